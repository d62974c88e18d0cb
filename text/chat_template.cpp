#include "text/chat_template.hpp"

#include "ds4/core/error.hpp"
#include "text/tokenizer.hpp"

namespace ds4::ref {

const std::string_view think_max_prefix =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

namespace {

constexpr std::string_view result_open = "<tool_result>";
constexpr std::string_view result_close = "</tool_result>";
constexpr std::string_view result_close_escaped = "<\\/tool_result>";

}  // namespace

std::string escape_tool_result(std::string_view raw) {
    std::string out;
    out.reserve(raw.size());
    for (std::size_t pos = 0;;) {
        const std::size_t at = raw.find(result_close, pos);
        out += raw.substr(pos, at == std::string_view::npos ? std::string_view::npos : at - pos);
        if (at == std::string_view::npos) return out;
        out += result_close_escaped;
        pos = at + result_close.size();
    }
}

std::string render_chat(const std::vector<chat_message>& messages, const render_options& options) {
    std::size_t last_user = messages.size();
    bool tools_in_use = !options.tools_system_block.empty();
    std::string system;
    for (std::size_t i = 0; i < messages.size(); ++i) {
        const chat_message& m = messages[i];
        const std::string where = "message " + std::to_string(i);
        require(m.role == chat_role::assistant || (m.tool_calls.empty() && !m.reasoning),
                where + ": only assistant messages carry reasoning or tool calls");
        if (m.role == chat_role::user) last_user = i;
        if (m.role == chat_role::tool || !m.tool_calls.empty()) tools_in_use = true;
        // System messages anywhere are hoisted into the one system slot after BOS; the template
        // has no other place for them.
        if (m.role == chat_role::system) {
            if (!system.empty()) system += "\n\n";
            system += m.content;
        }
    }
    if (!options.tools_system_block.empty()) {
        if (!system.empty()) system += "\n\n";
        system += options.tools_system_block;
    }

    std::string out(bos_text);
    if (options.thinking && options.think_max && options.context_tokens >= think_max_min_context)
        out += think_max_prefix;
    out += system;

    chat_role previous = chat_role::system;
    for (std::size_t i = 0; i < messages.size(); ++i) {
        const chat_message& m = messages[i];
        switch (m.role) {
            case chat_role::system: continue;
            case chat_role::user:
                out += user_text;
                out += m.content;
                break;
            case chat_role::tool:
                // Consecutive results share one user turn.
                if (previous != chat_role::tool) out += user_text;
                out += result_open;
                out += escape_tool_result(m.content);
                out += result_close;
                break;
            case chat_role::assistant: {
                out += assistant_text;
                // Old reasoning is dropped to save context, except in tool loops (the model needs
                // its plan across calls) and for turns answering the latest user message.
                const bool keep = m.reasoning && (tools_in_use || last_user == messages.size() || i > last_user);
                if (keep) {
                    out += think_text;
                    out += *m.reasoning;
                }
                out += think_end_text;
                out += m.content;
                try {
                    out += render_dsml_tool_calls(m.tool_calls);
                } catch (const ds4::error& e) {
                    fail("message " + std::to_string(i) + ": " + e.what());
                }
                out += eos_text;
                break;
            }
        }
        previous = m.role;
    }
    if (options.add_generation_prompt) {
        out += assistant_text;
        out += options.thinking ? think_text : think_end_text;
    }
    return out;
}

std::string render_tools_block(std::span<const tool_spec> tools) {
    if (tools.empty()) return {};
    const std::string dsml(dsml_text);
    std::string out =
        "## Tools\n\n"
        "You can call the tools listed below. To call tools, end your answer with one block in exactly this "
        "format:\n\n"
        "<" + dsml + "tool_calls>\n"
        "<" + dsml + "invoke name=\"TOOL_NAME\">\n"
        "<" + dsml + "parameter name=\"PARAMETER\" string=\"true\">raw text</" + dsml + "parameter>\n"
        "<" + dsml + "parameter name=\"PARAMETER\" string=\"false\">JSON value</" + dsml + "parameter>\n"
        "</" + dsml + "invoke>\n"
        "</" + dsml + "tool_calls>\n\n"
        "Use string=\"true\" for string parameters and write the value as is, without quotes or escapes. Use "
        "string=\"false\" for every other type and write the value as JSON (number, true/false, null, object or "
        "array). One block may hold several invoke elements; they run in order. Each result comes back in the "
        "next user turn as <tool_result>...</tool_result>, in the same order as the calls.\n\n"
        "### Available tools\n";
    for (const tool_spec& t : tools) {
        out += "\n{\"name\": " + json_quote(t.name) + ", \"description\": " + json_quote(t.description) +
               ", \"parameters\": " + (t.parameters_json.empty() ? std::string("{}") : t.parameters_json) + "}";
    }
    return out;
}

}  // namespace ds4::ref
