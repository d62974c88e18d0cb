#pragma once
// Prefill attention for one sequence's chunk of n_tok query tokens at positions p0 .. p0+n_tok-1
// (model.md §2.4 steps 9-10) on tensor cores: mma.sync.m16n8k16, f16 operands, fp32 accumulation.
// MQA: all n_head heads use the same K=V row. Token t (position pos) sees the raw window rows
// max(0, pos-n_swa+1) .. pos and the compressed rows c < n_comp(pos) = (pos+1) / ratio (ratio 0:
// none). Every compressed row below n_comp is visible: this first version takes no indexer mask
// (ratio-4 layers past 512 compressed rows need it before this kernel can serve them in the graph).
// The head's sink joins the denominator; inverse RoPE on the output's last n_rot dims at pos.
// Rows are native kv_layout.hpp rows in pages (raw row at absolute position p in raw page table
// entry p / 64, compressed row c in entry c / 64), decoded to F16 in shared memory: exact, the
// stored values are F16 values (decode_attention_row).
//
// Contract: bounded. q is rounded to F16 (relative 2^-11 per element) and p = exp2(s - m) is
// rounded to F16 for the P.V product; scores, softmax state, sums and outputs are fp32, exp2f of
// logits pre-scaled by log2(e)/sqrt(head_dim) (ex2.approx). Row order differs from the reference
// (online softmax over 64-row tiles: raw pages ascending, then compressed pages ascending), so the
// result is not bitwise. Measured against an fp64 evaluation of the same formula on the same
// stored rows by ds4-validate (attention_prefill rows): relative L2 <= 3e-3 over a case, every
// element within 3e-2 absolute (outputs are convex combinations of rows of unit scale); NaN/Inf
// positions equal. The max difference to the sequential F32 reference is reported beside it.
// Graph contract: no allocation, no host synchronisation; p0 and n_tok are launch values (the grid
// is one CTA per token), page tables are read on the device. No scratch.
// Shapes: head_dim 128 or 512, n_rot 64, n_head a multiple of 8 up to 64.
//
// Work split: one CTA per token (the tokens with most rows launch first), 8 warps; warp w owns
// heads 16*(w/2) .. +15 (the M dimension) and output dims (w%2)*D/2 .. +D/2. Each 64-row K=V tile
// is decoded once into shared memory and read by all warps. The two warps of a head group each
// compute the scores over their half of the dims and exchange them through shared memory
// (both sums are a + b in the same order, so both warps hold bitwise equal scores and softmax
// state). Per warp per tile: 8 x D/32 mma for the scores, D/16 x 4 for P.V.
// Cost (not yet measured on a device): the tile load is not overlapped with the mma (one CTA per
// SM at flash: 165 KiB of shared memory, ~200 registers per thread).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int prefill_tile_rows = model::kv_page_rows;  // one page per K=V tile
inline constexpr int prefill_threads = 256;
inline constexpr int prefill_max_heads = 64;

struct attention_prefill_shape {
    int n_head = 0, head_dim = 0, n_rot = 0, n_swa = 0;
    int ratio = 0;  // compressed rows visible to pos: (pos + 1) / ratio; 0 = no compressed rows
};

struct attention_prefill_args {
    const float* q;      // [n_tok][n_head][head_dim], after RoPE
    float* out;          // [n_tok][n_head][head_dim]
    const float* sinks;  // [n_head]
    const std::uint8_t* raw_pages;
    const std::int32_t* raw_page_table;  // entry p / 64 for the raw row at absolute position p
    const std::uint8_t* comp_pages;
    const std::int32_t* comp_page_table;  // entry c / 64 for compressed row c
    int p0 = 0, n_tok = 0;
    rope_params rope;
};

