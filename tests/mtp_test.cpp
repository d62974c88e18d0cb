// The MTP head (docs/model.md §4) on the tiny synthetic model and its MTP file: the layer
// program's MTP block with the reference ops equals a composition written here from §4 over the
// reference ops (bitwise, 24 positions so the window of 16 wraps), for F32 (what ds4-synth
// writes) and F16 HC/router weights; the CPU backend's draft() equals the composition's greedy
// chain and leaves the committed state alone; the loader refuses a base file and a mis-shaped
// tensor by name.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/model/shape.hpp"
#include "ds4/model/tensors.hpp"
#include "harness/synth/generator.hpp"
#include "reference/attention_split.hpp"
#include "ds4/graph/layer_program.hpp"
#include "ds4/model/metadata.hpp"
#include "reference/cpu_backend.hpp"
#include "reference/cpu_ops.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/kv_store.hpp"
#include "reference/matvec.hpp"
#include "reference/moe.hpp"
#include "reference/norm_rope.hpp"
#include "reference/sampling.hpp"

using namespace ds4;
using namespace ds4::ref;

namespace {

constexpr int n_positions = 24;

std::filesystem::path temp_path(const std::string& what) {
    return std::filesystem::temp_directory_path() / ("ds4_mtp_test_" + std::to_string(::getpid()) + "_" + what + ".gguf");
}

model::model_dims tiny() { return model::dims_of<model::tiny_shape>(); }

const std::filesystem::path& base_path() {
    static const std::filesystem::path p = [] {
        const auto path = temp_path("base");
        synth::write_options opt;
        opt.seed = 1;
        synth::write_model(path, tiny(), opt);
        return path;
    }();
    return p;
}

// The base model bound for the reference op set.
struct base_model {
    gguf::file file = gguf::file::open(base_path());
    model::model_dims d = model::expected_dims(file);
    model_weights w = bind_model_weights(file, d);
    model::kv_page_pool attn{model::attention_row_layout{d.head_dim, d.n_rot}.bytes()};
    model::kv_page_pool idx{model::indexer_row_layout{d.indexer_head_dim}.bytes()};
    cpu_ops ops{d, w, 0};
};

base_model& base() {
    static base_model b;
    return b;
}

// An MTP file from an edited inventory (types or dims changed), through ds4-synth's own writer.
std::filesystem::path write_mtp_file(const std::string& what, const std::vector<model::tensor_spec>& inv) {
    const auto path = temp_path(what);
    synth::write_options opt;
    opt.seed = 7;
    gguf::writer w(path);
    synth::detail::write_general_keys(w, tiny(), "MTP");
    synth::detail::stream_tensors(w, inv, tiny(), opt, std::chrono::steady_clock::now());
    return path;
}

// The layer program's MTP block on the reference ops, with its own window.
struct ops_head {
    gguf::file file;
    mtp_weights w = bind_mtp_weights(file, base().d, base().file);
    std::vector<layer_kv> window = new_mtp_layers(base().attn);

    struct step_out {
        std::vector<float> logits, hc;
    };
    step_out step(std::int32_t token, const float* prev_hc, std::int32_t pos) {
        cpu_ops::batch b;
        b.rows.resize(1);
        row_work& r = b.rows[0];
        r.kv = &window;
        r.pos = pos;
        r.token = token;
        r.wants_output = true;
        r.prev_hc = prev_hc;
        base().ops.prepare(b);
        graph::mtp_forward(base().ops, b, w);
        return {r.logits, r.X};
    }
};

// ---- The independent composition of §4 --------------------------------------------------------

struct tensor_ref {
    ggml_type type;
    const void* data;
};

struct composed_mtp {
    gguf::file f;
    model::model_dims d = tiny();
    std::deque<std::vector<float>> window;  // stored rows (F32, as §2.9's simulated cache), oldest first

    tensor_ref t(const std::string& name) const {
        const gguf::tensor_info& i = f.tensor("mtp.0." + name);
        return {i.type, i.data};
    }
    const float* f32(const std::string& name) const { return static_cast<const float*>(t(name).data); }
    const q8_0_block* q8(const std::string& name) const { return static_cast<const q8_0_block*>(t(name).data); }

