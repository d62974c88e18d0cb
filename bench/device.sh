#!/usr/bin/env bash
# One call on the GPU machine: (build,) validate, benchmark, print a short table last.
# The machine has no package registry: Google Benchmark and doctest travel in .device-carry/
# (bench/pack-device.sh fills it). Binaries built on the CI machine for sm_90 travel in
# .device-bin/ and run as they are; without them everything is built here.
set -uo pipefail
cd "$(dirname "$0")/.."
# $OUT returns at most 8 files: logs are concatenated, JSON stays in a scratch folder.
out=${OUT:-/tmp/ds4-out}
json=$(mktemp -d)
mkdir -p "$out"
carry=$PWD/.device-carry/usr

# A CUDA tool from the environment: PATH first, then $CUDA_HOME/bin and $CUDA_PATH/bin, then the
# usual install prefixes (/usr/local/cuda, /opt/cuda, /usr/local/cuda-X.Y newest first). Prints
# nothing when it is in none of them.
find_cuda_tool() {
  local tool=$1 dir
  command -v "$tool" 2>/dev/null && return
  for dir in ${CUDA_HOME:+"$CUDA_HOME/bin"} ${CUDA_PATH:+"$CUDA_PATH/bin"} /usr/local/cuda/bin /opt/cuda/bin \
             $(ls -d /usr/local/cuda-*/bin 2>/dev/null | sort -rV); do
    [ -x "$dir/$tool" ] && { echo "$dir/$tool"; return; }
  done
}
export LD_LIBRARY_PATH=$carry/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv,noheader | tee "$out/gpu.txt"

status=0
bin=$PWD/.device-bin
# Prebuilt when .device-bin says what it was built from (BUILT_FROM) or holds ds4-validate; a pack
# without either is built here (a pack that left ds4-validate out to fit the carry was once built
# here silently, and its "main" runs were the checked-out branch's).
if [ ! -f "$bin/BUILT_FROM" ] && [ ! -x "$bin/ds4-validate" ]; then
  # DS4_BUILD_DIR: a build folder outside the copied tree survives the next call on a warm machine.
  bin=${DS4_BUILD_DIR:-$PWD/build-device}
  # CMake finds nvcc through CUDACXX when it is not on PATH.
  if [ -z "${CUDACXX:-}" ]; then
    nvcc=$(find_cuda_tool nvcc)
    [ -n "$nvcc" ] || { echo "nvcc not found (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda); set CUDACXX"; exit 1; }
    export CUDACXX=$nvcc
  fi
  # Boost travels as an archive (pack-device.sh); unpacked once per warm machine.
  if [ -f .device-carry/boost.tar.xz ] && [ ! -d "$PWD/.device-carry/usr/include/boost" ]; then
    tar -C .device-carry -xJf .device-carry/boost.tar.xz
  fi
  cmake -S . -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DCMAKE_PREFIX_PATH="$carry" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  # Keep going past a failed target: the binaries that did build still run, the failures are listed.
  cmake --build "$bin" -j 16 -- -k 0 >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -30; status=1; }
  bin_tests=$bin/tests bin_bench=$bin/bench bin_harness=$bin/harness
else
  bin_tests=$bin bin_bench=$bin bin_harness=$bin
fi

# The whole model's file (DS4_MODEL=1, DS4_KERNELS=1, DS4_TIMELINE=1 or DS4_TTFT=1): the full-shape synthetic
# flash file is written to /dev/shm once per warm machine, in the background (CPU only) while the
# GPU tests and ds4-validate run. DS4_MODEL_LAYERS=N writes flash's first N layers instead (the
# custom preset): a model that fits an 80 GB card (30 layers, ~61 GB; at 36 the prefill chunk's
# workspace did not fit), for A/B runs only; the targets are the full file's on the H200.
model=/dev/shm/flash.gguf synth_pid= layer_args=()
if [ -n "${DS4_MODEL_LAYERS:-}" ]; then
  model=/dev/shm/flash-$DS4_MODEL_LAYERS.gguf layer_args=(--layers "$DS4_MODEL_LAYERS")
