#!/usr/bin/env python3
"""The scheduler through the server: batch invariance, 256 concurrent streaming clients with some
vanishing (no leak, no stall), the fairness policy measured, cancellation, timeouts, SSE
keep-alive during prefill, /health on a stalled step, SIGTERM drain, speculative decoding with the
MTP head and with prompt-lookup drafts."""
import json
import os
import socket
import subprocess
import threading
import time

from ds4_server import Server, Suite, args, chat, request, stream, wait_until

binary, model = args()[:2]
suite = Suite()


def token_bytes(r):
    return [bytes(e["bytes"]) for e in r["choices"][0]["logprobs"]["content"]]


def idle_and_empty(s):
    """Nothing running or queued, and the backend holds only the prefix cache's idle sequences
    (none at all, pages included, when the cache is empty)."""
    st, r = request(s, "GET", "/v1/stats")
    cached = r["prefix_cache"]["entries"]
    return (r["sequences"]["running"] == 0 and r["sequences"]["backend"] == cached and r["queue"]["waiting"] == 0
            and (cached > 0 or r["memory"]["kv_pages_used"] == 0) and r["http"]["generations_open"] == 0), r


def check_prefix_cache(s):
    sys_prompt = "You are a careful assistant who answers about memory hierarchies and caches."
    turn1 = [{"role": "system", "content": sys_prompt}, {"role": "user", "content": "What is a cache line?"}]
    body1 = {"model": "ds4", "messages": turn1, "max_tokens": 4, "temperature": 0, "reasoning_effort": "none", "logprobs": True}
    st, r1 = request(s, "POST", "/v1/chat/completions", body1)
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # The same request again: all but the last prompt token come from the cache (one-token rollback).
    st, r1b = request(s, "POST", "/v1/chat/completions", body1)
    assert r1b["usage"]["prompt_tokens_details"]["cached_tokens"] == r1["usage"]["prompt_tokens"] - 1, r1b["usage"]
    assert token_bytes(r1b) == token_bytes(r1), "a forked prefix gives the same tokens"
    # The next turn of the conversation starts with the whole first prompt.
    turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]}, {"role": "user", "content": "And a page?"}]
    body2 = dict(body1, messages=turn2)
    st, r2 = request(s, "POST", "/v1/chat/completions", body2)
    # (and, where the answer re-tokenizes to the sampled tokens, the answer too: the finished
    # turn's own sequence is kept)
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= r1["usage"]["prompt_tokens"], r2["usage"]
    print(f"     turn 2: {r2['usage']['prompt_tokens_details']['cached_tokens']} of {r2['usage']['prompt_tokens']} prompt tokens from the cache")
    st, m = request(s, "POST", "/v1/messages", {"max_tokens": 2, "system": sys_prompt, "thinking": {"type": "disabled"},
                                                "messages": [{"role": "user", "content": "What is a cache line?"}]})
    assert m["usage"]["cache_read_input_tokens"] > 0 and m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"] == r1["usage"]["prompt_tokens"], m["usage"]
    # The same turn on a server without the cache: the same tokens.
    with Server(binary, model, "--prefix-cache", "0") as fresh:
        st, f2 = request(fresh, "POST", "/v1/chat/completions", body2)
        assert f2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert token_bytes(f2) == token_bytes(r2), "cached prefill == full prefill"
        wait_until(lambda: idle_and_empty(fresh)[0], 10, "no cache, nothing held")
        assert request(fresh, "GET", "/v1/stats")[1]["sequences"]["backend"] == 0
    st, stats = request(s, "GET", "/v1/stats")
    assert stats["prefix_cache"]["hits"] >= 3 and stats["prefix_cache"]["entries"] >= 1


