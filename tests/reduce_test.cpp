// The shared reduction order of ds4/core/reduce.hpp: hand-worked cases where the lane order and a
// sequential sum differ, the RMS scale against its formula, and the claim the kernels rely on:
// a block of T threads (each owning lanes t + T*j, combining them in registers, then across
// threads by xor partners) computes the same bits as the 256-lane halving tree.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ds4/core/reduce.hpp"

namespace {

// The kernel's schedule written out in plain C++ (block_lane_reduce for T threads).
double block_schedule(const std::vector<double>& term, int threads) {
    const int n = int(term.size()), per = ds4::reduce_lanes / threads;
    std::vector<double> acc(threads);
    for (int t = 0; t < threads; ++t) {
        std::vector<double> v(per);
        for (int j = 0; j < per; ++j) v[j] = ds4::lane_partial<double>(t + threads * j, n, [&](int i) { return term[i]; });
        acc[t] = ds4::lane_butterfly(v.data(), per);
    }
    for (int off = threads / 2; off > 0; off /= 2) {
        std::vector<double> next(threads);
        for (int t = 0; t < threads; ++t) next[t] = acc[t] + acc[t ^ off];
        acc = next;
    }
    for (int t = 1; t < threads; ++t) REQUIRE(acc[t] == acc[0]);  // every thread holds the total
    return acc[0];
}

}  // namespace

TEST_CASE("lane order: chunks of 4 per lane, then the lanes' tree (hand case)") {
    // Lane 0 holds 1 + three 2^-53 (each a tie that rounds back to 1); lane 1 holds four 2^-53
    // (exactly 2^-51). The tree gives 1 + 2^-51; the sequential chain would stay at 1.
    const std::vector<double> v = {1.0, 0x1p-53, 0x1p-53, 0x1p-53, 0x1p-53, 0x1p-53, 0x1p-53, 0x1p-53};
    const double tree = ds4::lane_tree_reduce<double>(8, [&](int i) { return v[std::size_t(i)]; });
    double seq = 0.0;
    for (double x : v) seq += x;
    CHECK(seq == 1.0);
    CHECK(tree == 1.0 + 0x1p-51);
}

TEST_CASE("rms_scale follows 1/sqrt(mean square + eps)") {
    const float x[5] = {3.0f, 4.0f, 0.0f, -0.0f, 0.0f};
    CHECK(ds4::rms_sum_squares(x, 5) == 25.0);
    CHECK(ds4::rms_scale(x, 4, 0.0f) == 0.4f);
    CHECK(ds4::rms_scale(x, 5, 0.0f) == 1.0f / std::sqrt(5.0f));
}

TEST_CASE("a block of 32, 64, 128 or 256 threads computes the lane tree's bits") {
    std::mt19937_64 g(3);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (int n : {1, 7, 300, 1027, 4096, 16384, 16387}) {
        std::vector<float> x(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) x[std::size_t(i)] = std::ldexp(n01(g), int(g() % 40) - 20);
        std::vector<double> sq(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) sq[std::size_t(i)] = ds4::square_f64(x[std::size_t(i)]);
        const double want = ds4::rms_sum_squares(x.data(), n);
        for (int threads : {32, 64, 128, 256}) CHECK(block_schedule(sq, threads) == want);
    }
}

TEST_CASE("sum_exp_shifted is the lane tree of exp_f32(l - m)") {
    std::vector<float> l = {0.5f, -1.0f, 2.0f, 2.0f, -30.0f};
    float want = ds4::exp_f32(0.5f - 2.0f) + ds4::exp_f32(-1.0f - 2.0f);
    want = want + ds4::exp_f32(0.0f);
    want = want + ds4::exp_f32(0.0f);  // lane 0 holds the first four, in order
    want = want + ds4::exp_f32(-32.0f);  // lane 1 holds the fifth
    CHECK(ds4::sum_exp_shifted(l.data(), 5, 2.0f) == want);
}
