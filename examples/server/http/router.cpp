#include "examples/server/http/router.hpp"

#include <cstdio>
#include <exception>

namespace ds4::server {

std::string_view http_request::header(std::string_view lower_name) const {
    for (const auto& [k, v] : headers)
        if (k == lower_name) return v;
    return {};
}

http_response error_response(const api_error& e, error_shape shape) {
    return {http_status(e), "application/json", error_body(e, shape)};
}

void router::add(std::string method, std::string path, handler h, error_shape shape, bool public_route) {
    routes_.push_back({std::move(method), std::move(path), std::move(h), shape, public_route});
}

error_shape router::shape_of(std::string_view path) const {
    for (const route& r : routes_)
        if (r.path == path) return r.shape;
    return error_shape::openai;
}

namespace {

// Constant-time in the key's bytes: the key must not leak through response timing.
bool same_key(std::string_view given, std::string_view key) {
    unsigned char diff = given.size() == key.size() ? 0 : 1;
    for (std::size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ (i < given.size() ? given[i] : 0));
    return diff == 0;
}

}  // namespace

route_result router::dispatch(const http_request& req) const {
    const route* found = nullptr;
    bool path_known = false;
    for (const route& r : routes_)
        if (r.path == req.path) {
            path_known = true;
            if (r.method == req.method) found = &r;
        }
    const error_shape shape = shape_of(req.path);
    if (!found) {
        if (path_known)
            return error_response({error_code::method_not_allowed, req.method + " is not allowed on " + req.path, "", false}, shape);
        return error_response({error_code::not_found, "no route " + req.method + " " + req.path, "", false}, shape);
    }
    if (!api_key_.empty() && !found->public_route) {
        std::string_view key = req.header("x-api-key");
        const std::string_view auth = req.header("authorization");
        if (key.empty() && auth.size() > 7 && (auth.substr(0, 7) == "Bearer " || auth.substr(0, 7) == "bearer "))
            key = auth.substr(7);
        if (!same_key(key, api_key_))
            return error_response({error_code::unauthorized, "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)", "", false},
                                  shape);
    }
    try {
        route_result r = found->h(req);
        if (auto* plan = std::get_if<generation_plan>(&r)) plan->shape = found->shape;
        return r;
    } catch (const api_exception& e) {
        return error_response(e.error, found->shape);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-server: %s %s: %s\n", req.method.c_str(), req.path.c_str(), e.what());
        return error_response({error_code::internal, e.what(), "", false}, found->shape);
    }
}

}  // namespace ds4::server