def check_batch_invariance(s):
    prompts = [f"Request {i}" + " caches" * (i % 4) for i in range(16)]
    bodies = [chat(p, max_tokens=5, logprobs=True, reasoning_effort="none" if i % 2 else "high",
                   **({"temperature": 0.9, "seed": 1000 + i} if i % 3 == 0 else {})) for i, p in enumerate(prompts)]
    alone = [token_bytes(request(s, "POST", "/v1/chat/completions", b)[1]) for b in bodies]
    together = [None] * 16

    def run(i):
        together[i] = token_bytes(request(s, "POST", "/v1/chat/completions", bodies[i], timeout=120)[1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(16):
        assert together[i] == alone[i], f"request {i}: alone {alone[i]} != among 16 {together[i]}"
    st, r = request(s, "GET", "/v1/stats")
    assert r["steps"]["max_rows"] > 16, "the 16 ran in shared steps"


def check_many_clients(s):
    n, results, lock = 256, {}, threading.Lock()

    def client(i):
        # Small work per client (a few rows each): the point is the concurrency, not the tokens.
        if i % 2:
            path, body = "/v1/chat/completions", chat("hi", max_tokens=3, reasoning_effort="none", stream=True)
        else:
            path, body = "/v1/completions", {"prompt": [1521, 40 + i], "max_tokens": 3, "stream": True, "temperature": 0}
        outcome = "error"
        try:
            if i % 16 == 5:  # gone before any token: the queued or prefilling job is cancelled
                sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
                data = json.dumps(body).encode()
                sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                time.sleep(0.01)
                sock.close()
                outcome = "hung up early"
            else:
                hang_up = i % 8 == 3  # gone mid-stream, after its first token
                st, events, _ = stream(s, path, body, timeout=150,
                                       on_event=lambda k, name, d: hang_up and k >= 1)
                if hang_up:
                    outcome = "hung up mid-stream"
                elif st == 200 and events[-1][1] == "[DONE]" and events[-2][1]["choices"][0]["finish_reason"] == "length":
                    outcome = "done"
        except Exception as e:  # noqa: BLE001
            outcome = "error: " + repr(e)
        with lock:
            results[i] = outcome

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, 170 - (time.monotonic() - t0)))
    elapsed = time.monotonic() - t0
    assert len(results) == n, f"{n - len(results)} clients stalled"
    bad = {i: o for i, o in results.items() if o.startswith("error")}
    assert not bad, f"{len(bad)} clients failed: {list(bad.items())[:5]}"
    done = sum(o == "done" for o in results.values())
    wait_until(lambda: idle_and_empty(s)[0], 30, "sequences and pages back to zero")
    st, r = request(s, "GET", "/v1/stats")
    print(f"     {n} streaming clients in {elapsed:.1f} s: {done} complete, {n - done} hung up; "
          f"{r['requests']['cancelled']} cancelled; max rows per step {r['steps']['max_rows']}")
    assert r["requests"]["cancelled"] >= n // 16, r["requests"]
    assert r["http"]["connections_open"] <= 2, r["http"]
    # Still serving afterwards.
    st, _ = request(s, "POST", "/v1/chat/completions", chat("after", max_tokens=2))
    assert st == 200


