// The shared reduction order of ds4/core/reduce.hpp: hand-worked cases where the lane order and a
// sequential sum differ, the RMS scale against its formula, and the claim the kernels rely on:
// a block of T threads (each owning lanes t + T*j, combining them in registers, then across
// threads by xor partners) computes the same bits as the 256-lane halving tree, whether its lanes
// are summed lane by lane or streamed chunk by chunk (add_thread_chunk).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ds4/core/reduce.hpp"

namespace {

// The combining half of the kernels' schedule (group_lane_combine) in plain C++, over the lane
// sums that lanes_of(t, v) leaves in thread t's v.
template <class LanesOf>
double combine_schedule(int threads, LanesOf lanes_of) {
    const int per = ds4::reduce_lanes / threads;
    std::vector<double> acc(threads);
    for (int t = 0; t < threads; ++t) {
        std::vector<double> v(per);
        lanes_of(t, v.data());
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

// block_lane_reduce for T threads: each lane's sum by lane_partial.
double block_schedule(const std::vector<double>& term, int threads) {
    const int n = int(term.size());
    return combine_schedule(threads, [&](int t, double* v) {
        for (int j = 0; j < ds4::reduce_lanes / threads; ++j)
            v[j] = ds4::lane_partial<double>(t + threads * j, n, [&](int i) { return term[i]; });
    });
}

// The vector kernels' schedule (norm_rope_vec_kernel, hc_row_scales): thread t visits its chunks
// t + Threads*m, m ascending, through add_thread_chunk.
template <int Threads>
double streamed_schedule(const std::vector<double>& term) {
    const int n = int(term.size());
    return combine_schedule(Threads, [&](int t, double* v) {
        double lanes[ds4::lanes_per_thread<Threads>] = {};
        for (int m = 0; (t + Threads * m) * ds4::reduce_chunk < n; ++m)
            ds4::add_thread_chunk<Threads>(lanes, t, m, n, [&](int i) { return term[i]; });
        std::copy(lanes, lanes + ds4::lanes_per_thread<Threads>, v);
    });
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
        CHECK(streamed_schedule<32>(sq) == want);
        CHECK(streamed_schedule<64>(sq) == want);
        CHECK(streamed_schedule<128>(sq) == want);
        CHECK(streamed_schedule<256>(sq) == want);
    }
}

TEST_CASE("streamed chunks: thread t's m-th chunk goes to lane t + Threads*(m % lanes_per_thread)") {
    // 32 threads, 8 lanes each: thread 1's chunks are 1, 33, 65, ... (m = 0, 1, 2, ...); chunk 33
    // (m = 1) is lane 33's first, chunk 257 (m = 8) is lane 1's second.
    double v[ds4::lanes_per_thread<32>] = {};
    const auto term = [](int i) { return double(i); };
    ds4::add_thread_chunk<32>(v, 1, 1, 2000, term);
    CHECK(v[1] == 132.0 + 133.0 + 134.0 + 135.0);
    ds4::add_thread_chunk<32>(v, 1, 0, 2000, term);
    ds4::add_thread_chunk<32>(v, 1, 8, 2000, term);
    CHECK(v[0] == (4.0 + 5.0 + 6.0 + 7.0) + (1028.0 + 1029.0 + 1030.0 + 1031.0));
    ds4::add_thread_chunk<32>(v, 1, 64, 2000, term);  // chunk 2049 starts past n: nothing added
    CHECK(v[0] == 4.0 + 5.0 + 6.0 + 7.0 + 1028.0 + 1029.0 + 1030.0 + 1031.0);
    double tail[ds4::lanes_per_thread<256>] = {};
    ds4::add_thread_chunk<256>(tail, 3, 0, 14, term);  // chunk 3 holds 12, 13 (14, 15 are past n)
    CHECK(tail[0] == 25.0);
}

TEST_CASE("add_whole_chunk adds what add_thread_chunk adds for a chunk inside the row") {
    // Terms chosen so that the order of the adds shows: 2^53 + 1 + 1 + 1 in double, one add at a
    // time, is 2^53 (each one rounds away to even), not 2^53 + 4.
    const auto term = [](int i) { return i % 4 == 0 ? 0x1p53 : 1.0; };
    double a[ds4::lanes_per_thread<64>] = {}, b[ds4::lanes_per_thread<64>] = {};
    for (int m = 0; m < 8; ++m) {
        const int c = 5 + 64 * m;
        ds4::add_thread_chunk<64>(a, 5, m, 4096, term);
        ds4::add_whole_chunk<64>(b, m, [&](int e) { return term(c * 4 + e); });
    }
    for (int j = 0; j < ds4::lanes_per_thread<64>; ++j) CHECK(a[j] == b[j]);
    CHECK(b[0] == 0x1p54);  // chunks m = 0 and 4 (slot 0): every one rounds away
}

TEST_CASE("sum_exp_shifted is the lane tree of exp_f32(l - m)") {
    std::vector<float> l = {0.5f, -1.0f, 2.0f, 2.0f, -30.0f};
    float want = ds4::exp_f32(0.5f - 2.0f) + ds4::exp_f32(-1.0f - 2.0f);
    want = want + ds4::exp_f32(0.0f);
    want = want + ds4::exp_f32(0.0f);  // lane 0 holds the first four, in order
    want = want + ds4::exp_f32(-32.0f);  // lane 1 holds the fifth
    CHECK(ds4::sum_exp_shifted(l.data(), 5, 2.0f) == want);
}
