#pragma once
// The indexer of ratio-4 layers (model.md §2.6) for decode, many sequences per launch:
//   prepare  q_h = QAT(RoPE_tail64(q_raw_h, pos)) per head (q_raw = indexer.attn_q_b . qn, the F16
//            matvec of kernels/matvec.cuh run by the caller); w_h = w_raw_h * 1/sqrtf(128*n_head)
//            (w_raw = indexer.proj . xn, same matvec launch as the other attention-norm readers)
//   scores   score[c] = sum_{h ascending} relu(k_c . q_h) * w_h over the native E2M1 key rows
//   select   the top_k rows, lower index first on equal scores, as a mask and an ascending list
// Active only when n_comp > top_k (read from device memory); otherwise n_selected = 0 (every
// compressed row visible) and nothing else is written.
//
// Contract: exact. Prepared q/w and scores equal ref::indexer_queries/_head_weights/_scores bit
// for bit: each dot runs the reference's sequential order over the 128 dims in one thread (keys
// decoded as decode_indexer_row), and each score sums its heads in order in one thread. The
// selection is exact given the scores: a 4-pass radix select (8 bits per pass) over the
// order-preserving integer keys of the scores (-0 taken as +0, so equal floats tie), histograms
// spread over all blocks with integer atomics (order-free), then the rows above the threshold
// plus the first E rows equal to it in index order (block scans, block totals summed in order):
// the set of ref::indexer_top_k. NaN scores are outside the contract (the reference's order is
// not total there).
// Speed note: the exact scalar dots are compute bound (64 x 128 separate mul/add per key, about
// 30 us at 64K keys on an H200 vs ~1 us to read the keys); an int8 tensor-core path is exact too
// (E2M1 codes x 2 are integers, block sums fit int32) whenever the sequential float partial sums
// are representable, which a per-(key, head) exponent-spread check can prove, with this path as
// fallback; not done yet.
// Graph contract: positions and n_comp from device memory; grids from the capacities; scratch
// (histograms zero on entry and left zero, select state, block counts) from the caller.
// Shapes: n_head <= 64, head dim 128, any n_comp_capacity, top_k >= 1.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/kernels/compressor.cuh"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int indexer_dim = 128;
inline constexpr int indexer_max_heads = 64;
inline constexpr int indexer_threads = 256;
inline constexpr int indexer_score_keys = 32;       // keys per scores CTA (one per lane)
inline constexpr int indexer_select_items = 4;      // scores per thread in the select kernels
inline constexpr int indexer_select_block = indexer_threads * indexer_select_items;
inline constexpr int indexer_radix_passes = 4;

struct indexer_launch {
    int n_head = 0, top_k = 0;
    int n_seq = 0;             // sequence capacity (grid)
    int n_comp_capacity = 0;   // rows per sequence the scratch holds (grid)
    const std::uint32_t* pos = nullptr;    // [n_seq], compressor_idle = no token
    const std::int32_t* n_comp = nullptr;  // [n_seq] compressed rows now stored
    const float* q_raw = nullptr;          // q_raw + s * q_stride: n_head*128 values
    int q_stride = 0;
    const float* w_raw = nullptr;          // w_raw + s * w_stride: n_head values
    int w_stride = 0;
    float w_scale = 0;                     // 1.0f / sqrtf(float(128 * n_head)), as the reference
    rope_params rope;
    float* q = nullptr;                    // [n_seq][n_head*128] prepared queries
    float* w = nullptr;                    // [n_seq][n_head] prepared head weights
    kv_pages keys;                         // indexer key rows (indexer_row_layout{128})
    float* scores = nullptr;               // [n_seq][n_comp_capacity]
    unsigned* hist = nullptr;              // [n_seq][4][256], zero; left zero
    unsigned* sel_state = nullptr;         // [n_seq][5][2]
    unsigned* block_counts = nullptr;      // [n_seq][select_blocks][2]
    std::uint8_t* mask = nullptr;          // [n_seq][n_comp_capacity]: 1 = selected (rows < n_comp)
    std::int32_t* selected = nullptr;      // [n_seq][top_k]: selected rows, ascending
    std::int32_t* n_selected = nullptr;    // [n_seq]: top_k, or 0 when every row is visible
};

