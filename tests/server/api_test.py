#!/usr/bin/env python3
"""Every endpoint, buffered and streaming, against each API's documented event lifecycle."""
import json
import math
import re
import socket
import sys
import time

from ds4_server import Server, Suite, args, chat, request, stream

binary, model = args()[:2]
suite = Suite()


def data_events(events):
    return [d for _, d in events]


def check_chat_buffered(s):
    st, r = request(s, "POST", "/v1/chat/completions", chat("Hello there", max_tokens=6))
    assert st == 200, r
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-") and r["model"] == "deepseek-v4-flash"
    c = r["choices"][0]
    assert c["message"]["role"] == "assistant" and c["finish_reason"] in ("length", "stop")
    assert "reasoning_content" in c["message"], "thinking is on by default"
    u = r["usage"]
    assert u["prompt_tokens"] > 0 and 1 <= u["completion_tokens"] <= 6 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] == 0
    for k in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert r["timings"][k] >= 0, k
    assert r["timings"]["ttft_ms"] > 0


def chat_stream_text(s, body):
    st, events, _ = stream(s, "/v1/chat/completions", dict(body, stream=True))
    assert st == 200, events
    ds = data_events(events)
    assert ds[-1] == "[DONE]", "the stream ends with [DONE]"
    chunks = ds[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", "the first chunk carries the role"
    finish = [i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(finish) == 1, "exactly one chunk has a finish_reason"
    fc = chunks[finish[0]]
    assert "timings" in fc and "usage" in fc
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks[: finish[0]])
    content = "".join(c["choices"][0]["delta"].get("content", "") or "" for c in chunks[: finish[0]])
    return reasoning, content, fc["choices"][0]["finish_reason"], chunks[finish[0] + 1:]


def check_chat_stream(s):
    body = chat("Tell me a story", max_tokens=10)
    st, r = request(s, "POST", "/v1/chat/completions", body)
    reasoning, content, finish, after = chat_stream_text(s, body)
    m = r["choices"][0]["message"]
    assert (reasoning, content) == (m.get("reasoning_content", ""), m["content"] or ""), "stream == buffered"
    assert finish == r["choices"][0]["finish_reason"]
    assert after == [], "no chunk after the finish chunk without include_usage"
    _, _, _, after = chat_stream_text(s, dict(body, stream_options={"include_usage": True}))
    assert len(after) == 1 and after[0]["choices"] == [] and after[0]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"]


def check_thinking_off(s):
    st, r = request(s, "POST", "/v1/chat/completions", chat("Hi", max_tokens=5, reasoning_effort="none"))
    assert st == 200 and "reasoning_content" not in r["choices"][0]["message"], r
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    reasoning, content, _, _ = chat_stream_text(s, chat("Hi", max_tokens=5, reasoning_effort="none"))
    assert reasoning == "" and content == r["choices"][0]["message"]["content"]
    st, on = request(s, "POST", "/v1/chat/completions", chat("Hi", max_tokens=5))
    assert on["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0 or on["choices"][0]["message"]["content"]


def check_logprobs(s):
    st, r = request(s, "POST", "/v1/chat/completions", chat("Numbers", max_tokens=5, logprobs=True, top_logprobs=3))
    assert st == 200, r
    entries = r["choices"][0]["logprobs"]["content"]
    assert len(entries) == r["usage"]["completion_tokens"] or r["choices"][0]["finish_reason"] == "stop"
    for e in entries:
        top = e["top_logprobs"]
        assert len(top) == 3
        assert all(top[i]["logprob"] >= top[i + 1]["logprob"] for i in range(2)), "alternatives by logprob, descending"
        # Greedy: the sampled token is the most likely one.
        assert e["bytes"] == top[0]["bytes"] and abs(e["logprob"] - top[0]["logprob"]) < 1e-6
        assert e["logprob"] <= 0 and sum(math.exp(t["logprob"]) for t in top) <= 1.0 + 1e-5
    # Streamed logprobs cover the same tokens.
    st, events, _ = stream(s, "/v1/chat/completions", chat("Numbers", max_tokens=5, logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for _, c in events[:-1] for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert [e["bytes"] for e in streamed] == [e["bytes"] for e in entries]


def check_stop_and_seed(s):
    base = chat("Once upon a time", max_tokens=12, reasoning_effort="none")
    st, r = request(s, "POST", "/v1/chat/completions", base)
    text = r["choices"][0]["message"]["content"]
    clean = [i for i in range(2, len(text) - 2) if "\ufffd" not in text[i:i + 2]]
    assert clean, "greedy output has a clean substring: " + repr(text)
    stop = text[clean[len(clean) // 2]: clean[len(clean) // 2] + 2]
    cut = text.find(stop)
    st, r2 = request(s, "POST", "/v1/chat/completions", dict(base, stop=[stop, "\x00never"]))
    assert r2["choices"][0]["message"]["content"] == text[:cut] and r2["choices"][0]["finish_reason"] == "stop", (text, stop, r2)
    _, content, finish, _ = chat_stream_text(s, dict(base, stop=stop))
    assert content == text[:cut] and finish == "stop"
    sampled = dict(base, temperature=1.0, top_p=0.95, top_k=50, min_p=0.01, seed=42)
    a = request(s, "POST", "/v1/chat/completions", sampled)[1]["choices"][0]["message"]["content"]
    b = request(s, "POST", "/v1/chat/completions", sampled)[1]["choices"][0]["message"]["content"]
    assert a == b, "a seed makes sampling reproducible"


def check_completions(s):
    body = {"model": "ds4", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    st, r = request(s, "POST", "/v1/completions", body)
    assert st == 200 and r["object"] == "text_completion", r
    c = r["choices"][0]
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == r["usage"]["completion_tokens"]
    assert "".join(lp["tokens"]).encode("utf-8", "replace") and all(len(t) <= 2 for t in lp["top_logprobs"])
    st, events, _ = stream(s, "/v1/completions", dict(body, stream=True, logprobs=None))
    ds = data_events(events)
    assert ds[-1] == "[DONE]"
    finishes = [d for d in ds[:-1] if d["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0] is ds[-2]
    assert "".join(d["choices"][0]["text"] for d in ds[:-1]) == c["text"], "stream == buffered"
    st, r = request(s, "POST", "/v1/completions", {"prompt": [1521, 100, 200], "max_tokens": 2})
    assert st == 200 and r["usage"]["prompt_tokens"] == 3, r


def check_n_choices(s):
    """OpenAI's n: choice i is the answer a one-choice request with seed + i gives (content and
    logprobs), streamed chunks name their choice, one finish per choice, one [DONE] after the last;
    usage counts the prompt once and sums the answers; the later choices fork the first one's
    cached prompt instead of prefilling it."""
    msgs = [{"role": "system", "content": "You are a careful assistant who answers briefly."},
            {"role": "user", "content": "Name a colour of the sea at dusk."}]
    body = {"model": "ds4", "messages": msgs, "max_tokens": 6, "temperature": 1.0, "seed": 40, "logprobs": True,
            "reasoning_effort": "none"}
    singles = [request(s, "POST", "/v1/chat/completions", dict(body, seed=40 + i))[1] for i in range(3)]
    hits0 = request(s, "GET", "/v1/stats")[1]["prefix_cache"]["hits"]
    st, r = request(s, "POST", "/v1/chat/completions", dict(body, n=3, messages=msgs + [{"role": "user", "content": "Again."}]))
    assert st == 200 and [c["index"] for c in r["choices"]] == [0, 1, 2], r
    assert request(s, "GET", "/v1/stats")[1]["prefix_cache"]["hits"] >= hits0 + 2, "choices 1 and 2 fork choice 0's prompt"
    st, r = request(s, "POST", "/v1/chat/completions", dict(body, n=3))
    assert st == 200 and len(r["choices"]) == 3, r
    for i, c in enumerate(r["choices"]):
        one = singles[i]["choices"][0]
        assert c["index"] == i and c["message"]["content"] == one["message"]["content"], (i, c, one)
        assert [e["logprob"] for e in c["logprobs"]["content"]] == [e["logprob"] for e in one["logprobs"]["content"]]
    u = r["usage"]
    assert u["prompt_tokens"] == singles[0]["usage"]["prompt_tokens"], u
    assert u["completion_tokens"] == sum(x["usage"]["completion_tokens"] for x in singles), u
    st, events, _ = stream(s, "/v1/chat/completions", dict(body, n=2, stream=True, stream_options={"include_usage": True}))
    ds = data_events(events)
    assert st == 200 and ds[-1] == "[DONE]" and ds.count("[DONE]") == 1, ds[-3:]
    chunks = [d for d in ds[:-1] if d["choices"]]
    for i in range(2):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"].get("role") == "assistant" and sum(1 for c in mine if c["finish_reason"]) == 1, mine
        text = "".join(c["delta"].get("content", "") for c in mine)
        assert text == r["choices"][i]["message"]["content"], (i, text)
    assert not ds[-2]["choices"] and ds[-2]["usage"]["completion_tokens"] == sum(
        x["usage"]["completion_tokens"] for x in singles[:2]), ds[-2]
    comp = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0.9, "seed": 7}
    one = [request(s, "POST", "/v1/completions", dict(comp, seed=7 + i))[1]["choices"][0]["text"] for i in range(2)]
    st, rc = request(s, "POST", "/v1/completions", dict(comp, n=2))
    assert st == 200 and [c["text"] for c in rc["choices"]] == one and [c["index"] for c in rc["choices"]] == [0, 1], rc
    for bad in (0, 129):
        st, e = request(s, "POST", "/v1/chat/completions", dict(body, n=bad))
        assert st == 400 and e["error"]["code"] == "invalid_value" and e["error"]["param"] == "n", e


def check_tokenize(s):
    """/tokenize gives the tokens the generating routes feed (their usage.prompt_tokens counts them)
    and /detokenize their text back; bad ids and missing fields are named."""
    text = "The capital of France is"
    st, t = request(s, "POST", "/tokenize", {"model": "ds4", "prompt": text, "return_token_strs": True})
    assert st == 200 and t["count"] == len(t["tokens"]) == len(t["token_strs"]) and t["max_model_len"] > 0, t
    st, c = request(s, "POST", "/v1/completions", {"prompt": text, "max_tokens": 1})
    assert c["usage"]["prompt_tokens"] == t["count"], (c["usage"], t)
    st, d = request(s, "POST", "/detokenize", {"tokens": t["tokens"]})
    assert st == 200 and d["prompt"] == "".join(t["token_strs"]) and d["prompt"].endswith(text), d
    st, d1 = request(s, "POST", "/detokenize", {"tokens": t["tokens"][1:]})
    assert d1["prompt"] == text, d1  # past BOS the text round-trips
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    st, tm = request(s, "POST", "/tokenize", {"messages": messages, "reasoning_effort": "none"})
    st, cm = request(s, "POST", "/v1/chat/completions", {"messages": messages, "reasoning_effort": "none", "max_tokens": 1})
    assert st == 200 and cm["usage"]["prompt_tokens"] == tm["count"] > t["count"], (cm["usage"], tm["count"])
    st, e = request(s, "POST", "/detokenize", {"tokens": [1, 10 ** 9]})
    assert st == 400 and e["error"]["code"] == "invalid_value" and e["error"]["param"] == "tokens[1]", e
    st, e = request(s, "POST", "/detokenize", {"tokens": [1, "x"]})
    assert st == 400 and e["error"]["code"] == "invalid_type" and e["error"]["param"] == "tokens[1]", e
    st, e = request(s, "POST", "/tokenize", {"model": "ds4"})
    assert st == 400 and e["error"]["code"] == "missing_field", e


def check_logit_controls(s):
    """logit_bias, frequency_penalty and presence_penalty: a token biased by +100 is every greedy
    token (its text checked through /detokenize), the penalties change a greedy answer, and bad
    values are refused naming the field (repetition_penalty, a multiplicative change, is refused
    unless 1)."""
    st, t = request(s, "POST", "/tokenize", {"prompt": "the sea"})
    sea = t["tokens"][-1]  # a whole word's token: its text does not depend on its neighbours
    body = {"model": "ds4", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 0}
    st, r = request(s, "POST", "/v1/completions", dict(body, logit_bias={str(sea): 100}))
    assert st == 200 and r["usage"]["completion_tokens"] == 5, r
    st, d = request(s, "POST", "/detokenize", {"tokens": [sea] * 5})
    assert d["prompt"] != "" and "\ufffd" not in d["prompt"], d
    assert r["choices"][0]["text"] == d["prompt"], (r["choices"][0]["text"], d)
    chat_body = {"model": "ds4", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16,
                 "temperature": 0, "reasoning_effort": "none"}
    st, plain = request(s, "POST", "/v1/chat/completions", chat_body)
    st, pen = request(s, "POST", "/v1/chat/completions", dict(chat_body, presence_penalty=2, frequency_penalty=2))
    assert st == 200 and pen["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"], pen
    st, zero = request(s, "POST", "/v1/chat/completions", dict(chat_body, presence_penalty=0, frequency_penalty=0,
                                                             logit_bias={}, repetition_penalty=1))
    assert zero["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"], zero
    for extra, code, param in (({"logit_bias": {"abc": 1}}, "invalid_value", "logit_bias.abc"),
                               ({"logit_bias": {"99999999": 1}}, "invalid_value", "logit_bias.99999999"),
                               ({"logit_bias": {"5": 101}}, "invalid_value", "logit_bias.5"),
                               ({"logit_bias": {"5": "up"}}, "invalid_type", "logit_bias.5"),
                               ({"logit_bias": {"5": 1, "05": 2}}, "invalid_value", "logit_bias"),
                               ({"logit_bias": [1]}, "invalid_type", "logit_bias"),
                               ({"frequency_penalty": 2.5}, "invalid_value", "frequency_penalty"),
                               ({"presence_penalty": "x"}, "invalid_type", "presence_penalty"),
                               ({"repetition_penalty": 1.1}, "invalid_value", "repetition_penalty")):
        st, e = request(s, "POST", "/v1/chat/completions", dict(chat_body, **extra))
        assert st == 400 and e["error"]["code"] == code and e["error"]["param"] == param, (extra, e)


def check_responses(s):
    body = {"model": "ds4", "input": "Hello", "max_output_tokens": 6, "temperature": 0, "reasoning": {"effort": "low"}}
    st, r = request(s, "POST", "/v1/responses", body)
    assert st == 200 and r["object"] == "response" and r["status"] in ("completed", "incomplete"), r
    assert r["output"][0]["type"] == "reasoning", "reasoning items when asked for"
    assert r["usage"]["output_tokens"] >= 1 and "timings" in r
    st, events, _ = stream(s, "/v1/responses", dict(body, stream=True))
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"], names
    assert names[-1] in ("response.completed", "response.incomplete")
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(n == d["type"] for n, d in events)
    # Items open and close in order, deltas only inside an open item.
    open_item = None
    for n, d in events[2:-1]:
        if n == "response.output_item.added":
            assert open_item is None
            open_item = d["item"]["id"]
        elif n == "response.output_item.done":
            assert d["item"]["id"] == open_item
            open_item = None
        else:
            assert open_item is not None and d["item_id"] == open_item, n
    assert open_item is None
    texts = [i["content"][0]["text"] for i in events[-1][1]["response"]["output"]]
    assert texts == [i["content"][0]["text"] for i in r["output"]], "stream == buffered"
    st, r = request(s, "POST", "/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}], "max_output_tokens": 3})
    assert st == 200 and all(o["type"] != "reasoning" for o in r["output"]), "no reasoning item unless asked"


def check_messages(s):
    body = {"model": "ds4", "max_tokens": 8, "temperature": 0, "system": "Be brief.", "messages": [{"role": "user", "content": "Hello"}]}
    st, r = request(s, "POST", "/v1/messages", body)
    assert st == 200 and r["type"] == "message" and r["role"] == "assistant", r
    assert r["content"][0]["type"] == "thinking", "thinking first, on by default"
    assert r["stop_reason"] in ("max_tokens", "end_turn") and r["usage"]["output_tokens"] >= 1
    st, events, _ = stream(s, "/v1/messages", dict(body, stream=True))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    index, blocks = -1, []
    for n, d in events[1:-2]:
        assert n == d["type"], n
        if n == "content_block_start":
            assert d["index"] == index + 1
            index = d["index"]
            blocks.append(dict(d["content_block"]))
        elif n == "content_block_delta":
            assert d["index"] == index
            k = {"thinking_delta": "thinking", "text_delta": "text"}[d["delta"]["type"]]
            blocks[-1][k] += d["delta"][k]
        elif n == "content_block_stop":
            assert d["index"] == index
    assert [(b["type"], b.get("text", b.get("thinking"))) for b in blocks] == \
           [(b["type"], b.get("text", b.get("thinking"))) for b in r["content"]], "stream == buffered"
    assert events[-2][1]["delta"]["stop_reason"] == r["stop_reason"]
    st, r = request(s, "POST", "/v1/messages", dict(body, thinking={"type": "disabled"}))
    assert all(b["type"] != "thinking" for b in r["content"]), r
    st, n = request(s, "POST", "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    assert st == 200 and n["input_tokens"] == events[0][1]["message"]["usage"]["input_tokens"], (n, events[0])


def check_info(s):
    st, r = request(s, "GET", "/v1/models")
    assert st == 200 and r["object"] == "list" and r["data"][0]["id"] == "deepseek-v4-flash"
    st, r = request(s, "GET", "/health")
    assert st == 200 and r["status"] == "ok"
    st, text = request(s, "GET", "/metrics")
    assert st == 200
    names = set()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+)", line)
        assert m, "Prometheus sample line: " + line
        float(m.group(2))
        names.add(m.group(1))
    assert {"ds4_sequences_running", "ds4_decode_tokens_total", "ds4_heartbeat_age_seconds"} <= names
    # Idle once the scheduler has published the step that finished the earlier checks: it sends
    # a request's last event during the step and its counts (running, cache entries) after it,
    # while the backend's sequence count is live, so for one step the two can disagree. Polled,
    # at most 5 s.
    deadline = time.monotonic() + 5.0
    while True:
        st, r = request(s, "GET", "/v1/stats")
        settled = st == 200 and r["sequences"]["running"] == 0 and r["sequences"]["backend"] == r["prefix_cache"]["entries"]
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert settled and r["steps"]["count"] > 0, r
    assert r["steps"]["backend_s"] > 0 and r["steps"]["host_s"] >= 0, r["steps"]
    assert {"ds4_step_backend_seconds_total", "ds4_step_host_seconds_total"} <= names


def check_keep_alive(s):
    conn = s.conn()
    for i in range(3):
        st, r = request(conn, "POST", "/v1/chat/completions", chat("Again", max_tokens=2))
        assert st == 200
        st, events, _ = stream(conn, "/v1/chat/completions", chat("Again", max_tokens=2, stream=True))
        assert events[-1][1] == "[DONE]"
    st, r = request(conn, "GET", "/health")
    assert st == 200
    conn.close()


def raw_exchange(s, request_bytes, wait_s=0.0, then=b""):
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        sock.sendall(request_bytes)
        first = b""
        if wait_s:
            sock.settimeout(wait_s)
            try:
                first = sock.recv(4096)
            except socket.timeout:
                pass
            sock.settimeout(30)
        sock.sendall(then)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return first, data
            data += chunk


def check_expect_continue_and_http10(s):
    body = json.dumps(chat("hi", max_tokens=2)).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    first, rest = raw_exchange(s, head, wait_s=5.0, then=body)
    assert first.startswith(b"HTTP/1.1 100 Continue"), first
    assert b"HTTP/1.1 200" in first + rest and b"chat.completion" in first + rest
    # HTTP/1.0 has no chunked coding: the stream is raw SSE that ends with the connection.
    body = json.dumps(chat("hi", max_tokens=2, stream=True)).encode()
    _, data = raw_exchange(s, b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    headers, _, payload = data.partition(b"\r\n\r\n")
    assert b"chunked" not in headers.lower() and b"text/event-stream" in headers, headers
    assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n"), payload[-80:]


with Server(binary, model) as s:
    suite.run("chat buffered", check_chat_buffered, s)
    suite.run("chat streaming lifecycle", check_chat_stream, s)
    suite.run("thinking off", check_thinking_off, s)
    suite.run("logprobs", check_logprobs, s)
    suite.run("stop strings and seeds", check_stop_and_seed, s)
    suite.run("completions", check_completions, s)
    suite.run("tokenize and detokenize", check_tokenize, s)
    suite.run("n choices", check_n_choices, s)
    suite.run("logit_bias and penalties", check_logit_controls, s)
    suite.run("responses lifecycle", check_responses, s)
    suite.run("messages lifecycle", check_messages, s)
    suite.run("models, health, metrics, stats", check_info, s)
    suite.run("keep-alive connection", check_keep_alive, s)
    suite.run("Expect: 100-continue, HTTP/1.0 streaming", check_expect_continue_and_http10, s)
suite.exit()
