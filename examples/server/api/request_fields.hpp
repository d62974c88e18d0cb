#pragma once
// Typed access to request JSON: every field read through these helpers reports a wrong type or
// an unusable value as an api_error naming the field, and unknown fields are simply never read.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/server/api/context.hpp"
#include "examples/server/job.hpp"

namespace ds4::server {

using json = nlohmann::json;

// UTF-8 check (invalid_utf8 with the byte offset), then a strict parse (invalid_json with the
// parser's position); the top level must be an object.
json parse_body(std::string_view body);

const json* find_field(const json& obj, std::string_view key);  // nullptr when absent or null
std::optional<std::string> get_string(const json& obj, std::string_view key, std::string_view where = {});
std::optional<bool> get_bool(const json& obj, std::string_view key, std::string_view where = {});
std::optional<double> get_number(const json& obj, std::string_view key, double lo, double hi, std::string_view where = {});
std::optional<std::int64_t> get_integer(const json& obj, std::string_view key, std::int64_t lo, std::int64_t hi,
                                        std::string_view where = {});
const json* get_array(const json& obj, std::string_view key, std::string_view where = {});
const json* get_object(const json& obj, std::string_view key, std::string_view where = {});

// Calls fn(item, "key[i]") for each element of the array `key`, which must be present and
// non-empty, and whose elements must be objects.
void for_each_object(const json& body, std::string_view key, const std::function<void(const json&, const std::string&)>& fn);

// `model`, when present, must name the served model.
void check_model(const json& body, const server_context& ctx);

// temperature, top_p, top_k, min_p and seed into the job's sampler (a random seed when absent).
void parse_sampling(const json& body, job& j);
// logit_bias ({"token id": -100..100}), frequency_penalty and presence_penalty (-2..2) into the
// job; a backend that cannot apply them (capabilities::logit_adjust) refuses non-neutral ones,
// and so does every backend for repetition_penalty != 1 (a multiplicative change: not supported).
void parse_logit_controls(const json& body, job& j, const server_context& ctx);
std::vector<std::string> parse_stop(const json& body, std::string_view key);

// OpenAI's n (1..128): choices 1..n-1 of the request as jobs of their own on j's channel, with
// j's prompt, budget and output options and the seeds after j's (a seeded request's choices are
// reproducible, each equal to a one-choice request with its seed). Call once j is complete.
std::vector<std::shared_ptr<job>> more_choices(const json& body, const job& j);

// max_tokens: absent = what is left of the context; < 1 or over the whole context =
// invalid_max_tokens; prompt + max_tokens over the context = context_length_exceeded.
void set_token_budget(const json& body, std::initializer_list<std::string_view> keys, job& j, const server_context& ctx);

// JSON text for responses: invalid UTF-8 (never produced, but never fatal) becomes U+FFFD.
std::string dump(const json& j);

json usage_json(const usage_counts& u);          // OpenAI chat/completions usage
json timings_json(const timing_figures& t);
// {"token","logprob","bytes","top_logprobs":[...]} of OpenAI's logprobs content.
json logprob_entry(const token_logprobs& lp, const ref::tokenizer& tok);
// The logprobs request fields: `flag` (bool, or an integer count for /v1/completions) and
// `top_key` (0..20): -1 when no logprobs were asked for.
int parse_logprobs(const json& body, std::string_view flag, std::string_view top_key);
std::string now_id(std::string_view prefix);     // prefix + random hex
std::int64_t unix_time();

// The tokenized prompt (BOS included by the template), checked against the context.
std::vector<std::int32_t> tokenize_prompt(const server_context& ctx, const std::string& text);

// Every finished generation: counted, and its tool calls remembered with the exact sampled text.
void remember_tool_turn(server_context& ctx, const gen_event& final_ev, const std::vector<std::string>& ids, bool thinking);

}  // namespace ds4::server
