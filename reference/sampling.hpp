#pragma once
// Token sampling (docs/kernels.md "sampling"): argmax, and temperature / top-k / top-p / min-p with
// the counter-based RNG of ds4/core/rng.hpp, so the GPU sampler draws the same numbers.
#include <cstdint>
#include <vector>

namespace ds4::ref {

// The first index holding the maximum logit (docs/model.md §7.7). NaN logits are never chosen
// unless every logit is NaN (then 0).
int sample_argmax(const float* logits, int n);

struct sampling_params {
    float temperature = 0.0f;  // <= 0: greedy (argmax)
    int top_k = 0;             // <= 0 or >= n: off
    float top_p = 1.0f;        // >= 1: off
    float min_p = 0.0f;        // <= 0: off
    std::uint64_t seed = 0;
};

// The sampler, one fixed order so the GPU can replay it:
//  1. candidates sorted by logit descending, ties by lower index; keep the first top_k;
//  2. z_i = logit_i / temperature; w_i = exp_f32(z_i - z_0) (w_0 = 1, unnormalised);
//  3. top-p: total = sum w_i in candidate order; keep the shortest prefix whose running sum
//     reaches top_p * total;
//  4. min-p: keep the prefix with w_i >= min_p (min_p * w_0);
//  5. u = rng_uniform(seed, step); t = u * (sum of kept w_i in order); pick the first i whose
//     running sum exceeds t (the last kept one if rounding leaves none).
int sample(const float* logits, int n, const sampling_params& p, std::uint64_t step);

struct token_logprob {
    std::int32_t token = 0;
    float logprob = 0.0f;
};

// Log-probabilities of the model's distribution (the raw logits, temperature 1), as the APIs
// report them, in one fixed order a GPU reduction can replay:
//  m = the maximum logit; s = sum of exp_f32(l_i - m) in the lane order of ds4/core/reduce.hpp
//  (256 lanes of 4-element chunks, then a butterfly: what one GPU block computes);
//  logprob(i) = (l_i - m) - log_f32(s).
// logprob_of gives the chosen token's; top_logprobs the n largest (by logit descending, ties by
// lower index), n clamped to [0, n_vocab].
float logprob_of(const float* logits, int n, int token);
std::vector<token_logprob> top_logprobs(const float* logits, int n, int n_top);

}  // namespace ds4::ref
