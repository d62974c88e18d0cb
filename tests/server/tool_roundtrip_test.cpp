// The server's output layer in-process, on the tiny model's real tokenizer and the CPU backend:
// sampled DSML becomes OpenAI tool_calls / Anthropic tool_use (buffered and streamed), and the
// follow-up request that carries the calls and their results back renders the earlier turn to
// exactly the text, and tokens, the model saw. The random tiny model never writes DSML itself,
// so the sampled tokens are the tokenization of a hand-written turn, fed where the scheduler
// feeds sampled tokens.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/server/api/routes.hpp"
#include "examples/server/output_processor.hpp"
#include "tests/support/tiny_server.hpp"

namespace ds4::server {
namespace {

using json = nlohmann::json;

using fixture = tiny_server;

// What the model "samples": reasoning, </think>, a sentence, then one DSML call, then EOS.
const std::string reasoning = "I need the forecast.";
const std::string content = "Let me look that up.";
const std::string dsml =
    "\n\n<\uFF5CDSML\uFF5Ctool_calls>\n<\uFF5CDSML\uFF5Cinvoke name=\"get_weather\">\n"
    "<\uFF5CDSML\uFF5Cparameter name=\"city\" string=\"true\">Paris</\uFF5CDSML\uFF5Cparameter>\n"
    "<\uFF5CDSML\uFF5Cparameter name=\"days\" string=\"false\">3</\uFF5CDSML\uFF5Cparameter>\n"
    "</\uFF5CDSML\uFF5Cinvoke>\n</\uFF5CDSML\uFF5Ctool_calls>";
const std::string sampled_text = reasoning + "</think>" + content + dsml;

generation_plan plan_of(route_result r) {
    REQUIRE(std::holds_alternative<generation_plan>(r));
    return std::move(std::get<generation_plan>(r));
}

// Feeds the tokens as the scheduler does (deltas per token, then the final event) and returns
// the formatter's output: the buffered body, or the SSE text when streaming.
std::string drive(generation_plan& plan, const std::vector<std::int32_t>& tokens, const ref::tokenizer& tok) {
    output_processor proc(tok, plan.work->output);
    std::string sse = plan.stream ? plan.format->stream_start() : std::string();
    const auto emit = [&](const gen_event& ev) {
        if (plan.stream) sse += plan.format->stream_event(ev);
        else plan.format->collect(ev);
    };
    gen_event last;
    for (std::int32_t t : tokens) {
        gen_event ev;
        const bool over = proc.on_token(t, ev);
        if (over) {
            last = std::move(ev);
            break;
        }
        emit(ev);
    }
    proc.finish(last);
    last.final = true;
    last.reason = proc.tool_calls() > 0 ? finish_reason::tool_calls : finish_reason::stop;
    last.raw_reasoning = proc.raw_reasoning();
    last.raw_content = proc.raw_content();
    emit(last);
    return plan.stream ? sse : plan.format->buffered_response().body;
}

std::vector<json> sse_data(const std::string& sse) {
    std::vector<json> out;
    for (std::size_t at = 0; (at = sse.find("data: ", at)) != std::string::npos;) {
        const std::size_t end = sse.find("\n\n", at);
        const std::string payload = sse.substr(at + 6, end - at - 6);
        if (payload != "[DONE]") out.push_back(json::parse(payload));
        at = end;
    }
    return out;
}

bool starts_with(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& prefix) {
    return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

const json weather_tool_openai = json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "Forecast for a city", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}})");

