// POST /v1/completions (OpenAI legacy Completions): a raw prompt, no chat template, no reasoning
// split and no tool calls. Streaming lifecycle: "text_completion" chunks with choices[0].text,
// the last with finish_reason (and usage, timings); with stream_options.include_usage a chunk with
// no choices and the usage; then "data: [DONE]". With n > 1 each chunk names its choice by index
// and the usage chunk and [DONE] follow the last choice's end.
#include "examples/server/api/routes.hpp"

#include <algorithm>

#include "examples/server/http/sse.hpp"

namespace ds4::server {

namespace {

class completion_formatter final : public generation_formatter {
public:
    completion_formatter(server_context& ctx, bool include_usage, bool logprobs, int n)
        : ctx_(ctx), id_(now_id("cmpl-")), created_(unix_time()), include_usage_(include_usage), logprobs_(logprobs),
          choices_(std::size_t(n)) {}

    std::string stream_start() override { return {}; }

    std::string stream_event(const gen_event& ev) override {
        choice& c = choices_.at(std::size_t(ev.choice));
        std::string out, text;
        for (const delta& d : ev.deltas) text += d.text;
        json lp = logprobs_json(ev, c.offset);
        c.offset += text.size();
        if (!text.empty() || !lp.is_null()) out += sse_data(dump(chunk(text, std::move(lp), nullptr, ev.choice)));
        if (!ev.final) return out;
        c.final = ev;
        if (ev.error) {
            out += sse_data("{\"error\":" + error_object(*ev.error, error_shape::openai) + "}");
        } else {
            json last = chunk("", nullptr, finish_name(ev.reason), ev.choice);
            last["usage"] = usage_json(ev.usage);
            last["timings"] = timings_json(ev.timings);
            out += sse_data(dump(last));
        }
        if (++finals_ < int(choices_.size())) return out;
        if (include_usage_ && !any_error()) {
            json u = chunk("", nullptr, nullptr, 0);
            u["choices"] = json::array();
            u["usage"] = usage_json(total_usage());
            out += sse_data(dump(u));
        }
        return out + sse_data("[DONE]");
    }

    void collect(const gen_event& ev) override {
        choice& c = choices_.at(std::size_t(ev.choice));
        // A final event may carry no tokens (a timeout, a cancellation, an engine error): no
        // arrays to append then (found by fuzz/http_fuzzer: indexing the null threw out of the
        // connection's event handler).
        if (logprobs_ && !ev.logprobs.empty()) {
            const json lp = logprobs_json(ev, c.text.size());
            for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
                for (const json& v : lp[k]) c.lp[k].push_back(v);
        }
        for (const delta& d : ev.deltas) c.text += d.text;
        if (ev.final) c.final = ev;
    }

    http_response buffered_response() override {
        for (const choice& c : choices_)
            if (c.final.error) return error_response(*c.final.error, error_shape::openai);
        json body = chunk(choices_[0].text, logprobs_ ? choices_[0].lp : json(nullptr), finish_name(choices_[0].final.reason), 0);
        for (std::size_t i = 1; i < choices_.size(); ++i) {
            const choice& c = choices_[i];
            body["choices"].push_back(chunk(c.text, logprobs_ ? c.lp : json(nullptr), finish_name(c.final.reason), int(i))["choices"][0]);
        }
        body["usage"] = usage_json(total_usage());
        body["timings"] = timings_json(choices_[0].final.timings);
        return {200, "application/json", dump(body)};
    }

private:
    struct choice {
        std::size_t offset = 0;  // text streamed so far (logprobs' text_offset)
        std::string text;
        json lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
        gen_event final;
    };

    static json finish_name(finish_reason r) { return r == finish_reason::length ? "length" : "stop"; }

    bool any_error() const {
        return std::any_of(choices_.begin(), choices_.end(), [](const choice& c) { return c.final.error.has_value(); });
    }
    // The request's usage: the prompt once (choice 0's, which prefilled it), the answers summed.
    usage_counts total_usage() const {
        usage_counts u = choices_[0].final.usage;
        for (std::size_t i = 1; i < choices_.size(); ++i) u.completion_tokens += choices_[i].final.usage.completion_tokens;
        return u;
    }

