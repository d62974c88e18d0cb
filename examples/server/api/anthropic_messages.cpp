// POST /v1/messages (Anthropic Messages). Streaming lifecycle: message_start; per content block
// content_block_start, content_block_delta (thinking_delta / text_delta / input_json_delta),
// content_block_stop; then message_delta (stop_reason, usage, ds4's timings) and message_stop.
// A failure after message_start is an `error` event. Thinking blocks come first, as Claude's do.
#include "examples/server/api/routes.hpp"

#include "examples/server/api/prompt.hpp"
#include "examples/server/http/sse.hpp"

namespace ds4::server {

namespace {

class messages_formatter final : public generation_formatter {
public:
    messages_formatter(server_context& ctx, int input_tokens, bool thinking)
        : ctx_(ctx), id_(now_id("msg_")), input_tokens_(input_tokens), thinking_(thinking) {}

    std::string stream_start() override {
        json msg = {{"id", id_},         {"type", "message"},       {"role", "assistant"},
                    {"model", ctx_.model_id}, {"content", json::array()}, {"stop_reason", nullptr},
                    {"stop_sequence", nullptr}, {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}};
        return event("message_start", {{"type", "message_start"}, {"message", std::move(msg)}});
    }

    std::string stream_event(const gen_event& ev) override {
        std::string out;
        for (const delta& d : ev.deltas) {
            track(d);
            switch (d.type) {
            case delta::kind::reasoning:
                open(out, kind::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
                out += event("content_block_delta", block_delta({{"type", "thinking_delta"}, {"thinking", d.text}}));
                break;
            case delta::kind::content:
                open(out, kind::text, {{"type", "text"}, {"text", ""}});
                out += event("content_block_delta", block_delta({{"type", "text_delta"}, {"text", d.text}}));
                break;
            case delta::kind::tool_begin:
                close(out);
                open(out, kind::tool, {{"type", "tool_use"}, {"id", d.tool_id}, {"name", d.text}, {"input", json::object()}});
                break;
            case delta::kind::tool_arguments:
                out += event("content_block_delta", block_delta({{"type", "input_json_delta"}, {"partial_json", d.text}}));
                break;
            case delta::kind::tool_end: close(out); break;
            }
        }
        if (!ev.final) return out;
        close(out);
        remember(ev);
        if (ev.error) return out + event("error", json::parse("{\"type\":\"error\",\"error\":" + error_object(*ev.error, error_shape::anthropic) + "}"));
        out += event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop_reason(ev)}, {"stop_sequence", stop_sequence(ev)}}},
                                       {"usage", usage(ev)},
                                       {"timings", timings_json(ev.timings)}});
        return out + event("message_stop", {{"type", "message_stop"}});
    }

    void collect(const gen_event& ev) override {
        for (const delta& d : ev.deltas) {
            track(d);
            const auto last_is = [&](const char* type) { return !content_.empty() && content_.back()["type"] == type; };
            switch (d.type) {
            case delta::kind::reasoning:
                if (!last_is("thinking")) content_.push_back({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
                content_.back()["thinking"] = content_.back()["thinking"].get<std::string>() + d.text;
                break;
            case delta::kind::content:
                if (!last_is("text")) content_.push_back({{"type", "text"}, {"text", ""}});
                content_.back()["text"] = content_.back()["text"].get<std::string>() + d.text;
                break;
            case delta::kind::tool_begin:
                content_.push_back({{"type", "tool_use"}, {"id", d.tool_id}, {"name", d.text}, {"input", json::object()}});
                arguments_.clear();
                break;
            case delta::kind::tool_arguments: arguments_ += d.text; break;
            case delta::kind::tool_end:
                content_.back()["input"] = json::parse(arguments_, nullptr, false);
                if (!content_.back()["input"].is_object()) content_.back()["input"] = json::object();
                break;
            }
        }
        if (ev.final) {
            final_ = ev;
            remember(ev);
        }
    }

    http_response buffered_response() override {
        if (final_.error) return error_response(*final_.error, error_shape::anthropic);
        json body = {{"id", id_},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"model", ctx_.model_id},
                     {"content", content_},
                     {"stop_reason", stop_reason(final_)},
                     {"stop_sequence", stop_sequence(final_)},
                     {"usage", usage(final_)},
                     {"timings", timings_json(final_.timings)}};
        return {200, "application/json", dump(body)};
    }

private:
    enum class kind { none, thinking, text, tool };

    static std::string event(const char* name, const json& data) { return sse_event(name, dump(data)); }
    json block_delta(json d) const { return {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}}; }

    void open(std::string& out, kind k, json block) {
        if (current_ == k && k != kind::tool) return;
        close(out);
        current_ = k;
        out += event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
    }
    void close(std::string& out) {
        if (current_ == kind::none) return;
        out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
        ++index_;
        current_ = kind::none;
    }

    void track(const delta& d) {
        if (d.type == delta::kind::tool_begin) ids_.push_back(d.tool_id);
    }
    void remember(const gen_event& ev) {
        if (!ev.error) remember_tool_turn(ctx_, ev, ids_, thinking_);
    }

    static const char* stop_reason(const gen_event& ev) {
        if (ev.reason == finish_reason::length) return "max_tokens";
        if (ev.reason == finish_reason::tool_calls) return "tool_use";
        return ev.stop_sequence.empty() ? "end_turn" : "stop_sequence";
    }
    static json stop_sequence(const gen_event& ev) { return ev.stop_sequence.empty() ? json(nullptr) : json(ev.stop_sequence); }
    json usage(const gen_event& ev) const {
        return {{"input_tokens", ev.usage.prompt_tokens - ev.usage.cached_tokens},
                {"output_tokens", ev.usage.completion_tokens},
                {"cache_read_input_tokens", ev.usage.cached_tokens},
                {"cache_creation_input_tokens", 0}};
    }

    server_context& ctx_;
    std::string id_;
    int input_tokens_;
    bool thinking_;
    kind current_ = kind::none;
    int index_ = 0;
    json content_ = json::array();
    std::string arguments_;
    std::vector<std::string> ids_;
    gen_event final_;
};

