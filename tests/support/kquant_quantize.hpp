#pragma once
// Q2_K and Q4_K weight quantisers for tests: the library only decodes these formats (the model
// ships them), so the encoders live beside the tests that need quantised weights. They aim at a
// small, bounded decode error rather than at reproducing GGML's make_qkx2_quants bit for bit.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"

namespace ds4::detail {

// x ~= scale * q - min with q in 0..nmax, scale >= 0 and min >= 0 (the K-quant layouts store
// the min as a subtracted non-negative term).
struct scale_min {
    float scale;
    float min;
};

inline int nearest_level(float x, float scale, float min, int nmax) {
    if (scale <= 0.0f) return 0;
    const int q = static_cast<int>(std::lround((x + min) / scale));
    return q < 0 ? 0 : (q > nmax ? nmax : q);
}

// Tries a fan of step sizes around (max - min)/nmax, refits scale and min by least squares on
// the levels each one induces, and keeps the fit with the smallest squared error.
inline scale_min fit_scale_min(const float* x, int n, int nmax) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; ++i) {
        lo = std::fmin(lo, x[i]);
        hi = std::fmax(hi, x[i]);
    }
    if (hi <= lo) return {0.0f, -lo};
    scale_min best{(hi - lo) / static_cast<float>(nmax), -lo};
    double best_err = INFINITY;
    for (int step = -8; step <= 8; ++step) {
        const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / (hi - lo);
        double sl = 0, sll = 0, sx = 0, slx = 0;
        int levels[256];
        for (int i = 0; i < n; ++i) {
            int q = static_cast<int>(std::lround(iscale * (x[i] - lo)));
            q = q < 0 ? 0 : (q > nmax ? nmax : q);
            levels[i] = q;
            sl += q;
            sll += double(q) * q;
            sx += x[i];
            slx += q * double(x[i]);
        }
        // Least squares for x ~= s*q + off, then off <= 0 enforced (the layout cannot add).
        const double det = n * sll - sl * sl;
        if (det <= 0) continue;
        double s = (n * slx - sl * sx) / det;
        double off = (sx - s * sl) / n;
        if (off > 0) {
            off = 0;
            s = slx / sll;
        }
        if (s <= 0) continue;
        double err = 0;
        for (int i = 0; i < n; ++i) {
            const double e = s * levels[i] + off - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best = {static_cast<float>(s), static_cast<float>(-off)};
        }
    }
    return best;
}

// Codes non-negative per-group values (scales or mins) as 0..code_max times one super-scale,
// which is returned (the caller stores it as F16); codes[g] = round(v[g]/super).
inline float quantize_super(const float* v, int count, int code_max, std::uint8_t* codes) {
    float vmax = 0.0f;
    for (int g = 0; g < count; ++g) vmax = std::fmax(vmax, v[g]);
    const float super = vmax / static_cast<float>(code_max);
    for (int g = 0; g < count; ++g) {
        const int c = super > 0.0f ? static_cast<int>(std::lround(v[g] / super)) : 0;
        codes[g] = static_cast<std::uint8_t>(c < 0 ? 0 : (c > code_max ? code_max : c));
    }
    return super;
}

}  // namespace ds4::detail

namespace ds4 {

// Weight quantiser (host only): per-group least-squares scale/min, 4-bit codes under F16
// super-scales, then every quant re-chosen against the scales as they will decode.
inline void quantize_q2_k(const float* x, q2_k_block* out, std::size_t n) {
    require(n % 256 == 0, "quantize_q2_k: n = " + std::to_string(n) + " is not a multiple of 256");
    for (std::size_t b = 0; b < n / 256; ++b) {
        const float* xb = x + 256 * b;
        q2_k_block& o = out[b];
        float scales[16], mins[16];
        for (int g = 0; g < 16; ++g) {
            const detail::scale_min f = detail::fit_scale_min(xb + 16 * g, 16, 3);
            scales[g] = f.scale;
            mins[g] = f.min;
        }
        std::uint8_t sc[16], mc[16];
        o.d = f32_to_f16(detail::quantize_super(scales, 16, 15, sc));
        o.dmin = f32_to_f16(detail::quantize_super(mins, 16, 15, mc));
        const float d = f16_to_f32(o.d), dmin = f16_to_f32(o.dmin);
        for (int g = 0; g < 16; ++g) o.scales[g] = static_cast<std::uint8_t>(sc[g] | (mc[g] << 4));
        for (int i = 0; i < 64; ++i) o.qs[i] = 0;
        for (int e = 0; e < 256; ++e) {
            const int g = e >> 4;
            const int q = detail::nearest_level(xb[e], d * float(sc[g]), dmin * float(mc[g]), 3);
            const int k = e >> 7, j = (e >> 5) & 3, r = e & 31;
            o.qs[32 * k + r] = static_cast<std::uint8_t>(o.qs[32 * k + r] | (q << (2 * j)));
        }
    }
}

// Weight quantiser (host only): per-group least-squares scale/min, 6-bit codes under F16
// super-scales, then every quant re-chosen against the scales as they will decode.
inline void quantize_q4_k(const float* x, q4_k_block* out, std::size_t n) {
    require(n % 256 == 0, "quantize_q4_k: n = " + std::to_string(n) + " is not a multiple of 256");
    for (std::size_t b = 0; b < n / 256; ++b) {
        const float* xb = x + 256 * b;
        q4_k_block& o = out[b];
        float scales[8], mins[8];
        for (int j = 0; j < 8; ++j) {
            const detail::scale_min f = detail::fit_scale_min(xb + 32 * j, 32, 15);
            scales[j] = f.scale;
            mins[j] = f.min;
        }
        std::uint8_t sc[8], mc[8];
        o.d = f32_to_f16(detail::quantize_super(scales, 8, 63, sc));
        o.dmin = f32_to_f16(detail::quantize_super(mins, 8, 63, mc));
        for (int j = 0; j < 4; ++j) {
            o.scales[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
            o.scales[j + 4] = static_cast<std::uint8_t>(mc[j] | ((mc[j + 4] >> 4) << 6));
            o.scales[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mc[j + 4] & 15) << 4));
        }
        const float d = f16_to_f32(o.d), dmin = f16_to_f32(o.dmin);
        for (int i = 0; i < 128; ++i) o.qs[i] = 0;
        for (int e = 0; e < 256; ++e) {
            const int j = e >> 5;
            const int q = detail::nearest_level(xb[e], d * float(sc[j]), dmin * float(mc[j]), 15);
            const int idx = (j >> 1) * 32 + (e & 31);
            o.qs[idx] = static_cast<std::uint8_t>(o.qs[idx] | (q << (4 * (j & 1))));
        }
    }
}

}  // namespace ds4
