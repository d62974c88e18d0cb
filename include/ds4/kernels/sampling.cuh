#pragma once
// Token sampling on the device, one block per row (docs/kernels.md "sampling"): greedy argmax, or
// temperature / top-k / top-p / min-p with the counter-based RNG of core/rng.hpp, and the
// log-probabilities the APIs report (the chosen token's and the n largest). Logits never leave
// the device on the decode path; a row writes its token, status and log-probabilities.
//
// Contract: exact, against reference/sampling:
//   greedy: ref::sample_argmax (the first maximum; NaN never chosen unless all are, then 0).
//   sampled: ref::sample's fixed order replayed. Only a prefix of the sorted candidates can
//     matter: every kept weight w_0 = 1 starts the running sums, so a weight below 2^-24 never
//     changes one (it is under half an ulp of any sum >= 1) and can neither stop top-p nor be
//     drawn. The block therefore sorts just the candidates down to the smallest logit whose
//     weight is >= 2^-24 (cut at top_k), at most sampling_max_candidates of them, and one thread
//     replays the sequential sums over them. A row the prefix cannot decide sets status 1 and
//     token -1 (the caller samples it on the host from the same logits): more candidates than
//     the cap, min_p in (0, 2^-24) reaching past the prefix, or the reference's "last kept"
//     fallback landing past it (t rounding up to the total). Logits are finite and
//     logit/temperature does not overflow (NaN logits are outside the sampled contract: the
//     reference's sort is undefined on them).
//   log-probabilities: ref::logprob_of / ref::top_logprobs; the normaliser's sum runs in the
//     lane order of core/reduce.hpp, which the reference replays, so exact too.
// Graph contract: no allocation, no host synchronisation; sampler parameters (with the RNG step)
// and the live row count are read from device memory; the grid is the row capacity.
// Shapes: any n_vocab >= 1 (129280 on flash); up to 65535 rows.
//
// Cost: a sampled row streams its logits about 7 times (weights, cut, count, 4 radix passes)
// from L2 with one 256-thread block, each thread keeping 8 16-byte loads in flight
// (for_each_logit); the sort and the sequential replay touch only the prefix. The
// log-probabilities' normaliser (an exponential per logit) is a second launch over 32 CTAs a row
// (sampling_norm_kernel): 256 lanes of core/reduce.hpp's order, 8 whole lanes a CTA.
// Launches: sampling_argmax_kernel (32 x capacity: every row's argmax over 32 CTAs),
// sampling_kernel (grid: capacity), then sampling_norm_kernel (32 x capacity).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rng.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/kernels/check_in.cuh"

