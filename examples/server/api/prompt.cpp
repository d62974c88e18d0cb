#include "examples/server/api/prompt.hpp"

namespace ds4::server {

std::string content_text(const json& content, const std::string& where) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) throw_api_error(error_code::invalid_type, "'" + where + "' must be a string or an array of parts", where);
    std::string out;
    for (std::size_t i = 0; i < content.size(); ++i) {
        const json& part = content[i];
        const std::string pw = where + "[" + std::to_string(i) + "]";
        if (part.is_string()) {
            out += part.get<std::string>();
            continue;
        }
        if (!part.is_object()) throw_api_error(error_code::invalid_type, "'" + pw + "' must be an object", pw);
        const std::string type = get_string(part, "type", pw).value_or("text");
        if (type != "text" && type != "input_text" && type != "output_text")
            throw_api_error(error_code::invalid_value, "'" + pw + "': content parts of type '" + type + "' are not supported (text only)", pw);
        out += get_string(part, "text", pw).value_or("");
    }
    return out;
}

void restore_sampled_turn(ref::chat_message& m, const server_context& ctx) {
    if (m.role != ref::chat_role::assistant || m.tool_calls.empty()) return;
    const auto turn = ctx.tool_memory.recall(m.tool_calls.front().id);
    if (!turn) return;
    m.reasoning = turn->thinking ? std::optional<std::string>(turn->reasoning) : std::nullopt;
    m.content = turn->content;
    m.tool_calls.clear();
}

void build_prompt(const prompt_request& p, const server_context& ctx, job& j) {
    ref::render_options ro;
    ro.thinking = p.thinking;
    ro.think_max = p.think_max;
    ro.context_tokens = std::size_t(ctx.context_length);
    if (p.tools_enabled) ro.tools_system_block = ref::render_tools_block(p.tools);
    std::string text;
    try {
        text = ref::render_chat(p.messages, ro);
    } catch (const ds4::error& e) {
        throw_api_error(error_code::invalid_value, std::string("the messages cannot be rendered: ") + e.what(), "messages");
    }
    j.prompt = tokenize_prompt(ctx, text);
    j.output.thinking = p.thinking;
    j.output.parse_tools = p.tools_enabled;
}

void apply_reasoning_effort(const std::string& effort, prompt_request& p) {
    if (effort == "none") p.thinking = false;
    else if (effort == "max" || effort == "xhigh") p.think_max = true;
    else if (effort != "minimal" && effort != "low" && effort != "medium" && effort != "high")
        throw_api_error(error_code::invalid_value, "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or max",
                        "reasoning_effort");
}

}  // namespace ds4::server
