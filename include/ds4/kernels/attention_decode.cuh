#pragma once
// Flash decode attention for decode and verify rows (docs/model.md §2.4 steps 9-10): n_head query
// heads (64 at flash, fewer in the reduced shapes) share one head_dim K=V row per token (MQA).
// A token at position pos sees the raw window (positions max(0, pos-n_swa+1) .. pos, oldest ->
// newest), then the compressed rows c < n_comp[token] whose indexer mask byte is set (no mask:
// all of them), ascending; the head's sink joins the denominator; inverse RoPE on the output's
// last n_rot dims at pos. Rows are native kv_layout.hpp rows in pages (decode_attention_row
// values: E4M3 * 2^e then F16 round, or the F16 tail), addressed through per-sequence page
// tables: raw row at absolute position p in entry p / 64, compressed row c in entry c / 64.
//
// Contract: exact against reference/attention_split (attention_decode_split), the fixed split
// order this kernel computes: chunks of 64 rows (one page: raw by absolute position, compressed
// by index), per chunk sequential fma dots, max, exp_f32, ascending sum and AXPY; chunks merged
// in order with the sink (see attention_split.hpp for the formulas). NaN payloads aside (stored
// F16 NaNs are widened by the hardware conversion), every output bit equals the replay.
// Against sink_attention (the sequential F32 reference) the difference is rounding only; the
// checks report it (max |diff| and ulp) without enforcing it.
// Batch invariance: chunk boundaries come from absolute positions/indices, so a token's result
// is the same alone, with other sequences, or among verify rows.
//
// Two launches: split (one CTA per (chunk slot, head group, sequence slot)) writes per-chunk
// (m, l, o) partials; merge (one CTA per (head, 128 dims), token, sequence) folds them in chunk
// order, scales by 1/denom and applies the inverse RoPE. No atomics.
// Graph contract: no allocation, no host synchronisation; token positions, compressed counts,
// masks, sequence token ranges and page tables are read from device memory; grids depend on the
// capacity (sequences, query rows per sequence, max compressed rows, n_swa) only; idle sequence
// slots and chunk slots outside a sequence's live range exit early (the latter after marking
// their partials empty). Scratch (attention_decode_plan::scratch_bytes) needs no initialisation.
// The split kernel's shared-memory opt-in: prepare_attention_decode(device) before capture.
// Query rows of one sequence must have consecutive positions (verify: pos_0 + j).
// Shapes: head_dim a multiple of 128 up to 512, n_rot = 64, n_head a multiple of the head group.
//
// Cost: CUDA-core F32, per chunk and head 64 x head_dim fma for scores plus as many for the
// AXPY, shared-memory operands; rows are decoded to F16 in shared memory once per CTA (exact:
// stored values are F16 values). Compute, not HBM, bounds it: 131 kFLOP (64 heads x 512 x 2 fma)
// per 592-byte row per query row, so even the H200's FP32 peak (~67 TFLOP/s) streams rows at
// only ~300 GB/s-equivalent; measured 22-50 GB/s (bench/RESULTS.md). This kernel is the bitwise
// one; attention_decode_mma.cuh is the fast, bounded one (tensor cores, F16 operands).
// Scratch grows as rows / 64 x n_head x head_dim x 4 B per query row (128 KiB per chunk at flash).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/env_choice.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int attn_chunk_rows = model::kv_page_rows;  // one page = one chunk (split) of rows
inline constexpr int attn_threads = 256;
inline constexpr int attn_max_vec = 16;  // (query row, head) vectors per split CTA
inline constexpr int attn_max_q = 16;
inline constexpr int attn_max_dim = 512;
inline constexpr int attn_merge_threads = 64;  // 2 dims each: 128 dims per merge CTA
// Slots whose partials a merge thread loads at once, when a row has more slots than one batch
// (long raw contexts, fine splits) and the grid is at most attn_merge_batch_ctas CTAs (decode
// steps): BM_attention_decode_mma 32768/1 142 -> 63 us, 2048/1 (32 slots) 26.8 -> 21.0 (H200).
// Otherwise one slot at a time: the batch takes 80 registers against 32, which cost a prefill
// chunk's merge (256 CTAs a row, thousands of rows) 4% of prefill, and at the model's 2..3 slots a
// decode step it was 0.5% slower in the whole model though faster alone (bench/NOTES.md).
inline constexpr int attn_merge_batch = 8;
inline constexpr int attn_merge_batch_ctas = 2048;
// At most this many slots a row, in a grid of at most attn_merge_batch_ctas CTAs (decode steps),
// the merge issues all its loads at once (attention_merge_few_kernel).
inline constexpr int attn_merge_few = 4;
static_assert(attn_chunk_rows == 64, "the thread mappings below assume 64-row chunks");