TEST_CASE("OpenAI chat: DSML -> tool_calls -> tool result -> the turn renders byte-identically") {
    fixture f;
    const json request1 = {{"model", "ds4"}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", {weather_tool_openai}}};
    generation_plan p1 = plan_of(openai_chat(f.ctx, {"POST", "/v1/chat/completions", request1.dump(), {}}));
    const std::string prompt1 = f.tok.decode(p1.work->prompt);
    CHECK(prompt1.find("get_weather") != std::string::npos);  // the tools block is in the system prompt
    std::vector<std::int32_t> sampled = f.tok.encode(sampled_text, true);
    sampled.push_back(f.tok.eos_id());

    const json r1 = json::parse(drive(p1, sampled, f.tok));
    const json& msg = r1["choices"][0]["message"];
    CHECK(r1["choices"][0]["finish_reason"] == "tool_calls");
    CHECK(msg["reasoning_content"] == reasoning);
    CHECK(msg["content"] == content);
    REQUIRE(msg["tool_calls"].size() == 1);
    CHECK(msg["tool_calls"][0]["type"] == "function");
    CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
    CHECK(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}, {"days", 3}});

    // The same tokens streamed: the call's first chunk names it, the arguments arrive as deltas.
    json streamed_request = request1;
    streamed_request["stream"] = true;
    generation_plan ps = plan_of(openai_chat(f.ctx, {"POST", "/v1/chat/completions", streamed_request.dump(), {}}));
    std::string name, arguments, streamed_content;
    int begins = 0;
    for (const json& c : sse_data(drive(ps, sampled, f.tok))) {
        if (c["choices"].empty()) continue;
        const json& d = c["choices"][0]["delta"];
        if (d.contains("content")) streamed_content += d["content"].get<std::string>();
        if (!d.contains("tool_calls")) continue;
        const json& tc = d["tool_calls"][0];
        CHECK(tc["index"] == 0);
        if (tc.contains("id")) ++begins, name = tc["function"]["name"];
        arguments += tc["function"]["arguments"].get<std::string>();
    }
    CHECK(begins == 1);
    CHECK(name == "get_weather");
    CHECK(streamed_content == content);
    CHECK(json::parse(arguments) == json{{"city", "Paris"}, {"days", 3}});

    // The client sends the assistant turn back as the API gave it, plus the tool's result.
    json request2 = request1;
    request2["messages"].push_back({{"role", "assistant"}, {"content", msg["content"]}, {"tool_calls", msg["tool_calls"]}});
    request2["messages"].push_back({{"role", "tool"}, {"tool_call_id", msg["tool_calls"][0]["id"]}, {"content", "sunny, 21 C"}});
    generation_plan p2 = plan_of(openai_chat(f.ctx, {"POST", "/v1/chat/completions", request2.dump(), {}}));
    const std::string prompt2 = f.tok.decode(p2.work->prompt);
    const std::string seen = prompt1 + sampled_text + std::string(ref::eos_text);
    CHECK(prompt2.substr(0, seen.size()) == seen);
    CHECK(prompt2.find("<tool_result>sunny, 21 C</tool_result>", seen.size()) != std::string::npos);
    std::vector<std::int32_t> seen_tokens = p1.work->prompt;
    seen_tokens.insert(seen_tokens.end(), sampled.begin(), sampled.end());
    CHECK(starts_with(p2.work->prompt, seen_tokens));  // a prefix cache would hit all of it
}

