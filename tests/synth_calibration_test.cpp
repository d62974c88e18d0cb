// ds4-synth --gain-calibrated does what docs/numerics.md claims: on the calibrated tiny model a
// perturbation of relative L2 size e in the attention outputs moves the final logits by at most
// the stated amplification times e (relative L2, every row of a 48-token prefill; e = 1e-3 and
// the tensor-core attention's per-call bound 3e-3), where the default model amplifies it far
// more. The perturbation is injected into the reference backend's own op
// set (the layer program with cpu_ops, attention outputs offset by seeded noise), so the figure is
// the reference's, not the code under test's: that is the model the CUDA cross-backend test bounds
// its tensor-core mode on.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ds4/graph/layer_program.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/validate.hpp"
#include "harness/synth/generator.hpp"
#include "reference/cpu_ops.hpp"

using namespace ds4;
using namespace ds4::ref;

namespace {

constexpr int n_rows = 48;          // the cross-backend test's prefill (conformance::n_tokens)
constexpr std::uint64_t seed = 7;   // the cross-backend test's model seed
constexpr int all_layers = -1;

// The reference op set with every attention output (of one layer, or of all) moved by seeded
// Gaussian noise scaled to relative L2 `eps` of that row's output: the shape of the error a
// bounded attention kernel makes (relative L2 per call), at a chosen size.
struct perturbed_ops : cpu_ops {
    perturbed_ops(const model::model_dims& d, const model_weights& w, double eps, int layer)
        : cpu_ops(d, w, 0), eps_(eps), layer_(layer) {}

    void attention(batch& b, const layer_weights& w, int il, int ratio) const {
        cpu_ops::attention(b, w, il, ratio);
        if (eps_ == 0.0 || (layer_ != all_layers && il != layer_)) return;
        for (row_work& r : b.rows) {
            std::mt19937_64 g(std::uint64_t(il) * 1000003u + std::uint64_t(r.pos));
            std::normal_distribution<double> n;
            std::vector<double> noise(r.o.size());
            double nn = 0, oo = 0;
            for (std::size_t i = 0; i < noise.size(); ++i) {
                noise[i] = n(g);
                nn += noise[i] * noise[i];
                oo += double(r.o[i]) * double(r.o[i]);
            }
            const double k = eps_ * std::sqrt(oo / nn);
            for (std::size_t i = 0; i < noise.size(); ++i) r.o[i] = float(double(r.o[i]) + k * noise[i]);
        }
    }

private:
    double eps_;
    int layer_;
};

std::filesystem::path model_path(float gain) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("ds4_calibration_" + std::to_string(::getpid()) + "_" + std::to_string(gain) + ".gguf");
    synth::write_options opt;
    opt.seed = seed;
    opt.sat.residual_gain = gain;
    synth::write_model(path, model::dims_of<model::tiny_shape>(), opt);
    return path;
}

