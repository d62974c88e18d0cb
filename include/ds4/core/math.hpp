#pragma once
// The project's own elementary functions: exp, log, log1p, sigmoid, silu, softplus, sin/cos.
//
// Why they exist: glibc's expf/log1pf/sinf/cosf and CUDA's differ in the last bit on a share of
// inputs, so a kernel that called the CUDA versions could never be bit-identical to a reference
// that called libm (docs/README.md decision 1). These are written only with IEEE basic operations whose
// results are fixed by the standard (+ - * / sqrt, fma, rint, bit manipulation), every intended
// FMA spelled fmaf/fma and every other product and sum rounded on its own, so the host and the
// device produce the same bits for every input. They are accurate, not correctly rounded: the
// error bounds below are measured in tests/math_test.cpp against double-precision libm.
#include <cmath>
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4 {

// ---- single-rounding primitives not in rounding.hpp (fused and double-precision forms) ----

DS4_HD_INLINE float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

DS4_HD_INLINE double fma_f64(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
    return __fma_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

DS4_HD_INLINE double mul_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

// Nearest integer, ties to even, as a float (x must be finite; |x| < 2^23 keeps it exact).
DS4_HD_INLINE float rint_f32(float x) {
#if defined(__CUDA_ARCH__)
    return rintf(x);
#else
    return std::nearbyint(x);
#endif
}

DS4_HD_INLINE double rint_f64(double x) {
#if defined(__CUDA_ARCH__)
    return rint(x);
#else
    return std::nearbyint(x);
#endif
}

// ---- exp ----

// e^x for float x. Max error 0.92 ulp over the whole float range (measured: see math_test);
// overflow gives +inf (x > ~88.72), underflow rounds through the subnormals to +0, NaN gives NaN.
// Method: x = k*ln2 + r with k = rint(x/ln2), |r| <= ln2/2, the reduction done with two fmaf
// against a two-part ln2 (the first is exact, see below); e^r by the degree-7 Taylor polynomial
// in Horner form (truncation < 0.1 ulp at |r| = ln2/2); then an exact scaling by 2^k.
DS4_HD_INLINE float exp_f32(float x) {
    if (!(x == x)) return add_rn(x, x);  // NaN in, quiet NaN out
    if (x > 89.0f) return bits_float(0x7f800000u);
    if (x < -104.0f) return 0.0f;  // e^-104 < 2^-150: rounds to zero
    constexpr float log2e = 1.44269502163f;
    constexpr float ln2_hi = 0x1.62e430p-1f;   // float(ln 2)
    constexpr float ln2_lo = -0x1.05c610p-29f;  // float(ln 2 - ln2_hi)
    const float k = rint_f32(mul_rn(x, log2e));
    // x - k*ln2_hi is a multiple of 2^-24 of magnitude < 0.5 whenever k != 0, hence exact.
    float r = fma_f32(-k, ln2_hi, x);
    r = fma_f32(-k, ln2_lo, r);
    float p = 1.0f / 5040.0f;
    p = fma_f32(p, r, 1.0f / 720.0f);
    p = fma_f32(p, r, 1.0f / 120.0f);
    p = fma_f32(p, r, 1.0f / 24.0f);
    p = fma_f32(p, r, 1.0f / 6.0f);
    p = fma_f32(p, r, 0.5f);
    p = fma_f32(p, r, 1.0f);
    p = fma_f32(p, r, 1.0f);  // e^r in [0.70, 1.42]
    const int ki = static_cast<int>(k);
    // Split the scale so that only the last multiply can round (overflow or subnormal result).
    if (ki > 127) return mul_rn(mul_rn(p, exp2i(127)), exp2i(ki - 127));
    if (ki < -126) return mul_rn(mul_rn(p, exp2i(ki + 126)), exp2i(-126));
    return mul_rn(p, exp2i(ki));
}

// ---- log, log1p ----

namespace math_detail {

// log(1+f) for f in [sqrt(1/2)-1, sqrt(2)-1] given exactly: with s = f/(2+f),
// log(1+f) = 2 atanh(s) = f - (f^2/2 - s*(f^2/2 + R(s^2))), R = 2z/3 + 2z^2/5 + 2z^3/7 + 2z^4/9.
// Written this way the large term f is exact and the rounding errors sit in the small
// correction, which keeps the result under 1 ulp. Truncation: s^10/11 < 3e-9 relative.
// `e_ln2_lo` lets log_f32 fold its low exponent part into the correction.
DS4_HD_INLINE float log1p_reduced(float f, float e_ln2_lo) {
    const float s = div_rn(f, add_rn(2.0f, f));
    const float z = mul_rn(s, s);
    float R = 2.0f / 9.0f;
    R = fma_f32(R, z, 2.0f / 7.0f);
    R = fma_f32(R, z, 2.0f / 5.0f);
    R = fma_f32(R, z, 2.0f / 3.0f);
    R = mul_rn(R, z);
    const float hfsq = mul_rn(mul_rn(0.5f, f), f);
    const float corr = sub_rn(hfsq, fma_f32(s, add_rn(hfsq, R), e_ln2_lo));
    return sub_rn(f, corr);
}

}  // namespace math_detail

// Natural log for float x. Max error 0.81 ulp (measured). log(0) = -inf, log(x<0) = NaN,
// log(inf) = inf. x = 2^e * m with m in [sqrt(1/2), sqrt(2)); log x = e*ln2 + log(m), with
// ln2 split so that e*ln2_hi is exact for every exponent (16 significant bits).
DS4_HD_INLINE float log_f32(float x) {
    if (!(x == x)) return add_rn(x, x);
    if (x < 0.0f) return bits_float(0x7fc00000u);
    if (x == 0.0f) return bits_float(0xff800000u);
    if (x == bits_float(0x7f800000u)) return x;
    constexpr float ln2_hi = 0x1.62e400p-1f;    // 45426 * 2^-16
    constexpr float ln2_lo = 0x1.7f7d1cp-20f;   // float(ln 2 - ln2_hi)
    std::uint32_t u = float_bits(x);
    int e = 0;
    if (u < 0x00800000u) {  // subnormal: scale into the normal range first
        u = float_bits(mul_rn(x, exp2i(23)));
        e = -23;
    }
    e += static_cast<int>(u >> 23) - 127;
    std::uint32_t mbits = (u & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
    if (mbits > 0x3fb504f3u) {                               // m > sqrt(2): use m/2 and e+1
        mbits -= 0x00800000u;
        e += 1;
    }
    const float f = sub_rn(bits_float(mbits), 1.0f);  // exact (Sterbenz)
    const float ef = static_cast<float>(e);
    const float lm = math_detail::log1p_reduced(f, mul_rn(ef, ln2_lo));
    return add_rn(mul_rn(ef, ln2_hi), lm);
}

// log(1+y) for float y. Max error 1.2 ulp over y > -1 (measured; 0.8 ulp inside the
// reduced range). For 1+y inside
// [sqrt(1/2), sqrt(2)] y itself is the exact reduced argument; outside it, log(1+y) =
// log(u) + c/u where u = fl(1+y) and c = (1+y) - u is the exact rounding error (TwoSum).
DS4_HD_INLINE float log1p_f32(float y) {
    if (!(y == y)) return add_rn(y, y);
    if (y < -1.0f) return bits_float(0x7fc00000u);
    if (y == -1.0f) return bits_float(0xff800000u);
    if (y == bits_float(0x7f800000u)) return y;
    if (y >= -0.29289321f && y <= 0.41421356f) return math_detail::log1p_reduced(y, 0.0f);
    const float u = add_rn(1.0f, y);
    const float bv = sub_rn(u, 1.0f);
    const float c = add_rn(sub_rn(1.0f, sub_rn(u, bv)), sub_rn(y, bv));
    return add_rn(log_f32(u), div_rn(c, u));
}

// ---- activations ----

// The "stable sigmoid" of docs/model.md §2.7/§2.8 (upstream sigmoid_stable): for x >= 0,
// 1/(1+e^-x); for x < 0, e^x/(1+e^x), so e^|x| never overflows. Note the HC pre/post gates
// of §2.2 use the plain 1/(1+e^-x) for every x; hyper_connection writes that form itself.
// Max error 2.2 ulp (measured: exp's error plus the division).
DS4_HD_INLINE float sigmoid(float x) {
    if (x >= 0.0f) return div_rn(1.0f, add_rn(1.0f, exp_f32(-x)));
    const float e = exp_f32(x);
    return div_rn(e, add_rn(1.0f, e));
}

DS4_HD_INLINE float silu(float x) { return mul_rn(x, sigmoid(x)); }

// The shared expert's SwiGLU (docs/model.md §2.7): the gate clamped from above, the up
// projection on both sides, silu(min(g, c)) * clamp(u, -c, c).
DS4_HD_INLINE float swiglu_clamped(float g, float u, float c) {
    return mul_rn(silu(fminf(g, c)), fmaxf(fminf(u, c), -c));
}

// softplus exactly as docs/model.md §2.7: x above 20 passes through, below -20 it is e^x, else
// log1p(e^x). The router takes sqrtf of it.
DS4_HD_INLINE float softplus(float x) {
    if (x > 20.0f) return x;
    if (x < -20.0f) return exp_f32(x);
    return log1p_f32(exp_f32(x));
}

// ---- sin, cos ----

// sin and cos of a float angle, evaluated in double and rounded once to float. RoPE angles
// reach pos * 1 rad ~ 1e6 rad (and up to 4e9 at pos = 2^32), where a float reduction would
// lose every bit. k = rint(x * 2/pi); r = x - k*pi/2 with pi/2 in three double parts via fma:
// the first fma is exact (both x and k*p1 are multiples of 2^-52 and |r| < 1), the others
// round relative to |r|, so r is accurate to ~1e-16 relative over the domain |x| < 2^50. On |r| <= pi/4
// the Taylor polynomials (sin to r^13, cos to r^14) are accurate to ~3e-14 relative; the float
// result is therefore the correctly rounded one except within ~1e-13 of a rounding midpoint.
// Deterministic: only IEEE double basic operations, fma and floor.
DS4_HD_INLINE void sincos_f32(float angle, float* sin_out, float* cos_out) {
    // Domain |angle| < 2^50: beyond it rint(x*2/pi) is no longer within one of the true
    // quotient and r would be meaningless. RoPE angles stay below 2^32. Outside (inf and NaN
    // included) the result is NaN, on both sides.
    if (!(abs_exact(angle) < 0x1p50f)) {
        *sin_out = *cos_out = bits_float(0x7fc00000u);
        return;
    }
    constexpr double two_over_pi = 0x1.45f306dc9c883p-1;
    constexpr double p1 = 0x1.921fb54442d18p+0;    // pi/2 rounded to double
    constexpr double p2 = 0x1.1a62633145c07p-54;   // pi/2 - p1 rounded
    constexpr double p3 = -0x1.f1976b7ed8fbcp-110; // pi/2 - p1 - p2 rounded
    const double x = angle;
    const double k = rint_f64(mul_f64(x, two_over_pi));
    double r = fma_f64(-k, p1, x);
    r = fma_f64(-k, p2, r);
    r = fma_f64(-k, p3, r);
    const double z = mul_f64(r, r);
    double ps = 1.0 / 6227020800.0;  // 1/13!
    ps = fma_f64(ps, z, -1.0 / 39916800.0);
    ps = fma_f64(ps, z, 1.0 / 362880.0);
    ps = fma_f64(ps, z, -1.0 / 5040.0);
    ps = fma_f64(ps, z, 1.0 / 120.0);
    ps = fma_f64(ps, z, -1.0 / 6.0);
    const double sr = fma_f64(mul_f64(ps, z), r, r);  // r + r^3 * P(z)
    double pc = 1.0 / 87178291200.0;  // 1/14!
    pc = fma_f64(pc, z, -1.0 / 479001600.0);
    pc = fma_f64(pc, z, 1.0 / 3628800.0);
    pc = fma_f64(pc, z, -1.0 / 40320.0);
    pc = fma_f64(pc, z, 1.0 / 720.0);
    pc = fma_f64(pc, z, -1.0 / 24.0);
    pc = fma_f64(pc, z, 0.5);
    const double cr = fma_f64(-pc, z, 1.0);  // 1 - z * Q(z)
    // Quadrant k mod 4, computed in double: every step is exact (a power-of-two scale, floor,
    // a difference in {0..3}), and unlike a cast to an integer it has no out-of-range case whose
    // result differs between x86 (INT64_MIN) and the GPU (saturation) for angles beyond 2^63.
    const double k_div4 = mul_f64(k, 0.25);
#if defined(__CUDA_ARCH__)
    const double k_floor4 = floor(k_div4);
#else
    const double k_floor4 = std::floor(k_div4);
#endif
    const int q = static_cast<int>(k - 4.0 * k_floor4);
    double s, c;
    switch (q) {
        case 0: s = sr; c = cr; break;
        case 1: s = cr; c = -sr; break;
        case 2: s = -sr; c = -cr; break;
        default: s = -cr; c = sr; break;
    }
    *sin_out = static_cast<float>(s);
    *cos_out = static_cast<float>(c);
}

DS4_HD_INLINE float sin_f32(float x) {
    float s, c;
    sincos_f32(x, &s, &c);
    return s;
}

DS4_HD_INLINE float cos_f32(float x) {
    float s, c;
    sincos_f32(x, &s, &c);
    return c;
}

}  // namespace ds4
