#pragma once
// The grouped MoE's gate/up (moe_gemm.cuh) with the IQ2_XXS weights decoded straight into the
// mma.sync A fragments, never into shared memory: the same work items, contract and bits as
// moe_gemm_gate_up_kernel, fewer instructions per mma.
//
// Why: the tile kernel decodes a block's 128 weight rows into shared memory, then 16 warps load
// them back as A fragments, four warps per fragment (a warp covers 16 of the 64 pairs); ncu
// counted ~25 instructions per IMMA (1.49 G for 59 M) at ~0.56 IPC. Here a warp covers one m16
// tile of weight rows and every pair of the item, so each weight is decoded once, by the thread
// whose fragment holds it.
//
// The k order inside a 32-weight sub-block is free (an integer dot is exact in any order) as long
// as A and B agree, so lane (g, t) takes grid group t of rows g and g + 8: one selector lookup per
// row gives both of its A words (a0 = weights 8t..8t+3 at mma k 4t.., a2 = weights 8t+4..8t+7 at
// mma k 16 + 4t..), and its B words are bytes 8t..8t+7 of the pair's sub-block, one 8-byte load.
// The rest is the tile kernel's arithmetic in its order: sumi per sub-block from a zero
// accumulator, bsum += sumi * (2s + 1), then per block sumf += (d_w * d_x) * bsum.
//
// CTA: f-tile of 64 f-rows (tiles 0, 1 gate, 2, 3 up: 128 weight rows) x the item's pairs (<= 64).
// 8 warps, warp w: tile w / 2, rows 16 (w % 2) .. +15, n-tiles of 8 pairs up to the item's count.
// Two CTAs per SM (<= 128 registers, ~103 KB of shared memory): a ring of three stages (the four
// tiles' raw blocks, the pairs' Q8_K block and scales) landed by cp.async two blocks ahead.
//
// A block runs A-stationary: all eight sub-blocks' A words are decoded first (sixteen independent
// lookup chains), then each n-tile issues its eight mmas, independent of one another. Decoding
// per sub-block between the n-tiles' guarded mmas left each sub-block's lookup chain exposed
// (34% of stalls were fixed-latency waits); this order is 7% faster on the H100. The 32 A words
// and 16 scales take the registers of the n-tiles' integer sums, so n-tiles 4..7 keep their float
// sums in shared memory (one float4 load and store a block).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/launch.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_gemm_gate_up_parts.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"

