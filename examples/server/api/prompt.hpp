#pragma once
// From API messages to the tokens the model sees: the pieces every chat API shares (text content
// in its several JSON forms, tool specs, the tool-call memory) and the render + tokenize + budget
// step that ends every chat handler.
#include <string>
#include <vector>

#include "examples/server/api/request_fields.hpp"
#include "text/chat_template.hpp"

namespace ds4::server {

struct prompt_request {
    std::vector<ref::chat_message> messages;
    std::vector<ref::tool_spec> tools;
    bool thinking = true;
    bool think_max = false;
    bool tools_enabled = true;  // tool_choice none: no tools block, no DSML parsing
};

// A content field as text: a string, or an array of parts whose text parts (type "text",
// "input_text", "output_text") are concatenated; other part types are a typed error.
std::string content_text(const json& content, const std::string& where);

// A turn that ended in tool calls the server produced: restored to the exact sampled text.
void restore_sampled_turn(ref::chat_message& m, const server_context& ctx);

// Renders and tokenizes; fills the job's prompt and its output options' thinking/tools.
void build_prompt(const prompt_request& p, const server_context& ctx, job& j);

// The thinking switch of OpenAI's reasoning_effort ("none" off; "max"/"xhigh" Think-Max).
void apply_reasoning_effort(const std::string& effort, prompt_request& p);

}  // namespace ds4::server
