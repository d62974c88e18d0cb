#pragma once
// Hyper-connection pre and post (docs/model.md §2.2, §2.3) and the output head's HC mix (§2.8).
// The HC state of a row is n_hc streams of n_embd floats, stream-major (X[h*n_embd + d]).
//   hc pre, one launch: the rows are taken in groups of RB; each group has blocks_per_group
//   blocks, block b holding a run of 512-element segments of the flat state. Every block
//     1. issues its fn loads, computes its rows' RMS scales over n_hc*n_embd (16384 on flash)
//        while they are in flight, then the F16 dot partials of its segments for all mix outputs
//        (one warp per (output, segment)) into the scratch;
//     2. counts itself in on its group's arrival counter (as the split-K matvec and the MoE do).
//   One-row groups (decode) keep the block's own segments of the state in shared memory as the
//   scale streams them, so the dots read no global memory. They can also fold in the previous
//   sublayer's hc post (post_F, hc_pre_folds_post): the scale reads X and F and forms the state Y
//   in registers, and each block stores its own segments of Y, which the finish reads back.
//   The block that completes its group finishes it: warps 1..7 issue the first row's stream loads,
//   thread (row, o) adds output o's segment partials in segment order and computes the gate; then
//   warp 0 runs the rows' Sinkhorns (n_hc <= 4: a half-warp per row, a lane per matrix entry;
//   above, a lane per row) and writes the split for hc post while warps 1..7 compute
//   x_in[d] = sum_h X[h][d]*pre[h] (the gates need no Sinkhorn, so the two run side by side).
//   One-row groups (decode) spread x_in's chunks evenly over warps 1..7, all of a row's stream
//   loads in one round trip (hc_fin_row_staged), and stage x_in in shared memory; larger groups
//   compute the chunks of each thread's own lanes of the norm's lane order (hc_fin_row).
//   With norm_weight set (the RMSNorm that follows hc pre in the layer: attn_norm, ffn_norm, the
//   output norm) the lane sums of squares are formed in lane order (from shared memory, or from
//   the registers), warp 1 combines them between named barriers, and the values are scaled and
//   written: no launch.
//   hc post, one launch: Y[j][d] = F[d]*post[j] + sum_i M[i][j]*X[i][d].
//   output HC mix: the same launch with n_hc outputs and the stable-sigmoid gates, no Sinkhorn.
//
// Contract: exact. Equals reference/hyper_connection bitwise: the sum of squares in the lane
// order of core/reduce.hpp (streamed chunk by chunk through add_thread_chunk, which adds each
// lane's terms in the same order as block_lane_reduce); flat = X*scale, then the F16 matvec
// order of format/row_dot.hpp (lane l of a warp sums 16 elements in order, the xor butterfly as
// shuffles, segments added in order from zero, whichever block computed them); the scalar parts
// are core/hyper_connection.hpp itself, called as they are (n_hc = 4 a constant only so that they
// unroll); the folded norm is reference rms_norm of x_in (each of the 256 lanes' chunks in order,
// the butterfly on one warp, then (x*scale)*w). tests/hyper_connection_emulation_test.cpp replays
// this decomposition on the CPU (the lane Sinkhorn is checked against the reference on the GPU by
// ds4-validate's hc rows).
// Graph contract: no allocation, no host synchronisation; the live row count is read from device
// memory; the grid is a function of the row capacity and the shape only; the scratch (segment
// partials and arrival counters, zeroed once by the caller and left at zero by every launch) and
// the split buffer come from the caller.
// Shapes: n_hc 1..8, the launch's template parameter NHC (4 on flash; a run-time n_hc form, its
// arrays in local memory, wrote wrong splits on the H200 and was removed); any n_embd (16-byte
// vector loads of fn and the state where rows allow, scalar otherwise); rows up to 65535.
//
// Geometry: kernels/hyper_connection_grid.hpp (one row per group at decode capacities, so that
// no block streams more than one row's state for its scale; ~128 blocks). Each block of a group
// recomputes the group's scales (a 64 KB L2 read per row, issued while the block's fn loads are
// in flight from DRAM) so that no block ever waits on another.
// Cost (decode, batch 1, flash; H100, bench/RESULTS.md "Thirty-ninth session"): the staged finish
// took BM_hc_post_pre_norm/1 from 13.13 to 11.50 us and BM_hc_pre_norm/1 from 12.71 to 11.17;
// inlining the finish into the one-row kernel, to 10.62 and 10.17. A probe of that launch (us
// after the PDL wait): count-in 4.45, the finish entered 5.38, barrier 2 6.75, x_in 7.23, lane
// sums 7.84, combine 8.19, norm writes 9.25; the lane Sinkhorn ends 9.82 (now the longer path).
// The norm's weights in registers and a lane's chunks read together: writes end 8.77, launch
// 10.62 -> 10.39 us; the Sinkhorn's passes in registers (no shuffles, no division branch) end
// where the shuffled ones did (9.86), and with the range flag by & instead of && (no branch a
// pass) at 9.76: the launch's tail, of which the 39 passes are ~1.2 us (BM_hc_pre_iters 20 - 1
// passes) and the rest the softmax and the gathers beside warps 1..7's norm.
// Earlier (H200, bench/RESULTS.md "Twenty-second session"): BM_hc_pre_norm/1
// 12.5 us, with hc post folded in (BM_hc_post_pre_norm/1) 12.4 (13.4 with the finish's partials
// as scalar loads; 16.7 before the eighteenth session's two fixes below; 27.6 before the lane
// Sinkhorn and the staged segments). A globaltimer
// timeline of one folded launch (twenty-third session, us after the PDL wait): scale 2.7, dots
// 1.9, count-in 1.1, the finish's entry and mix sums 2.2, then x_in + norm 3.4 beside the
// Sinkhorn's 3.5 (two paths of one length: shortening either alone gains nothing);
// in an ncu profile (sixteenth session) no-instruction stalls lead no section (1.5% of the
// samples, in the prologue), so the ninth session's instruction-fetch hypothesis is not borne
// out; the scale's L2 loads (long scoreboard, 26% of the samples), the dots' dependent chains
// (22%) and the finish (20%) hold most of them. Target: <= 8 us
// (bench/hyper_connection_bench BM_hc_pre/1; BM_hc_post_pre_norm/1 is the backend's form).
// In the decode graph what counts is when the launch's blocks can land: at 246 registers a block
// needed an SM of its own and waited for the launch before (out_b's matvec) to drain whole SMs;
// capped at 144 (hc_pre_max_regs) the launch alone is ~1 us slower and the model 1.9% faster
// (H100, bench/RESULTS.md "Thirty-third session").
// Decode's folded one-row launch runs hc_pre_kernel<1, NHC, true>, compiled for that path alone:
// the code is fetched cold at every launch, and the general kernel's 170 KB cost the model 1.0%
// against the instance's 104 (H100, bench/RESULTS.md "Fifty-first session").
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/hyper_connection.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/check_in.cuh"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/hyper_connection_grid.hpp"

namespace ds4::kernels {

inline constexpr int hc_threads = 256;
inline constexpr int hc_warps = hc_threads / 32;

struct hc_pre_launch {
    const float* X = nullptr;         // [capacity][n_hc][n_embd]
    const std::uint16_t* fn = nullptr;  // [n_mix][n_hc*n_embd] F16 (GGUF row-major)
    const float* scale = nullptr;     // F32[3] (pre) or F32[1] (output mix)
    const float* base = nullptr;      // F32[n_mix]
    int n_embd = 0, n_hc = 4, iters = 20;
    float rms_eps = 1e-6f, hc_eps = 1e-6f;
    bool output_mix = false;          // §2.8: n_mix = n_hc, sigmoid_stable gates, no Sinkhorn
    float* x_in = nullptr;            // [capacity][x_in_stride]: x_in (pre) or e (output mix)
    std::int64_t x_in_stride = 0;
    float* split = nullptr;           // [capacity][n_mix]: pre, post, comb (pre only; hc post reads it)
    // Scratch of hc_partial_floats() floats (kernels/hyper_connection_grid.hpp: the row groups'
    // arrival counters, then the segment partials). Zeroed once before the first launch; every
    // launch leaves the counters at zero. One scratch serves any capacity up to its own.
    float* partials = nullptr;
    const std::int32_t* n_rows = nullptr;  // live rows (device); null: every row of the capacity
    // Optional: the RMSNorm with weight that reads x_in next (attn_norm, ffn_norm, the output
    // norm), folded in: norm_out[r*norm_stride + d] = (x_in[d]*scale)*norm_weight[d], the scale
    // over the row's x_in in core/reduce.hpp's lane order (norm_rope.cuh's rms_norm, bit for bit).
    const float* norm_weight = nullptr;
    float* norm_out = nullptr;
    std::int64_t norm_stride = 0;
    float norm_eps = 1e-6f;
    // Optional (hc_pre_folds_post): the previous sublayer's hc post, folded in. The state this
    // launch mixes is then Y = hc post(post_F, X, post_split): every block forms the row's Y in
    // registers as its scale reads X and F (hc_post_element) and stores its own segments of Y to
    // post_Y, which the finishing block reads for x_in and the next sublayer reads as its X (one
    // launch and one 64 KB read per row less). post_Y must not alias X. post_split may be split itself:
    // every block reads its row's post split before it counts in, and the finishing block writes
    // the group's split after the whole group counted in.
    const float* post_F = nullptr;  // [capacity][post_F_stride]
    std::int64_t post_F_stride = 0;
    const float* post_split = nullptr;  // [capacity][2*n_hc + n_hc*n_hc]
    float* post_Y = nullptr;            // [capacity][n_hc][n_embd]

