#!/usr/bin/env python3
"""Tool calls end to end over HTTP, OpenAI and Anthropic shapes, buffered and streamed: a request
with tools -> the model's DSML becomes tool_calls / tool_use -> the client sends the call and its
result back -> the server renders the earlier turn to exactly the tokens the model saw.

The random tiny model never writes DSML, so the server runs with the --debug-forced-output hook:
every answer is the tokens of a hand-written turn (reasoning, </think>, a sentence, one DSML call),
fed back into the sequence exactly as sampled tokens are. "Rendered byte-identically" is checked
through the prefix cache, which matches token ids exactly: a finished turn stays cached as its
prompt plus every answer token but the last (EOS, never fed), so the follow-up request's
cached_tokens equals prompt_tokens + completion_tokens - 1 of the first request exactly when its
rendering repeats those tokens; one token rendered differently anywhere makes it smaller.
"""
import json

from ds4_server import Server, Suite, args, request, stream

binary, model = args()[:2]
suite = Suite()

REASONING = "I need the forecast."
CONTENT = "Let me look that up."
DSML = ("\n\n<\uFF5CDSML\uFF5Ctool_calls>\n<\uFF5CDSML\uFF5Cinvoke name=\"get_weather\">\n"
        "<\uFF5CDSML\uFF5Cparameter name=\"city\" string=\"true\">Paris</\uFF5CDSML\uFF5Cparameter>\n"
        "<\uFF5CDSML\uFF5Cparameter name=\"days\" string=\"false\">3</\uFF5CDSML\uFF5Cparameter>\n"
        "</\uFF5CDSML\uFF5Cinvoke>\n</\uFF5CDSML\uFF5Ctool_calls>")
ANSWER = REASONING + "</think>" + CONTENT + DSML
ARGS = {"city": "Paris", "days": 3}
OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city",
                                                 "parameters": {"type": "object", "properties": {
                                                     "city": {"type": "string"}, "days": {"type": "integer"}}}}}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Forecast for a city",
                  "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}


def openai_body(question, **extra):
    return dict({"model": "ds4", "messages": [{"role": "user", "content": question}], "tools": [OPENAI_TOOL],
                 "temperature": 0, "max_tokens": 400}, **extra)


