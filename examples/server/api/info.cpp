// GET /v1/models, /health, /metrics (Prometheus text exposition format 0.0.4), /v1/stats (JSON),
// and the route table.
#include <cstdio>

#include "examples/server/api/routes.hpp"
#include "examples/server/http/server.hpp"

namespace ds4::server {

http_response models_list(const server_context& ctx) {
    json data = json::array();
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(ctx.started.time_since_epoch()).count();
    std::vector<std::string> ids{ctx.model_id};
    ids.insert(ids.end(), ctx.model_aliases.begin(), ctx.model_aliases.end());
    for (const std::string& id : ids)
        data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "ds4"}, {"context_length", ctx.context_length}});
    return {200, "application/json", dump({{"object", "list"}, {"data", std::move(data)}})};
}

// Healthy while the engine loop's heartbeat is fresh: a step stuck in the backend (or a dead
// engine thread) turns it into 503, whatever the sockets still do.
http_response health(const server_context& ctx) {
    const double age = ctx.sched.heartbeat_age_ms();
    const bool ok = age <= ctx.stall_limit_ms;
    const json j = {{"status", ok ? "ok" : "stalled"}, {"heartbeat_age_ms", age}, {"stall_limit_ms", ctx.stall_limit_ms}};
    return {ok ? 200 : 503, "application/json", dump(j)};
}

json stats_object(const server_context& ctx) {
    const scheduler_stats s = ctx.sched.stats();
    const engine::memory_ledger m = ctx.backend.memory();
    json j;
    j["model"] = ctx.model_id;
    j["backend"] = ctx.sched.caps().name;
    j["sequences"] = {{"running", s.running}, {"prefilling", s.prefilling}, {"decoding", s.decoding}, {"backend", m.sequences}};
    j["queue"] = {{"waiting", s.waiting}, {"draining", s.draining}};
    j["memory"] = {{"weights", m.weights},         {"kv_used", m.kv_used},         {"kv_capacity", m.kv_capacity},
                   {"kv_pages_used", m.kv_pages_used}, {"sequence_state", m.sequence_state}, {"scratch", m.scratch},
                   {"device_total", m.device_total}, {"device_free", m.device_free},   {"charged", s.charged_bytes},
                   {"prefix_cache_idle", s.cache_bytes}, {"disk_kv", s.disk.bytes},    {"disk_kv_pending", s.disk.pending_bytes},
                   {"floor", s.mem_floor},
                   {"total", m.weights + m.kv_used + m.sequence_state + m.scratch},   {"refusals", s.refusals}};
    j["prefix_cache"] = {{"entries", s.cache_entries}, {"hits", s.cache_hits}, {"cached_tokens", s.cached_tokens},
                         {"lookups", s.cache_lookups}, {"idle_bytes", s.cache_bytes},
                         {"hit_rate", s.cache_lookups ? double(s.cache_hits) / double(s.cache_lookups) : 0.0}};
    j["disk_kv"] = {{"enabled", s.disk_enabled}, {"files", s.disk.files},         {"bytes", s.disk.bytes},
                    {"budget", s.disk.budget},   {"hits", s.disk.hits},           {"restored_tokens", s.disk_tokens},
                    {"saves", s.disk.saves},     {"save_errors", s.disk.save_errors}, {"evictions", s.disk.evictions},
                    {"rejected_files", s.disk.rejected}, {"pending", s.disk.pending}, {"pending_bytes", s.disk.pending_bytes},
                    {"dropped", s.disk.dropped}, {"abandoned", s.disk.abandoned}, {"last_error", s.disk.last_error}};
    j["speeds"] = {{"prefill_tokens_per_s", s.prefill_tokens_per_s}, {"decode_tokens_per_s", s.decode_tokens_per_s}};
    j["steps"] = {{"count", s.steps},
                  {"prefill_tokens", s.prefill_tokens},
                  {"decode_tokens", s.decode_tokens},
                  {"max_rows", s.max_step_rows},
                  {"max_prefill_rows", s.max_step_prefill_rows},
                  {"max_decode_gap_steps", s.max_decode_gap_steps},
                  {"backend_s", s.backend_s},
                  {"host_s", s.host_s}};
    j["speculative"] = {{"draft", draft_source_name(s.draft)},
                        {"tokens_per_step", s.spec_tokens},
                        {"drafted", s.spec_drafted},
                        {"accepted", s.spec_accepted},
                        {"acceptance_rate", s.spec_drafted ? double(s.spec_accepted) / double(s.spec_drafted) : 0.0}};
    const scheduler_options& o = ctx.sched.options();
    j["policy"] = {{"max_seqs", o.max_seqs}, {"step_tokens", o.step_tokens}, {"prefill_chunk", o.prefill_chunk}, {"prefix_cache", o.prefix_cache}};
    j["requests"] = {{"finished", s.requests_finished}, {"cancelled", s.requests_cancelled}, {"failed", s.requests_failed}};
    j["heartbeat_age_ms"] = s.heartbeat_age_ms;
    if (ctx.counters) {
        const http_counters& c = *ctx.counters;
        j["http"] = {{"connections_open", c.connections_open.load()}, {"connections_total", c.connections_total.load()},
                     {"requests_total", c.requests_total.load()},     {"errors_total", c.errors_total.load()},
                     {"client_disconnects", c.client_disconnects.load()}, {"generations_open", c.generations_open.load()}};
    }
    return j;
}