struct attention_decode_shape {
    int n_head = 0, head_dim = 0, n_rot = 0, n_swa = 0;
};

// Capacity of a launch: the graph's fixed geometry.
struct attention_decode_capacity {
    int n_seq = 1;     // sequence slots
    int max_q = 1;     // query rows per sequence (1 decode, up to 16 verify)
    int max_comp = 0;  // compressed rows any token may see
};

struct attention_decode_plan {
    attention_decode_shape shape;
    attention_decode_capacity cap;
    int heads_per_cta = 1;  // G: vectors per CTA = rows x G <= 16
    int raw_chunks = 0, comp_chunks = 0;

    static attention_decode_plan make(const attention_decode_shape& s, const attention_decode_capacity& c) {
        require(s.head_dim % 128 == 0 && s.head_dim <= attn_max_dim && s.n_rot == 64 && s.head_dim > s.n_rot &&
                    (s.head_dim - s.n_rot) % e4m3_block_size == 0,
                "attention_decode: head_dim must be a multiple of 128 up to 512 with n_rot 64");
        require(s.n_head > 0 && s.n_swa > 0, "attention_decode: n_head and n_swa must be positive");
        require(c.n_seq > 0 && c.max_q >= 1 && c.max_q <= attn_max_q && c.max_comp >= 0,
                "attention_decode: capacity needs n_seq > 0, 1 <= max_q <= 16, max_comp >= 0");
        attention_decode_plan p;
        p.shape = s;
        p.cap = c;
        const int g_max = attn_max_vec / c.max_q;
        for (int g = 1; g <= g_max; ++g)
            if (s.n_head % g == 0) p.heads_per_cta = g;
        // The union of the windows of max_q consecutive positions spans n_swa + max_q - 1 rows,
        // at most this many 64-row chunks whatever the alignment.
        p.raw_chunks = (s.n_swa + c.max_q - 2) / attn_chunk_rows + 2;
        p.comp_chunks = (c.max_comp + attn_chunk_rows - 1) / attn_chunk_rows;
        return p;
    }
    int chunk_slots() const { return raw_chunks + comp_chunks; }
    std::size_t partial_count() const {
        return std::size_t(cap.n_seq) * std::size_t(chunk_slots()) * std::size_t(cap.max_q) * std::size_t(shape.n_head);
    }
    // float2 (m, l) per partial, then head_dim floats of o per partial.
    std::size_t scratch_bytes() const { return partial_count() * (8 + 4 * std::size_t(shape.head_dim)); }
    std::size_t split_smem_bytes() const {
        const int D = shape.head_dim;
        return std::size_t(attn_max_vec) * D * 4                       // q vectors
               + std::size_t(attn_chunk_rows) * (D / 2 + 2) * 4        // rows as F16, padded
               + std::size_t(attn_max_vec) * attn_chunk_rows * 4 * 2   // scores, p (transposed)
               + std::size_t(attn_chunk_rows) * 4 + attn_max_vec * 8;  // visibility bits, (m, l)
    }
};

