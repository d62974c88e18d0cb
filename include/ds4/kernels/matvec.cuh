#pragma once
// Quantized and half-precision matvec for decode and verify: y[r][o] = W[o] . x[r] for 1 to 16
// activation rows r, over up to 8 weight matrices that read the same input in one launch
// (q_a + kv + compressors + indexer proj; router + shared gate/up), or each its own column slice
// of one input (out_a's groups read their heads of o), optionally with the input's RMSNorm
// folded into the launch (q_b on q_a's output: the q_a_norm launch between them goes away).
//
// Contract: exact. Every output equals reference/matvec (format/row_dot.hpp order).
//   Q8_0 (tiled layout, format/tiled.hpp): x is quantized to Q8_0 activations (F32 scale,
//   round-half-even) inside the kernel, or read pre-quantized from its producer. Lane l of a
//   warp owns row 32t+l of a tile, so the sequential in-segment order runs in one lane; segments
//   are summed in the same lane (whole-row items) or, for matrices with few tiles, computed by
//   separate warps and summed in segment order by the warp that finishes last (an integer
//   counter decides who; no float atomics).
//   F16 (GGUF row-major): a warp per (row, 512-element segment), lanes as in the definition,
//   the butterfly as shuffles, segments summed in order through shared memory.
//   Folded RMSNorm (Q8_0): every CTA computes each live row's rms_scale in core/reduce.hpp's
//   lane order (64 threads: add_thread_chunk + group_lane_combine, the adds of rms_sum_squares)
//   and quantizes (x * scale) * w, the bits of reference/norm_rope's rms_norm; the first CTA also
//   stores that normalised row for later readers.
// Graph contract: no allocation, no host synchronisation; scratch (partials, counters) comes
// from the caller, counters start at zero and are left at zero; the grid is a function of the
// matrix shapes and the row capacity R only. n_rows is a launch value: a captured step passes
// n_rows = capacity. Rows are independent and nothing is indexed by an activation, so a live row's
// bits do not depend on what the idle rows of x hold (ds4-validate's matvec_graph rows check it).
// prepare_matvec(device) before capture.
// Shapes: in % 32 == 0 (Q8_0) or in % 16 == 0 (F16); any number of rows; n_rows <= 16; x rows,
// column offsets and the norm weight 16-byte aligned.
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/env_choice.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/half_at.cuh"
#include "ds4/kernels/quantize_q8_0_lanes.cuh"

