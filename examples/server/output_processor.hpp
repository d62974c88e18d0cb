#pragma once
// Turns sampled tokens into API-level deltas on the engine thread: token bytes to whole UTF-8
// characters (an invalid byte becomes U+FFFD, so every delta is valid JSON text), reasoning up to
// </think>, content after it, DSML tool calls out of the content, and stop strings cut from the
// content with the text that could still begin one held back.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "examples/server/job.hpp"
#include "text/dsml.hpp"
#include "text/tokenizer.hpp"

namespace ds4::server {

// Bytes in, the longest valid UTF-8 prefix out; an incomplete trailing sequence waits for more.
class utf8_assembler {
public:
    std::string feed(std::string_view bytes);
    std::string finish();  // what is left, incomplete sequences replaced

private:
    std::string pending_;
};

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if the byte there cannot
// start one; `complete` is false when s ends inside an otherwise valid sequence.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i, bool& complete);
// The byte offset of the first invalid UTF-8 byte, or npos.
std::size_t first_invalid_utf8(std::string_view s);

class output_processor {
public:
    output_processor(const ref::tokenizer& tok, output_options options);

    // Appends the token's deltas to ev; true when the output is over (EOS or a stop string).
    bool on_token(std::int32_t token, gen_event& ev);
    // Flushes everything held back (call once, at the end, whatever ended the generation).
    void finish(gen_event& ev);

    const std::string& matched_stop() const { return matched_stop_; }
    int tool_calls() const { return n_tool_calls_; }
    int reasoning_tokens() const { return reasoning_tokens_; }
    const std::string& raw_reasoning() const { return raw_reasoning_; }
    const std::string& raw_content() const { return raw_content_; }

private:
    void content_text(std::string text, gen_event& ev);
    void visible_text(std::string_view text, gen_event& ev);
    void emit(delta::kind kind, std::string text, gen_event& ev);

    const ref::tokenizer& tok_;
    output_options options_;
    bool in_reasoning_;
    bool done_ = false;
    utf8_assembler reasoning_utf8_, content_utf8_;
    ref::dsml_stream_parser dsml_;
    std::string stop_held_;  // content not yet sent because it may begin a stop string
    std::string matched_stop_;
    std::string raw_reasoning_, raw_content_;
    int n_tool_calls_ = 0;
    int reasoning_tokens_ = 0;
    std::string current_tool_id_;
};

// "call_" + 24 hex digits from a per-thread random generator.
std::string new_tool_call_id();

}  // namespace ds4::server
