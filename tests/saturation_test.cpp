// The saturating paths of the math (docs/model.md §2.4 step 5, §2.6, §2.7), where a wrong limit only
// shows once activations reach it:
//   * the SwiGLU clamps (gate <= 10, up in [-10, 10]) of the shared and routed experts, on
//     inputs far beyond them, against double math on the decoded weights;
//   * end to end, tiny synthetic models made with ds4-synth's saturation gains (FFN gate/up
//     weights x48, of the routed experts, the shared expert or both, so about half their SwiGLU
//     inputs pass the clamp; KV norms x1e-5 so every FP8 block sits under the 1e-4 amax floor),
//     run past the indexer threshold (more compressed rows than indexer top_k). The clamp and
//     top_k are read from the file, so the same weights with another clamp or another top_k
//     (preset "custom") must change exactly the logits the spec says they change: a clamp that
//     one path ignores, or an indexer switched on at the wrong count, shows.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/model/shape.hpp"
#include "harness/synth/generator.hpp"
#include "reference/cpu_backend.hpp"
#include "tests/conformance/backend_conformance.hpp"
#include "reference/moe.hpp"

using namespace ds4;

namespace {

double silu_d(double x) { return x / (1.0 + std::exp(-x)); }

// §2.7: silu(min(g, 10)) * clamp(u, -10, 10).
double swiglu_d(double g, double u) { return silu_d(std::min(g, 10.0)) * std::clamp(u, -10.0, 10.0); }

// A Q8_0 block of 32 equal weights v (d = v/127 as F16, q = 127), and its decoded value.
q8_0_block flat_q8_0(float v) {
    q8_0_block b;
    b.d = f32_to_f16(v / 127.0f);
    for (auto& q : b.qs) q = 127;
    return b;
}
double flat_value(const q8_0_block& b) { return double(f16_to_f32(b.d)) * 127.0; }

}  // namespace

TEST_CASE("shared expert: gate and up far beyond the clamp of 10 on both sides") {
    // n_embd = 32, xn = 1 everywhere (Q8_0 exact: d = 1/127, q = 127). Row r of gate/up is 32
    // equal weights, so g_r = 32 * w_r * x: g sweeps [-24, 24] and u sweeps [24, -24] in another
    // order. down is the identity, so out[o] = Q8_0(mid)[o].
    const int n_embd = 32, n_ff = 32;
    std::vector<q8_0_block> gate(n_ff), up(n_ff), down(std::size_t(n_embd) * (n_ff / 32));
    for (int r = 0; r < n_ff; ++r) {
        gate[r] = flat_q8_0((-24.0f + 48.0f * r / 31.0f) / 32.0f);
        up[r] = flat_q8_0((24.0f - 48.0f * ((r * 7) % 32) / 31.0f) / 32.0f);
    }
    for (int o = 0; o < n_embd; ++o) {
        down[o].d = f32_to_f16(1.0f / 64.0f);
        for (int i = 0; i < 32; ++i) down[o].qs[i] = static_cast<std::int8_t>(i == o ? 64 : 0);
    }
    std::vector<float> xn(n_embd, 1.0f), out(n_embd);
    ref::shared_expert(gate.data(), up.data(), down.data(), xn.data(), n_embd, n_ff,
                       model::common_shape::swiglu_clamp_exp, out.data());

    const double x = double(1.0f / 127.0f) * 127.0;
    std::vector<double> mid(n_ff);
    double amax = 0;
    int beyond = 0;
    for (int r = 0; r < n_ff; ++r) {
        const double g = 32.0 * flat_value(gate[r]) * x, u = 32.0 * flat_value(up[r]) * x;
        beyond += g > 10.0 || std::fabs(u) > 10.0;
        mid[r] = swiglu_d(g, u);
        amax = std::max(amax, std::fabs(mid[r]));
    }
    REQUIRE(beyond >= 16);
    for (int o = 0; o < n_embd; ++o) {
        INFO("row " << o << " mid " << mid[o]);
        CHECK(std::fabs(out[o] - mid[o]) <= 0.51 * amax / 127.0 + 1e-5 * amax);
    }
}

