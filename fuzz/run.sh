#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in a build of their own and
# runs them from a seed corpus generated here: ds4-synth's tiny model files, truncations of them
# (fuzz_seeds), and one request body per server API (written below).
#
#   fuzz/run.sh --ci WORKDIR             CI (the CTest entry fuzz_smoke): 30 s per fuzzer from
#                                        the seeds alone; any finding fails.
#   fuzz/run.sh WORKDIR [SECONDS] [TARGET...]
#                                        long runs: SECONDS per target (default 3600), the targets
#                                        side by side (gguf_fuzzer and http_fuzzer by default); the
#                                        corpus grows in WORKDIR/corpus/TARGET and is reused.
#                                        e.g. nohup fuzz/run.sh "$HOME/ds4-fuzz" 28800 gguf_fuzzer &
#
# Environment: DS4_FUZZ_JOBS (build parallelism, default 2), DS4_FUZZ_ARGS (more libFuzzer
# options, e.g. "-jobs=4 -workers=4"). A finding leaves its input in WORKDIR/artifacts/;
# reproduce it with WORKDIR/build/fuzz/TARGET FILE, then add a regression test in tests/ that
# builds the case (see docs/gguf-limits.md, "Fuzzing").
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
ci=0
if [[ ${1:-} == --ci ]]; then ci=1; shift; fi
[[ $# -ge 1 ]] || { sed -n '2,19p' "$0" >&2; exit 2; }
work=$(mkdir -p "$1" && cd "$1" && pwd)
shift
seconds=3600
((ci)) && seconds=30
if [[ $# -ge 1 && $1 =~ ^[0-9]+$ ]]; then seconds=$1; shift; fi
targets=("$@")
((${#targets[@]})) || targets=(gguf_fuzzer http_fuzzer)

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz/run.sh: $tool not found; scripts/install-deps.sh installs clang and libclang-rt-dev" >&2; exit 1; }
done
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
build=$work/build
# -O1 with line tables: the usual fuzzing trade between speed and readable reports; no NDEBUG,
# so the library's assertions stay on. CUDA is off: the fuzzers reach host code only.
CC=clang CXX=clang++ cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" -DDS4_ENABLE_CUDA=OFF -DDS4_BUILD_FUZZERS=ON >"$work/configure.log" ||
  { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$build" -j "${DS4_FUZZ_JOBS:-2}" --target fuzz_seeds "${targets[@]}"

seeds=$work/seeds
rm -rf "$seeds"
mkdir -p "$seeds/gguf_fuzzer" "$seeds/http_fuzzer"
"$build/fuzz/fuzz_seeds" "$seeds/gguf_fuzzer"
# http_fuzzer: the first byte picks the API ('A' messages, 'B' count_tokens, 'C' chat
# completions, 'D' completions, 'E' responses, 'F' tokenize, 'G' detokenize), the rest is the body.
h=$seeds/http_fuzzer
printf 'A%s' '{"model":"deepseek-v4-flash","max_tokens":16,"system":"Be brief.","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"Hello"},{"type":"tool_use","id":"t1","name":"calc","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"42"}]}],"tools":[{"name":"calc","description":"adds","input_schema":{"type":"object","properties":{"a":{"type":"integer"}}}}],"tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["END"],"temperature":0.7,"top_p":0.9,"top_k":40,"stream":true}' >"$h/messages.json"
printf 'B%s' '{"model":"deepseek-v4-flash","system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"How many tokens?"}]}' >"$h/count_tokens.json"
printf 'C%s' '{"model":"deepseek-v4-flash","messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"Weather?"}]},{"role":"assistant","reasoning_content":"r","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"sunny"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"tool_choice":"auto","reasoning_effort":"high","max_completion_tokens":8,"stop":["\n\n"],"logprobs":true,"top_logprobs":2,"seed":7,"stream":true,"stream_options":{"include_usage":true}}' >"$h/chat.json"
printf 'C%s' '{"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"thinking":false},"max_tokens":4,"temperature":0,"min_p":0.1,"n":2,"stream":true}' >"$h/chat_min.json"
printf 'D%s' '{"model":"deepseek-v4-flash","prompt":"Once upon a time","max_tokens":8,"echo":false,"logprobs":2,"stop":"\n","temperature":1.0,"stream":false}' >"$h/completions.json"
printf 'E%s' '{"model":"deepseek-v4-flash","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"reasoning":{"effort":"low"},"max_output_tokens":8,"stream":true}' >"$h/responses.json"
printf 'E%s' '{"input":"plain text prompt","max_output_tokens":4}' >"$h/responses_text.json"
printf 'F%s' '{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"return_token_strs":true}' >"$h/tokenize.json"
printf 'F%s' '{"prompt":[1,2,3]}' >"$h/tokenize_ids.json"
printf 'G%s' '{"tokens":[0,1,2,100,1000]}' >"$h/detokenize.json"

mkdir -p "$work/artifacts"
# The targets run side by side (each its own SECONDS, one process each): the CI smoke run ends
# with them, when the other tests are done and the cores would idle.
pids=()
for t in "${targets[@]}"; do
  corpus=$work/corpus/$t
  ((ci)) && rm -rf "$corpus"
  mkdir -p "$corpus"
  echo "fuzz/run.sh: $t for ${seconds}s (corpus $corpus)"
  # -timeout: one input over 10 s is a finding (issue 16: any file costs O(size) time);
  # -rss_limit_mb: so is one that needs over 2 GiB.
  # shellcheck disable=SC2086
  "$build/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$work/artifacts/$t-" ${DS4_FUZZ_ARGS:-} "$corpus" "$seeds/$t" >"$work/$t.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  if ! wait "${pids[$i]}"; then
    tail -n 60 "$work/$t.log" >&2
    echo "fuzz/run.sh: $t found a problem; its input is in $work/artifacts/" >&2
    status=1
  else
    grep -E '^(Done|stat::(average_exec_per_sec|new_units_added|peak_rss_mb))' "$work/$t.log" || true
  fi
done
exit "$status"