DS4_HD_INLINE int indexer_select_blocks(int n_comp_capacity) {
    return (n_comp_capacity + indexer_select_block - 1) / indexer_select_block;
}

namespace detail {

__device__ __forceinline__ bool indexer_active(const indexer_launch& a, int seq, int& n) {
    n = a.n_comp[seq];
    return a.pos[seq] != compressor_idle && n > a.top_k;
}

// Order-preserving key: larger float, larger key; -0 maps with +0.
__device__ __forceinline__ unsigned score_key(float s) {
    unsigned u = float_bits(s);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace detail

// One CTA per (head, sequence), one thread per dim.
__global__ void __launch_bounds__(indexer_dim) indexer_prepare_kernel(const __grid_constant__ indexer_launch a) {
    __shared__ float x[indexer_dim];
    const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
    int n;
    if (!detail::indexer_active(a, seq, n)) return;
    x[tid] = a.q_raw[std::size_t(seq) * a.q_stride + std::size_t(h) * indexer_dim + tid];
    if (tid == 0) a.w[std::size_t(seq) * a.n_head + h] = mul_rn(a.w_raw[std::size_t(seq) * a.w_stride + h], a.w_scale);
    __syncthreads();
    if (tid < 32) {
        float sn, cs;
        sincos_f32(rope_theta(a.rope, a.pos[seq], tid), &sn, &cs);
        rope_rotate(x[64 + 2 * tid], x[64 + 2 * tid + 1], cs, sn);
    }
    __syncthreads();
    static_assert(indexer_dim == 128, "the indexer's Hadamard is 128 wide");
    detail::hadamard128_block(x, tid);
    // E2M1 round trip per 32-value block: one warp per block.
    const float v = mul_rn(x[tid], 0.08838834764831845f);
    const float amax = detail::warp_max_num(max_num(0.0f, abs_exact(v)));
    const int e = ceil_log2(div_rn(max_num(amax, e2m1_amax_floor), e2m1_max));
    a.q[std::size_t(seq) * a.n_head * indexer_dim + std::size_t(h) * indexer_dim + tid] =
        mul_rn(e2m1_decode(e2m1_encode_scaled(v, exp2i(-e))), exp2i(e));
}

// 32 keys per CTA, lane = key; warp w computes heads w, w+8, ... (up to 8 per thread), each dot
// sequential over the 128 dims. Key rows sit in shared memory rotated by the key index so the
// 32 lanes reading dim i hit 32 banks; queries are broadcast.
__global__ void __launch_bounds__(indexer_threads) indexer_scores_kernel(const __grid_constant__ indexer_launch a) {
    __shared__ float qs[indexer_max_heads * indexer_dim];
    __shared__ float ks[indexer_score_keys * indexer_dim];  // later: products [head][key]
    const int seq = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int n;
    if (!detail::indexer_active(a, seq, n)) return;
    const int c0 = blockIdx.x * indexer_score_keys;
    if (c0 >= n) return;
    const float* q = a.q + std::size_t(seq) * a.n_head * indexer_dim;
    for (int i = tid; i < a.n_head * indexer_dim; i += indexer_threads) qs[i] = q[i];
    for (int f = tid; f < indexer_score_keys * indexer_dim; f += indexer_threads) {
        const int c = f / indexer_dim, i = f % indexer_dim;
        float v = 0.0f;
        if (c0 + c < n) {
            // decode_indexer_row: code * 2^e, then the F16 round.
            const std::uint8_t* row = kv_page_row(a.keys, seq, c0 + c);
            const std::uint8_t code = std::uint8_t((row[i / 2] >> (4 * (i & 1))) & 0xfu);
            const int e = static_cast<std::int8_t>(row[64 + i / e2m1_block_size]);
            v = f16_round(mul_rn(e2m1_decode(code), exp2i(e)));
        }
        ks[c * indexer_dim + ((i + c) & (indexer_dim - 1))] = v;
    }
    __syncthreads();
    constexpr int per_thread = indexer_max_heads / (indexer_threads / 32);
    float acc[per_thread];
    for (int k = 0; k < per_thread; ++k) acc[k] = 0.0f;
    const float* krow = ks + lane * indexer_dim;
#pragma unroll 4
    for (int i = 0; i < indexer_dim; ++i) {
        const float kv = krow[(i + lane) & (indexer_dim - 1)];
#pragma unroll
        for (int k = 0; k < per_thread; ++k) {
            const int h = warp + 8 * k;
            if (h < a.n_head) acc[k] = add_rn(acc[k], mul_rn(kv, qs[h * indexer_dim + i]));
        }
    }
    __syncthreads();
    float* prod = ks;  // [head][key]
    const float* w = a.w + std::size_t(seq) * a.n_head;
#pragma unroll
    for (int k = 0; k < per_thread; ++k) {
        const int h = warp + 8 * k;
        if (h < a.n_head) prod[h * indexer_score_keys + lane] = mul_rn(acc[k] > 0.0f ? acc[k] : 0.0f, w[h]);
    }
    __syncthreads();
    if (warp == 0 && c0 + lane < n) {
        float s = 0.0f;
        for (int h = 0; h < a.n_head; ++h) s = add_rn(s, prod[h * indexer_score_keys + lane]);
        a.scores[std::size_t(seq) * a.n_comp_capacity + c0 + lane] = s;
    }
}

namespace detail {

using select_scan = cub::BlockScan<unsigned, indexer_threads>;
using select_reduce = cub::BlockReduce<unsigned, indexer_threads>;

// From the histogram of pass p (digit at bits 24-8p) and the rank still to find, the digit that
// holds it and the rank inside that digit. All threads call; the result is in shared memory.
__device__ __forceinline__ void pick_digit(const unsigned* hist, unsigned krem, unsigned& digit_s, unsigned& krem_s,
                                           typename select_scan::TempStorage& tmp) {
    const int t = threadIdx.x;
    const unsigned cnt = hist[255 - t];
    unsigned incl;
    select_scan(tmp).InclusiveSum(cnt, incl);
    const unsigned excl = incl - cnt;
    if (excl < krem && incl >= krem) {
        digit_s = unsigned(255 - t);
        krem_s = krem - excl;
    }
    __syncthreads();
}

// The select state before pass `pass` (prefix of the threshold key, rank within it), from the
// state before the previous pass and its histogram. Written to shared memory.
__device__ __forceinline__ void select_state_for(const indexer_launch& a, int seq, int pass, unsigned& prefix_s,
                                                 unsigned& krem_s, typename select_scan::TempStorage& tmp) {
    if (pass == 0) {
        if (threadIdx.x == 0) {
            prefix_s = 0;
            krem_s = unsigned(a.top_k);
        }
        __syncthreads();
        return;
    }
    __shared__ unsigned digit_s;
    const unsigned* st = a.sel_state + (std::size_t(seq) * 5 + (pass - 1)) * 2;
    const unsigned prev_prefix = st[0], prev_krem = st[1];
    pick_digit(a.hist + (std::size_t(seq) * indexer_radix_passes + (pass - 1)) * 256, prev_krem, digit_s, krem_s, tmp);
    if (threadIdx.x == 0) prefix_s = prev_prefix | (digit_s << (24 - 8 * (pass - 1)));
    __syncthreads();
}

}  // namespace detail

// Pass `pass` of the radix select: histogram of the next 8 bits of the keys that match the
// prefix found so far. Block 0 records the state the pass started from.
__global__ void __launch_bounds__(indexer_threads)
    indexer_select_hist_kernel(const __grid_constant__ indexer_launch a, int pass) {
    __shared__ unsigned h[256];
    __shared__ unsigned prefix_s, krem_s;
    __shared__ typename detail::select_scan::TempStorage tmp;
    const int seq = blockIdx.y, tid = threadIdx.x;
    int n;
    if (!detail::indexer_active(a, seq, n)) return;
    const int base = blockIdx.x * indexer_select_block;
    if (base >= n) return;
    h[tid] = 0;
    detail::select_state_for(a, seq, pass, prefix_s, krem_s, tmp);
    if (blockIdx.x == 0 && tid == 0) {
        unsigned* st = a.sel_state + (std::size_t(seq) * 5 + pass) * 2;
        st[0] = prefix_s;
        st[1] = krem_s;
    }
    const unsigned mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    const int shift = 24 - 8 * pass;
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        if (c < n) {
            const unsigned key = detail::score_key(scores[c]);
            if ((key & mask) == prefix_s) atomicAdd(&h[(key >> shift) & 255u], 1u);
        }
    }
    __syncthreads();
    if (h[tid]) atomicAdd(&a.hist[(std::size_t(seq) * indexer_radix_passes + pass) * 256 + tid], h[tid]);
}

// After the last pass: the threshold key T and E, the number of rows equal to T to take; each
// block counts its rows above and equal to T.
__global__ void __launch_bounds__(indexer_threads) indexer_select_count_kernel(const __grid_constant__ indexer_launch a) {
    __shared__ unsigned prefix_s, krem_s;
    __shared__ typename detail::select_scan::TempStorage tmp;
    __shared__ typename detail::select_reduce::TempStorage rtmp;
    const int seq = blockIdx.y, tid = threadIdx.x;
    int n;
    if (!detail::indexer_active(a, seq, n)) return;
    const int base = blockIdx.x * indexer_select_block;
    if (base >= n) return;
    detail::select_state_for(a, seq, indexer_radix_passes, prefix_s, krem_s, tmp);
    const unsigned T = prefix_s;
    if (blockIdx.x == 0 && tid == 0) {
        unsigned* st = a.sel_state + (std::size_t(seq) * 5 + 4) * 2;
        st[0] = T;
        st[1] = krem_s;
    }
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    unsigned gt = 0, eq = 0;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        if (c < n) {
            const unsigned key = detail::score_key(scores[c]);
            gt += key > T;
            eq += key == T;
        }
    }
    gt = detail::select_reduce(rtmp).Sum(gt);
    __syncthreads();
    eq = detail::select_reduce(rtmp).Sum(eq);
    if (tid == 0) {
        unsigned* bc = a.block_counts + (std::size_t(seq) * indexer_select_blocks(a.n_comp_capacity) + blockIdx.x) * 2;
        bc[0] = gt;
        bc[1] = eq;
    }
}

