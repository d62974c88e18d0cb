#!/usr/bin/env python3
"""Each malformed input gets its typed error in the API's own shape, and the next request is served."""
import socket
import threading

from ds4_server import Server, Suite, args, chat, request, stream, wait_until

binary, model = args()[:2]
suite = Suite()
CTX = 256


def served(s):
    st, r = request(s, "POST", "/v1/chat/completions", chat("ok?", max_tokens=1))
    assert st == 200, ("the next request is served", r)


def openai_error(s, path, expect_status, expect_code, body=None, raw=None, headers=None, param=None):
    st, r = request(s, "POST" if (body is not None or raw is not None) else "GET", path, body, raw=raw, headers=headers)
    assert st == expect_status, (st, r)
    e = r["error"]
    assert e["code"] == expect_code and isinstance(e["message"], str) and e["message"], r
    assert e["type"] in ("invalid_request_error", "not_found_error", "authentication_error", "server_overloaded"), r
    if param is not None:
        assert e["param"] == param, r
    served(s) if not headers else None
    return e


def anthropic_error(s, expect_status, expect_type, expect_code, body=None, raw=None, headers=None):
    st, r = request(s, "POST", "/v1/messages", body, raw=raw, headers=headers)
    assert st == expect_status and r["type"] == "error", (st, r)
    assert r["error"]["type"] == expect_type and r["error"]["code"] == expect_code, r
    return r


def check_body_errors(s):
    openai_error(s, "/v1/chat/completions", 400, "invalid_json", raw=b'{"messages": [')
    openai_error(s, "/v1/chat/completions", 400, "invalid_json", raw=b"")
    openai_error(s, "/v1/chat/completions", 400, "invalid_utf8", raw=b'{"messages":[{"role":"user","content":"\xff\xfe"}]}')
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", raw=b"[1,2]")
    openai_error(s, "/v1/completions", 400, "invalid_json", raw=b"{'single': 'quotes'}")
    anthropic_error(s, 400, "invalid_request_error", "invalid_json", raw=b"{nope")
    anthropic_error(s, 400, "invalid_request_error", "invalid_utf8", raw=b'{"x":"\xc3\x28"}')
    served(s)


def check_field_types(s):
    base = chat("hi", max_tokens=2)
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, messages="hello"), param="messages")
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, temperature="hot"), param="temperature")
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, max_tokens="5"), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, stream="yes"), param="stream")
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, stop=5), param="stop")
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, messages=[{"role": "user", "content": 7}]), param="messages[0].content")
    openai_error(s, "/v1/chat/completions", 400, "invalid_value", dict(base, temperature=-1), param="temperature")
    openai_error(s, "/v1/chat/completions", 400, "invalid_value", dict(base, top_logprobs=99, logprobs=True), param="top_logprobs")
    openai_error(s, "/v1/chat/completions", 400, "missing_field", {"model": "ds4"}, param="messages")
    openai_error(s, "/v1/responses", 400, "invalid_type", {"input": 5})
    openai_error(s, "/v1/completions", 400, "missing_field", {"max_tokens": 2})
    anthropic_error(s, 400, "invalid_request_error", "invalid_type", {"max_tokens": 2, "messages": [{"role": "user", "content": 5}]})
    anthropic_error(s, 400, "invalid_request_error", "missing_field", {"messages": [{"role": "user", "content": "hi"}]})