    // Optional (the chunk kernel only, hyper_connection_chunk.cuh): each row's RMS scale of X,
    // formed by the hc post that wrote X (hc_post_launch::row_scale) in the same lane order.
    const float* row_scale = nullptr;  // [capacity]

    __host__ __device__ int n_mix() const { return output_mix ? n_hc : 2 * n_hc + n_hc * n_hc; }
    __host__ __device__ int n_flat() const { return n_hc * n_embd; }
    __host__ __device__ int segments() const { return (n_flat() + f16_segment - 1) / f16_segment; }
};

struct hc_post_launch {
    const float* F = nullptr;      // sublayer output [capacity][F_stride]
    std::int64_t F_stride = 0;
    const float* X = nullptr;      // [capacity][n_hc][n_embd]
    const float* split = nullptr;  // from hc pre
    float* Y = nullptr;            // [capacity][n_hc][n_embd], must not alias X
    int n_embd = 0, n_hc = 4;
    const std::int32_t* n_rows = nullptr;
    // Optional (hc_post_forms_scales): each row's RMS scale of Y (rms_eps), as the next hc pre
    // would form it over its flat state, for the chunk kernel's hc_pre_launch::row_scale. The
    // launch then takes one block per row, which forms the row's Y and its sum of squares in
    // core/reduce.hpp's lane order (hc_row_scales_post), so the next hc pre reads Y once less.
    float* row_scale = nullptr;  // [capacity]
    float rms_eps = 1e-6f;
};

inline std::size_t hc_partial_floats(const hc_pre_launch& a, int capacity) {
    return hc_scratch_floats(capacity, a.n_mix(), a.segments());
}

namespace detail {

__device__ __forceinline__ int live_rows(const std::int32_t* n_rows, int capacity) {
    return n_rows ? min(*n_rows, capacity) : capacity;
}

// fn items whose loads a warp issues together: 3, a warp's whole share at capacity 1 (24 items
// on 8 warps), in flight while the block computes the scale; 4 made ptxas spill beside the
// scale's 16 vector loads.
inline constexpr int hc_fn_batch = 3;
// Chunks a scale thread loads per batch, all in flight together: 16 (one batch for a 16384 row)
// when one row has all 256 threads, 8 when the rows share them (register room for 4 rows).
template <int RB>
inline constexpr int hc_scale_batch = RB == 1 ? 16 : 8;

// A lane's 16 F16 weights of one (output, segment) item as raw halves: two 16-byte loads when the
// row allows, scalar loads otherwise (halves past the flat length are 0 and never used).
struct hc_fn_lane {
    int4 lo, hi;
};

__device__ __forceinline__ hc_fn_lane hc_load_fn(const std::uint16_t* w, int cnt, bool vec) {
    if (vec && cnt == f16_lane_elems)
        return {__ldg(reinterpret_cast<const int4*>(w)), __ldg(reinterpret_cast<const int4*>(w) + 1)};
    std::uint32_t p[f16_lane_elems / 2];
#pragma unroll
    for (int k = 0; k < f16_lane_elems / 2; ++k) {
        const std::uint32_t h0 = 2 * k < cnt ? w[2 * k] : 0u, h1 = 2 * k + 1 < cnt ? w[2 * k + 1] : 0u;
        p[k] = h0 | (h1 << 16);
    }
    return {make_int4(int(p[0]), int(p[1]), int(p[2]), int(p[3])), make_int4(int(p[4]), int(p[5]), int(p[6]), int(p[7]))};
}

// The scale of each of the block's rows: row g on threads [g*G, (g+1)*G), G = hc_threads/RB, all
// rows' double chains at once. Each thread streams its chunks t + G*m in batches of
// hc_scale_batch vector loads and adds them through add_thread_chunk: the lane order of
// core/reduce.hpp, the same adds as block_lane_reduce (reduce.hpp says why the orders agree).
// With `stage` (one-row groups), the chunks [c_begin, c_end) that pass through the registers are
// also kept in shared memory: the block's own segments, which its dots read next (three dependent
// L2 round trips per warp when each dot loaded them itself).
template <int RB>
__device__ __forceinline__ void hc_row_scales(const hc_pre_launch& a, int r0, int rows, double* scratch, float* scale_s,
                                              float4* stage, int c_begin, int c_end) {
    constexpr int G = hc_threads / RB;
    const int g = int(threadIdx.x) / G, t = int(threadIdx.x) % G, nf = a.n_flat();
    const bool vec = nf % reduce_chunk == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0;
    double v[lanes_per_thread<G>] = {};
    if (g < rows) {
        const float* x = a.X + std::int64_t(r0 + g) * nf;
        constexpr int batch = hc_scale_batch<RB>;
        for (int b = 0; (t + G * b * batch) * reduce_chunk < nf; ++b) {
            const int m0 = b * batch;
            float4 q[batch];
#pragma unroll
            for (int i = 0; i < batch; ++i) q[i] = load_chunk(x, t + G * (m0 + i), nf, vec);
            if constexpr (RB == 1) {
                if (stage) {
#pragma unroll
                    for (int i = 0; i < batch; ++i) {
                        const int c = t + G * (m0 + i);
                        if (c >= c_begin && c < c_end) stage[c - c_begin] = q[i];
                    }
                }
            }
            if (vec) {
#pragma unroll
                for (int i = 0; i < batch; ++i)
                    if ((t + G * (m0 + i)) * reduce_chunk < nf)
                        add_whole_chunk<G>(v, m0 + i, [&](int k) { return square_f64(float4_at(q[i], k)); });
            } else {
#pragma unroll
                for (int i = 0; i < batch; ++i)
                    add_thread_chunk<G>(v, t, m0 + i, nf, [&](int k) { return square_f64(float4_at(q[i], k % reduce_chunk)); });
            }
        }
    }
    const double ss = group_lane_combine<G>(v, scratch + g * G, t);
    if (t == 0 && g < rows) scale_s[g] = rms_scale_from_sum(ss, nf, a.rms_eps);
}

// Row r's split (pre, post, comb) from `split` [rows][2*NHC + NHC*NHC] into s, by a block of
// hc_threads threads in turn; the caller's barrier orders it before use.
template <int NHC>
__device__ __forceinline__ void load_row_split(const float* split, int r, hc_split& s) {
    constexpr int n_mix = 2 * NHC + NHC * NHC;
    const float* sp = split + std::int64_t(r) * n_mix;
    for (int k = int(threadIdx.x); k < n_mix; k += hc_threads) {
        if (k < NHC) s.pre[k] = sp[k];
        else if (k < 2 * NHC) s.post[k - NHC] = sp[k];
        else s.comb[k - 2 * NHC] = sp[k];
    }
}

// hc_row_scales with hc post folded in (one-row groups, hc_pre_folds_post). Y chunk t + G*m,
// m = k + K*h (K = n_embd / (4G) d-chunks per stream), is stream h of d-chunk t + G*k, so the
// chunks of hc_row_scales's thread t are every stream of its own K d-chunks: the thread loads
// those of X and F, forms Y there (hc_post_element with the row's split in shared memory),
// stages the block's own chunks and stores them to post_Y, and adds the squares in chunk order,
// m ascending, as hc_row_scales does. sp is filled by the caller; the barrier here orders it.
// Staged = false (hc post's chunk form, hc_post_scales_kernel: one block per row): every chunk of
// Y is stored, nothing staged (stage, c_begin and c_end unused).
template <int NHC, bool Staged = true>
__device__ __forceinline__ void hc_row_scales_post(const hc_pre_launch& a, int r, const hc_split& sp, double* scratch,
                                                   float* scale_s, float4* stage, int c_begin, int c_end) {
    constexpr int G = hc_threads, KM = hc_scale_batch<1> / NHC;
    const int t = int(threadIdx.x), nf = a.n_flat(), K = a.n_embd / (reduce_chunk * G);
    const auto* x = reinterpret_cast<const float4*>(a.X + std::int64_t(r) * nf);
    const auto* f = reinterpret_cast<const float4*>(a.post_F + std::int64_t(r) * a.post_F_stride);
    float4 q[NHC][KM], fv[KM];
#pragma unroll
    for (int k = 0; k < KM; ++k) {
        if (k >= K) continue;
        fv[k] = f[t + G * k];
#pragma unroll
        for (int h = 0; h < NHC; ++h) q[h][k] = x[t + G * (k + K * h)];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < KM; ++k) {
        if (k >= K) continue;
        float y[NHC][reduce_chunk];
#pragma unroll
        for (int e = 0; e < reduce_chunk; ++e) {
            float xv[NHC];
#pragma unroll
            for (int h = 0; h < NHC; ++h) xv[h] = float4_at(q[h][k], e);
#pragma unroll
            for (int h = 0; h < NHC; ++h) y[h][e] = hc_post_element(float4_at(fv[k], e), xv, 1, sp, NHC, h);
        }
#pragma unroll
        for (int h = 0; h < NHC; ++h) q[h][k] = make_float4(y[h][0], y[h][1], y[h][2], y[h][3]);
    }
    auto* yrow = reinterpret_cast<float4*>(a.post_Y + std::int64_t(r) * nf);
    double v[lanes_per_thread<G>] = {};
#pragma unroll
    for (int h = 0; h < NHC; ++h)
#pragma unroll
        for (int k = 0; k < KM; ++k) {
            if (k >= K) continue;
            const int c = t + G * (k + K * h);
            if constexpr (!Staged) {
                yrow[c] = q[h][k];
            } else if (c >= c_begin && c < c_end) {
                stage[c - c_begin] = q[h][k];
                yrow[c] = q[h][k];
            }
            add_whole_chunk<G>(v, k + K * h, [&](int e) { return square_f64(float4_at(q[h][k], e)); });
        }
    const double ss = group_lane_combine<G>(v, scratch, t);
    if (t == 0) scale_s[0] = rms_scale_from_sum(ss, nf, a.rms_eps);
}

// The largest mix.
inline constexpr int hc_max_mix = 2 * hc_split::max_hc + hc_split::max_hc * hc_split::max_hc;
// Segment partials a finishing thread loads at once (32: a flash row's 16384 / 512).
inline constexpr int hc_sum_batch = 32;
// Chunks of the flat state a one-row block keeps in shared memory for its dots: 4 segments
// (capacity 16 gives 8 blocks a row, 4 of flash's 32 segments each); a longer run loads its own.
inline constexpr int hc_stage_chunks = 4 * f16_segment / reduce_chunk;

// The finish's x_in and folded norm run on warps 1..7 (warp 0 is in the Sinkhorn). Thread t owns
// the norm's lanes t and, for t < 32, hc_fin_threads + t (core/reduce.hpp: 256 lanes, lane l
// holding chunks l + 256k in order), and computes the x_in chunks of those lanes: each lane's
// sum of squares is formed in registers as its chunks are made, and the normalised values are
// written from the same registers. (Warps 1..7 re-reading x_in for a one-warp norm cost six
// dependent L2 round trips on one warp.)
inline constexpr int hc_fin_threads = hc_threads - 32;
// Chunks per owned lane in flight together (the finish's FB): one, in every form. Prefill's
// groups hold two blocks per SM at n_hc <= 4 (128 registers: a batch of 2 spilled). Decode's
// one-row groups held 4 on flash (a lane's whole share of a 4096 row, no second pass for the
// norm) at 246 registers; one costs the launch alone ~1 us (H100: 12.2 -> 13.2 us) and buys the
// register cap of hc_pre_kernel, which the model pays back (bench/NOTES.md, thirty-third session).
inline constexpr int hc_fin_batch = 1;

__device__ __forceinline__ int hc_fin_lane(int t, int j) { return j == 0 ? t : hc_fin_threads + t; }
__device__ __forceinline__ bool hc_fin_owns(int t, int j) { return j == 0 || t < reduce_lanes - hc_fin_threads; }

// The stream chunks of batch kb of thread t's lanes for row r: x[j][i][h] is stream h of chunk
// lane_j + 256*(FB*kb + i) (zero past the row). With hc post folded in, the state is the Y the
// group's blocks stored before they counted in: read through L2 (ld.cg), as the partials are.
template <int NHC, int FB>
__device__ __forceinline__ void hc_fin_load(const hc_pre_launch& a, int r, int t, int kb, bool vec,
                                            float4 (&x)[2][FB][NHC]) {
    const bool fold = a.post_F != nullptr;
    const float* X = (fold ? a.post_Y : a.X) + std::int64_t(r) * a.n_flat();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        if (!hc_fin_owns(t, j)) continue;
#pragma unroll
        for (int i = 0; i < FB; ++i) {
            const int c = hc_fin_lane(t, j) + reduce_lanes * (FB * kb + i);
#pragma unroll
            for (int h = 0; h < NHC; ++h) {
                const float* xh = X + std::int64_t(h) * a.n_embd;
                // Folding needs n_embd % 1024 == 0 and 16-byte alignment (hc_pre_folds_post).
                x[j][i][h] = fold ? (c * reduce_chunk < a.n_embd ? __ldcg(reinterpret_cast<const float4*>(xh) + c)
                                                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f))
                                  : load_chunk(xh, c, a.n_embd, vec);
            }
        }
    }
}