def openai_follow_up(body, message, result):
    """The client's next request: the assistant turn as the API gave it, then the tool's result."""
    call = message["tool_calls"][0]
    messages = body["messages"] + [{"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
                                   {"role": "tool", "tool_call_id": call["id"], "content": result}]
    return dict(body, messages=messages, stream=False, max_tokens=2)  # its answer is not what is checked


def check_openai_buffered(s):
    body = openai_body("Weather in Paris?")
    st, r = request(s, "POST", "/v1/chat/completions", body)
    assert st == 200, r
    choice = r["choices"][0]
    msg = choice["message"]
    assert choice["finish_reason"] == "tool_calls", choice
    assert msg["reasoning_content"] == REASONING and msg["content"] == CONTENT, msg
    assert len(msg["tool_calls"]) == 1 and msg["tool_calls"][0]["type"] == "function", msg
    fn = msg["tool_calls"][0]["function"]
    assert fn["name"] == "get_weather" and json.loads(fn["arguments"]) == ARGS, fn
    seen = r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1
    st, r2 = request(s, "POST", "/v1/chat/completions", openai_follow_up(body, msg, "sunny, 21 C"))
    assert st == 200, r2
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == seen, f"the follow-up reuses {cached} tokens of the {seen} the model saw: its rendering differs"
    assert r2["usage"]["prompt_tokens"] > seen + 5, "the tool result follows the turn"
    # The check is sharp: a turn the server does not know (an unseen call id, so no memory of
    # the sampled text) with one character changed reuses fewer tokens.
    changed = dict(msg, content=CONTENT + " ", tool_calls=[dict(msg["tool_calls"][0], id="call_unseen")])
    st, r3 = request(s, "POST", "/v1/chat/completions", openai_follow_up(body, changed, "sunny, 21 C"))
    assert st == 200 and r3["usage"]["prompt_tokens_details"]["cached_tokens"] < seen, r3["usage"]


def check_openai_streamed(s):
    body = openai_body("Weather in Rome?", stream=True, stream_options={"include_usage": True})
    st, events, _ = stream(s, "/v1/chat/completions", body)
    assert st == 200 and events[-1][1] == "[DONE]", events[-3:]
    chunks = [d for _, d in events[:-1]]
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant", chunks[0]
    reasoning = content = arguments = ""
    calls, finish, usage = [], None, None
    for c in chunks:
        usage = c.get("usage") or usage
        for ch in c["choices"]:
            d = ch["delta"]
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                assert tc["index"] == 0, tc
                if "id" in tc:
                    calls.append({"id": tc["id"], "type": tc["type"], "function": {"name": tc["function"]["name"], "arguments": ""}})
                calls[-1]["function"]["arguments"] += tc["function"].get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    assert reasoning == REASONING and content == CONTENT and finish == "tool_calls", (reasoning, content, finish)
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather", calls
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS, calls
    seen = usage["prompt_tokens"] + usage["completion_tokens"] - 1
    message = {"role": "assistant", "content": content, "tool_calls": calls}
    st, r2 = request(s, "POST", "/v1/chat/completions", openai_follow_up(body, message, "rain, 14 C"))
    assert st == 200 and r2["usage"]["prompt_tokens_details"]["cached_tokens"] == seen, (r2.get("usage"), seen)


def anthropic_body(question, **extra):
    return dict({"model": "ds4", "max_tokens": 400, "temperature": 0, "tools": [ANTHROPIC_TOOL],
                 "messages": [{"role": "user", "content": question}]}, **extra)


def anthropic_follow_up(body, content, result):
    use = next(b for b in content if b["type"] == "tool_use")
    messages = body["messages"] + [{"role": "assistant", "content": content},
                                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": result}]}]
    return dict(body, messages=messages, stream=False, max_tokens=2)


def prompt_tokens(usage):
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def check_anthropic_buffered(s):
    body = anthropic_body("Weather in Oslo?")
    st, r = request(s, "POST", "/v1/messages", body)
    assert st == 200 and r["stop_reason"] == "tool_use", r
    assert [b["type"] for b in r["content"]] == ["thinking", "text", "tool_use"], r["content"]
    assert r["content"][0]["thinking"] == REASONING and r["content"][1]["text"] == CONTENT
    use = r["content"][2]
    assert use["name"] == "get_weather" and use["input"] == ARGS and use["id"], use
    seen = prompt_tokens(r["usage"]) + r["usage"]["output_tokens"] - 1
    follow = anthropic_follow_up(body, r["content"], "sunny, 21 C")
    st, n = request(s, "POST", "/v1/messages/count_tokens", {k: v for k, v in follow.items() if k != "max_tokens"})
    st, r2 = request(s, "POST", "/v1/messages", follow)
    assert st == 200 and r2["usage"]["cache_read_input_tokens"] == seen, (r2.get("usage"), seen)
    assert prompt_tokens(r2["usage"]) == n["input_tokens"] > seen, (r2["usage"], n)


def check_anthropic_streamed(s):
    body = anthropic_body("Weather in Lima?", stream=True)
    st, events, _ = stream(s, "/v1/messages", body)
    assert st == 200, events
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    blocks, index = [], -1
    for n, d in events[1:-2]:
        assert n == d["type"], n
        if n == "content_block_start":
            assert d["index"] == index + 1, d
            index = d["index"]
            blocks.append(dict(d["content_block"], partial=""))
        elif n == "content_block_delta":
            assert d["index"] == index, d
            delta = d["delta"]
            if delta["type"] == "thinking_delta":
                blocks[-1]["thinking"] += delta["thinking"]
            elif delta["type"] == "text_delta":
                blocks[-1]["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                blocks[-1]["partial"] += delta["partial_json"]
            # signature_delta and others carry nothing the follow-up needs
        elif n == "content_block_stop":
            assert d["index"] == index, d
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"], blocks
    assert blocks[0]["thinking"] == REASONING and blocks[1]["text"] == CONTENT, blocks
    assert json.loads(blocks[2]["partial"]) == ARGS and blocks[2]["name"] == "get_weather", blocks[2]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use", events[-2]
    content = [{"type": "thinking", "thinking": blocks[0]["thinking"], "signature": blocks[0].get("signature", "")},
               {"type": "text", "text": blocks[1]["text"]},
               {"type": "tool_use", "id": blocks[2]["id"], "name": blocks[2]["name"], "input": json.loads(blocks[2]["partial"])}]
    start_usage = events[0][1]["message"]["usage"]
    seen = start_usage["input_tokens"] + events[-2][1]["usage"]["output_tokens"] - 1
    st, r2 = request(s, "POST", "/v1/messages", anthropic_follow_up(body, content, "fog, 9 C"))
    assert st == 200 and r2["usage"]["cache_read_input_tokens"] == seen, (r2.get("usage"), seen)


def check_ignore_eos(s):
    """ignore_eos (vLLM's extension, sent by benchmark clients): the forced answer ends in EOS; with
    it the EOS is a token like any other, without text, and the answer runs to max_tokens."""
    body = {"model": "ds4", "prompt": "Forecast?", "temperature": 0, "max_tokens": 400, "logprobs": 0}
    st, plain = request(s, "POST", "/v1/completions", body)
    assert st == 200 and plain["choices"][0]["finish_reason"] == "stop", plain
    n = plain["usage"]["completion_tokens"]  # the answer's tokens and its EOS
    st, r = request(s, "POST", "/v1/completions", dict(body, ignore_eos=True, max_tokens=n + 6))
    assert st == 200 and r["choices"][0]["finish_reason"] == "length", r
    assert r["usage"]["completion_tokens"] == n + 6, r["usage"]
    assert r["choices"][0]["text"] == plain["choices"][0]["text"] == ANSWER, r["choices"][0]["text"]
    assert len(r["choices"][0]["logprobs"]["tokens"]) == n + 6  # the EOS tokens reported too
    chat = {"model": "ds4", "messages": [{"role": "user", "content": "Forecast?"}], "temperature": 0, "max_tokens": n + 3,
            "ignore_eos": True}
    st, c = request(s, "POST", "/v1/chat/completions", chat)
    assert st == 200 and c["choices"][0]["finish_reason"] == "length" and c["usage"]["completion_tokens"] == n + 3, c
    st, e = request(s, "POST", "/v1/chat/completions", dict(chat, ignore_eos="yes"))
    assert st == 400 and e["error"]["code"] == "invalid_type" and e["error"]["param"] == "ignore_eos", e


with Server(binary, model, "--debug-forced-output", ANSWER) as server:
    suite.run("OpenAI chat, buffered: tools -> tool_calls -> result -> the turn re-renders exactly", check_openai_buffered, server)
    suite.run("OpenAI chat, streamed: tools -> tool_calls deltas -> result -> exact re-render", check_openai_streamed, server)
    suite.run("Anthropic messages, buffered: tools -> tool_use -> tool_result -> exact re-render", check_anthropic_buffered, server)
    suite.run("Anthropic messages, streamed: tool_use blocks -> tool_result -> exact re-render", check_anthropic_streamed, server)
    suite.run("ignore_eos: past EOS to max_tokens", check_ignore_eos, server)
suite.exit()
