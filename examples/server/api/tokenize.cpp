// POST /tokenize and /detokenize (vLLM's shapes; clients count and inspect tokens with them).
//   /tokenize    {"prompt": text or tokens} -> the tokens /v1/completions would feed;
//                {"messages": [...], tools, ...} -> those /v1/chat/completions would feed;
//                answers {"count", "max_model_len", "tokens"}, and "token_strs" (each token's
//                text) when "return_token_strs" is true.
//   /detokenize  {"tokens": [ids]} -> {"prompt": the tokens' text, special tokens included}.
#include "examples/server/api/prompt.hpp"
#include "examples/server/api/routes.hpp"

namespace ds4::server {

route_result tokenize(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    job j;
    if (find_field(body, "messages")) build_prompt(chat_prompt(body, ctx), ctx, j);
    else if (find_field(body, "prompt")) j.prompt = completion_prompt(body, ctx);
    else throw_api_error(error_code::missing_field, "'prompt' or 'messages' is required", "prompt");
    json out = {{"count", j.prompt.size()}, {"max_model_len", ctx.context_length}, {"tokens", j.prompt}};
    if (get_bool(body, "return_token_strs").value_or(false)) {
        json strs = json::array();
        for (std::int32_t t : j.prompt) strs.push_back(ctx.tok.token_to_piece(t));
        out["token_strs"] = std::move(strs);
    }
    return http_response{200, "application/json", dump(out)};
}

route_result detokenize(server_context& ctx, const http_request& req) {
    const json body = parse_body(req.body);
    check_model(body, ctx);
    const json* tokens = get_array(body, "tokens");
    if (!tokens) throw_api_error(error_code::missing_field, "'tokens' is required", "tokens");
    std::string text;
    for (std::size_t i = 0; i < tokens->size(); ++i) {
        const json& t = (*tokens)[i];
        const std::string w = "tokens[" + std::to_string(i) + "]";
        if (!t.is_number_integer()) throw_api_error(error_code::invalid_type, "'" + w + "' must be a token id (an integer)", w);
        const auto id = t.get<std::int64_t>();
        if (id < 0 || id >= std::int64_t(ctx.tok.vocab_size()))
            throw_api_error(error_code::invalid_value,
                            "'" + w + "' is " + std::to_string(id) + ", outside the vocabulary of " + std::to_string(ctx.tok.vocab_size()),
                            w);
        text += ctx.tok.token_to_piece(std::int32_t(id));
    }
    return http_response{200, "application/json", dump({{"prompt", text}})};
}

}  // namespace ds4::server
