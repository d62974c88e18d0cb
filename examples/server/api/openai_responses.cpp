// POST /v1/responses (OpenAI Responses). Streaming lifecycle, every event with a sequence_number:
// response.created, response.in_progress; per output item response.output_item.added, then
//   reasoning (only when the request has a `reasoning` object):  response.reasoning_text.delta* / .done
//   message:        response.content_part.added, response.output_text.delta*, .output_text.done, .content_part.done
//   function_call:  response.function_call_arguments.delta*, .function_call_arguments.done
// and response.output_item.done; then response.completed (response.incomplete when
// max_output_tokens ran out, response.failed on an error). The buffered body is the response
// object of the last event: one state machine builds both.
#include "examples/server/api/routes.hpp"

#include "examples/server/api/prompt.hpp"
#include "examples/server/http/sse.hpp"

namespace ds4::server {

namespace {

class responses_formatter final : public generation_formatter {
public:
    responses_formatter(server_context& ctx, bool show_reasoning, bool thinking, json echo)
        : ctx_(ctx), id_(now_id("resp_")), created_(unix_time()), show_reasoning_(show_reasoning), thinking_(thinking),
          echo_(std::move(echo)) {}

    std::string stream_start() override {
        std::string out = event("response.created", {{"response", response("in_progress")}});
        return out + event("response.in_progress", {{"response", response("in_progress")}});
    }

    std::string stream_event(const gen_event& ev) override {
        std::string out;
        for (const delta& d : ev.deltas) {
            switch (d.type) {
            case delta::kind::reasoning:
                if (!show_reasoning_) break;
                open(out, "reasoning", {{"type", "reasoning"}, {"id", now_id("rs_")}, {"summary", json::array()}, {"content", json::array()}});
                text_ += d.text;
                out += event("response.reasoning_text.delta", item_ref({{"content_index", 0}, {"delta", d.text}}));
                break;
            case delta::kind::content:
                if (open(out, "message", {{"type", "message"}, {"id", now_id("msg_")}, {"status", "in_progress"}, {"role", "assistant"}, {"content", json::array()}}))
                    out += event("response.content_part.added", item_ref({{"content_index", 0}, {"part", text_part("")}}));
                text_ += d.text;
                out += event("response.output_text.delta", item_ref({{"content_index", 0}, {"delta", d.text}, {"logprobs", json::array()}}));
                break;
            case delta::kind::tool_begin:
                close(out);
                ids_.push_back(d.tool_id);
                open(out, "function_call",
                     {{"type", "function_call"}, {"id", now_id("fc_")}, {"call_id", d.tool_id}, {"name", d.text}, {"arguments", ""}, {"status", "in_progress"}});
                break;
            case delta::kind::tool_arguments:
                text_ += d.text;
                out += event("response.function_call_arguments.delta", item_ref({{"delta", d.text}}));
                break;
            case delta::kind::tool_end: close(out); break;
            }
        }
        if (!ev.final) return out;
        close(out);
        final_ = ev;
        if (!ev.error) remember_tool_turn(ctx_, ev, ids_, thinking_);
        if (ev.error) return out + event("response.failed", {{"response", response("failed")}});
        if (ev.reason == finish_reason::length) return out + event("response.incomplete", {{"response", response("incomplete")}});
        return out + event("response.completed", {{"response", response("completed")}});
    }

    void collect(const gen_event& ev) override { stream_event(ev); }

    http_response buffered_response() override {
        if (final_.error) return error_response(*final_.error, error_shape::openai);
        return {200, "application/json", dump(response(final_.reason == finish_reason::length ? "incomplete" : "completed"))};
    }

private:
    std::string event(const char* type, json data) {
        data["type"] = type;
        data["sequence_number"] = sequence_++;
        return sse_event(type, dump(data));
    }
    json item_ref(json fields) const {
        fields["item_id"] = output_.back()["id"];
        fields["output_index"] = output_.size() - 1;
        return fields;
    }
    static json text_part(const std::string& text) { return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}; }

    // Opens an item of `type` unless one is open; true when it opened one.
    bool open(std::string& out, const char* type, json item) {
        if (!current_.empty() && current_ == type && current_ != "function_call") return false;
        close(out);
        current_ = type;
        text_.clear();
        output_.push_back(item);
        out += event("response.output_item.added", {{"output_index", output_.size() - 1}, {"item", std::move(item)}});
        return true;
    }

    void close(std::string& out) {
        if (current_.empty()) return;
        json& item = output_.back();
        if (current_ == "reasoning") {
            out += event("response.reasoning_text.done", item_ref({{"content_index", 0}, {"text", text_}}));
            item["content"] = json::array({{{"type", "reasoning_text"}, {"text", text_}}});
        } else if (current_ == "message") {
            out += event("response.output_text.done", item_ref({{"content_index", 0}, {"text", text_}, {"logprobs", json::array()}}));
            out += event("response.content_part.done", item_ref({{"content_index", 0}, {"part", text_part(text_)}}));
            item["content"] = json::array({text_part(text_)});
            item["status"] = "completed";
        } else {
            out += event("response.function_call_arguments.done", item_ref({{"arguments", text_}}));
            item["arguments"] = text_;
            item["status"] = "completed";
        }
        out += event("response.output_item.done", {{"output_index", output_.size() - 1}, {"item", item}});
        current_.clear();
    }

