#pragma once
// FP4 E2M1 (docs/model.md §2.6): the indexer's QAT round trip and its key cache, one power-of-two
// scale per 32 values. A 4-bit code is sign bit 3 plus a 3-bit index into the magnitudes
// {0, .5, 1, 1.5, 2, 3, 4, 6}; the format has no inf or NaN.
//
// Contract: exact. e2m1_round is decode(encode(.)) and scales are exact powers of two, so
// e2m1_block_decode(e2m1_block_encode(x)) equals e2m1_block_roundtrip(x) bit for bit.
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/minifloat.hpp"

namespace ds4 {

inline constexpr int e2m1_block_size = 32;
inline constexpr float e2m1_max = 6.0f;
// 6 * 2^-126: the spec's floor, chosen so that amax/6 stays a normal float (scale >= 2^-126).
inline constexpr float e2m1_amax_floor = 7.052966104933725e-38f;

using e2m1_grid = detail::minifloat<1, 0, 7, -1>;

// Nearest grid value, ties to the even index, sign kept; beyond 6 (and NaN, which the format
// cannot hold) saturates to 6.
DS4_HD_INLINE std::uint8_t e2m1_encode(float x) {
    const auto sign = static_cast<std::uint8_t>((float_bits(x) >> 28) & 0x8u);
    const float a = abs_exact(x);
    if (!(a == a)) return static_cast<std::uint8_t>(sign | 0x7u);
    return static_cast<std::uint8_t>(sign | e2m1_grid::magnitude_code(a));
}

DS4_HD_INLINE float e2m1_decode(std::uint8_t c) {
    const std::uint32_t sign = std::uint32_t(c & 0x8u) << 28;
    return bits_float(float_bits(e2m1_grid::value(c & 0x7)) | sign);
}

DS4_HD_INLINE float e2m1_round(float x) { return e2m1_decode(e2m1_encode(x)); }

// scale = 2^ceil(log2(max(amax, 6*2^-126) / 6)); finite inputs give -126..126.
DS4_HD_INLINE int e2m1_block_scale_exp(const float* x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = max_num(amax, abs_exact(x[i]));
    amax = max_num(amax, e2m1_amax_floor);
    return ceil_log2(div_rn(amax, e2m1_max));
}

// As for E4M3, x * 2^-exp is bitwise a true division for every reachable exponent, and a NaN
// saturates with its own sign (not the sign of the GPU's canonical NaN product).
DS4_HD_INLINE std::uint8_t e2m1_encode_scaled(float x, float inv_scale) {
    if (!(x == x)) return e2m1_encode(x);
    return e2m1_encode(clamp_symmetric(mul_rn(x, inv_scale), e2m1_max));
}

DS4_HD_INLINE void e2m1_block_roundtrip(float* x, int n) {
    const int e = e2m1_block_scale_exp(x, n);
    const float scale = exp2i(e), inv_scale = exp2i(-e);
    for (int i = 0; i < n; ++i) x[i] = mul_rn(e2m1_decode(e2m1_encode_scaled(x[i], inv_scale)), scale);
}

// Two codes per byte, element 2k in the low nibble; an odd n leaves the last high nibble 0.
DS4_HD_INLINE int e2m1_block_encode(const float* x, int n, std::uint8_t* packed) {
    const int e = e2m1_block_scale_exp(x, n);
    const float inv_scale = exp2i(-e);
    for (int i = 0; i < n; i += 2) {
        const std::uint8_t lo = e2m1_encode_scaled(x[i], inv_scale);
        const std::uint8_t hi = i + 1 < n ? e2m1_encode_scaled(x[i + 1], inv_scale) : 0;
        packed[i / 2] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
    return e;
}

DS4_HD_INLINE void e2m1_block_decode(const std::uint8_t* packed, int exponent, int n, float* out) {
    const float scale = exp2i(exponent);
    for (int i = 0; i < n; ++i) {
        const std::uint8_t code = static_cast<std::uint8_t>((packed[i / 2] >> (4 * (i & 1))) & 0xfu);
        out[i] = mul_rn(e2m1_decode(code), scale);
    }
}

}  // namespace ds4