def check_fairness():
    with Server(binary, model, "--prefill-chunk", "8", "--step-tokens", "16") as s:
        times, b_window = [], {}

        def on_event(k, name, d):
            times.append(time.monotonic())
            if k == 3:  # a few tokens in: the long prompt arrives
                threading.Thread(target=long_prompt).start()
            return False

        def long_prompt():
            b_window["start"] = time.monotonic()
            st, r = request(s, "POST", "/v1/chat/completions", chat("memory bandwidth " * 60, max_tokens=1), timeout=150)
            b_window["end"] = time.monotonic()
            b_window["response"] = r

        st, events, _ = stream(s, "/v1/chat/completions", chat("stream", max_tokens=100, reasoning_effort="none", stream=True),
                                 timeout=150, on_event=on_event)
        wait_until(lambda: "end" in b_window, 120, "the long prompt")
        inside = [t for t in times if b_window["start"] <= t <= b_window["end"]]
        gaps = [b - a for a, b in zip(inside, inside[1:])]
        prompt_tokens = b_window["response"]["usage"]["prompt_tokens"]
        prefill_s = b_window["end"] - b_window["start"]
        st, r = request(s, "GET", "/v1/stats")
        print(f"     a {prompt_tokens}-token prompt prefilled in {prefill_s:.2f} s while a stream decoded; "
              f"the stream got {len(inside)} tokens meanwhile, largest gap {max(gaps) * 1e3:.0f} ms; "
              f"max decode gap {r['steps']['max_decode_gap_steps']} step, max prefill rows per step {r['steps']['max_prefill_rows']}")
        assert r["steps"]["max_decode_gap_steps"] == 1, "a decoding stream gets a token every step"
        assert r["steps"]["max_prefill_rows"] <= 16, "prefill stays inside the step budget"
        # The exact check is max_decode_gap_steps above; the client's count is a little short of
        # one per step (the window's edges are client-side times, and a token that ends inside a
        # UTF-8 character makes no chunk), so it is held to 90% of the steps.
        assert len(inside) >= (prompt_tokens // 8) * 9 // 10, "one token per prefill chunk step"
        assert max(gaps) < prefill_s / 8, "the long prefill never held the stream for long"


def check_cancel_and_timeout():
    with Server(binary, model, "--request-timeout", "1") as s:
        # A buffered request whose client vanishes: its sequence is freed at the next step.
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        data = json.dumps(chat("long", max_tokens=3000, reasoning_effort="none")).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        wait_until(lambda: request(s, "GET", "/v1/stats")[1]["sequences"]["running"] == 1, 10, "the request running")
        sock.close()
        t0 = time.monotonic()
        wait_until(lambda: idle_and_empty(s)[0], 5, "the vanished client's sequence freed")
        print(f"     sequence freed {1e3 * (time.monotonic() - t0):.0f} ms after the client vanished")
        assert request(s, "GET", "/v1/stats")[1]["requests"]["cancelled"] == 1
        # A streaming request of three choices whose client hangs up: every choice is freed.
        # ignore_eos: a choice that samples EOS before the hang-up would end as finished, not
        # cancelled (about one run in fifteen on the tiny model).
        st, events, _ = stream(s, "/v1/chat/completions", chat("long", max_tokens=3000, reasoning_effort="none", stream=True,
                                                                 n=3, temperature=1.0, ignore_eos=True),
                               on_event=lambda i, name, data: i >= 6)
        assert len({e[1]["choices"][0]["index"] for e in events if e[1] != "[DONE]" and e[1]["choices"]}) >= 2, events
        wait_until(lambda: idle_and_empty(s)[0], 5, "the three choices freed")
        counts = request(s, "GET", "/v1/stats")[1]["requests"]
        assert counts["cancelled"] == 4 and counts["finished"] == 0, counts
        # Past --request-timeout: a typed error, buffered or streamed, and nothing left behind.
        st, r = request(s, "POST", "/v1/chat/completions", chat("long", max_tokens=3000, reasoning_effort="none"))
        assert st == 408 and r["error"]["code"] == "timeout", (st, r)
        # Greedy: a sampled EOS before the timeout would end it early, now and then.
        st, events, _ = stream(s, "/v1/messages", {"max_tokens": 3000, "temperature": 0, "messages": [{"role": "user", "content": "x"}],
                                                   "stream": True})
        assert events[-1][0] == "error" and events[-1][1]["error"]["code"] == "timeout", events[-1]
        wait_until(lambda: idle_and_empty(s)[0], 5, "timed-out sequences freed")


def check_keepalive_comments():
    with Server(binary, model, "--sse-keepalive-ms", "20", "--prefill-chunk", "4", "--debug-step-delay-ms", "40") as s:
        st, events, comments = stream(s, "/v1/chat/completions", chat("a prompt of a few dozen tokens " * 3, max_tokens=2, stream=True))
        before_first_token = sum(1 for c in comments if c <= 1)
        assert st == 200 and events[-1][1] == "[DONE]"
        assert before_first_token >= 3, f"keep-alive comments while prefilling: {comments}"
        st, events, comments = stream(s, "/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": "x " * 40}], "stream": True})
        assert sum(1 for c in comments if c <= 1) >= 3, comments


def check_health_stall():
    with Server(binary, model, "--debug-step-delay-ms", "800", "--stall-s", "0.3") as s:
        assert request(s, "GET", "/health")[0] == 200, "idle is healthy: the loop still beats"
        t = threading.Thread(target=request, args=(s, "POST", "/v1/chat/completions", chat("x", max_tokens=3)))
        t.start()
        seen = []
        deadline = time.monotonic() + 10
        while t.is_alive() and time.monotonic() < deadline:
            seen.append(request(s, "GET", "/health"))
            time.sleep(0.05)
        t.join(10)
        assert any(st == 503 and r["status"] == "stalled" for st, r in seen), "a step longer than --stall-s fails /health"
        wait_until(lambda: request(s, "GET", "/health")[0] == 200, 5, "healthy again")


def check_sigterm_drain():
    with Server(binary, model, "--debug-step-delay-ms", "30") as s:
        sent = []

        def on_event(k, name, d):
            if k == 2 and not sent:
                sent.append(s.terminate and s.proc.send_signal(15))
            return False

        st, events, _ = stream(s, "/v1/chat/completions", chat("drain", max_tokens=30, reasoning_effort="none", stream=True), on_event=on_event)
        assert events[-1][1] == "[DONE]" and events[-2][1]["choices"][0]["finish_reason"] == "length", "in-flight work finishes"
        assert s.proc.wait(20) == 0
    with Server(binary, model, "--debug-step-delay-ms", "30", "--drain-s", "0.2") as s:
        sent = []

        def on_event(k, name, d):
            if k == 2 and not sent:
                sent.append(s.proc.send_signal(15))
            return False

        st, events, _ = stream(s, "/v1/chat/completions", chat("drain", max_tokens=500, reasoning_effort="none", stream=True), on_event=on_event)
        assert events[-2][1]["error"]["code"] == "shutting_down" and events[-1][1] == "[DONE]", events[-2:]
        assert s.proc.wait(20) == 0