    json chunk(const std::string& text, json logprobs, json finish, int index) const {
        return {{"id", id_},
                {"object", "text_completion"},
                {"created", created_},
                {"model", ctx_.model_id},
                {"choices", json::array({{{"text", text}, {"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}}})}};
    }

    // The legacy shape: parallel arrays, top alternatives as {token text: logprob} objects.
    json logprobs_json(const gen_event& ev, std::size_t offset) const {
        if (!logprobs_ || ev.logprobs.empty()) return nullptr;
        json j = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
        for (const token_logprobs& lp : ev.logprobs) {
            const std::string& piece = ctx_.tok.token_to_piece(lp.token);
            j["tokens"].push_back(piece);
            j["token_logprobs"].push_back(lp.logprob);
            json top = json::object();
            for (const engine::token_logprob& t : lp.top) top[ctx_.tok.token_to_piece(t.token)] = t.logprob;
            j["top_logprobs"].push_back(std::move(top));
            j["text_offset"].push_back(offset);
            offset += piece.size();
        }
        return j;
    }

    server_context& ctx_;
    std::string id_;
    std::int64_t created_;
    bool include_usage_, logprobs_;
    std::vector<choice> choices_;
    int finals_ = 0;
};

}  // namespace

std::vector<std::int32_t> completion_prompt(const json& body, const server_context& ctx) {
    std::vector<std::int32_t> tokens;
    const json* prompt = find_field(body, "prompt");
    if (!prompt) throw_api_error(error_code::missing_field, "'prompt' is required", "prompt");
    std::string text;
    if (prompt->is_string()) text = prompt->get<std::string>();
    else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) text = (*prompt)[0].get<std::string>();
    else if (prompt->is_array() && !prompt->empty() && std::all_of(prompt->begin(), prompt->end(), [](const json& t) { return t.is_number_integer(); })) {
        for (const json& t : *prompt) {
            const auto id = t.get<std::int64_t>();
            if (id < 0 || id >= std::int64_t(ctx.tok.vocab_size()))
                throw_api_error(error_code::invalid_value, "'prompt' holds token " + std::to_string(id) + ", outside the vocabulary", "prompt");
            tokens.push_back(std::int32_t(id));
        }
    } else
        throw_api_error(error_code::invalid_type, "'prompt' must be a string, one string in an array, or an array of token ids", "prompt");
    if (tokens.empty()) {
        // Special-token text is honoured, as the chat template's output is; BOS is added if missing.
        tokens = tokenize_prompt(ctx, text);
        if (tokens.empty() || tokens.front() != ctx.tok.bos_id()) tokens.insert(tokens.begin(), ctx.tok.bos_id());
    }
    return tokens;
}

route_result openai_completions(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    auto j = std::make_shared<job>();
    j->prompt = completion_prompt(body, ctx);
    parse_sampling(body, *j);
    parse_logit_controls(body, *j, ctx);
    j->output.raw_text = true;
    j->output.thinking = false;
    j->output.parse_tools = false;
    j->output.stop = parse_stop(body, "stop");
    j->output.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    j->output.n_logprobs = parse_logprobs(body, "logprobs", "top_logprobs");
    j->sampler.n_logprobs = std::max(0, j->output.n_logprobs);
    // The legacy API's default is 16 tokens, not the rest of the context.
    json budget = body;
    if (!find_field(budget, "max_tokens")) budget["max_tokens"] = std::min<std::int64_t>(16, ctx.context_length - std::int64_t(j->prompt.size()));
    set_token_budget(budget, {"max_tokens"}, *j, ctx);

    bool include_usage = false;
    if (const json* so = get_object(body, "stream_options")) include_usage = get_bool(*so, "include_usage", "stream_options").value_or(false);
    generation_plan plan;
    plan.more = more_choices(body, *j);
    plan.work = std::move(j);
    plan.format = std::make_unique<completion_formatter>(ctx, include_usage, plan.work->output.n_logprobs >= 0,
                                                         1 + int(plan.more.size()));
    plan.stream = get_bool(body, "stream").value_or(false);
    return plan;
}

}  // namespace ds4::server
