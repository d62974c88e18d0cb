#pragma once
// The backend contract every engine implements (the CPU reference backend, the CUDA backend) and
// the only engine surface a server sees. Nothing here names a backend type, a device type or a
// host container the backend must keep.
//
// Errors: every call validates all of its arguments before it changes any state, and reports a
// bad argument as a ds4::error naming the sequence, row, position or byte at fault; after such an
// error every sequence is exactly as it was. A failure while a submitted step runs (a device
// fault) is reported by wait().
//
// Threads: one thread drives a backend (the server's engine thread); the calls are not re-entrant.
// memory() may be called from any thread.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ds4/engine/step.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::engine {

struct capabilities {
    std::string name;                   // "cpu", "cuda:0 (NVIDIA H200)", ...
    std::int32_t max_rows_per_step = 0;  // rows one submit may carry
    std::int32_t max_in_flight = 1;      // submitted steps not yet waited for
    std::int32_t page_rows = 0;          // KV rows per page
    // truncate() may move a sequence back this many positions from its length; rollback
    // further back needs a snapshot (restore) or a re-prefill.
    std::int32_t max_rollback = 0;
    std::int32_t max_draft = 0;          // MTP drafts per draft() call; 0 = no drafter loaded
    bool exact = false;                  // logits are bit-equal to the CPU reference's
    bool logit_adjust = false;           // applies sampler::adjust (logit_bias, penalties)
    // Rows of one sequence's prompt per step at which prefill reaches its full rate (a GPU's
    // chunked GEMMs); 0: no preference (the rate does not grow with the rows of a step).
    std::int32_t prefill_rows = 0;
};

// Every byte the backend holds, for a governor that decides before it admits work. Device
// figures come from the device (or the host's physical memory for a CPU backend), never from RSS.
struct memory_ledger {
    std::uint64_t weights = 0;         // resident weight bytes (one copy)
    std::uint64_t kv_used = 0;         // KV pages held by sequences; a page shared by forks counts once
    std::uint64_t kv_capacity = 0;     // the most the KV pools may hold; 0 = bounded only by memory
    std::uint64_t sequence_state = 0;  // per-sequence state outside pages (compressor frontiers, HC, MTP)
    std::uint64_t scratch = 0;         // workspaces, staging, captured graphs
    std::uint64_t device_total = 0;
    std::uint64_t device_free = 0;
    std::int64_t kv_pages_used = 0;
    std::int32_t sequences = 0;
};

// A submitted step; wait() turns it into its result, once.
struct step_ticket {
    std::uint64_t id = 0;
};

class backend {
public:
    virtual ~backend() = default;

    virtual const model::model_dims& dims() const = 0;
    virtual capabilities caps() const = 0;
    virtual memory_ledger memory() const = 0;
    // The bytes of KV pages and per-sequence state one sequence of `length` tokens holds: what a
    // governor charges an admission (prompt plus decode budget) before it runs.
    virtual std::uint64_t sequence_bytes(std::int32_t length) const = 0;

    // Sequences. A new sequence has length 0. fork() returns a sequence at the source's length
    // that shares its pages; whichever writes a shared page first copies it (copy on write).
    virtual sequence_id create() = 0;
    virtual sequence_id fork(sequence_id source) = 0;
    virtual void free(sequence_id seq) = 0;
    virtual std::int32_t length(sequence_id seq) const = 0;
    // Rolls the sequence back to `length` (length(seq) - caps().max_rollback <= length <=
    // length(seq), and not before the position of its last restore): the state afterwards is
    // bit-identical to the state the sequence had when it first reached `length`, compressor
    // frontiers included, so its snapshot bytes equal a snapshot taken then.
    virtual void truncate(sequence_id seq, std::int32_t length) = 0;

    // The sequence's whole state as a self-describing blob (magic, version, shape, checksum),
    // in one format every backend writes and reads: a snapshot taken on one backend restores on
    // another of the same model. A truncated, corrupted, foreign or other-version blob is a
    // ds4::error and the sequence is left unchanged.
    virtual std::vector<std::byte> snapshot(sequence_id seq) const = 0;
    virtual void restore(sequence_id seq, std::span<const std::byte> blob) = 0;

    // Validates the whole step, applies it to the sequences' lengths, and enqueues it; a
    // synchronous backend runs it here. The next step may be submitted (up to max_in_flight)
    // before this one is waited for; its rows are validated against the lengths after this one.
    virtual step_ticket submit(const step_request& step) = 0;
    virtual step_result wait(step_ticket ticket) = 0;

    // Up to n (<= caps().max_draft) greedy MTP drafts for `seq` from the final HC state the last
    // step kept for its last output row (keep_hc_state) and that row's token and position
    // (docs/model.md §4). Without a kept state, or without a drafter, a ds4::error.
    virtual std::vector<std::int32_t> draft(sequence_id seq, std::int32_t n) = 0;

    // Opt-in per-op profiling, a measuring aid (never needed to serve). set_profiling(true) starts
    // a fresh record and returns whether this backend can profile (the default: no); while on, a
    // backend may synchronise after each step. profile_report() is the record so far as CSV text
    // (a header line, then one line per op family: calls, launches and time per step, the weight
    // bytes it streams and their floor at the device's bandwidth), "" when nothing was recorded.
    virtual bool set_profiling(bool) { return false; }
    virtual std::string profile_report() const { return ""; }

    // Convenience for synchronous callers: submit, then wait.
    step_result run(const step_request& step) { return wait(submit(step)); }
};

}  // namespace ds4::engine