namespace prefill_detail {

template <int D>
struct geometry {
    static_assert(D == 128 || D == 512, "attention_prefill: head_dim 128 or 512");
    static constexpr int rows = prefill_tile_rows;
    static constexpr int half_dims = D / 2;         // output dims (and score dims) per warp
    static constexpr int stride = D + 8;            // halves per smem row: 4-bank skew, conflict-free
    static constexpr int n_tiles_o = half_dims / 8;  // n8 tiles of the output per warp
    static constexpr std::size_t q_bytes = std::size_t(prefill_max_heads) * stride * 2;
    static constexpr std::size_t k_bytes = std::size_t(rows) * stride * 2;
    static constexpr std::size_t x_bytes = std::size_t(8) * 16 * rows * 4;  // score halves per warp
    static constexpr std::size_t smem_bytes = q_bytes + k_bytes + x_bytes;
};

__device__ __forceinline__ void mma_16816(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                          std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
    const auto a = static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ std::uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
}

}  // namespace prefill_detail

template <int D>
__global__ void __launch_bounds__(prefill_threads, 1)
    attention_prefill_kernel(const __grid_constant__ attention_prefill_args a, attention_prefill_shape s) {
    using namespace prefill_detail;
    using G = geometry<D>;
    constexpr int R = G::rows, S = G::stride, HD = G::half_dims;
    const int t = a.n_tok - 1 - static_cast<int>(blockIdx.x);  // most rows first
    const int pos = a.p0 + t;
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    const int hg = warp >> 1, half = warp & 1;
    const bool active = hg * 16 < s.n_head;

    extern __shared__ float4 prefill_smem[];
    __half* qs = reinterpret_cast<__half*>(prefill_smem);               // [64][S]
    __half* ks = qs + prefill_max_heads * S;                            // [64][S]
    float* xs = reinterpret_cast<float*>(ks + R * S);                   // [8 warps][8 tiles][4][32]

    // q (F32) -> F16 in shared memory; heads past n_head are zero.
    for (int i = tid; i < prefill_max_heads * (D / 4); i += prefill_threads) {
        const int h = i / (D / 4), d = 4 * (i % (D / 4));
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < s.n_head) x = *reinterpret_cast<const float4*>(a.q + (std::int64_t(t) * s.n_head + h) * D + d);
        *reinterpret_cast<uint2*>(qs + h * S + d) = make_uint2(pack_half2(x.x, x.y), pack_half2(x.z, x.w));
    }

    const int raw_lo = max(0, pos - s.n_swa + 1);
    const int n_comp = s.ratio > 0 ? (pos + 1) / s.ratio : 0;
    const int raw_first = raw_lo / R, n_raw_tiles = pos / R - raw_first + 1;
    const int n_tiles = n_raw_tiles + (n_comp + R - 1) / R;
    const float scale_log2 = 1.4426950408889634f / sqrtf(float(D));

    float o[G::n_tiles_o][4];
