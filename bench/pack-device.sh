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
for f in $(dpkg -L libbenchmark-dev libbenchmark1debian doctest-dev | grep -v /share/); do
  [ -f "$f" ] || continue
  mkdir -p ".device-carry$(dirname "$f")"
  cp -L "$f" ".device-carry$f"
done
for f in "$build"/tests/*_gpu "$build"/bench/*_bench "$build"/harness/ds4-validate; do
  [ -x "$f" ] && cp "$f" .device-bin/
done
du -sh .device-carry .device-bin