__device__ __forceinline__ void hc_store_chunk(float* dst, int c, int n, const float (&y)[reduce_chunk], bool vec) {
    const int i0 = c * reduce_chunk;
    if (vec) {
        *reinterpret_cast<float4*>(dst + i0) = make_float4(y[0], y[1], y[2], y[3]);
    } else {
#pragma unroll
        for (int e = 0; e < reduce_chunk; ++e)
            if (i0 + e < n) dst[i0 + e] = y[e];
    }
}

// The folded norm's scale from the 256 lane sums in lane_s (every thread of warps 1..7 calls it
// once its own lanes are stored): warp 1 combines them (group_lane_combine<32>: thread t's lanes
// t + 32m, shuffles only, so no block barrier waits on warp 0) between named barriers 1.
__device__ __forceinline__ float hc_fin_norm_scale(int t, int n, float eps, const double* lane_s, float* nscale_s) {
    asm volatile("bar.sync 1, %0;" ::"r"(hc_fin_threads) : "memory");
    if (t < 32) {
        double v[lanes_per_thread<32>];
#pragma unroll
        for (int m = 0; m < lanes_per_thread<32>; ++m) v[m] = lane_s[t + 32 * m];
        const float sc = rms_scale_from_sum(group_lane_combine<32>(v, static_cast<double*>(nullptr), t), n, eps);
        if (t == 0) *nscale_s = sc;
    }
    asm volatile("bar.sync 1, %0;" ::"r"(hc_fin_threads) : "memory");
    return *nscale_s;
}