namespace ds4::kernels {

inline constexpr int matvec_max_rows = 16;
inline constexpr int matvec_max_matrices = 8;
// Two warps per CTA: small matrices (q_a, kv: 256 warp items) then spread over 128 SMs instead of
// 32 (measured on the H200: q_a 4096->1024 took 12.7 us on 32 CTAs of 8 warps, 0.12 waves).
inline constexpr int matvec_warps = 2;
// Resident warps per SM the Q8_0 kernel is compiled for (the register cap: 65536 / (32 x this)).
// One row: 16 (128 registers), so the 2048-item split plans of out_a and out_b (16 items per
// SM) run as one wave; more rows need the registers for their partial sums: 12.
__host__ __device__ constexpr int matvec_min_warps(int rows) { return rows == 1 ? 16 : 12; }
// Split-K partials the finishing warp loads at once per row: 16 at one row (out_b's 16 segments
// in one round trip), fewer as the rows multiply (registers).
__host__ __device__ constexpr int matvec_finish_batch(int rows) { return rows >= 8 ? 4 : (rows >= 4 ? 8 : 16); }

enum class matvec_format { q8_0, f16 };

// One weight matrix of a launch, in its tiled layout (format/tiled.hpp).
struct matvec_matrix {
    const void* weights = nullptr;          // Q8_0 tiled quants, or F16 rows as in the GGUF (16-byte aligned)
    const std::uint16_t* scales = nullptr;  // Q8_0 tiled scales
    float* y = nullptr;                     // y[r * y_stride + o]
    // This matrix's input starts at column x_col of x (a multiple of 4): x[r * x_stride + x_col + i].
    int x_col = 0;
    // Q8_0 only: activations already quantized by their producer (split layout: int8 qs
    // [r * act_stride + i], F32 scales [r * (act_stride / 32) + b]); null = quantize x in-kernel.
    // The grouped output projection uses this: each group reads its own slice of the heads.
    const std::int8_t* act_qs = nullptr;
    const float* act_d = nullptr;
    int act_stride = 0;
    int rows = 0;
    int y_stride = 0;
    // Scratch for split matrices (segs_per_item < segments): [tiles][segments][R][32] floats
    // and [tiles] counters. Unused (may be null) when each item covers a whole row.
    float* partials = nullptr;
    unsigned* counters = nullptr;
};

struct matvec_launch {
    matvec_format format = matvec_format::q8_0;
    const float* x = nullptr;  // x[r * x_stride + i]
    int x_stride = 0;
    int n_rows = 1;            // live activation rows (<= R of the instantiation)
    int in = 0;
    // Q8_0 only, every matrix reading x whole (x_col 0, no act_qs): the matrices multiply
    // (x * rms_scale(x)) * norm_weight[i] instead of x; null = x as it is. The first CTA stores
    // that normalised input to x_normed[r * x_stride + i] too when x_normed is set.
    const float* norm_weight = nullptr;
    float norm_eps = 0.0f;
    float* x_normed = nullptr;
    int n_matrices = 0;
    matvec_matrix m[matvec_max_matrices];
    // Filled by plan_matvec:
    int segments = 0;
    // Whole-row plans on large matrices quantize x once per (persistent) CTA into shared memory;
    // split plans quantize each segment in the warp that needs it, overlapped with its loads.
    bool cta_quant = false;
    int f16_rpc = 1;  // F16: rows per CTA (f16_plan_rows)
    int f16_form = 0;  // F16: the kernel's form (f16_form() below); 0 = f16_form()'s choice
    int segs_per_item[matvec_max_matrices] = {};
    int item_begin[matvec_max_matrices + 1] = {};
};

namespace detail {

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

__device__ __forceinline__ int dot16(const int4& w, const int4& x, int acc) {
    acc = dp4a(w.x, x.x, acc);
    acc = dp4a(w.y, x.y, acc);
    acc = dp4a(w.z, x.z, acc);
    return dp4a(w.w, x.w, acc);
}

// Item -> (matrix, tile, first segment, end segment).
struct item_coords {
    int mat, tile, s0, s1;
};
__device__ __forceinline__ item_coords locate(const matvec_launch& a, int item) {
    int k = 0;
    while (k + 1 < a.n_matrices && item >= a.item_begin[k + 1]) ++k;
    const int local = item - a.item_begin[k];
    const int spi = a.segs_per_item[k];
    const int per_tile = (a.segments + spi - 1) / spi;
    item_coords c;
    c.mat = k;
    c.tile = local / per_tile;
    c.s0 = (local % per_tile) * spi;
    c.s1 = min(c.s0 + spi, a.segments);
    return c;
}

// Before pdl_wait (core/launch.hpp): the first weights of a warp's first item toward L2, so
// that they stream while the previous kernel finishes; a cap keeps the CTAs of a persistent grid
// from pushing more than ~13 MB ahead of their use (a 32 KB cap ran decode at 104.4 tok/s at 2K
// where 8 KB ran 108.2-109.3 on the H200, though on another machine instance: bench/NOTES.md).
inline constexpr std::size_t matvec_prefetch_bytes = 8192;

__device__ __forceinline__ void prefetch_item(const matvec_launch& a, int item) {
    if (item >= a.item_begin[a.n_matrices]) return;
    const item_coords c = locate(a, item);
    const matvec_matrix& m = a.m[c.mat];
    const int nb = a.in / 32, nb8 = (nb + 7) / 8 * 8;
    const int b0 = c.s0 * q8_0_segment_blocks, b1 = min(c.s1 * q8_0_segment_blocks, nb);
    const std::size_t q_bytes = std::size_t(b1 - b0) * 1024;  // a tile's block: 32 rows x 32 quants
    const std::size_t n = q_bytes < matvec_prefetch_bytes ? q_bytes : matvec_prefetch_bytes;
    prefetch_l2(static_cast<const std::uint8_t*>(m.weights) + (std::size_t(c.tile) * nb8 + b0) * 1024, n);
    // Their scales: 512 bytes per group of 8 blocks.
    prefetch_l2(m.scales + (std::size_t(c.tile) * (nb8 / 8) + b0 / 8) * 256, (n / 1024 + 7) / 8 * 512);
}

// Stores one lane's results for R rows, either directly or through the split-K scratch; the
// last warp to finish a tile sums every segment's partial in segment order.
template <int R>
__device__ __forceinline__ void finish_item(const matvec_launch& a, const item_coords& c, int lane,
                                            const float (&acc)[R], bool whole) {
    const matvec_matrix& m = a.m[c.mat];
    const int row = c.tile * tile_rows + lane;
    if (whole) {
        if (row < m.rows)
            for (int r = 0; r < R; ++r)
                if (r < a.n_rows) m.y[std::size_t(r) * m.y_stride + row] = acc[r];
        return;
    }
    // The warp's partial stores are released by lane 0's acq_rel add after the warp barrier (the
    // pattern of CUTLASS's split-K semaphore); __threadfence would be a sequentially consistent
    // MEMBAR.SC.GPU per item, stronger than the hand-off needs.
    __syncwarp();
    unsigned done = 0;
    if (lane == 0) {
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> counter(m.counters[c.tile]);
        done = counter.fetch_add(unsigned(c.s1 - c.s0), cuda::memory_order_acq_rel) + unsigned(c.s1 - c.s0);
    }
    done = __shfl_sync(0xffffffffu, done, 0);
    if (done != unsigned(a.segments)) return;
    __syncwarp();
    float total[R];
    for (int r = 0; r < R; ++r) total[r] = 0.0f;
    const float* p = m.partials + std::size_t(c.tile) * a.segments * R * 32;
    // The partials in batches whose loads are all issued before the first add (one at a time, the
    // loop over a run-time segment count was a chain of dependent L2 round trips on the tile's
    // last warp: out_b at 16 rows 83.7 -> 81.3 us on the H200, one row unchanged).
    constexpr int batch = matvec_finish_batch(R);
    for (int s0 = 0; s0 < a.segments; s0 += batch) {
        float v[batch][R];
#pragma unroll
        for (int k = 0; k < batch; ++k)
#pragma unroll
            for (int r = 0; r < R; ++r)
                v[k][r] = s0 + k < a.segments ? __ldcg(p + (std::size_t(s0 + k) * R + r) * 32 + lane) : 0.0f;
#pragma unroll
        for (int k = 0; k < batch; ++k)
            if (s0 + k < a.segments)
#pragma unroll
                for (int r = 0; r < R; ++r) total[r] = add_rn(total[r], v[k][r]);
    }
    if (row < m.rows)
        for (int r = 0; r < R; ++r)
            if (r < a.n_rows) m.y[std::size_t(r) * m.y_stride + row] = total[r];
    if (lane == 0) m.counters[c.tile] = 0;
}

// The 16 input values of row r at columns [col, col + 16) (col counted in x): x itself, or with
// a folded RMSNorm (x * scale) * w, the reference's two roundings in its order.
__device__ __forceinline__ void load_input_16(const matvec_launch& a, int r, int col, bool live,
                                              const float* norm_scale, float (&v)[16]) {
    load_16(a.x + std::size_t(r) * a.x_stride + col, live, v);
    if (a.norm_weight == nullptr || !live) return;
    float w[16];
    load_16(a.norm_weight + col, true, w);
    const float s = norm_scale[r];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = mul_rn(mul_rn(v[i], s), w[i]);
}

// The folded RMSNorm's per-row scales into norm_scale[R] (shared), every thread of the CTA
// taking part: thread t streams chunks t + 64m of the row as 16-byte loads, adds chunk m to its
// lane sum m % 4 (core/reduce.hpp's streamed order) and the block combines the 256 lane sums in
// the butterfly's order, so each scale equals rms_scale(x_r). Idle rows are skipped (their x may
// hold anything). The first CTA then stores the normalised live rows to x_normed.
template <int R>
__device__ __forceinline__ void norm_prologue(const matvec_launch& a, float* norm_scale, double* scratch) {
    constexpr int threads = matvec_warps * 32;
    constexpr int per = lanes_per_thread<threads>;
    const int t = int(threadIdx.x);
    for (int r = 0; r < R && r < a.n_rows; ++r) {
        const float* xr = a.x + std::size_t(r) * a.x_stride;
        double v[per] = {};
        // m = per*k + j, so chunk m's lane slot m % per is the constant j.
        for (int k = 0; (t + threads * per * k) * reduce_chunk < a.in; ++k) {
#pragma unroll
            for (int j = 0; j < per; ++j) {
                const int m = per * k + j;
                const float4 c = load_chunk(xr, t + threads * m, a.in, true);
                add_thread_chunk<threads>(v, t, m, a.in,
                                          [&](int i) { return square_f64(float4_at(c, i % reduce_chunk)); });
            }
        }
        const double ss = group_lane_combine<threads>(v, scratch, t);
        if (t == 0) norm_scale[r] = rms_scale_from_sum(ss, a.in, a.norm_eps);
    }
    __syncthreads();
    if (blockIdx.x != 0 || a.x_normed == nullptr) return;
    for (int r = 0; r < R && r < a.n_rows; ++r) {
        const float s = norm_scale[r];
        for (int c = t; c * reduce_chunk < a.in; c += threads) {
            const float4 x = reinterpret_cast<const float4*>(a.x + std::size_t(r) * a.x_stride)[c];
            const float4 w = reinterpret_cast<const float4*>(a.norm_weight)[c];
            reinterpret_cast<float4*>(a.x_normed + std::size_t(r) * a.x_stride)[c] =
                make_float4(mul_rn(mul_rn(x.x, s), w.x), mul_rn(mul_rn(x.y, s), w.y), mul_rn(mul_rn(x.z, s), w.z),
                            mul_rn(mul_rn(x.w, s), w.w));
        }
    }
}

template <int R>
__device__ __forceinline__ void store_partial(const matvec_launch& a, const item_coords& c, int s, int lane,
                                              const float (&seg)[R]) {
    float* p = a.m[c.mat].partials + (std::size_t(c.tile) * a.segments + s) * R * 32;
    for (int r = 0; r < R; ++r) __stcg(p + r * 32 + lane, seg[r]);
}

}  // namespace detail

// Quantizes this segment's activations (blocks [b0, b1) of R rows) into the warp's shared
// buffer: two lanes per 32-value block, the max is exact in any order, so this equals
// quantize_q8_0_act. Done per warp and per segment so it overlaps the weight loads already in
// flight, instead of a CTA-wide prologue that every CTA repeats over the whole input.
template <int R>
__device__ __forceinline__ void quantize_segment(const matvec_launch& a, int x_col, int b0, int b1, int lane,
                                                 const float* norm_scale, std::int8_t* sq, float* sd) {
    const int b = b0 + lane / 2, h = lane & 1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float v[16];
        detail::load_input_16(a, r, x_col + b * 32 + h * 16, b < b1 && r < a.n_rows, norm_scale, v);
        detail::quantize_half_block(v, sq + r * 512 + lane * 16, h == 0 ? sd + r * 16 + lane / 2 : nullptr);
    }
}