namespace ds4::kernels {

inline constexpr int sampling_threads = 256;
inline constexpr int sampling_max_candidates = 4096;
inline constexpr int sampling_max_logprobs = 20;  // engine::max_logprobs
// Weights below this never change a running sum that starts at w_0 = 1 (see the header).
inline constexpr float sampling_negligible = 0x1p-24f;

// One row's sampler: engine::sampler plus the RNG step of this draw.
struct sampling_row {
    float temperature = 0.0f;  // <= 0 (or NaN): greedy
    float top_p = 1.0f;        // >= 1: off
    float min_p = 0.0f;        // <= 0: off
    std::int32_t top_k = 0;    // <= 0 or >= n_vocab: off
    std::uint64_t seed = 0;
    std::uint64_t step = 0;
    std::int32_t n_logprobs = -1;  // < 0: none; 0: the chosen token's; n: and the n largest (<= 20)
};

struct sampled_logprob {
    std::int32_t token = 0;
    float logprob = 0.0f;
};

struct sampling_launch {
    const float* logits = nullptr;  // logits[r * logits_stride + i]
    std::int64_t logits_stride = 0;
    int n_vocab = 0;
    const sampling_row* params = nullptr;  // [capacity]
    std::int32_t* token = nullptr;         // [capacity]
    // [capacity]: 0 sampled here; 1 the host must sample the row (token -1, no log-probabilities
    // written for it).
    std::int32_t* status = nullptr;
    float* logprob = nullptr;              // [capacity] (rows with n_logprobs >= 0)
    sampled_logprob* top = nullptr;        // [capacity][sampling_max_logprobs] (rows with n_logprobs > 0)
    const std::int32_t* n_rows = nullptr;  // live rows (device); null: every row of the capacity
    // Scratch of sampling_work_floats(capacity) floats for the log-probabilities' normaliser (a
    // row's shift m, its arrival counter, its 256 lane sums), zeroed once before the first launch;
    // every launch leaves the counters at zero. Required.
    float* work = nullptr;
};

// The normaliser's split: CTA c of a row sums lanes [c * lanes, (c + 1) * lanes) of core/reduce.hpp's
// order (each lane whole, its chunks in index order), and the last CTA to count in combines the 256
// lane sums by the butterfly. 32 CTAs put the row's ~129K exponentials on 32 SMs; one block took
// ~60 us of the ~87 us sampling launch on the H100 (flash vocabulary, bench/RESULTS.md).
inline constexpr int sampling_norm_ctas = 32;
inline constexpr int sampling_norm_lanes = reduce_lanes / sampling_norm_ctas;
// Per row: [0] the shift m, [1] the normaliser's arrival counter and [2] the argmax's (as
// unsigned), [3] the row's argmax (as int), [4 .. 260) the lane sums, [260 .. 324) the argmax
// launch's (value, index) per CTA.
inline constexpr int sampling_work_lanes = 4;
inline constexpr int sampling_work_best = sampling_work_lanes + reduce_lanes;
inline constexpr int sampling_work_stride = sampling_work_best + 2 * sampling_norm_ctas;
inline constexpr std::size_t sampling_work_floats(int capacity) { return std::size_t(capacity) * sampling_work_stride; }

namespace detail {

// Monotonic key of a float (larger float, larger key); -0 and +0 share a key because the
// reference compares them equal (ties then go to the lower index).
__device__ __forceinline__ unsigned order_key(float f) {
    const unsigned u = f == 0.0f ? 0u : float_bits(f);
    return (u >> 31) ? ~u : (u | 0x80000000u);
}

// Candidate key: logit descending, then index ascending, as one descending 64-bit order.
__device__ __forceinline__ unsigned long long candidate_key(float f, int i) {
    return (static_cast<unsigned long long>(order_key(f)) << 32) | static_cast<unsigned>(~unsigned(i));
}
__device__ __forceinline__ int candidate_index(unsigned long long k) { return int(~unsigned(k & 0xffffffffu)); }

// 16-byte loads a thread keeps in flight in the streaming passes below.
inline constexpr int sampling_batch = 8;
// Consecutive indices a thread checks per tile when gather_top takes the ties in index order.
inline constexpr int sampling_tie_run = 8;

// Calls f(i, l[i]) for every i < n that thread t owns (i = t + 256k, or the four elements of
// float4 t + 256k), with sampling_batch 16-byte loads in flight a thread. One logit a thread at a
// time, each pass waited on an L2 round trip per 256 logits: ~60 us a pass over 129280 logits in
// the decode graph (H200 timeline, bench/NOTES.md 2026-12-04). Only for passes whose result does
// not depend on the order in which a thread visits its elements (the argmax choice, a minimum,
// counts, integer histograms).
template <class F>
__device__ __forceinline__ void for_each_logit(const float* l, int n, F&& f) {
    const int t = int(threadIdx.x);
    if ((reinterpret_cast<std::uintptr_t>(l) & 15u) != 0) {
        for (int i = t; i < n; i += sampling_threads) f(i, l[i]);
        return;
    }
    const float4* l4 = reinterpret_cast<const float4*>(l);
    const int n4 = n / 4;
    for (int c0 = t; c0 < n4; c0 += sampling_threads * sampling_batch) {
        float4 q[sampling_batch];
#pragma unroll
        for (int k = 0; k < sampling_batch; ++k) {
            const int c = c0 + k * sampling_threads;
            q[k] = c < n4 ? l4[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < sampling_batch; ++k) {
            const int c = c0 + k * sampling_threads;
            if (c < n4) {
                f(4 * c, q[k].x);
                f(4 * c + 1, q[k].y);
                f(4 * c + 2, q[k].z);
                f(4 * c + 3, q[k].w);
            }
        }
    }
    for (int i = 4 * n4 + t; i < n; i += sampling_threads) f(i, l[i]);
}

struct sampling_shared {
    unsigned long long keys[sampling_max_candidates];
    unsigned hist[256];
    float red_v[sampling_threads / 32];
    int red_i[sampling_threads / 32];
    unsigned prefix, mask;
    int rank, count, taken;
    int token, status;
};

// (value, index) pairs: the reference argmax rule as an associative, commutative choice.
__device__ __forceinline__ bool argmax_prefers(float vb, int ib, float va, int ia) {
    const bool na = !(va == va), nb = !(vb == vb);
    if (na != nb) return na;  // a number beats NaN
    if (na) return ib < ia;
    return vb > va || (vb == va && ib < ia);
}

__device__ __forceinline__ int block_count(int mine, sampling_shared& sh) {
    const int t = int(threadIdx.x);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mine += __shfl_xor_sync(0xffffffffu, mine, off);
    if (t % 32 == 0) sh.red_i[t / 32] = mine;
    __syncthreads();
    int total = 0;
    for (int w = 0; w < sampling_threads / 32; ++w) total += sh.red_i[w];
    __syncthreads();
    return total;
}

__device__ __forceinline__ float block_min(float mine, sampling_shared& sh) {
    const int t = int(threadIdx.x);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mine = fminf(mine, __shfl_xor_sync(0xffffffffu, mine, off));
    if (t % 32 == 0) sh.red_v[t / 32] = mine;
    __syncthreads();
    float m = sh.red_v[0];
    for (int w = 1; w < sampling_threads / 32; ++w) m = fminf(m, sh.red_v[w]);
    __syncthreads();
    return m;
}

// Gathers the `want` first candidates of the order (logit descending, index ascending) among
// l[0..n) into sh.keys[0..want), unsorted: an MSB-first radix select of the order key (four
// 8-bit digits, integer histograms) finds the key K of the last one and the count above it,
// then the ties at K are taken in index order. want <= sampling_max_candidates.
__device__ inline void gather_top(const float* l, int n, int want, sampling_shared& sh) {
    const int t = int(threadIdx.x);
    if (t == 0) sh.prefix = 0, sh.mask = 0, sh.rank = want - 1, sh.count = 0, sh.taken = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += sampling_threads) sh.hist[b] = 0;
        __syncthreads();
        const unsigned prefix = sh.prefix, mask = sh.mask;
        for_each_logit(l, n, [&](int, float v) {
            const unsigned k = order_key(v);
            if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 0xffu], 1u);
        });
        __syncthreads();
        if (t == 0) {
            int rank = sh.rank;
            for (int b = 255; b >= 0; --b) {
                const int c = int(sh.hist[b]);
                if (rank < c) {
                    sh.prefix |= unsigned(b) << shift;
                    sh.mask |= 0xffu << shift;
                    break;
                }
                rank -= c;
            }
            sh.rank = rank;  // rank among the keys equal to the prefix so far
        }
        __syncthreads();
    }
    const unsigned K = sh.prefix;
    const int ties = sh.rank + 1;  // how many of the keys equal to K belong to the set
    for_each_logit(l, n, [&](int i, float v) {
        if (order_key(v) > K) sh.keys[atomicAdd(&sh.count, 1)] = candidate_key(v, i);
    });
    // Ties at K in index order, a tile of 256 runs of sampling_tie_run indices at a time: thread t
    // checks the run base + t * run (thread order is index order, the run's loads all in flight),
    // and a scan of the threads' counts ranks the ties. The set taken is the first `ties` ties by
    // index, as with one index a thread, in 8x fewer tiles (each a few barriers and a round trip).
    constexpr int run = sampling_tie_run;
    const int lane = t % 32, warp = t / 32;
    for (int base = 0; base < n; base += sampling_threads * run) {
        __syncthreads();
        if (sh.taken >= ties) break;
        const int i0 = base + t * run;
        float v[run];
#pragma unroll
        for (int e = 0; e < run; ++e) v[e] = i0 + e < n ? l[i0 + e] : 0.0f;
        unsigned tie = 0;
#pragma unroll
        for (int e = 0; e < run; ++e) tie |= unsigned(i0 + e < n && order_key(v[e]) == K) << e;
        const int mine = __popc(tie);
        int incl = mine;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
            const int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        if (lane == 31) sh.red_i[warp] = incl;
        __syncthreads();
        int before = sh.taken + incl - mine;
        for (int w = 0; w < warp; ++w) before += sh.red_i[w];
#pragma unroll
        for (int e = 0; e < run; ++e)
            if ((tie >> e) & 1u) {
                if (before < ties) sh.keys[atomicAdd(&sh.count, 1)] = candidate_key(v[e], i0 + e);
                ++before;
            }
        __syncthreads();
        if (t == 0) {
            int c = 0;
            for (int w = 0; w < sampling_threads / 32; ++w) c += sh.red_i[w];
            sh.taken += c;
        }
    }
    __syncthreads();
}

