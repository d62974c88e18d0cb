// MoE router and experts (docs/model.md §2.7). Expert outputs are checked against double math on the
// decoded weights with a bound derived from the activation quantisation steps.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "reference/moe.hpp"
#include "tests/support/kquant_quantize.hpp"

using ds4::ref::moe_route;

TEST_CASE("router top-6: strict > keeps the lower expert id first on ties") {
    std::vector<float> p(16, 0.25f);
    const moe_route all_equal = ds4::ref::route_top_k(p.data(), nullptr, 16, 6, 1.5f);
    for (int s = 0; s < 6; ++s) CHECK(all_equal.expert[s] == s);
    p[9] = 0.9f;
    p[3] = 0.9f;
    p[12] = 0.7f;
    const moe_route r = ds4::ref::route_top_k(p.data(), nullptr, 16, 6, 1.5f);
    const int want[6] = {3, 9, 12, 0, 1, 2};
    for (int s = 0; s < 6; ++s) CHECK(r.expert[s] == want[s]);
    // Against a stable sort of the biased scores on many ties.
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> u(0, 7);
    for (int trial = 0; trial < 50; ++trial) {
        std::vector<float> q(256), bias(256);
        for (auto& v : q) v = 0.125f * u(rng);
        for (auto& v : bias) v = 0.25f * (u(rng) % 3);
        std::vector<int> idx(256);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return q[a] + bias[a] > q[b] + bias[b]; });
        const moe_route t = ds4::ref::route_top_k(q.data(), bias.data(), 256, 6, 1.5f);
        for (int s = 0; s < 6; ++s) CHECK(t.expert[s] == idx[s]);
    }
}

TEST_CASE("router weights: unbiased p, normalised to 1.5; bias only selects") {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> u(0.1f, 2.0f);
    std::vector<float> p(64), bias(64, 0.0f);
    for (auto& v : p) v = u(rng);
    bias[5] = 100.0f;  // forces expert 5 in, at slot 0, with its own small p
    const moe_route r = ds4::ref::route_top_k(p.data(), bias.data(), 64, 6, 1.5f);
    CHECK(r.expert[0] == 5);
    float sum_p = 0, sum_w = 0;
    for (int s = 0; s < 6; ++s) sum_p += p[r.expert[s]];
    for (int s = 0; s < 6; ++s) {
        sum_w += r.weight[s];
        CHECK(r.weight[s] == doctest::Approx(p[r.expert[s]] / sum_p * 1.5f).epsilon(1e-6));
    }
    CHECK(sum_w == doctest::Approx(1.5).epsilon(1e-6));
    // A vanishing sum is floored at 2^-14 instead of dividing by ~0.
    std::vector<float> tiny(8, 1e-9f);
    const moe_route t = ds4::ref::route_top_k(tiny.data(), nullptr, 8, 6, 1.5f);
    CHECK(t.weight[0] == 1e-9f / 6.103515625e-5f * 1.5f);
}

TEST_CASE("hash routing takes tid2eid in stored slot order") {
    std::vector<float> p(32);
    for (int e = 0; e < 32; ++e) p[e] = 0.1f + 0.01f * e;
    const std::int32_t row[6] = {17, 3, 30, 3 + 8, 0, 21};  // deliberately not sorted by score
    const moe_route r = ds4::ref::route_hash(p.data(), row, 6, 1.5f);
    float sum = 0;
    for (int s = 0; s < 6; ++s) {
        CHECK(r.expert[s] == row[s]);
        sum += r.weight[s];
    }
    CHECK(sum == doctest::Approx(1.5).epsilon(1e-6));
}

TEST_CASE("router probabilities are sqrt(softplus(logit))") {
    const int n_embd = 64, n_expert = 12;
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<std::uint16_t> w(n_embd * n_expert);
    for (auto& v : w) v = ds4::f32_to_f16(0.5f * g(rng));
    std::vector<float> x(n_embd), p(n_expert);
    for (auto& v : x) v = g(rng);
    ds4::ref::router_probs(w.data(), x.data(), n_embd, n_expert, p.data());
    for (int e = 0; e < n_expert; ++e) {
        double l = 0;
        for (int i = 0; i < n_embd; ++i) l += double(ds4::f16_to_f32(w[e * n_embd + i])) * x[i];
        CHECK(p[e] == doctest::Approx(std::sqrt(std::log1p(std::exp(l)))).epsilon(1e-5));
    }
}

