#!/usr/bin/env bash
# The main job on an embedded default: builds ds4, generates the tiny synthetic model on first
# run (cached under .cache/), validates it, and answers one real chat request with it on the CPU
# backend. Until the example server lands the request goes through ds4-cli; the command itself
# stays the same when it starts the server. Extra arguments go to ds4-cli (e.g. --model FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DS4_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target ds4-cli
exec "$build/examples/cli/ds4-cli" --prompt "${DS4_PROMPT:-Write a haiku about memory bandwidth.}" -n "${DS4_TOKENS:-48}" "$@"
