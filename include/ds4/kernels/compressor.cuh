#pragma once
// The KV compressor (docs/model.md §2.5) for decode (one token of each of many sequences) and prefill
// (a chunk of one sequence). Inputs are the kv and gate projections of each token (the F16
// matvec of kernels/matvec.cuh, run by the caller in the launch that reads the attention norm
// output); the kernels add ape[pos % r], update the frontier state and, when (pos+1) % r == 0,
// emit: per-channel softmax pooling (ratio 4: the 8 candidates in the CPU interleaved order),
// RMSNorm * norm, RoPE on the last n_rot dims at pos+1-r, then the stored form (attention: E4M3
// round trip of the nope dims and the F16 round; indexer: Hadamard-128, E2M1 round trip, F16
// round) re-encoded into the native row of model/kv_layout.hpp in the sequence's pages, exactly
// as the CPU engine does (encode_attention_row / encode_indexer_row of ref::compressor_update's row).
//
// Contract: exact. State rows and emitted row bytes equal reference/compressor bit for bit.
//   Pooling: one thread per channel j runs the reference loop (max, exp_f32, sums) unchanged; it
//   loads its candidates 16 at a time before using them, so a ratio-128 pool waits on 16 load
//   latencies instead of 256 (the loop was latency-bound: 137 us for one batch-1 emission on the
//   H200 with 128 threads and one load in flight per thread).
//   RMSNorm: the double sum of squares in the lane order of core/reduce.hpp, on one warp (hd <=
//   512; emissions come every 4th or 128th token).
//   RoPE: one thread per pair; rope_theta's iterated product is the reference's sequence.
//   Hadamard: each butterfly output is one add of two fixed inputs, whatever thread computes it.
//   Block amax: max_num over non-negative values (NaN ignored) is order-free, so warp shuffles.
// State layout: as ref::compressor_state (rows() x width() floats each for kv and score, row-major),
// per sequence at state + seq * state_stride. Blocks have one thread per channel of the widest
// head (512); in the pool and the ratio-4 window shift thread j alone touches columns j and hd+j,
// so one barrier (after the new token's write) orders the decode step.
// Graph contract: positions come from device memory (compressor_idle = no token this step); the
// grid is (sequence capacity, streams); blocks without an emission exit after the state write.
// Verify rows (a run of consecutive rows of one sequence in the step) go through one block in
// order, each saving the frontier it starts from where the launch asks (truncate's history), so a
// step of verify runs is one launch per layer and captures like a decode step.
// No allocation, no host synchronisation, no scratch. Prefill (not on the captured path) reads
// its first position from device memory and takes the chunk length from the host.
// Shapes: head_dim 128 or 512 (any multiple of 128 up to 512), n_rot = 64; indexer rows 128 wide;
// any ratio (4 pools the overlapping windows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/copy_words.cuh"
#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int compressor_max_head_dim = 512;
inline constexpr int compressor_threads = compressor_max_head_dim;  // one thread per channel
inline constexpr int compressor_head_dim_step = 128;
// Prefill chunks of ratio-4 layers emit a row every 4 tokens: 128-thread blocks (4 channels each)
// keep 16 emissions per SM in flight instead of 4 (H200, 4096 tokens: 69 us at 128 threads, 198 us
// at 512); ratio 128 emits 32 rows per chunk, where one thread per channel wins (508 -> 142 us).
// The dense launch also loads candidates 8 at a time (ratio 4 has 8), so that its registers allow
// 16 blocks per SM.
inline constexpr int compressor_prefill_dense_threads = 128;
inline constexpr int compressor_max_streams = 2;  // attention + indexer compressor of a ratio-4 layer
inline constexpr std::uint32_t compressor_idle = 0xffffffffu;
inline constexpr float compressor_neg_inf = -1e30f;  // initial score (ref DS4_NEG_INF)

enum class compressor_kind : int { attention = 0, indexer = 1 };

// Paged rows of one stream on the device: row i of sequence s lies in page
// table[s * table_stride + i / kv_page_rows], at offset (i % kv_page_rows) * row_bytes of the page.
struct kv_pages {
    std::uint8_t* pool = nullptr;
    const std::int32_t* table = nullptr;
    int table_stride = 0;
    int row_bytes = 0;
};