http_response stats_json(const server_context& ctx) { return {200, "application/json", dump(stats_object(ctx))}; }

http_response metrics_text(const server_context& ctx) {
    const json s = stats_object(ctx);
    std::string out;
    const auto metric = [&](const char* name, const char* type, const char* help, double v) {
        char line[64];
        std::snprintf(line, sizeof line, "%.17g", v);
        out += std::string("# HELP ds4_") + name + " " + help + "\n# TYPE ds4_" + name + " " + type + "\nds4_" + name + " " + line + "\n";
    };
    metric("sequences_running", "gauge", "Sequences in the running batch.", s["sequences"]["running"].get<double>());
    metric("sequences_prefilling", "gauge", "Running sequences still prefilling their prompt.", s["sequences"]["prefilling"].get<double>());
    metric("backend_sequences", "gauge", "Sequences the backend holds.", s["sequences"]["backend"].get<double>());
    metric("queue_waiting", "gauge", "Requests waiting for admission.", s["queue"]["waiting"].get<double>());
    metric("kv_used_bytes", "gauge", "KV page bytes held by sequences.", s["memory"]["kv_used"].get<double>());
    metric("kv_pages_used", "gauge", "KV pages held by sequences.", s["memory"]["kv_pages_used"].get<double>());
    metric("memory_charged_bytes", "gauge", "KV bytes charged to running admissions (prompt + decode budget).", s["memory"]["charged"].get<double>());
    metric("memory_total_bytes", "gauge", "Weights, KV pages, sequence state and scratch the backend holds.", s["memory"]["total"].get<double>());
    metric("memory_sequence_state_bytes", "gauge", "Per-sequence state outside KV pages.", s["memory"]["sequence_state"].get<double>());
    metric("memory_scratch_bytes", "gauge", "Workspaces, staging and graphs.", s["memory"]["scratch"].get<double>());
    metric("device_free_bytes", "gauge", "Free device memory (read from the device).", s["memory"]["device_free"].get<double>());
    metric("memory_floor_bytes", "gauge", "Free device memory admissions never take.", s["memory"]["floor"].get<double>());
    metric("memory_refusals_total", "counter", "Admissions refused for memory.", s["memory"]["refusals"].get<double>());
    metric("weights_bytes", "gauge", "Resident weight bytes.", s["memory"]["weights"].get<double>());
    metric("prefix_cache_entries", "gauge", "Idle prefix sequences kept for reuse.", s["prefix_cache"]["entries"].get<double>());
    metric("prefix_cache_hits_total", "counter", "Admissions that forked a cached prefix.", s["prefix_cache"]["hits"].get<double>());
    metric("prefix_cache_tokens_total", "counter", "Prompt tokens not prefilled thanks to the cache.", s["prefix_cache"]["cached_tokens"].get<double>());
    metric("prefix_cache_hit_rate", "gauge", "Cache hits over admissions looked up.", s["prefix_cache"]["hit_rate"].get<double>());
    metric("prefix_cache_idle_bytes", "gauge", "KV bytes held by idle cached prefixes.", s["prefix_cache"]["idle_bytes"].get<double>());
    metric("disk_kv_bytes", "gauge", "Bytes of prefix snapshots in --kv-dir.", s["disk_kv"]["bytes"].get<double>());
    metric("disk_kv_files", "gauge", "Prefix snapshots in --kv-dir.", s["disk_kv"]["files"].get<double>());
    metric("disk_kv_hits_total", "counter", "Prefixes restored from disk instead of prefilled.", s["disk_kv"]["hits"].get<double>());
    metric("disk_kv_saves_total", "counter", "Prefix snapshots written to disk.", s["disk_kv"]["saves"].get<double>());
    metric("disk_kv_save_errors_total", "counter", "Prefix snapshots not written (full disk, over budget).", s["disk_kv"]["save_errors"].get<double>());
    metric("disk_kv_pending", "gauge", "Disk KV saves queued or being written by the writer thread.", s["disk_kv"]["pending"].get<double>());
    metric("disk_kv_dropped_total", "counter", "Disk KV saves dropped because the write queue was full.", s["disk_kv"]["dropped"].get<double>());
    metric("disk_kv_evictions_total", "counter", "Prefix snapshots evicted for the disk budget.", s["disk_kv"]["evictions"].get<double>());
    metric("disk_kv_rejected_files_total", "counter", "Disk KV files ignored (corrupt, truncated, foreign, other version).",
           s["disk_kv"]["rejected_files"].get<double>());
    metric("steps_total", "counter", "Engine steps run.", s["steps"]["count"].get<double>());
    metric("prefill_tokens_total", "counter", "Prompt tokens prefilled.", s["steps"]["prefill_tokens"].get<double>());
    metric("decode_tokens_total", "counter", "Tokens decoded.", s["steps"]["decode_tokens"].get<double>());
    metric("spec_drafted_tokens_total", "counter", "Drafted tokens verified by speculative decoding.", s["speculative"]["drafted"].get<double>());
    metric("spec_accepted_tokens_total", "counter", "Drafted tokens equal to the token the model sampled before them.",
           s["speculative"]["accepted"].get<double>());
    metric("step_backend_seconds_total", "counter", "Engine-thread time inside the backend's steps.", s["steps"]["backend_s"].get<double>());
    metric("step_host_seconds_total", "counter", "Engine-thread time of the steps outside the backend (building, outputs, snapshots).",
           s["steps"]["host_s"].get<double>());
    metric("prefill_tokens_per_second", "gauge", "Recent prefill throughput.", s["speeds"]["prefill_tokens_per_s"].get<double>());
    metric("decode_tokens_per_second", "gauge", "Recent decode throughput.", s["speeds"]["decode_tokens_per_s"].get<double>());
    metric("requests_finished_total", "counter", "Generations that finished.", s["requests"]["finished"].get<double>());
    metric("requests_cancelled_total", "counter", "Generations cancelled (client gone).", s["requests"]["cancelled"].get<double>());
    metric("requests_failed_total", "counter", "Generations that ended in an error.", s["requests"]["failed"].get<double>());
    metric("heartbeat_age_seconds", "gauge", "Time since the engine loop last made progress.", s["heartbeat_age_ms"].get<double>() / 1e3);
    if (s.contains("http")) {
        metric("http_connections_open", "gauge", "Open client connections.", s["http"]["connections_open"].get<double>());
        metric("http_requests_total", "counter", "HTTP requests read.", s["http"]["requests_total"].get<double>());
        metric("http_errors_total", "counter", "Responses with an error status.", s["http"]["errors_total"].get<double>());
        metric("http_client_disconnects_total", "counter", "Clients gone before their generation ended.",
               s["http"]["client_disconnects"].get<double>());
    }
    return {200, "text/plain; version=0.0.4; charset=utf-8", out};
}

