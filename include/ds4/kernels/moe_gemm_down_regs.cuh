#pragma once
// The grouped MoE's down (moe_gemm.cuh) with the Q2_K weights decoded straight into the mma.sync
// A fragments: the same work items, contract and bits as moe_gemm_down_kernel, with the layout of
// moe_gemm_gate_up_regs.cuh (a warp: one m16 tile of output rows x every pair of the item).
//
// Lane (g, t)'s A words of a k-step are word t of the two 16-byte pieces of rows g and g + 8
// (k 0..15 and 16..31 of the sub-block, natural order): (w >> 2j) & 0x03030303 times the group's
// scale (<= 45 per byte, no carries), three instructions a word, no shared-memory round trip. The
// 8 k-steps of a block chain into one accumulator; the min term is the tile kernel's one u8 x s8
// mma per output tile, its A words formed from the row's scale bytes in registers.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_gemm_down_parts.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"

namespace ds4::kernels {

inline constexpr int moe_down_regs_threads = 256;

namespace moe_down_regs_detail {

using namespace moe_gemm_detail;

inline constexpr int stages = 3;
static_assert(moe_down_regs_threads / 32 == 4 * 32 / 16, "one warp per m16 tile of the CTA's four 32-row tiles");

struct stage {
    alignas(16) std::uint8_t raw[4][down_tile_bytes];
    alignas(16) std::uint8_t act[moe_gemm_pairs_cta * 256];  // the pairs' Q8_K block of mid (act_offset)
    alignas(16) std::int16_t bsums[moe_gemm_pairs_cta][16];
    float xd[moe_gemm_pairs_cta];
    std::uint32_t dd[4 * 32];  // d | dmin << 16 of each weight row's block
};
struct shared {
    stage st[stages];
    std::int32_t pair[moe_gemm_pairs_cta];
};
inline constexpr int smem = int(sizeof(shared));
static_assert(2 * smem <= 227 * 1024 && smem <= 166912, "two CTAs per sm_90 SM, one within sm_80's opt-in");

// One thread's copies, formed once per CTA (block b adds b * step, b words, 16 b sums, 256 b, b).
struct sources {
    const std::uint8_t* q;
    std::size_t step;
    std::uint32_t w[3];       // weight chunks tid + 256 i of the four tiles' 10 KiB block (640 chunks)
    const std::uint32_t* dd;  // threads < 128: row o0 + tid's word of block 0
    std::uint32_t bs;         // threads < 128: pair tid / 2, half tid % 2 of its 16-sums
    int bs_p;
    std::uint32_t a[4];       // activation chunks tid + 256 i: pair c / 16, piece c % 16
    std::uint32_t xd;         // threads < 64: pair tid's scale
};
inline constexpr int w_chunks = 4 * down_tile_bytes / 16;
__device__ __forceinline__ sources sources_of(const moe_gemm_launch& L, int e, int o0, const std::int32_t* pair, int count) {
    const auto lay = down_layout(L.shape);
    const int tid = int(threadIdx.x), n_ff = L.shape.n_ff, nb = n_ff / 256;
    sources s;
    s.q = L.a.down_q + std::size_t(e) * lay.quant_bytes();
    s.step = lay.quant_offset(o0, 1, 0) - lay.quant_offset(o0, 0, 0);
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const int c = tid + i * moe_down_regs_threads;
        s.w[i] = c < w_chunks ? std::uint32_t(lay.quant_offset(o0 + 32 * (c / (down_tile_bytes / 16)), 0, 0) +
                                              c % (down_tile_bytes / 16) * 16)
                              : 0u;
    }
    s.dd = L.a.down_dd + std::size_t(e) * lay.dd_count() + lay.dd_index(o0 + tid % 128, 0);
    s.bs_p = tid / 2 % moe_gemm_pairs_cta;
    s.bs = std::uint32_t(pair[s.bs_p < count ? s.bs_p : 0]) * std::uint32_t(n_ff / 16) + 8u * std::uint32_t(tid % 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = tid + i * moe_down_regs_threads, p = c / 16;
        s.a[i] = std::uint32_t(p < count ? pair[p] : 0) * std::uint32_t(n_ff) + std::uint32_t(c % 16) * 16u;
    }
    const int p = tid % moe_gemm_pairs_cta;
    s.xd = std::uint32_t(p < count ? pair[p] : 0) * std::uint32_t(nb);
    return s;
}
__device__ __forceinline__ void issue(const moe_gemm_launch& L, const sources& s, int count, int b, stage& st) {
    const int tid = int(threadIdx.x);
    const std::uint8_t* qb = s.q + std::size_t(b) * s.step;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        const int c = tid + i * moe_down_regs_threads;
        if (c < w_chunks) cp_async::zfill<16>(&st.raw[0][0] + c * 16, qb + s.w[i], true);
    }
    if (tid < 4 * 32) {
        cp_async::zfill<4>(&st.dd[tid], s.dd + down_layout(L.shape).dd_index(0, b), true);
        cp_async::zfill<16>(&st.bsums[s.bs_p][8 * (tid % 2)], L.w.midq_bsums + s.bs + std::uint32_t(b) * 16u, s.bs_p < count);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = tid + i * moe_down_regs_threads, p = c / 16;
        cp_async::zfill<16>(st.act + act_offset(p, c % 16), L.w.midq + s.a[i] + std::uint32_t(b) * 256u, p < count);
    }
    if (tid < moe_gemm_pairs_cta) cp_async::zfill<4>(&st.xd[tid], L.w.midq_d + s.xd + std::uint32_t(b), tid < count);
}

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

}  // namespace moe_down_regs_detail