// Q8_0: lane l of a warp owns row 32t+l of a tile and streams its 16-byte halves; activation
// reads are warp-wide broadcasts from the warp's shared buffer (or from the producer's
// pre-quantized buffer in global memory). At least 12 warps per SM (<= 170 registers; 16 at one
// row, matvec_min_warps) keep enough 16-byte loads in flight to cover HBM latency, with room for R
// partial sums.
template <int R>
__global__ void __launch_bounds__(matvec_warps * 32, matvec_min_warps(R) / matvec_warps) matvec_q8_0_kernel(const __grid_constant__ matvec_launch a) {
    if (threadIdx.x % 32 == 0) detail::prefetch_item(a, int(blockIdx.x) * matvec_warps + int(threadIdx.x) / 32);
    pdl_enter();
    extern __shared__ int4 smem[];
    __shared__ float norm_scale[R];
    __shared__ double norm_scratch[matvec_warps * 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nb = a.in / 32;
    if (a.norm_weight) detail::norm_prologue<R>(a, norm_scale, norm_scratch);
    // cta_quant: int8 [R][in] then F32 [R][nb] for the whole input. Otherwise per warp: int8
    // [R][16 blocks][32] then F32 [R][16] for the segment in hand.
    auto* sq = reinterpret_cast<std::int8_t*>(smem) + (a.cta_quant ? 0 : warp * R * (512 + 64));
    auto* sd = reinterpret_cast<float*>(sq + (a.cta_quant ? R * a.in : R * 512));
    if (a.cta_quant) {
        // Two lanes per block as in quantize_segment, all warps of the CTA over all blocks.
        // Every lane of a warp runs every round (the pair max is a shuffle); rounds past the end
        // quantize zeros and write nothing.
        for (int base = 0; base < R * nb; base += blockDim.x / 2) {
            const int blk = base + int(threadIdx.x) / 2;
            const bool in_range = blk < R * nb;
            const int r = in_range ? blk / nb : 0, b = in_range ? blk % nb : 0, h = threadIdx.x & 1;
            const bool live = in_range && r < a.n_rows;
            float v[16];
            detail::load_input_16(a, r, b * 32 + h * 16, live, norm_scale, v);
            detail::quantize_half_block(v, in_range ? sq + std::size_t(r) * a.in + b * 32 + h * 16 : nullptr,
                                        in_range && h == 0 ? sd + r * nb + b : nullptr);
        }
        __syncthreads();
    }
    const q8_0_tiled_layout L{0, a.in, nb, (nb + 7) / 8 * 8, 0};
    const int total = a.item_begin[a.n_matrices];
    // G blocks of weight loads in flight per lane: 8 (256 B) for few rows; fewer when many rows'
    // partial sums need the registers (ptxas spilled at R=4 with 8).
    constexpr int G = R >= 16 ? 2 : (R >= 4 ? 4 : 8);
    for (int item = blockIdx.x * matvec_warps + warp; item < total; item += gridDim.x * matvec_warps) {
        const detail::item_coords c = detail::locate(a, item);
        const matvec_matrix& m = a.m[c.mat];
        const bool whole = c.s0 == 0 && c.s1 == a.segments;
        const bool pre = m.act_qs != nullptr;
        const auto* wq = static_cast<const int4*>(m.weights) + std::size_t(c.tile) * L.nb8 * 64 + lane;
        const auto* ws = reinterpret_cast<const int4*>(m.scales) + std::size_t(c.tile) * (L.nb8 / 8) * 32 + lane;
        float acc[R], seg[R];
        for (int r = 0; r < R; ++r) acc[r] = 0.0f;
        for (int s = c.s0; s < c.s1; ++s) {
            const int b0 = s * q8_0_segment_blocks;
            const int b1 = min(b0 + q8_0_segment_blocks, nb);
            // Activation rows of this segment: the warp's buffer, or the producer's blocks.
            const std::int8_t* qa = pre ? m.act_qs + b0 * 32 : (a.cta_quant ? sq + b0 * 32 : sq);
            const float* da = pre ? m.act_d + b0 : (a.cta_quant ? sd + b0 : sd);
            const std::size_t q_rs = pre ? std::size_t(m.act_stride) : (a.cta_quant ? std::size_t(a.in) : 512);
            const std::size_t d_rs = pre ? std::size_t(m.act_stride / 32) : (a.cta_quant ? std::size_t(nb) : 16);
            for (int r = 0; r < R; ++r) seg[r] = 0.0f;
            // At 16 warps a SM (one row) the segment's quantization runs before the first weight
            // loads are issued: with the loads in flight over it ptxas spills at 128 registers.
            constexpr bool quantize_first = matvec_min_warps(R) > 12;
            if (quantize_first && !pre && !a.cta_quant) {
                __syncwarp();
                quantize_segment<R>(a, m.x_col, b0, b1, lane, norm_scale, sq, sd);
                __syncwarp();
            }
            for (int g = b0; g < b1; g += G) {
                int4 wv[2 * G];
#pragma unroll
                for (int j = 0; j < 2 * G; ++j)
                    if (g + j / 2 < b1) wv[j] = __ldcs(wq + (std::size_t(g) * 2 + j) * 32);
                const int4 sc4 = __ldg(ws + (g / 8) * 32);
                if (!quantize_first && g == b0 && !pre && !a.cta_quant) {
                    __syncwarp();
                    quantize_segment<R>(a, m.x_col, b0, b1, lane, norm_scale, sq, sd);
                    __syncwarp();
                }
#pragma unroll
                for (int j = 0; j < G; ++j) {
                    const int b = g + j;
                    if (b >= b1) break;
                    const float wd = f16_operand(half_at(sc4, b % 8));
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const int4* xr = reinterpret_cast<const int4*>(qa + r * q_rs + (b - b0) * 32);
                        int isum = detail::dot16(wv[2 * j], xr[0], 0);
                        isum = detail::dot16(wv[2 * j + 1], xr[1], isum);
                        const float t = mul_rn(mul_rn(wd, da[r * d_rs + (b - b0)]), float(isum));
                        seg[r] = add_rn(seg[r], t);
                    }
                }
            }
            if (whole) {
                for (int r = 0; r < R; ++r) acc[r] = add_rn(acc[r], seg[r]);
            } else {
                detail::store_partial<R>(a, c, s, lane, seg);
            }
        }
        detail::finish_item<R>(a, c, lane, acc, whole);
    }
}

