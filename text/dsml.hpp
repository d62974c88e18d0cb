#pragma once
// DSML, the tool-call markup DeepSeek-V4 writes (docs/model.md §6):
//
//   \n\n<｜DSML｜tool_calls>\n
//   <｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>\n ...
//   </｜DSML｜invoke>\n ...
//   </｜DSML｜tool_calls>
//
// string="true": VALUE is the raw string; "false": VALUE is a JSON literal written as is.
// Rendering (for the prompt) and parsing (of sampled text, complete or streaming) live together
// so the two directions cannot drift. Tool-call arguments are JSON object text; only the small
// flat-object reader DSML needs is here, no JSON library.
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds4::ref {

struct tool_call {
    std::string id;         // API-level id; not part of the DSML text
    std::string name;
    std::string arguments;  // a JSON object, e.g. {"path":"a.txt","limit":10}
};

// `raw` as a JSON string literal, quotes included. Escapes only what JSON requires (", \ and
// control characters); bytes >= 0x80 pass through, so UTF-8 stays UTF-8.
std::string json_quote(std::string_view raw);

// One member of a JSON object: strings decoded (is_string), every other value kept as the exact
// JSON text written (numbers, true/false/null, nested objects and arrays).
struct json_member {
    std::string key;
    std::string value;
    bool is_string = false;
};

// Strict parse of one JSON object (whitespace around it allowed, empty text = {}). Throws
// ds4::error with the byte offset on malformed input.
std::vector<json_member> parse_json_object(std::string_view json);

// The block appended to assistant content, leading "\n\n" included; empty for no calls.
// Throws ds4::error naming the call whose arguments are not a JSON object.
std::string render_dsml_tool_calls(std::span<const tool_call> calls);

enum class dsml_status {
    ok,            // no block, or every block well formed and closed
    malformed,     // a block broke the grammar after a call had started: the text is returned as plain text
    unterminated,  // the text ended inside a block
};

struct dsml_result {
    std::string content;  // text outside the blocks; the "\n\n" separator before a block is dropped
    std::vector<tool_call> calls;  // complete calls only (id left empty)
    dsml_status status = dsml_status::ok;
    std::string error;
};

// A block opening tag followed by anything but the grammar, before any invoke has begun, is
// plain text (the model merely mentioned the tag); parsing goes on after it.
dsml_result parse_dsml(std::string_view assistant_text);

struct dsml_event {
    enum class kind {
        text,             // content delta
        tool_call_begin,  // data = tool name
        arguments,        // delta of the call's arguments JSON, starting with '{'
        tool_call_end,
        error,            // data = message; nothing follows
    };
    kind type;
    std::string data;
    bool operator==(const dsml_event&) const = default;
};

// Incremental parser for sampled text. Holds back only bytes that could still begin a DSML tag
// (plus the "\n\n" before a block opener and an incomplete UTF-8 tail, so every delta is whole
// characters); everything else is emitted at once. Events of one kind in a row are merged.
class dsml_stream_parser {
public:
    std::vector<dsml_event> feed(std::string_view chunk);
    // Flushes held-back text; an error event if a block is still open.
    std::vector<dsml_event> finish();
    dsml_status status() const { return status_; }

private:
    enum class state { text, block, invoke_name, invoke_body, param_name, param_value, failed };

    bool step(std::vector<dsml_event>& out);
    bool fail(std::vector<dsml_event>& out, std::string_view why);
    void consume(std::size_t n);

    state state_ = state::text;
    dsml_status status_ = dsml_status::ok;
    std::string pending_;        // received, not yet consumed
    std::string raw_block_;      // bytes consumed since the block opener, to give back as text
    std::size_t opener_size_ = 0;  // how much of raw_block_ is the opener ("\n\n" + tag)
    bool call_started_ = false;  // a tool_call_begin went out in this block: no way back
    bool first_param_ = true;
    bool string_value_ = false;
};

}  // namespace ds4::ref
