#pragma once
// The DeepSeek-V4 prompt renderer (docs/model.md §6). Produces the text the tokenizer encodes with
// parse_special = true:
//
//   <｜begin▁of▁sentence｜>[Think-Max prefix][system text + tools block]
//   ( <｜User｜>text | <｜User｜><tool_result>..</tool_result>[<tool_result>..</tool_result>..]
//   | <｜Assistant｜>(</think> | <think>reasoning</think>)content[DSML]<｜end▁of▁sentence｜> )*
//   <｜Assistant｜><think>   (thinking)   or   <｜Assistant｜></think>   (non-thinking)
//
// Rendering must be byte-stable: the server's prefix cache only hits when a follow-up request
// re-renders the earlier turns to exactly the text the model saw.
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/dsml.hpp"

namespace ds4::ref {

enum class chat_role { system, user, assistant, tool };

struct chat_message {
    chat_role role = chat_role::user;
    std::string content;
    std::optional<std::string> reasoning;  // assistant only; absent = the turn had no thinking
    std::vector<tool_call> tool_calls;     // assistant only
    std::string tool_call_id;              // tool only; order, not id, decides placement
};

struct render_options {
    bool thinking = true;
    bool think_max = false;
    std::size_t context_tokens = 0;  // the sequence's context size; gates Think-Max
    std::string tools_system_block;  // from render_tools_block, or empty
    bool add_generation_prompt = true;
};

// DeepSeek recommends Think-Max only with at least a 384K-token context window.
inline constexpr std::size_t think_max_min_context = 393216;

// Prepended after BOS in Think-Max mode. CHECK AGAINST UPSTREAM: the spec names the constant
// (ds4.c DS4_REASONING_EFFORT_MAX_PREFIX) but not its text; this is the text that public copies
// of ds4.c carry. A different byte here changes what the model was tuned on.
extern const std::string_view think_max_prefix;

// Escape for tool results: the only sequence that could end a result early is a literal
// "</tool_result>", rendered as "<\/tool_result>" (JSON-style slash escape: visibly the same
// tag to the model, no longer the closing one). Everything else is raw.
std::string escape_tool_result(std::string_view raw);

// Throws ds4::error for an assistant tool call with malformed arguments or a message role out of
// place (reasoning/tool calls on non-assistant messages).
std::string render_chat(const std::vector<chat_message>& messages, const render_options& options);

struct tool_spec {
    std::string name;
    std::string description;
    std::string parameters_json;  // JSON schema object, inserted as written
};

// The "## Tools" section of the system prompt: how to write DSML, then one JSON line per tool.
// Empty for no tools.
std::string render_tools_block(std::span<const tool_spec> tools);

}  // namespace ds4::ref