#pragma unroll
    for (int j = 0; j < G::n_tiles_o; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    const model::attention_row_layout lay{D, 64};
    constexpr int nope = D - 64;
    for (int tile = 0; tile < n_tiles; ++tile) {
        const bool raw = tile < n_raw_tiles;
        const int page_idx = raw ? raw_first + tile : tile - n_raw_tiles;
        const int base = page_idx * R;  // absolute position (raw) or index (compressed) of row 0
        const int vis_lo = raw ? raw_lo : 0, vis_hi = raw ? pos : n_comp - 1;  // inclusive
        __syncthreads();  // previous tile consumed (K and the score exchange)
        {
            const std::int32_t page = raw ? a.raw_page_table[page_idx] : a.comp_page_table[page_idx];
            const std::uint8_t* pg = (raw ? a.raw_pages : a.comp_pages) + std::int64_t(page) * R * lay.bytes();
            // 8 dims per item; rows no token of this CTA sees are zero (p = 0 must not meet NaN).
            for (int i = tid; i < R * (D / 8); i += prefill_threads) {
                const int r = i / (D / 8), d = 8 * (i % (D / 8));
                const int idx = base + r;
                uint4 w = make_uint4(0u, 0u, 0u, 0u);
                if (idx >= vis_lo && idx <= vis_hi) {
                    const std::uint8_t* row = pg + std::int64_t(r) * lay.bytes();
                    if (d < nope) {
                        const uint2 codes = *reinterpret_cast<const uint2*>(row + d);
                        const float sc = exp2i(static_cast<std::int8_t>(row[lay.exponent_offset() + d / e4m3_block_size]));
                        std::uint32_t h[8];
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            const std::uint32_t word = e < 4 ? codes.x : codes.y;
                            h[e] = f32_to_f16(mul_rn(e4m3_decode(static_cast<std::uint8_t>(word >> (8 * (e & 3)))), sc));
                        }
                        w = make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
                    } else {
                        w = *reinterpret_cast<const uint4*>(row + lay.rope_offset() + 2 * (d - nope));
                    }
                }
                *reinterpret_cast<uint4*>(ks + r * S + d) = w;
            }
        }
        __syncthreads();

        float sc[8][4];
        if (active) {
            // Scores over this warp's half of the dims: A = q rows (heads), B[k=d][n=row] = K[row][d].
#pragma unroll
            for (int j = 0; j < 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            const __half* qa = qs + (hg * 16 + g) * S + half * HD + 2 * c;
            const __half* kb = ks + g * S + half * HD + 2 * c;
#pragma unroll 2
            for (int k0 = 0; k0 < HD; k0 += 16) {
                const std::uint32_t a0 = *reinterpret_cast<const std::uint32_t*>(qa + k0);
                const std::uint32_t a1 = *reinterpret_cast<const std::uint32_t*>(qa + 8 * S + k0);
                const std::uint32_t a2 = *reinterpret_cast<const std::uint32_t*>(qa + k0 + 8);
                const std::uint32_t a3 = *reinterpret_cast<const std::uint32_t*>(qa + 8 * S + k0 + 8);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const __half* kr = kb + 8 * j * S + k0;
                    mma_16816(sc[j], a0, a1, a2, a3, *reinterpret_cast<const std::uint32_t*>(kr),
                              *reinterpret_cast<const std::uint32_t*>(kr + 8));
                }
            }
            float* mine = xs + warp * (8 * 4 * 32);
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[(j * 4 + e) * 32 + lane] = sc[j][e];
        }
        __syncthreads();
        if (!active) continue;
        {
            // Full scores = low half + high half (same order in both warps: bitwise equal).
            const float* lo_half = xs + (warp & ~1) * (8 * 4 * 32);
            const float* hi_half = lo_half + 8 * 4 * 32;
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = base + 8 * j + 2 * c + (e & 1);
                    const float v = lo_half[(j * 4 + e) * 32 + lane] + hi_half[(j * 4 + e) * 32 + lane];
                    sc[j][e] = (col >= vis_lo && col <= vis_hi) ? v * scale_log2 : -INFINITY;
                }
        }
        // Online softmax for rows g (e = 0, 1) and g + 8 (e = 2, 3); a quad holds one row.
        float alpha[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * rr], sc[j][2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[rr], mx);
            const float b = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: p = 0, no NaN
            alpha[rr] = exp2f(m[rr] - b);
            m[rr] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                sc[j][2 * rr] = exp2f(sc[j][2 * rr] - b);
                sc[j][2 * rr + 1] = exp2f(sc[j][2 * rr + 1] - b);
                sum += sc[j][2 * rr] + sc[j][2 * rr + 1];
            }
            l[rr] = l[rr] * alpha[rr] + sum;  // this thread's columns; the quad is summed at the end
        }
#pragma unroll
        for (int j = 0; j < G::n_tiles_o; ++j) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }
        // O += P . V: P from the score accumulators (F16), V[row][d] by ldmatrix.trans.
        const int lr = lane & 7, lm = lane >> 3;