// Row r of the finish on thread t of warps 1..7: x_in (or the output mix's e) = sum_h X[h]*w[h]
// per element (hc_weighted_sum), then with norm_weight the RMSNorm of it: the lane sums to
// lane_s, warp 1 combines them (group_lane_combine<32>: thread t's lanes t + 32m, shuffles only,
// so no block barrier waits on warp 0), then (x*scale)*w. `x` holds batch 0 already when
// `loaded`. Named barrier 1 (warps 1..7) orders lane_s and nscale_s between rows.
template <int NHC, int FB>
__device__ __forceinline__ void hc_fin_row(const hc_pre_launch& a, int r, const float* w, int t,
                                           float4 (&x)[2][FB][NHC], bool loaded, double* lane_s,
                                           float* nscale_s) {
    const int n = a.n_embd;
    float* xin = a.x_in + std::int64_t(r) * a.x_in_stride;
    const bool vec = n % reduce_chunk == 0 && a.x_in_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0 &&
                     reinterpret_cast<std::uintptr_t>(a.x_in) % 16 == 0;
    const bool norm = a.norm_weight != nullptr;
    const int per_lane = ((n + reduce_chunk - 1) / reduce_chunk + reduce_lanes - 1) / reduce_lanes;
    const int batches = (per_lane + FB - 1) / FB;
    float keep[2][FB][reduce_chunk];  // batch 0's x_in, for the norm's last pass
    double acc[2] = {0.0, 0.0};
    // f(j, i, c) for each chunk c of batch kb on thread t's lanes (j: the lane, i: its place).
    auto each_chunk = [&](int kb, auto&& f) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (!hc_fin_owns(t, j)) continue;
#pragma unroll
            for (int i = 0; i < FB; ++i) {
                const int c = hc_fin_lane(t, j) + reduce_lanes * (FB * kb + i);
                if (c * reduce_chunk < n) f(j, i, c);
            }
        }
    };
    for (int kb = 0; kb < batches; ++kb) {
        if (kb > 0 || !loaded) hc_fin_load<NHC, FB>(a, r, t, kb, vec, x);
        each_chunk(kb, [&](int j, int i, int c) {
            float y[reduce_chunk];
#pragma unroll
            for (int e = 0; e < reduce_chunk; ++e) {
                float xv[NHC];
#pragma unroll
                for (int h = 0; h < NHC; ++h) xv[h] = float4_at(x[j][i][h], e);
                y[e] = hc_weighted_sum(xv, 1, w, NHC);
            }
            hc_store_chunk(xin, c, n, y, vec);
            if (norm) acc[j] = chunk_partial(acc[j], n - c * reduce_chunk, [&](int e) { return square_f64(y[e]); });
            if (kb == 0) {
#pragma unroll
                for (int e = 0; e < reduce_chunk; ++e) keep[j][i][e] = y[e];
            }
        });
    }
    if (!norm) return;
    float* out = a.norm_out + std::int64_t(r) * a.norm_stride;
    const bool vec_n = vec && a.norm_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.norm_out) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(a.norm_weight) % 16 == 0;
#pragma unroll
    for (int j = 0; j < 2; ++j)
        if (hc_fin_owns(t, j)) lane_s[hc_fin_lane(t, j)] = acc[j];
    // Batch 0's weights in flight across the combine.
    float4 wk[2][FB];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < FB; ++i)
            wk[j][i] = hc_fin_owns(t, j) ? load_chunk(a.norm_weight, hc_fin_lane(t, j) + reduce_lanes * i, n, vec_n)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float sc = hc_fin_norm_scale(t, n, a.norm_eps, lane_s, nscale_s);
    for (int kb = 0; kb < batches; ++kb) {
        each_chunk(kb, [&](int j, int i, int c) {
            // Later batches read back this thread's own x_in stores.
            const float4 q = kb == 0 ? make_float4(keep[j][i][0], keep[j][i][1], keep[j][i][2], keep[j][i][3])
                                     : load_chunk(xin, c, n, vec);
            const float4 wv = kb == 0 ? wk[j][i] : load_chunk(a.norm_weight, c, n, vec_n);
            float y[reduce_chunk];
#pragma unroll
            for (int e = 0; e < reduce_chunk; ++e) y[e] = mul_rn(mul_rn(float4_at(q, e), sc), float4_at(wv, e));
            hc_store_chunk(out, c, n, y, vec_n);
        });
    }
}

// The staged finish (n_hc <= 4, n_embd <= 4096, 16-byte rows): x_in by chunks spread evenly over
// warps 1..7 (thread t the chunks t + 224k, k < 5, all 20 stream loads in one round trip), then
// the norm's lane sums from shared memory. Owning the norm's lanes (hc_fin_row) gave threads
// 0..31 two lanes, 32 loads in 4 dependent batches under the 144-register cap: 0.6-0.9 us an
// x_in batch and 0.5 a norm-write batch (H100 globaltimer probe, bench/NOTES.md thirty-ninth
// session). The values and their orders are hc_fin_row's: x_in per element, each lane's chunks
// in index order, the same combine, (x*scale)*w.
inline constexpr int hc_fin_stage_floats = 4096;
inline constexpr int hc_fin_stage_k = (hc_fin_stage_floats / reduce_chunk + hc_fin_threads - 1) / hc_fin_threads;
// The tail's float4s: the fifth chunk's streams of threads 0..127 (hc_pre_kernel's stage_s, dead
// by the finish).
inline constexpr int hc_fin_tail_threads = hc_fin_stage_floats / reduce_chunk - hc_fin_threads * (hc_fin_stage_k - 1);

template <int NHC>
__host__ __device__ __forceinline__ bool hc_fin_stageable(const hc_pre_launch& a) {
    auto al = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    const bool rows_ok = a.n_embd % reduce_chunk == 0 && a.n_embd <= hc_fin_stage_floats && al(a.X) &&
                         (a.post_F == nullptr || al(a.post_Y)) && al(a.x_in) && a.x_in_stride % 4 == 0;
    const bool norm_ok = a.norm_weight == nullptr ||
                         (al(a.norm_weight) && al(a.norm_out) && a.norm_stride % 4 == 0);
    return NHC <= 4 && rows_ok && norm_ok;
}

// Row r's stream chunks of thread t: x[k][h] is stream h of chunk t + 224k for k < 4 (zero past
// the row); the fifth chunk's streams (threads 0..127 at n_embd 4096) go to `tail` by cp.async,
// so that all 20 loads are in flight at once without 80 registers (at the 144-register cap of
// hc_pre_kernel that spilled). Through L2 (ld.cg / cp.async.cg): with hc post folded in, the
// group's blocks stored that state in this launch.
inline constexpr int hc_fin_reg_k = hc_fin_stage_k - 1;

