// libFuzzer target over the server's request layer: the first input byte picks an API, the rest
// is its request body, which goes through that API's handler exactly as the router calls it
// (parse_body's UTF-8 and JSON checks, every field reader, the chat template render, tokenization,
// the token budget) on ds4-synth's tiny model, its tokenizer and the CPU backend. A request the
// handler accepts is then driven to its end the way the scheduler would, with the body's own
// tokens as the sampled text (output processing, DSML parsing, the streamed and buffered
// formatters). A handler must answer with a plan or an api_exception carrying a client error
// code; anything else (an internal error, another exception escaping to the router's 500, a
// sanitizer report) is a finding. Beast's HTTP parser is not ds4's code and is not fuzzed here.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "examples/server/api/routes.hpp"
#include "examples/server/output_processor.hpp"
#include "tests/support/tiny_server.hpp"

namespace {

using namespace ds4;
using namespace ds4::server;

// Built once per process: the model load is the expensive part.
tiny_server& served() {
    static tiny_server m;
    return m;
}

struct api {
    const char* path;
    route_result (*handler)(server_context&, const http_request&);
};
// fuzz/run.sh's seeds pick their API with a letter: 'A' the first, 'B' the second...
constexpr std::array<api, 7> apis{{{"/v1/messages", anthropic_messages},
                                   {"/v1/messages/count_tokens", anthropic_count_tokens},
                                   {"/v1/chat/completions", openai_chat},
                                   {"/v1/completions", openai_completions},
                                   {"/v1/responses", openai_responses},
                                   {"/tokenize", tokenize},
                                   {"/detokenize", detokenize}}};

[[noreturn]] void finding(const std::string& what) {
    std::fprintf(stderr, "http_fuzzer: %s\n", what.c_str());
    std::abort();
}

// The scheduler's side of a generation, without the engine: tokens in, events to the formatter.
void drive(generation_plan& plan, const std::string& body, const ref::tokenizer& tok) {
    output_processor proc(tok, plan.work->output);
    if (plan.stream) (void)plan.format->stream_start();
    std::vector<std::int32_t> tokens = tok.encode(body.substr(0, 256), false);
    tokens.push_back(tok.eos_id());
    gen_event last;
    for (std::int32_t t : tokens) {
        gen_event ev;
        if (proc.on_token(t, ev)) {
            last = std::move(ev);
            break;
        }
        if (plan.stream) (void)plan.format->stream_event(ev);
        else plan.format->collect(ev);
    }
    proc.finish(last);
    last.final = true;
    last.reason = proc.tool_calls() > 0 ? finish_reason::tool_calls : finish_reason::stop;
    last.raw_reasoning = proc.raw_reasoning();
    last.raw_content = proc.raw_content();
    if (plan.stream) (void)plan.format->stream_event(last);
    else {
        plan.format->collect(last);
        (void)plan.format->buffered_response();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    tiny_server& m = served();
    const api& a = apis[std::uint8_t(data[0] - 'A') % apis.size()];
    http_request req{"POST", a.path, std::string(reinterpret_cast<const char*>(data + 1), size - 1), {}};
    try {
        route_result r = a.handler(m.ctx, req);
        if (auto* plan = std::get_if<generation_plan>(&r)) drive(*plan, req.body, m.tok);
        else (void)std::get<http_response>(r).body.size();
    } catch (const api_exception& e) {
        // A malformed request is the client's error: a 4xx with a code that names it.
        const error_code c = e.error.code;
        if (c == error_code::internal || c == error_code::insufficient_memory || c == error_code::shutting_down ||
            c == error_code::timeout)
            finding(std::string(a.path) + ": a server error for a request: " + e.what());
        (void)error_body(e.error, error_shape::openai);
    }
    return 0;
}
