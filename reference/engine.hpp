#pragma once
// The batched engine interface (spec decision 7) and its CPU backend.
//
// One forward call takes a flat list of rows, each {sequence, position, token, wants_logits}:
// prefill chunks, decode rows and speculative verify rows of several sequences mix freely. A
// sequence owns its KV state (raw window, compressed rows, indexer keys in the native paged
// formats of ds4/model/kv_layout.hpp, and the compressors' F32 frontiers); rows of one sequence
// are applied in position order and must continue its current length exactly.
//
// Batch invariance (decision 3): a sequence's logits depend only on its own tokens. The CPU
// backend runs every row through the same per-token code (model.md §2, §9), so a prefill of N
// tokens in one call, N single-token calls, and any mix with other sequences give the same bits,
// and the reference ops split work by constants, never by the thread count.
//
// A CUDA backend implements the same `backend` interface; nothing here names a CPU type.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "ds4/gguf/reader.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::ref {

using sequence_id = std::int32_t;

struct forward_row {
    sequence_id seq = -1;
    std::int32_t pos = 0;
    std::int32_t token = 0;
    bool wants_logits = false;
};

struct forward_options {
    // Also return the final HC state (n_hc * n_embd floats) of every row that wants logits: the
    // MTP head's input (model.md §4).
    bool want_hc_state = false;
};

struct forward_result {
    int n_vocab = 0;
    int hc_dim = 0;
    std::vector<std::size_t> rows;  // index into the call's rows of each logits row, ascending
    std::vector<float> logits;      // rows.size() x n_vocab
    std::vector<float> hc_state;    // rows.size() x hc_dim when asked for

    const float* logits_of(std::size_t i) const { return logits.data() + i * std::size_t(n_vocab); }
    const float* hc_state_of(std::size_t i) const { return hc_state.data() + i * std::size_t(hc_dim); }
};

class backend {
public:
    virtual ~backend() = default;

    virtual const model::model_dims& dims() const = 0;

    virtual sequence_id create_sequence() = 0;
    // A new sequence at the same position sharing the source's KV pages (prefix sharing); either
    // one copies a page before it first writes into it.
    virtual sequence_id fork_sequence(sequence_id source) = 0;
    virtual void free_sequence(sequence_id seq) = 0;
    virtual std::int32_t sequence_length(sequence_id seq) const = 0;

    // Validates every row before changing any state: unknown sequences, token ids out of range,
    // and positions that do not continue each sequence contiguously are a ds4::error naming the
    // sequence and the positions.
    virtual forward_result forward(std::span<const forward_row> rows, const forward_options& options = {}) = 0;

    // The sequence's whole state at its current length as a self-describing byte blob (header,
    // format version, shape, payload checksum): speculative rollback and disk persistence.
    virtual std::vector<std::byte> snapshot(sequence_id seq) const = 0;
    // Replaces the sequence's state by a snapshot's. A blob that is truncated, corrupted, of another
    // version or of another shape is a ds4::error, and the sequence is left unchanged.
    virtual void restore(sequence_id seq, std::span<const std::byte> blob) = 0;
};

// The CPU reference backend: weights used in place from the GGUF mapping, every tensor bound by
// its inventory name after validation against the shape the file declares.
class cpu_engine final : public backend {
public:
    // Opens and validates the file; the error is the validator's report on a bad file.
    static std::unique_ptr<cpu_engine> load(const std::filesystem::path& path);
    explicit cpu_engine(gguf::file file);
    ~cpu_engine() override;

    const gguf::file& file() const;

    const model::model_dims& dims() const override;
    sequence_id create_sequence() override;
    sequence_id fork_sequence(sequence_id source) override;
    void free_sequence(sequence_id seq) override;
    std::int32_t sequence_length(sequence_id seq) const override;
    forward_result forward(std::span<const forward_row> rows, const forward_options& options = {}) override;
    std::vector<std::byte> snapshot(sequence_id seq) const override;
    void restore(sequence_id seq, std::span<const std::byte> blob) override;

    // Pages in use across all sequences (attention rows, indexer rows): for tests and stats.
    std::size_t attention_pages_in_use() const;
    std::size_t indexer_pages_in_use() const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ds4::ref
