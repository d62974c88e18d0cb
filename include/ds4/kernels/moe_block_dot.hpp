#pragma once
// The integer block dots of kernels/moe.cuh as one lane computes them from the tiled layouts
// (format/tiled.hpp), host and device: the CPU test (tests/tiled_test.cpp) proves them equal
// to dot_iq2_xxs_q8_k / dot_q2_k_q8_k without a GPU. Integer sums are exact in any order, so
// the only float operations are the per-block scale products, done by the caller in the
// reference order.
//
// IQ2_XXS signs: a sign byte expands to a byte mask m (0xff = negative). For a grid byte g and
// an activation x, (g ^ 0xff) as int8 is -g-1, so  sum(sign*g*x) = dp4a(g ^ m, x) - dp4a(m, x)
// (m as int8 is -1 where negative). The two dp4a chains replace a per-byte negate, which has no
// carry-free 32-bit form.
#include <cstdint>

#include "ds4/core/host_device.hpp"
#include "ds4/format/iq2_xxs_tables.hpp"

// nvcc unrolls these fixed-trip loops; host compilers (which warn on an unknown pragma) need not.
#if defined(__CUDA_ARCH__)
#define DS4_MOE_UNROLL _Pragma("unroll")
#else
#define DS4_MOE_UNROLL
#endif

namespace ds4::kernels {

DS4_HD_INLINE int dp4a_s8(std::uint32_t a, std::uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(int(a), int(b), c);
#else
    for (int k = 0; k < 4; ++k)
        c += int(std::int8_t(std::uint8_t(a >> (8 * k)))) * int(std::int8_t(std::uint8_t(b >> (8 * k))));
    return c;
#endif
}

// Byte mask of ksigns_iq2xs[i]: byte j is 0xff when bit j is set.
DS4_HD_INLINE std::uint64_t iq2_xxs_sign_mask(int i) {
    const std::uint8_t s = iq2xxs_ksigns_at(i);
    std::uint64_t m = 0;
    for (int j = 0; j < 8; ++j)
        if ((s >> j) & 1u) m |= std::uint64_t(0xff) << (8 * j);
    return m;
}

// One 32-weight sub-block (words a0 = grid indices, a1 = signs | s << 28) decoded into eight
// words of (grid ^ mask) and eight mask words; grid/masks are the 256- and 128-entry tables
// (shared memory in the kernel).
DS4_HD_INLINE void iq2_xxs_sub_decode(std::uint32_t a0, std::uint32_t a1, const std::uint64_t* grid,
                                      const std::uint64_t* masks, std::uint32_t (&gx)[8], std::uint32_t (&mk)[8]) {
DS4_MOE_UNROLL
    for (int l = 0; l < 4; ++l) {
        const std::uint64_t g = grid[(a0 >> (8 * l)) & 255u];
        const std::uint64_t m = masks[(a1 >> (7 * l)) & 127u];
        mk[2 * l] = std::uint32_t(m);
        mk[2 * l + 1] = std::uint32_t(m >> 32);
        gx[2 * l] = std::uint32_t(g) ^ mk[2 * l];
        gx[2 * l + 1] = std::uint32_t(g >> 32) ^ mk[2 * l + 1];
    }
}

// sumi of the sub-block against 32 int8 activations (8 words).
DS4_HD_INLINE int iq2_xxs_sub_dot(const std::uint32_t (&gx)[8], const std::uint32_t (&mk)[8], const std::uint32_t* x) {
    int pos = 0, neg = 0;
DS4_MOE_UNROLL
    for (int k = 0; k < 8; ++k) {
        pos = dp4a_s8(gx[k], x[k], pos);
        neg = dp4a_s8(mk[k], x[k], neg);
    }
    return pos - neg;
}

// Integer part of a Q2_K block dot: sc = the 16 scale/min bytes (4 words), qs = 64 quant bytes
// (16 words), x = 256 int8 activations (64 words), bsums = the activation's 16-sums.
// Piece c of qs (words 4c..4c+3) shifted by 2j holds group g = 8(c/2) + 2j + c%2, which is
// activation words 4g..4g+3 (model.md §5.4 element order).
DS4_HD_INLINE void q2_k_block_isum(const std::uint32_t* sc, const std::uint32_t* qs, const std::uint32_t* x,
                                   const std::int16_t* bsums, int& isum, int& summs) {
    int is = 0, sm = 0;
DS4_MOE_UNROLL
    for (int g = 0; g < 16; ++g) sm += int(bsums[g]) * int((sc[g / 4] >> (8 * (g % 4) + 4)) & 15u);
DS4_MOE_UNROLL
    for (int c = 0; c < 4; ++c)
DS4_MOE_UNROLL
        for (int j = 0; j < 4; ++j) {
            const int g = 8 * (c / 2) + 2 * j + c % 2;
            int v = 0;
DS4_MOE_UNROLL
            for (int w = 0; w < 4; ++w) v = dp4a_s8((qs[4 * c + w] >> (2 * j)) & 0x03030303u, x[4 * g + w], v);
            is += int((sc[g / 4] >> (8 * (g % 4))) & 15u) * v;
        }
    isum = is;
    summs = sm;
}

}  // namespace ds4::kernels