// A user turn's blocks: tool results become tool messages (in order), the text one user message.
void add_user_blocks(const json& content, const std::string& w, std::vector<ref::chat_message>& out) {
    if (content.is_string()) {
        out.push_back({ref::chat_role::user, content.get<std::string>(), {}, {}, {}});
        return;
    }
    if (!content.is_array()) throw_api_error(error_code::invalid_type, "'" + w + "' must be a string or an array of blocks", w);
    std::string text;
    for (std::size_t i = 0; i < content.size(); ++i) {
        const std::string bw = w + "[" + std::to_string(i) + "]";
        const json& b = content[i];
        if (!b.is_object()) throw_api_error(error_code::invalid_type, "'" + bw + "' must be an object", bw);
        const std::string type = get_string(b, "type", bw).value_or("");
        if (type == "text") text += get_string(b, "text", bw).value_or("");
        else if (type == "tool_result") {
            ref::chat_message m{ref::chat_role::tool, {}, {}, {}, get_string(b, "tool_use_id", bw).value_or("")};
            if (const json* c = find_field(b, "content")) m.content = content_text(*c, bw + ".content");
            out.push_back(std::move(m));
        } else
            throw_api_error(error_code::invalid_value, "'" + bw + "': blocks of type '" + type + "' are not supported in user turns", bw);
    }
    if (!text.empty() || out.empty() || out.back().role != ref::chat_role::tool) out.push_back({ref::chat_role::user, text, {}, {}, {}});
}

ref::chat_message assistant_blocks(const json& content, const std::string& w) {
    ref::chat_message m{ref::chat_role::assistant, {}, {}, {}, {}};
    if (content.is_string()) {
        m.content = content.get<std::string>();
        return m;
    }
    if (!content.is_array()) throw_api_error(error_code::invalid_type, "'" + w + "' must be a string or an array of blocks", w);
    for (std::size_t i = 0; i < content.size(); ++i) {
        const std::string bw = w + "[" + std::to_string(i) + "]";
        const json& b = content[i];
        if (!b.is_object()) throw_api_error(error_code::invalid_type, "'" + bw + "' must be an object", bw);
        const std::string type = get_string(b, "type", bw).value_or("");
        if (type == "text") m.content += get_string(b, "text", bw).value_or("");
        else if (type == "thinking") m.reasoning = m.reasoning.value_or("") + get_string(b, "thinking", bw).value_or("");
        else if (type == "redacted_thinking") continue;
        else if (type == "tool_use") {
            const json* input = get_object(b, "input", bw);
            m.tool_calls.push_back({get_string(b, "id", bw).value_or(""), get_string(b, "name", bw).value_or(""),
                                    input ? dump(*input) : std::string("{}")});
        } else
            throw_api_error(error_code::invalid_value, "'" + bw + "': blocks of type '" + type + "' are not supported in assistant turns", bw);
    }
    return m;
}

