#pragma once
// The integer form of the indexer's scores that kernels/indexer.cuh runs on int8 tensor cores,
// host and device, so that tests/indexer_test.cpp proves it equal to ref::indexer_scores on
// the CPU. The kernel only adds the mma tiling, which sums integers (order-free).
//
// Why it is exact. Doubled E2M1 magnitudes are the integers {0,1,2,3,4,6,8,12}. Key block b
// holds (ck/2) * 2^ek_b (then the F16 round), query block b (cq/2) * 2^eq_b. Over the blocks that
// hold a nonzero code, let ekmin/eqmin be the smallest exponent; if every shift e_b - emin is at
// most 3, K8 = ck << shift and Q8 = cq << shift fit int8 (12 << 3 = 96), and
//   k . q = I * u,  I = sum K8 * Q8 (|I| <= 128 * 96 * 96 < 2^21),  u = 2^(ekmin + eqmin - 2).
// The reference's sequential float dot is that value bit for bit: every product and partial sum
// is a multiple of u below 2^21 u, representable while u >= 2^-149 (ekmin >= -23, eqmin >= -124).
// The key's F16 round changes nothing while every key block exponent is in [-23, 13]: 0.5 * 2^-23
// is F16's smallest subnormal and 6 * 2^13 = 49152 <= 65504 (three significant bits at most).
//
// The head sum. With I' = max(I, 0) and w'_h = w_h * 2^(eqmin_h - 2) (exact), the reference's
// p_h = round(relu(d_h) * w_h) is round(I' * w'_h) * 2^ekmin, and its sum over heads in order is
// (sum in order of round(I' * w'_h)) * 2^ekmin: scaling by a power of two commutes with every
// rounding while no value is subnormal or infinite in either domain, which |w'_h| in
// [2^-103, 2^86] guarantees for ekmin in [-23, 13] (nonzero terms >= 2^-126, sums < 2^127; an
// exact sum below 2^-126 is representable in both domains). The sign of zero never matters: the
// running sum starts at +0 and adding a zero of either sign leaves it unchanged or +0.
//
// round(I' * w') is one FMA: the mma accumulator starts at the bits of 2^23, so it reads as the
// float 2^23 + I (I > -2^22), max with 2^23's bits is the relu, and fma(2^23 + I', w', -2^23 w')
// rounds I' * w' once.
#include <cstdint>

#include "ds4/core/byte_perm.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4::kernels {

inline constexpr int indexer_int8_max_shift = 3;
inline constexpr int indexer_int8_key_exp_lo = -23, indexer_int8_key_exp_hi = 13;
inline constexpr int indexer_int8_query_exp_lo = -124, indexer_int8_query_exp_hi = 95;
inline constexpr int indexer_int8_weight_exp_lo = -103, indexer_int8_weight_exp_hi = 86;  // |w'| range
inline constexpr std::int32_t indexer_int8_bias = 0x4b000000;  // the bits of 2^23
inline constexpr float indexer_int8_bias_value = 8388608.0f;

// Doubled E2M1 magnitude of a 4-bit code (sign ignored): {0,1,2,3,4,6,8,12}.
DS4_HD_INLINE int e2m1_doubled_magnitude(unsigned code) { return int((0xc8643210u >> (4 * (code & 7u))) & 15u); }

// Signed int8 operand of one code under a block shift.
DS4_HD_INLINE int indexer_int8_value(unsigned code, int shift) {
    const int m = e2m1_doubled_magnitude(code) << (shift & 3);
    return (code & 8u) ? -m : m;
}

// Byte-permute tables for one block shift: byte m of {pos_lo, pos_hi} is the doubled magnitude
// of code m shifted, {neg_lo, neg_hi} its negation (byte-wise two's complement; no byte is 0
// except code 0's, so the word subtraction never borrows across bytes).
struct indexer_int8_table {
    std::uint32_t pos_lo, pos_hi, neg_lo, neg_hi;
};

DS4_HD_INLINE indexer_int8_table indexer_int8_table_for(unsigned shift) {
    indexer_int8_table t;
    t.pos_lo = 0x03020100u << shift;
    t.pos_hi = 0x0c080604u << shift;
    t.neg_lo = 0x01010000u - t.pos_lo;
    t.neg_hi = 0x01010100u - t.pos_hi;
    return t;
}