struct attention_decode_args {
    const float* q;      // [token][n_head][head_dim], after RoPE
    float* out;          // [token][n_head][head_dim]
    const float* sinks;  // [n_head]
    const std::uint8_t* raw_pages;
    const std::int32_t* raw_page_table;  // [n_seq][raw_table_stride]
    const std::uint8_t* comp_pages;
    const std::int32_t* comp_page_table;  // [n_seq][comp_table_stride]
    const std::int32_t* seq_tok0;         // [n_seq] first token of the sequence's query rows
    const std::int32_t* seq_ntok;         // [n_seq] live query rows, 0 = idle slot
    const std::int32_t* tok_pos;          // [token]
    const std::int32_t* tok_n_comp;       // [token] compressed rows the token may see (<= max_comp)
    const std::uint8_t* comp_mask;        // nullptr, or [token][comp_mask_stride] bytes, 0 = skipped
    int raw_table_stride = 0, comp_table_stride = 0, comp_mask_stride = 0;
    rope_params rope;
    // The tensor-core kernel (attention_decode_mma.cuh) takes the indexer's selection as a list
    // instead of a mask: comp_sel + t * comp_sel_stride holds comp_nsel[t] ascending rows; a count
    // of 0 (the indexer's "every row visible") or a null list means rows 0 .. tok_n_comp[t] - 1.
    const std::int32_t* comp_sel = nullptr;
    const std::int32_t* comp_nsel = nullptr;
    int comp_sel_stride = 0;
    // Optional, the sm_90a tensor-core kernel only (head_dim 512): q as that kernel's shared-memory
    // operand (attention_q16.hpp), q16_token_halves(512) halves per token, which it then copies
    // instead of converting q; q itself stays required (the other kernels read it).
    const __half* q16 = nullptr;
};

struct attention_decode_launch {
    attention_decode_args a;
    float2* ml;  // scratch partials
    float* po;
    int n_head, head_dim, n_rot, n_swa, max_q, heads_per_cta, raw_chunks, chunk_slots;
    float kq_scale;
};

namespace attn_detail {

struct seq_view {
    int ntok, t0, lo, hi, max_comp;
};

__device__ inline bool load_seq(const attention_decode_launch& L, int s, seq_view& v) {
    v.ntok = min(L.a.seq_ntok[s], L.max_q);
    if (v.ntok <= 0) return false;
    v.t0 = L.a.seq_tok0[s];
    v.lo = 0x7fffffff;
    v.hi = -1;
    v.max_comp = 0;
    for (int j = 0; j < v.ntok; ++j) {
        const int p = L.a.tok_pos[v.t0 + j];
        v.lo = min(v.lo, max(0, p - L.n_swa + 1));
        v.hi = max(v.hi, p);
        v.max_comp = max(v.max_comp, L.a.tok_n_comp[v.t0 + j]);
    }
    return v.hi >= 0;
}

__device__ inline std::size_t partial_index(const attention_decode_launch& L, int s, int k, int j, int h) {
    return ((std::size_t(s) * std::size_t(L.chunk_slots) + std::size_t(k)) * std::size_t(L.max_q) + std::size_t(j)) *
               std::size_t(L.n_head) +
           std::size_t(h);
}

__device__ inline float4 half4_to_float4(uint2 u) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

}  // namespace attn_detail