// The request's prompt as the model would see it: shared by /v1/messages and count_tokens.
prompt_request messages_prompt(const json& body, server_context& ctx) {
    prompt_request p;
    if (const json* sys = find_field(body, "system")) p.messages.push_back({ref::chat_role::system, content_text(*sys, "system"), {}, {}, {}});
    for_each_object(body, "messages", [&](const json& m, const std::string& w) {
        const std::string role = get_string(m, "role", w).value_or("");
        const json* content = find_field(m, "content");
        if (!content) throw_api_error(error_code::missing_field, "'" + w + ".content' is required", w + ".content");
        if (role == "user") add_user_blocks(*content, w + ".content", p.messages);
        else if (role == "assistant") {
            ref::chat_message a = assistant_blocks(*content, w + ".content");
            restore_sampled_turn(a, ctx);
            p.messages.push_back(std::move(a));
        } else
            throw_api_error(error_code::invalid_value, "'" + w + ".role' must be user or assistant", w + ".role");
    });
    if (const json* tools = get_array(body, "tools"))
        for (std::size_t i = 0; i < tools->size(); ++i) {
            const std::string w = "tools[" + std::to_string(i) + "]";
            const json& t = (*tools)[i];
            if (!t.is_object()) throw_api_error(error_code::invalid_type, "'" + w + "' must be an object", w);
            ref::tool_spec s{get_string(t, "name", w).value_or(""), get_string(t, "description", w).value_or(""), "{}"};
            if (s.name.empty()) throw_api_error(error_code::missing_field, "'" + w + ".name' is required", w + ".name");
            if (const json* schema = get_object(t, "input_schema", w)) s.parameters_json = dump(*schema);
            p.tools.push_back(std::move(s));
        }
    if (const json* choice = get_object(body, "tool_choice")) {
        const std::string type = get_string(*choice, "type", "tool_choice").value_or("auto");
        if (type == "none") p.tools_enabled = false;
        else if (type == "tool") {
            const std::string name = get_string(*choice, "name", "tool_choice").value_or("");
            std::erase_if(p.tools, [&](const ref::tool_spec& t) { return t.name != name; });
            if (p.tools.empty()) throw_api_error(error_code::invalid_value, "'tool_choice.name' names no tool in 'tools'", "tool_choice.name");
        } else if (type != "auto" && type != "any")
            throw_api_error(error_code::invalid_value, "'tool_choice.type' must be auto, any, tool or none", "tool_choice.type");
    }
    if (const json* thinking = get_object(body, "thinking")) {
        const std::string type = get_string(*thinking, "type", "thinking").value_or("enabled");
        if (type == "disabled") p.thinking = false;
        else if (type != "enabled" && type != "adaptive")
            throw_api_error(error_code::invalid_value, "'thinking.type' must be enabled, adaptive or disabled", "thinking.type");
    }
    return p;
}

}  // namespace

route_result anthropic_messages(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    const prompt_request p = messages_prompt(body, ctx);
    if (!find_field(body, "max_tokens")) throw_api_error(error_code::missing_field, "'max_tokens' is required", "max_tokens");

    auto j = std::make_shared<job>();
    parse_sampling(body, *j);
    j->output.stop = parse_stop(body, "stop_sequences");
    build_prompt(p, ctx, *j);
    set_token_budget(body, {"max_tokens"}, *j, ctx);

    generation_plan plan;
    plan.format = std::make_unique<messages_formatter>(ctx, int(j->prompt.size()), p.thinking);
    plan.work = std::move(j);
    plan.stream = get_bool(body, "stream").value_or(false);
    return plan;
}

// POST /v1/messages/count_tokens: {"input_tokens": N} for the same request body.
route_result anthropic_count_tokens(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    job j;
    build_prompt(messages_prompt(body, ctx), ctx, j);
    return http_response{200, "application/json", dump({{"input_tokens", j.prompt.size()}})};
}

}  // namespace ds4::server