// Eight codes (one little-endian word of the row, element 2k in the low nibble of byte k) to
// eight int8 operands: lo = elements 0-3, hi = elements 4-7. The magnitude selects from the
// positive and the negative table, the sign picks between the two (selector nibble i or 4 + i).
DS4_HD_INLINE void indexer_codes_to_int8(std::uint32_t w, const indexer_int8_table& t, std::uint32_t& lo,
                                         std::uint32_t& hi) {
    const std::uint32_t mag = w & 0x77777777u;
    const std::uint32_t pick = ((w >> 1) & 0x44444444u) | 0x32103210u;
    lo = prmt(prmt(t.pos_lo, t.pos_hi, mag), prmt(t.neg_lo, t.neg_hi, mag), pick);
    const std::uint32_t mag_hi = mag >> 16, pick_hi = pick >> 16;
    hi = prmt(prmt(t.pos_lo, t.pos_hi, mag_hi), prmt(t.neg_lo, t.neg_hi, mag_hi), pick_hi);
}

// The key precondition, from the 4 exponent bytes (little-endian word) and the mask of blocks
// that hold a nonzero code. Keys failing it are scored by the scalar exact code.
struct indexer_key_int8 {
    bool exact = true;
    int ekmin = 0;           // key value = K8 * 2^(ekmin - 1); 0 for an all-zero key
    unsigned shifts = 0;     // bits 2b..2b+1: shift of block b (0 for zero blocks)
};

DS4_HD_INLINE indexer_key_int8 indexer_key_int8_of(std::uint32_t exponents, unsigned nonzero) {
    int e[4], lo = 127, hi = -128;
    for (int b = 0; b < 4; ++b) {
        e[b] = static_cast<std::int8_t>(static_cast<std::uint8_t>(exponents >> (8 * b)));
        if ((nonzero >> b) & 1u) {
            lo = e[b] < lo ? e[b] : lo;
            hi = e[b] > hi ? e[b] : hi;
        }
    }
    indexer_key_int8 k;
    if ((nonzero & 15u) == 0) return k;
    k.exact = hi - lo <= indexer_int8_max_shift && lo >= indexer_int8_key_exp_lo && hi <= indexer_int8_key_exp_hi;
    k.ekmin = lo;
    for (int b = 0; b < 4; ++b)
        if ((nonzero >> b) & 1u) k.shifts |= unsigned((e[b] - lo) & 3) << (2 * b);
    return k;
}

// The kernel's form of indexer_key_int8_of, one word for the lanes that need it: byte b bits 0-1 =
// (e_b - ekmin) mod 4 (the block shift; any value for a zero block, whose codes all have magnitude
// 0 and give 0 under every table), bit 2 = exact, bits 26-31 = ekmin + 23 when exact (ekmin is in
// [-23, 13] then). The shifts come from one byte-parallel subtraction: every byte of
// (e & 3) | 4 is at least 4 > (ekmin & 3), so no byte borrows from the next.
DS4_HD_INLINE unsigned indexer_key_meta_of(std::uint32_t exponents, unsigned nonzero) {
    int lo = 127, hi = -128;
    for (int b = 0; b < 4; ++b) {
        const int e = static_cast<std::int8_t>(static_cast<std::uint8_t>(exponents >> (8 * b)));
        const bool nz = ((nonzero >> b) & 1u) != 0;
        lo = nz && e < lo ? e : lo;
        hi = nz && e > hi ? e : hi;
    }
    const bool any = (nonzero & 15u) != 0;
    const bool exact =
        !any || (hi - lo <= indexer_int8_max_shift && lo >= indexer_int8_key_exp_lo && hi <= indexer_int8_key_exp_hi);
    const std::uint32_t shifts =
        (((exponents & 0x03030303u) | 0x04040404u) - (std::uint32_t(lo) & 3u) * 0x01010101u) & 0x03030303u;
    const std::uint32_t ek = any ? std::uint32_t(lo - indexer_int8_key_exp_lo) : std::uint32_t(-indexer_int8_key_exp_lo);
    return shifts | (exact ? (4u | (ek << 26)) : 0u);
}
DS4_HD_INLINE unsigned indexer_meta_shift(unsigned meta, int block) { return (meta >> (8 * block)) & 3u; }
DS4_HD_INLINE bool indexer_meta_exact(unsigned meta) { return (meta & 4u) != 0; }
DS4_HD_INLINE int indexer_meta_ekmin(unsigned meta) { return int(meta >> 26) + indexer_int8_key_exp_lo; }