void add_routes(router& r, server_context& ctx) {
    const auto gen = [&ctx](route_result (*fn)(server_context&, const http_request&)) {
        return [&ctx, fn](const http_request& req) { return fn(ctx, req); };
    };
    r.add("POST", "/v1/chat/completions", gen(openai_chat), error_shape::openai);
    r.add("POST", "/v1/completions", gen(openai_completions), error_shape::openai);
    r.add("POST", "/v1/responses", gen(openai_responses), error_shape::openai);
    r.add("POST", "/v1/messages", gen(anthropic_messages), error_shape::anthropic);
    r.add("POST", "/v1/messages/count_tokens", gen(anthropic_count_tokens), error_shape::anthropic);
    r.add("POST", "/tokenize", gen(tokenize), error_shape::openai);
    r.add("POST", "/detokenize", gen(detokenize), error_shape::openai);
    r.add("GET", "/v1/models", [&ctx](const http_request&) -> route_result { return models_list(ctx); }, error_shape::openai);
    r.add("GET", "/health", [&ctx](const http_request&) -> route_result { return health(ctx); }, error_shape::openai, true);
    r.add("GET", "/metrics", [&ctx](const http_request&) -> route_result { return metrics_text(ctx); }, error_shape::openai);
    r.add("GET", "/v1/stats", [&ctx](const http_request&) -> route_result { return stats_json(ctx); }, error_shape::openai);
}

}  // namespace ds4::server