namespace detail {

// A lane's 16 F16 weights (two 16-byte words of a GGUF row, in memory order) as floats, by the
// conversion instruction (f16_operand: the products are all that consume them). f16_to_f32's NaN
// check and software path, inlined 16 times a pair, made the F16 matvec ~7,000 instructions long:
// 42% of its warp samples waited for instructions (ncu, H100), and it streamed at ~1 TB/s.
__device__ __forceinline__ void f16_lane_floats(const int4& lo, const int4& hi, float (&wf)[16]) {
    const unsigned words[8] = {unsigned(lo.x), unsigned(lo.y), unsigned(lo.z), unsigned(lo.w),
                               unsigned(hi.x), unsigned(hi.y), unsigned(hi.z), unsigned(hi.w)};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        wf[2 * i] = f16_operand(std::uint16_t(words[i] & 0xffffu));
        wf[2 * i + 1] = f16_operand(std::uint16_t(words[i] >> 16));
    }
}

// The same from memory: two 16-byte streaming loads at w (the MoE router's segments).
__device__ __forceinline__ void f16_lane_weights(const std::uint16_t* w, float (&wf)[16]) {
    const int4* src = reinterpret_cast<const int4*>(w);
    f16_lane_floats(__ldcs(src), __ldcs(src + 1), wf);
}

// A segment's sum on every lane (format/row_dot.hpp order): the lane's 16 products in order (no
// FMA; a lane past the end passes live = false and adds 0), then the xor butterfly 16..1. The two
// halves are apart so that a warp can interleave several segments' butterflies.
// x_at(i): the lane's x elements 4i..4i+3 (from memory, or registers a caller keeps).
template <class XAt>
__device__ __forceinline__ float f16_lane_dot(const float (&wf)[16], XAt&& x_at) {
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 f = x_at(i);
        q = add_rn(q, mul_rn(wf[4 * i], f.x));
        q = add_rn(q, mul_rn(wf[4 * i + 1], f.y));
        q = add_rn(q, mul_rn(wf[4 * i + 2], f.z));
        q = add_rn(q, mul_rn(wf[4 * i + 3], f.w));
    }
    return q;
}
__device__ __forceinline__ float f16_lane_sum(const float (&wf)[16], const float* x, bool live) {
    float q = 0.0f;
    if (live) {
        const float4* xr = reinterpret_cast<const float4*>(x);
        q = f16_lane_dot(wf, [&](int i) { return __ldg(xr + i); });
    }
    return q;
}
__device__ __forceinline__ float f16_warp_sum(float q) {
#pragma unroll
    for (int off = f16_lanes / 2; off > 0; off /= 2) q = add_rn(q, __shfl_xor_sync(0xffffffffu, q, off));
    return q;
}
__device__ __forceinline__ float f16_segment_sum(const float (&wf)[16], const float* x, bool live) {
    return f16_warp_sum(f16_lane_sum(wf, x, live));
}