DS4_HD_INLINE std::uint8_t* kv_page_row(const kv_pages& p, int seq, std::int64_t row) {
    const std::int32_t page = p.table[std::int64_t(seq) * p.table_stride + row / model::kv_page_rows];
    return p.pool + (std::int64_t(page) * model::kv_page_rows + row % model::kv_page_rows) * p.row_bytes;
}

// One compressor of one layer.
struct compressor_stream {
    compressor_kind kind = compressor_kind::attention;
    int ratio = 0, head_dim = 0, n_rot = 64;
    const std::uint16_t* ape = nullptr;  // F16 [ratio][width]
    const float* norm = nullptr;         // F32 [head_dim]
    // Projections (matvec outputs, no ape): token t at kv + t * proj_stride (decode: t = sequence;
    // prefill: t = index in the chunk), width() values each.
    const float* kv = nullptr;
    const float* gate = nullptr;
    int proj_stride = 0;
    float* state_kv = nullptr;  // sequence s at + s * state_stride
    float* state_score = nullptr;
    std::size_t state_stride = 0;
    // Decode only, instead of the three above: row s's state lives in its own allocation
    // (device array of row_state[s] base pointers, e.g. one block per engine sequence), kv at
    // row_state[s] + row_kv_offset and score at row_state[s] + row_score_offset. Read on the
    // device, so one captured launch serves whichever sequences fill the rows.
    float* const* row_state = nullptr;
    std::size_t row_kv_offset = 0, row_score_offset = 0;
    kv_pages out;  // compressed rows (attention: attention_row_layout, indexer: indexer_row_layout)
    rope_params rope;
    float eps = 1e-6f;

    DS4_HD int width() const { return (ratio == 4 ? 2 : 1) * head_dim; }
    DS4_HD int rows() const { return (ratio == 4 ? 2 : 1) * ratio; }
};

struct compressor_decode_launch {
    compressor_stream s[compressor_max_streams];
    int n_streams = 1;
    const std::uint32_t* pos = nullptr;  // [n_seq]: this step's position, or compressor_idle
    int n_seq = 0;                       // sequence capacity (grid)
    // Optional (several consecutive rows of one sequence: verify rows, or a prompt chunk's last
    // rows, which save their frontiers). run_rows[r] is the length of the run that starts at row
    // r, 0 for a row inside a run or an idle row; block r takes the run's rows in order through the state of row r (its row_state, or
    // state + r * state_stride), each row with its own projections, position and page table.
    // Null: every live row is a run of one.
    const std::int32_t* run_rows = nullptr;
    // Optional (row_state only): save_slot[r] >= 0 saves the state row r starts from (kv and
    // score, rows() x width() floats each) into frontier slot save_slot[r] before the row's
    // update, slot k at + k * 2 * rows() * width() floats from the live kv and score (the
    // backend's ring of saved frontiers, compressor_slots). The state must be 16-byte aligned.
    const std::int32_t* save_slot = nullptr;
};

struct compressor_prefill_launch {
    compressor_stream s[compressor_max_streams];
    int n_streams = 1;
    const std::uint32_t* pos0 = nullptr;  // device: position of the chunk's first token
    int seq = 0;                          // the sequence whose state and pages are used
    int n_tokens = 0;                     // chunk length
};

