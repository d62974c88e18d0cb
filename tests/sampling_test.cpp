// Sampling: argmax, the top-k / top-p / min-p filters on hand cases, and the counter-based RNG
// (Random123's Philox4x32-10 known answers; same seed and step, same draw).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "ds4/core/rng.hpp"
#include "reference/sampling.hpp"

using ds4::ref::sampling_params;

TEST_CASE("Philox4x32-10 known-answer vectors (Random123 kat_vectors)") {
    const auto a = ds4::philox4x32_10({{0, 0, 0, 0}}, 0, 0);
    CHECK(a.v[0] == 0x6627e8d5u);
    CHECK(a.v[1] == 0xe169c58du);
    CHECK(a.v[2] == 0xbc57ac4cu);
    CHECK(a.v[3] == 0x9b00dbd8u);
    const auto b = ds4::philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
    CHECK(b.v[0] == 0x408f276du);
    CHECK(b.v[3] == 0x6d5451fdu);
    const auto c = ds4::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
    CHECK(c.v[0] == 0xd16cfe09u);
    CHECK(c.v[1] == 0x94fdccebu);
    CHECK(c.v[2] == 0x5001e420u);
    CHECK(c.v[3] == 0x24126ea1u);
}

TEST_CASE("argmax picks the first maximum") {
    const float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f};
    CHECK(ds4::ref::sample_argmax(l, 6) == 1);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float m[3] = {nan, -5.0f, -7.0f};
    CHECK(ds4::ref::sample_argmax(m, 3) == 1);
    sampling_params greedy;  // temperature 0
    CHECK(ds4::ref::sample(l, 6, greedy, 3) == 1);
}

TEST_CASE("top-k, top-p and min-p filters on hand cases") {
    // Logits ln(w) with unnormalised weights 8, 4, 2, 1, 1 (temperature 1).
    const float l[5] = {std::log(2.0f), std::log(8.0f), std::log(1.0f), std::log(4.0f), std::log(1.0f)};
    auto support = [&](sampling_params p) {
        std::set<int> seen;
        for (std::uint64_t step = 0; step < 4000; ++step) seen.insert(ds4::ref::sample(l, 5, p, step));
        return seen;
    };
    sampling_params p;
    p.temperature = 1.0f;
    p.seed = 7;
    CHECK(support(p) == std::set<int>{0, 1, 2, 3, 4});
    p.top_k = 2;
    CHECK(support(p) == std::set<int>{1, 3});
    p.top_k = 0;
    p.top_p = 0.75f;  // 8/16 = 0.5 < 0.75 <= 12/16: tokens 1 and 3
    CHECK(support(p) == std::set<int>{1, 3});
    p.top_p = 0.76f;  // needs 14/16: tokens 1, 3, 0
    CHECK(support(p) == std::set<int>{0, 1, 3});
    p.top_p = 1.0f;
    p.min_p = 0.25f;  // w/w_max >= 0.25: 8, 4, 2
    CHECK(support(p) == std::set<int>{0, 1, 3});
    p.min_p = 0.6f;  // only the best
    CHECK(support(p) == std::set<int>{1});
    // Ties at the top-k boundary: the lower index wins.
    const float t[4] = {1.0f, 3.0f, 3.0f, 3.0f};
    sampling_params k2;
    k2.temperature = 1.0f;
    k2.top_k = 2;
    std::set<int> seen;
    for (std::uint64_t step = 0; step < 500; ++step) seen.insert(ds4::ref::sample(t, 4, k2, step));
    CHECK(seen == std::set<int>{1, 2});
}

TEST_CASE("same seed and step, same draw; frequencies follow the weights") {
    const float l[4] = {0.0f, std::log(3.0f), std::log(2.0f), std::log(4.0f)};  // weights 1, 3, 2, 4
    sampling_params p;
    p.temperature = 1.0f;
    p.seed = 0x1234567890abcdefull;
    std::vector<int> a, b, counts(4, 0);
    const int n = 20000;
    for (int s = 0; s < n; ++s) {
        a.push_back(ds4::ref::sample(l, 4, p, std::uint64_t(s)));
        b.push_back(ds4::ref::sample(l, 4, p, std::uint64_t(s)));
        ++counts[a.back()];
    }
    CHECK(a == b);
    p.seed += 1;
    int same = 0;
    for (int s = 0; s < n; ++s) same += ds4::ref::sample(l, 4, p, std::uint64_t(s)) == a[s];
    CHECK(same < n * 0.45);  // a different seed gives a different stream (~30% agree by chance)
    const double w[4] = {0.1, 0.3, 0.2, 0.4};
    for (int i = 0; i < 4; ++i) CHECK(std::fabs(counts[i] / double(n) - w[i]) < 0.015);
    // Uniforms are 24-bit and in [0, 1).
    for (std::uint64_t s = 0; s < 1000; ++s) {
        const float u = ds4::rng_uniform(42, s);
        CHECK(u >= 0.0f);
        CHECK(u < 1.0f);
    }
}
