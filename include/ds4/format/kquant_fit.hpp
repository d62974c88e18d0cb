#pragma once
// Host-side scale/min search shared by the Q2_K and Q4_K weight quantisers. They exist for
// synthetic models and tests, so they aim at a small, bounded decode error rather than at
// reproducing GGML's make_qkx2_quants bit for bit.
#include <cmath>
#include <cstdint>

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
