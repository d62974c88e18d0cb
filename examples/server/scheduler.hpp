#pragma once
// The engine thread: the only thread that touches the backend. Every step it
//   1. takes new jobs, drops cancelled and timed-out ones (their sequences freed now),
//   2. admits waiting jobs while fewer than max_seqs run and their memory fits,
//   3. builds one step under the token budget, fairness policy:
//        decode rows first, one per decoding sequence, always (a long prompt never delays a token
//        of a running stream by more than one step);
//        then prefill chunks in admission order, each at most prefill_chunk tokens, while the step
//        has fewer than step_tokens rows; at least one chunk per step when a prompt is waiting,
//        so prefill still advances under a full decode batch,
//   4. runs it, hands each sampled token to its job's output processor and channel, and retires
//      finished sequences.
// Prefix cache: when a prompt is fully prefilled its sequence is forked (pages shared, copy on
// write) and kept idle under the prompt's tokens, and a turn that ends normally keeps its own
// sequence under prompt + answer; a later prompt that starts with those tokens
// (the next turn of a conversation, the same system prompt) forks it instead of prefilling them,
// rolled back (truncate) where it diverges within the backend's rollback reach (found through a
// radix tree over token ids, prefix_index.hpp). Idle entries are
// evicted least recently used, beyond --prefix-cache entries or when memory is short.
// The loop's heartbeat is stamped every iteration (and every 50 ms while idle); /health fails
// when it is older than the stall limit.
// Speculative decoding (--spec-tokens, drafts from the backend's MTP drafter or from prompt
// lookup). MTP: every step keeps the rows' HC state for the drafter; a decoding sequence whose
// last row the backend kept asks it for drafts, and when the first draft is the token it already
// sampled (docs/model.md §4: the drafter re-predicts it) the rest ride the next step as verify
// rows after its decode row. Prompt lookup (--draft ngram, ngram_drafter.hpp): the drafts are the
// tokens that followed an earlier occurrence of the sequence's last tokens in its prompt and
// answer; no model, so any backend with rollback takes them. Row i's
// sampled token is accepted while every draft before it matched the token sampled at the row
// before; the rows after the first mismatch are rolled back (truncate). Sampling is a function of
// (logits, seed, position), so where a row's logits do not depend on the rows beside it (an exact
// backend: the CPU one, CUDA with --exact) the answer is bit-identical to decoding without
// drafts, greedy or sampled; drafts only change how many tokens one step yields. Draft rows take
// what is left of the step after the decode rows and one prefill chunk.
// One step in flight, even where the backend allows two (caps().max_in_flight): every decode row
// feeds the token the previous step sampled, so a step built before that one is waited for could
// carry only prefill rows, and the decoding streams would then wait a whole extra step per token
// (against the fairness policy above) to hide only the engine thread's own time between steps,
// which /v1/stats reports (steps.host_s beside steps.backend_s; 0.9% on the CPU backend). Hiding
// it for decode rows needs rows whose token the backend takes from the step in flight.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ds4/engine/backend.hpp"
#include "examples/server/disk_kv.hpp"
#include "examples/server/job.hpp"
#include "examples/server/prefix_index.hpp"
#include "text/tokenizer.hpp"

namespace ds4::server {

enum class draft_source { automatic, mtp, ngram, off };

// "auto", "mtp", "ngram", "off" (the --draft flag's words); throws naming the value otherwise.
draft_source parse_draft_source(const std::string& word);
const char* draft_source_name(draft_source d);

struct scheduler_options {
    int max_seqs = 64;        // sequences running at once; the rest wait in the queue
    int step_tokens = 256;    // rows per step (decode + prefill)
    int prefill_chunk = 64;   // prompt tokens of one sequence per step
    // The bytes of KV state admissions may be charged (prompt plus decode budget, from
    // backend::sequence_bytes); 0 = the backend's KV capacity, or free memory less a floor.
    std::uint64_t kv_budget = 0;
    // Free device memory (memory().device_free) admissions never take; -1 = 4 GiB on a device
    // backend, 0 on the CPU backend.
    std::int64_t mem_floor = -1;
    int prefix_cache = 16;      // idle prefix sequences kept; 0 = no prefix cache
    int prefix_cache_min = 8;   // shortest prompt worth caching / reusing
    int debug_step_delay_ms = 0;  // test hook: sleep this long inside every step
    // Test hook: every generation's tokens are this text's tokens then EOS, in place of the
    // sampled ones (fed back like them), so a random model can answer with DSML over HTTP.
    std::string debug_forced_output;
    // Disk KV (disk_kv.hpp): prefixes saved here as they are cached and restored after a
    // restart; empty = off. kv_disk_budget 0 = no limit. model_id: model_identity() of the GGUF.
    std::string kv_dir;
    std::uint64_t kv_disk_budget = 0;
    std::uint64_t model_id = 0;
    int kv_disk_queue = 4;          // saves waiting for the disk writer; more are dropped (counted)
    int kv_disk_drain_ms = 10000;   // how long stop() lets queued saves finish; the rest are abandoned
    int debug_disk_write_delay_ms = 0;  // test hook: the disk writer waits this long before each write
    int debug_snapshot_delay_ms = 0;    // test hook: a disk KV snapshot takes this much longer (a slow device copy)
    // Drafted tokens a decoding sequence verifies per step (speculative decoding, above); -1: 2
    // when the backend has a drafter (caps().max_draft > 0), else 0; 0: off.
    int spec_tokens = -1;
    // Where drafts come from: automatic (the backend's MTP drafter where it has one, else none),
    // mtp, ngram (prompt lookup: matches of ngram_min to ngram_max tokens), or off.
    draft_source draft = draft_source::automatic;
    int ngram_min = 2, ngram_max = 4;
};

struct scheduler_stats {
    draft_source draft = draft_source::off;  // the drafts' source in use
    int running = 0, prefilling = 0, decoding = 0, waiting = 0;
    std::uint64_t steps = 0, prefill_tokens = 0, decode_tokens = 0;
    std::uint64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
    int max_step_rows = 0;          // the most rows one step carried
    int max_step_prefill_rows = 0;  // the most prefill rows one step carried
    int max_decode_gap_steps = 0;   // the most steps between two tokens of one decoding sequence
    double prefill_tokens_per_s = 0, decode_tokens_per_s = 0;  // over the last few seconds of steps
    // Engine-thread time of the steps run: inside the backend's submit + wait, and the rest
    // (admission, building rows, outputs, snapshots for disk KV). The rest is what overlapping
    // two steps in flight could hide, at most.
    double backend_s = 0, host_s = 0;
    double heartbeat_age_ms = 0;
    bool draining = false;
    std::uint64_t charged_bytes = 0;
    int cache_entries = 0;
    std::uint64_t cache_hits = 0, cached_tokens = 0, cache_lookups = 0;
    std::uint64_t cache_bytes = 0;  // the idle prefixes' sequence_bytes
    bool disk_enabled = false;
    disk_kv_stats disk;
    std::uint64_t disk_tokens = 0;  // prompt tokens restored from disk instead of prefilled
    std::uint64_t refusals = 0;     // admissions refused for memory
    std::uint64_t mem_floor = 0;    // free device memory never given to admissions
    int spec_tokens = 0;              // drafts verified per sequence and step (0: no speculation)
    std::uint64_t spec_drafted = 0;   // draft tokens sent as verify rows
    std::uint64_t spec_accepted = 0;  // of those, the ones equal to the token sampled at the row before
};

class scheduler {
public:
    scheduler(engine::backend& backend, const ref::tokenizer& tok, scheduler_options options);
    ~scheduler();
    scheduler(const scheduler&) = delete;
    scheduler& operator=(const scheduler&) = delete;

