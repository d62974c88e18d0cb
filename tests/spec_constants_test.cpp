// Every constant of docs/model.md §1, §2 and §7, pinned once against a literal copied by hand from
// the spec (never from the code), plus the few constants that live inside an operation rather
// than in a named field, pinned through the smallest input whose output depends on them.
// A one-character slip in a constant (clamp 10 -> 7, 20 Sinkhorn passes -> 21, base 160000 ->
// 16000) must fail here even when no end-to-end test reaches the value.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/model/shape.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/indexer.hpp"
#include "reference/moe.hpp"
#include "reference/norm_rope.hpp"

using namespace ds4;

TEST_CASE("docs/model.md §1: the hard-coded hyper-parameters") {
    using F = model::flash_shape;
    CHECK(F::n_layer == 43);
    CHECK(F::n_embd == 4096);
    CHECK(F::n_vocab == 129280);
    CHECK(F::n_head == 64);
    CHECK(F::n_head_kv == 1);
    CHECK(F::head_dim == 512);
    CHECK(F::n_rot == 64);
    CHECK(F::n_out_group == 8);
    CHECK(F::n_lora_q == 1024);
    CHECK(F::n_lora_o == 1024);
    CHECK(F::n_expert == 256);
    CHECK(F::n_expert_used == 6);
    CHECK(F::n_expert_shared == 1);
    CHECK(F::n_ff_exp == 2048);
    CHECK(F::n_hash_layer == 3);
    CHECK(F::n_swa == 128);
    CHECK(F::n_indexer_head == 64);
    CHECK(F::indexer_head_dim == 128);
    CHECK(F::indexer_top_k == 512);
    CHECK(F::n_hc == 4);
    CHECK(F::n_hc_sinkhorn_iter == 20);
    CHECK(F::rms_eps == 1e-6f);
    CHECK(F::hc_eps == 1e-6f);
    CHECK(F::expert_weights_scale == 1.5f);
    CHECK(F::expert_weights_norm);
    CHECK(F::swiglu_clamp_exp == 10.0f);
    CHECK(F::rope_freq_base == 10000.0f);
    CHECK(F::compress_rope_freq_base == 160000.0f);
    CHECK(F::rope_scale_factor == 16.0f);
    CHECK(F::yarn_beta_fast == 32.0f);
    CHECK(F::yarn_beta_slow == 1.0f);
    CHECK(F::rope_orig_ctx == 65536);
    CHECK(F::long_ratio == 128);
    CHECK(F::short_ratio == 4);
    CHECK(F::n_window_layers == 2);
}

TEST_CASE("docs/model.md §1: compression ratio per layer (21 ratio-4, 20 ratio-128, 2 window-only)") {
    const model::model_dims d = model::dims_of<model::flash_shape>();
    REQUIRE(d.compress_ratios.size() == 43);
    int n4 = 0, n128 = 0, n0 = 0;
    for (int il = 0; il < 43; ++il) {
        const int want = il < 2 ? 0 : (il % 2 == 0 ? 4 : 128);
        CHECK(d.ratio_of(il) == want);
        n4 += d.ratio_of(il) == 4, n128 += d.ratio_of(il) == 128, n0 += d.ratio_of(il) == 0;
    }
    CHECK(n4 == 21);
    CHECK(n128 == 20);
    CHECK(n0 == 2);
    CHECK(d.hc_mix() == 24);
    CHECK(d.n_nope() == 448);
}

TEST_CASE("docs/model.md §1: derived RoPE constants") {
    // Compressed layers: theta_scale = 160000^(-2/64) = 0.687656045, YaRN freq_scale 1/16,
    // corr dims floor(15.453) = 15 and ceil(24.708) = 25.
    const rope_params c = ds4_rope_params(true);
    CHECK(c.theta_scale == doctest::Approx(0.687656045).epsilon(1e-8));
    CHECK(c.freq_scale == 0.0625f);
    CHECK(c.yarn);
    CHECK(c.corr_low == 15.0f);
    CHECK(c.corr_high == 25.0f);
    // Layers 0-1 and the MTP block: 10000^(-1/32) = 0.749894202, no YaRN.
    const rope_params w = ds4_rope_params(false);
    CHECK(w.theta_scale == doctest::Approx(0.749894202).epsilon(1e-8));
    CHECK(w.freq_scale == 1.0f);
    CHECK_FALSE(w.yarn);
    // The YaRN magnitude factor cancels: 1/(1+0.1 ln 16) * (1+0.1 ln 16) == 1.0f exactly.
    const float m = 1.0f + 0.1f * std::log(16.0f);
    CHECK((1.0f / m) * m == 1.0f);
}