// Logits of a one-sequence prefill of `tokens` with attention outputs perturbed by eps.
std::vector<std::vector<float>> logits(const gguf::file& f, const std::vector<std::int32_t>& tokens, double eps,
                                       int layer) {
    const model::model_dims d = model::expected_dims(f);
    model::require_valid(f, d);
    const model_weights w = bind_model_weights(f, d);
    model::kv_page_pool attn{model::attention_row_layout{d.head_dim, d.n_rot}.bytes()};
    model::kv_page_pool idx{model::indexer_row_layout{d.indexer_head_dim}.bytes()};
    std::vector<layer_kv> kv = new_layers(d, attn, idx);
    perturbed_ops ops(d, w, eps, layer);
    cpu_ops::batch b;
    for (std::size_t p = 0; p < tokens.size(); ++p) {
        row_work r;
        r.kv = &kv;
        r.pos = std::int32_t(p);
        r.token = tokens[p];
        r.wants_output = true;
        b.rows.push_back(std::move(r));
    }
    ops.prepare(b);
    graph::forward(graph::base_layer_rules{d}, ops, b);
    std::vector<std::vector<float>> out;
    for (const row_work& r : b.rows) out.push_back(r.logits);
    return out;
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& x) {
    double num = 0, den = 0;
    for (std::size_t k = 0; k < ref.size(); ++k) {
        const double e = double(x[k]) - double(ref[k]);
        num += e * e;
        den += double(ref[k]) * double(ref[k]);
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<std::int32_t> tokens_for(unsigned s, int n_vocab) {
    std::mt19937 g(s);
    std::uniform_int_distribution<std::int32_t> u(0, n_vocab - 1);
    std::vector<std::int32_t> t(n_rows);
    for (auto& v : t) v = u(g);
    return t;
}

// Worst over rows of (relative L2 change of the logits) / eps, against the unperturbed `clean`.
double amplification(const gguf::file& f, const std::vector<std::int32_t>& tokens,
                     const std::vector<std::vector<float>>& clean, double eps, int layer) {
    const auto moved = logits(f, tokens, eps, layer);
    double worst = 0;
    for (std::size_t i = 0; i < clean.size(); ++i) worst = std::max(worst, rel_l2(clean[i], moved[i]) / eps);
    return worst;
}
double amplification(const gguf::file& f, const std::vector<std::int32_t>& tokens, double eps, int layer) {
    return amplification(f, tokens, logits(f, tokens, 0.0, layer), eps, layer);
}

struct model_file {
    std::filesystem::path path;
    gguf::file file;
    explicit model_file(float gain) : path(model_path(gain)), file(gguf::file::open(path)) {}
    ~model_file() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("the calibrated tiny model amplifies attention-output perturbations at most as stated") {
    const model_file calibrated(synth::calibrated_residual_gain), plain(1.0f);
    const int n_vocab = model::expected_dims(calibrated.file).n_vocab;
    for (unsigned s : {1u, 2u}) {
        const auto t = tokens_for(s, n_vocab);
        const auto clean = logits(calibrated.file, t, 0.0, all_layers);
        const auto plain_clean = logits(plain.file, t, 0.0, all_layers);
        CAPTURE(s);
        for (const auto& [eps, stated] : {std::pair{1e-3, synth::calibrated_amplification},
                                         std::pair{3e-3, synth::calibrated_amplification_at_3e_3}}) {
            CAPTURE(eps);
            const double all = amplification(calibrated.file, t, clean, eps, all_layers);
            const double first = amplification(calibrated.file, t, clean, eps, 0);
            const double plain_all = amplification(plain.file, t, plain_clean, eps, all_layers);
            MESSAGE("tokens " << s << ", eps " << eps << ": calibrated (gain " << synth::calibrated_residual_gain
                              << ") amplification " << all << " (layer 0 alone " << first << ", stated " << stated
                              << "), default model " << plain_all);
            CHECK(all <= stated);
            CHECK(first <= stated);
            // The gain is what removes the chaos: the same perturbation on the default model.
            CHECK(plain_all >= 3 * all);
        }
    }
}

// How the gain was chosen (docs/numerics.md): the amplification (all layers perturbed, and layer
// 0 alone) for a range of gains and perturbation sizes. Not a check; run with --no-skip to
// reproduce the table.
TEST_CASE("calibration sweep" * doctest::skip()) {
    for (float gain : {1.0f, 0.3f, 0.1f, 0.03f, 0.02f, 0.01f, 0.005f}) {
        const model_file m(gain);
        const int n_vocab = model::expected_dims(m.file).n_vocab;
        for (unsigned s : {1u, 2u})
            for (double eps : {1e-3, 3e-3, 1e-1})
                std::printf("gain %-6g tokens %u eps %-6g amplification all layers %-8.4g layer 0 %-8.4g\n",
                            double(gain), s, eps, amplification(m.file, tokens_for(s, n_vocab), eps, all_layers),
                            amplification(m.file, tokens_for(s, n_vocab), eps, 0));
    }
}
