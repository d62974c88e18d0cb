#pragma once
// Every API surface, one handler per file, and the table that mounts them.
#include <cstdint>
#include <vector>

#include "examples/server/api/context.hpp"
#include "examples/server/api/request_fields.hpp"
#include "examples/server/http/router.hpp"
#include "text/chat_template.hpp"

namespace ds4::server {

struct prompt_request;

route_result openai_chat(server_context& ctx, const http_request& req);         // api/openai_chat.cpp
route_result openai_completions(server_context& ctx, const http_request& req);  // api/openai_completions.cpp
route_result openai_responses(server_context& ctx, const http_request& req);    // api/openai_responses.cpp
route_result anthropic_messages(server_context& ctx, const http_request& req);  // api/anthropic_messages.cpp
route_result anthropic_count_tokens(server_context& ctx, const http_request& req);
route_result tokenize(server_context& ctx, const http_request& req);    // api/tokenize.cpp
route_result detokenize(server_context& ctx, const http_request& req);

// The prompts the OpenAI routes feed: a chat request's messages, tools and thinking switches
// (api/openai_chat.cpp), a completion request's prompt as tokens, BOS first
// (api/openai_completions.cpp).
prompt_request chat_prompt(const json& body, server_context& ctx);
std::vector<std::int32_t> completion_prompt(const json& body, const server_context& ctx);

// api/info.cpp
http_response models_list(const server_context& ctx);
http_response health(const server_context& ctx);
http_response metrics_text(const server_context& ctx);
http_response stats_json(const server_context& ctx);

// Shared by the two OpenAI chat surfaces (api/openai_chat.cpp).
std::vector<ref::tool_spec> openai_tools(const json& body);
void apply_tool_choice(const json& body, prompt_request& p);

void add_routes(router& r, server_context& ctx);

}  // namespace ds4::server