template <int = 0>
__global__ void __launch_bounds__(moe_down_regs_threads, 2)
    moe_gemm_down_regs_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
    using namespace moe_down_regs_detail;
    extern __shared__ int4 moe_down_regs_smem[];
    const work_item it = item_of(L);
    if (it.e < 0) return;
    const int first = it.first + it.p0, count = it.count;
    const int n_embd = L.shape.n_embd, nb = L.shape.n_ff / 256;
    auto& sm = *reinterpret_cast<shared*>(moe_down_regs_smem);
    load_pairs(L, first, count, sm.pair);
    __syncthreads();
    const int o0 = int(blockIdx.x) * 128;  // n_embd % 256 == 0: every tile row exists
    const sources src = sources_of(L, it.e, o0, sm.pair, count);

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    const int tt = warp / 2, r0 = 16 * (warp % 2) + g;  // rows r0 and r0 + 8 of tile tt
    const int n_live = (count + 7) / 8;
    constexpr int nt = moe_gemm_pairs_cta / 8;
    float sumf[nt][4];
#pragma unroll
    for (int n = 0; n < nt; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) sumf[n][x] = 0.0f;

    run_ring<stages>(nb, [&](int b, int s) { issue(L, src, count, b, sm.st[s]); }, [&](int b, int s) {
        const stage& st = sm.st[s];
        const std::uint8_t* raw = st.raw[tt];
        const uint4 sc0 = q2_k_scales(st.raw[tt], r0), sc1 = q2_k_scales(st.raw[tt], r0 + 8);
        int isum[nt][4];
#pragma unroll
        for (int n = 0; n < nt; ++n)
#pragma unroll
            for (int x = 0; x < 4; ++x) isum[n][x] = 0;
#pragma unroll
        for (int ib = 0; ib < 8; ++ib) {
            // Sub-block ib = 4k + j: half h is piece 1 + 2k + h shifted by 2j, group 8k + 2j + h.
            const int k = ib / 4, j = ib % 4, gr = 8 * k + 2 * j;
            const std::uint8_t* p0 = raw + (1 + 2 * k) * 512 + 4 * t;
            const std::uint8_t* p1 = raw + (2 + 2 * k) * 512 + 4 * t;
            unsigned a[4];
            a[0] = ((*reinterpret_cast<const unsigned*>(p0 + r0 * 16) >> (2 * j)) & 0x03030303u) * (byte_of(sc0, gr) & 15u);
            a[1] = ((*reinterpret_cast<const unsigned*>(p0 + (r0 + 8) * 16) >> (2 * j)) & 0x03030303u) * (byte_of(sc1, gr) & 15u);
            a[2] = ((*reinterpret_cast<const unsigned*>(p1 + r0 * 16) >> (2 * j)) & 0x03030303u) * (byte_of(sc0, gr + 1) & 15u);
            a[3] = ((*reinterpret_cast<const unsigned*>(p1 + (r0 + 8) * 16) >> (2 * j)) & 0x03030303u) * (byte_of(sc1, gr + 1) & 15u);
#pragma unroll
            for (int n = 0; n < nt; ++n) {
                if (n >= n_live) break;
                unsigned b0, b1;
                b_frag(st.act, 8 * n + g, ib, t, b0, b1);
                mma_s8(isum[n], a, b0, b1);
            }
        }
        // summs = sum over groups of bsum_g * min_g as one u8 x s8 mma per n-tile (moe_gemm.cuh):
        // row words [min_g, g = 4t..4t+3 | 16 min_g] against [lo | hi] of the pair's 16-sums.
        const unsigned w0 = word_of(sc0, t), w1 = word_of(sc1, t);
        const unsigned am[4] = {(w0 >> 4) & 0x0f0f0f0fu, (w1 >> 4) & 0x0f0f0f0fu, w0 & 0xf0f0f0f0u, w1 & 0xf0f0f0f0u};
        const std::uint32_t dv0 = st.dd[tt * 32 + r0], dv1 = st.dd[tt * 32 + r0 + 8];
        const float d[2] = {f16_operand(std::uint16_t(dv0 & 0xffffu)), f16_operand(std::uint16_t(dv1 & 0xffffu))};
        const float dm[2] = {f16_operand(std::uint16_t(dv0 >> 16)), f16_operand(std::uint16_t(dv1 >> 16))};
#pragma unroll
        for (int n = 0; n < nt; ++n) {
            if (n >= n_live) break;
            const uint2 v = *reinterpret_cast<const uint2*>(&st.bsums[8 * n + g][4 * t]);
            int summs[4] = {0, 0, 0, 0};
            mma_u8s8(summs, am, bsums_lo(v), bsums_hi(v));
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int h = x / 2;
                const float xd = st.xd[8 * n + 2 * t + x % 2];
                const float dall = mul_rn(xd, d[h]), dmin = mul_rn(xd, dm[h]);
                sumf[n][x] = add_rn(sumf[n][x], sub_rn(mul_rn(dall, float(isum[n][x])), mul_rn(dmin, float(summs[x]))));
            }
        }
    });
    cp_async::wait<0>();
#pragma unroll
    for (int n = 0; n < nt; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int pr = 8 * n + 2 * t + x % 2, o = o0 + 32 * tt + r0 + 8 * (x / 2);
            if (pr < count) L.w.ys[std::size_t(sm.pair[pr]) * n_embd + o] = sumf[n][x];
        }
}

}  // namespace ds4::kernels
