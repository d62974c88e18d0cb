// ds4::exp_f32 / log_f32 / log1p_f32 / sigmoid / softplus / sincos_f32 against double-precision
// libm. The functions promise "accurate to ~1 ulp" and deterministic bits; the expected values
// here come from glibc's double functions, an independent implementation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "ds4/core/math.hpp"

namespace {

// Error of `got` against the exact value `want`, in ulps of the float grid at `want`.
double ulp_error(float got, double want) {
    if (std::isnan(want)) return std::isnan(got) ? 0.0 : 1e9;
    if (std::isinf(want)) {
        if (std::isinf(got) && (got > 0) == (want > 0)) return 0.0;
        // The exact value can exceed FLT_MAX by less than half an ulp and still round down.
        want = want > 0 ? std::numeric_limits<float>::max() : -std::numeric_limits<float>::max();
    }
    if (std::isinf(got)) {
        const double lim = std::ldexp(1.0, 128) * (1.0 - std::ldexp(1.0, -25));
        return std::fabs(want) >= lim ? 0.0 : 1e9;
    }
    const double a = std::fabs(want);
    int e = a > 0 ? std::ilogb(a) : -149;
    if (e < -126) e = -126;
    const double ulp = std::ldexp(1.0, e - 23);
    return std::fabs(double(got) - want) / ulp;
}

float from_bits(std::uint32_t u) { return ds4::bits_float(u); }

}  // namespace

TEST_CASE("exp_f32 is within 1 ulp of exp over the float range") {
    double worst = 0;
    float worst_x = 0;
    for (std::uint64_t u = 0; u <= 0xffffffffu; u += 61) {
        const float x = from_bits(static_cast<std::uint32_t>(u));
        if (std::isnan(x)) continue;
        const double err = ulp_error(ds4::exp_f32(x), std::exp(double(x)));
        if (err > worst) {
            worst = err;
            worst_x = x;
        }
    }
    MESSAGE("exp_f32 worst error " << worst << " ulp at x = " << worst_x);
    CHECK(worst <= 1.0);
}

TEST_CASE("exp_f32 edges") {
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(ds4::exp_f32(0.0f) == 1.0f);
    CHECK(ds4::exp_f32(-0.0f) == 1.0f);
    CHECK(ds4::exp_f32(inf) == inf);
    CHECK(ds4::exp_f32(-inf) == 0.0f);
    CHECK(std::isnan(ds4::exp_f32(std::numeric_limits<float>::quiet_NaN())));
    CHECK(ds4::exp_f32(88.72f) < inf);    // just below ln(FLT_MAX)
    CHECK(ds4::exp_f32(88.73f) == inf);   // just above
    CHECK(ds4::exp_f32(-87.5f) > 0.0f);   // normal
    CHECK(ds4::exp_f32(-100.0f) > 0.0f);  // subnormal, e^-100 = 3.7e-44
    CHECK(ulp_error(ds4::exp_f32(-100.0f), std::exp(-100.0)) <= 1.0);
    CHECK(ds4::exp_f32(-104.0f) == 0.0f);
    CHECK(ds4::exp_f32(1.0f) == doctest::Approx(2.718281828).epsilon(1e-7));
}

TEST_CASE("log_f32 is within 1 ulp and log1p_f32 within 1.25 ulp") {
    double worst_log = 0, worst_log1p = 0;
    for (std::uint64_t u = 1; u < 0x7f800000u; u += 37) {  // every positive finite class
        const float x = from_bits(static_cast<std::uint32_t>(u));
        const double e1 = ulp_error(ds4::log_f32(x), std::log(double(x)));
        const double e2 = ulp_error(ds4::log1p_f32(x), std::log1p(double(x)));
        if (e1 > worst_log) worst_log = e1;
        if (e2 > worst_log1p) worst_log1p = e2;
    }
    for (std::uint32_t u = 0x80000001u; u < 0xbf800000u; u += 37) {  // y in (-1, 0)
        const float y = from_bits(u);
        const double e2 = ulp_error(ds4::log1p_f32(y), std::log1p(double(y)));
        if (e2 > worst_log1p) worst_log1p = e2;
    }
    MESSAGE("log_f32 worst " << worst_log << " ulp, log1p_f32 worst " << worst_log1p << " ulp");
    CHECK(worst_log <= 1.0);
    CHECK(worst_log1p <= 1.25);
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(ds4::log_f32(1.0f) == 0.0f);
    CHECK(ds4::log_f32(0.0f) == -inf);
    CHECK(std::isnan(ds4::log_f32(-1.0f)));
    CHECK(ds4::log_f32(inf) == inf);
    CHECK(ds4::log1p_f32(0.0f) == 0.0f);
    CHECK(ds4::log1p_f32(-1.0f) == -inf);
    CHECK(std::isnan(ds4::log1p_f32(-2.0f)));
    CHECK(ds4::log1p_f32(1e-30f) == 1e-30f);
}

