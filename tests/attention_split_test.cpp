// The split-KV replay of kernels/attention_decode.cuh (reference/attention_split): same
// mathematics as sink_attention within F32 rounding, against a double softmax; chunks fixed by
// absolute position (a shifted window regroups rows, a longer batch does not); masked rows absent.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/attention_decode.hpp"
#include "reference/attention_split.hpp"

#include "tests/support/randn.hpp"

namespace {

using ds4::test::randn;

// Double evaluation of the same formula over the visible rows.
std::vector<double> softmax_double(const std::vector<float>& q, const std::vector<const float*>& rows,
                                   const std::vector<float>& sinks, int n_head, int hd) {
    std::vector<double> out(std::size_t(n_head) * hd, 0.0);
    for (int h = 0; h < n_head; ++h) {
        std::vector<double> s(rows.size());
        double m = sinks[std::size_t(h)];
        for (std::size_t r = 0; r < rows.size(); ++r) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += double(q[std::size_t(h) * hd + std::size_t(i)]) * rows[r][i];
            s[r] = d / std::sqrt(double(hd));
            m = std::max(m, s[r]);
        }
        double den = std::exp(sinks[std::size_t(h)] - m);
        for (std::size_t r = 0; r < rows.size(); ++r) {
            const double w = std::exp(s[r] - m);
            den += w;
            for (int i = 0; i < hd; ++i) out[std::size_t(h) * hd + std::size_t(i)] += w * rows[r][i];
        }
        for (int i = 0; i < hd; ++i) out[std::size_t(h) * hd + std::size_t(i)] /= den;
    }
    return out;
}

}  // namespace

TEST_CASE("split replay agrees with sink_attention and a double softmax") {
    const int n_head = 4, hd = 128;
    for (int n_raw : {1, 17, 64, 128})
        for (int n_comp : {0, 63, 200}) {
            const std::int64_t first = 1000 - n_raw + 1;  // window ends at position 1000 (chunk 15 ends at 1023)
            const auto q = randn(std::size_t(n_head) * hd, 1, 2.0f);
            const auto raw = randn(std::size_t(n_raw) * hd, 2, 1.0f);
            const auto comp = randn(std::size_t(std::max(1, n_comp)) * hd, 3, 1.0f);
            const auto sinks = randn(std::size_t(n_head), 4, 1.0f);
            std::vector<std::uint8_t> mask(std::size_t(std::max(1, n_comp)));
            for (int c = 0; c < n_comp; ++c) mask[std::size_t(c)] = (c * 7) % 3 != 0;
            std::vector<float> got(std::size_t(n_head) * hd), ref(got.size());
            ds4::ref::split_sink_attention(q.data(), raw.data(), first, n_raw, comp.data(), n_comp, mask.data(), sinks.data(),
                                           n_head, hd, got.data());
            ds4::ref::sink_attention(q.data(), raw.data(), n_raw, comp.data(), n_comp, mask.data(), sinks.data(), n_head, hd,
                                     ref.data());
            std::vector<const float*> rows;
            for (int r = 0; r < n_raw; ++r) rows.push_back(raw.data() + std::size_t(r) * hd);
            for (int c = 0; c < n_comp; ++c)
                if (mask[std::size_t(c)]) rows.push_back(comp.data() + std::size_t(c) * hd);
            const auto dbl = softmax_double(q, rows, sinks, n_head, hd);
            for (std::size_t i = 0; i < got.size(); ++i) {
                CHECK(std::fabs(got[i] - dbl[i]) <= 2e-6 * (1.0 + std::fabs(dbl[i])));
                CHECK(std::fabs(got[i] - ref[i]) <= 4e-6 * (1.0 + std::fabs(ref[i])));
            }
        }
}

TEST_CASE("split chunks follow absolute positions") {
    const int n_head = 2, hd = 128, n_raw = 100;
    const auto q = randn(std::size_t(n_head) * hd, 5, 3.0f);
    const auto raw = randn(std::size_t(n_raw) * hd, 6, 1.0f);
    const auto sinks = randn(std::size_t(n_head), 7, 1.0f);
    std::vector<float> a(std::size_t(n_head) * hd), b(a.size()), c(a.size());
    // The same rows at positions 0..99 and 64..163 group identically (both split at row 64)...
    ds4::ref::split_sink_attention(q.data(), raw.data(), 0, n_raw, nullptr, 0, nullptr, sinks.data(), n_head, hd, a.data());
    ds4::ref::split_sink_attention(q.data(), raw.data(), 64, n_raw, nullptr, 0, nullptr, sinks.data(), n_head, hd, b.data());
    // ...and at 30..129 they split at rows 34 and 98: a different, equally valid rounding order.
    ds4::ref::split_sink_attention(q.data(), raw.data(), 30, n_raw, nullptr, 0, nullptr, sinks.data(), n_head, hd, c.data());
    bool all_same = true;
    for (std::size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i] == b[i]);
        CHECK(std::fabs(a[i] - c[i]) <= 4e-6 * (1.0 + std::fabs(a[i])));
        all_same = all_same && a[i] == c[i];
    }
    CHECK_FALSE(all_same);
}

TEST_CASE("split masked compressed rows are absent, not zero-weighted") {
    const int n_head = 2, hd = 128, n_comp = 130;
    const auto q = randn(std::size_t(n_head) * hd, 8, 1.0f);
    const auto raw = randn(std::size_t(hd), 9, 1.0f);
    auto comp = randn(std::size_t(n_comp) * hd, 10, 1.0f);
    const auto sinks = randn(std::size_t(n_head), 11, 1.0f);
    std::vector<std::uint8_t> mask(std::size_t(n_comp), 1);
    mask[70] = 0;
    for (int i = 0; i < hd; ++i) comp[std::size_t(70) * hd + std::size_t(i)] = std::nanf("");
    std::vector<float> got(std::size_t(n_head) * hd);
    ds4::ref::split_sink_attention(q.data(), raw.data(), 5, 1, comp.data(), n_comp, mask.data(), sinks.data(), n_head, hd,
                                   got.data());
    for (float v : got) CHECK(std::isfinite(v));
}