#pragma unroll
        for (int kk = 0; kk < R / 16; ++kk) {
            const std::uint32_t p0 = pack_half2(sc[2 * kk][0], sc[2 * kk][1]);
            const std::uint32_t p1 = pack_half2(sc[2 * kk][2], sc[2 * kk][3]);
            const std::uint32_t p2 = pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            const std::uint32_t p3 = pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            const __half* vb = ks + (16 * kk + (lm & 1) * 8 + lr) * S + half * HD + (lm >> 1) * 8;
#pragma unroll
            for (int j = 0; j < G::n_tiles_o; j += 2) {
                std::uint32_t b[4];
                ldmatrix_x4_trans(b, vb + 8 * j);
                mma_16816(o[j], p0, p1, p2, p3, b[0], b[1]);
                mma_16816(o[j + 1], p0, p1, p2, p3, b[2], b[3]);
            }
        }
    }
    if (!active) return;

    // Sink, normalisation, inverse RoPE of the tail, store.
    const float log2e = 1.4426950408889634f;
    float fac[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float lsum = l[rr];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const int h = hg * 16 + g + 8 * rr;
        const float sk = h < s.n_head ? a.sinks[h] * log2e : 0.0f;
        const float M = fmaxf(m[rr], sk);
        const float w = exp2f(m[rr] - M);
        fac[rr] = w / (lsum * w + exp2f(sk - M));
    }
#pragma unroll
    for (int j = 0; j < G::n_tiles_o; ++j) {
        const int d = half * HD + 8 * j + 2 * c;
        float sn = 0.0f, cs = 1.0f;
        if (d >= nope) sincos_f32(rope_theta(a.rope, static_cast<std::uint32_t>(pos), (d - nope) / 2), &sn, &cs);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int h = hg * 16 + g + 8 * rr;
            float x0 = o[j][2 * rr] * fac[rr], x1 = o[j][2 * rr + 1] * fac[rr];
            if (d >= nope) rope_rotate(x0, x1, cs, -sn);
            if (h < s.n_head)
                *reinterpret_cast<float2*>(a.out + (std::int64_t(t) * s.n_head + h) * D + d) = make_float2(x0, x1);
        }
    }
}

// Shared memory one launch needs (opt-in above 48 KiB; 162 KiB at head_dim 512 fits sm_80's 163).
inline std::size_t attention_prefill_smem_bytes(int head_dim) {
    return head_dim == 512 ? prefill_detail::geometry<512>::smem_bytes : prefill_detail::geometry<128>::smem_bytes;
}

namespace prefill_detail {

template <int D>
void launch(const attention_prefill_shape& s, const attention_prefill_args& args, cudaStream_t stream) {
    constexpr int smem = static_cast<int>(geometry<D>::smem_bytes);
    // Raised once per thread and instantiation, so a launch inside a graph capture sets nothing.
    static thread_local bool opted_in = false;
    if (!opted_in) {
        cuda_check(cudaFuncSetAttribute(attention_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                   "attention_prefill smem");
        opted_in = true;
    }
    attention_prefill_kernel<D><<<args.n_tok, prefill_threads, smem, stream>>>(args, s);
    cuda_check_launch("attention_prefill");
}

}  // namespace prefill_detail

// One chunk's attention on `stream`. All of args' pointers are device memory.
inline void attention_prefill(const attention_prefill_shape& s, const attention_prefill_args& args, cudaStream_t stream) {
    require((s.head_dim == 128 || s.head_dim == 512) && s.n_rot == 64,
            "attention_prefill: head_dim must be 128 or 512 with n_rot 64");
    require(s.n_head > 0 && s.n_head % 8 == 0 && s.n_head <= prefill_max_heads,
            "attention_prefill: n_head must be a multiple of 8 up to 64");
    require(s.n_swa > 0 && s.ratio >= 0 && args.p0 >= 0 && args.n_tok >= 0, "attention_prefill: bad shape or chunk");
    if (args.n_tok == 0) return;
    if (s.head_dim == 512) prefill_detail::launch<512>(s, args, stream);
    else prefill_detail::launch<128>(s, args, stream);
}

}  // namespace ds4::kernels