TEST_CASE("Anthropic messages: DSML -> tool_use -> tool_result -> the turn renders byte-identically") {
    fixture f;
    const json tool = {{"name", "get_weather"}, {"description", "Forecast for a city"}, {"input_schema", {{"type", "object"}}}};
    const json request1 = {{"max_tokens", 64}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", {tool}}};
    generation_plan p1 = plan_of(anthropic_messages(f.ctx, {"POST", "/v1/messages", request1.dump(), {}}));
    std::vector<std::int32_t> sampled = f.tok.encode(sampled_text, true);
    sampled.push_back(f.tok.eos_id());
    const json r1 = json::parse(drive(p1, sampled, f.tok));
    CHECK(r1["stop_reason"] == "tool_use");
    REQUIRE(r1["content"].size() == 3);
    CHECK(r1["content"][0] == json{{"type", "thinking"}, {"thinking", reasoning}, {"signature", ""}});
    CHECK(r1["content"][1] == json{{"type", "text"}, {"text", content}});
    CHECK(r1["content"][2]["type"] == "tool_use");
    CHECK(r1["content"][2]["name"] == "get_weather");
    CHECK(r1["content"][2]["input"] == json{{"city", "Paris"}, {"days", 3}});

    // Streamed: thinking, text and tool_use blocks in order, the input as input_json_delta.
    json sr = request1;
    sr["stream"] = true;
    generation_plan ps = plan_of(anthropic_messages(f.ctx, {"POST", "/v1/messages", sr.dump(), {}}));
    std::vector<std::string> starts;
    std::string partial;
    for (const json& e : sse_data(drive(ps, sampled, f.tok))) {
        if (e["type"] == "content_block_start") starts.push_back(e["content_block"]["type"]);
        if (e["type"] == "content_block_delta" && e["delta"]["type"] == "input_json_delta") partial += e["delta"]["partial_json"].get<std::string>();
    }
    CHECK(starts == std::vector<std::string>{"thinking", "text", "tool_use"});
    CHECK(json::parse(partial) == json{{"city", "Paris"}, {"days", 3}});

    json request2 = request1;
    request2["messages"].push_back({{"role", "assistant"}, {"content", r1["content"]}});
    request2["messages"].push_back(
        {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", r1["content"][2]["id"]}, {"content", "sunny, 21 C"}}}}});
    generation_plan p2 = plan_of(anthropic_messages(f.ctx, {"POST", "/v1/messages", request2.dump(), {}}));
    std::vector<std::int32_t> seen_tokens = p1.work->prompt;
    seen_tokens.insert(seen_tokens.end(), sampled.begin(), sampled.end());
    CHECK(starts_with(p2.work->prompt, seen_tokens));
}

TEST_CASE("Responses: DSML -> function_call item -> function_call_output -> the turn renders byte-identically") {
    fixture f;
    const json tool = json::parse(R"({"type": "function", "name": "get_weather", "description": "Forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})");
    const json request1 = {{"input", "Weather in Paris?"}, {"tools", {tool}}};
    generation_plan p1 = plan_of(openai_responses(f.ctx, {"POST", "/v1/responses", request1.dump(), {}}));
    std::vector<std::int32_t> sampled = f.tok.encode(sampled_text, true);
    sampled.push_back(f.tok.eos_id());
    const json r1 = json::parse(drive(p1, sampled, f.tok));
    CHECK(r1["status"] == "completed");
    REQUIRE(r1["output"].size() == 2);  // no reasoning item: the request did not ask for one
    CHECK(r1["output"][0]["type"] == "message");
    CHECK(r1["output"][0]["content"][0]["text"] == content);
    const json& call = r1["output"][1];
    CHECK(call["type"] == "function_call");
    CHECK(call["name"] == "get_weather");
    CHECK(json::parse(call["arguments"].get<std::string>()) == json{{"city", "Paris"}, {"days", 3}});

    json request2 = request1;
    request2["input"] = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}, r1["output"][0], call,
                                     {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "sunny"}}});
    generation_plan p2 = plan_of(openai_responses(f.ctx, {"POST", "/v1/responses", request2.dump(), {}}));
    std::vector<std::int32_t> seen_tokens = p1.work->prompt;
    seen_tokens.insert(seen_tokens.end(), sampled.begin(), sampled.end());
    CHECK(starts_with(p2.work->prompt, seen_tokens));
}

