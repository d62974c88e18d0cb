#pragma once
// The parts of the grouped MoE's gate/up that do not depend on how it multiplies, shared by
// moe_gemm.cuh's mma.sync kernel and moe_gemm_wgmma.cuh's warpgroup-MMA kernel: the
// pairs' rows, the IQ2_XXS selector tables, the weight copies of a CTA's four 32-row tiles, each
// thread's decode tasks and a sub-block's decode, and the SwiGLU that turns the f-tile's gate and
// up sums into mid.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_gemm_launch.cuh"

namespace ds4::kernels::moe_gemm_detail {

static_assert(sel_copies == 1 << 3, "the decode's sel_table_offset<3>");

// The IQ2_XXS layout of the gate and up experts (format/tiled.hpp).
__device__ __forceinline__ iq2_xxs_tiled_layout gate_up_layout(const moe_gemm_shape& s) {
    const int nb = s.n_embd / 256;
    return iq2_xxs_tiled_layout{s.n_ff, s.n_embd, nb, (nb + 7) / 8 * 8, (s.n_ff + 31) / 32};
}

// The activation row of each of the CTA's pairs (0 past the group).
__device__ __forceinline__ void load_pair_rows(const moe_gemm_launch& L, int first, int count, std::int32_t* row) {
    for (int p = int(threadIdx.x); p < moe_gemm_pairs_cta; p += int(blockDim.x))
        row[p] = p < count ? L.w.sorted[first + p] / moe_slots : 0;
}

// IQ2_XXS decode selectors (moe_block_dot.hpp), built once per CTA: a group's decode is two table
// reads and two PRMT instead of a global grid read and ~40 bit operations. Entry i of lane copy c
// at word sel_copies * i + c, a lane reading copy lane % sel_copies: a warp's 32 random lookups
// meet at most four to a bank (one copy took 3.3 wavefronts a lookup).
struct iq2_sel_tables {
    std::uint32_t grid[256 * sel_copies];
    std::uint32_t sign[128 * sel_copies];
};
__device__ __forceinline__ void fill_sel_tables(iq2_sel_tables& t) {
    for (int i = int(threadIdx.x); i < 256 + 128; i += int(blockDim.x)) {
        const std::uint32_t v = i < 256 ? iq2_xxs_grid_sel(i) : iq2_xxs_sign_sel(i - 256);
        std::uint32_t* dst = i < 256 ? &t.grid[i * sel_copies] : &t.sign[(i - 256) * sel_copies];
#pragma unroll
        for (int c = 0; c < sel_copies; ++c) dst[c] = v;
    }
}

// Group l's selector word (grid | sign) of a 32-weight sub-block from its 8 stored bytes (4 grid
// indices; 4 sign indices and the scale), through lane copy copy4 / 4.
__device__ __forceinline__ std::uint32_t group_sel(const iq2_sel_tables& t, uint2 v, std::uint32_t copy4, int l) {
    const auto* grid = reinterpret_cast<const unsigned char*>(t.grid);
    const auto* sign = reinterpret_cast<const unsigned char*>(t.sign);
    return *reinterpret_cast<const std::uint32_t*>(grid + sel_table_offset<3>(v.x, 8 * l, 255u, copy4)) |
           *reinterpret_cast<const std::uint32_t*>(sign + sel_table_offset<3>(v.y, 7 * l, 127u, copy4));
}
// The sub-block's signed int8 weights: w[0..3] k 0..15, w[4..7] k 16..31.
__device__ __forceinline__ void decode_sub_block(const iq2_sel_tables& t, uint2 v, std::uint32_t copy4, std::uint32_t (&w)[8]) {
#pragma unroll
    for (int l = 0; l < 4; ++l) iq2_xxs_group_decode(group_sel(t, v, copy4, l), w[2 * l], w[2 * l + 1]);
}
// The same weights times the sub-block's scale 2s + 1 as two digit operands (moe_block_dot.hpp's
// split): hi[0..3] / lo[0..3] k 0..15, hi[4..7] / lo[4..7] k 16..31; sw is the scale's entry.
__device__ __forceinline__ void decode_sub_block_split(const iq2_sel_tables& t, const iq2_xxs_split_words& sw, uint2 v,
                                                       std::uint32_t copy4, std::uint32_t (&hi)[8], std::uint32_t (&lo)[8]) {
#pragma unroll
    for (int l = 0; l < 4; ++l)
        iq2_xxs_group_decode_split(sw, group_sel(t, v, copy4, l), hi[2 * l], hi[2 * l + 1], lo[2 * l], lo[2 * l + 1]);
}
__device__ __forceinline__ int sub_block_scale(uint2 v) { return int(2 * (v.y >> 28) + 1); }  // 2s + 1
// F16 d of block b from the aligned word holding the d of blocks b & ~1 and b | 1.
__device__ __forceinline__ float block_d(std::uint32_t d2, int b) {
    return f16_operand(std::uint16_t(b % 2 ? d2 >> 16 : d2 & 0xffffu));
}

// A gate/up CTA's weight copies, formed once: weight chunk threadIdx.x (tile `tile`, byte `off`
// of its 2 KiB block, blocks `step` apart), and the scale word of row threadIdx.x of the four
// tiles (threads < 128). Tiles 0, 1 are gate rows f0 .. f0 + 63, tiles 2, 3 up rows.
struct gate_up_sources {
    const std::uint8_t* w;
    std::size_t step;
    const std::uint16_t* d;
    int tile, off, d_f;
};
__device__ __forceinline__ gate_up_sources gate_up_sources_of(const moe_gemm_launch& L, int e, int f0) {
    static_assert(4 * gu_tile_bytes / 16 == moe_gemm_threads, "gate/up: one weight chunk per thread and block");
    const auto lay = gate_up_layout(L.shape);
    gate_up_sources s;
    s.tile = int(threadIdx.x) / (gu_tile_bytes / 16);
    s.off = int(threadIdx.x) % (gu_tile_bytes / 16) * 16;
    s.w = (s.tile >= 2 ? L.a.up_q : L.a.gate_q) + std::size_t(e) * lay.quant_bytes() + lay.quant_offset(f0 + 32 * (s.tile % 2), 0, 0) + s.off;
    s.step = lay.quant_offset(f0, 1, 0) - lay.quant_offset(f0, 0, 0);
    const int dt = int(threadIdx.x) / 32 % 4;
    s.d_f = f0 + 32 * (dt % 2) + int(threadIdx.x) % 32;
    s.d = (dt >= 2 ? L.a.up_d : L.a.gate_d) + std::size_t(e) * lay.scale_count();
    return s;
}
// Block b's weight bytes of the four tiles and the rows' scale words into a stage.
__device__ __forceinline__ void issue_gate_up_weights(const moe_gemm_launch& L, const gate_up_sources& s, int b,
                                                      std::uint8_t (&raw)[4][gu_tile_bytes], std::uint32_t* d2) {
    cp_async::zfill<16>(raw[s.tile] + s.off, s.w + std::size_t(b) * s.step, true);
    if (threadIdx.x < 4 * 32)
        cp_async::zfill<4>(&d2[threadIdx.x], s.d + (gate_up_layout(L.shape).scale_index(s.d_f, b) & ~std::size_t(1)), true);
}

// This thread's decode tasks: tiles tile0 and tile0 + 1, row `row` of the tile, sub-block `ib` (a
// warp reads 256 consecutive bytes of one stored piece: no conflicts); its selector copy.
struct gate_up_task {
    int row, ib, tile0;
    std::uint32_t copy4;
};
__device__ __forceinline__ gate_up_task gate_up_task_of(int warp, int lane) {
    static_assert(4 * 32 * 8 == 2 * moe_gemm_threads, "gate/up: two decode tasks a thread");
    return {(warp % 2) * 16 + lane % 16, 2 * (warp % 8 / 2) + lane / 16, 2 * (warp / 8), (std::uint32_t(lane) % sel_copies) * 4u};
}
// The stored 8 bytes of a task's sub-block in tile tt of a stage.
__device__ __forceinline__ uint2 task_bytes(const std::uint8_t (&raw)[4][gu_tile_bytes], int tt, const gate_up_task& k) {
    return *reinterpret_cast<const uint2*>(raw[tt] + (k.ib / 2) * 512 + k.row * 16 + (k.ib % 2) * 8);
}

// mid[pair][f0 + fr] = silu(min(g, c)) * clamp(u, c) * w_pair from the f-tile's sums
// sres[0][pair][fr] (gate) and sres[1][pair][fr] (up), already scaled by 0.125.
__device__ __forceinline__ void gate_up_finish(const moe_gemm_launch& L, const float* sres, int first, int count, int f0) {
    const float c = L.a.clamp;
    const int n_ff = L.shape.n_ff;
    for (int i = int(threadIdx.x); i < count * 64; i += int(blockDim.x)) {
        const int pr = i / 64, fr = i % 64, f = f0 + fr;
        const int pair = L.w.sorted[first + pr];
        const float gv = fminf(sres[pr * 64 + fr], c);
        const float uv = fmaxf(fminf(sres[(moe_gemm_pairs_cta + pr) * 64 + fr], c), -c);
        L.w.mid[std::size_t(pair) * n_ff + f] = mul_rn(mul_rn(silu(gv), uv), L.a.wts[pair]);
    }
}

}  // namespace ds4::kernels::moe_gemm_detail