namespace {

double silu_d(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("routed experts against double math on decoded weights") {
    const int n_embd = 512, n_ff = 256, n_expert = 3;
    const int nb_in = n_embd / 256, nb_ff = n_ff / 256;
    std::uint64_t state = 12345;
    std::vector<ds4::iq2_xxs_block> gate(std::size_t(n_expert) * n_ff * nb_in), up(gate.size());
    ds4::fill_random_iq2_xxs(state, gate.data(), gate.size(), 0.01f);
    ds4::fill_random_iq2_xxs(state, up.data(), up.size(), 0.01f);
    std::mt19937 rng(4);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> downf(std::size_t(n_expert) * n_embd * n_ff);
    for (auto& v : downf) v = 0.05f * g(rng);
    std::vector<ds4::q2_k_block> down(downf.size() / 256);
    ds4::quantize_q2_k(downf.data(), down.data(), downf.size());
    std::vector<float> xn(n_embd);
    for (auto& v : xn) v = 2.0f * g(rng);

    moe_route route;
    route.n_used = 2;
    route.expert[0] = 2;
    route.expert[1] = 0;
    route.weight[0] = 0.9f;
    route.weight[1] = 0.6f;
    std::vector<float> out(n_embd);
    ds4::ref::moe_routed(gate.data(), up.data(), down.data(), route, xn.data(), n_embd, n_ff, 10.0f, out.data());

    // The Q8_K activation of xn, decoded exactly in double.
    std::vector<ds4::q8_k_block> xq(nb_in);
    ds4::quantize_q8_k(xn.data(), xq.data(), n_embd);
    std::vector<double> x(n_embd);
    for (int i = 0; i < n_embd; ++i) x[i] = double(xq[i / 256].d) * xq[i / 256].qs[i % 256];

    std::vector<double> want(n_embd, 0.0), bound(n_embd, 0.0);
    std::vector<float> row(256);
    for (int s = 0; s < route.n_used; ++s) {
        const int e = route.expert[s];
        std::vector<double> mid(n_ff);
        for (int r = 0; r < n_ff; ++r) {
            double gv = 0, uv = 0;
            for (int b = 0; b < nb_in; ++b) {
                ds4::dequantize(gate[(std::size_t(e) * n_ff + r) * nb_in + b], row.data());
                for (int i = 0; i < 256; ++i) gv += double(row[i]) * x[256 * b + i];
                ds4::dequantize(up[(std::size_t(e) * n_ff + r) * nb_in + b], row.data());
                for (int i = 0; i < 256; ++i) uv += double(row[i]) * x[256 * b + i];
            }
            gv = std::min(gv, 10.0);
            uv = std::max(std::min(uv, 10.0), -10.0);
            mid[r] = silu_d(gv) * uv * route.weight[s];
        }
        // Q8_K of mid moves each value by at most half a step (amax/127) of its block.
        std::vector<double> step(nb_ff);
        for (int b = 0; b < nb_ff; ++b) {
            double amax = 0;
            for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(mid[256 * b + i]));
            step[b] = amax / 127.0;
        }
        for (int o = 0; o < n_embd; ++o) {
            for (int b = 0; b < nb_ff; ++b) {
                ds4::dequantize(down[(std::size_t(e) * n_embd + o) * nb_ff + b], row.data());
                for (int i = 0; i < 256; ++i) {
                    want[o] += double(row[i]) * mid[256 * b + i];
                    bound[o] += std::fabs(double(row[i])) * (0.51 * step[b] + 1e-5 * std::fabs(mid[256 * b + i]));
                }
            }
        }
    }
    int checked = 0;
    for (int o = 0; o < n_embd; ++o) {
        CHECK(std::fabs(out[o] - want[o]) <= bound[o]);
        checked += bound[o] < std::fabs(want[o]) ? 1 : 0;
    }
    CHECK(checked > n_embd / 4);  // the bound is tight enough to mean something
}

TEST_CASE("shared expert against double math on decoded Q8_0 weights") {
    const int n_embd = 96, n_ff = 64;
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    auto make = [&](int n) {
        std::vector<float> f(n);
        for (auto& v : f) v = 0.1f * g(rng);
        std::vector<ds4::q8_0_block> q(n / 32);
        ds4::quantize_q8_0(f.data(), q.data(), n);
        return q;
    };
    const auto gate = make(n_embd * n_ff), up = make(n_embd * n_ff), down = make(n_ff * n_embd);
    std::vector<float> xn(n_embd), out(n_embd);
    for (auto& v : xn) v = 3.0f * g(rng);
    ds4::ref::shared_expert(gate.data(), up.data(), down.data(), xn.data(), n_embd, n_ff, 10.0f, out.data());

    std::vector<ds4::q8_0_act_block> xq(n_embd / 32);
    ds4::quantize_q8_0_act(xn.data(), xq.data(), n_embd);
    auto wv = [](const std::vector<ds4::q8_0_block>& w, std::size_t i) {
        return double(ds4::f16_to_f32(w[i / 32].d)) * w[i / 32].qs[i % 32];
    };
    std::vector<double> mid(n_ff);
    for (int r = 0; r < n_ff; ++r) {
        double gv = 0, uv = 0;
        for (int i = 0; i < n_embd; ++i) {
            const double x = double(xq[i / 32].d) * xq[i / 32].qs[i % 32];
            gv += wv(gate, std::size_t(r) * n_embd + i) * x;
            uv += wv(up, std::size_t(r) * n_embd + i) * x;
        }
        mid[r] = silu_d(std::min(gv, 10.0)) * std::max(std::min(uv, 10.0), -10.0);
    }
    for (int o = 0; o < n_embd; ++o) {
        double want = 0, bound = 0;
        for (int b = 0; b < n_ff / 32; ++b) {
            double amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(mid[32 * b + i]));
            for (int i = 0; i < 32; ++i) {
                const double w = wv(down, std::size_t(o) * n_ff + 32 * b + i);
                want += w * mid[32 * b + i];
                bound += std::fabs(w) * (0.51 * amax / 127.0 + 1e-5 * std::fabs(mid[32 * b + i]));
            }
        }
        CHECK(std::fabs(out[o] - want) <= bound);
    }
}
