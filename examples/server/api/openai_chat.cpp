// POST /v1/chat/completions (OpenAI Chat Completions).
// Streaming lifecycle: a chunk with delta {role:"assistant", content:""}; chunks with delta
// reasoning_content / content / tool_calls (a call's first chunk carries index, id, type and name,
// the next ones argument text); a chunk with an empty delta and finish_reason (plus usage and
// ds4's timings); with stream_options.include_usage a chunk with no choices and the usage; then
// "data: [DONE]". A failure after the stream began is a data frame {"error":{...}} before [DONE].
// With n > 1 every chunk names its choice by index, each choice ends with its own finish chunk,
// and the usage chunk (prompt once, answers summed) and [DONE] follow the last of them.
#include "examples/server/api/routes.hpp"

#include <algorithm>

#include "examples/server/api/prompt.hpp"
#include "examples/server/http/sse.hpp"

namespace ds4::server {

namespace {

std::string_view finish_name(finish_reason r) {
    switch (r) {
    case finish_reason::length: return "length";
    case finish_reason::tool_calls: return "tool_calls";
    default: return "stop";
    }
}

class chat_formatter final : public generation_formatter {
public:
    chat_formatter(server_context& ctx, bool include_usage, bool logprobs, bool thinking, int n)
        : ctx_(ctx), id_(now_id("chatcmpl-")), created_(unix_time()), include_usage_(include_usage), logprobs_(logprobs),
          thinking_(thinking), choices_(std::size_t(n)) {}

    std::string stream_start() override {
        std::string out;
        for (int i = 0; i < int(choices_.size()); ++i) out += sse_data(dump(chunk({{"role", "assistant"}, {"content", ""}}, i)));
        return out;
    }

    std::string stream_event(const gen_event& ev) override {
        std::string out;
        track(ev);
        json d = json::object();
        for (const delta& x : ev.deltas) {
            switch (x.type) {
            case delta::kind::reasoning: append_text(out, d, ev, "reasoning_content", x.text); break;
            case delta::kind::content: append_text(out, d, ev, "content", x.text); break;
            case delta::kind::tool_begin:
                flush(out, d, ev, false);
                d["tool_calls"] = json::array(
                    {{{"index", x.tool_index}, {"id", x.tool_id}, {"type", "function"}, {"function", {{"name", x.text}, {"arguments", ""}}}}});
                break;
            case delta::kind::tool_arguments:
                if (!d.contains("tool_calls") || d["tool_calls"][0]["index"] != x.tool_index) {
                    flush(out, d, ev, false);
                    d["tool_calls"] = json::array({{{"index", x.tool_index}, {"function", {{"arguments", ""}}}}});
                }
                d["tool_calls"][0]["function"]["arguments"] = d["tool_calls"][0]["function"]["arguments"].get<std::string>() + x.text;
                break;
            case delta::kind::tool_end: break;
            }
        }
        flush(out, d, ev, true);
        if (!ev.final) return out;
        choice_of(ev).final = ev;
        if (ev.error) {
            out += sse_data("{\"error\":" + error_object(*ev.error, error_shape::openai) + "}");
        } else {
            json last = chunk(json::object(), ev.choice);
            last["choices"][0]["finish_reason"] = finish_name(ev.reason);
            last["usage"] = usage_json(ev.usage);
            last["timings"] = timings_json(ev.timings);
            out += sse_data(dump(last));
        }
        if (++finals_ < int(choices_.size())) return out;
        // Once every choice has ended: the request's usage, then the end of the stream.
        if (include_usage_ && !any_error()) {
            json u = chunk(json::object(), 0);
            u["choices"] = json::array();
            u["usage"] = usage_json(total_usage());
            out += sse_data(dump(u));
        }
        out += sse_data("[DONE]");
        return out;
    }

    void collect(const gen_event& ev) override {
        track(ev);
        choice& c = choice_of(ev);
        for (const delta& x : ev.deltas) {
            switch (x.type) {
            case delta::kind::reasoning: c.reasoning += x.text; c.have_reasoning = true; break;
            case delta::kind::content: c.content += x.text; break;
            case delta::kind::tool_begin:
                c.calls.push_back({{"id", x.tool_id}, {"type", "function"}, {"function", {{"name", x.text}, {"arguments", ""}}}});
                break;
            case delta::kind::tool_arguments:
                c.calls.back()["function"]["arguments"] = c.calls.back()["function"]["arguments"].get<std::string>() + x.text;
                break;
            case delta::kind::tool_end: break;
            }
        }
        for (const token_logprobs& lp : ev.logprobs) c.logprob_content.push_back(logprob_entry(lp, ctx_.tok));
        if (ev.final) c.final = ev;
    }