// Pair p of the row group at row0 (row row0 + p / segments, segment p % segments), the lane's
// weights raw as loaded: its segment sums for the R rows of x, by lane 0 into part[p * R + r].
template <int R>
__device__ __forceinline__ void f16_pair_sums(const matvec_launch& a, const matvec_matrix& m, int row0, int p, int lane,
                                              const int4 (&raw)[2], float* part) {
    const int row = row0 + p / a.segments;
    const int e0 = (p % a.segments) * f16_segment + lane * f16_lane_elems;
    const bool live = row < m.rows && e0 < a.in;
    float wf[16];
    if (live) f16_lane_floats(raw[0], raw[1], wf);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float q = f16_segment_sum(wf, a.x + std::size_t(r) * a.x_stride + m.x_col + e0, live);
        if (lane == 0) part[p * R + r] = q;
    }
}

// The group's outputs, the CTA's threads over (row, x row): each row's segment sums in segment order.
template <int R>
__device__ __forceinline__ void f16_group_finish(const matvec_launch& a, const matvec_matrix& m, int row0, const float* part) {
    for (int t = threadIdx.x; t < a.f16_rpc * R; t += blockDim.x) {
        const int lr = t / R, r = t % R, row = row0 + lr;
        if (row >= m.rows || r >= a.n_rows) continue;
        float acc = 0.0f;
        for (int s = 0; s < a.segments; ++s) acc = add_rn(acc, part[(lr * a.segments + s) * R + r]);
        m.y[std::size_t(r) * m.y_stride + row] = acc;
    }
}

}  // namespace detail

// F16 (weights in the GGUF row-major layout, x in F32): one warp computes one 512-element
// segment of one row exactly as the definition is written: lane l sums its 16 elements in
// order, the xor butterfly over lanes is a shuffle reduction, and the CTA adds a row's segment
// results in segment order from shared memory. A CTA takes f16_rpc rows of one matrix
// (f16_plan_rows); a warp loads the weights of up to f16_pair_batch of its (row, segment) pairs
// before it multiplies any, so that a CTA's loads are in flight together (one CTA per 8 KB row
// with one pair a warp streamed the compressor projections at 1.3-1.4 TB/s, ncu, H200: every
// CTA one DRAM round trip and a drain).
inline constexpr int f16_warps = 8;
// Pairs a warp loads together: 2, what the default plans give a warp (1 or 2 pairs). With 4 the
// kernel held 103 registers and two CTAs per SM; with 2 it holds 76-80 and three CTAs fit, so 24
// warps' loads are in flight on an SM instead of 16 (the kernel waits on memory latency: ncu,
// H100, 41% long-scoreboard once the weights went through the cvt). The H200's whole-model decode:
// +1.7% at 2K, +0.8% at 64K.
inline constexpr int f16_pair_batch = 2;
inline constexpr int f16_ctas_per_sm = 3;

__host__ __device__ inline int f16_rows_per_cta(int segments) { return segments >= f16_warps ? 1 : f16_warps / segments; }

// Rows per CTA of a plan: f16_rows_per_cta times a multiplier, 2 when the single-pass form
// would launch at least f16_wide_ctas_per_sm CTAs per SM, else 1. On the H200 (matvec_bench,
// one row) the compressor and indexer projections (2048-2624 CTAs at 1x) took 18.4 -> 14.4,
// 23.1 -> 18.1 and 17.6 -> 13.9 us at 2x (4x and 8x were no better); the router, the HC mix and
// indexer_proj (24-256 CTAs) lost 30-70% at 2x: fewer CTAs than SMs' worth of load slots.
// DS4_F16_ROWS=1|2|4|8 forces the multiplier (A/B).
inline constexpr int f16_wide_ctas_per_sm = 8;

inline int f16_plan_rows(int segments, int ctas_single, int sm_count) {
    static const int forced = env_choice("DS4_F16_ROWS", {1, 2, 4, 8});
    const int mult = forced ? forced : ctas_single >= f16_wide_ctas_per_sm * sm_count ? 2 : 1;
    return f16_rows_per_cta(segments) * mult;
}

template <int R>
__global__ void __launch_bounds__(f16_warps * 32, f16_ctas_per_sm) matvec_f16_kernel(const __grid_constant__ matvec_launch a) {
    extern __shared__ int4 smem[];
    auto* part = reinterpret_cast<float*>(smem);  // [pair][R]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rpc = a.f16_rpc;
    int k = 0;
    while (k + 1 < a.n_matrices && int(blockIdx.x) >= a.item_begin[k + 1]) ++k;
    const matvec_matrix& m = a.m[k];
    const int row0 = (int(blockIdx.x) - a.item_begin[k]) * rpc;
    const int pairs = rpc * a.segments;
    const auto* w = static_cast<const std::uint16_t*>(m.weights);
    // Before the wait (core/launch.hpp): the CTA's rows, contiguous in the GGUF layout, toward L2.
    if (threadIdx.x == 0 && row0 < m.rows)
        prefetch_l2(w + std::size_t(row0) * a.in, std::size_t(min(rpc, m.rows - row0)) * a.in * 2);
    pdl_enter();
    for (int p0 = warp; p0 < pairs; p0 += f16_warps * f16_pair_batch) {
        int4 raw[f16_pair_batch][2];
#pragma unroll
        for (int i = 0; i < f16_pair_batch; ++i) {
            const int p = p0 + i * f16_warps, row = row0 + p / a.segments, s = p % a.segments;
            const int e0 = s * f16_segment + lane * f16_lane_elems;
            if (p < pairs && row < m.rows && e0 < a.in) {
                const int4* src = reinterpret_cast<const int4*>(w + std::size_t(row) * a.in + e0);
                raw[i][0] = __ldcs(src);
                raw[i][1] = __ldcs(src + 1);
            }
        }
#pragma unroll
        for (int i = 0; i < f16_pair_batch; ++i) {
            const int p = p0 + i * f16_warps;
            if (p >= pairs) break;  // warp-uniform
            detail::f16_pair_sums<R>(a, m, row0, p, lane, raw[i], part);
        }
    }
    __syncthreads();
    detail::f16_group_finish<R>(a, m, row0, part);
}

