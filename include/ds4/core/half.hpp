#pragma once
// IEEE binary16 and bfloat16 conversions, bit-exact on host and device. The software path is
// round-to-nearest-even like the hardware conversions, so the reference and the kernels agree
// on every input, NaN payloads aside (NaN maps to a quiet NaN of the same sign).
#include <cstdint>
#include <cstring>

#include "ds4/core/host_device.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace ds4 {

DS4_HD_INLINE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

DS4_HD_INLINE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

DS4_HD_INLINE float f16_to_f32(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
    // The conversion instruction is exact for every finite half; NaNs keep the software path
    // so their payload bits match the host.
    if ((h & 0x7c00u) != 0x7c00u) return __half2float(__ushort_as_half(h));
#endif
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24, exact in float.
    int e = -1;
    do {
        mant <<= 1;
        ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_float(sign | (std::uint32_t(112 - e) << 23) | (mant << 13));
}

// A half as an operand of float arithmetic: on the device the conversion instruction for every
// half, NaNs included. It differs from f16_to_f32 only in a NaN's payload bits, which the
// arithmetic consuming it does not keep (the device's float operations return the canonical NaN),
// and it has no branch (a dot of 16 halves took 16 check-and-branch pairs).
DS4_HD_INLINE float f16_operand(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    return f16_to_f32(h);
#endif
}

DS4_HD_INLINE std::uint16_t f32_to_f16(float f) {
    const std::uint32_t u = float_bits(f);
    const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to or beyond inf
    if (abs >= 0x38800000u) {                                      // normal half
        const std::uint32_t mant_odd = (abs >> 13) & 1u;
        const std::uint32_t rounded = abs + 0xfffu + mant_odd;       // RNE on the 13 dropped bits
        return std::uint16_t(sign | ((rounded - 0x38000000u) >> 13));
    }
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
    // Subnormal half: shift the implicit-1 mantissa into place, round to nearest even.
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14..24
    const std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    const std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return std::uint16_t(sign | r);
}

// "F16 round" of the spec: f16_to_f32(f32_to_f16(x)).
DS4_HD_INLINE float f16_round(float x) { return f16_to_f32(f32_to_f16(x)); }

DS4_HD_INLINE float bf16_to_f32(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

DS4_HD_INLINE std::uint16_t f32_to_bf16(float f) {
    const std::uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);
    return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace ds4