namespace detail {

// The unnormalised Walsh-Hadamard butterfly of ref::hadamard128 over 128 floats in shared
// memory (strides 1..64); threads 0..63 each do one (a+b, a-b) pair per stage, so every output
// is the same single add as the reference's, whatever thread computes it. Every thread of the
// block must call it (it synchronises).
__device__ __forceinline__ void hadamard128_block(float* x, int tid) {
    for (int stride = 1; stride < 128; stride *= 2) {
        if (tid < 64) {
            const int i = (tid / stride) * 2 * stride + tid % stride;
            const float a = x[i], b = x[i + stride];
            x[i] = add_rn(a, b);
            x[i + stride] = sub_rn(a, b);
        }
        __syncthreads();
    }
}


// std::max(a, b) as the reference calls it: (a < b) ? b : a.
__device__ __forceinline__ float ref_max(float a, float b) { return a < b ? b : a; }

__device__ __forceinline__ float warp_max_num(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_num(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The per-channel softmax pool of ref::compressor_pool. cand(i, s, v): ratio 4 takes i = 0..7 as
// (prev 0, cur 0, prev 1, cur 1, ...), others i = 0..r-1.
// Candidates are loaded Batch at a time, all before the first use, so their latencies
// overlap; the arithmetic is the reference's, in its order.
inline constexpr int pool_batch = 16;

template <int Batch = pool_batch, class Cand>
__device__ __forceinline__ float pool_channel(int r, Cand&& cand) {
    static_assert(Batch >= 8 && Batch % 2 == 0, "ratio 4's 8 candidates fit one batch");
    const int n = r == 4 ? 8 : r;
    float s[Batch], v[Batch];
    const auto load = [&](int i0) {
#pragma unroll
        for (int k = 0; k < Batch; ++k)
            if (i0 + k < n) cand(i0 + k, s[k], v[k]);
    };
    float mx = compressor_neg_inf;
    for (int i0 = 0; i0 < n; i0 += Batch) {
        load(i0);
#pragma unroll
        for (int k = 0; k < Batch; ++k)
            if (i0 + k < n) mx = ref_max(mx, s[k]);
    }
    if (mx <= compressor_neg_inf * 0.5f) return 0.0f;
    float denom = 0.0f, sum = 0.0f;
    if (r == 4) {
        // One batch holds all 8 (prev 0, cur 0, prev 1, ...): still loaded from the first pass.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float wp = exp_f32(sub_rn(s[2 * i], mx));
            const float wc = exp_f32(sub_rn(s[2 * i + 1], mx));
            denom = add_rn(denom, add_rn(wp, wc));
            sum = add_rn(sum, mul_rn(wp, v[2 * i]));
            sum = add_rn(sum, mul_rn(wc, v[2 * i + 1]));
        }
    } else {
        for (int i0 = 0; i0 < n; i0 += Batch) {
            if (n > Batch) load(i0);  // otherwise the first pass's batch is still here
#pragma unroll
            for (int k = 0; k < Batch; ++k) {
                if (i0 + k >= n) break;
                const float wi = exp_f32(sub_rn(s[k], mx));
                denom = add_rn(denom, wi);
                sum = add_rn(sum, mul_rn(wi, v[k]));
            }
        }
    }
    return denom > 0.0f ? div_rn(sum, denom) : 0.0f;
}

// x: the pooled row in shared memory (head_dim values, written before the call). Finishes the
// row as ref::compressor_update and writes its native encoding to dst. All threads call it.
__device__ __forceinline__ void finish_row(const compressor_stream& c, float* x, std::uint32_t rope_pos,
                                           std::uint8_t* dst) {
    __shared__ float scale_s;
    const int hd = c.head_dim, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __syncthreads();
    // ref::rms_scale's lane order (core/reduce.hpp) on warp 0 alone: no block barrier, so the
    // kernels' block widths (512, 128) need not match the reduction's.
    if (warp == 0) {
        const double ss = block_lane_reduce<32, double>(hd, [x](int i) { return square_f64(x[i]); }, nullptr);
        if (lane == 0) scale_s = rms_scale_from_sum(ss, hd, c.eps);
    }
    __syncthreads();
    const float scale = scale_s;
    for (int j = tid; j < hd; j += blockDim.x) x[j] = mul_rn(mul_rn(x[j], scale), c.norm[j]);
    __syncthreads();
    if (tid < c.n_rot / 2) {
        float* tail = x + hd - c.n_rot;
        float sn, cs;
        sincos_f32(rope_theta(c.rope, rope_pos, tid), &sn, &cs);
        rope_rotate(tail[2 * tid], tail[2 * tid + 1], cs, sn);
    }
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    if (c.kind == compressor_kind::attention) {
        const model::attention_row_layout l{hd, c.n_rot};
        // Stored form (ref::kv_row_as_stored), then encode_attention_row of that row.
        for (int b = warp; b < l.n_blocks(); b += n_warps) {
            float v[2], y[2];
            for (int k = 0; k < 2; ++k) v[k] = x[b * 64 + 32 * k + lane];
            float amax = warp_max_num(max_num(max_num(0.0f, abs_exact(v[0])), abs_exact(v[1])));
            int e = ceil_log2(div_rn(max_num(amax, e4m3_amax_floor), e4m3_max));
            for (int k = 0; k < 2; ++k)
                y[k] = f16_round(mul_rn(e4m3_round(clamp_symmetric(mul_rn(v[k], exp2i(-e)), e4m3_max)), exp2i(e)));
            amax = warp_max_num(max_num(max_num(0.0f, abs_exact(y[0])), abs_exact(y[1])));
            e = ceil_log2(div_rn(max_num(amax, e4m3_amax_floor), e4m3_max));
            for (int k = 0; k < 2; ++k)
                dst[b * 64 + 32 * k + lane] = e4m3_encode_scaled(y[k], exp2i(-e));
            if (lane == 0) dst[l.exponent_offset() + b] = static_cast<std::uint8_t>(model::kv_exponent_byte(e));
        }
        for (int i = tid; i < c.n_rot; i += blockDim.x) {
            const std::uint16_t h = f32_to_f16(f16_round(x[l.n_nope() + i]));
            dst[l.rope_offset() + 2 * i] = static_cast<std::uint8_t>(h & 0xffu);
            dst[l.rope_offset() + 2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
        }
        for (int i = l.exponent_offset() + l.n_blocks() + tid; i < l.bytes(); i += blockDim.x) dst[i] = 0;
        return;
    }
    // Indexer: ref::indexer_qat (Hadamard-128 butterfly, x 1/sqrt(128), E2M1 per 32), F16 round,
    // then encode_indexer_row.
    hadamard128_block(x, tid);
    const model::indexer_row_layout l{128};
    for (int b = warp; b < l.n_blocks(); b += n_warps) {
        const float v = mul_rn(x[b * 32 + lane], 0.08838834764831845f);
        float amax = warp_max_num(max_num(0.0f, abs_exact(v)));
        int e = ceil_log2(div_rn(max_num(amax, e2m1_amax_floor), e2m1_max));
        const float y = f16_round(mul_rn(e2m1_decode(e2m1_encode_scaled(v, exp2i(-e))), exp2i(e)));
        amax = warp_max_num(max_num(0.0f, abs_exact(y)));
        e = ceil_log2(div_rn(max_num(amax, e2m1_amax_floor), e2m1_max));
        const unsigned code = e2m1_encode_scaled(y, exp2i(-e));
        const unsigned hi = __shfl_down_sync(0xffffffffu, code, 1);
        if ((lane & 1) == 0) dst[(b * 32 + lane) / 2] = static_cast<std::uint8_t>(code | (hi << 4));
        if (lane == 0) dst[l.exponent_offset() + b] = static_cast<std::uint8_t>(model::kv_exponent_byte(e));
    }
    for (int i = l.exponent_offset() + l.n_blocks() + tid; i < l.bytes(); i += blockDim.x) dst[i] = 0;
}

}  // namespace detail

// The kernels below are templates only for linkage: this header may be included by several
// translation units, and a __global__ function cannot be inline.
// Runs: the launch has run_rows (a separate instantiation: the loop over a run's rows costs the
// single-row form 64 registers more, 64 -> 128 on sm_90a, which its neighbours under PDL would feel).
template <bool Runs>
__global__ void __launch_bounds__(compressor_threads)
    compressor_decode_kernel(const __grid_constant__ compressor_decode_launch a) {
    __shared__ float row[compressor_max_head_dim];
    const compressor_stream& c = a.s[blockIdx.y];
    const int first = blockIdx.x;
    const int r = c.ratio, hd = c.head_dim, w = c.width();
    float* K = c.row_state ? c.row_state[first] + c.row_kv_offset : c.state_kv + std::size_t(first) * c.state_stride;
    float* S = c.row_state ? c.row_state[first] + c.row_score_offset : c.state_score + std::size_t(first) * c.state_stride;
    // An emitting step's pool reads every state row, written steps ago and by now mostly out of
    // L2: asked for before the wait (neither the state nor the positions are the previous launch's
    // output; launches before it are complete once this one runs, core/launch.hpp).
    if (!Runs && threadIdx.x == 0) {
        const std::uint32_t pos = a.pos[first];
        const bool aligned = ((reinterpret_cast<std::uintptr_t>(K) | reinterpret_cast<std::uintptr_t>(S)) & 15u) == 0;
        if (aligned && pos != compressor_idle && (pos + 1) % std::uint32_t(r) == 0) {
            const std::size_t bytes = std::size_t(c.rows()) * w * sizeof(float);
            prefetch_l2(K, bytes);
            prefetch_l2(S, bytes);
        }
    }
    pdl_enter();
    const int n_rows = Runs ? a.run_rows[first] : 1;
    for (int t = 0; t < n_rows; ++t) {
        const int seq = first + t;
        const std::uint32_t pos = a.pos[seq];
        if (pos == compressor_idle) return;
        // The previous row's pool, window shift and finished row are done before this row
        // saves or writes the state (other threads touched other columns).
        if (Runs && t > 0) __syncthreads();
        if (Runs && a.save_slot != nullptr && a.save_slot[seq] >= 0) {
            const std::size_t floats = std::size_t(c.rows()) * w;
            const std::size_t at = std::size_t(a.save_slot[seq]) * 2 * floats;
            copy_words(K, K + at, floats, threadIdx.x, blockDim.x);
            copy_words(S, S + at, floats, threadIdx.x, blockDim.x);
            __syncthreads();
        }
        const int p = int(pos % std::uint32_t(r));
        const int new_row = r == 4 ? 4 + p : p;
        const float* kv = c.kv + std::size_t(seq) * c.proj_stride;
        const float* gate = c.gate + std::size_t(seq) * c.proj_stride;
        const std::uint16_t* ape = c.ape + std::size_t(p) * w;
        // Loads before stores, here and in the window shift: K and S may alias kv, gate and each
        // other as far as the compiler knows, so a loop that loads and stores in turn waits one
        // memory round trip per iteration (the shift was 16 in a row, ncu, H200: rows written
        // steps ago, mostly from HBM, on the chain of every 4th decode step of a ratio-4 layer).
        static_assert(2 * compressor_max_head_dim <= 2 * compressor_threads, "a state row (2 x head_dim at ratio 4) in two passes");
        float kv_in[2], sc_in[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int j = int(threadIdx.x) + i * compressor_threads;
            if (j < w) {
                kv_in[i] = kv[j];
                sc_in[i] = add_rn(gate[j], f16_to_f32(ape[j]));
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int j = int(threadIdx.x) + i * compressor_threads;
            if (j < w) {
                K[new_row * w + j] = kv_in[i];
                S[new_row * w + j] = sc_in[i];
            }
        }
        if ((pos + 1) % std::uint32_t(r) != 0) continue;
        // Thread j pools channel j (columns j and hd+j for ratio 4), which other threads wrote when
        // hd < blockDim.x; after the pool it is the only one touching those columns.
        __syncthreads();
        for (int j = threadIdx.x; j < hd; j += blockDim.x) {
            row[j] = detail::pool_channel(r, [&](int i, float& s, float& v) {
                const int idx = r == 4 ? ((i & 1) ? (4 + (i >> 1)) * w + hd + j : (i >> 1) * w + j) : i * w + j;
                s = S[idx];
                v = K[idx];
            });
            if (r == 4) {  // the current window becomes the previous one: K's 8 loads, then S's
                const auto shift = [&](float* X) {
                    float cur[4][2];
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        cur[i][0] = X[(4 + i) * w + j];
                        cur[i][1] = X[(4 + i) * w + hd + j];
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        X[i * w + j] = cur[i][0];
                        X[i * w + hd + j] = cur[i][1];
                    }
                };
                shift(K);
                shift(S);
            }
        }
        const std::int64_t out_row = std::int64_t((pos + 1) / std::uint32_t(r)) - 1;
        detail::finish_row(c, row, pos + 1 - std::uint32_t(r), kv_page_row(c.out, seq, out_row));
    }
}

// Prefill, part 1: block e emits the chunk's e-th row, reading each token's (score, kv) from the
// chunk's projections or, for tokens before the chunk, from the frontier state (not modified).
template <int Batch>
__global__ void __launch_bounds__(Batch == 8 ? compressor_prefill_dense_threads : compressor_threads)
    compressor_prefill_emit_kernel(const __grid_constant__ compressor_prefill_launch a) {
    pdl_enter();
    __shared__ float row[compressor_max_head_dim];
    const compressor_stream& c = a.s[blockIdx.y];
    const std::int64_t p0 = *a.pos0, r = c.ratio;
    const std::int64_t q = p0 + (r - 1 - p0 % r) + std::int64_t(blockIdx.x) * r;  // window end
    if (q >= p0 + a.n_tokens) return;
    const int hd = c.head_dim, w = c.width();
    const float* K = c.state_kv + std::size_t(a.seq) * c.state_stride;
    const float* S = c.state_score + std::size_t(a.seq) * c.state_stride;
    auto value = [&](std::int64_t t, int col, bool prev_window, float& s, float& v) {
        if (t < 0) {
            s = compressor_neg_inf;
            v = 0.0f;
        } else if (t >= p0) {
            const std::size_t o = std::size_t(t - p0) * c.proj_stride + col;
            v = c.kv[o];
            s = add_rn(c.gate[o], f16_to_f32(c.ape[std::size_t(t % r) * w + col]));
        } else {
            // Before the chunk: generic rows hold the latest token of each residue; ratio 4 keeps
            // the window open at p0 in rows 4..7 and the last completed one in rows 0..3.
            int srow = int(t % r);
            if (r == 4 && !(prev_window && (t / 4) * 4 + 3 < p0)) srow += 4;
            s = S[srow * w + col];
            v = K[srow * w + col];
        }
    };
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        row[j] = detail::pool_channel<Batch>(int(r), [&](int i, float& s, float& v) {
            if (r == 4) {
                if (i & 1) value(q - 3 + (i >> 1), hd + j, false, s, v);
                else value(q - 7 + (i >> 1), j, true, s, v);
            } else {
                value(q - r + 1 + i, j, false, s, v);
            }
        });
    }
    const std::int64_t out_row = (q + 1) / r - 1;
    detail::finish_row(c, row, std::uint32_t(q + 1 - r), kv_page_row(c.out, a.seq, out_row));
}

// Prefill, part 2 (after part 1): the frontier state after the chunk. Block b owns state row b
// (ratio 4: rows b and 4+b, since the previous-window row may come from the old current one).
template <int = 0>
__global__ void __launch_bounds__(compressor_threads)
    compressor_prefill_state_kernel(const __grid_constant__ compressor_prefill_launch a) {
    pdl_enter();
    const compressor_stream& c = a.s[blockIdx.y];
    const std::int64_t p0 = *a.pos0, r = c.ratio, P = p0 + a.n_tokens;
    const int w = c.width();
    const int rho = blockIdx.x;
    if (rho >= (r == 4 ? 4 : r)) return;
    float* K = c.state_kv + std::size_t(a.seq) * c.state_stride;
    float* S = c.state_score + std::size_t(a.seq) * c.state_stride;
    auto chunk = [&](std::int64_t t, int col, float& s, float& v) {
        const std::size_t o = std::size_t(t - p0) * c.proj_stride + col;
        v = c.kv[o];
        s = add_rn(c.gate[o], f16_to_f32(c.ape[std::size_t(t % r) * w + col]));
    };
    // Latest token t < P with t % r == rho.
    const std::int64_t t_last = (P - 1) - (((P - 1 - rho) % r) + r) % r;
    const int cur_row = r == 4 ? 4 + rho : rho;
    const std::int64_t W = P / 4 - 1;  // ratio 4: the last completed window
    const bool prev_changes = r == 4 && W >= 0 && 4 * W + 3 >= p0;
    for (int j = threadIdx.x; j < w; j += blockDim.x) {
        if (prev_changes) {
            const std::int64_t t = 4 * W + rho;
            float s, v;
            if (t >= p0) chunk(t, j, s, v);
            else {
                s = S[cur_row * w + j];
                v = K[cur_row * w + j];
            }
            S[rho * w + j] = s;
            K[rho * w + j] = v;
        }
        if (t_last >= p0) {
            float s, v;
            chunk(t_last, j, s, v);
            S[cur_row * w + j] = s;
            K[cur_row * w + j] = v;
        }
    }
}

// Host launchers. Streams of one launch may differ in ratio and kind (a ratio-4 layer passes its
// attention and indexer compressors together: one launch per layer per step).
inline void check_compressor_stream(const compressor_stream& c) {
    require(c.ratio > 0 && c.head_dim > 0 && c.head_dim % compressor_head_dim_step == 0 &&
                c.head_dim <= compressor_max_head_dim && c.n_rot == 64 && c.n_rot < c.head_dim,
            "compressor: head_dim " + std::to_string(c.head_dim) + " (multiple of 128 up to 512), n_rot " +
                std::to_string(c.n_rot) + " (64)");
    require(c.kind == compressor_kind::attention || c.head_dim == 128, "compressor: indexer rows are 128 wide");
    require(c.proj_stride >= c.width() && (c.row_state != nullptr || c.state_stride >= std::size_t(c.rows()) * c.width()),
            "compressor: projection or state stride too small");
}

inline void launch_compressor_decode(const compressor_decode_launch& a, cudaStream_t stream) {
    require(a.n_streams >= 1 && a.n_streams <= compressor_max_streams && a.n_seq >= 1, "compressor: launch shape");
    for (int i = 0; i < a.n_streams; ++i) {
        check_compressor_stream(a.s[i]);
        require(a.save_slot == nullptr || (a.run_rows != nullptr && a.s[i].row_state != nullptr),
                "compressor: frontier saves need run_rows and row_state");
    }
    if (a.run_rows != nullptr)
        launch_kernel("compressor_decode_kernel", compressor_decode_kernel<true>, dim3(a.n_seq, a.n_streams),
                      compressor_threads, 0, stream, a);
    else
        launch_kernel("compressor_decode_kernel", compressor_decode_kernel<false>, dim3(a.n_seq, a.n_streams),
                      compressor_threads, 0, stream, a);
    cuda_check_launch("compressor_decode");
}

inline void launch_compressor_prefill(const compressor_prefill_launch& a, cudaStream_t stream) {
    require(a.n_streams >= 1 && a.n_streams <= compressor_max_streams && a.n_tokens >= 1, "compressor: launch shape");
    for (int i = 0; i < a.n_streams; ++i) require(a.s[i].row_state == nullptr, "compressor: row_state is decode-only");
    int min_ratio = 1 << 30, max_rows = 0;
    for (int i = 0; i < a.n_streams; ++i) {
        check_compressor_stream(a.s[i]);
        min_ratio = std::min(min_ratio, a.s[i].ratio);
        max_rows = std::max(max_rows, a.s[i].ratio == 4 ? 4 : a.s[i].ratio);
    }
    const int threads = min_ratio <= 4 ? compressor_prefill_dense_threads : compressor_threads;
    const dim3 grid(a.n_tokens / min_ratio + 1, a.n_streams);
    if (min_ratio <= 4) launch_kernel("compressor_prefill_emit_kernel", compressor_prefill_emit_kernel<8>, grid, threads,
                                      0, stream, a);
    else launch_kernel("compressor_prefill_emit_kernel", compressor_prefill_emit_kernel<detail::pool_batch>, grid,
                       threads, 0, stream, a);
    cuda_check_launch("compressor_prefill_emit");
    launch_kernel("compressor_prefill_state_kernel", compressor_prefill_state_kernel<>, dim3(max_rows, a.n_streams),
                  threads, 0, stream, a);
    cuda_check_launch("compressor_prefill_state");
}

}  // namespace ds4::kernels