// The same products on a persistent grid (f16_ctas_per_sm CTAs per SM at most): CTA c
// takes the CTA-sized row groups c, c + grid, ... and each warp keeps B pairs' weights in flight
// while it multiplies the B before them, across the group boundary too, so a warp's loads never
// stop for the CTA's barrier, its final sums or a new CTA's start. Same (row, segment) sums, same
// segment order: the same bits. Segment partials alternate between two buffers by group, so one
// barrier a group suffices. Measured (H100, bench/RESULTS.md "Thirty-sixth session"): alone no
// faster than the one-group-per-CTA form (indexer q_b 10.6 us at one row either way, 1.6 TB/s), in
// the whole model +0.4% (its CTAs stay resident beside the other streams' launches); ncu puts the
// limit on each pair's x loads, issued only once its weights have arrived.

namespace detail {

// Group g's matrix and first row (item_begin counts groups of a.f16_rpc rows per matrix).
__device__ __forceinline__ int f16_group_matrix(const matvec_launch& a, int g, int& row0) {
    int k = 0;
    while (k + 1 < a.n_matrices && g >= a.item_begin[k + 1]) ++k;
    row0 = (g - a.item_begin[k]) * a.f16_rpc;
    return k;
}

// The weights of the warp's pairs i0 .. i0+B-1 of group g (pair p = warp + f16_warps * i), or
// nothing past the groups, the pairs, the rows or the input.
template <int B>
__device__ __forceinline__ void f16_stream_load(const matvec_launch& a, int g, int i0, int warp, int lane,
                                                int4 (&raw)[B][2]) {
    if (g >= a.item_begin[a.n_matrices]) return;
    int row0;
    const matvec_matrix& m = a.m[f16_group_matrix(a, g, row0)];
    const auto* w = static_cast<const std::uint16_t*>(m.weights);
    const int pairs = a.f16_rpc * a.segments;
#pragma unroll
    for (int j = 0; j < B; ++j) {
        const int p = warp + f16_warps * (i0 + j), row = row0 + p / a.segments;
        const int e0 = (p % a.segments) * f16_segment + lane * f16_lane_elems;
        if (p < pairs && row < m.rows && e0 < a.in) {
            const int4* src = reinterpret_cast<const int4*>(w + std::size_t(row) * a.in + e0);
            raw[j][0] = __ldcs(src);
            raw[j][1] = __ldcs(src + 1);
        }
    }
}

}  // namespace detail

template <int R, int B>
__global__ void __launch_bounds__(f16_warps * 32, f16_ctas_per_sm)
    matvec_f16_stream_kernel(const __grid_constant__ matvec_launch a) {
    extern __shared__ int4 smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rpc = a.f16_rpc, pairs = rpc * a.segments, groups = a.item_begin[a.n_matrices];
    const int per_warp = (pairs + f16_warps - 1) / f16_warps;  // pair slots of a warp in a group
    const int grid = int(gridDim.x);
    int g = int(blockIdx.x);
    // Before the wait (core/launch.hpp): the first group's rows, contiguous in the GGUF layout, toward L2.
    if (threadIdx.x == 0 && g < groups) {
        int row0;
        const matvec_matrix& m = a.m[detail::f16_group_matrix(a, g, row0)];
        if (row0 < m.rows)
            prefetch_l2(static_cast<const std::uint16_t*>(m.weights) + std::size_t(row0) * a.in,
                        std::size_t(min(rpc, m.rows - row0)) * a.in * 2);
    }
    pdl_enter();
    int4 cur[B][2];
    detail::f16_stream_load<B>(a, g, 0, warp, lane, cur);
    for (int parity = 0; g < groups; g += grid, parity ^= 1) {
        float* part = reinterpret_cast<float*>(smem) + parity * pairs * R;  // [pair][R]
        int row0;
        const matvec_matrix& m = a.m[detail::f16_group_matrix(a, g, row0)];
        for (int i0 = 0; i0 < per_warp; i0 += B) {
            const bool last = i0 + B >= per_warp;
            int4 next[B][2];
            detail::f16_stream_load<B>(a, last ? g + grid : g, last ? 0 : i0 + B, warp, lane, next);
#pragma unroll
            for (int j = 0; j < B; ++j) {
                const int p = warp + f16_warps * (i0 + j);
                if (p >= pairs) break;  // warp-uniform
                detail::f16_pair_sums<R>(a, m, row0, p, lane, cur[j], part);
            }
#pragma unroll
            for (int j = 0; j < B; ++j) {
                cur[j][0] = next[j][0];
                cur[j][1] = next[j][1];
            }
        }
        // The other buffer's readers (the previous group's sums) passed this barrier's
        // predecessor before any warp wrote this group's partials, so one barrier a group.
        __syncthreads();
        detail::f16_group_finish<R>(a, m, row0, part);
    }
}

// ---- host side -----------------------------------------------------------------------------

// Scratch for split matrices, allocated once by the caller; counters zeroed once.
struct matvec_workspace {
    float* partials = nullptr;
    std::size_t partial_floats = 0;
    unsigned* counters = nullptr;
    std::size_t counter_count = 0;
};

struct matvec_requirements {
    std::size_t partial_floats = 0;
    std::size_t counter_count = 0;
};

// Row capacities with an instantiation; a launch for n rows uses the smallest one >= n.
inline int matvec_capacity_for(int n_rows) {
    require(n_rows >= 1 && n_rows <= matvec_max_rows,
            "matvec: " + std::to_string(n_rows) + " activation rows (1.." + std::to_string(matvec_max_rows) + ")");
    int r = 1;
    while (r < n_rows) r *= 2;
    return r;
}

