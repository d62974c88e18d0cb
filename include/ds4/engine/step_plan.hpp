#pragma once
// The validation every backend runs on a step before it changes anything (backend.hpp: errors
// change nothing), and the plan it leaves: the rows grouped by sequence in first-appearance
// order, each group in position order, and the sampler of each output row.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/engine/step.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::engine {

inline std::string sequence_name(sequence_id s) { return "sequence " + std::to_string(s); }

// Sampler fields a request can get wrong. n_vocab > 0: the adjustments are checked against it
// (in range, each token once, finite); 0: a backend that takes none refuses any.
inline void check_sampler(const sampler& s, std::size_t row, std::int32_t n_vocab, bool takes_adjust) {
    const std::string at = "step: sampler of row " + std::to_string(row);
    require(std::isfinite(s.temperature) && s.temperature >= 0.0f, at + ": temperature must be finite and >= 0");
    require(std::isfinite(s.top_p) && s.top_p > 0.0f && s.top_p <= 1.0f, at + ": top_p must be in (0, 1]");
    require(std::isfinite(s.min_p) && s.min_p >= 0.0f && s.min_p <= 1.0f, at + ": min_p must be in [0, 1]");
    require(s.top_k >= 0, at + ": top_k must be >= 0");
    require(s.n_logprobs >= 0 && s.n_logprobs <= max_logprobs,
            at + ": n_logprobs must be in [0, " + std::to_string(max_logprobs) + "]");
    if (s.adjust.empty()) return;
    require(takes_adjust, at + ": this backend does not apply logit adjustments (logit_bias, penalties)");
    std::vector<std::int32_t> seen;
    seen.reserve(s.adjust.size());
    for (const logit_adjust& a : s.adjust) {
        require(a.token >= 0 && a.token < n_vocab, at + ": adjusted token " + std::to_string(a.token) +
                                                       " is outside the vocabulary of " + std::to_string(n_vocab));
        require(std::isfinite(a.delta), at + ": the delta of token " + std::to_string(a.token) + " is not finite");
        seen.push_back(a.token);
    }
    std::sort(seen.begin(), seen.end());
    const auto dup = std::adjacent_find(seen.begin(), seen.end());
    require(dup == seen.end(), at + ": token " + (dup == seen.end() ? std::string() : std::to_string(*dup)) +
                                   " is adjusted more than once");
}

struct step_plan {
    std::vector<sequence_id> order;                          // sequences, first-appearance order
    std::map<sequence_id, std::vector<std::size_t>> rows;     // step rows of each, by position
    std::vector<std::size_t> sampler_of;                     // row -> sampler index (SIZE_MAX: none)
};

// `length_of(seq)` returns the sequence's length, or throws naming it when it does not exist.
inline step_plan plan_step(const step_request& step, const model::model_dims& d, std::int32_t max_rows,
                           const std::function<std::int32_t(sequence_id, const std::string&)>& length_of,
                           bool takes_adjust = false) {
    step_plan p;
    require(step.rows.size() <= std::size_t(max_rows), "step: " + std::to_string(step.rows.size()) +
                                                           " rows, more than the " + std::to_string(max_rows) +
                                                           " one step may carry");
    p.sampler_of.assign(step.rows.size(), SIZE_MAX);
    std::size_t n_out = 0;
    for (std::size_t i = 0; i < step.rows.size(); ++i) {
        const row& r = step.rows[i];
        const std::string at = "step: row " + std::to_string(i) + " of " + sequence_name(r.seq);
        length_of(r.seq, "step: row " + std::to_string(i));
        require(r.token >= 0 && r.token < d.n_vocab,
                at + ": token " + std::to_string(r.token) + " is outside the vocabulary of " + std::to_string(d.n_vocab));
        require(r.out == output::none || r.out == output::sample || r.out == output::logits, at + ": unknown output kind");
        if (r.out != output::none) p.sampler_of[i] = n_out++;
        auto& v = p.rows[r.seq];
        if (v.empty()) p.order.push_back(r.seq);
        v.push_back(i);
    }
    require(step.samplers.size() == n_out, "step: " + std::to_string(n_out) + " rows want output but " +
                                               std::to_string(step.samplers.size()) + " samplers were given");
    for (std::size_t i = 0; i < step.rows.size(); ++i)
        if (p.sampler_of[i] != SIZE_MAX) check_sampler(step.samplers[p.sampler_of[i]], i, d.n_vocab, takes_adjust);
    for (auto& [seq, idx] : p.rows) {
        std::stable_sort(idx.begin(), idx.end(),
                         [&](std::size_t a, std::size_t b) { return step.rows[a].pos < step.rows[b].pos; });
        const std::int32_t len = length_of(seq, "step");
        for (std::size_t k = 0; k < idx.size(); ++k) {
            if (step.rows[idx[k]].pos == len + std::int32_t(k)) continue;
            std::string got;
            for (std::size_t j = 0; j < idx.size() && j < 16; ++j)
                got += (j ? ", " : "") + std::to_string(step.rows[idx[j]].pos);
            if (idx.size() > 16) got += ", ...";
            fail("step: " + sequence_name(seq) + " has length " + std::to_string(len) +
                 "; its rows in this step have positions " + got + ", which must be " + std::to_string(len) + ", " +
                 std::to_string(len + 1) + ", ... without gaps or repeats");
        }
        require(d.context_length == 0 || std::int64_t(len) + std::int64_t(idx.size()) <= d.context_length,
                "step: " + sequence_name(seq) + " would exceed the context length " + std::to_string(d.context_length));
    }
    return p;
}

}  // namespace ds4::engine