namespace ds4::kernels {

inline constexpr int moe_gu_regs_threads = 256;

namespace moe_gu_regs_detail {

using namespace moe_gemm_detail;

inline constexpr int stages = 3;
inline constexpr int warps = moe_gu_regs_threads / 32;
// n-tiles whose float sums stay in registers; the rest live in shared memory (one float4 load and
// store a block), so a block's 32 A words and 16 scales fit in 128 registers beside them.
inline constexpr int reg_tiles = 4;
static_assert(warps == 4 * 32 / 16, "one warp per m16 tile of the f-tile's four 32-row tiles");

struct stage {
    alignas(16) std::uint8_t raw[4][gu_tile_bytes];              // the tiles' block as stored
    alignas(16) std::uint8_t act[moe_gemm_pairs_cta * 256];      // the pairs' Q8_K block (act_at)
    float xd[moe_gemm_pairs_cta];
    std::uint32_t d2[4 * 32];                                    // word holding each row's F16 d
};
struct shared {
    union {
        stage st[stages];
        float res[2][moe_gemm_pairs_cta][64];  // gate and up of the f-tile (after the loop)
    } u;
    std::int32_t row[moe_gemm_pairs_cta];
    iq2_sel_tables sel;
    float4 sumf_hi[(moe_gemm_pairs_cta / 8) - reg_tiles][moe_gu_regs_threads];  // a thread's sums of n-tiles >= reg_tiles
};
inline constexpr int smem = int(sizeof(shared));
static_assert(2 * smem <= 227 * 1024 && smem <= 166912, "two CTAs per sm_90 SM, one within sm_80's opt-in");

// 16-byte chunk c of pair p's block at chunk c ^ 2 (p % 8): a warp's B loads (pairs 8 ni + g,
// 8 bytes at 8t of one sub-block: chunks 2 ib and 2 ib + 1) then meet each bank once per
// half-warp (the tile kernel's c ^ (p % 8) pairs rows g and g ^ 1 on the same banks).
__device__ __forceinline__ int act_at(int p, int c) { return p * 256 + ((c ^ (2 * (p & 7))) * 16); }

// One thread's copies, formed once per CTA (the block adds b * step, 256 b, b).
struct sources {
    const std::uint8_t* w[2];  // weight chunks tid and tid + 256 of the four tiles' 8 KiB block
    std::size_t step;
    const std::uint16_t* d;    // threads < 128: its row's scale array, d_f the row
    int d_f;
    std::uint32_t q[4];        // activation chunks tid + 256 i: pair c / 16, piece c % 16
    std::uint32_t xd;          // threads < 64: pair tid's scale
};
__device__ __forceinline__ sources sources_of(const moe_gemm_launch& L, int e, int f0, const std::int32_t* rows, int count) {
    const auto lay = gate_up_layout(L.shape);
    const int tid = int(threadIdx.x), nb = L.shape.n_embd / 256;
    sources s;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int c = tid + i * moe_gu_regs_threads, tile = c / (gu_tile_bytes / 16);
        s.w[i] = (tile >= 2 ? L.a.up_q : L.a.gate_q) + std::size_t(e) * lay.quant_bytes() +
                 lay.quant_offset(f0 + 32 * (tile % 2), 0, 0) + (c % (gu_tile_bytes / 16)) * 16;
    }
    s.step = lay.quant_offset(f0, 1, 0) - lay.quant_offset(f0, 0, 0);
    const int dt = tid / 32 % 4;
    s.d_f = f0 + 32 * (dt % 2) + tid % 32;
    s.d = (dt >= 2 ? L.a.up_d : L.a.gate_d) + std::size_t(e) * lay.scale_count();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = tid + i * moe_gu_regs_threads, p = c / 16;
        s.q[i] = std::uint32_t(p < count ? rows[p] : 0) * std::uint32_t(L.shape.n_embd) + std::uint32_t(c % 16) * 16u;
    }
    const int p = tid % moe_gemm_pairs_cta;
    s.xd = std::uint32_t(p < count ? rows[p] : 0) * std::uint32_t(nb);
    return s;
}
// Block b into a stage: 8 KiB of weights, 128 scale words, the pairs' 256 quants and scale.
__device__ __forceinline__ void issue(const moe_gemm_launch& L, const sources& s, int count, int b, stage& st) {
    const int tid = int(threadIdx.x);
#pragma unroll
    for (int i = 0; i < 2; ++i)
        cp_async::zfill<16>(&st.raw[0][0] + (tid + i * moe_gu_regs_threads) * 16, s.w[i] + std::size_t(b) * s.step, true);
    if (tid < 4 * 32)
        cp_async::zfill<4>(&st.d2[tid], s.d + (gate_up_layout(L.shape).scale_index(s.d_f, b) & ~std::size_t(1)), true);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int c = tid + i * moe_gu_regs_threads, p = c / 16;
        cp_async::zfill<16>(st.act + act_at(p, c % 16), L.w.xq + s.q[i] + std::uint32_t(b) * 256u, p < count);
    }
    if (tid < moe_gemm_pairs_cta) cp_async::zfill<4>(&st.xd[tid], L.w.xq_d + s.xd + std::uint32_t(b), tid < count);
}

// Lane t's selector word of a sub-block (its 8 stored bytes v): grid index byte t, sign bits 7t..
// (copy4: the lane's table copy, as a byte offset).
__device__ __forceinline__ std::uint32_t lane_sel(const iq2_sel_tables& tab, uint2 v, int t, std::uint32_t copy4) {
    const auto* grid = reinterpret_cast<const unsigned char*>(tab.grid);
    const auto* sign = reinterpret_cast<const unsigned char*>(tab.sign);
    const std::uint32_t gi = __byte_perm(v.x, 0u, 0x4440u | unsigned(t));
    const std::uint32_t si = (v.y >> (7 * t)) & 127u;
    return *reinterpret_cast<const std::uint32_t*>(grid + ((gi << 5) | copy4)) |
           *reinterpret_cast<const std::uint32_t*>(sign + ((si << 5) | copy4));
}

// d = A.B from zero for one 32-wide sub-block.
__device__ __forceinline__ void mma_zero(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}

}  // namespace moe_gu_regs_detail