def check_budget_and_model(s):
    base = chat("hi", max_tokens=2)
    openai_error(s, "/v1/chat/completions", 404, "model_not_found", dict(base, model="gpt-4o"), param="model")
    anthropic_error(s, 404, "not_found_error", "model_not_found", {"model": "claude-x", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    openai_error(s, "/v1/chat/completions", 400, "invalid_max_tokens", dict(base, max_tokens=-5), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "invalid_max_tokens", dict(base, max_tokens=0), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "invalid_max_tokens", dict(base, max_tokens=10**12), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "invalid_max_tokens", dict(base, max_tokens=10**30), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "invalid_max_tokens", dict(base, max_tokens=1e30), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "invalid_type", dict(base, max_tokens=2.5), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "context_length_exceeded", dict(base, max_tokens=CTX - 3), param="max_tokens")
    openai_error(s, "/v1/chat/completions", 400, "context_length_exceeded", chat("word " * 400, max_tokens=1))
    openai_error(s, "/v1/responses", 400, "invalid_max_tokens", {"input": "hi", "max_output_tokens": -1})
    anthropic_error(s, 400, "invalid_request_error", "context_length_exceeded",
                    {"max_tokens": CTX, "messages": [{"role": "user", "content": "hi"}]})
    # Unknown fields are ignored, at every level.
    st, r = request(s, "POST", "/v1/chat/completions", dict(base, frobnicate={"x": [1]}, messages=[{"role": "user", "content": "hi", "name": "x", "extra": 1}]))
    assert st == 200, r


def check_routes(s):
    st, r = request(s, "GET", "/v1/nothing")
    assert st == 404 and r["error"]["code"] == "not_found"
    st, r = request(s, "GET", "/v1/chat/completions")
    assert st == 405 and r["error"]["code"] == "method_not_allowed"
    # Not HTTP at all: a 400, the connection closed, the server unharmed.
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(b"GARBAGE \x01\x02\r\n\r\n")
        data = sock.recv(4096)
        assert data.startswith(b"HTTP/1.1 400"), data
    served(s)


def check_oversized():
    with Server(binary, model, "--max-body", "4096") as s:
        body = chat("x" * 10000, max_tokens=1)
        openai_error(s, "/v1/chat/completions", 413, "body_too_large", body)
        r = anthropic_error(s, 413, "request_too_large", "body_too_large", {"max_tokens": 1, "messages": [{"role": "user", "content": "y" * 10000}]})
        served(s)


def check_api_key():
    with Server(binary, model, api_key="sekrit") as s:
        openai_error(s, "/v1/chat/completions", 401, "invalid_api_key", chat("hi", max_tokens=1), headers={"X-Nothing": "1"})
        openai_error(s, "/v1/chat/completions", 401, "invalid_api_key", chat("hi", max_tokens=1), headers={"Authorization": "Bearer wrong"})
        anthropic_error(s, 401, "authentication_error", "invalid_api_key", {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        st, _ = request(s, "GET", "/v1/models")
        assert st == 401
        st, _ = request(s, "GET", "/health")
        assert st == 200, "/health is public"
        st, r = request(s, "POST", "/v1/chat/completions", chat("hi", max_tokens=1), headers={"Authorization": "Bearer sekrit"})
        assert st == 200, r
        st, r = request(s, "POST", "/v1/messages", {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}, headers={"x-api-key": "sekrit"})
        assert st == 200, r
        st, events, _ = stream(s, "/v1/chat/completions", chat("hi", max_tokens=1, stream=True), headers={"Authorization": "Bearer sekrit"})
        assert st == 200 and events[-1][1] == "[DONE]"


def check_memory_governor():
    # The tiny model's sequence_bytes: about 2.1 MB for a short sequence, 2.4 MB past 3000 tokens.
    with Server(binary, model, "--kv-budget", "2400000", "--model-alias", "claude-x") as s:
        e = openai_error(s, "/v1/chat/completions", 503, "insufficient_memory", chat("hi", max_tokens=4000), param="max_tokens")
        assert e["retryable"] is False and e["bytes_missing"] > 0 and str(e["bytes_missing"]) in e["message"], e
        r = anthropic_error(s, 503, "overloaded_error", "insufficient_memory", {"max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}]})
        st, r, _ = stream(s, "/v1/chat/completions", chat("hi", max_tokens=4000, stream=True))
        assert st == 503 and r["error"]["code"] == "insufficient_memory", "a stream refused at admission is an HTTP error"
        # Two that fit one at a time: the second waits in the queue, then runs; both succeed.
        out = [None, None]
        body = dict(chat("hi", max_tokens=2000, reasoning_effort="none", model="claude-x"), stop=list("aeiou ,.'"))

        def run(i):
            out[i] = request(s, "POST", "/v1/chat/completions", body, timeout=120)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(o and o[0] == 200 for o in out), out
        queued = max(o[1]["timings"]["queue_ms"] for o in out)
        first = min(out, key=lambda o: o[1]["timings"]["queue_ms"])[1]["timings"]
        assert queued >= 0.5 * (first["ttft_ms"] + first["decode_ms"]), ("the second waited for the first", out)


def check_mem_floor():
    # The floor of free memory is never crossed: a floor that leaves less free memory than one
    # request needs refuses it, retryable (429) while the machine could hold it once memory comes
    # back, never (503) when the floor is the whole device. Both with the bytes missing.
    with Server(binary, model) as s:
        m = request(s, "GET", "/v1/stats")[1]["memory"]
        assert m["floor"] == 0 and m["device_total"] > 0 and m["device_free"] > 0, m
        st, r = request(s, "POST", "/v1/chat/completions", chat("hi", max_tokens=4))
        assert st == 200
    room = m["device_total"] - m["weights"] - m["scratch"]
    seq = 3_000_000  # over the tiny model's sequence_bytes for a short request (errors_test's governor check)
    with Server(binary, model, "--mem-floor", str(room - seq)) as s:
        st, r = request(s, "POST", "/v1/chat/completions", chat("hi", max_tokens=4))
        e = r["error"]
        assert st == 429 and e["code"] == "insufficient_memory" and e["retryable"] is True and e["bytes_missing"] > 0 and str(e["bytes_missing"]) in e["message"], e
        # The engine thread publishes its counters after the step that sent the refusal: a client
        # can ask before that (seen under load), so this polls (at most 5 s).
        wait_until(lambda: request(s, "GET", "/v1/stats")[1]["memory"]["refusals"] == 1, 5, "the refusal counted")
        st, st2 = request(s, "GET", "/v1/stats")
        assert st2["memory"]["refusals"] == 1 and st2["memory"]["floor"] == room - seq, st2["memory"]
        st, met = request(s, "GET", "/metrics")
        assert "\nds4_memory_refusals_total 1\n" in met
    with Server(binary, model, "--mem-floor", str(m["device_total"])) as s:
        st, r = request(s, "POST", "/v1/chat/completions", chat("hi", max_tokens=4))
        e = r["error"]
        assert st == 503 and e["code"] == "insufficient_memory" and e["retryable"] is False and e["bytes_missing"] > 0, e
        assert request(s, "GET", "/health")[0] == 200, "refusals leave the server up"


def check_many_under_small_budget():
    # 64 concurrent requests against a budget of about one sequence: the ones that can never fit
    # are refused (503, bytes missing), the rest queue and are served; the server stays up and
    # every page and charge returns at the end.
    with Server(binary, model, "--kv-budget", "2400000", "--prefix-cache", "0") as s:
        out = [None] * 64

        def run(i):
            body = chat(f"Request {i} " + "about caches " * (i % 4), max_tokens=4000 if i % 2 else 6, reasoning_effort="none")
            try:
                out[i] = request(s, "POST", "/v1/chat/completions", body, timeout=150)
            except OSError as e:
                out[i] = (0, str(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(160)
        for i, (st, r) in enumerate(out):
            if i % 2:
                assert st == 503 and r["error"]["code"] == "insufficient_memory" and r["error"]["bytes_missing"] > 0, (i, st, r)
            else:
                assert st == 200 and r["usage"]["completion_tokens"] > 0, (i, st, r)
        assert request(s, "GET", "/health")[0] == 200

        def drained():
            st = request(s, "GET", "/v1/stats")[1]
            return (st["sequences"]["backend"] == 0 and st["memory"]["kv_pages_used"] == 0 and st["memory"]["charged"] == 0
                    and st["queue"]["waiting"] == 0)

        wait_until(drained, 10, "every page and charge returned")
        assert request(s, "GET", "/v1/stats")[1]["memory"]["refusals"] == 32


def check_flags():
    import subprocess
    for bad in (["--port", "abc"], ["--max-seqs", "0"], ["--nope"]):
        r = subprocess.run([binary, "--model", model, "--backend", "cpu", *bad], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and r.stderr, (bad, r.returncode, r.stderr)
    r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--api-key" in r.stdout and "--max-seqs" in r.stdout
    r = subprocess.run([binary, "--model", model + ".missing", "--backend", "cpu"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "does not exist" in r.stderr, r.stderr


with Server(binary, model, "--ctx", str(CTX)) as s:
    suite.run("malformed bodies", check_body_errors, s)
    suite.run("wrong field types and values", check_field_types, s)
    suite.run("budget, model, unknown fields", check_budget_and_model, s)
    suite.run("routes and garbage", check_routes, s)
suite.run("oversized bodies", check_oversized)
suite.run("api key", check_api_key)
suite.run("flags: bad ones exit 2, --help 0, a missing model 1", check_flags)
suite.run("memory governor: refusal and queueing; model aliases", check_memory_governor)
suite.run("memory floor: 429 when a retry can succeed, 503 when never", check_mem_floor)
suite.run("64 concurrent under a one-sequence budget: served or refused, all pages back", check_many_under_small_budget)
suite.exit()
