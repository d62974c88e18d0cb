#pragma once
// What one engine step takes and gives back (docs/engine.md).
//
// A step is a flat list of rows {sequence, position, token, output}: prefill chunks, decode rows
// and speculative verify rows of many sequences mix in one step. Rows of one sequence are applied
// in position order and must continue the sequence's current length without gaps. A row that
// wants output is sampled on the backend with its own sampler; the step returns token ids (and
// optional top-k log-probabilities), and full logits only for rows that ask for them (a verifier,
// a test), so a GPU backend copies back a few bytes per row instead of the vocabulary.
//
// Sampling is deterministic: the draw of a row is a function of (seed, position) only, so the
// same row sampled alone, in a batch of 256, or replayed from a snapshot gives the same token.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ds4::engine {

using sequence_id = std::int32_t;

enum class output : std::uint8_t {
    none,    // the row only extends the KV state (prefill rows before the last)
    sample,  // the row is sampled: token id, its log-probability, optional top alternatives
    logits,  // sampled too, and the full logits row is returned
};

struct row {
    sequence_id seq = -1;
    std::int32_t pos = 0;
    std::int32_t token = 0;
    output out = output::none;
};

// An additive change to one token's logit before its row is sampled: OpenAI's logit_bias, and
// the frequency and presence penalties, which the caller turns into deltas from its own counts
// of the tokens generated so far.
struct logit_adjust {
    std::int32_t token = 0;
    float delta = 0.0f;
};

// One row's sampler. temperature <= 0 is greedy (the first maximum); top_k <= 0, top_p >= 1 and
// min_p <= 0 switch those filters off. n_logprobs alternatives (0 = none) are returned beside the
// sampled token's own log-probability.
struct sampler {
    float temperature = 0.0f;
    float top_p = 1.0f;
    float min_p = 0.0f;
    std::int32_t top_k = 0;
    std::uint64_t seed = 0;
    std::int32_t n_logprobs = 0;
    // Added to the row's logits (logit + delta, one float add each) before anything else reads
    // them: the draw, the log-probabilities and a returned logits row all see the adjusted
    // logits. Each token at most once, finite deltas; read during submit() only. A backend
    // without capabilities::logit_adjust refuses a non-empty list.
    std::span<const logit_adjust> adjust{};
};

// A row's logits with its sampler's adjustments added, in place (the CPU backend's and the host
// side of every backend's definition; a device applies the same single add per token).
inline void apply_adjust(const sampler& s, float* logits) {
    for (const logit_adjust& a : s.adjust) logits[a.token] = logits[a.token] + a.delta;
}

// The largest n_logprobs a backend must serve (the OpenAI API's limit).
inline constexpr std::int32_t max_logprobs = 20;

struct step_request {
    std::span<const row> rows;
    // One sampler per row with out != none, in row order.
    std::span<const sampler> samplers;
    // Feed every row's final hyper-connection state to the MTP drafter on the backend (its own
    // window advances over the rows; the last row of each sequence seeds backend::draft). The
    // state never travels to the host. A step without it leaves a gap that restarts the
    // drafter's window at the next step that keeps it.
    bool keep_hc_state = false;
};

struct token_logprob {
    std::int32_t token = 0;
    float logprob = 0.0f;
};

struct sampled {
    std::size_t row = 0;        // index of the row in the step
    std::int32_t token = 0;     // the sampled token
    float logprob = 0.0f;       // log-probability of `token` under the logits (adjusted: sampler::adjust)
    std::vector<token_logprob> top;  // n_logprobs largest, by logit descending, ties by lower id
};

struct step_result {
    std::vector<sampled> outputs;  // one per row with out != none, in row order
    std::int32_t n_vocab = 0;
    // Rows with out == logits, in row order: logits_rows[i] is the row index of
    // logits[i * n_vocab .. (i + 1) * n_vocab).
    std::vector<std::size_t> logits_rows;
    std::vector<float> logits;

    std::span<const float> logits_of(std::size_t i) const {
        return {logits.data() + i * std::size_t(n_vocab), std::size_t(n_vocab)};
    }
};

}  // namespace ds4::engine
