#pragma once
// The parts of the grouped MoE's down that do not depend on how it multiplies, shared by
// moe_gemm.cuh's mma.sync kernel and moe_gemm_down_wgmma.cuh's warpgroup-MMA kernel: the pairs,
// the weight, scale and 16-sum copies of a CTA's four 32-row Q2_K tiles, the decode of a
// 16-weight half of a sub-block to q * group scale, and the min-term operands.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/byte_perm.hpp"
#include "ds4/core/half.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"

namespace ds4::kernels::moe_gemm_detail {

inline constexpr int down_tile_bytes = 5 * 512;  // one 32-row tile's Q2_K block: scales + 4 pieces

// The Q2_K layout of the down experts (format/tiled.hpp).
__device__ __forceinline__ q2_k_tiled_layout down_layout(const moe_gemm_shape& s) {
    const int nb = s.n_ff / 256;
    return q2_k_tiled_layout{s.n_embd, s.n_ff, nb, (nb + 3) / 4 * 4, (s.n_embd + 31) / 32};
}

// The CTA's pairs (0 past the group).
__device__ __forceinline__ void load_pairs(const moe_gemm_launch& L, int first, int count, std::int32_t* pair) {
    for (int p = int(threadIdx.x); p < moe_gemm_pairs_cta; p += int(blockDim.x)) pair[p] = p < count ? L.w.sorted[first + p] : 0;
}

// A down CTA's weight copies, formed once (as gate/up's): weight chunks threadIdx.x and, for the
// first 128 threads, threadIdx.x + 512 (4 tiles x 160 chunks) as byte offsets of block 0 in the
// expert's quants, blocks `step` apart; the d | dmin word of row threadIdx.x of the 4 tiles
// (threads < 128); the 16-sums of pair threadIdx.x / 2, half threadIdx.x % 2 (threads < 128).
struct down_sources {
    const std::uint8_t* q;
    const std::uint32_t* dd;  // row o0 + threadIdx.x's word of block 0; block b's is dd_index(0, b) further
    std::size_t step;
    std::uint32_t w0, w1, bs;
    int bs_p;
};
__device__ __forceinline__ down_sources down_sources_of(const moe_gemm_launch& L, int e, int o0, const std::int32_t* pair, int count) {
    static_assert(4 * down_tile_bytes / 16 > moe_gemm_threads && 4 * down_tile_bytes / 16 <= 2 * moe_gemm_threads);
    constexpr int chunks = 4 * down_tile_bytes / 16;
    const auto lay = down_layout(L.shape);
    auto w_offset = [&](int c) {
        return std::uint32_t(lay.quant_offset(o0 + 32 * (c / (down_tile_bytes / 16)), 0, 0) + c % (down_tile_bytes / 16) * 16);
    };
    down_sources s;
    s.q = L.a.down_q + std::size_t(e) * lay.quant_bytes();
    s.dd = L.a.down_dd + std::size_t(e) * lay.dd_count() + lay.dd_index(o0 + int(threadIdx.x) % 128, 0);
    s.step = lay.quant_offset(o0, 1, 0) - lay.quant_offset(o0, 0, 0);
    const int c1 = int(threadIdx.x) + moe_gemm_threads;
    s.w0 = w_offset(int(threadIdx.x));
    s.w1 = c1 < chunks ? w_offset(c1) : 0u;
    s.bs_p = int(threadIdx.x) / 2 % moe_gemm_pairs_cta;
    s.bs = std::uint32_t(pair[s.bs_p < count ? s.bs_p : 0]) * std::uint32_t(L.shape.n_ff / 16) + 8u * (threadIdx.x % 2);
    return s;
}
// Block b's weight bytes, the rows' d | dmin words and the pairs' 16-sums into a stage.
__device__ __forceinline__ void issue_down_weights(const moe_gemm_launch& L, const down_sources& s, int b, int count,
                                                   std::uint8_t (&raw)[4][down_tile_bytes], std::uint32_t* dd,
                                                   std::int16_t (&bsums)[moe_gemm_pairs_cta][16]) {
    constexpr int chunks = 4 * down_tile_bytes / 16;
    const std::uint8_t* qb = s.q + std::size_t(b) * s.step;
    const int c1 = int(threadIdx.x) + moe_gemm_threads;
    cp_async::zfill<16>(&raw[0][0] + threadIdx.x * 16, qb + s.w0, true);
    if (c1 < chunks) cp_async::zfill<16>(&raw[0][0] + c1 * 16, qb + s.w1, true);
    // The tiled layout puts a row's words of every block at the same offsets from its block-0 word.
    if (threadIdx.x < 4 * 32) cp_async::zfill<4>(&dd[threadIdx.x], s.dd + down_layout(L.shape).dd_index(0, b), true);
    if (threadIdx.x < 2 * moe_gemm_pairs_cta)
        cp_async::zfill<16>(&bsums[s.bs_p][8 * (threadIdx.x % 2)], L.w.midq_bsums + s.bs + std::uint32_t(b) * 16u, s.bs_p < count);
}

// Half h (k 16h .. 16h + 15) of sub-block ib = 4k + j of row `row` of a tile's stored block:
// piece 1 + 2k + h shifted by 2j, times the scale of group 8k + 2j + h (q * scale <= 45, int8).
__device__ __forceinline__ uint4 decode_q2_k_half(const std::uint8_t (&raw)[down_tile_bytes], const uint4& sc, int row, int ib, int h) {
    const int k = ib / 4, j = ib % 4, g = 8 * k + 2 * j + h;
    uint4 v = *reinterpret_cast<const uint4*>(raw + (1 + 2 * k + h) * 512 + row * 16);
    const unsigned s = byte_of(sc, g) & 15u;
    v.x = ((v.x >> (2 * j)) & 0x03030303u) * s;
    v.y = ((v.y >> (2 * j)) & 0x03030303u) * s;
    v.z = ((v.z >> (2 * j)) & 0x03030303u) * s;
    v.w = ((v.w >> (2 * j)) & 0x03030303u) * s;
    return v;
}
// The row's 16 scale bytes (scale | min << 4) of a tile's stored block.
__device__ __forceinline__ uint4 q2_k_scales(const std::uint8_t (&raw)[down_tile_bytes], int row) {
    return *reinterpret_cast<const uint4*>(raw + row * 16);
}
// The min-term A operand of a row: k 0..15 the 16 group mins, k 16..31 the same times 16 (u8).
__device__ __forceinline__ uint4 q2_k_mins(const uint4& sc) {
    return make_uint4((sc.x >> 4) & 0x0f0f0f0fu, (sc.y >> 4) & 0x0f0f0f0fu, (sc.z >> 4) & 0x0f0f0f0fu, (sc.w >> 4) & 0x0f0f0f0fu);
}
__device__ __forceinline__ uint4 q2_k_mins16(const uint4& sc) {
    return make_uint4(sc.x & 0xf0f0f0f0u, sc.y & 0xf0f0f0f0u, sc.z & 0xf0f0f0f0u, sc.w & 0xf0f0f0f0u);
}
// The min-term B operand of 4 groups' 16-sums v (two words of two int16): bsum_g = 16 hi_g +
// lo_g with lo_g = bsum_g & 15 (a byte) and hi_g = bsum_g >> 4 (in [-128, 127]: |bsum| <= 2032).
__device__ __forceinline__ unsigned bsums_lo(const uint2& v) { return byte_perm(v.x & 0x000f000fu, v.y & 0x000f000fu, 0x6420u); }
__device__ __forceinline__ unsigned bsums_hi(const uint2& v) {
    return byte_perm((v.x >> 4) & 0x00ff00ffu, (v.y >> 4) & 0x00ff00ffu, 0x6420u);
}

}  // namespace ds4::kernels::moe_gemm_detail
