#pragma once
// What every API handler shares: the model's identity and tokenizer, the scheduler, the tool-call
// memory, and the server's counters for /metrics and /v1/stats.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ds4/engine/backend.hpp"
#include "examples/server/scheduler.hpp"
#include "text/tokenizer.hpp"

namespace ds4::server {

struct http_counters;

// The exact text the model sampled for a turn that ended in tool calls, under each call's id: a
// follow-up request that carries those calls back renders that turn byte-identically to what the
// model saw (the API's JSON arguments need not re-render to the same DSML bytes).
class tool_call_memory {
public:
    struct turn {
        std::string reasoning;  // raw, without <think> / </think>
        bool thinking = true;
        std::string content;    // raw, the DSML block included
    };
    void remember(const std::vector<std::string>& ids, turn t);
    std::optional<turn> recall(const std::string& id) const;

private:
    static constexpr std::size_t capacity = 4096;
    mutable std::mutex mutex_;
    std::list<std::string> order_;  // oldest first
    std::unordered_map<std::string, turn> turns_;
};

struct server_context {
    engine::backend& backend;
    const ref::tokenizer& tok;
    scheduler& sched;
    std::string model_id;
    server_context(engine::backend& b, const ref::tokenizer& t, scheduler& s, std::string id)
        : backend(b), tok(t), sched(s), model_id(std::move(id)) {}
    std::vector<std::string> model_aliases;  // other names `model` may carry
    int context_length = 0;
    std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
    http_counters* counters = nullptr;  // set once the HTTP server exists
    double stall_limit_ms = 30000;
    tool_call_memory tool_memory;
};

}  // namespace ds4::server
