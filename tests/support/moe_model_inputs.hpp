#pragma once
// The routed-expert inputs of a real forward pass, for the moe_gemm tests (the CPU emulation and
// the GPU kernel): the tiny synthetic model prefilled on the CPU reference, each layer's xn and
// route of every row kept just before its routed experts, as one moe_gemm problem per layer
// (that layer's GGUF experts and their tiled copies). CUDA exact mode computes these activations
// bit for bit, so they are what the backend's chunk path hands moe_gemm.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ds4/graph/layer_program.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/metadata.hpp"
#include "harness/synth/generator.hpp"
#include "reference/cpu_ops.hpp"
#include "reference/moe.hpp"
#include "tests/support/moe_gemm_problem.hpp"

namespace ds4::test {

// The conformance suite's random_tokens(b, seed, n) for a vocabulary of n_vocab.
inline std::vector<std::int32_t> conformance_tokens(unsigned seed, int n, int n_vocab) {
    std::mt19937 g(seed);
    std::uniform_int_distribution<std::int32_t> pick(0, n_vocab - 1);
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    for (auto& v : t) v = pick(g);
    return t;
}

// The reference op set, keeping each layer's routed-expert inputs.
struct capturing_ops : ref::cpu_ops {
    using ref::cpu_ops::cpu_ops;
    struct layer_inputs {
        const ref::layer_weights* w;
        std::vector<std::vector<float>> xn;
        std::vector<ref::moe_route> route;
    };
    mutable std::vector<layer_inputs> seen;
    void routed_experts(batch& b, const layer_weights& w) const {
        layer_inputs in{&w, {}, {}};
        for (const ref::row_work& r : b.rows) {
            in.xn.push_back(r.xn);
            in.route.push_back(r.route);
        }
        seen.push_back(std::move(in));
        ref::cpu_ops::routed_experts(b, w);
    }
};

// One layer's experts and captured rows as a problem (its clamp: the model's, 10).
inline problem layer_problem(const model::model_dims& d, const capturing_ops::layer_inputs& in) {
    const int n_embd = d.n_embd, n_ff = d.n_ff_exp, ne = d.n_expert, rows = int(in.xn.size());
    const std::size_t gate_blocks = std::size_t(ne) * n_ff * (n_embd / 256), down_blocks = std::size_t(ne) * n_embd * (n_ff / 256);
    REQUIRE(in.w->gate_exps.type == ggml_type::iq2_xxs);
    REQUIRE(in.w->up_exps.type == ggml_type::iq2_xxs);
    REQUIRE(in.w->down_exps.type == ggml_type::q2_k);
    problem p{n_embd, n_ff, ne, rows, {}, {}, {}, iq2_xxs_tiled_layout::make(n_ff, n_embd),
              q2_k_tiled_layout::make(n_embd, n_ff), {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const auto* gate = static_cast<const iq2_xxs_block*>(in.w->gate_exps.data);
    const auto* up = static_cast<const iq2_xxs_block*>(in.w->up_exps.data);
    const auto* down = static_cast<const q2_k_block*>(in.w->down_exps.data);
    p.gate.assign(gate, gate + gate_blocks);
    p.upw.assign(up, up + gate_blocks);
    p.down.assign(down, down + down_blocks);
    tile_experts(p);
    for (int r = 0; r < rows; ++r) {
        const ref::moe_route& route = in.route[std::size_t(r)];
        REQUIRE(route.n_used == moe_problem_slots);
        p.x.insert(p.x.end(), in.xn[std::size_t(r)].begin(), in.xn[std::size_t(r)].end());
        for (int k = 0; k < moe_problem_slots; ++k) {
            p.sel.push_back(route.expert[k]);
            p.w.push_back(route.weight[k]);
        }
    }
    return p;
}

// Prefills `tokens` (positions 0..) in one step of the CPU reference on the tiny model written
// with `model_seed`; one problem per layer.
inline std::vector<problem> forward_moe_problems(std::uint64_t model_seed, const std::vector<std::int32_t>& tokens) {
    const auto path = std::filesystem::temp_directory_path() / ("ds4_moe_inputs_" + std::to_string(::getpid()) + ".gguf");
    synth::write_options opt;
    opt.seed = model_seed;
    synth::write_model(path, model::dims_of<model::tiny_shape>(), opt);
    const gguf::file file = gguf::file::open(path);
    std::filesystem::remove(path);  // the mapping stays valid after unlink
    const model::model_dims d = model::expected_dims(file);
    REQUIRE(d.n_expert_used == moe_problem_slots);
    REQUIRE(d.swiglu_clamp_exp == 10.0f);
    const ref::model_weights weights = ref::bind_model_weights(file, d);
    // Pools before the layers: page tables release into them.
    model::kv_page_pool attn_pool(model::attention_row_layout{d.head_dim, d.n_rot}.bytes());
    model::kv_page_pool idx_pool(model::indexer_row_layout{d.indexer_head_dim}.bytes());
    std::vector<ref::layer_kv> layers = ref::new_layers(d, attn_pool, idx_pool);
    capturing_ops ops(d, weights, 0);
    capturing_ops::batch b;
    for (std::size_t pos = 0; pos < tokens.size(); ++pos) {
        ref::row_work r;
        r.kv = &layers;
        r.pos = std::int32_t(pos);
        r.token = tokens[pos];
        b.rows.push_back(std::move(r));
    }
    ops.prepare(b);
    graph::forward(graph::base_layer_rules{d}, ops, b);
    REQUIRE(int(ops.seen.size()) == d.n_layer);
    std::vector<problem> out;
    for (const auto& in : ops.seen) out.push_back(layer_problem(d, in));
    return out;
}

// reference/moe's moe_routed for every row of the problem: [rows][n_embd].
inline std::vector<float> reference_routed(const problem& P) {
    std::vector<float> out(std::size_t(P.rows) * P.n_embd);
    for (int r = 0; r < P.rows; ++r) {
        ref::moe_route route;
        route.n_used = moe_problem_slots;
        for (int k = 0; k < moe_problem_slots; ++k) {
            route.expert[k] = P.sel[std::size_t(r) * moe_problem_slots + k];
            route.weight[k] = P.w[std::size_t(r) * moe_problem_slots + k];
        }
        ref::moe_routed(P.gate.data(), P.upw.data(), P.down.data(), route, P.x.data() + std::size_t(r) * P.n_embd,
                        P.n_embd, P.n_ff, 10.0f, out.data() + std::size_t(r) * P.n_embd);
    }
    return out;
}

// Rows of `got` ([rows][n]) that differ from `want` in any bit.
inline int differing_rows(const std::vector<float>& want, const std::vector<float>& got, int rows, int n) {
    int bad = 0;
    for (int r = 0; r < rows; ++r)
        bad += std::memcmp(want.data() + std::size_t(r) * n, got.data() + std::size_t(r) * n, std::size_t(n) * 4) != 0;
    return bad;
}

}  // namespace ds4::test