// The kernels below are templates only for linkage: this header may be included by several
// translation units, and a __global__ function cannot be inline.
template <int = 0>
__global__ void __launch_bounds__(attn_threads) attention_split_kernel(const __grid_constant__ attention_decode_launch L) {
    pdl_enter();
    using namespace attn_detail;
    constexpr int C = attn_chunk_rows;
    const int k = static_cast<int>(blockIdx.x), g = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
    const int tid = static_cast<int>(threadIdx.x);
    seq_view sv;
    if (!load_seq(L, s, sv)) return;
    const int D = L.head_dim, G = L.heads_per_cta, P = sv.ntok * G;

    // This slot's chunk: raw chunks from the window union's first, then compressed chunks.
    const bool raw = k < L.raw_chunks;
    const int c = raw ? sv.lo / C + k : k - L.raw_chunks;
    const bool live = raw ? c <= sv.hi / C : c * C < sv.max_comp;
    const std::int32_t page =
        !live ? -1
              : (raw ? L.a.raw_page_table[std::int64_t(s) * L.a.raw_table_stride + c]
                     : L.a.comp_page_table[std::int64_t(s) * L.a.comp_table_stride + c]);
    if (page < 0) {  // nothing visible here for any token: mark empty partials
        for (int v = tid; v < P; v += attn_threads)
            L.ml[partial_index(L, s, k, v / G, g * G + v % G)] = make_float2(-INFINITY, 0.0f);
        return;
    }

    extern __shared__ float4 attn_smem[];
    float* qs = reinterpret_cast<float*>(attn_smem);                    // [16][D]
    std::uint32_t* ks = reinterpret_cast<std::uint32_t*>(qs + attn_max_vec * D);  // [64][D/2 + 2] half2 words
    const int kstride = D / 2 + 2;
    float* sc = reinterpret_cast<float*>(ks + C * kstride);  // [16][64] scores
    float* pt = sc + attn_max_vec * C;                       // [64][16] p (or -1: not visible)
    std::uint32_t* vis = reinterpret_cast<std::uint32_t*>(pt + attn_max_vec * C);  // [64] bit j: row visible to token j
    float2* mls = reinterpret_cast<float2*>(vis + C);                               // [16]

    // Visibility of each row for each query row of the sequence.
    if (tid < C) {
        const int idx = c * C + tid;
        std::uint32_t bits = 0;
        for (int j = 0; j < sv.ntok; ++j) {
            const int t = sv.t0 + j;
            bool ok;
            if (raw) {
                const int p = L.a.tok_pos[t];
                ok = idx <= p && idx >= p - L.n_swa + 1;
            } else {
                ok = idx < L.a.tok_n_comp[t] &&
                     (!L.a.comp_mask || L.a.comp_mask[std::int64_t(t) * L.a.comp_mask_stride + idx] != 0);
            }
            bits |= (ok ? 1u : 0u) << j;
        }
        vis[tid] = bits;
    }
    // q vectors v = j*G + hh (zero beyond P).
    const int D4 = D / 4;
    for (int i = tid; i < attn_max_vec * D4; i += attn_threads) {
        const int v = i / D4, d4 = i % D4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (v < P) {
            const int j = v / G, h = g * G + v % G;
            x = reinterpret_cast<const float4*>(L.a.q + (std::int64_t(sv.t0 + j) * L.n_head + h) * D)[d4];
        }
        reinterpret_cast<float4*>(qs)[i] = x;
    }
    __syncthreads();

    // Rows to F16 in shared memory (exact: stored values are F16 values); invisible rows zero.
    {
        const model::attention_row_layout lay{D, L.n_rot};
        const int nope = lay.n_nope();
        const std::uint8_t* base = (raw ? L.a.raw_pages : L.a.comp_pages) + std::int64_t(page) * C * lay.bytes();
        for (int i = tid; i < C * D4; i += attn_threads) {
            const int r = i / D4, d = 4 * (i % D4);
            uint2 w = make_uint2(0u, 0u);
            if (vis[r] != 0) {
                const std::uint8_t* row = base + std::int64_t(r) * lay.bytes();
                if (d < nope) {
                    const std::uint32_t codes = *reinterpret_cast<const std::uint32_t*>(row + d);
                    const float scale = exp2i(static_cast<std::int8_t>(row[lay.exponent_offset() + d / e4m3_block_size]));
                    std::uint32_t h[4];
                    for (int e = 0; e < 4; ++e)
                        h[e] = f32_to_f16(mul_rn(e4m3_decode(static_cast<std::uint8_t>(codes >> (8 * e))), scale));
                    w = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
                } else {
                    w = *reinterpret_cast<const uint2*>(row + lay.rope_offset() + 2 * (d - nope));
                }
            }
            *reinterpret_cast<uint2*>(ks + r * kstride + d / 2) = w;
        }
    }
    __syncthreads();

    // Scores: warp w takes vectors 2w, 2w+1; lane l rows l and l+32.
    {
        const int v0 = 2 * (tid >> 5), r0 = tid & 31;
        if (v0 < P) {
            float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
            const float* q0 = qs + v0 * D;
            const float* q1 = q0 + D;
            const std::uint32_t* k0 = ks + r0 * kstride;
            const std::uint32_t* k1 = ks + (r0 + 32) * kstride;
#pragma unroll 2
            for (int d = 0; d < D; d += 4) {
                const float4 a0 = half4_to_float4(*reinterpret_cast<const uint2*>(k0 + d / 2));
                const float4 a1 = half4_to_float4(*reinterpret_cast<const uint2*>(k1 + d / 2));
                const float4 b0 = *reinterpret_cast<const float4*>(q0 + d);
                const float4 b1 = *reinterpret_cast<const float4*>(q1 + d);
                acc[0][0] = __fmaf_rn(b0.x, a0.x, acc[0][0]);
                acc[0][1] = __fmaf_rn(b1.x, a0.x, acc[0][1]);
                acc[1][0] = __fmaf_rn(b0.x, a1.x, acc[1][0]);
                acc[1][1] = __fmaf_rn(b1.x, a1.x, acc[1][1]);
                acc[0][0] = __fmaf_rn(b0.y, a0.y, acc[0][0]);
                acc[0][1] = __fmaf_rn(b1.y, a0.y, acc[0][1]);
                acc[1][0] = __fmaf_rn(b0.y, a1.y, acc[1][0]);
                acc[1][1] = __fmaf_rn(b1.y, a1.y, acc[1][1]);
                acc[0][0] = __fmaf_rn(b0.z, a0.z, acc[0][0]);
                acc[0][1] = __fmaf_rn(b1.z, a0.z, acc[0][1]);
                acc[1][0] = __fmaf_rn(b0.z, a1.z, acc[1][0]);
                acc[1][1] = __fmaf_rn(b1.z, a1.z, acc[1][1]);
                acc[0][0] = __fmaf_rn(b0.w, a0.w, acc[0][0]);
                acc[0][1] = __fmaf_rn(b1.w, a0.w, acc[0][1]);
                acc[1][0] = __fmaf_rn(b0.w, a1.w, acc[1][0]);
                acc[1][1] = __fmaf_rn(b1.w, a1.w, acc[1][1]);
            }
            sc[v0 * C + r0] = mul_rn(acc[0][0], L.kq_scale);
            sc[v0 * C + r0 + 32] = mul_rn(acc[1][0], L.kq_scale);
            sc[(v0 + 1) * C + r0] = mul_rn(acc[0][1], L.kq_scale);
            sc[(v0 + 1) * C + r0 + 32] = mul_rn(acc[1][1], L.kq_scale);
        }
    }
    __syncthreads();
    // Chunk max per vector (strict >, from -inf, visible rows ascending).
    if (tid < P) {
        const int j = tid / G;
        float m = -INFINITY;
        for (int r = 0; r < C; ++r)
            if (((vis[r] >> j) & 1u) && sc[tid * C + r] > m) m = sc[tid * C + r];
        mls[tid].x = m;
    }
    __syncthreads();
    for (int i = tid; i < attn_max_vec * C; i += attn_threads) {
        const int v = i / C, r = i % C;
        float p = -1.0f;
        if (v < P && ((vis[r] >> (v / G)) & 1u)) p = exp_f32(sub_rn(sc[i], mls[v].x));
        pt[r * attn_max_vec + v] = p;
    }
    __syncthreads();
    if (tid < P) {
        float l = 0.0f;
        for (int r = 0; r < C; ++r) {
            const float p = pt[r * attn_max_vec + tid];
            if (!(p < 0.0f)) l = add_rn(l, p);
        }
        mls[tid].y = l;
        L.ml[partial_index(L, s, k, tid / G, g * G + tid % G)] = make_float2(mls[tid].x, l);
    }
    __syncthreads();

    // AXPY: thread owns dims 4*(tid % 128) .. +3 of vectors 8*(tid / 128) .. +7.
    {
        const int d0 = 4 * (tid & 127), vb = 8 * (tid >> 7);
        if (d0 < D && vb < P) {
            float acc[8][4];
#pragma unroll
            for (int b = 0; b < 8; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
            for (int r = 0; r < C; ++r) {
                if (vis[r] == 0) continue;
                const float4 x = half4_to_float4(*reinterpret_cast<const uint2*>(ks + r * kstride + d0 / 2));
                const float4 pa = *reinterpret_cast<const float4*>(pt + r * attn_max_vec + vb);
                const float4 pb = *reinterpret_cast<const float4*>(pt + r * attn_max_vec + vb + 4);
                const float p[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
                for (int b = 0; b < 8; ++b) {
                    if (p[b] < 0.0f) continue;
                    acc[b][0] = __fmaf_rn(p[b], x.x, acc[b][0]);
                    acc[b][1] = __fmaf_rn(p[b], x.y, acc[b][1]);
                    acc[b][2] = __fmaf_rn(p[b], x.z, acc[b][2]);
                    acc[b][3] = __fmaf_rn(p[b], x.w, acc[b][3]);
                }
            }
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                const int v = vb + b;
                if (v < P && mls[v].y != 0.0f)
                    *reinterpret_cast<float4*>(L.po + partial_index(L, s, k, v / G, g * G + v % G) * D + d0) =
                        make_float4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
            }
        }
    }
}

namespace attn_detail {

// A load issued where it is written (asm volatile: the compiler neither sinks it below the
// branches after it nor merges it away), through L2: the partials were written by the split grid.
__device__ __forceinline__ float2 load_cg(const float2* p) {
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
    return v;
}

// A merged output pair: o / denom, the inverse RoPE on the last n_rot dims at the token's
// position, stored at out[t][h][d..d+1].
__device__ __forceinline__ void merge_store(const attention_decode_launch& L, int t, int h, int d, float o0, float o1,
                                            float denom) {
    const int D = L.head_dim;
    const float inv = div_rn(1.0f, denom);
    o0 = mul_rn(o0, inv);
    o1 = mul_rn(o1, inv);
    const int nope = D - L.n_rot;
    if (d >= nope) {
        float sn, cs;
        sincos_f32(rope_theta(L.a.rope, static_cast<std::uint32_t>(L.a.tok_pos[t]), (d - nope) / 2), &sn, &cs);
        rope_rotate(o0, o1, cs, -sn);
    }
    *reinterpret_cast<float2*>(L.a.out + (std::int64_t(t) * L.n_head + h) * D + d) = make_float2(o0, o1);
}

}  // namespace attn_detail

template <int KB>
__global__ void __launch_bounds__(attn_merge_threads) attention_merge_kernel(const __grid_constant__ attention_decode_launch L) {
    pdl_enter();
    using namespace attn_detail;
    const int D = L.head_dim, per_head = D / 128;
    const int h = static_cast<int>(blockIdx.x) / per_head;
    const int d = (static_cast<int>(blockIdx.x) % per_head) * 128 + 2 * static_cast<int>(threadIdx.x);
    const int j = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
    seq_view sv;
    if (!load_seq(L, s, sv) || j >= sv.ntok) return;
    const int t = sv.t0 + j;
    const float sink = L.a.sinks[h];
    float M = sink, denom, o0 = 0.0f, o1 = 0.0f;
    if constexpr (KB == 1) {
        // The loop the model's decode and prefill merges were measured with (the batched form
        // below at KB = 1 compiles to different code).
        for (int k = 0; k < L.chunk_slots; ++k) {
            const float2 ml = L.ml[partial_index(L, s, k, j, h)];
            if (ml.y != 0.0f && ml.x > M) M = ml.x;
        }
        denom = exp_f32(sub_rn(sink, M));
        for (int k = 0; k < L.chunk_slots; ++k) {
            const std::size_t pi = partial_index(L, s, k, j, h);
            const float2 ml = L.ml[pi];
            if (ml.y == 0.0f) continue;
            const float w = exp_f32(sub_rn(ml.x, M));
            denom = fma_f32(w, ml.y, denom);
            const float2 o = *reinterpret_cast<const float2*>(L.po + pi * D + d);
            o0 = fma_f32(w, o.x, o0);
            o1 = fma_f32(w, o.y, o1);
        }
    } else {
        // Slots in batches of KB whose loads are all issued before their first use (the loop
        // above is one dependent round trip per slot, twice); the max and the sums still go
        // through the slots in order, and an empty slot's o is never read.
        const int n_slots = L.chunk_slots;
        auto load_ml = [&](int k0, float2 (&ml)[KB]) {
#pragma unroll
            for (int i = 0; i < KB; ++i)
                ml[i] = k0 + i < n_slots ? L.ml[partial_index(L, s, k0 + i, j, h)] : make_float2(0.0f, 0.0f);
        };
        for (int k0 = 0; k0 < n_slots; k0 += KB) {
            float2 ml[KB];
            load_ml(k0, ml);
#pragma unroll
            for (int i = 0; i < KB; ++i)
                if (ml[i].y != 0.0f && ml[i].x > M) M = ml[i].x;
        }
        denom = exp_f32(sub_rn(sink, M));
        for (int k0 = 0; k0 < n_slots; k0 += KB) {
            float2 ml[KB], o[KB];
            load_ml(k0, ml);
#pragma unroll
            for (int i = 0; i < KB; ++i)
                o[i] = ml[i].y != 0.0f
                           ? *reinterpret_cast<const float2*>(L.po + partial_index(L, s, k0 + i, j, h) * D + d)
                           : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int i = 0; i < KB; ++i) {
                if (ml[i].y == 0.0f) continue;
                const float w = exp_f32(sub_rn(ml[i].x, M));
                denom = fma_f32(w, ml[i].y, denom);
                o0 = fma_f32(w, o[i].x, o0);
                o1 = fma_f32(w, o[i].y, o1);
            }
        }
    }
    attn_detail::merge_store(L, t, h, d, o0, o1, denom);
}