def check_speculative():
    """A server that drafts with the MTP head answers with the same tokens and log-probabilities
    as one that does not (the scheduler's in-process test covers accepted and rejected drafts;
    the random MTP head rarely re-predicts a sampled token), reports its drafts, and a server asked
    to draft without an MTP file refuses to start, naming why."""
    mtp = os.path.splitext(model)[0] + "-mtp.gguf"
    assert os.path.exists(mtp), "the server_model fixture writes the MTP file next to the model: " + mtp
    body = {"model": "ds4", "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
            "max_tokens": 24, "temperature": 0.8, "seed": 7, "logprobs": True, "reasoning_effort": "none"}
    with Server(binary, model, "--prefix-cache", "0") as plain:
        st, want = request(plain, "POST", "/v1/chat/completions", body)
        assert st == 200, want
        assert request(plain, "GET", "/v1/stats")[1]["speculative"]["tokens_per_step"] == 0
    with Server(binary, model, "--mtp", mtp, "--spec-tokens", "3", "--prefix-cache", "0") as s:
        st, got = request(s, "POST", "/v1/chat/completions", body)
        assert st == 200, got
        st, stats = request(s, "GET", "/v1/stats")
        st, metrics = request(s, "GET", "/metrics")
    assert token_bytes(got) == token_bytes(want)
    assert [e["logprob"] for e in got["choices"][0]["logprobs"]["content"]] == \
        [e["logprob"] for e in want["choices"][0]["logprobs"]["content"]]
    sp = stats["speculative"]
    assert sp["tokens_per_step"] == 3 and 0 <= sp["accepted"] <= sp["drafted"], sp
    assert "ds4_spec_drafted_tokens_total" in metrics and "ds4_spec_accepted_tokens_total" in metrics
    # The default: 2 drafts a step once an MTP file is given.
    with Server(binary, model, "--mtp", mtp) as s:
        assert request(s, "GET", "/v1/stats")[1]["speculative"]["tokens_per_step"] == 2
    r = subprocess.run([binary, "--model", model, "--port", "0", "--backend", "cpu", "--spec-tokens", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "needs an MTP drafter (--mtp FILE)" in r.stderr, (r.returncode, r.stderr[-500:])


def check_prompt_lookup():
    """--draft ngram over HTTP: a completion that quotes its prompt (forced by the debug hook, the
    random model would not) is answered with the plain server's tokens in fewer steps, stats name
    the source, and a bad --draft word stops the server at start, naming it."""
    quote = "The quick brown fox jumps over the lazy dog, then it runs far away into the forest."
    body = {"model": "ds4", "prompt": "Repeat this sentence exactly: " + quote + "\nNow repeat it:",
            "max_tokens": 200, "temperature": 0, "logprobs": 1}
    runs = {}
    for name, extra in (("plain", []), ("ngram", ["--draft", "ngram", "--spec-tokens", "3"])):
        with Server(binary, model, "--prefix-cache", "0", "--debug-forced-output", quote, *extra) as s:
            st, runs[name] = request(s, "POST", "/v1/completions", body)
            assert st == 200, runs[name]
            runs[name + "_stats"] = request(s, "GET", "/v1/stats")[1]
    assert runs["ngram"]["choices"][0]["text"] == runs["plain"]["choices"][0]["text"] == quote, runs["ngram"]
    plain_st, st = runs["plain_stats"], runs["ngram_stats"]
    assert plain_st["speculative"]["draft"] == "off", plain_st["speculative"]
    sp = st["speculative"]
    assert sp["draft"] == "ngram" and sp["tokens_per_step"] == 3 and 0 < sp["accepted"] <= sp["drafted"], sp
    assert st["steps"]["count"] < plain_st["steps"]["count"], (st["steps"], plain_st["steps"])
    r = subprocess.run([binary, "--model", model, "--port", "0", "--backend", "cpu", "--draft", "medusa"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--draft medusa: expected auto, mtp, ngram or off" in r.stderr, (r.returncode, r.stderr[-500:])


with Server(binary, model, "--max-seqs", "192") as s:
    suite.run("batch invariance (alone == among 16)", check_batch_invariance, s)
    suite.run("256 streaming clients, some vanishing", check_many_clients, s)
    suite.run("prefix cache: reuse, multi-turn, same tokens as without", check_prefix_cache, s)
suite.run("fairness: decode first, bounded prefill chunks", check_fairness)
suite.run("cancellation and timeouts", check_cancel_and_timeout)
suite.run("SSE keep-alive comments during prefill", check_keepalive_comments)
suite.run("/health fails on a stalled step", check_health_stall)
suite.run("SIGTERM drains", check_sigterm_drain)
suite.run("speculative decoding: the same answers with MTP drafts", check_speculative)
suite.run("speculative decoding: prompt-lookup drafts over HTTP", check_prompt_lookup)
suite.exit()
