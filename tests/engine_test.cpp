// The CPU backend on the tiny synthetic model (window 16, ratio-4 and ratio-16 compressors,
// indexer top_k 8) against the spec's own F32 statement of a decode step, and the sanity of its
// logits. The contract's properties (batch and thread invariance, fork, truncate, snapshots,
// errors, sampling) are the conformance suite's (engine_conformance_test.cpp). 48 tokens cross
// the window, three ratio-16 and twelve ratio-4 emissions, and the indexer threshold.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/model/metadata.hpp"
#include "ds4/model/shape.hpp"
#include "harness/synth/generator.hpp"
#include "reference/attention_split.hpp"
#include "reference/compressor.hpp"
#include "reference/cpu_backend.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/indexer.hpp"
#include "reference/kv_store.hpp"
#include "reference/matvec.hpp"
#include "reference/moe.hpp"
#include "reference/norm_rope.hpp"
#include "tests/conformance/backend_conformance.hpp"

using namespace ds4;
using namespace ds4::ref;
using conformance::logit_rows;

namespace {

constexpr int n_tokens = 48;

struct tiny_model {
    gguf::file file;
    std::unique_ptr<engine::backend> backend;
};

// One tiny model per test binary, generated in-process into a temp file; the simulation reads
// the same file through its own mapping.
tiny_model& tiny() {
    static tiny_model m = [] {
        const auto p = std::filesystem::temp_directory_path() / ("ds4_engine_test_" + std::to_string(::getpid()) + ".gguf");
        synth::write_options opt;
        opt.seed = 1;
        synth::write_model(p, model::dims_of<model::tiny_shape>(), opt);
        tiny_model t{gguf::file::open(p), make_cpu_backend(p)};
        std::filesystem::remove(p);  // the mappings stay valid after unlink
        return t;
    }();
    return m;
}

engine::backend& backend() { return *tiny().backend; }

logit_rows solo(const std::vector<std::int32_t>& tokens) { return conformance::solo(backend(), tokens); }

const unsigned base_seed = std::random_device{}();

}  // namespace

TEST_CASE("engine: logits are finite and informative") {
    INFO("seed " << base_seed);
    const auto tokens = conformance::random_tokens(backend(), base_seed, n_tokens);
    const logit_rows l = solo(tokens);
    for (const auto& row : l) {
        for (float v : row) REQUIRE(std::isfinite(v));
        bool differ = false;
        for (float v : row) differ = differ || v != row[0];
        CHECK(differ);
    }
    // Different histories give different logits at the last position.
    auto other = tokens;
    other[3] = (other[3] + 1) % backend().dims().n_vocab;
    CHECK(solo(other).back() != l.back());
}

namespace {

// The spec's own statement of a decode step (docs/model.md §9) with ds4's F32 KV storage: stored rows
// are ref::kv_row_as_stored / the compressors' rows as floats, the indexer masks the full F32
// key cache, attention takes the mask. Written independently of the engine's paging and binding,
// so the engine's native-KV paged cache is checked against the simulated F32 cache it replaces.
class f32_simulation {
public:
    explicit f32_simulation(const tiny_model& m) : f_(m.file), d_(m.backend->dims()) {
        for (int il = 0; il < d_.n_layer; ++il) {
            const int r = d_.ratio_of(il);
            layers_.push_back({{}, {}, {}, r ? make_compressor_state(r, d_.head_dim) : compressor_state{},
                               r == 4 ? make_compressor_state(4, 128) : compressor_state{}});
        }
    }