// The same merge for decode steps whose rows have at most attn_merge_few slots (the model's 2..3):
// the slots' (m, l) and o are all loaded at once after the wait, beside the sequence view's first
// loads, and the sink (a weight) before it, where the slot loop above makes one dependent L2 round
// trip per slot and step (ncu, H100, 2..3 slots: 7.9 us, two thirds of the stalls on global
// loads). The arithmetic is attention_merge_kernel<1>'s, in the same order: the same bits. An
// empty slot's o is loaded and never read. Measured (H100): the chunk bench 4096/1/256, split and
// merge, 23.8 -> 22.4 us; the 30-layer decode +0.4% (bench/RESULTS.md, thirty-seventh session).
template <int = 0>
__global__ void __launch_bounds__(attn_merge_threads) attention_merge_few_kernel(const __grid_constant__ attention_decode_launch L) {
    using namespace attn_detail;
    const int D = L.head_dim, per_head = D / 128;
    const int h = static_cast<int>(blockIdx.x) / per_head;
    const int d = (static_cast<int>(blockIdx.x) % per_head) * 128 + 2 * static_cast<int>(threadIdx.x);
    const int j = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
    const float sink = L.a.sinks[h];
    pdl_enter();
    const int n_slots = L.chunk_slots;
    float2 ml[attn_merge_few], o[attn_merge_few];
#pragma unroll
    for (int k = 0; k < attn_merge_few; ++k) {
        const std::size_t pi = partial_index(L, s, k < n_slots ? k : 0, j, h);
        ml[k] = load_cg(L.ml + pi);
        o[k] = load_cg(reinterpret_cast<const float2*>(L.po + pi * D + d));
    }
    seq_view sv;
    if (!load_seq(L, s, sv) || j >= sv.ntok) return;
    const int t = sv.t0 + j;
    float M = sink;
#pragma unroll
    for (int k = 0; k < attn_merge_few; ++k)
        if (k < n_slots && ml[k].y != 0.0f && ml[k].x > M) M = ml[k].x;
    float denom = exp_f32(sub_rn(sink, M)), o0 = 0.0f, o1 = 0.0f;
#pragma unroll
    for (int k = 0; k < attn_merge_few; ++k) {
        if (k >= n_slots || ml[k].y == 0.0f) continue;
        const float w = exp_f32(sub_rn(ml[k].x, M));
        denom = fma_f32(w, ml[k].y, denom);
        o0 = fma_f32(w, o[k].x, o0);
        o1 = fma_f32(w, o[k].y, o1);
    }
    merge_store(L, t, h, d, o0, o1, denom);
}

