#pragma once
// The one RoPE angle definition (docs/model.md §2.4 step 4) for the CPU reference and every kernel.
//
// Pairs are adjacent (GGML "normal" mode): (x[2k], x[2k+1]) of the rotated tail, k = 0..n_rot/2-1.
//   theta_extrap(k) = (float)pos * theta_scale^k, as an iterated float product: start at
//                     (float)pos and multiply by theta_scale once per pair (upstream's CPU path).
//                     Upstream's CUDA computes pos*powf(base, -2k/n_rot) instead (§7.8); that is
//                     one of the reasons its GPU is not bit-equal to its CPU. We keep the CPU
//                     form because it uses only IEEE multiplications, identical on both sides.
//   YaRN (compressed layers): ramp = 1 - clamp((k - low)/max(0.001, high - low), 0, 1),
//                     theta = (freq_scale*theta_extrap)*(1-ramp) + theta_extrap*ramp.
//   cos/sin from sincos_f32 (math.hpp: double-precision reduction, deterministic).
// The YaRN magnitude factor (1+0.1 ln 16) is cancelled by upstream's attn_factor and evaluates
// to exactly 1.0f, so it is not applied at all here (multiplying by 1 changes no bit).
#include <cmath>
#include <cstdint>

#include "ds4/core/host_device.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4 {

struct rope_params {
    float theta_scale = 1.0f;  // base^(-2/n_rot)
    float freq_scale = 1.0f;   // 1, or 1/scale_factor with YaRN
    float corr_low = 0.0f;     // YaRN ramp: pairs k <= corr_low rotate at the raw frequency,
    float corr_high = 0.0f;    // pairs k >= corr_high at freq_scale times it
    bool yarn = false;
};

// Host-side construction from the model constants (§1), in double and rounded once, so the
// parameters do not depend on the platform's powf/logf. Kernels receive the struct by value.
inline rope_params make_rope_params(float freq_base, float freq_scale, bool yarn, int n_rot,
                                    int orig_ctx, float beta_fast, float beta_slow) {
    rope_params p;
    p.theta_scale = static_cast<float>(std::pow(double(freq_base), -2.0 / double(n_rot)));
    p.freq_scale = freq_scale;
    p.yarn = yarn;
    if (yarn) {
        // corr(beta) = n_rot * ln(orig_ctx / (beta * 2 pi)) / (2 ln base); 15.45 and 24.71 for
        // the compressed layers, far from an integer, so floor/ceil are platform-independent.
        const double two_pi = 6.283185307179586;
        auto corr = [&](double beta) {
            return n_rot * std::log(orig_ctx / (beta * two_pi)) / (2.0 * std::log(double(freq_base)));
        };
        const double lo = std::floor(corr(beta_fast));
        const double hi = std::ceil(corr(beta_slow));
        p.corr_low = static_cast<float>(lo < 0.0 ? 0.0 : lo);
        p.corr_high = static_cast<float>(hi > n_rot - 1 ? n_rot - 1 : hi);
    }
    return p;
}

// DeepSeek-V4-Flash: layers with compression (ratio != 0) use base 160000 with YaRN (factor 16,
// original context 65536, betas 32/1); window-only layers and the MTP block use base 10000.
inline rope_params ds4_rope_params(bool compressed_layer, int n_rot = 64) {
    return compressed_layer ? make_rope_params(160000.0f, 1.0f / 16.0f, true, n_rot, 65536, 32.0f, 1.0f)
                            : make_rope_params(10000.0f, 1.0f, false, n_rot, 65536, 32.0f, 1.0f);
}

// YaRN ramp of pair k: 1 = raw frequency, 0 = interpolated.
DS4_HD_INLINE float rope_yarn_ramp(const rope_params& p, int k) {
    const float y = div_rn(sub_rn(static_cast<float>(k), p.corr_low),
                           max_num(0.001f, sub_rn(p.corr_high, p.corr_low)));
    const float c = y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);
    return sub_rn(1.0f, c);
}

// The angle of pair k at position pos from theta_extrap(k), i.e. after the iterated product.
DS4_HD_INLINE float rope_theta_from_extrap(const rope_params& p, float theta_extrap, int k) {
    const float theta_interp = mul_rn(p.freq_scale, theta_extrap);
    if (!p.yarn) return theta_interp;
    const float ramp = rope_yarn_ramp(p, k);
    return add_rn(mul_rn(theta_interp, sub_rn(1.0f, ramp)), mul_rn(theta_extrap, ramp));
}

// theta_extrap(k): k multiplications from (float)pos. A kernel thread owning one pair loops
// k <= 31 times; a thread owning a whole tail walks the pairs in order (rope_tail_inplace).
DS4_HD_INLINE float rope_theta(const rope_params& p, std::uint32_t pos, int k) {
    float t = static_cast<float>(pos);
    for (int i = 0; i < k; ++i) t = mul_rn(t, p.theta_scale);
    return rope_theta_from_extrap(p, t, k);
}

// Rotate one pair by (c, s); inverse RoPE passes -s (§2.4 step 10).
DS4_HD_INLINE void rope_rotate(float& x0, float& x1, float c, float s) {
    const float a = x0, b = x1;
    x0 = sub_rn(mul_rn(a, c), mul_rn(b, s));
    x1 = add_rn(mul_rn(a, s), mul_rn(b, c));
}

// Rotate the n_rot values at `tail` (n_rot even) for position pos.
DS4_HD_INLINE void rope_tail_inplace(float* tail, int n_rot, const rope_params& p, std::uint32_t pos,
                                     bool inverse) {
    float theta_extrap = static_cast<float>(pos);
    for (int k = 0; k < n_rot / 2; ++k) {
        float s, c;
        sincos_f32(rope_theta_from_extrap(p, theta_extrap, k), &s, &c);
        rope_rotate(tail[2 * k], tail[2 * k + 1], c, inverse ? -s : s);
        theta_extrap = mul_rn(theta_extrap, p.theta_scale);
    }
}

}  // namespace ds4