TEST_CASE("routed experts: gate and up far beyond the clamp, IQ2_XXS gate/up and Q2_K down") {
    const int n_embd = 256, n_ff = 256, n_expert = 2;
    std::uint64_t state = 1717;
    // Weight RMS ~0.9 on a unit-RMS input of 256: g and u have RMS ~15.
    const float d = static_cast<float>(0.9 / iq2_xxs_random_rms(1.0f));
    std::vector<iq2_xxs_block> gate(std::size_t(n_expert) * n_ff), up(gate.size());
    fill_random_iq2_xxs(state, gate.data(), gate.size(), d);
    fill_random_iq2_xxs(state, up.data(), up.size(), d);
    // Q2_K down blocks with random codes, scales and mins: decoded exactly below.
    std::mt19937 rng(17);
    std::vector<q2_k_block> down(std::size_t(n_expert) * n_embd);
    for (auto& b : down) {
        for (auto& s : b.scales) s = static_cast<std::uint8_t>(rng());
        for (auto& q : b.qs) q = static_cast<std::uint8_t>(rng());
        b.d = f32_to_f16(0.002f);
        b.dmin = f32_to_f16(0.003f);
    }
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> xn(n_embd), out(n_embd);
    for (auto& v : xn) v = n(rng);
    ref::moe_route route;
    route.n_used = 2;
    route.expert[0] = 1, route.expert[1] = 0;
    route.weight[0] = 0.8f, route.weight[1] = 0.7f;
    ref::moe_routed(gate.data(), up.data(), down.data(), route, xn.data(), n_embd, n_ff,
                    model::common_shape::swiglu_clamp_exp, out.data());

    std::vector<q8_k_block> xq(1);
    quantize_q8_k(xn.data(), xq.data(), n_embd);
    std::vector<float> row(256);
    std::vector<double> want(n_embd, 0.0), bound(n_embd, 0.0);
    int beyond = 0;
    for (int s = 0; s < route.n_used; ++s) {
        const int e = route.expert[s];
        std::vector<double> mid(n_ff);
        double amax = 0;
        for (int r = 0; r < n_ff; ++r) {
            double g = 0, u = 0;
            dequantize(gate[std::size_t(e) * n_ff + r], row.data());
            for (int i = 0; i < 256; ++i) g += double(row[i]) * xq[0].d * xq[0].qs[i];
            dequantize(up[std::size_t(e) * n_ff + r], row.data());
            for (int i = 0; i < 256; ++i) u += double(row[i]) * xq[0].d * xq[0].qs[i];
            beyond += g > 10.0 || std::fabs(u) > 10.0;
            mid[r] = swiglu_d(g, u) * route.weight[s];
            amax = std::max(amax, std::fabs(mid[r]));
        }
        for (int o = 0; o < n_embd; ++o) {
            dequantize(down[std::size_t(e) * n_embd + o], row.data());
            for (int i = 0; i < 256; ++i) {
                want[o] += double(row[i]) * mid[i];
                bound[o] += std::fabs(double(row[i])) * (0.51 * amax / 127.0 + 1e-5 * std::fabs(mid[i]));
            }
        }
    }
    REQUIRE(beyond > n_ff / 2);
    for (int o = 0; o < n_embd; ++o) {
        INFO("row " << o);
        CHECK(std::fabs(out[o] - want[o]) <= bound[o]);
    }
}