    json response(const char* status) const {
        json r = echo_;
        r["id"] = id_;
        r["object"] = "response";
        r["created_at"] = created_;
        r["status"] = status;
        r["model"] = ctx_.model_id;
        r["output"] = output_;
        r["error"] = final_.error ? json::parse(error_object(*final_.error, error_shape::openai)) : json(nullptr);
        r["incomplete_details"] = std::string(status) == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
        if (final_.final) {
            const usage_counts& u = final_.usage;
            r["usage"] = {{"input_tokens", u.prompt_tokens},
                          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                          {"output_tokens", u.completion_tokens},
                          {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
                          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
            r["timings"] = timings_json(final_.timings);
        } else {
            r["usage"] = nullptr;
        }
        return r;
    }

    server_context& ctx_;
    std::string id_;
    std::int64_t created_;
    bool show_reasoning_, thinking_;
    json echo_;  // request fields a response object repeats
    std::int64_t sequence_ = 0;
    std::string current_;  // the open item's type, or empty
    std::string text_;     // the open item's text so far
    json output_ = json::array();
    std::vector<std::string> ids_;
    gen_event final_;
};

// The assistant message function calls attach to: the last message if it is an assistant turn
// still open for calls, else a new one.
ref::chat_message& assistant_turn(prompt_request& p, std::optional<std::string>& reasoning) {
    if (p.messages.empty() || p.messages.back().role != ref::chat_role::assistant) {
        p.messages.push_back({ref::chat_role::assistant, {}, std::exchange(reasoning, std::nullopt), {}, {}});
    }
    return p.messages.back();
}

void read_input(const json& input, prompt_request& p) {
    if (input.is_string()) {
        p.messages.push_back({ref::chat_role::user, input.get<std::string>(), {}, {}, {}});
        return;
    }
    if (!input.is_array()) throw_api_error(error_code::invalid_type, "'input' must be a string or an array of items", "input");
    std::optional<std::string> reasoning;  // a reasoning item belongs to the assistant turn after it
    for (std::size_t i = 0; i < input.size(); ++i) {
        const std::string w = "input[" + std::to_string(i) + "]";
        const json& item = input[i];
        if (!item.is_object()) throw_api_error(error_code::invalid_type, "'" + w + "' must be an object", w);
        const std::string type = get_string(item, "type", w).value_or("message");
        if (type == "message") {
            const std::string role = get_string(item, "role", w).value_or("");
            const json* c = find_field(item, "content");
            const std::string text = c ? content_text(*c, w + ".content") : std::string();
            if (role == "user") p.messages.push_back({ref::chat_role::user, text, {}, {}, {}});
            else if (role == "system" || role == "developer") p.messages.push_back({ref::chat_role::system, text, {}, {}, {}});
            else if (role == "assistant") p.messages.push_back({ref::chat_role::assistant, text, std::exchange(reasoning, std::nullopt), {}, {}});
            else throw_api_error(error_code::invalid_value, "'" + w + ".role' must be user, system, developer or assistant", w + ".role");
        } else if (type == "function_call") {
            ref::chat_message& a = assistant_turn(p, reasoning);
            a.tool_calls.push_back({get_string(item, "call_id", w).value_or(""), get_string(item, "name", w).value_or(""),
                                    get_string(item, "arguments", w).value_or("{}")});
        } else if (type == "function_call_output") {
            p.messages.push_back({ref::chat_role::tool, get_string(item, "output", w).value_or(""), {}, {}, get_string(item, "call_id", w).value_or("")});
        } else if (type == "reasoning") {
            std::string text;
            if (const json* parts = get_array(item, "content", w))
                for (const json& part : *parts)
                    if (part.is_object()) text += part.value("text", "");
            reasoning = text;
        } else
            throw_api_error(error_code::invalid_value, "'" + w + ".type' of '" + type + "' is not supported", w + ".type");
    }
}

}  // namespace

route_result openai_responses(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    if (find_field(body, "previous_response_id"))
        throw_api_error(error_code::invalid_value, "'previous_response_id' is not supported: this server keeps no responses; send the whole input",
                        "previous_response_id");
    prompt_request p;
    if (auto instructions = get_string(body, "instructions")) p.messages.push_back({ref::chat_role::system, *instructions, {}, {}, {}});
    const json* input = find_field(body, "input");
    if (!input) throw_api_error(error_code::missing_field, "'input' is required", "input");
    read_input(*input, p);
    for (ref::chat_message& m : p.messages) restore_sampled_turn(m, ctx);
    p.tools = openai_tools(body);
    apply_tool_choice(body, p);
    bool show_reasoning = false;
    if (const json* r = get_object(body, "reasoning")) {
        const std::string effort = get_string(*r, "effort", "reasoning").value_or("medium");
        apply_reasoning_effort(effort, p);
        show_reasoning = p.thinking;
    }

    auto j = std::make_shared<job>();
    parse_sampling(body, *j);
    build_prompt(p, ctx, *j);
    set_token_budget(body, {"max_output_tokens"}, *j, ctx);
    json echo = {{"instructions", body.value("instructions", json(nullptr))},
                 {"max_output_tokens", body.value("max_output_tokens", json(nullptr))},
                 {"temperature", j->sampler.temperature},
                 {"top_p", j->sampler.top_p},
                 {"tools", body.value("tools", json::array())},
                 {"tool_choice", body.value("tool_choice", json("auto"))},
                 {"parallel_tool_calls", true}};
    generation_plan plan;
    plan.format = std::make_unique<responses_formatter>(ctx, show_reasoning, p.thinking, std::move(echo));
    plan.work = std::move(j);
    plan.stream = get_bool(body, "stream").value_or(false);
    return plan;
}

}  // namespace ds4::server
