#include "examples/server/api/request_fields.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>

#include "examples/server/output_processor.hpp"

namespace ds4::server {

namespace {

std::string field_name(std::string_view where, std::string_view key) {
    return where.empty() ? std::string(key) : std::string(where) + "." + std::string(key);
}

std::string_view type_name(const json& v) {
    switch (v.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    default: return "null";
    }
}

[[noreturn]] void wrong_type(std::string_view where, std::string_view key, std::string_view want, const json& v) {
    const std::string f = field_name(where, key);
    throw_api_error(error_code::invalid_type, "'" + f + "' must be " + std::string(want) + ", not " + std::string(type_name(v)), f);
}

}  // namespace

void tool_call_memory::remember(const std::vector<std::string>& ids, turn t) {
    std::lock_guard lock(mutex_);
    for (const std::string& id : ids) {
        if (turns_.emplace(id, t).second) order_.push_back(id);
    }
    while (order_.size() > capacity) {
        turns_.erase(order_.front());
        order_.pop_front();
    }
}

std::optional<tool_call_memory::turn> tool_call_memory::recall(const std::string& id) const {
    std::lock_guard lock(mutex_);
    const auto it = turns_.find(id);
    if (it == turns_.end()) return std::nullopt;
    return it->second;
}

json parse_body(std::string_view body) {
    const std::size_t bad = first_invalid_utf8(body);
    if (bad != std::string_view::npos)
        throw_api_error(error_code::invalid_utf8, "the request body is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    json j;
    try {
        j = json::parse(body);
    } catch (const json::exception& e) {
        // Not only parse_error: a number beyond double's range (1e999) is out_of_range, and was a
        // 500 (found by fuzz/http_fuzzer).
        throw_api_error(error_code::invalid_json, std::string("the request body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw_api_error(error_code::invalid_type, "the request body must be a JSON object, not " + std::string(type_name(j)));
    return j;
}

const json* find_field(const json& obj, std::string_view key) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

std::optional<std::string> get_string(const json& obj, std::string_view key, std::string_view where) {
    const json* v = find_field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(where, key, "a string", *v);
    return v->get<std::string>();
}

std::optional<bool> get_bool(const json& obj, std::string_view key, std::string_view where) {
    const json* v = find_field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(where, key, "a boolean", *v);
    return v->get<bool>();
}

std::optional<double> get_number(const json& obj, std::string_view key, double lo, double hi, std::string_view where) {
    const json* v = find_field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(where, key, "a number", *v);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
        const std::string f = field_name(where, key);
        throw_api_error(error_code::invalid_value, "'" + f + "' must be in [" + json(lo).dump() + ", " + json(hi).dump() + "]", f);
    }
    return x;
}

std::optional<std::int64_t> get_integer(const json& obj, std::string_view key, std::int64_t lo, std::int64_t hi,
                                        std::string_view where) {
    const json* v = find_field(obj, key);
    if (!v) return std::nullopt;
    const std::string f = field_name(where, key);
    const auto out_of_range = [&] {
        throw_api_error(error_code::invalid_value, "'" + f + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", f);
    };
    if (v->is_number_unsigned()) {
        const auto u = v->get<std::uint64_t>();
        // JSON's non-negative integers parse as unsigned: the lower bound matters here too (n: 0).
        if (u > std::uint64_t(hi) || (lo > 0 && u < std::uint64_t(lo))) out_of_range();
        return std::int64_t(u);
    }
    if (v->is_number_integer()) {
        const auto x = v->get<std::int64_t>();
        if (x < lo || x > hi) out_of_range();
        return x;
    }
    // 1e30 is an integer written as a float; 1.5 is not an integer at all.
    if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>())) out_of_range();
    wrong_type(where, key, "an integer", *v);
}

const json* get_array(const json& obj, std::string_view key, std::string_view where) {
    const json* v = find_field(obj, key);
    if (v && !v->is_array()) wrong_type(where, key, "an array", *v);
    return v;
}

const json* get_object(const json& obj, std::string_view key, std::string_view where) {
    const json* v = find_field(obj, key);
    if (v && !v->is_object()) wrong_type(where, key, "an object", *v);
    return v;
}

void for_each_object(const json& body, std::string_view key, const std::function<void(const json&, const std::string&)>& fn) {
    const json* arr = get_array(body, key);
    const std::string k(key);
    if (!arr || arr->empty()) throw_api_error(error_code::missing_field, "'" + k + "' must be a non-empty array", k);
    for (std::size_t i = 0; i < arr->size(); ++i) {
        const std::string w = k + "[" + std::to_string(i) + "]";
        if (!(*arr)[i].is_object()) throw_api_error(error_code::invalid_type, "'" + w + "' must be an object", w);
        fn((*arr)[i], w);
    }
}

void check_model(const json& body, const server_context& ctx) {
    const std::optional<std::string> m = get_string(body, "model");
    if (m && *m != ctx.model_id && *m != "ds4" && std::find(ctx.model_aliases.begin(), ctx.model_aliases.end(), *m) == ctx.model_aliases.end())
        throw_api_error(error_code::model_not_found, "the model '" + *m + "' does not exist; this server serves '" + ctx.model_id + "'",
                        "model");
}

void parse_sampling(const json& body, job& j) {
    engine::sampler& s = j.sampler;
    s.temperature = float(get_number(body, "temperature", 0.0, 2.0).value_or(1.0));
    s.top_p = float(get_number(body, "top_p", 0.0, 1.0).value_or(1.0));
    s.top_k = std::int32_t(get_integer(body, "top_k", -1, 1 << 30).value_or(0));
    s.min_p = float(get_number(body, "min_p", 0.0, 1.0).value_or(0.0));
    if (const json* seed = find_field(body, "seed")) {
        if (seed->is_number_integer() || seed->is_number_unsigned()) s.seed = seed->get<std::uint64_t>();  // two's complement for negatives
        else wrong_type({}, "seed", "an integer", *seed);
    } else {
        thread_local std::mt19937_64 rng{std::random_device{}()};
        s.seed = rng();
    }
}

void parse_logit_controls(const json& body, job& j, const server_context& ctx) {
    logit_controls& c = j.logits;
    c.frequency_penalty = float(get_number(body, "frequency_penalty", -2.0, 2.0).value_or(0.0));
    c.presence_penalty = float(get_number(body, "presence_penalty", -2.0, 2.0).value_or(0.0));
    if (const json* bias = get_object(body, "logit_bias")) {
        const std::int32_t n_vocab = ctx.backend.dims().n_vocab;
        for (const auto& [key, value] : bias->items()) {
            const std::string w = "logit_bias." + key;
            std::int64_t token = -1;
            const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), token);
            if (ec != std::errc() || end != key.data() + key.size() || token < 0 || token >= n_vocab)
                throw_api_error(error_code::invalid_value,
                                "'logit_bias' keys are token ids in [0, " + std::to_string(n_vocab) + "); got '" + key + "'", w);
            if (!value.is_number()) wrong_type({}, w, "a number", value);
            const double v = value.get<double>();
            if (!(v >= -100.0 && v <= 100.0))
                throw_api_error(error_code::invalid_value, "'" + w + "' must be in [-100, 100]", w);
            if (v != 0.0) c.bias.push_back({std::int32_t(token), float(v)});
        }
        // Keys are unique in a JSON object as parsed, but "7" and "07" name one token.
        std::sort(c.bias.begin(), c.bias.end(), [](const auto& a, const auto& b) { return a.token < b.token; });
        const auto dup = std::adjacent_find(c.bias.begin(), c.bias.end(),
                                            [](const auto& a, const auto& b) { return a.token == b.token; });
        if (dup != c.bias.end())
            throw_api_error(error_code::invalid_value, "'logit_bias' names token " + std::to_string(dup->token) + " twice",
                            "logit_bias");
    }
    if (const std::optional<double> rp = get_number(body, "repetition_penalty", 0.0, 1e9); rp && *rp != 1.0)
        throw_api_error(error_code::invalid_value,
                        "'repetition_penalty' is not supported (it scales logits); use frequency_penalty or presence_penalty",
                        "repetition_penalty");
    if (c.any() && !ctx.sched.caps().logit_adjust)
        throw_api_error(error_code::invalid_value,
                        "logit_bias, frequency_penalty and presence_penalty are not supported by the " +
                            ctx.sched.caps().name + " backend",
                        !c.bias.empty() ? "logit_bias" : c.frequency_penalty != 0.0f ? "frequency_penalty" : "presence_penalty");
}

std::vector<std::shared_ptr<job>> more_choices(const json& body, const job& j) {
    const int n = int(get_integer(body, "n", 1, 128).value_or(1));
    std::vector<std::shared_ptr<job>> more;
    for (int i = 1; i < n; ++i) {
        auto c = std::make_shared<job>();
        c->prompt = j.prompt;
        c->sampler = j.sampler;
        c->sampler.seed = j.sampler.seed + std::uint64_t(i);
        c->logits = j.logits;
        c->max_tokens = j.max_tokens;
        c->output = j.output;
        c->arrival = j.arrival;
        c->deadline = j.deadline;
        c->out = j.out;
        c->choice = i;
        c->after = j.prompt_ready;
        more.push_back(std::move(c));
    }
    return more;
}

std::vector<std::string> parse_stop(const json& body, std::string_view key) {
    std::vector<std::string> out;
    const json* v = find_field(body, key);
    if (!v) return out;
    if (v->is_string()) out.push_back(v->get<std::string>());
    else if (v->is_array()) {
        if (v->size() > 16) throw_api_error(error_code::invalid_value, "'" + std::string(key) + "' holds at most 16 strings", std::string(key));
        for (const json& s : *v) {
            if (!s.is_string()) wrong_type({}, key, "a string or an array of strings", *v);
            out.push_back(s.get<std::string>());
        }
    } else
        wrong_type({}, key, "a string or an array of strings", *v);
    std::erase_if(out, [](const std::string& s) { return s.empty(); });
    return out;
}

void set_token_budget(const json& body, std::initializer_list<std::string_view> keys, job& j, const server_context& ctx) {
    const int prompt = int(j.prompt.size());
    std::optional<std::int64_t> asked;
    std::string_view key = *keys.begin();
    for (std::string_view k : keys) {
        const json* v = find_field(body, k);
        if (!v) continue;
        key = k;
        if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()))
            throw_api_error(error_code::invalid_max_tokens, "'" + std::string(k) + "' is beyond any context", std::string(k));
        if (!v->is_number_integer() && !v->is_number_unsigned()) wrong_type({}, k, "an integer", *v);
        if (v->is_number_unsigned() && v->get<std::uint64_t>() > std::uint64_t(INT64_MAX))
            throw_api_error(error_code::invalid_max_tokens, "'" + std::string(k) + "' is beyond any context", std::string(k));
        asked = v->get<std::int64_t>();
        break;
    }
    if (prompt >= ctx.context_length)
        throw_api_error(error_code::context_length_exceeded,
                        "the prompt has " + std::to_string(prompt) + " tokens; the context holds " + std::to_string(ctx.context_length),
                        "messages");
    if (!asked) {
        j.max_tokens = ctx.context_length - prompt;
        return;
    }
    if (*asked < 1) throw_api_error(error_code::invalid_max_tokens, "'" + std::string(key) + "' must be at least 1", std::string(key));
    if (*asked > ctx.context_length)
        throw_api_error(error_code::invalid_max_tokens,
                        "'" + std::string(key) + "' of " + std::to_string(*asked) + " is over the whole context of " +
                            std::to_string(ctx.context_length) + " tokens",
                        std::string(key));
    if (prompt + *asked > ctx.context_length)
        throw_api_error(error_code::context_length_exceeded,
                        "the prompt (" + std::to_string(prompt) + " tokens) plus " + std::string(key) + " (" + std::to_string(*asked) +
                            ") is over the context of " + std::to_string(ctx.context_length) + " tokens",
                        std::string(key));
    j.max_tokens = int(*asked);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(const usage_counts& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
            {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

json timings_json(const timing_figures& t) {
    return {{"queue_ms", t.queue_ms},
            {"ttft_ms", t.ttft_ms},
            {"prefill_ms", t.prefill_ms},
            {"decode_ms", t.decode_ms},
            {"prefill_tokens_per_s", t.prefill_tokens_per_s},
            {"decode_tokens_per_s", t.decode_tokens_per_s},
            {"draft_tokens", t.draft_tokens},
            {"draft_tokens_accepted", t.draft_tokens_accepted}};
}

json logprob_entry(const token_logprobs& lp, const ref::tokenizer& tok) {
    const auto one = [&](std::int32_t token, float logprob) {
        const std::string& piece = tok.token_to_piece(token);
        json bytes = json::array();
        for (unsigned char c : piece) bytes.push_back(int(c));
        return json{{"token", piece}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
    };
    json e = one(lp.token, lp.logprob);
    json top = json::array();
    for (const engine::token_logprob& t : lp.top) top.push_back(one(t.token, t.logprob));
    e["top_logprobs"] = std::move(top);
    return e;
}

int parse_logprobs(const json& body, std::string_view flag, std::string_view top_key) {
    const json* f = find_field(body, flag);
    if (!f) return -1;
    if (f->is_boolean()) {
        if (!f->get<bool>()) return -1;
        return int(get_integer(body, top_key, 0, engine::max_logprobs).value_or(0));
    }
    return int(get_integer(body, flag, 0, engine::max_logprobs).value_or(0));
}

std::string now_id(std::string_view prefix) {
    std::string id = new_tool_call_id();  // "call_" + 24 hex digits
    return std::string(prefix) + id.substr(5);
}

std::int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::int32_t> tokenize_prompt(const server_context& ctx, const std::string& text) {
    return ctx.tok.encode(text, true);
}

void remember_tool_turn(server_context& ctx, const gen_event& final_ev, const std::vector<std::string>& ids, bool thinking) {
    if (ids.empty()) return;
    ctx.tool_memory.remember(ids, {final_ev.raw_reasoning, thinking, final_ev.raw_content});
}

}  // namespace ds4::server