    // F16 or F32 weight times an F32 activation.
    static void dense(tensor_ref w, const float* x, int n_in, int n_out, float* y) {
        if (w.type == ggml_type::f16)
            matvec_f16(static_cast<const std::uint16_t*>(w.data), x, n_in, n_out, y);
        else
            matvec_f32(static_cast<const float*>(w.data), x, n_in, n_out, y);
    }

    // §2.2: flat = RMSNorm(X), mix = fn . flat, Sinkhorn split, x_in = sum_h X[h]*pre[h].
    hc_split pre(const std::vector<float>& X, const std::string& which, std::vector<float>& x_in) const {
        std::vector<float> flat(X.size()), mix(std::size_t(d.hc_mix()));
        rms_norm_noweight(X.data(), d.hc_dim(), d.rms_eps, flat.data());
        dense(t("hc_" + which + "_fn.weight"), flat.data(), d.hc_dim(), d.hc_mix(), mix.data());
        const hc_split s = ref::hc_split_sinkhorn(mix.data(), f32("hc_" + which + "_scale.weight"),
                                             f32("hc_" + which + "_base.weight"), d.n_hc, d.n_hc_sinkhorn_iter, d.hc_eps);
        x_in.assign(std::size_t(d.n_embd), 0.0f);
        for (int i = 0; i < d.n_embd; ++i) {
            float acc = 0.0f;
            for (int h = 0; h < d.n_hc; ++h) acc += X[std::size_t(h * d.n_embd + i)] * s.pre[h];
            x_in[std::size_t(i)] = acc;
        }
        return s;
    }

    // §2.3.
    std::vector<float> post(const std::vector<float>& F, const std::vector<float>& X, const hc_split& s) const {
        std::vector<float> Y(X.size());
        for (int j = 0; j < d.n_hc; ++j)
            for (int i = 0; i < d.n_embd; ++i) {
                float acc = F[std::size_t(i)] * s.post[j];
                for (int k = 0; k < d.n_hc; ++k) acc += s.comb[k * d.n_hc + j] * X[std::size_t(k * d.n_embd + i)];
                Y[std::size_t(j * d.n_embd + i)] = acc;
            }
        return Y;
    }

