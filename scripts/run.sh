#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds ds4-server, generates the
# tiny synthetic model on first run (cached under .cache/), starts the server (CUDA where a GPU is
# present, else the CPU backend), sends it one real chat request, prints the reply, and keeps
# serving with the URL printed until Ctrl-C (or SIGTERM). Nothing reads stdin, so it runs the same
# unattended. Extra arguments go to ds4-server (e.g. --model FILE --port 8000 --backend cpu).
#
#   DS4_RUN_ONCE=1   exit after the first reply (tests, CI)
#   DS4_PROMPT=...   the request's user message;  DS4_TOKENS=N  its max_tokens (default 48)
#   DS4_BUILD_DIR    the build directory (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${DS4_SKIP_DEPS:-}" ] || scripts/install-deps.sh
build=${DS4_BUILD_DIR:-build}
generator=()  # Ninja as scripts/test.sh; a build folder keeps the generator it was configured with
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target ds4-server ds4-synth

# The default model, written under a temporary name and renamed: an interrupted first run never
# leaves a half-written file where the next run would find it.
model_flag=()
if [[ " $* " != *" --model "* ]]; then
  model=.cache/ds4-tiny.gguf
  model_flag=(--model "$model")
  if [ ! -f $model ]; then
    mkdir -p .cache
    echo "ds4: generating the tiny synthetic model into $model"
    "$build/harness/ds4-synth" --preset tiny --seed 1 --out "$model.tmp.$$" >/dev/null
    mv "$model.tmp.$$" "$model"
  fi
fi

log=$(mktemp "${TMPDIR:-/tmp}/ds4-server.XXXXXX.log")
"$build/examples/server/ds4-server" "${model_flag[@]}" "$@" >"$log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null; exit 0' INT TERM
for _ in $(seq 600); do  # up to 60 s for the model to load
  grep -q "listening on" "$log" && break
  kill -0 $server 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
url=$(grep -o 'http://[^ ]*' "$log" | head -1)
[ -n "$url" ] || { cat "$log"; kill $server; exit 1; }
sed -n '1p' "$log"
hostport=${url#http://}

# One chat request over bash's /dev/tcp: no HTTP client needed.
prompt=${DS4_PROMPT:-Write a haiku about memory bandwidth.}
prompt=${prompt//\\/\\\\}; prompt=${prompt//\"/\\\"}
body="{\"model\":\"ds4\",\"max_tokens\":${DS4_TOKENS:-48},\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}]}"
exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}"
printf 'POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$hostport" "$(printf %s "$body" | wc -c)" "$body" >&3
response=$(cat <&3)
exec 3<&-
reply=${response#*$'\r\n\r\n'}
echo "ds4: POST $url/v1/chat/completions  {\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}]}"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); m=r["choices"][0]["message"]; t=r["timings"]
print("reasoning:", m.get("reasoning_content", "")); print("reply:    ", m["content"])
print("usage:    ", r["usage"]["prompt_tokens"], "prompt +", r["usage"]["completion_tokens"], "completion tokens;",
      "ttft %.0f ms, prefill %.1f tok/s, decode %.1f tok/s" % (t["ttft_ms"], t["prefill_tokens_per_s"], t["decode_tokens_per_s"]))' "$reply"
else
  echo "$reply"
fi
[[ $reply == *'"chat.completion"'* ]] || { echo "ds4: the request failed"; cat "$log"; kill $server; exit 1; }

if [ -n "${DS4_RUN_ONCE:-}" ]; then
  kill -TERM $server
  wait $server
  exit 0
fi
echo "ds4: serving at $url (OpenAI /v1/chat/completions, /v1/completions, /v1/responses; Anthropic /v1/messages); server log $log; Ctrl-C stops"
wait $server