// The F16 kernel's form: 1 = a CTA per row group (matvec_f16_kernel), 2 and 3 = persistent
// (matvec_f16_stream_kernel) with 1 or 2 pairs a warp in flight ahead (4 spilled at 80 registers,
// the cap of 3 CTAs per SM). DS4_F16_FORM forces it (A/B).
inline int f16_form() {
    static const int forced = env_choice("DS4_F16_FORM", {1, 2, 3});
    return forced ? forced : 3;
}

inline std::size_t matvec_smem_bytes(const matvec_launch& a, int capacity) {
    if (a.format == matvec_format::f16) {
        const int pairs = a.f16_rpc * a.segments;
        // The persistent forms alternate two partial buffers.
        const int form = a.f16_form ? a.f16_form : f16_form();
        return std::size_t(form == 1 ? 1 : 2) * pairs * capacity * sizeof(float);
    }
    if (a.cta_quant) return std::size_t(capacity) * a.in + std::size_t(capacity) * (a.in / 32) * sizeof(float);
    return std::size_t(matvec_warps) * capacity * (512 + 64);
}

// Chooses how each matrix is cut into warp items. A matrix with enough 32-row tiles to fill the
// GPU gets whole-row items (no scratch traffic); a narrow one is split along segments until it
// has about `target` items. Depends on shapes and the SM count only, never on live values, and
// the result is the same bits either way.
// items_target: how many warp items a narrow matrix is split into (0: the default, 16 per SM);
// exposed so the benchmark can sweep it.
inline matvec_requirements plan_matvec(matvec_launch& a, int capacity, int sm_count, int items_target = 0) {
    require(a.n_matrices >= 1 && a.n_matrices <= matvec_max_matrices, "matvec: 1..8 matrices per launch");
    require(a.n_rows >= 1 && a.n_rows <= capacity, "matvec: more live rows than the row capacity");
    for (int k = 0; k < a.n_matrices; ++k) {
        require(a.m[k].x_col >= 0 && a.m[k].x_col % 4 == 0, "matvec: column offset " + std::to_string(a.m[k].x_col) +
                                                                 " is not a non-negative multiple of 4");
        require(a.norm_weight == nullptr || (a.m[k].x_col == 0 && a.m[k].act_qs == nullptr),
                "matvec: a folded RMSNorm needs every matrix to read x whole and unquantized");
    }
    require(a.norm_weight == nullptr || a.format == matvec_format::q8_0, "matvec: a folded RMSNorm is Q8_0 only");
    if (a.format == matvec_format::q8_0) {
        require(a.in % 32 == 0, "matvec q8_0: in = " + std::to_string(a.in) + " is not a multiple of 32");
        a.segments = (a.in / 32 + q8_0_segment_blocks - 1) / q8_0_segment_blocks;
    } else {
        require(a.in % 16 == 0, "matvec f16: in = " + std::to_string(a.in) + " is not a multiple of 16");
        a.segments = (a.in + f16_segment - 1) / f16_segment;
    }
    matvec_requirements req;
    a.item_begin[0] = 0;
    if (a.format == matvec_format::f16) {
        // F16 items are CTAs of f16_rpc rows; no split-K scratch.
        int ctas_single = 0;
        for (int k = 0; k < a.n_matrices; ++k)
            ctas_single += (a.m[k].rows + f16_rows_per_cta(a.segments) - 1) / f16_rows_per_cta(a.segments);
        const int rpc = f16_plan_rows(a.segments, ctas_single, sm_count);
        a.f16_rpc = rpc;
        for (int k = 0; k < a.n_matrices; ++k) {
            a.segs_per_item[k] = a.segments;
            a.item_begin[k + 1] = a.item_begin[k] + (a.m[k].rows + rpc - 1) / rpc;
        }
        return req;
    }
    const int target = items_target > 0 ? items_target : sm_count * 16;  // one wave at 16 warps/SM (one row)
    for (int k = 0; k < a.n_matrices; ++k) {
        const int tiles = (a.m[k].rows + tile_rows - 1) / tile_rows;
        // Whole rows once a matrix has 4 tiles per SM: measured on the H200, q_b (1024 tiles,
        // 2 segments) ran 13.6 us whole-row against 17.1 us split, where each split item pays a
        // partial store, an atomic and the ordered final sum; out_b (128 tiles, 16 segments)
        // needs the split (17.3 us at one segment per item, 30.4 us at seven).
        int spi = a.segments;
        if (tiles < sm_count * 4 && tiles < target) {
            const long want = (long(a.segments) * tiles) / target;
            spi = int(want < 1 ? 1 : (want > a.segments ? a.segments : want));
        }
        a.segs_per_item[k] = spi;
        const int per_tile = (a.segments + spi - 1) / spi;
        a.item_begin[k + 1] = a.item_begin[k] + tiles * per_tile;
        if (spi < a.segments) {
            req.partial_floats += std::size_t(tiles) * a.segments * capacity * 32;
            req.counter_count += std::size_t(tiles);
        }
    }
    // One CTA-wide quantization of x serves every matrix only when they all read the same columns.
    bool all_whole = true, any_x = false, one_x = true;
    for (int k = 0; k < a.n_matrices; ++k) {
        all_whole &= a.segs_per_item[k] == a.segments;
        any_x |= a.m[k].act_qs == nullptr;
        one_x &= a.m[k].x_col == 0;
    }
    a.cta_quant = all_whole && any_x && one_x;
    return req;
}

