// Reference matvecs (Q8_0 with activation quantisation, F16, F32): values against a double
// statement on decoded weights, and results independent of the thread count (bitwise).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/q8_0.hpp"
#include "reference/matvec.hpp"
#include "reference/parallel.hpp"

#include "tests/support/randn.hpp"

namespace {

using ds4::test::randn;

struct thread_count_guard {
    ~thread_count_guard() { ds4::ref::set_thread_count(0); }
};

}  // namespace

TEST_CASE("Q8_0 matvec: integer block dots of the quantised activation") {
    const int n_in = 32 * 37, n_out = 53;  // 37 blocks: crosses the 16-block segment twice
    const auto wf = randn(std::size_t(n_in) * n_out, 1, 0.02f);
    std::vector<ds4::q8_0_block> w(wf.size() / 32);
    ds4::quantize_q8_0(wf.data(), w.data(), wf.size());
    const auto x = randn(n_in, 2);
    std::vector<float> y(n_out);
    ds4::ref::matvec_q8_0(w.data(), x.data(), n_in, n_out, y.data());
    std::vector<ds4::q8_0_act_block> xq(n_in / 32);
    ds4::quantize_q8_0_act(x.data(), xq.data(), n_in);
    for (int o = 0; o < n_out; ++o) {
        // Exact integer sums per block, scales in double: the only differences are float roundings.
        double want = 0, mag = 0;
        for (int b = 0; b < n_in / 32; ++b) {
            const auto& wb = w[std::size_t(o) * (n_in / 32) + b];
            const double t = double(ds4::f16_to_f32(wb.d)) * xq[b].d * ds4::q8_0_block_isum(wb, xq[b]);
            want += t;
            mag += std::fabs(t);
        }
        CHECK(std::fabs(y[o] - want) <= 40 * 6e-8 * mag);
    }
    // The activation quantisation itself stays within half a step of x (round half even).
    for (int i = 0; i < n_in; ++i) CHECK(std::fabs(xq[i / 32].qs[i % 32] * xq[i / 32].d - x[i]) <= 0.5001f * xq[i / 32].d);
}

TEST_CASE("F16 and F32 matvecs against double") {
    const int n_in = 1000, n_out = 77;  // n_in not a multiple of the 512 segment
    const auto wf = randn(std::size_t(n_in) * n_out, 3, 0.05f);
    std::vector<std::uint16_t> wh(wf.size());
    for (std::size_t i = 0; i < wf.size(); ++i) wh[i] = ds4::f32_to_f16(wf[i]);
    const auto x = randn(n_in, 4);
    std::vector<float> yh(n_out), yf(n_out);
    ds4::ref::matvec_f16(wh.data(), x.data(), n_in, n_out, yh.data());
    ds4::ref::matvec_f32(wf.data(), x.data(), n_in, n_out, yf.data());
    for (int o = 0; o < n_out; ++o) {
        double wanth = 0, wantf = 0, mag = 0;
        for (int i = 0; i < n_in; ++i) {
            wanth += double(ds4::f16_to_f32(wh[std::size_t(o) * n_in + i])) * x[i];
            wantf += double(wf[std::size_t(o) * n_in + i]) * x[i];
            mag += std::fabs(double(wf[std::size_t(o) * n_in + i]) * x[i]);
        }
        CHECK(std::fabs(yh[o] - wanth) <= 40 * 6e-8 * mag);
        CHECK(std::fabs(yf[o] - wantf) <= n_in * 6e-8 * mag);
    }
}

TEST_CASE("matvec results do not depend on the thread count") {
    thread_count_guard guard;
    const int n_in = 512 + 96, n_out = 1001;
    const auto wf = randn(std::size_t(n_in) * n_out, 5, 0.03f);
    std::vector<ds4::q8_0_block> wq(wf.size() / 32);
    ds4::quantize_q8_0(wf.data(), wq.data(), wf.size());
    std::vector<std::uint16_t> wh(wf.size());
    for (std::size_t i = 0; i < wf.size(); ++i) wh[i] = ds4::f32_to_f16(wf[i]);
    const auto x = randn(n_in, 6);
    auto run = [&](int threads) {
        ds4::ref::set_thread_count(threads);
        CHECK(ds4::ref::thread_count() == threads);
        std::vector<float> y(3 * n_out);
        ds4::ref::matvec_q8_0(wq.data(), x.data(), n_in, n_out, y.data());
        ds4::ref::matvec_f16(wh.data(), x.data(), n_in, n_out, y.data() + n_out);
        ds4::ref::matvec_f32(wf.data(), x.data(), n_in, n_out, y.data() + 2 * n_out);
        return y;
    };
    const auto y1 = run(1);
    const auto y2 = run(2);
    const auto y5 = run(5);
    CHECK(y1 == y2);  // float == : bitwise for finite values
    CHECK(y1 == y5);
}

TEST_CASE("parallel_for covers every index exactly once") {
    thread_count_guard guard;
    for (int threads : {1, 3, 8}) {
        ds4::ref::set_thread_count(threads);
        for (std::int64_t n : {1, 7, 64, 1000}) {
            std::vector<int> hits(n, 0);
            ds4::ref::parallel_for(n, [&](std::int64_t b, std::int64_t e) {
                for (std::int64_t i = b; i < e; ++i) ++hits[i];
            });
            for (int h : hits) CHECK(h == 1);
        }
    }
}