// Bitonic sort of sh.keys[0..count) descending (padded with 0, below every real key).
__device__ inline void sort_keys_desc(int count, sampling_shared& sh) {
    int size = 1;
    while (size < count) size *= 2;
    const int t = int(threadIdx.x);
    for (int i = count + t; i < size; i += sampling_threads) sh.keys[i] = 0;
    __syncthreads();
    for (int k = 2; k <= size; k *= 2) {
        for (int j = k / 2; j > 0; j /= 2) {
            for (int i = t; i < size; i += sampling_threads) {
                const int p = i ^ j;
                if (p > i) {
                    const unsigned long long a = sh.keys[i], b = sh.keys[p];
                    const bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) sh.keys[i] = b, sh.keys[p] = a;
                }
            }
            __syncthreads();
        }
    }
}

// The argmax of every live row (ref::sample_argmax: the first maximum, NaN never chosen unless all
// are, then 0) over sampling_norm_ctas CTAs a row: CTA c takes the 256-logit blocks c, c + 32, ...
// (a warp's loads one 128-byte line), argmax_prefers is associative and commutative, so the
// split cannot change the choice; the last CTA to count in combines the 32 partials and stores the
// index for sampling_kernel. On one block this pass took ~25 us of a greedy step's sampling (H100).
template <int = 0>
__global__ void __launch_bounds__(sampling_threads) sampling_argmax_kernel(const __grid_constant__ sampling_launch a, int capacity) {
    pdl_enter();
    __shared__ float red_v[sampling_threads / 32];
    __shared__ int red_i[sampling_threads / 32];
    __shared__ bool last;
    const int r = int(blockIdx.y), c = int(blockIdx.x), t = int(threadIdx.x), n = a.n_vocab;
    if (r >= (a.n_rows ? min(*a.n_rows, capacity) : capacity)) return;
    const float* l = a.logits + r * a.logits_stride;
    float* w = a.work + std::size_t(r) * sampling_work_stride;
    float bv = bits_float(0x7fc00000u);
    int bi = 0x7fffffff;
    constexpr int step = sampling_norm_ctas * sampling_threads, batch = 4;
    for (int i0 = c * sampling_threads + t; i0 < n; i0 += batch * step) {
        float v[batch];
#pragma unroll
        for (int k = 0; k < batch; ++k) v[k] = i0 + k * step < n ? l[i0 + k * step] : 0.0f;
#pragma unroll
        for (int k = 0; k < batch; ++k)
            if (i0 + k * step < n && argmax_prefers(v[k], i0 + k * step, bv, bi)) bv = v[k], bi = i0 + k * step;
    }
    auto warp_best = [&](float& v, int& i) {
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, off);
            const int oi = __shfl_xor_sync(0xffffffffu, i, off);
            if (argmax_prefers(ov, oi, v, i)) v = ov, i = oi;
        }
    };
    warp_best(bv, bi);
    if (t % 32 == 0) red_v[t / 32] = bv, red_i[t / 32] = bi;
    __syncthreads();
    if (t < 32) {
        float v = t < sampling_threads / 32 ? red_v[t] : bits_float(0x7fc00000u);
        int i = t < sampling_threads / 32 ? red_i[t] : 0x7fffffff;
        warp_best(v, i);
        if (t == 0) w[sampling_work_best + 2 * c] = v, w[sampling_work_best + 2 * c + 1] = __int_as_float(i);
    }
    if (!check_in(reinterpret_cast<unsigned*>(w + 2), unsigned(gridDim.x), &last)) return;
    if (t < 32) {
        float v = t < int(gridDim.x) ? __ldcg(w + sampling_work_best + 2 * t) : bits_float(0x7fc00000u);
        int i = t < int(gridDim.x) ? __float_as_int(__ldcg(w + sampling_work_best + 2 * t + 1)) : 0x7fffffff;
        warp_best(v, i);
        if (t == 0) w[3] = __int_as_float(i);
    }
}