namespace {

constexpr int n_tokens = 44;  // ratio-4 layers hold 9..11 rows (> top_k 8) from pos 35 on

using logit_rows = std::vector<std::vector<float>>;

struct gains {
    float routed = 48.0f, shared = 48.0f;
};

// One tiny model with the saturation gains, under a shape edited by `edit`, run over the first
// n of `tokens`.
template <class Edit>
logit_rows run_saturated(const std::vector<std::int32_t>& tokens, int n, gains g, Edit edit) {
    model::model_dims d = model::dims_of<model::tiny_shape>();
    edit(d);
    const auto path = std::filesystem::temp_directory_path() /
                      ("ds4_saturation_test_" + std::to_string(::getpid()) + ".gguf");
    synth::write_options opt;
    opt.seed = 3;
    opt.sat.routed_gain = g.routed;
    opt.sat.shared_gain = g.shared;
    opt.sat.kv_norm_gain = 1e-5f;
    synth::write_model(path, d, opt);
    auto eng = ref::make_cpu_backend(path);
    std::filesystem::remove(path);
    return conformance::run(*eng, eng->create(), tokens, 0, n);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::vector<std::int32_t>& tokens() {
    static const std::vector<std::int32_t> t = [] {
        std::mt19937 g(4242);
        std::vector<std::int32_t> v(n_tokens);
        for (auto& x : v) x = static_cast<std::int32_t>(g() % model::tiny_shape::n_vocab);
        return v;
    }();
    return t;
}

const logit_rows& spec_run() {
    static const logit_rows l = run_saturated(tokens(), n_tokens, gains{}, [](model::model_dims&) {});
    return l;
}

}  // namespace

TEST_CASE("saturated model end to end: finite, informative logits with the FP8 floor active") {
    const logit_rows& l = spec_run();
    REQUIRE(l.size() == std::size_t(n_tokens));
    for (const auto& row : l) {
        for (float v : row) REQUIRE(std::isfinite(v));
        CHECK(*std::max_element(row.begin(), row.end()) > *std::min_element(row.begin(), row.end()));
    }
}

TEST_CASE("saturated model end to end: the clamp of 10 decides every position's logits, on each path") {
    // Only the routed experts saturated, only the shared expert, then both. Same weights with the
    // clamp lifted (1e30) or lowered (7): every position must change, so a path that ignores or
    // misreads the clamp changes the logits. 8 tokens: the clamp acts from the first one.
    const int n = 8;
    for (const gains g : {gains{48.0f, 1.0f}, gains{1.0f, 48.0f}, gains{48.0f, 48.0f}}) {
        const logit_rows base = run_saturated(tokens(), n, g, [](model::model_dims&) {});
        for (const float clamp : {1e30f, 7.0f}) {
            if (g.routed != g.shared && clamp != 1e30f) continue;
            INFO("routed gain " << g.routed << ", shared gain " << g.shared << ", clamp " << clamp);
            const logit_rows other = run_saturated(tokens(), n, g, [&](model::model_dims& d) {
                d.preset = std::string(model::custom_preset);
                d.swiglu_clamp_exp = clamp;
            });
            REQUIRE(other.size() == base.size());
            int changed = 0;
            for (std::size_t p = 0; p < other.size(); ++p) changed += !same_bits(other[p], base[p]);
            CHECK(changed == n);
        }
    }
}

TEST_CASE("saturated model end to end: the indexer acts from top_k + 1 compressed rows on, not before") {
    // With top_k beyond the run's length every compressed row stays visible. The spec's model
    // must agree bitwise while a ratio-4 layer holds <= 8 rows (pos + 1 < 36) and differ at every
    // position after, where the indexer drops rows.
    const logit_rows all_rows = run_saturated(tokens(), n_tokens, gains{}, [](model::model_dims& d) {
        d.preset = std::string(model::custom_preset);
        d.indexer_top_k = 1 << 20;
    });
    REQUIRE(all_rows.size() == spec_run().size());
    const int top_k = model::tiny_shape::indexer_top_k;
    for (int p = 0; p < n_tokens; ++p) {
        const int n_comp = (p + 1) / 4;
        INFO("pos " << p << " n_comp " << n_comp);
        CHECK(same_bits(all_rows[std::size_t(p)], spec_run()[std::size_t(p)]) == (n_comp <= top_k));
    }
}