// The mask and the ascending list: a row is taken when its key is above T, or equal to T and
// among the first E such rows in index order. Block 0 also clears the histograms.
__global__ void __launch_bounds__(indexer_threads) indexer_select_write_kernel(const __grid_constant__ indexer_launch a) {
    __shared__ typename detail::select_scan::TempStorage tmp;
    __shared__ typename detail::select_reduce::TempStorage rtmp;
    __shared__ unsigned gt_before_s, eq_before_s;
    const int seq = blockIdx.y, tid = threadIdx.x;
    int n;
    const bool active = detail::indexer_active(a, seq, n);
    if (blockIdx.x == 0 && tid == 0) a.n_selected[seq] = active ? a.top_k : 0;
    if (!active) return;
    const int base = blockIdx.x * indexer_select_block;
    if (base >= n) return;
    if (blockIdx.x == 0)
        for (int i = tid; i < indexer_radix_passes * 256; i += indexer_threads)
            a.hist[std::size_t(seq) * indexer_radix_passes * 256 + i] = 0;
    const unsigned* st = a.sel_state + (std::size_t(seq) * 5 + 4) * 2;
    const unsigned T = st[0], E = st[1];
    const unsigned* bc = a.block_counts + std::size_t(seq) * indexer_select_blocks(a.n_comp_capacity) * 2;
    unsigned gt_b = 0, eq_b = 0;
    for (int b = tid; b < int(blockIdx.x); b += indexer_threads) {
        gt_b += bc[2 * b];
        eq_b += bc[2 * b + 1];
    }
    gt_b = detail::select_reduce(rtmp).Sum(gt_b);
    __syncthreads();
    eq_b = detail::select_reduce(rtmp).Sum(eq_b);
    if (tid == 0) {
        gt_before_s = gt_b;
        eq_before_s = eq_b;
    }
    __syncthreads();
    const unsigned eq_before = eq_before_s;
    const unsigned sel_before = gt_before_s + (eq_before < E ? eq_before : E);
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    unsigned key[indexer_select_items];
    unsigned n_eq = 0;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        key[k] = c < n ? detail::score_key(scores[c]) : 0u;
        n_eq += c < n && key[k] == T;
    }
    unsigned eq_rank;
    detail::select_scan(tmp).ExclusiveSum(n_eq, eq_rank);
    eq_rank += eq_before;
    bool sel[indexer_select_items];
    unsigned n_sel = 0;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        sel[k] = false;
        if (c < n) {
            if (key[k] > T) sel[k] = true;
            else if (key[k] == T) sel[k] = eq_rank++ < E;
        }
        n_sel += sel[k];
    }
    __syncthreads();
    unsigned at;
    detail::select_scan(tmp).ExclusiveSum(n_sel, at);
    at += sel_before;
    std::uint8_t* mask = a.mask + std::size_t(seq) * a.n_comp_capacity;
    std::int32_t* list = a.selected + std::size_t(seq) * a.top_k;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        if (c < n) {
            mask[c] = sel[k] ? 1 : 0;
            if (sel[k]) list[at++] = c;
        }
    }
}