    http_response buffered_response() override {
        for (const choice& c : choices_)
            if (c.final.error) return error_response(*c.final.error, error_shape::openai);
        json list = json::array();
        for (std::size_t i = 0; i < choices_.size(); ++i) {
            const choice& c = choices_[i];
            json msg = {{"role", "assistant"}, {"content", c.content}};
            if (c.have_reasoning || thinking_) msg["reasoning_content"] = c.reasoning;
            if (!c.calls.empty()) msg["tool_calls"] = c.calls;
            json item = {{"index", i}, {"message", std::move(msg)}, {"finish_reason", finish_name(c.final.reason)}};
            item["logprobs"] = logprobs_ ? json{{"content", c.logprob_content}} : json(nullptr);
            list.push_back(std::move(item));
        }
        json body = {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", ctx_.model_id}, {"choices", std::move(list)}};
        body["usage"] = usage_json(total_usage());
        body["timings"] = timings_json(choices_[0].final.timings);
        return {200, "application/json", dump(body)};
    }

private:
    struct choice {
        std::string content, reasoning;
        bool have_reasoning = false;
        json calls = json::array();
        json logprob_content = json::array();
        std::vector<std::string> ids;  // its tool-call ids, for the tool-call memory
        gen_event final;
    };

    choice& choice_of(const gen_event& ev) { return choices_.at(std::size_t(ev.choice)); }
    bool any_error() const {
        return std::any_of(choices_.begin(), choices_.end(), [](const choice& c) { return c.final.error.has_value(); });
    }
    // The request's usage: the prompt once (choice 0's, which prefilled it), the answers summed.
    usage_counts total_usage() const {
        usage_counts u = choices_[0].final.usage;
        for (std::size_t i = 1; i < choices_.size(); ++i) {
            u.completion_tokens += choices_[i].final.usage.completion_tokens;
            u.reasoning_tokens += choices_[i].final.usage.reasoning_tokens;
        }
        return u;
    }

    json chunk(json delta_obj, int index) const {
        json c = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", ctx_.model_id}};
        c["choices"] = json::array({{{"index", index}, {"delta", std::move(delta_obj)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
        return c;
    }

    // Text after a tool call within one event goes in a chunk of its own.
    void append_text(std::string& out, json& d, const gen_event& ev, const char* key, const std::string& text) {
        if (d.contains("tool_calls")) flush(out, d, ev, false);
        d[key] = d.value(key, std::string()) + text;
    }

    // One chunk per kind change keeps each delta in the shape clients expect.
    void flush(std::string& out, json& d, const gen_event& ev, bool with_logprobs) {
        if (d.empty() && !(with_logprobs && logprobs_ && !ev.logprobs.empty())) return;
        json c = chunk(std::move(d), ev.choice);
        if (with_logprobs && logprobs_ && !ev.logprobs.empty()) {
            json lps = json::array();
            for (const token_logprobs& lp : ev.logprobs) lps.push_back(logprob_entry(lp, ctx_.tok));
            c["choices"][0]["logprobs"] = {{"content", std::move(lps)}};
        }
        out += sse_data(dump(c));
        d = json::object();
    }

    // Tool-call ids of each choice, for the tool-call memory.
    void track(const gen_event& ev) {
        choice& c = choice_of(ev);
        for (const delta& x : ev.deltas)
            if (x.type == delta::kind::tool_begin) c.ids.push_back(x.tool_id);
        if (ev.final && !ev.error) remember_tool_turn(ctx_, ev, c.ids, thinking_);
    }

    server_context& ctx_;
    std::string id_;
    std::int64_t created_;
    bool include_usage_, logprobs_, thinking_;
    std::vector<choice> choices_;
    int finals_ = 0;
};

ref::chat_role role_of(const std::string& role, const std::string& where) {
    if (role == "system" || role == "developer") return ref::chat_role::system;
    if (role == "user") return ref::chat_role::user;
    if (role == "assistant") return ref::chat_role::assistant;
    if (role == "tool" || role == "function") return ref::chat_role::tool;
    throw_api_error(error_code::invalid_value, "'" + where + ".role' must be system, developer, user, assistant or tool", where + ".role");
}

}  // namespace

std::vector<ref::tool_spec> openai_tools(const json& body) {
    std::vector<ref::tool_spec> tools;
    const json* arr = get_array(body, "tools");
    if (!arr) return tools;
    for (std::size_t i = 0; i < arr->size(); ++i) {
        const std::string w = "tools[" + std::to_string(i) + "]";
        const json& t = (*arr)[i];
        if (!t.is_object()) throw_api_error(error_code::invalid_type, "'" + w + "' must be an object", w);
        // Chat nests the function; Responses flattens it.
        const json* fn = get_object(t, "function", w);
        const json& f = fn ? *fn : t;
        const std::string fw = fn ? w + ".function" : w;
        ref::tool_spec s;
        s.name = get_string(f, "name", fw).value_or("");
        if (s.name.empty()) throw_api_error(error_code::missing_field, "'" + fw + ".name' is required", fw + ".name");
        s.description = get_string(f, "description", fw).value_or("");
        const json* params = get_object(f, "parameters", fw);
        s.parameters_json = params ? dump(*params) : "{\"type\":\"object\",\"properties\":{}}";
        tools.push_back(std::move(s));
    }
    return tools;
}

// tool_choice: "none" switches tools off; a named function keeps that tool only; "auto" and
// "required" keep all (required cannot be enforced without constrained decoding: the model is
// told the tools and decides).
void apply_tool_choice(const json& body, prompt_request& p) {
    const json* c = find_field(body, "tool_choice");
    if (!c) return;
    if (c->is_string()) {
        const std::string s = c->get<std::string>();
        if (s == "none") p.tools_enabled = false;
        else if (s != "auto" && s != "required" && s != "any")
            throw_api_error(error_code::invalid_value, "'tool_choice' must be none, auto, required or a named tool", "tool_choice");
        return;
    }
    if (!c->is_object()) throw_api_error(error_code::invalid_type, "'tool_choice' must be a string or an object", "tool_choice");
    std::string name;
    if (const json* fn = get_object(*c, "function", "tool_choice")) name = get_string(*fn, "name", "tool_choice.function").value_or("");
    else name = get_string(*c, "name", "tool_choice").value_or("");
    const std::string type = get_string(*c, "type", "tool_choice").value_or("");
    if (type == "none") p.tools_enabled = false;
    if (name.empty()) return;
    std::erase_if(p.tools, [&](const ref::tool_spec& t) { return t.name != name; });
    if (p.tools.empty()) throw_api_error(error_code::invalid_value, "'tool_choice' names no tool in 'tools'", "tool_choice");
}

prompt_request chat_prompt(const json& body, server_context& ctx) {
    prompt_request p;
    for_each_object(body, "messages", [&](const json& m, const std::string& w) {
        ref::chat_message cm;
        const std::optional<std::string> role = get_string(m, "role", w);
        if (!role) throw_api_error(error_code::missing_field, "'" + w + ".role' is required", w + ".role");
        cm.role = role_of(*role, w);
        if (const json* c = find_field(m, "content")) cm.content = content_text(*c, w + ".content");
        if (cm.role == ref::chat_role::assistant) {
            if (auto r = get_string(m, "reasoning_content", w)) cm.reasoning = *r;
            if (const json* calls = get_array(m, "tool_calls", w))
                for (std::size_t k = 0; k < calls->size(); ++k) {
                    const std::string cw = w + ".tool_calls[" + std::to_string(k) + "]";
                    const json& c = (*calls)[k];
                    if (!c.is_object()) throw_api_error(error_code::invalid_type, "'" + cw + "' must be an object", cw);
                    const json* fn = get_object(c, "function", cw);
                    if (!fn) throw_api_error(error_code::missing_field, "'" + cw + ".function' is required", cw + ".function");
                    ref::tool_call tc;
                    tc.id = get_string(c, "id", cw).value_or("");
                    tc.name = get_string(*fn, "name", cw + ".function").value_or("");
                    tc.arguments = get_string(*fn, "arguments", cw + ".function").value_or("{}");
                    cm.tool_calls.push_back(std::move(tc));
                }
            restore_sampled_turn(cm, ctx);
        }
        if (cm.role == ref::chat_role::tool) cm.tool_call_id = get_string(m, "tool_call_id", w).value_or("");
        p.messages.push_back(std::move(cm));
    });
    p.tools = openai_tools(body);
    apply_tool_choice(body, p);
    if (auto effort = get_string(body, "reasoning_effort")) apply_reasoning_effort(*effort, p);
    if (const json* kw = get_object(body, "chat_template_kwargs")) {
        if (auto t = get_bool(*kw, "thinking", "chat_template_kwargs")) p.thinking = *t;
        if (auto t = get_bool(*kw, "enable_thinking", "chat_template_kwargs")) p.thinking = *t;
    }
    return p;
}

route_result openai_chat(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    const prompt_request p = chat_prompt(body, ctx);

    auto j = std::make_shared<job>();
    parse_sampling(body, *j);
    parse_logit_controls(body, *j, ctx);
    j->output.stop = parse_stop(body, "stop");
    j->output.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    j->output.n_logprobs = parse_logprobs(body, "logprobs", "top_logprobs");
    j->sampler.n_logprobs = std::max(0, j->output.n_logprobs);
    build_prompt(p, ctx, *j);
    set_token_budget(body, {"max_completion_tokens", "max_tokens"}, *j, ctx);

    const bool stream = get_bool(body, "stream").value_or(false);
    bool include_usage = false;
    if (const json* so = get_object(body, "stream_options")) include_usage = get_bool(*so, "include_usage", "stream_options").value_or(false);
    generation_plan plan;
    plan.more = more_choices(body, *j);
    plan.work = std::move(j);
    plan.format = std::make_unique<chat_formatter>(ctx, include_usage, plan.work->output.n_logprobs >= 0, p.thinking,
                                                   1 + int(plan.more.size()));
    plan.stream = stream;
    return plan;
}

}  // namespace ds4::server
