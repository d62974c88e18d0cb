#!/usr/bin/env bash
# The main job on an embedded default: builds ds4, generates the tiny synthetic model on first
# run (cached under .cache/), and runs it. Until the example server lands this validates the
# model and prints its summary; the command itself stays the same when it starts the server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${DS4_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target ds4-synth
model=${DS4_MODEL:-.cache/ds4-tiny.gguf}
if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  "$build/harness/ds4-synth" --preset tiny --seed 1 --out "$model.tmp"
  mv "$model.tmp" "$model"
fi
exec "$build/harness/ds4-synth" --summary "$model"