inline void check_indexer_launch(const indexer_launch& a) {
    require(a.n_head >= 1 && a.n_head <= indexer_max_heads && a.top_k >= 1 && a.n_seq >= 1 &&
                a.n_comp_capacity >= 1,
            "indexer: n_head " + std::to_string(a.n_head) + " (1..64), top_k " + std::to_string(a.top_k));
}

// The selection alone, over a.scores (radix passes, counts, write): 6 launches.
inline void launch_indexer_select(const indexer_launch& a, cudaStream_t stream) {
    check_indexer_launch(a);
    const dim3 grid(indexer_select_blocks(a.n_comp_capacity), a.n_seq);
    for (int pass = 0; pass < indexer_radix_passes; ++pass) {
        indexer_select_hist_kernel<<<grid, indexer_threads, 0, stream>>>(a, pass);
        cuda_check_launch("indexer_select_hist");
    }
    indexer_select_count_kernel<<<grid, indexer_threads, 0, stream>>>(a);
    cuda_check_launch("indexer_select_count");
    indexer_select_write_kernel<<<grid, indexer_threads, 0, stream>>>(a);
    cuda_check_launch("indexer_select_write");
}

// prepare, scores, select: 8 launches.
inline void launch_indexer(const indexer_launch& a, cudaStream_t stream) {
    check_indexer_launch(a);
    indexer_prepare_kernel<<<dim3(a.n_head, a.n_seq), indexer_dim, 0, stream>>>(a);
    cuda_check_launch("indexer_prepare");
    const int score_blocks = (a.n_comp_capacity + indexer_score_keys - 1) / indexer_score_keys;
    indexer_scores_kernel<<<dim3(score_blocks, a.n_seq), indexer_threads, 0, stream>>>(a);
    cuda_check_launch("indexer_scores");
    launch_indexer_select(a, stream);
}

}  // namespace ds4::kernels