    // One §4 step; returns the logits, leaves the output HC in `hc`.
    std::vector<float> step(std::int32_t token, const float* prev_hc, std::int32_t pos, std::vector<float>& hc,
                            const std::uint16_t* token_embd, const q8_0_block* output) {
        const int E = d.n_embd, hd = d.head_dim;
        const auto n = [](int v) { return std::size_t(v); };
        std::vector<float> e(n(E)), Ep(n(E)), X(n(d.hc_dim()));
        for (int i = 0; i < E; ++i) e[n(i)] = f16_to_f32(token_embd[n(token) * n(E) + n(i)]);
        rms_norm(e.data(), f32("enorm.weight"), E, d.rms_eps, e.data());
        matvec_q8_0(q8("e_proj.weight"), e.data(), E, E, Ep.data());
        for (int s = 0; s < d.n_hc; ++s) {
            std::vector<float> hn(n(E)), H(n(E));
            rms_norm(prev_hc + n(s) * n(E), f32("hnorm.weight"), E, d.rms_eps, hn.data());
            matvec_q8_0(q8("h_proj.weight"), hn.data(), E, E, H.data());
            for (int i = 0; i < E; ++i) X[n(s) * n(E) + n(i)] = Ep[n(i)] + H[n(i)];
        }

        // Attention, window-only: base 10000, no YaRN (il = 1 semantics).
        const rope_params rp = ds4_rope_params(false, d.n_rot);
        std::vector<float> x_in, xn(n(E)), qr(n(d.n_lora_q)), q(n(d.q_dim())), kv(n(hd)), o(n(d.q_dim())),
            low(n(d.lora_o_total())), att(n(E));
        hc_split sp = pre(X, "attn", x_in);
        rms_norm(x_in.data(), f32("attn_norm.weight"), E, d.rms_eps, xn.data());
        matvec_q8_0(q8("attn_q_a.weight"), xn.data(), E, d.n_lora_q, qr.data());
        rms_norm(qr.data(), f32("attn_q_a_norm.weight"), d.n_lora_q, d.rms_eps, qr.data());
        matvec_q8_0(q8("attn_q_b.weight"), qr.data(), d.n_lora_q, d.q_dim(), q.data());
        head_rms_norm(q.data(), d.n_head, hd, d.rms_eps);
        matvec_q8_0(q8("attn_kv.weight"), xn.data(), E, hd, kv.data());
        rms_norm(kv.data(), f32("attn_kv_a_norm.weight"), hd, d.rms_eps, kv.data());
        rope_tail(q.data(), d.n_head, hd, d.n_rot, rp, std::uint32_t(pos), false);
        rope_tail(kv.data(), 1, hd, d.n_rot, rp, std::uint32_t(pos), false);
        kv_row_as_stored(kv.data(), hd, d.n_rot);
        window.push_back(kv);
        if (int(window.size()) > d.n_swa) window.pop_front();
        std::vector<float> rows;
        for (const auto& r : window) rows.insert(rows.end(), r.begin(), r.end());
        attention_decode_split(q.data(), rows.data(), int(window.size()), nullptr, 0, nullptr, f32("attn_sinks.weight"),
                               d.n_head, hd, d.n_rot, rp, std::uint32_t(pos), o.data());
        const int gin = d.group_in();
        for (int g = 0; g < d.n_out_group; ++g)
            matvec_q8_0(q8("attn_output_a.weight") + n(g) * n(d.n_lora_o) * n(gin / 32), o.data() + n(g) * n(gin), gin,
                        d.n_lora_o, low.data() + n(g) * n(d.n_lora_o));
        matvec_q8_0(q8("attn_output_b.weight"), low.data(), d.lora_o_total(), E, att.data());
        X = post(att, X, sp);

        // MoE: learned routing with the required bias; Q4_K experts on Q8_K activations.
        sp = pre(X, "ffn", x_in);
        rms_norm(x_in.data(), f32("ffn_norm.weight"), E, d.rms_eps, xn.data());
        std::vector<float> p(n(d.n_expert));
        dense(t("ffn_gate_inp.weight"), xn.data(), E, d.n_expert, p.data());
        for (float& v : p) v = std::sqrt(softplus(v));
        const moe_route route =
            route_top_k(p.data(), f32("exp_probs_b.bias"), d.n_expert, d.n_expert_used, d.expert_weights_scale);
        const int ff = d.n_ff_exp, nb_in = E / 256, nb_ff = ff / 256;
        const auto* gate = static_cast<const q4_k_block*>(t("ffn_gate_exps.weight").data);
        const auto* up = static_cast<const q4_k_block*>(t("ffn_up_exps.weight").data);
        const auto* down = static_cast<const q4_k_block*>(t("ffn_down_exps.weight").data);
        std::vector<q8_k_block> xq(n(nb_in)), mq(n(nb_ff));
        quantize_q8_k(xn.data(), xq.data(), E);
        std::vector<std::vector<float>> ys;
        for (int s = 0; s < route.n_used; ++s) {
            const std::size_t ex = n(route.expert[s]);
            std::vector<float> mid(n(ff)), y(n(E));
            for (int r = 0; r < ff; ++r) {
                const float g = std::fmin(dot_q4_k_q8_k(gate + (ex * n(ff) + n(r)) * n(nb_in), xq.data(), nb_in), 10.0f);
                const float u = std::fmax(
                    std::fmin(dot_q4_k_q8_k(up + (ex * n(ff) + n(r)) * n(nb_in), xq.data(), nb_in), 10.0f), -10.0f);
                mid[n(r)] = (silu(g) * u) * route.weight[s];
            }
            quantize_q8_k(mid.data(), mq.data(), ff);
            for (int r = 0; r < E; ++r) y[n(r)] = dot_q4_k_q8_k(down + (ex * n(E) + n(r)) * n(nb_ff), mq.data(), nb_ff);
            ys.push_back(y);
        }
        std::vector<float> F(n(E)), shared(n(E));
        for (int r = 0; r < E; ++r) {
            float acc = 0.0f;
            for (const auto& y : ys) acc += y[n(r)];
            F[n(r)] = acc;
        }
        shared_expert(q8("ffn_gate_shexp.weight"), q8("ffn_up_shexp.weight"), q8("ffn_down_shexp.weight"), xn.data(),
                      E, ff, d.swiglu_clamp_exp, shared.data());
        for (int r = 0; r < E; ++r) F[n(r)] += shared[n(r)];
        X = post(F, X, sp);

        // Output head (§2.8) with the MTP's HC head and norm, the base output matrix.
        std::vector<float> flat(X.size()), pre4(n(d.n_hc)), mixed(n(E)), logits(n(d.n_vocab));
        rms_norm_noweight(X.data(), d.hc_dim(), d.rms_eps, flat.data());
        dense(t("hc_head_fn.weight"), flat.data(), d.hc_dim(), d.n_hc, pre4.data());
        std::vector<float> w(n(d.n_hc));
        for (int h = 0; h < d.n_hc; ++h)
            w[n(h)] = sigmoid(pre4[n(h)] * f32("hc_head_scale.weight")[0] + f32("hc_head_base.weight")[h]) + d.hc_eps;
        for (int i = 0; i < E; ++i) {
            float acc = 0.0f;
            for (int h = 0; h < d.n_hc; ++h) acc += X[n(h) * n(E) + n(i)] * w[n(h)];
            mixed[n(i)] = acc;
        }
        rms_norm(mixed.data(), f32("norm.weight"), E, d.rms_eps, mixed.data());
        matvec_q8_0(output, mixed.data(), E, d.n_vocab, logits.data());
        hc = X;
        return logits;
    }
};

struct target_run {
    std::vector<std::int32_t> tokens;
    std::vector<std::vector<float>> hc;  // every row's final HC state
    const float* hc_state_of(std::size_t p) const { return hc[p].data(); }
};

// The base model over random tokens through the layer program, every row's final HC state.
const target_run& target() {
    static const target_run run = [] {
        target_run t;
        std::mt19937 g(11);
        std::uniform_int_distribution<std::int32_t> pick(0, tiny().n_vocab - 1);
        std::vector<layer_kv> layers = new_layers(base().d, base().attn, base().idx);
        cpu_ops::batch b;
        for (int i = 0; i < n_positions; ++i) {
            t.tokens.push_back(pick(g));
            row_work r;
            r.kv = &layers;
            r.pos = i;
            r.token = t.tokens.back();
            b.rows.push_back(std::move(r));
        }
        base().ops.prepare(b);
        graph::forward(graph::base_layer_rules{base().d}, base().ops, b);
        for (const row_work& r : b.rows) t.hc.push_back(r.X);
        return t;
    }();
    return run;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The head against the composition at every position, with the inventory `inv`.
void check_against_composition(const std::string& what, const std::vector<model::tensor_spec>& inv) {
    const auto path = write_mtp_file(what, inv);
    ops_head head{gguf::file::open(path)};
    composed_mtp c{gguf::file::open(path), tiny(), {}};
    std::filesystem::remove(path);
    const target_run& t = target();
    for (int p = 0; p < n_positions; ++p) {
        CAPTURE(p);
        const auto s = head.step(t.tokens[std::size_t(p)], t.hc_state_of(std::size_t(p)), p);
        std::vector<float> hc;
        const std::vector<float> logits = c.step(t.tokens[std::size_t(p)], t.hc_state_of(std::size_t(p)), p, hc,
                                                 base().w.token_embd, base().w.head.output);
        CHECK(same_bits(s.logits, logits));
        CHECK(same_bits(s.hc, hc));
        CHECK(std::all_of(s.logits.begin(), s.logits.end(), [](float v) { return std::isfinite(v); }));
    }
}

std::vector<model::tensor_spec> retyped(std::vector<model::tensor_spec> inv, ggml_type to) {
    for (auto& t : inv)
        if (t.base == "hc_head_fn.weight" || t.base == "hc_attn_fn.weight" || t.base == "hc_ffn_fn.weight" ||
            t.base == "ffn_gate_inp.weight")
            t.type = to;
    return inv;
}

}  // namespace

TEST_CASE("mtp: the head equals the §4 composition bitwise (F32 HC and router, as ds4-synth writes)") {
    check_against_composition("f32", model::mtp_inventory(tiny()));
}

TEST_CASE("mtp: F16 HC mixers and router are accepted and equal the composition") {
    check_against_composition("f16", retyped(model::mtp_inventory(tiny()), ggml_type::f16));
}

// The CPU backend with the MTP file: prefill with keep_hc_state, then draft().
std::unique_ptr<engine::backend> backend_with_head(const std::filesystem::path& mtp) {
    cpu_backend_options o;
    o.mtp = mtp;
    return make_cpu_backend(base_path(), o);
}

void prefill(engine::backend& b, engine::sequence_id s, int n, bool keep) {
    std::vector<engine::row> rows;
    for (int p = 0; p < n; ++p) rows.push_back({s, p, target().tokens[std::size_t(p)], engine::output::none});
    b.run({rows, {}, keep});
}

TEST_CASE("mtp: the backend's drafts are the composition's greedy chain and leave only the real rows committed") {
    const auto path = write_mtp_file("draft", model::mtp_inventory(tiny()));
    auto b = backend_with_head(path);
    composed_mtp c{gguf::file::open(path), tiny(), {}};
    std::filesystem::remove(path);
    const target_run& t = target();
    const int p = 10;
    const engine::sequence_id s = b->create();
    prefill(*b, s, p + 1, true);
    const auto da = b->draft(s, 5);
    const auto db = b->draft(s, 5);
    REQUIRE(da.size() == 5);
    CHECK(da == db);
    CHECK(b->length(s) == p + 1);

    // The chain by the composition: real rows 0..p from the target's HC states, then each
    // recursive step from the previous step's output.
    std::vector<float> hc, logits;
    for (int q = 0; q <= p; ++q)
        logits = c.step(t.tokens[std::size_t(q)], t.hc_state_of(std::size_t(q)), q, hc, base().w.token_embd,
                        base().w.head.output);
    std::vector<std::int32_t> manual{sample_argmax(logits.data(), int(logits.size()))};
    for (int k = 1; k < 5; ++k) {
        const std::vector<float> prev = hc;
        logits = c.step(manual.back(), prev.data(), p + k, hc, base().w.token_embd, base().w.head.output);
        manual.push_back(sample_argmax(logits.data(), int(logits.size())));
    }
    CHECK(manual == da);

    // A fork drafts the same; a one-step prefix of the drafts is the same chain.
    const engine::sequence_id f = b->fork(s);
    CHECK(b->draft(f, 5) == da);
    CHECK(b->draft(f, 2) == std::vector<std::int32_t>(da.begin(), da.begin() + 2));
    b->free(f);
    b->free(s);
}

TEST_CASE("mtp: draft needs a kept state at the last position, a loaded head and a sane count") {
    const auto path = write_mtp_file("errors", model::mtp_inventory(tiny()));
    auto b = backend_with_head(path);
    std::filesystem::remove(path);
    const engine::sequence_id s = b->create();
    CHECK_THROWS_WITH_AS(b->draft(s, 2), doctest::Contains("no kept HC state"), ds4::error);
    prefill(*b, s, 4, false);
    CHECK_THROWS_WITH_AS(b->draft(s, 2), doctest::Contains("no kept HC state"), ds4::error);
    const engine::row next{s, 4, target().tokens[4], engine::output::none};
    b->run({std::span(&next, 1), {}, true});
    CHECK(b->draft(s, 3).size() == 3);
    CHECK_THROWS_AS(b->draft(s, 0), ds4::error);
    CHECK_THROWS_AS(b->draft(s, b->caps().max_draft + 1), ds4::error);
    b->truncate(s, 4);
    CHECK_THROWS_WITH_AS(b->draft(s, 2), doctest::Contains("no kept HC state"), ds4::error);
    b->free(s);

    auto plain = make_cpu_backend(base_path());
    CHECK(plain->caps().max_draft == 0);
    const engine::sequence_id q = plain->create();
    CHECK_THROWS_WITH_AS(plain->draft(q, 1), doctest::Contains("no MTP head"), ds4::error);
}

TEST_CASE("mtp: the loader refuses a base model file and a mis-shaped tensor, by name") {
    try {
        backend_with_head(base_path());
        FAIL("a base model file was accepted as an MTP file");
    } catch (const ds4::error& e) {
        CHECK(std::string(e.what()).find("mtp.0.e_proj.weight") != std::string::npos);
    }
    auto inv = model::mtp_inventory(tiny());
    for (auto& t : inv)
        if (t.base == "hnorm.weight") t.dims = {std::uint64_t(tiny().n_embd / 2)};
    const auto path = write_mtp_file("badshape", inv);
    try {
        backend_with_head(path);
        FAIL("a mis-shaped MTP file was accepted");
    } catch (const ds4::error& e) {
        CHECK(std::string(e.what()).find("mtp.0.hnorm.weight") != std::string::npos);
    }
    std::filesystem::remove(path);
}
