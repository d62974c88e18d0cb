// Indexer queries and the row selection (docs/model.md §2.6) against an independent double-precision
// statement of the spec: q = q_b . qn; per head RoPE (compressed-layer YaRN parameters) on the
// LAST 64 of the 128 dims; the Sylvester Hadamard matrix times 1/sqrt(128); the E2M1 round trip
// per 32 values with scale 2^ceil(log2(amax/6)). The float code may differ from the double
// statement only where the FP4 rounding is decided by float noise: an element within 1e-4 of a
// grid midpoint, or a block whose amax/6 is within 1e-4 of a power of two. Everything else must
// be equal bit for bit, and such ambiguous elements must stay rare or the test proves nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "reference/indexer.hpp"

namespace {

constexpr int hd = 128;

// Compressed-layer RoPE from docs/model.md §1/§2.4: base 160000, 64 rotated dims, freq_scale 1/16,
// ramp between corr dims 15 and 25. theta_extrap is the spec's iterated float product ((float)pos
// times float(160000^(-2/64)) once per pair: at pos 300000 it is 0.1 rad away from the exact
// power); everything after it in double.
void rope_tail_d(double* x, std::uint32_t pos) {
    const float theta_scale = static_cast<float>(std::pow(160000.0, -2.0 / 64.0));
    float extrap_f = static_cast<float>(pos);
    for (int k = 0; k < 32; ++k, extrap_f *= theta_scale) {
        const double extrap = extrap_f;
        const double ramp = 1.0 - std::clamp((k - 15.0) / 10.0, 0.0, 1.0);
        const double theta = extrap / 16.0 * (1.0 - ramp) + extrap * ramp;
        const double c = std::cos(theta), s = std::sin(theta);
        const double a = x[2 * k], b = x[2 * k + 1];
        x[2 * k] = a * c - b * s;
        x[2 * k + 1] = a * s + b * c;
    }
}

void hadamard_d(double* x) {
    double y[hd];
    for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int j = 0; j < hd; ++j) acc += (__builtin_popcount(unsigned(i & j)) & 1 ? -x[j] : x[j]);
        y[i] = acc / std::sqrt(128.0);
    }
    std::copy(y, y + hd, x);
}

// FP4 of one 32-block. Returns false in `clear` for elements whose rounding float noise can flip.
void e2m1_d(const double* v, float* out, bool* clear) {
    const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    double amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    amax = std::max(amax, 7.052966104933725e-38);
    const double l = std::log2(amax / 6.0);
    const bool scale_clear = std::fabs(l - std::round(l)) > 1e-4;
    const double scale = std::exp2(std::ceil(l));
    for (int i = 0; i < 32; ++i) {
        const double t = std::min(std::fabs(v[i]) / scale, 6.0);
        int best = 0;
        for (int g = 1; g < 8; ++g)
            if (std::fabs(t - grid[g]) < std::fabs(t - grid[best])) best = g;
        bool near_mid = false;
        for (int g = 0; g < 7; ++g) near_mid = near_mid || std::fabs(t - 0.5 * (grid[g] + grid[g + 1])) < 1e-4;
        // Exact midpoints (ties) go to the even index; the float code sees them as ties too only
        // if it got the same t, so they count as unclear as well.
        out[i] = float(std::copysign(grid[best] * scale, v[i]));
        clear[i] = scale_clear && !near_mid;
    }
}

// docs/model.md §2.6 queries for all heads.
void spec_queries(const std::vector<std::uint16_t>& q_b, const std::vector<float>& qn, int n_lora_q, int n_head,
                  std::uint32_t pos, std::vector<float>& q, std::vector<bool>& clear) {
    q.assign(std::size_t(n_head) * hd, 0.0f);
    clear.assign(q.size(), true);
    for (int h = 0; h < n_head; ++h) {
        double x[hd];
        for (int d = 0; d < hd; ++d) {
            const std::size_t o = std::size_t(h) * hd + d;
            double acc = 0;
            for (int i = 0; i < n_lora_q; ++i) acc += double(ds4::f16_to_f32(q_b[o * n_lora_q + i])) * qn[i];
            x[d] = acc;
        }
        rope_tail_d(x + 64, pos);
        hadamard_d(x);
        for (int b = 0; b < hd; b += 32) {
            bool c[32];
            e2m1_d(x + b, q.data() + std::size_t(h) * hd + b, c);
            for (int i = 0; i < 32; ++i) clear[std::size_t(h) * hd + b + i] = c[i];
        }
    }
}

