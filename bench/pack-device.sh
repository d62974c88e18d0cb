#!/usr/bin/env bash
# Fills the ignored folders (.gitignore lists both) that bench/device.sh needs on the GPU machine: Google Benchmark and
# doctest from this machine's Debian packages (.device-carry/) and, when a build exists, the
# GPU binaries built here (.device-bin/). Then: device run with carry [.device-carry, .device-bin]
# and command `bash bench/device.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rm -rf .device-carry .device-bin
mkdir -p .device-carry .device-bin
# Header-only and small packages travel as files (their CMake configs under /usr/share/cmake too);
# Boost's 160 MB of headers travel as one xz archive (about 9 MB) that device.sh unpacks.
for f in $(dpkg -L libbenchmark-dev libbenchmark1debian doctest-dev libcli11-dev nlohmann-json3-dev |
           grep -v -E '/share/(doc|man|lintian)/'); do
  [ -f "$f" ] || continue
  mkdir -p ".device-carry$(dirname "$f")"
  cp -L "$f" ".device-carry$f"
done
boost_cmake=$(cd / && ls -d usr/lib/x86_64-linux-gnu/cmake/Boost-* usr/lib/x86_64-linux-gnu/cmake/BoostDetectToolset-* \
                             usr/lib/x86_64-linux-gnu/cmake/boost_headers-* 2>/dev/null || true)
[ -n "$boost_cmake" ] && tar -C / -cJf .device-carry/boost.tar.xz usr/include/boost $boost_cmake
for f in "$build"/tests/*_gpu "$build"/bench/*_bench "$build"/harness/ds4-validate "$build"/harness/ds4-synth \
         "$build"/bench/ds4-bench "$build"/bench/libds4_timeline.so "$build"/examples/server/ds4-server; do
  [ -x "$f" ] && cp "$f" .device-bin/
done
# What the binaries were built from: device.sh runs a pack that names its build as prebuilt.
if [ -n "$(ls -A .device-bin)" ]; then
  rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && rev="$rev (uncommitted changes)"
  echo "$rev" >.device-bin/BUILT_FROM
fi
du -sh .device-carry .device-bin
