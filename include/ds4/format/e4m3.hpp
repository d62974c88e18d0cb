#pragma once
// FP8 E4M3FN (docs/model.md §2.4 step 5): the KV cache's storage for the 448 non-RoPE dims, one
// power-of-two scale per 64 values. Codes are sign bit 7 plus a 7-bit magnitude: exponent
// i>>3, mantissa i&7; value mant*2^-9 for exponent 0, else (1+mant/8)*2^(exp-7); 126 is the
// largest finite code (448) and 127 is NaN.
//
// Contract: exact. e4m3_round is defined as decode(encode(.)), and block scales are powers of
// two applied by exact multiplication, so e4m3_block_decode(e4m3_block_encode(x)) equals
// e4m3_block_roundtrip(x) bit for bit, on host and device alike.
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/minifloat.hpp"

namespace ds4 {

inline constexpr int e4m3_block_size = 64;
inline constexpr float e4m3_max = 448.0f;
// Floor of the block amax, so an all-zero block still gets a finite scale (2^-22).
inline constexpr float e4m3_amax_floor = 1e-4f;

using e4m3_grid = detail::minifloat<3, -6, 126, 127>;

// Nearest E4M3FN code, ties to the even code, sign kept (also for zero and for values that
// round to zero); magnitudes at or beyond 448 saturate to 448, NaN maps to the NaN code.
DS4_HD_INLINE std::uint8_t e4m3_encode(float x) {
    const auto sign = static_cast<std::uint8_t>((float_bits(x) >> 24) & 0x80u);
    const float a = abs_exact(x);
    if (!(a == a)) return static_cast<std::uint8_t>(sign | 0x7fu);
    return static_cast<std::uint8_t>(sign | e4m3_grid::magnitude_code(a));
}

DS4_HD_INLINE float e4m3_decode(std::uint8_t c) {
    const std::uint32_t sign = std::uint32_t(c & 0x80u) << 24;
    const int code = c & 0x7f;
    if (code == 0x7f) return bits_float(sign | 0x7fc00000u);
    return bits_float(float_bits(e4m3_grid::value(code)) | sign);
}

DS4_HD_INLINE float e4m3_round(float x) { return e4m3_decode(e4m3_encode(x)); }

// Block exponent: scale = 2^ceil(log2(max(amax, 1e-4) / 448)), ceil_log2 exact (see
// rounding.hpp for why this deviates from log2f). Finite inputs give -22..120.
DS4_HD_INLINE int e4m3_block_scale_exp(const float* x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = max_num(amax, abs_exact(x[i]));
    amax = max_num(amax, e4m3_amax_floor);
    return ceil_log2(div_rn(amax, e4m3_max));
}

// x/scale is computed as x * 2^-exp: for every exponent a finite block can have, both 2^exp
// and 2^-exp are normal floats, so this is the same real number as a true division rounded
// once, i.e. the same bits, and cheaper on the GPU. A NaN keeps its own sign: the GPU's
// multiply returns a positive canonical NaN where x86 keeps the operand's sign (measured: the
// H200 kv_store check differed from the host in exactly the -NaN codes before this).
DS4_HD_INLINE std::uint8_t e4m3_encode_scaled(float x, float inv_scale) {
    if (!(x == x)) return static_cast<std::uint8_t>(0x7fu | ((float_bits(x) >> 24) & 0x80u));
    return e4m3_encode(clamp_symmetric(mul_rn(x, inv_scale), e4m3_max));
}

DS4_HD_INLINE void e4m3_block_roundtrip(float* x, int n) {
    const int e = e4m3_block_scale_exp(x, n);
    const float scale = exp2i(e), inv_scale = exp2i(-e);
    for (int i = 0; i < n; ++i) x[i] = mul_rn(e4m3_decode(e4m3_encode_scaled(x[i], inv_scale)), scale);
}

// Native storage: one code per value plus the block exponent (returned).
DS4_HD_INLINE int e4m3_block_encode(const float* x, int n, std::uint8_t* codes) {
    const int e = e4m3_block_scale_exp(x, n);
    const float inv_scale = exp2i(-e);
    for (int i = 0; i < n; ++i) codes[i] = e4m3_encode_scaled(x[i], inv_scale);
    return e;
}

DS4_HD_INLINE void e4m3_block_decode(const std::uint8_t* codes, int exponent, int n, float* out) {
    const float scale = exp2i(exponent);
    for (int i = 0; i < n; ++i) out[i] = mul_rn(e4m3_decode(codes[i]), scale);
}

}  // namespace ds4
