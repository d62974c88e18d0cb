// ds4-server: OpenAI- and Anthropic-compatible serving of DeepSeek-V4-Flash over continuous
// batching. main wires the pieces: flags, the backend, the tokenizer, the scheduler's engine
// thread, the HTTP front; then waits for SIGINT/SIGTERM and drains.
//
// Exit codes: 0 after a clean drain, 1 a model or startup error, 2 bad flags.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <pthread.h>
#include <thread>

#include <CLI/CLI.hpp>

#include "backends/open_backend.hpp"
#include "ds4/core/error.hpp"
#include "examples/server/api/routes.hpp"
#include "examples/server/http/server.hpp"
#include "examples/server/model_tokenizer.hpp"
#include "examples/server/scheduler.hpp"
#include "text/tokenizer.hpp"

namespace {

struct flags {
    std::string model = ".cache/ds4-tiny.gguf";
    std::string mtp;
    std::string draft = "auto";
    std::string backend = "auto";
    std::string model_id = "deepseek-v4-flash";
    std::vector<std::string> aliases;
    std::string api_key;
    int ctx = 0;
    int threads = 0;
    bool exact = false;
    double stall_s = 30;
    double drain_s = 60;
    double kv_disk_drain_s = 10;
    ds4::server::http_options http;
    ds4::server::scheduler_options sched;
    bool step_tokens_set = false, prefill_chunk_set = false;  // given on the command line
};

int serve(const flags& fl, const sigset_t& signals) {
    using namespace ds4::server;
    const draft_source draft = parse_draft_source(fl.draft);  // before the model loads
    if (!std::filesystem::exists(fl.model))
        ds4::fail("model file '" + fl.model + "' does not exist (scripts/run.sh generates the tiny model, or: ds4-synth --preset tiny --seed 1 --out " +
                  fl.model + ")");
    ds4::backends::backend_options bo;
    bo.model = fl.model;
    bo.mtp = fl.mtp;
    bo.kind = ds4::backends::parse_backend_kind(fl.backend);
    bo.threads = fl.threads;
    bo.kv_capacity_bytes = fl.sched.kv_budget;
    bo.exact = fl.exact;
    const std::unique_ptr<ds4::engine::backend> backend = ds4::backends::open_backend(bo);
    const ds4::ref::tokenizer tok = tokenizer_from_gguf(fl.model);
    const int model_ctx = backend->dims().context_length;
    ds4::require(fl.ctx <= model_ctx, "--ctx " + std::to_string(fl.ctx) + " is over the model's context of " + std::to_string(model_ctx));

    scheduler_options so = fl.sched;
    so.draft = draft;
    // A backend whose prefill rate grows with the rows of a step (the CUDA backend's chunks: a
    // 32K prompt at 64 rows a step is many times slower than at 1024) sets the defaults; a
    // longer step delays the other streams' next token by one chunk's time.
    if (const int rows = backend->caps().prefill_rows; rows > 0) {
        if (!fl.prefill_chunk_set) so.prefill_chunk = std::max(so.prefill_chunk, rows);
        if (!fl.step_tokens_set) so.step_tokens = std::max(so.step_tokens, so.prefill_chunk);
    }
    so.kv_disk_drain_ms = int(fl.kv_disk_drain_s * 1e3);
    if (!so.kv_dir.empty()) so.model_id = model_identity(fl.model);
    scheduler sched(*backend, tok, so);
    server_context ctx{*backend, tok, sched, fl.model_id};
    ctx.context_length = fl.ctx > 0 ? fl.ctx : model_ctx;
    ctx.model_aliases = fl.aliases;
    ctx.stall_limit_ms = fl.stall_s * 1e3;
    router routes(fl.api_key);
    add_routes(routes, ctx);
    http_server http(fl.http, routes, sched);
    ctx.counters = &http.counters();
    http.start();
    std::printf("ds4-server: %s (%s) on %s, context %d, up to %d sequences, steps of up to %d rows (%d prompt tokens of one sequence)\n",
                fl.model.c_str(), backend->dims().preset.c_str(), backend->caps().name.c_str(), ctx.context_length, so.max_seqs,
                so.step_tokens, so.prefill_chunk);
    std::printf("ds4-server: listening on http://%s:%u\n", fl.http.host.c_str(), unsigned(http.port()));
    std::fflush(stdout);

    int sig = 0;
    sigwait(&signals, &sig);
    std::printf("ds4-server: %s, draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    std::fflush(stdout);
    // Drain: no new connections or jobs; in-flight generations finish within the drain time,
    // the rest end with a shutting_down error frame; then the sockets close.
    http.stop_accepting();
    sched.begin_drain();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(fl.drain_s);
    while (!sched.empty() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sched.stop();
    const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (http.counters().generations_open > 0 && std::chrono::steady_clock::now() < flush_deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    http.stop();
    std::printf("ds4-server: stopped\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    flags fl;
    CLI::App app{"ds4-server: OpenAI and Anthropic APIs for DeepSeek-V4-Flash over continuous batching"};
    app.add_option("--model", fl.model, "base model GGUF")->capture_default_str();
    app.add_option("--mtp", fl.mtp, "MTP head GGUF: speculative decoding with its drafts (a backend without an MTP drafter says so and ignores it)");
    app.add_option("--spec-tokens", fl.sched.spec_tokens,
                   "drafted tokens a decoding sequence verifies per step; -1 = the source's default (MTP 2, ngram 3), 0 = off")
        ->capture_default_str();
    app.add_option("--draft", fl.draft,
                   "where drafts come from: auto (the MTP drafter when --mtp loads one), mtp, ngram (prompt lookup: the "
                   "tokens that followed an earlier occurrence of the sequence's last tokens; no model, any backend), off")
        ->capture_default_str();
    app.add_option("--ngram-max", fl.sched.ngram_max, "--draft ngram: the longest match looked for")
        ->capture_default_str()->check(CLI::Range(1, 16));
    app.add_option("--ngram-min", fl.sched.ngram_min, "--draft ngram: the shortest match that drafts")
        ->capture_default_str()->check(CLI::Range(1, 16));
    app.add_option("--backend", fl.backend, "auto | cpu | cuda")->capture_default_str();
    app.add_option("--model-id", fl.model_id, "the model name the APIs serve")->capture_default_str();
    app.add_option("--model-alias", fl.aliases, "more model names to answer to (repeatable), e.g. for clients with a fixed model name");
    app.add_option("--host", fl.http.host, "address to bind")->capture_default_str();
    app.add_option("--port", fl.http.port, "port; 0 picks a free one (printed)")->capture_default_str();
    app.add_option("--api-key", fl.api_key, "require this key (Authorization: Bearer or x-api-key); default: none");
    app.add_option("--ctx", fl.ctx, "context per sequence; 0 = the model's")->check(CLI::NonNegativeNumber);
    app.add_option("--max-seqs", fl.sched.max_seqs, "sequences in the running batch")->capture_default_str()->check(CLI::Range(1, 65536));
    CLI::Option* step_tokens = app.add_option("--step-tokens", fl.sched.step_tokens, "rows per engine step (decode + prefill); default 256, or the backend's prefill rows (CUDA: 1024) when larger")
        ->check(CLI::Range(1, 1 << 20));
    CLI::Option* prefill_chunk = app.add_option("--prefill-chunk", fl.sched.prefill_chunk, "prompt tokens of one sequence per step; default 64, or the backend's prefill rows (CUDA: 1024)")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--kv-budget", fl.sched.kv_budget, "bytes of KV state admissions may hold; 0 = the backend's capacity or free memory")
        ->capture_default_str();
    app.add_option("--mem-floor", fl.sched.mem_floor, "bytes of free device memory admissions never take; -1 = 4 GiB on a GPU, 0 on the CPU")
        ->capture_default_str()->check(CLI::Range(std::int64_t(-1), std::numeric_limits<std::int64_t>::max()));
    app.add_option("--kv-dir", fl.sched.kv_dir, "disk KV: cached prefixes saved here and restored after a restart; default: off");
    app.add_option("--kv-disk-budget", fl.sched.kv_disk_budget, "bytes --kv-dir may hold (least recently used evicted); 0 = no limit")
        ->capture_default_str();
    app.add_option("--kv-disk-queue", fl.sched.kv_disk_queue, "disk KV saves that may wait for the writer thread; more are dropped (counted)")
        ->capture_default_str()->check(CLI::Range(1, 4096));
    app.add_option("--kv-disk-drain-s", fl.kv_disk_drain_s, "seconds shutdown lets queued disk KV saves finish; the rest are abandoned")
        ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
    app.add_option("--prefix-cache", fl.sched.prefix_cache, "idle prompt prefixes kept for reuse (forked, copy on write); 0 = off")
        ->capture_default_str()->check(CLI::Range(0, 65536));
    app.add_flag("--exact", fl.exact, "CUDA: exact CUDA-core attention (logits bit-equal to the CPU backend's)");
    app.add_option("--threads", fl.threads, "CPU backend threads; 0 = all cores")->capture_default_str()->check(CLI::NonNegativeNumber);
    app.add_option("--io-threads", fl.http.io_threads, "HTTP I/O threads")->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--max-body", fl.http.max_body, "largest request body in bytes")->capture_default_str();
    app.add_option("--sse-keepalive-ms", fl.http.sse_keepalive_ms, "SSE comment after this long without output")->capture_default_str()->check(CLI::Range(10, 600000));
    app.add_option("--request-timeout", fl.http.request_timeout_s, "seconds a generation may run")->capture_default_str()->check(CLI::Range(1, 86400 * 7));
    app.add_option("--idle-timeout", fl.http.idle_timeout_s, "seconds an idle keep-alive connection stays open")->capture_default_str()->check(CLI::Range(1, 86400));
    app.add_option("--stall-s", fl.stall_s, "/health fails when the engine loop made no progress for this long")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--drain-s", fl.drain_s, "seconds SIGTERM waits for in-flight requests")->capture_default_str()->check(CLI::NonNegativeNumber);
    app.add_option("--debug-step-delay-ms", fl.sched.debug_step_delay_ms, "test hook: sleep in every engine step")->group("");
    app.add_option("--debug-forced-output", fl.sched.debug_forced_output, "test hook: every answer is this text's tokens, then EOS")
        ->group("");
    app.add_option("--debug-disk-write-delay-ms", fl.sched.debug_disk_write_delay_ms, "test hook: the disk KV writer waits before each write")
        ->group("");
    app.add_option("--debug-snapshot-delay-ms", fl.sched.debug_snapshot_delay_ms,
                   "test hook: each disk KV snapshot takes this much longer on the engine thread")
        ->group("");
    try {
        app.parse(argc, argv);
        fl.step_tokens_set = step_tokens->count() > 0;
        fl.prefill_chunk_set = prefill_chunk->count() > 0;
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;  // --help is a ParseError too, with exit code 0
    }

    // A file-size limit (ulimit -f) turns a disk KV write into EFBIG, a failed save, instead of
    // killing the server.
    std::signal(SIGXFSZ, SIG_IGN);
    // Every thread inherits the blocked set; main alone takes the signals, with sigwait.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    try {
        return serve(fl, signals);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4-server: %s\n", e.what());
        return 1;
    }
}