template <int NHC>
__device__ __forceinline__ void hc_fin_stage_load(const hc_pre_launch& a, int r, int t,
                                                  float4 (&x)[hc_fin_reg_k][NHC], float4* tail) {
    const float* X = (a.post_F != nullptr ? a.post_Y : a.X) + std::int64_t(r) * a.n_flat();
    const int n_chunks = a.n_embd / reduce_chunk;
#pragma unroll
    for (int k = 0; k < hc_fin_reg_k; ++k) {
        const int c = t + hc_fin_threads * k;
#pragma unroll
        for (int h = 0; h < NHC; ++h)
            x[k][h] = c < n_chunks ? __ldcg(reinterpret_cast<const float4*>(X + std::int64_t(h) * a.n_embd) + c)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const int c = t + hc_fin_threads * hc_fin_reg_k;
    if (c < n_chunks) {
#pragma unroll
        for (int h = 0; h < NHC; ++h)
            cp_async::zfill<16>(tail + t * NHC + h, reinterpret_cast<const float4*>(X + std::int64_t(h) * a.n_embd) + c, true);
    }
    cp_async::commit();
}

template <int NHC>
__device__ __forceinline__ void hc_fin_row_staged(const hc_pre_launch& a, int r, const float* w, int t,
                                                  float4 (&x)[hc_fin_reg_k][NHC], float4* tail, bool loaded,
                                                  float4* xs, double* lane_s, float* nscale_s) {
    const int n = a.n_embd, n_chunks = n / reduce_chunk;
    if (!loaded) hc_fin_stage_load<NHC>(a, r, t, x, tail);
    float g[NHC];
#pragma unroll
    for (int h = 0; h < NHC; ++h) g[h] = w[h];
    float4* xin = reinterpret_cast<float4*>(a.x_in + std::int64_t(r) * a.x_in_stride);
    const bool norm = a.norm_weight != nullptr;
#pragma unroll
    for (int k = 0; k < hc_fin_stage_k; ++k) {
        const int c = t + hc_fin_threads * k;
        float4 xk[NHC];
        if (k < hc_fin_reg_k) {
#pragma unroll
            for (int h = 0; h < NHC; ++h) xk[h] = x[k < hc_fin_reg_k ? k : 0][h];
        } else {
            cp_async::wait<0>();  // this thread's own copies: visible to it without a barrier
#pragma unroll
            for (int h = 0; h < NHC; ++h) xk[h] = c < n_chunks ? tail[t * NHC + h] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float v[reduce_chunk];
#pragma unroll
        for (int e = 0; e < reduce_chunk; ++e) {
            float xv[NHC];
#pragma unroll
            for (int h = 0; h < NHC; ++h) xv[h] = float4_at(xk[h], e);
            v[e] = hc_weighted_sum(xv, 1, g, NHC);
        }
        const float4 y = make_float4(v[0], v[1], v[2], v[3]);
        if (c < n_chunks) {
            xin[c] = y;
            if (norm) xs[c] = y;
        }
    }
    if (!norm) return;
    // The weights' round trip overlaps the lane sums and the combine.
    const float4* nw = reinterpret_cast<const float4*>(a.norm_weight);
    float4 wk[hc_fin_stage_k];
#pragma unroll
    for (int k = 0; k < hc_fin_stage_k; ++k) {
        const int c = t + hc_fin_threads * k;
        wk[k] = c < n_chunks ? __ldg(nw + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(hc_fin_threads) : "memory");
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        if (!hc_fin_owns(t, j)) continue;
        const int l = hc_fin_lane(t, j);
        // A lane's chunks (4 at most) read together, then added in index order.
        constexpr int per_lane = hc_fin_stage_floats / reduce_chunk / reduce_lanes;
        float4 q[per_lane];
#pragma unroll
        for (int m = 0; m < per_lane; ++m) {
            const int c = l + reduce_lanes * m;
            q[m] = c < n_chunks ? xs[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        double acc = 0.0;
#pragma unroll
        for (int m = 0; m < per_lane; ++m)
            if (l + reduce_lanes * m < n_chunks)
                acc = add_of(add_of(add_of(add_of(acc, square_f64(q[m].x)), square_f64(q[m].y)), square_f64(q[m].z)),
                             square_f64(q[m].w));
        lane_s[l] = acc;
    }
    const float sc = hc_fin_norm_scale(t, n, a.norm_eps, lane_s, nscale_s);
    float4* out = reinterpret_cast<float4*>(a.norm_out + std::int64_t(r) * a.norm_stride);
#pragma unroll
    for (int k = 0; k < hc_fin_stage_k; ++k) {
        const int c = t + hc_fin_threads * k;
        if (c < n_chunks) {
            const float4 q = xs[c];
            const float4 wv = wk[k];
            out[c] = make_float4(mul_rn(mul_rn(q.x, sc), wv.x), mul_rn(mul_rn(q.y, sc), wv.y),
                                 mul_rn(mul_rn(q.z, sc), wv.z), mul_rn(mul_rn(q.w, sc), wv.w));
        }
    }
}

// The Sinkhorn (n_hc <= 4): each half-warp takes one row of the group (two rows per round). Lane
// k = i*n_hc + j of it forms M[i][j]'s row softmax (the exps side by side, one a lane; row sums
// gathered by shuffles), then every lane of the half gathers the whole matrix and runs the
// passes in registers, each pass's n_hc sums side by side with their reciprocals by rcp_rn_fast
// (no division's check-and-branch between them). Every value goes through core/
// hyper_connection.hpp's operations in hc_split_sinkhorn's order; a sum outside rcp_rn_fast_ok's
// range (never with finite logits and eps > 2^-125) sends the row to hc_split_sinkhorn itself.
// (A lane per M[i][j] through all 39 passes, its row and column gathered by shuffles each pass,
// spent ~3.1 us of a one-row launch, H100 probe; one lane per row with div_rn ~10 us; the whole
// Sinkhorn on one lane, the exps included, ~7.2 us.)
inline constexpr int hc_sink_lanes = 16;

// A row whose pass sums left rcp_rn_fast's range: core/hyper_connection.hpp's Sinkhorn itself.
// Out of line: never taken with finite logits, it was a fifth of the one-row kernel's code.
template <int NHC>
__device__ __noinline__ void hc_sinkhorn_reference(const float* mix, const float* scale, const float* base, int iters,
                                                   float eps, float* comb_out) {
    const hc_split sp = hc_split_sinkhorn(mix, scale, base, NHC, iters, eps);
#pragma unroll
    for (int q = 0; q < NHC * NHC; ++q) comb_out[q] = sp.comb[q];
}

template <int NHC>
__device__ __forceinline__ void hc_sinkhorn_lanes(const hc_pre_launch& a, int r0, int rows,
                                                  const float (*mix_s)[hc_max_mix],
                                                  const float (*w_s)[hc_split::max_hc], int lane) {
    constexpr int E = NHC * NHC;
    const int half = lane / hc_sink_lanes, k = lane % hc_sink_lanes, i = k / NHC;
    const float eps = a.hc_eps;
    auto gather = [&](float v, int src) { return __shfl_sync(0xffffffffu, v, src, hc_sink_lanes); };
    for (int rb = 0; rb < rows; rb += 2) {
        const int rr = min(rb + half, rows - 1);  // an idle half repeats the last row, unwritten
        const float* mix = mix_s[rr];
        // Row softmax of the logits (max from -1e30 by '>', exp, 1/sum, +eps).
        float m = k < E ? hc_comb_logit(mix[2 * NHC + k], a.scale[2], a.base[2 * NHC + k]) : 0.0f;
        float mx = -1e30f;
#pragma unroll
        for (int jj = 0; jj < NHC; ++jj) {
            const float v = gather(m, i * NHC + jj);
            if (v > mx) mx = v;
        }
        m = exp_f32(sub_rn(m, mx));
        float sum = 0.0f;
#pragma unroll
        for (int jj = 0; jj < NHC; ++jj) sum = add_rn(sum, gather(m, i * NHC + jj));
        m = add_rn(mul_rn(m, div_rn(1.0f, sum)), eps);
        float M[NHC][NHC];
#pragma unroll
        for (int ii = 0; ii < NHC; ++ii)
#pragma unroll
            for (int jj = 0; jj < NHC; ++jj) M[ii][jj] = gather(m, ii * NHC + jj);
        // One pass: M[i][j] *= 1/(sum + eps), the sums along rows (by_row) or columns.
        bool ok = true;
        auto pass = [&](bool by_row) {
            float f[NHC];
#pragma unroll
            for (int p = 0; p < NHC; ++p) {
                float sum = 0.0f;
#pragma unroll
                for (int q = 0; q < NHC; ++q) sum = add_rn(sum, by_row ? M[p][q] : M[q][p]);
                f[p] = add_rn(sum, eps);
                ok &= rcp_rn_fast_ok(f[p]);  // not &&: its branches split each pass into blocks
                f[p] = rcp_rn_fast(f[p]);
            }
#pragma unroll
            for (int ii = 0; ii < NHC; ++ii)
#pragma unroll
                for (int jj = 0; jj < NHC; ++jj) M[ii][jj] = mul_rn(M[ii][jj], f[by_row ? ii : jj]);
        };
        // One column pass, then iters-1 (row, column) passes.
        const int iters = a.iters > 1 ? a.iters : 1;
        for (int it = 0; it < iters; ++it) {
            if (it > 0) pass(true);
            pass(false);
        }
        if (rb + half >= rows) continue;
        float* out = a.split + std::int64_t(r0 + rr) * (2 * NHC + E);
        if (k < NHC) {
            out[k] = w_s[rr][k];  // the pre gate (hc_pre_gate), formed with the partial sums
            out[NHC + k] = hc_post_gate(mix[NHC + k], a.scale[1], a.base[NHC + k]);
        }
        if (k != 0) continue;
        if (!ok) {
            hc_sinkhorn_reference<NHC>(mix, a.scale, a.base, a.iters, eps, out + 2 * NHC);
            continue;
        }
#pragma unroll
        for (int ii = 0; ii < NHC; ++ii)
#pragma unroll
            for (int jj = 0; jj < NHC; ++jj) out[2 * NHC + ii * NHC + jj] = M[ii][jj];
    }
}

// The group's finish, on the block that completed it (every block's partials are visible).
// Out of line and independent of the group size (rows <= hc_max_group_rows), so that it
// compiles once per NHC rather than once per kernel: it holds the Sinkhorn and x_in, the larger
// part of the code.
// Stage: the staged x_in (hc_fin_row_staged) where the row allows it, its tail in `stage`
// (hc_fin_tail_threads * NHC float4s); one-row groups only (at the 128-register cap of larger
// groups its loads spill).
// StagedOnly (decode's folded kernel, hc_pre_kernel's Folded): the launch checked hc_fin_stageable,
// so only the staged form is compiled.
// The body reads `a` where it is: inlined into a kernel, its fields are the kernel's parameters.
template <int NHC, int FB, bool Stage, bool StagedOnly = false>
__device__ __forceinline__ void hc_finish_body(const hc_pre_launch& a, int r0, int rows, float4* stage) {
    __shared__ float mix_s[hc_max_group_rows][hc_max_mix];
    __shared__ float w_s[hc_max_group_rows][hc_split::max_hc];
    __shared__ double lane_s[reduce_lanes];
    __shared__ float nscale_s;
    const int n_hc = NHC, n_mix = a.n_mix(), n_seg = a.segments();
    const int tid = int(threadIdx.x);
    // Thread p = (row, output) adds that output's partials in segment order, from 0.0f; the
    // (row, output) runs are contiguous in the scratch, so every load of a batch is in flight.
    const float* part = a.partials + hc_partial_index(r0, 0, 0, n_mix, n_seg);
    const bool vec = n_seg % 4 == 0 && reinterpret_cast<std::uintptr_t>(part) % 16 == 0;
    auto sum_partials = [&](int p) {
        const float* src = part + std::int64_t(p) * n_seg;
        float acc = 0.0f;
        // Whole batches as 16-byte loads (8 a batch on flash), all issued before the first add:
        // as 32 scalar loads they were not all in flight (BM_hc_post_pre_norm/1 13.36 -> 12.37 us).
        const int n_vec = vec ? n_seg / hc_sum_batch * hc_sum_batch : 0;
        for (int s0 = 0; s0 < n_vec; s0 += hc_sum_batch) {
            float4 v[hc_sum_batch / 4];
#pragma unroll
            for (int k = 0; k < hc_sum_batch / 4; ++k) v[k] = __ldcg(reinterpret_cast<const float4*>(src + s0) + k);
#pragma unroll
            for (int k = 0; k < hc_sum_batch / 4; ++k)
                acc = add_rn(add_rn(add_rn(add_rn(acc, v[k].x), v[k].y), v[k].z), v[k].w);
        }
        for (int s0 = n_vec; s0 < n_seg; s0 += hc_sum_batch) {
            float v[hc_sum_batch];
#pragma unroll
            for (int k = 0; k < hc_sum_batch; ++k) v[k] = s0 + k < n_seg ? __ldcg(src + s0 + k) : 0.0f;
#pragma unroll
            for (int k = 0; k < hc_sum_batch; ++k)
                if (s0 + k < n_seg) acc = add_rn(acc, v[k]);
        }
        const int rr = p / n_mix, o = p % n_mix;
        mix_s[rr][o] = acc;
        if (o < n_hc)
            w_s[rr][o] = a.output_mix ? hc_output_weight(acc, a.scale[0], a.base[o], a.hc_eps)
                                      : hc_pre_gate(acc, a.scale[0], a.base[o], a.hc_eps);
    };
    // Warp 0 (the sums of p < 32, then the Sinkhorn) and warps 1..7 (the sums of p >= 32, then the
    // stream loads, x_in and the norm) run in separate branches that meet at named barrier 2. When
    // one path ran both the sums and the loads, the stream registers were live across the sums
    // and ptxas sank each partial load down to its add: ~10 serial L2 round trips on warp 0.
    if (tid < 32) {
        for (int p = tid; p < rows * n_mix; p += hc_threads) sum_partials(p);
        asm volatile("bar.sync 2, %0;" ::"r"(hc_threads) : "memory");
        if (a.output_mix) return;
        if constexpr (NHC * NHC <= hc_sink_lanes) {
            hc_sinkhorn_lanes<NHC>(a, r0, rows, mix_s, w_s, tid);
            return;
        }
        // The Sinkhorn of row `tid` (registers: n_hc a constant), written for hc post.
        if (tid >= rows) return;
        float mix[hc_max_mix];
#pragma unroll
        for (int o = 0; o < 2 * NHC + NHC * NHC; ++o) mix[o] = mix_s[tid][o];
        const hc_split sp = hc_split_sinkhorn(mix, a.scale, a.base, n_hc, a.iters, a.hc_eps);
        float* out = a.split + std::int64_t(r0 + tid) * n_mix;
#pragma unroll
        for (int h = 0; h < NHC; ++h) {
            out[h] = sp.pre[h];
            out[n_hc + h] = sp.post[h];
        }
#pragma unroll
        for (int k = 0; k < NHC * NHC; ++k) out[2 * n_hc + k] = sp.comb[k];
        return;
    }
    // A staged group is one row of at most 2*4 + 16 outputs: warp 0 sums them all.
    static_assert(!StagedOnly || 2 * NHC + NHC * NHC <= 32);
    if constexpr (!StagedOnly) {
        for (int p = tid; p < rows * n_mix; p += hc_threads) sum_partials(p);
    }
    // The first row's stream loads do not depend on the gates: their round trip overlaps warp 0's.
    if constexpr (Stage && NHC <= 4) {
        if (StagedOnly || hc_fin_stageable<NHC>(a)) {
            __shared__ float4 xs[hc_fin_stage_floats / reduce_chunk];
            float4 x[hc_fin_reg_k][NHC];
            hc_fin_stage_load<NHC>(a, r0, tid - 32, x, stage);
            asm volatile("bar.sync 2, %0;" ::"r"(hc_threads) : "memory");
            for (int rr = 0; rr < rows; ++rr)
                hc_fin_row_staged<NHC>(a, r0 + rr, w_s[rr], tid - 32, x, stage, rr == 0, xs, lane_s, &nscale_s);
            return;
        }
    }
    if constexpr (StagedOnly) return;
    float4 x[2][FB][NHC];
    const bool vec_x = a.n_embd % reduce_chunk == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0 &&
                       a.x_in_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.x_in) % 16 == 0;
    hc_fin_load<NHC, FB>(a, r0, tid - 32, 0, vec_x, x);
    asm volatile("bar.sync 2, %0;" ::"r"(hc_threads) : "memory");
    for (int rr = 0; rr < rows; ++rr) hc_fin_row<NHC, FB>(a, r0 + rr, w_s[rr], tid - 32, x, rr == 0, lane_s, &nscale_s);
}

// Out of line for the groups of several rows and the chunk kernel (one copy per NHC).
template <int NHC, int FB, bool Stage>
__device__ __noinline__ void hc_finish_group(const hc_pre_launch& a_param, int r0, int rows, float4* stage) {
    // A copy, which the call passes by value: read through the reference (a generic pointer to
    // the kernel's parameters) every field was a generic load, issued behind the branch before it
    // and loaded again after each global store (~2 us at the start of a one-row finish).
    const hc_pre_launch a = a_param;
    hc_finish_body<NHC, FB, Stage>(a, r0, rows, stage);
}

// NHC: n_hc as a constant, so that the finish's loops unroll and the Sinkhorn's arrays live in
// registers (the same function, the same operations).
// The register cap of hc pre. Groups of several rows (prefill) hold two blocks per SM at n_hc <= 4
// (128 registers), one above. A one-row group's block (decode) took 246 registers, a whole SM's
// file: under PDL it landed only on an SM that every block of the launch before had left (a Q8_0
// matvec, 8 blocks of 127 registers to an SM), so its early weight loads started late, and hc pre
// after out_b ended ~6 us later than after the MoE finish's 16 blocks (H100 timeline). At 144 it
// lands beside three matvec blocks (n_hc 3 and 4; n_hc 1 spills there, 8 needs more).
template <int RB, int NHC>
inline constexpr int hc_pre_max_regs = RB > 1 ? (NHC > 4 ? 255 : 128) : (NHC == 3 || NHC == 4 ? 144 : 255);

// Folded (decode: one-row groups with hc post folded in and the staged finish, which the launch
// checked): only that path is compiled. The general one-row kernel carried every form (unfolded
// scales, unstaged dots and finish), 170 KB of code against this one's 104; the code is fetched
// cold at every launch of the decode step (bench/NOTES.md, fifty-first session).
template <int RB, int NHC, bool Folded = false>
__global__ void __maxnreg__((hc_pre_max_regs<RB, NHC>)) hc_pre_kernel(const __grid_constant__ hc_pre_launch a, int capacity) {
    static_assert(hc_threads % RB == 0 && hc_threads / RB >= 32 && RB <= hc_max_group_rows);
    static_assert(!Folded || (RB == 1 && NHC <= 4));
    __shared__ double scratch[hc_threads];
    __shared__ float scale_s[RB];
    __shared__ bool last_s;
    __shared__ float4 stage_s[RB == 1 ? hc_stage_chunks : 1];
    __shared__ hc_split post_s;  // the row's split of the hc post folded in (one-row groups)
    const int group = int(blockIdx.y), r0 = group * RB;
    const int nf = a.n_flat(), n_seg = a.segments(), n_mix = a.n_mix();
    const hc_segment_run run = hc_block_segments(int(blockIdx.x), int(gridDim.x), n_seg);
    const int n_items = (run.end - run.begin) * n_mix;  // (segment, output), output fastest; warp w takes w, w + 8, ...
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const bool vec = nf % 8 == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0;
    auto fn_of = [&](int item) {
        const int s = run.begin + item / n_mix, o = item % n_mix, e0 = s * f16_segment + lane * f16_lane_elems;
        return hc_load_fn(a.fn + std::int64_t(o) * nf + e0, max(0, min(f16_lane_elems, nf - e0)), vec);
    };
    hc_fn_lane wl[hc_fn_batch];
    auto load_batch = [&](int k0) {
#pragma unroll
        for (int k = 0; k < hc_fn_batch; ++k)
            if (warp + hc_warps * (k0 + k) < n_items) wl[k] = fn_of(warp + hc_warps * (k0 + k));
    };
    // The weights do not depend on the scale, nor on any earlier kernel: the first batch's (DRAM)
    // loads go out before the wait (core/launch.hpp) and overlap it and the scale.
    load_batch(0);
    pdl_enter();
    const int n_live = live_rows(a.n_rows, capacity);
    if (r0 >= n_live) return;  // the whole group: none of its blocks counts in
    const int rows = min(RB, n_live - r0);
    constexpr int seg_chunks = f16_segment / reduce_chunk;
    const bool staged = Folded || (RB == 1 && (run.end - run.begin) * seg_chunks <= hc_stage_chunks);
    const int c_begin = run.begin * seg_chunks;
    // hc post folded in (hc_pre_folds_post: one-row groups, every block staged).
    const bool fold = Folded || (RB == 1 && a.post_F != nullptr);
    if constexpr (RB == 1) {
        if (fold) {
            load_row_split<NHC>(a.post_split, r0, post_s);
            hc_row_scales_post<NHC>(a, r0, post_s, scratch, scale_s, stage_s, c_begin, run.end * seg_chunks);
        }
    }
    if constexpr (!Folded)
        if (!fold) hc_row_scales<RB>(a, r0, rows, scratch, scale_s, staged ? stage_s : nullptr, c_begin, run.end * seg_chunks);
    __syncthreads();
    if (staged) {
        // flat = x*scale once per block (every output's dot used to form its own products).
        const float sc = scale_s[0];
        for (int c = int(threadIdx.x); c < (run.end - run.begin) * seg_chunks; c += hc_threads) {
            const float4 q = stage_s[c];
            stage_s[c] = make_float4(mul_rn(q.x, sc), mul_rn(q.y, sc), mul_rn(q.z, sc), mul_rn(q.w, sc));
        }
        __syncthreads();
    }
    auto dot = [&](int item, const hc_fn_lane& w) {
        const int s = run.begin + item / n_mix, o = item % n_mix;
        const int e0 = s * f16_segment + lane * f16_lane_elems;
        const int cnt = max(0, min(f16_lane_elems, nf - e0));
        const auto* h0 = reinterpret_cast<const std::uint16_t*>(&w.lo);
        const auto* h1 = reinterpret_cast<const std::uint16_t*>(&w.hi);
        float wf[f16_lane_elems];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            wf[e] = f16_operand(h0[e]);
            wf[8 + e] = f16_operand(h1[e]);
        }
        if (staged) {
            // The block's flat values (x*scale) from the stage; e0 is a multiple of 16, so the
            // lane's 16 values are 4 whole chunks of it (those past the flat length: cnt).
            float fl[f16_lane_elems];
#pragma unroll
            for (int k = 0; k < f16_lane_elems / 4; ++k) {
                const float4 q = stage_s[e0 / reduce_chunk - c_begin + k];
                fl[4 * k] = q.x, fl[4 * k + 1] = q.y, fl[4 * k + 2] = q.z, fl[4 * k + 3] = q.w;
            }
            float q = 0.0f;
            if (cnt == f16_lane_elems) {
#pragma unroll
                for (int e = 0; e < f16_lane_elems; ++e) q = add_rn(q, mul_rn(wf[e], fl[e]));
            } else {
#pragma unroll
                for (int e = 0; e < f16_lane_elems; ++e)
                    if (e < cnt) q = add_rn(q, mul_rn(wf[e], fl[e]));
            }
#pragma unroll
            for (int off = f16_lanes / 2; off > 0; off /= 2) q = add_rn(q, __shfl_xor_sync(0xffffffffu, q, off));
            if (lane == 0) a.partials[hc_partial_index(r0, o, s, n_mix, n_seg)] = q;
        } else if constexpr (!Folded) {
            for (int rr = 0; rr < rows; ++rr) {
                const float* x = a.X + std::int64_t(r0 + rr) * nf + e0;
                float xs[f16_lane_elems];
                if (vec && cnt == f16_lane_elems) {
#pragma unroll
                    for (int k = 0; k < f16_lane_elems / 4; ++k) {
                        const float4 q = __ldg(reinterpret_cast<const float4*>(x) + k);
                        xs[4 * k] = q.x, xs[4 * k + 1] = q.y, xs[4 * k + 2] = q.z, xs[4 * k + 3] = q.w;
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < f16_lane_elems; ++e) xs[e] = e < cnt ? __ldg(x + e) : 0.0f;
                }
                const float sc = scale_s[rr];
                float q = 0.0f;
#pragma unroll
                for (int e = 0; e < f16_lane_elems; ++e)
                    if (e < cnt) q = add_rn(q, mul_rn(wf[e], mul_rn(xs[e], sc)));
#pragma unroll
                for (int off = f16_lanes / 2; off > 0; off /= 2) q = add_rn(q, __shfl_xor_sync(0xffffffffu, q, off));
                if (lane == 0) a.partials[hc_partial_index(r0 + rr, o, s, n_mix, n_seg)] = q;
            }
        }
    };
    for (int k0 = 0; warp + hc_warps * k0 < n_items; k0 += hc_fn_batch) {
        if (k0 > 0) load_batch(k0);
#pragma unroll
        for (int k = 0; k < hc_fn_batch; ++k)
            if (warp + hc_warps * (k0 + k) < n_items) dot(warp + hc_warps * (k0 + k), wl[k]);
    }
    // The last block to count in finishes the group (check_in: CUTLASS's semaphore pattern, the
    // finish reading the others' partials through L2).
    if (!check_in(&reinterpret_cast<unsigned*>(a.partials)[group], gridDim.x, &last_s)) return;
    static_assert(RB > 1 || hc_fin_tail_threads * 4 <= hc_stage_chunks);
    // One-row groups (decode) inline the finish: the out-of-line call's entry (the parameters
    // copied to local memory) was ~0.7 us of the launch (H100 probe).
    if constexpr (RB == 1) hc_finish_body<NHC, hc_fin_batch, true, Folded>(a, r0, rows, stage_s);
    else hc_finish_group<NHC, hc_fin_batch, false>(a, r0, rows, stage_s);
}

// NHC: n_hc as a constant, so that the stream values stay in registers.
template <int NHC>
__global__ void __launch_bounds__(hc_threads) hc_post_kernel(const __grid_constant__ hc_post_launch a, int capacity) {
    pdl_enter();
    __shared__ hc_split s;
    const int r = int(blockIdx.y);
    if (r >= live_rows(a.n_rows, capacity)) return;
    const int n_hc = NHC;
    const int d = int(blockIdx.x) * hc_threads + int(threadIdx.x);
    const bool live = d < a.n_embd;
    const std::int64_t base = std::int64_t(r) * n_hc * a.n_embd + d;
    // This thread's F and stream values first: they do not depend on the split, so their loads
    // and the split's are one round trip (after the barrier they would be a second).
    float f = 0.0f, xv[NHC];
#pragma unroll
    for (int i = 0; i < NHC; ++i) xv[i] = live ? a.X[base + std::int64_t(i) * a.n_embd] : 0.0f;
    if (live) f = a.F[r * a.F_stride + d];
    load_row_split<NHC>(a.split, r, s);
    __syncthreads();
    if (!live) return;
#pragma unroll
    for (int j = 0; j < n_hc; ++j) a.Y[base + std::int64_t(j) * a.n_embd] = hc_post_element(f, xv, 1, s, n_hc, j);
}

// hc post with the rows' scales (hc_post_launch::row_scale): one block per row, Y and its sum of
// squares as the folded decode form forms them (hc_row_scales_post, every chunk stored).
template <int NHC>
__global__ void __launch_bounds__(hc_threads) hc_post_scales_kernel(const __grid_constant__ hc_post_launch p, int capacity) {
    __shared__ double scratch[hc_threads];
    __shared__ hc_split s;
    pdl_enter();
    const int r = int(blockIdx.x);
    if (r >= live_rows(p.n_rows, capacity)) return;
    load_row_split<NHC>(p.split, r, s);
    hc_pre_launch a;
    a.X = p.X;
    a.n_embd = p.n_embd;
    a.n_hc = NHC;
    a.rms_eps = p.rms_eps;
    a.post_F = p.F;
    a.post_F_stride = p.F_stride;
    a.post_Y = p.Y;
    hc_row_scales_post<NHC, false>(a, r, s, scratch, p.row_scale + r, nullptr, 0, 0);
}

inline void check_rows(int capacity, const char* who) {
    require(capacity >= 1 && capacity <= hc_max_rows, std::string(who) + ": row capacity " + std::to_string(capacity));
}

template <int RB, int NHC>
inline void launch_hc_pre_rb(const hc_pre_launch& a, int capacity, dim3 grid, cudaStream_t stream) {
    if constexpr (RB == 1 && NHC <= 4) {
        // The caller checked hc_pre_folds_post: every block of a one-row group stages its segments.
        if (a.post_F && hc_fin_stageable<NHC>(a)) {
            launch_kernel("hc_pre_kernel", hc_pre_kernel<1, NHC, true>, grid, hc_threads, 0, stream, a, capacity);
            return;
        }
    }
    launch_kernel("hc_pre_kernel", hc_pre_kernel<RB, NHC>, grid, hc_threads, 0, stream, a, capacity);
}

}  // namespace detail

// Whether a row's scale thread can hold every stream of its d-chunks in one batch
// (hc_row_scales_post): n_embd a multiple of 4 x hc_threads, and n_hc * n_embd / (4 x hc_threads)
// chunks a thread at most hc_scale_batch. hc post can then form its rows' scales
// (hc_post_launch::row_scale).
inline bool hc_post_forms_scales(int n_embd, int n_hc) {
    constexpr int d_chunk = reduce_chunk * hc_threads;
    return n_embd > 0 && n_embd % d_chunk == 0 && n_hc >= 1 && n_hc <= hc_split::max_hc &&
           n_hc * (n_embd / d_chunk) <= detail::hc_scale_batch<1>;
}

// Whether a launch of this shape and capacity can fold hc post in (hc_pre_launch::post_F): one-row
// groups whose every block stages its segments, and a shape whose hc post can form the scales.
inline bool hc_pre_folds_post(int n_embd, int n_hc, int capacity) {
    if (!hc_post_forms_scales(n_embd, n_hc)) return false;
    const int segments = n_hc * n_embd / f16_segment;
    const hc_pre_grid g = hc_pre_geometry(capacity, segments);
    const int longest_run = (segments + g.blocks_per_group - 1) / g.blocks_per_group;
    return g.rows_per_block == 1 && longest_run * (f16_segment / reduce_chunk) <= detail::hc_stage_chunks;
}

// HC pre (output_mix = false) or the output head's mix (output_mix = true): one launch, compiled
// for n_hc = NHC (4: the model's; a caller with another stream count instantiates its own).
template <int NHC = 4>
inline void launch_hc_pre(const hc_pre_launch& a, int capacity, cudaStream_t stream) {
    static_assert(NHC >= 1 && NHC <= hc_split::max_hc);
    detail::check_rows(capacity, "hc_pre");
    require(a.n_hc == NHC, "hc_pre: n_hc = " + std::to_string(a.n_hc) + ", the launch is compiled for " + std::to_string(NHC));
    require(a.n_embd >= 1, "hc_pre: n_embd = " + std::to_string(a.n_embd));
    require(a.X && a.fn && a.scale && a.base && a.x_in && a.partials, "hc_pre: null input, output or scratch");
    require(a.output_mix || a.split, "hc_pre: null split buffer");
    require(reinterpret_cast<std::uintptr_t>(a.fn) % 16 == 0, "hc_pre: fn must be 16-byte aligned");
    require(!a.norm_weight || a.norm_out, "hc_pre: a folded norm without its output");
    if (a.post_F) {
        require(hc_pre_folds_post(a.n_embd, a.n_hc, capacity),
                "hc_pre: hc post cannot be folded in at n_embd " + std::to_string(a.n_embd) + ", n_hc " +
                    std::to_string(a.n_hc) + ", capacity " + std::to_string(capacity));
        require(a.post_split && a.post_Y && a.post_Y != a.X, "hc_pre: folded hc post without its split or Y, or Y aliasing X");
        const auto misaligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 != 0; };
        require(!misaligned(a.X) && !misaligned(a.post_F) && !misaligned(a.post_Y) && a.post_F_stride % 4 == 0,
                "hc_pre: folded hc post needs 16-byte aligned X, F, Y and an F stride that is a multiple of 4");
    }
    const hc_pre_grid g = hc_pre_geometry(capacity, a.segments());
    const dim3 grid(unsigned(g.blocks_per_group), unsigned(g.groups));
    switch (g.rows_per_block) {
        case 8: detail::launch_hc_pre_rb<8, NHC>(a, capacity, grid, stream); break;
        case 4: detail::launch_hc_pre_rb<4, NHC>(a, capacity, grid, stream); break;
        default: detail::launch_hc_pre_rb<1, NHC>(a, capacity, grid, stream); break;
    }
    cuda_check_launch("hc_pre");
}