struct inputs {
    int n_lora_q, n_head;
    std::vector<std::uint16_t> q_b;
    std::vector<float> qn;
};

inputs random_inputs(std::mt19937& rng, int n_lora_q, int n_head) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    inputs in{n_lora_q, n_head, {}, {}};
    in.q_b.resize(std::size_t(n_head) * hd * n_lora_q);
    for (auto& w : in.q_b) w = ds4::f32_to_f16(0.05f * n(rng));
    in.qn.resize(std::size_t(n_lora_q));
    for (auto& v : in.qn) v = n(rng);
    return in;
}

}  // namespace

TEST_CASE("indexer queries == the double-precision statement of §2.6 (RoPE on the last 64 dims)") {
    std::mt19937 rng(1717);
    const ds4::rope_params rp = ds4::ds4_rope_params(true);
    const std::uint32_t positions[] = {0, 1, 3, 17, 100, 513, 2051, 65535, 300000};
    std::size_t n_checked = 0, n_unclear = 0;
    for (std::uint32_t pos : positions) {
        const inputs in = random_inputs(rng, 64, 4);
        std::vector<float> got(std::size_t(in.n_head) * hd), want;
        std::vector<bool> clear;
        ds4::ref::indexer_queries(in.q_b.data(), in.qn.data(), in.n_lora_q, in.n_head, pos, rp, got.data());
        spec_queries(in.q_b, in.qn, in.n_lora_q, in.n_head, pos, want, clear);
        for (std::size_t i = 0; i < got.size(); ++i) {
            if (!clear[i]) {
                ++n_unclear;
                continue;
            }
            ++n_checked;
            INFO("pos " << pos << " head " << i / hd << " dim " << i % hd);
            CHECK(got[i] == want[i]);
        }
    }
    CHECK(n_unclear * 50 < n_checked);  // fewer than 2% left undecided
}

TEST_CASE("indexer mask == top-k of the spec's scores when the k-th gap is clear") {
    std::mt19937 rng(99);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const ds4::rope_params rp = ds4::ds4_rope_params(true);
    const int n_lora_q = 64, n_head = 8, n_embd = 64, top_k = 16, n_comp = 40;
    int decided = 0;
    for (int trial = 0; trial < 12; ++trial) {
        const std::uint32_t pos = 4 * n_comp + 7u * trial + 1u;
        const inputs in = random_inputs(rng, n_lora_q, n_head);
        std::vector<std::uint16_t> proj(std::size_t(n_head) * n_embd);
        for (auto& w : proj) w = ds4::f32_to_f16(0.1f * n(rng));
        std::vector<float> xn(n_embd), keys(std::size_t(n_comp) * hd);
        for (auto& v : xn) v = n(rng);
        for (auto& v : keys) v = n(rng);

        std::vector<float> q;
        std::vector<bool> clear;
        spec_queries(in.q_b, in.qn, n_lora_q, n_head, pos, q, clear);
        if (std::count(clear.begin(), clear.end(), false) != 0) continue;  // an FP4 flip would move scores
        // w_h = (proj_h . xn) / sqrt(128 * n_head); score_c = sum_h w_h relu(k_c . q_h).
        std::vector<double> score(n_comp, 0.0);
        for (int h = 0; h < n_head; ++h) {
            double w = 0;
            for (int i = 0; i < n_embd; ++i) w += double(ds4::f16_to_f32(proj[std::size_t(h) * n_embd + i])) * xn[i];
            w /= std::sqrt(128.0 * n_head);
            for (int c = 0; c < n_comp; ++c) {
                double dot = 0;
                for (int d = 0; d < hd; ++d) dot += double(keys[std::size_t(c) * hd + d]) * q[std::size_t(h) * hd + d];
                score[c] += std::max(dot, 0.0) * w;
            }
        }
        std::vector<double> sorted = score;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        if (sorted[top_k - 1] - sorted[top_k] < 1e-4 * std::fabs(sorted[0])) continue;
        ++decided;
        const auto mask = ds4::ref::indexer_mask(in.q_b.data(), proj.data(), in.qn.data(), xn.data(), keys.data(),
                                                 n_comp, n_lora_q, n_embd, n_head, top_k, pos, rp);
        REQUIRE(mask.size() == std::size_t(n_comp));
        for (int c = 0; c < n_comp; ++c) {
            INFO("trial " << trial << " row " << c << " score " << score[c]);
            CHECK(bool(mask[c]) == (score[c] >= sorted[top_k - 1]));
        }
    }
    CHECK(decided >= 6);
}