// The kernel's [key][head] product rows (kernels/indexer.cuh): head h of a row sits at float
// 4 * indexer_prod_chunk_pos(h / 4) + h % 4. Chunks 4p+2, 4p+3 trade places so that the 16-byte
// stores of the mma lanes (chunks 2g + q, g = 2p and 2p + 1, for 4 keys each) fall in 8 distinct
// bank groups per quarter-warp with the 68-float row stride; see the kernel.
DS4_HD_INLINE constexpr int indexer_prod_chunk_pos(int chunk) { return chunk ^ ((chunk >> 1) & 1); }
DS4_HD_INLINE constexpr int indexer_prod_offset(int head) { return 4 * indexer_prod_chunk_pos(head >> 2) + (head & 3); }

// Mask of the blocks of a stored key row (indexer_row_layout{128}) that hold a nonzero code.
DS4_HD_INLINE unsigned indexer_row_nonzero_blocks(const std::uint8_t* row) {
    unsigned m = 0;
    for (int b = 0; b < 4; ++b) {
        unsigned any = 0;
        for (int i = 0; i < 16; ++i) any |= row[16 * b + i] & 0x77u;
        m |= (any != 0 ? 1u : 0u) << b;
    }
    return m;
}

DS4_HD_INLINE std::uint32_t indexer_row_exponents(const std::uint8_t* row) {
    return std::uint32_t(row[64]) | (std::uint32_t(row[65]) << 8) | (std::uint32_t(row[66]) << 16) |
           (std::uint32_t(row[67]) << 24);
}

// The query head precondition, from the head's 4 block exponents, its nonzero-block mask and its
// prepared weight w_h. On success w8 = w_h * 2^(eqmin - 2), the weight in integer-dot units.
struct indexer_query_int8 {
    bool exact = true;
    int eqmin = 0;  // query value = Q8 * 2^(eqmin - 1); 0 for an all-zero head
    float w8 = 0.0f;
};

DS4_HD_INLINE indexer_query_int8 indexer_query_int8_of(const int* e, unsigned nonzero, float w) {
    int lo = 127, hi = -128;
    for (int b = 0; b < 4; ++b)
        if ((nonzero >> b) & 1u) {
            lo = e[b] < lo ? e[b] : lo;
            hi = e[b] > hi ? e[b] : hi;
        }
    indexer_query_int8 q;
    if ((nonzero & 15u) != 0) {
        q.eqmin = lo;
        q.exact = hi - lo <= indexer_int8_max_shift && lo >= indexer_int8_query_exp_lo && lo <= indexer_int8_query_exp_hi;
    }
    // eqmin - 2 >= -126, so the scale is a normal power of two and w8 is exact whenever it is normal.
    // A zero weight is tested on w itself: a tiny w8 rounded to zero would drop real products.
    q.w8 = mul_rn(w, exp2i(q.eqmin - 2));
    const float aw = abs_exact(q.w8);
    const bool w_ok = w == 0.0f || (aw >= exp2i(indexer_int8_weight_exp_lo) && aw <= exp2i(indexer_int8_weight_exp_hi));
    q.exact = q.exact && w_ok;
    return q;
}

// round(max(I, 0) * w8) from the biased accumulator (2^23's bits + I), with c8 = -2^23 * w8.
DS4_HD_INLINE float indexer_int8_product(std::int32_t acc, float w8, float c8) {
    const std::int32_t relu = acc > indexer_int8_bias ? acc : indexer_int8_bias;
    return fma_f32(bits_float(static_cast<std::uint32_t>(relu)), w8, c8);
}

}  // namespace ds4::kernels