namespace attn_detail {

// The launch values both split kernels and the merge read; scratch holds partial_count (m, l)
// pairs, then partial_count * head_dim floats of o.
inline attention_decode_launch make_launch(const attention_decode_shape& s, const attention_decode_capacity& cap,
                                           const attention_decode_args& args, void* scratch, std::size_t partial_count,
                                           int chunk_slots, int raw_chunks, int heads_per_cta) {
    attention_decode_launch L;
    L.a = args;
    L.ml = static_cast<float2*>(scratch);
    L.po = reinterpret_cast<float*>(static_cast<char*>(scratch) + partial_count * sizeof(float2));
    L.n_head = s.n_head;
    L.head_dim = s.head_dim;
    L.n_rot = s.n_rot;
    L.n_swa = s.n_swa;
    L.max_q = cap.max_q;
    L.heads_per_cta = heads_per_cta;
    L.raw_chunks = raw_chunks;
    L.chunk_slots = chunk_slots;
    L.kq_scale = 1.0f / std::sqrt(float(s.head_dim));  // as reference/attention_decode
    return L;
}

// The merge of a step's partials, batched or not by its slots and grid (the same bits either way).
inline void launch_merge(const attention_decode_shape& s, const attention_decode_capacity& cap,
                         const attention_decode_launch& L, cudaStream_t stream) {
    const dim3 grid(s.n_head * (s.head_dim / 128), cap.max_q, cap.n_seq);
    const bool small = std::int64_t(grid.x) * grid.y * grid.z <= attn_merge_batch_ctas;
    const bool batched = L.chunk_slots > attn_merge_batch && small;
    // DS4_ATTN_MERGE=1 keeps the slot-at-a-time kernel where the few-slot one would run; =2 takes
    // the few-slot kernel on any grid (a prefill chunk's 2..3 slots: one round trip instead of
    // two per slot, at ~16 more registers). Measurement switches, the same bits.
    const int forced = env_choice("DS4_ATTN_MERGE", {1, 2});
    const bool few = L.chunk_slots <= attn_merge_few && (small || forced == 2) && forced != 1;
    launch_kernel("attention_merge_kernel",
                  few       ? attention_merge_few_kernel<>
                  : batched ? attention_merge_kernel<attn_merge_batch>
                            : attention_merge_kernel<1>,
                  grid, attn_merge_threads, 0, stream, L);
    cuda_check_launch("attention_merge");
}

}  // namespace attn_detail