TEST_CASE("sigmoid, silu and softplus against double formulas") {
    double worst_sig = 0, worst_sp = 0;
    for (int i = -400000; i <= 400000; ++i) {
        const float x = float(i) * 1.3e-4f;  // [-52, 52]
        const double xd = x;
        const double sig = 1.0 / (1.0 + std::exp(-xd));
        worst_sig = std::fmax(worst_sig, ulp_error(ds4::sigmoid(x), sig));
        const double sp = x > 20.0f ? xd : (x < -20.0f ? std::exp(xd) : std::log1p(std::exp(xd)));
        worst_sp = std::fmax(worst_sp, ulp_error(ds4::softplus(x), sp));
        CHECK_MESSAGE(std::fabs(ds4::silu(x) - xd * sig) <= 4e-7 * std::fabs(xd * sig) + 1e-44, x);
    }
    MESSAGE("sigmoid worst " << worst_sig << " ulp, softplus worst " << worst_sp << " ulp");
    CHECK(worst_sig <= 2.5);
    CHECK(worst_sp <= 2.0);
    // The piecewise definition of softplus (docs/model.md §2.7) at its switch points.
    CHECK(ds4::softplus(20.5f) == 20.5f);
    CHECK(ds4::softplus(-20.5f) == ds4::exp_f32(-20.5f));
    CHECK(ds4::softplus(20.0f) == ds4::log1p_f32(ds4::exp_f32(20.0f)));
    CHECK(ds4::sigmoid(-200.0f) == 0.0f);
    CHECK(ds4::sigmoid(200.0f) == 1.0f);
    CHECK(ds4::sigmoid(0.0f) == 0.5f);
}

TEST_CASE("sin/cos stay accurate at RoPE angles up to 1e6 and beyond") {
    double worst = 0;
    float worst_x = 0;
    // Angles as RoPE produces them: pos * theta_scale^k rounded to float, for large pos.
    for (std::uint32_t u = 0; u < 0x4f800000u; u += 1013) {  // [0, 2^32)
        const float x = from_bits(u);
        float s, c;
        ds4::sincos_f32(x, &s, &c);
        const double es = ulp_error(s, std::sin(double(x)));
        const double ec = ulp_error(c, std::cos(double(x)));
        // Results near zero are judged on absolute error at the float grid of 1 (a sin value
        // of 1e-9 has no meaning finer than the argument's own spacing).
        const double abs_s = std::fabs(double(s) - std::sin(double(x))) / 0x1p-24;
        const double abs_c = std::fabs(double(c) - std::cos(double(x))) / 0x1p-24;
        const double e = std::fmax(std::fmin(es, abs_s), std::fmin(ec, abs_c));
        if (e > worst) {
            worst = e;
            worst_x = x;
        }
    }
    MESSAGE("sincos_f32 worst " << worst << " ulp at x = " << worst_x);
    CHECK(worst <= 0.5001);  // correctly rounded but for double-rounding cases
    // Hand values: pi/2-ish quadrant boundaries and a large RoPE angle.
    CHECK(ds4::sin_f32(0.0f) == 0.0f);
    CHECK(ds4::cos_f32(0.0f) == 1.0f);
    CHECK(ds4::sin_f32(-1.0f) == -ds4::sin_f32(1.0f));
    CHECK(ds4::cos_f32(-1.0f) == ds4::cos_f32(1.0f));
    CHECK(ds4::sin_f32(1048575.0f) == float(std::sin(1048575.0)));
    CHECK(ds4::cos_f32(1048575.0f) == float(std::cos(1048575.0)));
    CHECK(std::isnan(ds4::sin_f32(std::numeric_limits<float>::infinity())));
    // The domain ends at 2^50 (RoPE angles stay below 2^32): beyond it NaN, never garbage.
    CHECK(std::fabs(ds4::sin_f32(0x1.fffffep49f)) <= 1.0f);
    for (float big : {0x1p50f, 1e19f, -3e25f, 3e38f}) {
        float s, c;
        ds4::sincos_f32(big, &s, &c);
        CHECK(std::isnan(s));
        CHECK(std::isnan(c));
    }
}
