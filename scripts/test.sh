#!/usr/bin/env bash
# Builds everything (CUDA included where nvcc exists) and runs every CPU test; GPU tests run
# too and skip themselves where there is no device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DS4_BUILD_DIR:-build}
# Ninja (installed by install-deps.sh) schedules the whole build graph on the cores: a target's
# objects compile while the libraries it links are still building, which make's per-target order
# does not allow (CI on 2 cores: ~2 minutes less). A build folder keeps the generator it was
# configured with.
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