// One attention step on `stream`: split then merge. `scratch` holds plan.scratch_bytes() (any
// contents). All of args' pointers are device memory; nothing is read back on the host.
inline void attention_decode(const attention_decode_plan& plan, const attention_decode_args& args, void* scratch,
                             cudaStream_t stream) {
    const auto& s = plan.shape;
    const attention_decode_launch L = attn_detail::make_launch(s, plan.cap, args, scratch, plan.partial_count(),
                                                               plan.chunk_slots(), plan.raw_chunks, plan.heads_per_cta);
    const int smem = static_cast<int>(plan.split_smem_bytes());
    raise_smem_limit(attention_split_kernel<>, std::size_t(smem), "attention_split smem", stream);
    launch_kernel("attention_split_kernel", attention_split_kernel<>,
                  dim3(plan.chunk_slots(), s.n_head / plan.heads_per_cta, plan.cap.n_seq), attn_threads, smem, stream,
                  L);
    cuda_check_launch("attention_split");
    attn_detail::launch_merge(s, plan.cap, L, stream);
}

// The split kernel's shared-memory opt-in on `device`, for every plan (the largest head_dim):
// call once per device before capturing a launch.
inline void prepare_attention_decode(int device) {
    attention_decode_plan p;
    p.shape.head_dim = attn_max_dim;
    with_device(device, [&] { raise_smem_limit(attention_split_kernel<>, p.split_smem_bytes(), "attention_split smem"); });
}

}  // namespace ds4::kernels