template <int NHC = 4>
inline void launch_hc_post(const hc_post_launch& a, int capacity, cudaStream_t stream) {
    static_assert(NHC >= 1 && NHC <= hc_split::max_hc);
    detail::check_rows(capacity, "hc_post");
    require(a.n_hc == NHC, "hc_post: n_hc = " + std::to_string(a.n_hc) + ", the launch is compiled for " + std::to_string(NHC));
    require(a.F && a.X && a.split && a.Y && a.n_embd >= 1, "hc_post: null input or output");
    require(a.X != a.Y, "hc_post: Y may not alias X");
    if (a.row_scale) {
        require(hc_post_forms_scales(a.n_embd, a.n_hc),
                "hc_post: cannot form the rows' scales at n_embd " + std::to_string(a.n_embd) + ", n_hc " +
                    std::to_string(a.n_hc));
        const auto misaligned = [](const void* q) { return reinterpret_cast<std::uintptr_t>(q) % 16 != 0; };
        require(!misaligned(a.X) && !misaligned(a.F) && !misaligned(a.Y) && a.F_stride % 4 == 0,
                "hc_post: the scales form needs 16-byte aligned X, F, Y and an F stride that is a multiple of 4");
        launch_kernel("hc_post_kernel", detail::hc_post_scales_kernel<NHC>, dim3(unsigned(capacity)), hc_threads, 0,
                      stream, a, capacity);
        cuda_check_launch("hc_post scales");
        return;
    }
    const dim3 grid(unsigned((a.n_embd + hc_threads - 1) / hc_threads), unsigned(capacity));
    launch_kernel("hc_post_kernel", detail::hc_post_kernel<NHC>, grid, hc_threads, 0, stream, a, capacity);
    cuda_check_launch("hc_post");
}

}  // namespace ds4::kernels
