#!/usr/bin/env bash
# Builds everything (CUDA included where nvcc exists) and runs every CPU test; GPU tests run
# too and skip themselves where there is no device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DS4_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