// A template only for linkage: this header may be included by several translation units, and a
// __global__ function cannot be inline.
template <int = 0>
__global__ void __launch_bounds__(sampling_threads, 1) sampling_kernel(const __grid_constant__ sampling_launch a, int capacity) {
    pdl_enter();
    __shared__ sampling_shared sh;
    const int r = int(blockIdx.x), t = int(threadIdx.x), n = a.n_vocab;
    if (r >= (a.n_rows ? min(*a.n_rows, capacity) : capacity)) return;
    const float* l = a.logits + r * a.logits_stride;
    const sampling_row p = a.params[r];
    // The row's argmax, from sampling_argmax_kernel.
    const int best = __float_as_int(a.work[std::size_t(r) * sampling_work_stride + 3]);
    if (t == 0) sh.token = best, sh.status = 0;
    const float T = p.temperature;
    if (T > 0.0f) {
        const float z0 = div_rn(l[best], T);
        auto weight = [&](float v) { return exp_f32(sub_rn(div_rn(v, T), z0)); };
        // The prefix: every logit >= the smallest one whose weight is not negligible.
        float lmin = bits_float(0x7f800000u);
        for_each_logit(l, n, [&](int, float v) {
            if (weight(v) >= sampling_negligible) lmin = fminf(lmin, v);
        });
        lmin = block_min(lmin, sh);
        int mine = 0;
        for_each_logit(l, n, [&](int, float v) { mine += v >= lmin; });
        const int prefix = block_count(mine, sh);
        const int k = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
        const int kk = min(k, prefix);
        if (kk > sampling_max_candidates) {
            if (t == 0) sh.status = 1;
        } else {
            gather_top(l, n, kk, sh);
            sort_keys_desc(kk, sh);
            // In place: (index, weight bits) in sorted order.
            for (int j = t; j < kk; j += sampling_threads) {
                const int i = candidate_index(sh.keys[j]);
                sh.keys[j] = (static_cast<unsigned long long>(float_bits(weight(l[i]))) << 32) | unsigned(i);
            }
            __syncthreads();
            if (t == 0) {
                auto w = [&](int j) { return bits_float(unsigned(sh.keys[j] >> 32)); };
                auto idx = [&](int j) { return int(unsigned(sh.keys[j] & 0xffffffffu)); };
                int kept = k, status = 0;
                if (p.top_p < 1.0f) {
                    float total = 0.0f;
                    for (int j = 0; j < kk; ++j) total = add_rn(total, w(j));
                    const float target = mul_rn(p.top_p, total);
                    float cum = 0.0f;
                    for (int j = 0; j < kk; ++j) {
                        cum = add_rn(cum, w(j));
                        if (cum >= target) {
                            kept = j + 1;
                            break;
                        }
                    }
                }
                if (p.min_p > 0.0f) {
                    int j = 1;
                    while (j < kept && j < kk && w(j) >= p.min_p) ++j;
                    // Past the prefix every weight is below 2^-24: it stops there only if min_p is not.
                    if (j < kept && j == kk && !(p.min_p >= sampling_negligible)) status = 1;
                    kept = j;
                }
                const int live = min(kept, kk);
                float total = 0.0f;
                for (int j = 0; j < live; ++j) total = add_rn(total, w(j));
                const float u = rng_uniform(p.seed, p.step);
                const float target = mul_rn(u, total);
                float cum = 0.0f;
                int token = -1;
                for (int j = 0; j < live && token < 0; ++j) {
                    cum = add_rn(cum, w(j));
                    if (target < cum) token = idx(j);
                }
                if (token < 0) {
                    if (kept - 1 < kk) token = idx(kept - 1);
                    else status = 1;
                }
                sh.token = status ? -1 : token;
                sh.status = status;
            }
        }
    }
    __syncthreads();
    const int token = sh.token, status = sh.status;
    if (t == 0) {
        a.token[r] = status ? -1 : token;
        a.status[r] = status;
    }
    if (p.n_logprobs < 0 || status != 0) return;
    // m as the reference's std::max sequence: NaN only when logit 0 is NaN. The log-probabilities
    // are written shifted, l - m; sampling_norm_kernel subtracts log(s) from them (the reference's
    // (l - m) - log(s), the same two roundings).
    const float m = l[0] == l[0] ? l[best] : l[0];
    if (t == 0) {
        a.work[std::size_t(r) * sampling_work_stride] = m;
        if (a.logprob) a.logprob[r] = sub_rn(l[token], m);
    }
    const int n_top = min(min(p.n_logprobs, sampling_max_logprobs), n);
    if (n_top <= 0 || !a.top) return;
    __syncthreads();
    gather_top(l, n, n_top, sh);
    sort_keys_desc(n_top, sh);
    if (t < n_top) {
        const int i = candidate_index(sh.keys[t]);
        a.top[std::int64_t(r) * sampling_max_logprobs + t] = {i, sub_rn(l[i], m)};
    }
}