namespace detail {

// Host work per launch must stay far below a decode step, so the shared-memory opt-in (raised
// once per device and R to the device maximum, covering every later size) and the occupancy
// answer per (R, smem size) are remembered per device, for every thread. The opt-in is
// prepare_matvec's; the occupancy query is legal during capture and is cached on first use.
template <int R>
inline per_device_once<bool>& q8_opted_in() {
    static per_device_once<bool> o;
    return o;
}

template <int R>
inline void q8_opt_in(int device) {
    // The kernel's static shared memory (the folded norm's scratch) comes off the opt-in limit:
    // asking for the whole limit is an invalid value.
    q8_opted_in<R>().get(device, [](int) {
        cuda_check(cudaFuncSetAttribute(matvec_q8_0_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(max_dynamic_smem(matvec_q8_0_kernel<R>))),
                   "matvec q8_0 smem attribute");
        return true;
    });
}

template <int R>
inline int q8_ctas_per_sm(std::size_t smem, cudaStream_t stream) {
    const int dev = current_device();
    require_prepared(q8_opted_in<R>().ready(dev), stream, "matvec", "prepare_matvec");
    q8_opt_in<R>(dev);
    struct occupancy {
        std::mutex m;
        std::vector<std::pair<std::size_t, int>> by_smem[max_devices];
    };
    static occupancy occ;
    std::lock_guard<std::mutex> lock(occ.m);
    for (const auto& [bytes, n] : occ.by_smem[dev])
        if (bytes == smem) return n;
    int per_sm = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, matvec_q8_0_kernel<R>, matvec_warps * 32, smem),
               "matvec q8_0 occupancy");
    if (per_sm >= 1) occ.by_smem[dev].emplace_back(smem, per_sm);
    return per_sm;
}

template <int R>
inline void launch_matvec_r(const matvec_launch& a, int sm_count, cudaStream_t stream) {
    const int items = a.item_begin[a.n_matrices];
    const std::size_t smem = matvec_smem_bytes(a, R);
    const bool q8 = a.format == matvec_format::q8_0;
    // F16 launches one CTA per item, nothing to size.
    const int per_sm = q8 ? q8_ctas_per_sm<R>(smem, stream) : 1;
    require(per_sm >= 1, "matvec: kernel does not fit on an SM (in = " + std::to_string(a.in) + ", rows " +
                             std::to_string(R) + ")");
    if (a.format == matvec_format::f16) {
        const int form = a.f16_form ? a.f16_form : f16_form();
        const int cap = sm_count * f16_ctas_per_sm, grid = items < cap ? items : cap;
        if (form == 1) {
            launch_kernel("matvec_f16_kernel", matvec_f16_kernel<R>, items, f16_warps * 32, smem, stream, a);
        } else if (form == 2) {
            launch_kernel("matvec_f16_stream_kernel", matvec_f16_stream_kernel<R, 1>, grid, f16_warps * 32, smem,
                          stream, a);
        } else {
            launch_kernel("matvec_f16_stream_kernel", matvec_f16_stream_kernel<R, 2>, grid, f16_warps * 32, smem,
                          stream, a);
        }
    } else {
        const int needed = (items + matvec_warps - 1) / matvec_warps;
        const int grid = needed < sm_count * per_sm ? needed : sm_count * per_sm;
        launch_kernel("matvec_q8_0_kernel", matvec_q8_0_kernel<R>, grid, matvec_warps * 32, smem, stream, a);
    }
    cuda_check_launch("matvec");
}
}  // namespace detail

// Assigns workspace slices to split matrices and launches. `a` must come from plan_matvec with
// the same capacity; the workspace must hold plan_matvec's requirements.
inline void launch_matvec(matvec_launch a, int capacity, const matvec_workspace& ws, int sm_count,
                          cudaStream_t stream) {
    require(a.f16_form >= 0 && a.f16_form <= 3,
            "matvec: f16_form " + std::to_string(a.f16_form) + " is not 0 (the default), 1, 2 or 3");
    std::size_t po = 0, co = 0;
    for (int k = 0; k < a.n_matrices; ++k) {
        if (a.segs_per_item[k] == a.segments) continue;
        const int tiles = (a.m[k].rows + tile_rows - 1) / tile_rows;
        a.m[k].partials = ws.partials + po;
        a.m[k].counters = ws.counters + co;
        po += std::size_t(tiles) * a.segments * capacity * 32;
        co += std::size_t(tiles);
    }
    require(po <= ws.partial_floats && co <= ws.counter_count, "matvec: workspace smaller than plan_matvec asked");
    switch (capacity) {
        case 1: detail::launch_matvec_r<1>(a, sm_count, stream); break;
        case 2: detail::launch_matvec_r<2>(a, sm_count, stream); break;
        case 4: detail::launch_matvec_r<4>(a, sm_count, stream); break;
        case 8: detail::launch_matvec_r<8>(a, sm_count, stream); break;
        case 16: {
            // Sixteen rows' partial sums do not fit next to the loads in flight (ptxas spills),
            // so capacity 16 is two 8-row launches on the same stream; rows are independent, so
            // the bits are those of one launch.
            matvec_launch lo = a, hi = a;
            lo.n_rows = a.n_rows < 8 ? a.n_rows : 8;
            detail::launch_matvec_r<8>(lo, sm_count, stream);
            if (a.n_rows > 8) {
                hi.n_rows = a.n_rows - 8;
                hi.x = a.x + std::size_t(8) * a.x_stride;
                if (a.x_normed) hi.x_normed = a.x_normed + std::size_t(8) * a.x_stride;
                for (int k = 0; k < a.n_matrices; ++k) {
                    hi.m[k].y = a.m[k].y + std::size_t(8) * a.m[k].y_stride;
                    if (a.m[k].act_qs) {
                        hi.m[k].act_qs = a.m[k].act_qs + std::size_t(8) * a.m[k].act_stride;
                        hi.m[k].act_d = a.m[k].act_d + std::size_t(8) * (a.m[k].act_stride / 32);
                    }
                }
                detail::launch_matvec_r<8>(hi, sm_count, stream);
            }
            break;
        }
        default: fail("matvec: row capacity " + std::to_string(capacity) + " is not 1, 2, 4, 8 or 16");
    }
}

// The Q8_0 kernels' shared-memory opt-in on `device` for every row capacity: call once per device
// before capturing a launch (an eager launch does it too).
inline void prepare_matvec(int device) {
    with_device(device, [&] {
        detail::q8_opt_in<1>(device);
        detail::q8_opt_in<2>(device);
        detail::q8_opt_in<4>(device);
        detail::q8_opt_in<8>(device);
    });
}

}  // namespace ds4::kernels