TEST_CASE("text after a tool-call block: streamed chunks carry what the buffered message holds") {
    fixture f;
    const json request = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"tools", {weather_tool_openai}}};
    std::vector<std::int32_t> sampled = f.tok.encode(sampled_text + "\nDone.", true);
    sampled.push_back(f.tok.eos_id());
    generation_plan pb = plan_of(openai_chat(f.ctx, {"POST", "/v1/chat/completions", request.dump(), {}}));
    const json buffered = json::parse(drive(pb, sampled, f.tok))["choices"][0]["message"];
    json sr = request;
    sr["stream"] = true;
    generation_plan ps = plan_of(openai_chat(f.ctx, {"POST", "/v1/chat/completions", sr.dump(), {}}));
    std::string content, arguments;
    for (const json& c : sse_data(drive(ps, sampled, f.tok))) {
        if (c["choices"].empty()) continue;
        const json& d = c["choices"][0]["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("tool_calls")) arguments += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
    }
    CHECK(content == buffered["content"].get<std::string>());
    CHECK(content.find("Done.") != std::string::npos);
    CHECK(arguments == buffered["tool_calls"][0]["function"]["arguments"].get<std::string>());
}

TEST_CASE("stop strings are cut across token boundaries and held back until decided") {
    fixture f;
    output_options o;
    o.thinking = false;
    o.stop = {"look that"};
    output_processor proc(f.tok, o);
    std::string text;
    bool over = false;
    for (std::int32_t t : f.tok.encode(content, true)) {
        gen_event ev;
        over = proc.on_token(t, ev);
        for (const delta& d : ev.deltas) text += d.text;
        if (over) break;
    }
    CHECK(over);
    CHECK(text == "Let me ");
    CHECK(proc.matched_stop() == "look that");
}

TEST_CASE("UTF-8 assembly: split characters wait, invalid bytes become U+FFFD") {
    utf8_assembler a;
    CHECK(a.feed("\xE6\x97") == "");
    CHECK(a.feed("\xA5x") == "\xE6\x97\xA5x");
    CHECK(a.feed("\xFF" "a") == "\xEF\xBF\xBD" "a");
    CHECK(a.feed("\xC3") == "");
    CHECK(a.finish() == "\xEF\xBF\xBD");
    CHECK(first_invalid_utf8("ok \xE2\x82\xAC") == std::string_view::npos);
    CHECK(first_invalid_utf8("ab\xED\xA0\x80") == 2);  // a UTF-16 surrogate is not UTF-8
}

// Found by fuzz/http_fuzzer: the legacy formatter indexed the logprobs of an event that had none,
// and the json type_error escaped the connection's event handler (a crashed server).
TEST_CASE("/v1/completions with logprobs, buffered: a final event without tokens gives the error body") {
    fixture f;
    const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"logprobs", 2}};
    generation_plan p = plan_of(openai_completions(f.ctx, {"POST", "/v1/completions", request.dump(), {}}));
    REQUIRE_FALSE(p.stream);
    gen_event timed_out;
    timed_out.final = true;
    timed_out.reason = finish_reason::error;
    timed_out.error = api_error{error_code::timeout, "the request timed out", "", true};
    p.format->collect(timed_out);
    const http_response r = p.format->buffered_response();
    CHECK(r.status == 408);
    CHECK(json::parse(r.body)["error"]["code"] == "timeout");

    generation_plan q = plan_of(openai_completions(f.ctx, {"POST", "/v1/completions", request.dump(), {}}));
    gen_event empty_stop;
    empty_stop.final = true;
    q.format->collect(empty_stop);
    const json body = json::parse(q.format->buffered_response().body);
    CHECK(body["choices"][0]["text"] == "");
    CHECK(body["choices"][0]["finish_reason"] == "stop");
}

// Found by fuzz/http_fuzzer: nlohmann's out_of_range for a number beyond double escaped
// parse_body's parse_error handler and became a 500.
TEST_CASE("a JSON number beyond double's range is invalid_json, in every API") {
    fixture f;
    for (auto* handler : {openai_chat, openai_completions, openai_responses, anthropic_messages, anthropic_count_tokens}) {
        const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"prompt":"Hi","input":"Hi","temperature":99e99999999999999999999})";
        try {
            (void)handler(f.ctx, {"POST", "/", body, {}});
            FAIL("the request was accepted");
        } catch (const api_exception& e) {
            CHECK(e.error.code == error_code::invalid_json);
        }
    }
}

}  // namespace
}  // namespace ds4::server