// The normaliser s = sum_exp_shifted(l, n, m) of the rows whose log-probabilities sampling_kernel
// wrote shifted, and log(s) taken from them. Grid (sampling_norm_ctas, capacity). CTA c owns lanes
// 8c .. 8c + 7, whose chunks k * 256 + 8c .. + 7 are the 32 consecutive logits from 1024k + 32c:
// warp w computes the exponentials of the tile's segments k = w, w + 8, ... (lane j element j,
// coalesced), then thread t < 8 adds lane 8c + t's four elements of each segment in order.
inline constexpr int sampling_norm_tile = 128;  // segments per shared-memory tile (16 KB)

template <int = 0>
__global__ void __launch_bounds__(sampling_threads) sampling_norm_kernel(const __grid_constant__ sampling_launch a, int capacity) {
    pdl_enter();
    __shared__ float e[sampling_norm_tile][32];
    __shared__ float scratch[sampling_threads];
    __shared__ bool last;
    const int r = int(blockIdx.y), c = int(blockIdx.x), t = int(threadIdx.x), n = a.n_vocab;
    if (r >= (a.n_rows ? min(*a.n_rows, capacity) : capacity)) return;
    const sampling_row p = a.params[r];
    if (p.n_logprobs < 0 || a.status[r] != 0) return;  // the same on every CTA of the row
    const float* l = a.logits + r * a.logits_stride;
    float* w = a.work + std::size_t(r) * sampling_work_stride;
    const float m = w[0];
    const int n_chunks = (n + reduce_chunk - 1) / reduce_chunk, first = sampling_norm_lanes * c;
    const int segs = n_chunks > first ? (n_chunks - first + reduce_lanes - 1) / reduce_lanes : 0;
    constexpr int seg_elems = sampling_norm_lanes * reduce_chunk;  // 32
    static_assert(seg_elems == 32, "one warp lane per element of a segment");
    const int warp = t / 32, lane = t % 32;
    float acc = 0.0f;
    for (int k0 = 0; k0 < segs; k0 += sampling_norm_tile) {
        const int kn = min(sampling_norm_tile, segs - k0);
        for (int kk = warp; kk < kn; kk += sampling_threads / 32) {
            const int i = (k0 + kk) * (reduce_lanes * reduce_chunk) + first * reduce_chunk + lane;
            e[kk][lane] = i < n ? exp_f32(sub_rn(l[i], m)) : 0.0f;
        }
        __syncthreads();
        if (t < sampling_norm_lanes) {
            for (int kk = 0; kk < kn; ++kk) {
                const int i0 = (k0 + kk) * (reduce_lanes * reduce_chunk) + (first + t) * reduce_chunk;
                // chunk_partial: the chunk's elements below n, in order (a chunk past n adds nothing).
#pragma unroll
                for (int j = 0; j < reduce_chunk; ++j)
                    if (i0 + j < n) acc = add_rn(acc, e[kk][reduce_chunk * t + j]);
            }
        }
        __syncthreads();
    }
    if (t < sampling_norm_lanes) w[sampling_work_lanes + first + t] = acc;
    if (!check_in(reinterpret_cast<unsigned*>(w + 1), unsigned(gridDim.x), &last)) return;
    float v[lanes_per_thread<sampling_threads>] = {__ldcg(w + sampling_work_lanes + t)};
    const float log_s = log_f32(group_lane_combine<sampling_threads>(v, scratch, t));
    if (t == 0 && a.logprob) a.logprob[r] = sub_rn(a.logprob[r], log_s);
    const int n_top = min(min(p.n_logprobs, sampling_max_logprobs), n);
    if (t < n_top && a.top) {
        sampled_logprob& o = a.top[std::int64_t(r) * sampling_max_logprobs + t];
        o.logprob = sub_rn(o.logprob, log_s);
    }
}

}  // namespace detail

inline void launch_sampling(const sampling_launch& a, int capacity, cudaStream_t stream) {
    require(capacity >= 1 && capacity <= 65535, "sampling: row capacity " + std::to_string(capacity));
    require(a.n_vocab >= 1, "sampling: n_vocab = " + std::to_string(a.n_vocab));
    require(a.logits && a.params && a.token && a.status && a.work,
            "sampling: null logits, parameters, token, status or work");
    launch_kernel("sampling_argmax_kernel", detail::sampling_argmax_kernel<>,
                  dim3(unsigned(sampling_norm_ctas), unsigned(capacity)), sampling_threads, 0, stream, a, capacity);
    cuda_check_launch("sampling argmax");
    launch_kernel("sampling_kernel", detail::sampling_kernel<>, capacity, sampling_threads, 0, stream, a, capacity);
    cuda_check_launch("sampling");
    launch_kernel("sampling_norm_kernel", detail::sampling_norm_kernel<>, dim3(unsigned(sampling_norm_ctas), unsigned(capacity)),
                  sampling_threads, 0, stream, a, capacity);
    cuda_check_launch("sampling normaliser");
}

}  // namespace ds4::kernels