    std::vector<float> step(std::int32_t pos, std::int32_t token) {
        const int E = d_.n_embd, hd = d_.head_dim, H = d_.n_head;
        const auto up = std::uint32_t(pos);
        std::vector<float> X(sz(d_.hc_dim())), Y(X.size()), x(sz(E)), xn(x.size()), a(x.size());
        for (int h = 0; h < d_.n_hc; ++h)
            for (int i = 0; i < E; ++i) X[std::size_t(h * E + i)] = f16_to_f32(u16("token_embd.weight")[std::size_t(token) * std::size_t(E) + std::size_t(i)]);
        for (int il = 0; il < d_.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            const int r = d_.ratio_of(il);
            const rope_params rp = ds4_rope_params(r != 0);
            layer& L = layers_[std::size_t(il)];
            hc_split sp = hc_pre(X.data(), u16(p + "hc_attn_fn.weight"), f32(p + "hc_attn_scale.weight"),
                                 f32(p + "hc_attn_base.weight"), E, 4, 20, 1e-6f, 1e-6f, x.data());
            rms_norm(x.data(), f32(p + "attn_norm.weight"), E, 1e-6f, xn.data());
            std::vector<float> qr(sz(d_.n_lora_q)), qn(qr.size()), q(sz(H * hd)), kv(sz(hd));
            matvec_q8_0(q8(p + "attn_q_a.weight"), xn.data(), E, d_.n_lora_q, qr.data());
            rms_norm(qr.data(), f32(p + "attn_q_a_norm.weight"), d_.n_lora_q, 1e-6f, qn.data());
            matvec_q8_0(q8(p + "attn_q_b.weight"), qn.data(), d_.n_lora_q, H * hd, q.data());
            head_rms_norm(q.data(), H, hd, 1e-6f);
            matvec_q8_0(q8(p + "attn_kv.weight"), xn.data(), E, hd, kv.data());
            rms_norm(kv.data(), f32(p + "attn_kv_a_norm.weight"), hd, 1e-6f, kv.data());
            rope_tail(q.data(), H, hd, 64, rp, up, false);
            rope_tail(kv.data(), 1, hd, 64, rp, up, false);
            kv_row_as_stored(kv.data(), hd, 64);
            L.raw.insert(L.raw.end(), kv.begin(), kv.end());
            std::vector<float> row(sz(hd)), irow(128);
            if (r && compressor_step(L.cs, weights(p + "attn_compressor_"), xn.data(), E, up, rp, 64,
                                     compressed_row_kind::attention, 1e-6f, row.data()))
                L.comp.insert(L.comp.end(), row.begin(), row.end());
            if (r == 4 && compressor_step(L.is, weights(p + "indexer_compressor_"), xn.data(), E, up, rp, 64,
                                          compressed_row_kind::indexer, 1e-6f, irow.data()))
                L.keys.insert(L.keys.end(), irow.begin(), irow.end());
            const int n_comp = int(L.comp.size()) / hd;
            std::vector<std::uint8_t> mask;
            if (r == 4)
                mask = indexer_mask(u16(p + "indexer.attn_q_b.weight"), u16(p + "indexer.proj.weight"), qn.data(), xn.data(),
                                    L.keys.data(), n_comp, d_.n_lora_q, E, d_.n_indexer_head, d_.indexer_top_k, up, rp);
            const int n_raw = std::min(pos + 1, d_.n_swa);
            std::vector<float> o(q.size()), low(sz(d_.lora_o_total()));
            attention_decode_split(q.data(), L.raw.data() + (L.raw.size() - std::size_t(n_raw * hd)), n_raw,
                                   L.comp.data(), n_comp, mask.empty() ? nullptr : mask.data(),
                                   f32(p + "attn_sinks.weight"), H, hd, 64, rp, up, o.data());
            const int gin = d_.group_in();
            for (int g = 0; g < d_.n_out_group; ++g)
                matvec_q8_0(q8(p + "attn_output_a.weight") + std::size_t(g * d_.n_lora_o * gin / 32),
                            o.data() + std::size_t(g * gin), gin, d_.n_lora_o, low.data() + std::size_t(g * d_.n_lora_o));
            matvec_q8_0(q8(p + "attn_output_b.weight"), low.data(), d_.lora_o_total(), E, a.data());
            hc_post(a.data(), X.data(), sp, E, 4, Y.data());
            X.swap(Y);

            sp = hc_pre(X.data(), u16(p + "hc_ffn_fn.weight"), f32(p + "hc_ffn_scale.weight"), f32(p + "hc_ffn_base.weight"),
                        E, 4, 20, 1e-6f, 1e-6f, x.data());
            rms_norm(x.data(), f32(p + "ffn_norm.weight"), E, 1e-6f, xn.data());
            std::vector<float> pr(sz(d_.n_expert)), sh(sz(E));
            router_probs(u16(p + "ffn_gate_inp.weight"), xn.data(), E, d_.n_expert, pr.data());
            const moe_route route =
                il < 3 ? route_hash(pr.data(), static_cast<const std::int32_t*>(data(p + "ffn_gate_tid2eid.weight")) + token * 6, 6, 1.5f)
                       : route_top_k(pr.data(), f_.find_tensor(p + "exp_probs_b.bias") ? f32(p + "exp_probs_b.bias") : nullptr,
                                     d_.n_expert, 6, 1.5f);
            moe_routed(static_cast<const iq2_xxs_block*>(data(p + "ffn_gate_exps.weight")),
                       static_cast<const iq2_xxs_block*>(data(p + "ffn_up_exps.weight")),
                       static_cast<const q2_k_block*>(data(p + "ffn_down_exps.weight")), route, xn.data(), E, d_.n_ff_exp,
                       10.0f, a.data());
            shared_expert(q8(p + "ffn_gate_shexp.weight"), q8(p + "ffn_up_shexp.weight"), q8(p + "ffn_down_shexp.weight"),
                          xn.data(), E, d_.n_ff_exp, 10.0f, sh.data());
            for (int i = 0; i < E; ++i) a[std::size_t(i)] += sh[std::size_t(i)];
            hc_post(a.data(), X.data(), sp, E, 4, Y.data());
            X.swap(Y);
        }
        std::vector<float> logits(sz(d_.n_vocab));
        output_hc_mix(X.data(), u16("output_hc_fn.weight"), f32("output_hc_scale.weight"), f32("output_hc_base.weight"), E, 4,
                      1e-6f, 1e-6f, x.data());
        rms_norm(x.data(), f32("output_norm.weight"), E, 1e-6f, x.data());
        matvec_q8_0(q8("output.weight"), x.data(), E, d_.n_vocab, logits.data());
        return logits;
    }

private:
    static std::size_t sz(int v) { return static_cast<std::size_t>(v); }
    struct layer {
        std::vector<float> raw, comp, keys;
        compressor_state cs, is;
    };
    const void* data(const std::string& n) const { return f_.tensor(n).data; }
    const float* f32(const std::string& n) const { return static_cast<const float*>(data(n)); }
    const std::uint16_t* u16(const std::string& n) const { return static_cast<const std::uint16_t*>(data(n)); }
    const q8_0_block* q8(const std::string& n) const { return static_cast<const q8_0_block*>(data(n)); }
    compressor_weights weights(const std::string& p) const {
        return {u16(p + "kv.weight"), u16(p + "gate.weight"), u16(p + "ape.weight"), f32(p + "norm.weight")};
    }

    const gguf::file& f_;
    const model::model_dims& d_;
    std::vector<layer> layers_;
};

}  // namespace

TEST_CASE("engine: native paged KV == the spec's F32-simulated cache, bitwise") {
    INFO("seed " << base_seed);
    const auto tokens = conformance::random_tokens(backend(), base_seed + 8, n_tokens);
    const logit_rows got = solo(tokens);
    f32_simulation sim(tiny());
    for (int p = 0; p < n_tokens; ++p) {
        INFO("position " << p);
        const std::vector<float> want = sim.step(p, tokens[std::size_t(p)]);
        REQUIRE(std::memcmp(want.data(), got[std::size_t(p)].data(), want.size() * sizeof(float)) == 0);
    }
}