TEST_CASE("docs/model.md §2.4/§2.6: the FP8 and FP4 limits") {
    CHECK(e4m3_max == 448.0f);
    CHECK(e4m3_amax_floor == 1e-4f);
    CHECK(e4m3_block_size == 64);
    CHECK(e2m1_max == 6.0f);
    CHECK(e2m1_amax_floor == 7.052966104933725e-38f);
    CHECK(e2m1_block_size == 32);
    CHECK(q8_0_block_size == 32);
    CHECK(q8_k_block_size == 256);
    CHECK(ref::indexer_head_dim == 128);

    // The limits at work. 470 alone: scale 2^ceil(log2(470/448)) = 2, 235 -> 240 (grid step 16
    // in [128, 256)), so 480 comes back: a scale that let 470 through at scale 1 gives 448.
    std::vector<float> b(64, 0.0f);
    b[0] = 470.0f;
    e4m3_block_roundtrip(b.data(), 64);
    CHECK(b[0] == 480.0f);
    // The 1e-4 amax floor: amax 1e-6 still gets scale 2^ceil(log2(1e-4/448)) = 2^-22, so 1e-9 is
    // 0.0041943 * 2^-22, on the subnormal step 2^-9: 2 steps = 2^-30. Without the floor the
    // scale would be 2^-28 and 1e-9 would round to 0.28125 * 2^-28.
    std::fill(b.begin(), b.end(), 0.0f);
    b[0] = 1e-6f;
    b[1] = 1e-9f;
    e4m3_block_roundtrip(b.data(), 64);
    CHECK(b[1] == std::ldexp(1.0f, -30));
    // FP4: 7 alone -> scale 2, 3.5 is the tie between 3 (index 5) and 4 (index 6): even index, 4.
    std::vector<float> f(32, 0.0f);
    f[0] = 7.0f;
    e2m1_block_roundtrip(f.data(), 32);
    CHECK(f[0] == 8.0f);
}

TEST_CASE("docs/model.md §2.2: HC epsilon 1e-6 in the pre gate, the row softmax and every Sinkhorn pass") {
    // mix = -1000 drives the pre sigmoid to exactly 0: pre = 0 + 1e-6.
    float mix[24], scale[3] = {1.0f, 1.0f, 1.0f}, base[24] = {};
    for (float& m : mix) m = 0.0f;
    for (int h = 0; h < 4; ++h) mix[h] = -1000.0f;
    const ref::hc_split s = ref::hc_split_sinkhorn(mix, scale, base, 4, 20, 1e-6f);
    for (int h = 0; h < 4; ++h) CHECK(s.pre[h] == 1e-6f);
    // post = 2*sigmoid(0) = 1; a uniform comb stays uniform: 0.25 + eps then normalised to
    // (0.25 + 1e-6) / (1 + 4e-6 + 1e-6) per pass: within 1e-5 of 0.25.
    for (int h = 0; h < 4; ++h) CHECK(s.post[h] == 1.0f);
    for (int k = 0; k < 16; ++k) CHECK(s.comb[k] == doctest::Approx(0.25).epsilon(1e-5));
}

TEST_CASE("docs/model.md §2.4: RMSNorm epsilon 1e-6 and the attention / indexer scales") {
    // x = 1e-3 everywhere: 1e-3/sqrt(1e-6 + 1e-6) = 0.70710678.
    std::vector<float> x(64, 1e-3f), out(64);
    ref::rms_norm_noweight(x.data(), 64, model::common_shape::rms_eps, out.data());
    CHECK(out[0] == doctest::Approx(0.70710678).epsilon(1e-6));
    // Indexer weight scale 1/sqrt(128*64) = 0.0110485433 on an identity projection.
    std::vector<std::uint16_t> proj(64 * 64, f32_to_f16(0.0f));
    for (int h = 0; h < 64; ++h) proj[std::size_t(h) * 64 + h] = f32_to_f16(1.0f);
    std::vector<float> xn(64, 1.0f), w(64);
    ref::indexer_head_weights(proj.data(), xn.data(), 64, 64, w.data());
    for (int h = 0; h < 64; ++h) CHECK(w[h] == doctest::Approx(0.0110485433).epsilon(1e-7));
    // Hadamard scale 0.08838834764831845 = 1/sqrt(128): e_0 maps to that value everywhere.
    std::vector<float> e(128, 0.0f);
    e[0] = 1.0f;
    ref::hadamard128(e.data());
    for (float v : e) CHECK(v == 0.08838834764831845f);
}

TEST_CASE("docs/model.md §2.7: routed weight scale 1.5 and the 2^-14 floor of the weight sum") {
    const float p[8] = {0.5f, 1.0f, 1.5f, 2.0f, 0.25f, 0.75f, 3.0f, 1.0f};
    const std::int32_t row[6] = {0, 1, 2, 3, 4, 5};
    const ref::moe_route r = ref::route_hash(p, row, 6, model::common_shape::expert_weights_scale);
    // sum = 6.0: w_s = p_s / 6 * 1.5.
    for (int s = 0; s < 6; ++s) CHECK(r.weight[s] == doctest::Approx(p[s] / 6.0 * 1.5).epsilon(1e-6));
    // Tiny scores: the sum 6e-6 is below 6.103515625e-5, which divides instead.
    const float tiny[6] = {1e-6f, 1e-6f, 1e-6f, 1e-6f, 1e-6f, 1e-6f};
    const ref::moe_route t = ref::route_hash(tiny, row, 6, 1.5f);
    for (int s = 0; s < 6; ++s) CHECK(t.weight[s] == doctest::Approx(1e-6 / 6.103515625e-5 * 1.5).epsilon(1e-6));
}