fi
if [[ ( "${DS4_MODEL:-0}" = 1 || "${DS4_KERNELS:-0}" = 1 || "${DS4_TTFT:-0}" = 1 || "${DS4_TIMELINE:-0}" = 1 ) && ! -f "$model" ]]; then
  /usr/bin/time -f "synth %e s" "$bin_harness/ds4-synth" --preset flash "${layer_args[@]}" --seed 5 --out "$model.part" --threads 16 \
      >"$json/synth.log" 2>&1 && mv "$model.part" "$model" &
  synth_pid=$!
fi
wait_model() {
  [ -n "$synth_pid" ] && { wait "$synth_pid" || true; tail -1 "$json/synth.log"; synth_pid=; }
  [ -f "$model" ] || { echo "no model at $model (ds4-synth failed)"; tail -5 "$json/synth.log"; return 1; }
}

# DS4_TESTS=0 skips the GPU tests; every binary runs under a time limit so that one hung kernel
# cannot eat the session's device time (DS4_TEST_TIMEOUT, DS4_VALIDATE_TIMEOUT, DS4_BENCH_TIMEOUT).
echo "== GPU tests"
[ "${DS4_TESTS:-1}" = 0 ] && echo "(skipped)"
for t in "$bin_tests"/*_gpu; do
  [ "${DS4_TESTS:-1}" = 0 ] && break
  [ -x "$t" ] || continue
  # DS4_TEST_FILTER: an extended regex; only the test binaries whose name matches run.
  [[ -n "${DS4_TEST_FILTER:-}" && ! $(basename "$t") =~ ${DS4_TEST_FILTER} ]] && continue
  log=$json/$(basename "$t").log
  if timeout "${DS4_TEST_TIMEOUT:-120}" "$t" >"$log" 2>&1; then echo "PASS $(basename "$t")"; else echo "FAIL $(basename "$t")"; tail -20 "$log"; status=1; fi
  cat "$log" >>"$out/gpu_tests.log"
done

echo "== ds4-validate"
# DS4_VALIDATE=0 / DS4_BENCH=0 skip those parts (a build-and-test call, a validate-only call).
if [ "${DS4_VALIDATE:-1}" = 0 ]; then echo "(skipped)";
elif [ ! -x "$bin_harness/ds4-validate" ]; then echo "no ds4-validate in $bin_harness"; status=1; else
  timeout "${DS4_VALIDATE_TIMEOUT:-300}" "$bin_harness/ds4-validate" ${DS4_VALIDATE_ARGS:-} >"$out/validate.txt" 2>&1 || status=1
  grep -E "FAIL|checks|seed" "$out/validate.txt" | head -40
fi

echo "== benchmarks"
for b in "$bin_bench"/*_bench; do
  [ "${DS4_BENCH:-1}" = 0 ] && { echo "(skipped)"; break; }
  [ -x "$b" ] || continue
  timeout "${DS4_BENCH_TIMEOUT:-300}" "$b" --benchmark_filter="${DS4_BENCH_FILTER:-.}" --benchmark_out="$json/$(basename "$b").json" \
       --benchmark_out_format=json >"$json/$(basename "$b").txt" 2>&1 || { echo "bench $(basename "$b") failed or timed out"; tail -5 "$json/$(basename "$b").txt"; status=1; }
  cat "$json/$(basename "$b").txt" >>"$out/bench.txt"
done
python3 bench/summarize.py "$json"/*_bench.json | tee "$out/summary.txt"

# DS4_PROFILE="<kernel regex> <bench binary> <benchmark filter>": an ncu report (duration, warp
# states and per-instruction source counters) of that kernel's first launch (the first
# DS4_PROFILE_COUNT launches of the kernels the regex matches; DS4_PROFILE_NCU adds ncu options, e.g.
# "--launch-skip 2 --cache-control none" for a warm launch: eager runs make 3 launches), run eagerly (DS4_BENCH_EAGER=1:
# ncu does not finish source counters on graph replays). $OUT gets the report, the SASS table, the
# details page with the samples per code section (bench/profile_sections.py) appended.
if [ -n "${DS4_PROFILE:-}" ]; then
  read -r pkernel pbin pfilter <<<"$DS4_PROFILE"
  ncu=${NCU:-$(find_cuda_tool ncu)}
  [ -n "$ncu" ] || { echo "ncu not found (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda); set NCU"; ncu=false; status=1; }
  DS4_BENCH_EAGER=1 timeout "${DS4_PROFILE_TIMEOUT:-180}" "$ncu" --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section SourceCounters -k "regex:$pkernel" --launch-count "${DS4_PROFILE_COUNT:-1}" ${DS4_PROFILE_NCU:-} -o "$out/profile" \
      "$bin_bench/$pbin" --benchmark_filter="$pfilter" \
      >"$json/profile.log" 2>&1 || { echo "profile failed or timed out"; tail -5 "$json/profile.log"; }
  if [ -f "$out/profile.ncu-rep" ]; then
    "$ncu" --import "$out/profile.ncu-rep" --page source --csv --print-source sass >"$out/profile_sass.csv" 2>&1
    "$ncu" --import "$out/profile.ncu-rep" --page details >"$out/profile.txt" 2>&1
    # Appended to the details page: $OUT brings back 8 files at most.
    python3 bench/profile_sections.py "$out/profile_sass.csv" --min 1.0 >"$json/sections.txt" 2>&1
    { echo "== samples per code section (bench/profile_sections.py)"; cat "$json/sections.txt"; } >>"$out/profile.txt"
    echo "== profiled kernels (duration)"
    grep -E "^  [a-z_].*\(|Duration" "$out/profile.txt" | paste - - | sed -E 's/ +/ /g' | cut -c1-160
    echo "== profile sections (share of warp stall samples)"
    head -40 "$json/sections.txt"
  else
    echo "no profile report"; tail -8 "$json/profile.log"
  fi
fi
# DS4_MODEL=1: the whole model. ds4-bench runs once per line of DS4_MODEL_RUNS ("ENV=V ... --
# ds4-bench args"), its output appended to $OUT/model.txt. DS4_BENCH_BIN=path among a line's
# variables runs that ds4-bench instead (another build's, carried beside: an A/B in one call).
if [ "${DS4_MODEL:-0}" = 1 ] && { echo "== whole model"; wait_model || { status=1; false; }; }; then
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    envs=${line%%--*} args=${line#*--}
    bench_bin=$bin_bench/ds4-bench
    [[ " $envs" =~ [[:space:]]DS4_BENCH_BIN=([^[:space:]]+) ]] && bench_bin=${BASH_REMATCH[1]}
    echo "-- $line" | tee -a "$out/model.txt"
    env $envs timeout "${DS4_MODEL_TIMEOUT:-300}" "$bench_bin" --model "$model" --backend cuda $args \
        >>"$out/model.txt" 2>&1 || { echo "ds4-bench failed or timed out"; status=1; }
    grep -E "tok/s|decode|prefill|total|host|hc_pre|moe|GiB" "$out/model.txt" | tail -40 >/dev/null
  done <<<"${DS4_MODEL_RUNS:-DS4_CUDA_GRAPHS=1 -- --no-batch --max-ctx 2048 --step 2048}"
fi
# DS4_KERNELS=1: per-kernel durations of one decode step in isolation (ncu over ds4-bench, eager:
# each kernel alone, caches and clocks untouched; the kernels of a decode step only, so that the
# count reaches ds4-bench's warm-up step), summarized by bench/kernel_durations.py into
# $OUT/kernels.txt.
if [ "${DS4_KERNELS:-0}" = 1 ] && { echo "== decode kernels (ncu)"; wait_model || { status=1; false; }; }; then
  ncu=${NCU:-$(find_cuda_tool ncu)}
  decode_kernels='matvec|compressor_decode|indexer|moe_router|moe_experts|moe_finish|moe_shared|attention_decode'
  decode_kernels+='|attention_merge|attention_split|kv_store|norm_rope|sampling|hc_pre|hc_post|embedding'
  DS4_CUDA_GRAPHS=0 timeout "${DS4_KERNELS_TIMEOUT:-240}" "${ncu:-false}" --cache-control none --clock-control none \
      --kernel-name "regex:$decode_kernels" --launch-count "${DS4_KERNELS_COUNT:-1000}" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size --csv --page raw \
      "$bin_bench/ds4-bench" --model "$model" --backend cuda --no-batch --max-ctx 2048 --step 2048 --decode 2 \
      >"$json/kernels.csv" 2>"$json/kernels.err" || { echo "ncu failed or timed out"; tail -5 "$json/kernels.err"; status=1; }
  python3 bench/kernel_durations.py "$json/kernels.csv" >"$out/kernels.txt" 2>&1 || status=1
  head -32 "$out/kernels.txt"
fi
# DS4_TIMELINE=1: a graph-mode kernel timeline of the decode step (bench/cupti_timeline.cpp, loaded
# into ds4-bench by the CUDA driver; CUPTI from the toolkit), summarized by bench/timeline_summary.py
# into $OUT/timeline.txt. DS4_TIMELINE_ENV adds variables to that run (an A/B switch).
if [ "${DS4_TIMELINE:-0}" = 1 ] && { echo "== decode timeline (CUPTI)"; wait_model || { status=1; false; }; }; then
  ncu_path=$(find_cuda_tool ncu)
  cupti_dir=$(dirname "${ncu_path:-/usr/local/cuda/bin/ncu}")/../lib64
  env ${DS4_TIMELINE_ENV:-} DS4_CUDA_GRAPHS=1 LD_LIBRARY_PATH="$cupti_dir:$LD_LIBRARY_PATH" \
      CUDA_INJECTION64_PATH="$bin_bench/libds4_timeline.so" DS4_TIMELINE="$json/timeline.csv" \
      timeout "${DS4_TIMELINE_TIMEOUT:-180}" "$bin_bench/ds4-bench" --model "$model" --backend cuda --no-batch \
      --max-ctx 2048 --step 2048 --decode 16 >"$json/timeline.log" 2>&1 || { echo "timeline run failed"; tail -5 "$json/timeline.log"; status=1; }
  python3 bench/timeline_summary.py "$json/timeline.csv" >"$out/timeline.txt" 2>&1 || status=1
  gzip -c "$json/timeline.csv" >"$out/timeline.csv.gz"  # for a reading the summary does not make
  head -16 "$out/timeline.txt"
fi
# DS4_TTFT=1: the server's time to first token for a long conversation turn on the CUDA backend
# (examples/server/bench/prefix_ttft_bench.py; DS4_TTFT_TOKENS, DS4_TTFT_CASES), into $OUT/ttft.txt.
if [ "${DS4_TTFT:-0}" = 1 ] && { echo "== time to first token"; wait_model || { status=1; false; }; }; then
  server=$bin/examples/server/ds4-server
  [ -x "$server" ] || server=$bin/ds4-server
  timeout "${DS4_TTFT_TIMEOUT:-300}" python3 -u examples/server/bench/prefix_ttft_bench.py --server "$server" \
      --model "$model" --ctx 0 --backend cuda --tokens "${DS4_TTFT_TOKENS:-32768}" \
      --cases "${DS4_TTFT_CASES:-cache,nocache,disk}" --work "$json/ttft" >"$out/ttft.txt" 2>&1 ||
    { echo "prefix_ttft_bench failed or timed out"; tail -20 "$json/ttft/servers.log" >>"$out/ttft.txt"; status=1; }
  tail -8 "$out/ttft.txt"
fi
echo "== validate table"
sed -n '/^kernel/,$p' "$out/validate.txt" | cut -c1-120 | head -60
exit $status
