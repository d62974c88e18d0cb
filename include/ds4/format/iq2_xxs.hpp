#pragma once
// IQ2_XXS (docs/model.md §5.4): 256 weights in 8 sub-blocks of 32; each sub-block is 8 bytes: four
// grid indices (8 magnitudes each, from iq2xxs_grid), four 7-bit sign fields (ksigns_iq2xs
// restores the eighth sign by parity) and a 4-bit scale s. Weight = d*(0.5+s)*0.25*grid*sign.
//
// Contract: exact. dequantize and dot_iq2_xxs_q8_k give the same bits on host and device. The
// dot is ds4's scalar branch (§7.3): integer sumi per sub-block times (2s+1), summed as
// integers per block; sumf += (d*x.d)*bsum; the result is 0.125f*sumf.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/iq2_xxs_tables.hpp"
#include "ds4/format/q8_k.hpp"

namespace ds4 {

struct iq2_xxs_block {
    std::uint16_t d;  // F16
    std::uint16_t qs[32];
};
static_assert(sizeof(iq2_xxs_block) == 66 && alignof(iq2_xxs_block) == 2, "GGML block_iq2_xxs layout");

// The two little-endian words of sub-block ib: a0 = grid indices, a1 = signs and scale.
DS4_HD_INLINE void iq2_xxs_words(const iq2_xxs_block& b, int ib, std::uint32_t& a0, std::uint32_t& a1) {
    a0 = std::uint32_t(b.qs[4 * ib]) | (std::uint32_t(b.qs[4 * ib + 1]) << 16);
    a1 = std::uint32_t(b.qs[4 * ib + 2]) | (std::uint32_t(b.qs[4 * ib + 3]) << 16);
}

DS4_HD_INLINE void dequantize(const iq2_xxs_block& b, float* out256) {
    const float d = f16_to_f32(b.d);
    for (int ib = 0; ib < 8; ++ib) {
        std::uint32_t a0, a1;
        iq2_xxs_words(b, ib, a0, a1);
        // (d*(0.5+s))*0.25 as GGML's dequantize_row_iq2_xxs rounds it; 0.5+s is exact.
        const float db = mul_rn(mul_rn(d, 0.5f + static_cast<float>(a1 >> 28)), 0.25f);
        for (int l = 0; l < 4; ++l) {
            const std::uint64_t grid = iq2xxs_grid_at(static_cast<int>((a0 >> (8 * l)) & 255u));
            const std::uint8_t signs = iq2xxs_ksigns_at(static_cast<int>((a1 >> (7 * l)) & 127u));
            for (int j = 0; j < 8; ++j) {
                const float v = mul_rn(db, static_cast<float>((grid >> (8 * j)) & 255u));
                out256[32 * ib + 8 * l + j] = (signs >> j) & 1u ? -v : v;
            }
        }
    }
}

DS4_HD_INLINE float dot_iq2_xxs_q8_k(const iq2_xxs_block* w, const q8_k_block* x, int nblocks) {
    float sumf = 0.0f;
    for (int b = 0; b < nblocks; ++b) {
        // |bsum| <= 8 * 31 * 32*43*128: well inside int32.
        std::int32_t bsum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            std::uint32_t a0, a1;
            iq2_xxs_words(w[b], ib, a0, a1);
            std::int32_t sumi = 0;
            for (int l = 0; l < 4; ++l) {
                const std::uint64_t grid = iq2xxs_grid_at(static_cast<int>((a0 >> (8 * l)) & 255u));
                const std::uint8_t signs = iq2xxs_ksigns_at(static_cast<int>((a1 >> (7 * l)) & 127u));
                for (int j = 0; j < 8; ++j) {
                    const std::int32_t p = std::int32_t((grid >> (8 * j)) & 255u) * x[b].qs[32 * ib + 8 * l + j];
                    sumi += (signs >> j) & 1u ? -p : p;
                }
            }
            bsum += sumi * std::int32_t(2 * (a1 >> 28) + 1);
        }
        const float d = mul_rn(f16_to_f32(w[b].d), x[b].d);
        sumf = add_rn(sumf, mul_rn(d, static_cast<float>(bsum)));
    }
    return mul_rn(0.125f, sumf);
}

namespace detail {
// splitmix64: state advances by a constant per output, so output k of a stream is reachable
// in O(1) (state + k*0x9e3779b97f4a7c15), which lets a generator split a tensor over threads.
inline std::uint64_t iq2_splitmix64(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
}  // namespace detail

// Random valid blocks for synthetic models. Every bit pattern of qs is a valid block: a grid
// index may be any byte, ksigns maps every 7-bit field to an even-parity mask, and s is any
// nibble. So a random block is d followed by 64 random bytes.
// Bulk generator: block i takes splitmix64 outputs 8i..8i+7 of `state` (qs bytes in
// little-endian order), all with scale f16(d); `state` is left advanced by 8*count outputs.
// Several GB/s on one core: eight multiply-xorshift rounds and one 64-byte copy per block.
inline void fill_random_iq2_xxs(std::uint64_t& state, iq2_xxs_block* out, std::size_t count, float d) {
    const std::uint16_t dh = f32_to_f16(d);
    for (std::size_t i = 0; i < count; ++i) {
        std::uint64_t r[8];
        for (int k = 0; k < 8; ++k) r[k] = detail::iq2_splitmix64(state);
        out[i].d = dh;
        std::memcpy(out[i].qs, r, sizeof r);
    }
}

// RMS of the weights of random blocks with scale f16(d): |d| * sqrt(E[((2s+1)/8)^2] *
// E[grid^2]) over uniform s and uniform grid bytes; a generator picks d from a target RMS.
inline double iq2_xxs_random_rms(float d) {
    double s2 = 0;
    for (int s = 0; s < 16; ++s) s2 += (2.0 * s + 1) * (2.0 * s + 1) / 64.0;
    double g2 = 0;
    for (int n = 0; n < 256; ++n)
        for (int j = 0; j < 8; ++j) {
            const double g = static_cast<double>((iq2xxs_grid[n] >> (8 * j)) & 255u);
            g2 += g * g;
        }
    const double dd = f16_to_f32(f32_to_f16(d));
    return (dd < 0 ? -dd : dd) * std::sqrt(s2 / 16.0 * g2 / 2048.0);
}

}  // namespace ds4