template <int = 0>
__global__ void __launch_bounds__(moe_gu_regs_threads, 2)
    moe_gemm_gate_up_regs_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
    using namespace moe_gu_regs_detail;
    extern __shared__ int4 moe_gu_regs_smem[];
    const work_item it = item_of(L);
    if (it.e < 0) return;
    const int first = it.first + it.p0, count = it.count;
    const int nb = L.shape.n_embd / 256;
    auto& sm = *reinterpret_cast<shared*>(moe_gu_regs_smem);
    load_pair_rows(L, first, count, sm.row);
    fill_sel_tables(sm.sel);
    __syncthreads();
    const int f0 = int(blockIdx.x) * 64;
    const sources src = sources_of(L, it.e, f0, sm.row, count);

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
    const int tt = warp / 2, r0 = 16 * (warp % 2) + g;  // rows r0 and r0 + 8 of tile tt
    const std::uint32_t copy4 = (std::uint32_t(lane) % sel_copies) * 4u;
    const int n_live = (count + 7) / 8;  // n-tiles holding a pair
    constexpr int nt = moe_gemm_pairs_cta / 8;
    // n-tile n's float sums (x, y: row r0, pairs 2t, 2t + 1; z, w: row r0 + 8); n is unrolled.
    float4 sumf[reg_tiles];
    auto sums = [&](int n) -> float4& {
        return n < reg_tiles ? sumf[n < reg_tiles ? n : 0] : sm.sumf_hi[n < reg_tiles ? 0 : n - reg_tiles][threadIdx.x];
    };
#pragma unroll
    for (int n = 0; n < nt; ++n) sums(n) = float4{0.0f, 0.0f, 0.0f, 0.0f};

    run_ring<stages>(nb, [&](int b, int s) { issue(L, src, count, b, sm.u.st[s]); }, [&](int b, int s) {
        const stage& st = sm.u.st[s];
        const std::uint8_t* raw = st.raw[tt];
        // The block's A fragments first: sixteen independent lookup chains, no branch between them.
        unsigned a[8][4];
        int ls[8][2];
#pragma unroll
        for (int ib = 0; ib < 8; ++ib) {
            const int off = (ib / 2) * 512 + (ib % 2) * 8;
            const uint2 v0 = *reinterpret_cast<const uint2*>(raw + off + r0 * 16);
            const uint2 v1 = *reinterpret_cast<const uint2*>(raw + off + (r0 + 8) * 16);
            iq2_xxs_group_decode(lane_sel(sm.sel, v0, t, copy4), a[ib][0], a[ib][2]);
            iq2_xxs_group_decode(lane_sel(sm.sel, v1, t, copy4), a[ib][1], a[ib][3]);
            ls[ib][0] = sub_block_scale(v0);
            ls[ib][1] = sub_block_scale(v1);
        }
        const float wd0 = block_d(st.d2[tt * 32 + r0], b), wd1 = block_d(st.d2[tt * 32 + r0 + 8], b);
        const int boff = (8 * t) % 16;
        // Then each n-tile's eight sub-block mmas, independent of one another; bsum of a (row, pair)
        // still adds the sub-blocks 0..7 of the block before its one float step.
#pragma unroll
        for (int n = 0; n < nt; ++n) {
            if (n >= n_live) break;
            const int p = 8 * n + g;
            int bsum[4] = {0, 0, 0, 0};
#pragma unroll
            for (int ib = 0; ib < 8; ++ib) {
                const uint2 bw = *reinterpret_cast<const uint2*>(st.act + act_at(p, 2 * ib + t / 2) + boff);
                int d[4];
                mma_zero(d, a[ib], bw.x, bw.y);
                bsum[0] += d[0] * ls[ib][0];
                bsum[1] += d[1] * ls[ib][0];
                bsum[2] += d[2] * ls[ib][1];
                bsum[3] += d[3] * ls[ib][1];
            }
            const float x0 = st.xd[8 * n + 2 * t], x1 = st.xd[8 * n + 2 * t + 1];
            float4 f = sums(n);
            f.x = add_rn(f.x, mul_rn(mul_rn(wd0, x0), float(bsum[0])));
            f.y = add_rn(f.y, mul_rn(mul_rn(wd0, x1), float(bsum[1])));
            f.z = add_rn(f.z, mul_rn(mul_rn(wd1, x0), float(bsum[2])));
            f.w = add_rn(f.w, mul_rn(mul_rn(wd1, x1), float(bsum[3])));
            sums(n) = f;
        }
    });
    cp_async::wait<0>();
    __syncthreads();  // the ring is free: res overlays it
    float* sres = &sm.u.res[0][0][0];  // [2][pair][64]
    const int fr = 32 * (tt % 2) + r0;
#pragma unroll
    for (int n = 0; n < nt; ++n)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int pr = 8 * n + 2 * t + x % 2;
            const float4 f = sums(n);
            const float v = x == 0 ? f.x : x == 1 ? f.y : x == 2 ? f.z : f.w;
            sres[((tt / 2) * moe_gemm_pairs_cta + pr) * 64 + fr + 8 * (x / 2)] = mul_rn(0.125f, v);
        }
    __syncthreads();
    gate_up_finish(L, sres, first, count, f0);
}

}  // namespace ds4::kernels