    // Queues a job; throws api_exception while draining. A job that can never fit in memory ends
    // with an insufficient_memory error event.
    void submit(std::shared_ptr<job> j);
    // No new jobs; running and queued ones go on.
    void begin_drain();
    bool empty() const;
    // Ends the loop: what is still running or queued ends with a shutting_down error; then the
    // disk KV writer finishes its queue within kv_disk_drain_ms.
    void stop();

    scheduler_stats stats() const;
    double heartbeat_age_ms() const;
    const scheduler_options& options() const { return options_; }
    // The backend's capabilities, read once (backend calls belong to the engine thread).
    const engine::capabilities& caps() const { return caps_; }

private:
    struct active;
    void loop();
    bool step_once();
    // The final event carries the last token's deltas (ev) before what the processor flushes.
    void finish(active& a, finish_reason reason, std::optional<api_error> error = {}, gen_event ev = {});
    void admit();
    void take_new();
    struct cached_prefix {
        engine::sequence_id seq;
        std::vector<std::int32_t> tokens;
        std::uint64_t last_used;
        std::uint64_t bytes;  // sequence_bytes of the tokens: what the governor counts it as
    };
    // A sequence for the job: a fork of the longest usable cached prefix, or a new one; sets the
    // prompt tokens it already holds.
    engine::sequence_id start_sequence(const job& j, int& reused);
    void cache_prompt(const active& a);
    // Saves the sequence's state under `tokens` (its first tokens) to disk KV, when on.
    void save_to_disk(engine::sequence_id seq, std::span<const std::int32_t> tokens);
    // Keeps a finished turn's sequence as an idle prefix; false when it is not kept (then freed).
    bool keep_turn(const active& a);
    bool evict_one();
    cached_prefix& entry(engine::sequence_id seq);
    // Rolls a sequence back to the tokens it has accepted (prompt + generated - 1) after verify
    // rows; true when it had rows to drop.
    bool settle(active& a);
    // The admission ceiling: the KV budget, the backend's capacity, or 0 when only free memory bounds it.
    std::uint64_t ceiling(const engine::memory_ledger& m) const;

    engine::backend& backend_;
    const ref::tokenizer& tok_;
    const scheduler_options options_;
    const engine::capabilities caps_;
    const draft_source draft_;  // options_.draft resolved against the backend (mtp, ngram or off)
    const int spec_;            // options_.spec_tokens resolved against the backend and the source

    mutable std::mutex mutex_;  // guards incoming_, the counters in stats_, stop_, draining_
    std::condition_variable wake_;
    std::deque<std::shared_ptr<job>> incoming_;
    bool stop_ = false;
    bool draining_ = false;
    scheduler_stats stats_;
    std::atomic<std::int64_t> heartbeat_ns_{0};
    std::atomic<int> pending_{0};  // jobs submitted and not yet finished

    // Engine thread only.
    std::deque<std::shared_ptr<job>> waiting_;
    std::vector<std::unique_ptr<active>> running_;
    std::uint64_t charged_ = 0;
    std::uint64_t step_index_ = 0;
    std::vector<cached_prefix> cache_;
    prefix_index<engine::sequence_id> index_;  // cache_'s tokens, radix tree
    std::uint64_t cache_hits_ = 0, cached_tokens_ = 0, cache_bytes_ = 0, cache_lookups_ = 0, disk_tokens_ = 0;
    std::unique_ptr<disk_kv> disk_;
    std::uint64_t floor_ = 0, refusals_ = 0;
    std::vector<std::int32_t> forced_;  // debug_forced_output's tokens and EOS
    double rate_window_s_ = 0, rate_prefill_ = 0, rate_decode_ = 0;
    std::uint64_t spec_drafted_ = 0, spec_accepted_ = 0;

    std::thread thread_;
};

}  // namespace ds4::server
