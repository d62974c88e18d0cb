// Sink attention (docs/model.md §2.4 step 9) against a double statement, the sink's role, the mask,
// and the inverse RoPE of step 10.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/rope.hpp"
#include "reference/attention_decode.hpp"
#include "reference/norm_rope.hpp"

#include "tests/support/randn.hpp"

namespace {

using ds4::test::randn;

}  // namespace

TEST_CASE("sink attention matches double softmax over raw then visible compressed rows") {
    const int n_head = 3, hd = 192, n_raw = 54, n_comp = 97;
    const auto q = randn(n_head * hd, 1, 1.0f);
    const auto raw = randn(std::size_t(n_raw) * hd, 2, 1.0f);
    const auto comp = randn(std::size_t(n_comp) * hd, 3, 1.0f);
    const std::vector<float> sinks = {0.5f, -3.0f, 4.0f};
    std::vector<std::uint8_t> mask(n_comp);
    for (int c = 0; c < n_comp; ++c) mask[c] = (c % 3) != 1;
    std::vector<float> out(n_head * hd);
    ds4::ref::sink_attention(q.data(), raw.data(), n_raw, comp.data(), n_comp, mask.data(), sinks.data(), n_head,
                             hd, out.data());
    for (int h = 0; h < n_head; ++h) {
        std::vector<const float*> rows;
        for (int r = 0; r < n_raw; ++r) rows.push_back(&raw[std::size_t(r) * hd]);
        for (int c = 0; c < n_comp; ++c)
            if (mask[c]) rows.push_back(&comp[std::size_t(c) * hd]);
        std::vector<double> s(rows.size());
        double m = sinks[h];
        for (std::size_t r = 0; r < rows.size(); ++r) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += double(q[h * hd + i]) * rows[r][i];
            s[r] = d / std::sqrt(double(hd));
            m = std::max(m, s[r]);
        }
        double den = std::exp(sinks[h] - m);
        std::vector<double> o(hd, 0.0);
        for (std::size_t r = 0; r < rows.size(); ++r) {
            const double w = std::exp(s[r] - m);
            den += w;
            for (int i = 0; i < hd; ++i) o[i] += w * rows[r][i];
        }
        for (int i = 0; i < hd; ++i) CHECK(out[h * hd + i] == doctest::Approx(o[i] / den).epsilon(1e-4).scale(1e-3));
    }
}

TEST_CASE("the sink only enlarges the denominator") {
    // q = 0: every score is 0, so o = sum(rows) / (n + e^sink) exactly in real arithmetic.
    const int hd = 64, n_raw = 5;
    const std::vector<float> q(hd, 0.0f);
    const auto raw = randn(std::size_t(n_raw) * hd, 4, 1.0f);
    for (float sink : {-50.0f, 0.0f, 1.0f, 3.0f}) {
        std::vector<float> out(hd);
        ds4::ref::sink_attention(q.data(), raw.data(), n_raw, nullptr, 0, nullptr, &sink, 1, hd, out.data());
        // m = max(sink, 0): weights e^-m per row, e^(sink-m) for the sink.
        const double m = std::max(0.0, double(sink));
        const double den = n_raw * std::exp(-m) + std::exp(sink - m);
        for (int i = 0; i < hd; ++i) {
            double sum = 0;
            for (int r = 0; r < n_raw; ++r) sum += raw[r * hd + i];
            CHECK(out[i] == doctest::Approx(sum * std::exp(-m) / den).epsilon(1e-5).scale(1e-5));
        }
    }
}

TEST_CASE("attention_decode = sink attention, then inverse RoPE on each head tail") {
    const int n_head = 2, hd = 128, n_raw = 7;
    const auto q = randn(n_head * hd, 5, 1.0f);
    const auto raw = randn(std::size_t(n_raw) * hd, 6, 1.0f);
    const std::vector<float> sinks = {0.0f, 1.0f};
    const auto rp = ds4::ds4_rope_params(true);
    std::vector<float> a(n_head * hd), b(n_head * hd);
    ds4::ref::attention_decode(q.data(), raw.data(), n_raw, nullptr, 0, nullptr, sinks.data(), n_head, hd, 64, rp,
                               300, a.data());
    ds4::ref::sink_attention(q.data(), raw.data(), n_raw, nullptr, 0, nullptr, sinks.data(), n_head, hd, b.data());
    // Rotating forward again must give back the plain attention output (within rounding).
    ds4::ref::rope_tail(a.data(), n_head, hd, 64, rp, 300, false);
    for (int i = 0; i < n_head * hd; ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5).scale(1e-5));
}
