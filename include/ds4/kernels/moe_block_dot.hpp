#pragma once
// The integer block dots of kernels/moe.cuh as one lane computes them from the tiled layouts
// (format/tiled.hpp), host and device: the CPU test (tests/tiled_test.cpp) proves them equal
// to dot_iq2_xxs_q8_k / dot_q2_k_q8_k without a GPU. Integer sums are exact in any order, so
// the only float operations are the per-block scale products, done by the caller in the
// reference order.
//
// IQ2_XXS: a grid byte is 8, 25 or 43, so an 8-weight group decodes with two byte permutes
// (PRMT) from one 8-byte source {8, 25, 43, 0, -8, -25, -43, 0}: selector nibble j = code of
// grid byte j (bits 0-1) | 4 if sign j is set (bit 2); bit 3 stays clear (it would select
// PRMT's sign-replicate mode). The grid-code word and the sign word of a group are two 32-bit table entries OR-ed,
// and the result is the signed weights as int8, so one dp4a per 4 weights. Every term is the
// exact integer sign*grid*x, so sumi is the reference's in any order.
#include <cstdint>

#include "ds4/core/byte_perm.hpp"
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

inline constexpr std::uint32_t iq2_xxs_perm_pos = 0x002b1908u;  // bytes 8, 25, 43, 0
inline constexpr std::uint32_t iq2_xxs_perm_neg = 0x00d5e7f8u;  // bytes -8, -25, -43, 0

// Grid entry i as 8 selector nibbles: byte 8, 25, 43 -> code 0, 1, 2 (bits 4-5 of the byte).
DS4_HD_INLINE std::uint32_t iq2_xxs_grid_sel(int i) {
    const std::uint64_t g = iq2xxs_grid_at(i);
    std::uint32_t s = 0;
    for (int j = 0; j < 8; ++j) s |= std::uint32_t((g >> (8 * j + 4)) & 3u) << (4 * j);
    return s;
}

// ksigns_iq2xs[i] as 8 selector nibbles: 4 where sign j is set.
DS4_HD_INLINE std::uint32_t iq2_xxs_sign_sel(int i) {
    const std::uint32_t k = iq2xxs_ksigns_at(i);
    std::uint32_t s = 0;
    for (int j = 0; j < 8; ++j) s |= ((k >> j) & 1u) << (4 * j + 2);
    return s;
}

// Byte offset of copy c (copy4 = 4c) of entry (w >> pos) & mask in a selector table of
// 2^CopiesLog2 words per entry (entry i, copy c at word i * 2^CopiesLog2 + c): a shift and one
// LOP3, (x & mask') | copy4. Extracting the index, scaling it, adding the copy and scaling to
// bytes took about four instructions (moe_gemm's decode, ncu). pos is a constant once the
// caller's loop unrolls.
template <int CopiesLog2>
DS4_HD_INLINE std::uint32_t sel_table_offset(std::uint32_t w, int pos, std::uint32_t mask, std::uint32_t copy4) {
    constexpr int S = CopiesLog2 + 2;
    const std::uint32_t x = pos >= S ? w >> (pos - S) : w << (S - pos);
    return (x & (mask << S)) | copy4;
}

// One 8-weight group (grid_sel | sign_sel) as two words of signed int8 weights. Every selector
// nibble is a code 0-2 plus the sign's 4, bit 3 clear, so the bare PRMT needs no 0x7777 mask
// (tests/moe_decode_emulation_test.cpp checks all 256 x 128 pairs).
DS4_HD_INLINE void iq2_xxs_group_decode(std::uint32_t sel, std::uint32_t& w0, std::uint32_t& w1) {
    w0 = prmt(iq2_xxs_perm_pos, iq2_xxs_perm_neg, sel);
    w1 = prmt(iq2_xxs_perm_pos, iq2_xxs_perm_neg, sel >> 16);
}

// The grid magnitudes times a sub-block's scale ls = 2s + 1, as two int8 digits: v = m * ls
// (m = 8, 25, 43; |v| <= 1333) is 64 * hi + lo with lo = v & 63 (0..63) and hi = v >> 6 (floor,
// -21..20). The four words are the PRMT sources of iq2_xxs_group_decode's selectors, so one
// group decodes to the digits of its scaled weights with four PRMT: sum(hi * x) * 64 + sum(lo * x)
// is sum(ls * w * x) exactly, and a block's 8 sub-blocks chain on one integer accumulator per
// digit (the grouped MoE's tensor-core gate/up, no multiply by ls per sub-block).
struct alignas(16) iq2_xxs_split_words {
    std::uint32_t pos_hi, neg_hi, pos_lo, neg_lo;
};
DS4_HD_INLINE iq2_xxs_split_words iq2_xxs_split_words_of(int s) {
    const int ls = 2 * s + 1, m[3] = {8, 25, 43};
    iq2_xxs_split_words r{0, 0, 0, 0};
    for (int j = 0; j < 3; ++j) {
        const int v = m[j] * ls;
        // v >> 6 of a negative int is the floor on every compiler this builds with (C++20 defines it).
        r.pos_hi |= std::uint32_t(std::uint8_t(v >> 6)) << (8 * j);
        r.pos_lo |= std::uint32_t(v & 63) << (8 * j);
        r.neg_hi |= std::uint32_t(std::uint8_t((-v) >> 6)) << (8 * j);
        r.neg_lo |= std::uint32_t((-v) & 63) << (8 * j);
    }
    return r;
}
// One 8-weight group's scaled weights as digits: hi0/lo0 weights 0-3, hi1/lo1 weights 4-7.
DS4_HD_INLINE void iq2_xxs_group_decode_split(const iq2_xxs_split_words& sw, std::uint32_t sel, std::uint32_t& hi0,
                                              std::uint32_t& hi1, std::uint32_t& lo0, std::uint32_t& lo1) {
    hi0 = prmt(sw.pos_hi, sw.neg_hi, sel);
    hi1 = prmt(sw.pos_hi, sw.neg_hi, sel >> 16);
    lo0 = prmt(sw.pos_lo, sw.neg_lo, sel);
    lo1 = prmt(sw.pos_lo, sw.neg_lo, sel >> 16);
}

// sumi of a 32-weight sub-block (8 words of signed weights) against 32 int8 activations.
// Two chains of four: integer sums are exact in any order, and one chain of eight dependent
// dp4a was the critical path of a sub-block at one row.
DS4_HD_INLINE int iq2_xxs_sub_dot(const std::uint32_t (&w)[8], const std::uint32_t* x) {
    int s0 = 0, s1 = 0;
DS4_MOE_UNROLL
    for (int k = 0; k < 8; k += 2) {
        s0 = dp4a_s8(w[k], x[k], s0);
        s1 = dp4a_s8(w[k + 1], x[k + 1], s1);
    }
    return s0 + s1;
}

// Integer part of a Q2_K block dot: sc = the 16 scale/min bytes (4 words), qs = 64 quant bytes
// (16 words), x = 256 int8 activations (64 words), bsums = the activation's 16-sums.
// Piece c of qs (words 4c..4c+3) shifted by 2j holds group g = 8(c/2) + 2j + c%2, which is
// activation words 4g..4g+3 (docs/model.md §5.4 element order).
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
