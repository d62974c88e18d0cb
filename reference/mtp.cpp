#include "reference/mtp.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>
#include <utility>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/tensors.hpp"
#include "ds4/model/validate.hpp"
#include "reference/attention_decode.hpp"
#include "reference/engine.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/matvec.hpp"
#include "reference/moe.hpp"
#include "reference/norm_rope.hpp"
#include "reference/parallel.hpp"
#include "reference/sampling.hpp"

namespace ds4::ref {
namespace {

// A weight the MTP file may store in one of several types (§4: hc fns and the router are F16 or
// F32; routed experts are any routed type). The dispatch reads the type, never guesses it.
struct typed_weight {
    ggml_type type = ggml_type::f32;
    const void* data = nullptr;
};

// Dense matvec of an F16 or F32 weight with an F32 activation (the reference's F16 and F32 orders).
void matvec_dense(const typed_weight& w, const float* x, int n_in, int n_out, float* y) {
    if (w.type == ggml_type::f16)
        matvec_f16(static_cast<const std::uint16_t*>(w.data), x, n_in, n_out, y);
    else
        matvec_f32(static_cast<const float*>(w.data), x, n_in, n_out, y);
}

// hc_pre of hyper_connection.cpp with the fn's type open: same norm, split and stream sum, so an
// F16 fn gives hc_pre's bits.
hc_split mtp_hc_pre(const float* X, const typed_weight& fn, const float* scale, const float* base,
                    const model::model_dims& d, float* x_in) {
    if (fn.type == ggml_type::f16)
        return hc_pre(X, static_cast<const std::uint16_t*>(fn.data), scale, base, d.n_embd, d.n_hc,
                      d.n_hc_sinkhorn_iter, d.rms_eps, d.hc_eps, x_in);
    const int n_flat = d.hc_dim(), n_mix = d.hc_mix();
    std::vector<float> flat(static_cast<std::size_t>(n_flat)), mix(static_cast<std::size_t>(n_mix));
    rms_norm_noweight(X, n_flat, d.rms_eps, flat.data());
    matvec_dense(fn, flat.data(), n_flat, n_mix, mix.data());
    const hc_split s = hc_split_sinkhorn(mix.data(), scale, base, d.n_hc, d.n_hc_sinkhorn_iter, d.hc_eps);
    for (int i = 0; i < d.n_embd; ++i) {
        float acc = 0.0f;
        for (int h = 0; h < d.n_hc; ++h) acc += X[static_cast<std::size_t>(h) * std::size_t(d.n_embd) + static_cast<std::size_t>(i)] * s.pre[h];
        x_in[i] = acc;
    }
    return s;
}

// output_hc_mix with the fn's type open (same order).
void mtp_output_hc_mix(const float* X, const typed_weight& fn, const float* scale, const float* base,
                       const model::model_dims& d, float* e) {
    if (fn.type == ggml_type::f16) {
        output_hc_mix(X, static_cast<const std::uint16_t*>(fn.data), scale, base, d.n_embd, d.n_hc, d.rms_eps,
                      d.hc_eps, e);
        return;
    }
    const int n_flat = d.hc_dim();
    std::vector<float> flat(static_cast<std::size_t>(n_flat));
    float pre[hc_split::max_hc], w[hc_split::max_hc];
    rms_norm_noweight(X, n_flat, d.rms_eps, flat.data());
    matvec_dense(fn, flat.data(), n_flat, d.n_hc, pre);
    for (int h = 0; h < d.n_hc; ++h) w[h] = sigmoid(pre[h] * scale[0] + base[h]) + d.hc_eps;
    for (int i = 0; i < d.n_embd; ++i) {
        float acc = 0.0f;
        for (int h = 0; h < d.n_hc; ++h) acc += X[static_cast<std::size_t>(h) * std::size_t(d.n_embd) + static_cast<std::size_t>(i)] * w[h];
        e[i] = acc;
    }
}

}  // namespace

struct mtp_head::impl {
    gguf::file file;
    model::model_dims d;
    model::attention_row_layout row;
    rope_params rope{};

    // Base model tensors (§4: MTP has no embedding or output matrix of its own).
    const std::uint16_t* token_embd = nullptr;
    const q8_0_block* output = nullptr;

    const q8_0_block *e_proj = nullptr, *h_proj = nullptr;
    const float *enorm = nullptr, *hnorm = nullptr, *norm = nullptr;
    typed_weight hc_head_fn;
    const float *hc_head_scale = nullptr, *hc_head_base = nullptr;

    typed_weight hc_attn_fn;
    const float *hc_attn_scale = nullptr, *hc_attn_base = nullptr, *attn_norm = nullptr;
    const q8_0_block *q_a = nullptr, *q_b = nullptr, *kv = nullptr, *out_a = nullptr, *out_b = nullptr;
    const float *q_a_norm = nullptr, *kv_norm = nullptr, *sinks = nullptr;
    typed_weight hc_ffn_fn, gate_inp, gate_exps, up_exps, down_exps;
    const float *hc_ffn_scale = nullptr, *hc_ffn_base = nullptr, *ffn_norm = nullptr, *probs_bias = nullptr;
    const q8_0_block *sh_gate = nullptr, *sh_up = nullptr, *sh_down = nullptr;

    impl(gguf::file f, const cpu_engine& base)
        : file(std::move(f)), d(base.dims()), row{d.head_dim, d.n_rot} {
        model::require_valid_mtp(file, d);
        const gguf::file& bf = base.file();
        token_embd = reinterpret_cast<const std::uint16_t*>(bf.tensor("token_embd.weight").data);
        output = reinterpret_cast<const q8_0_block*>(bf.tensor("output.weight").data);
        bind();
        // §4: the MTP block is il = 1 semantics, a window-only layer: base 10000, no YaRN.
        rope = make_rope_params(d.rope_freq_base, 1.0f, false, d.n_rot, d.rope_orig_ctx, d.yarn_beta_fast,
                                d.yarn_beta_slow);
    }

    // Binds through the MTP inventory, so every name read is one the validator checked (and its
    // type one the validator accepted).
    void bind() {
        std::unordered_set<std::string> names;
        for (const model::tensor_spec& t : model::mtp_inventory(d)) names.insert(t.name);
        auto get = [&](const std::string& base_name) -> const gguf::tensor_info& {
            const std::string name = "mtp.0." + base_name;
            require(names.count(name) == 1, "mtp_head: '" + name + "' is not in the MTP inventory");
            return file.tensor(name);
        };
        auto f32 = [&](const std::string& n) { return reinterpret_cast<const float*>(get(n).data); };
        auto q8 = [&](const std::string& n) { return reinterpret_cast<const q8_0_block*>(get(n).data); };
        auto typed = [&](const std::string& n) {
            const gguf::tensor_info& t = get(n);
            return typed_weight{t.type, t.data};
        };
        e_proj = q8("e_proj.weight");
        h_proj = q8("h_proj.weight");
        enorm = f32("enorm.weight");
        hnorm = f32("hnorm.weight");
        norm = f32("norm.weight");
        hc_head_fn = typed("hc_head_fn.weight");
        hc_head_scale = f32("hc_head_scale.weight");
        hc_head_base = f32("hc_head_base.weight");
        hc_attn_fn = typed("hc_attn_fn.weight");
        hc_attn_scale = f32("hc_attn_scale.weight");
        hc_attn_base = f32("hc_attn_base.weight");
        attn_norm = f32("attn_norm.weight");
        q_a = q8("attn_q_a.weight");
        q_a_norm = f32("attn_q_a_norm.weight");
        q_b = q8("attn_q_b.weight");
        kv = q8("attn_kv.weight");
        kv_norm = f32("attn_kv_a_norm.weight");
        sinks = f32("attn_sinks.weight");
        out_a = q8("attn_output_a.weight");
        out_b = q8("attn_output_b.weight");
        hc_ffn_fn = typed("hc_ffn_fn.weight");
        hc_ffn_scale = f32("hc_ffn_scale.weight");
        hc_ffn_base = f32("hc_ffn_base.weight");
        ffn_norm = f32("ffn_norm.weight");
        gate_inp = typed("ffn_gate_inp.weight");
        probs_bias = f32("exp_probs_b.bias");
        gate_exps = typed("ffn_gate_exps.weight");
        up_exps = typed("ffn_up_exps.weight");
        down_exps = typed("ffn_down_exps.weight");
        sh_gate = q8("ffn_gate_shexp.weight");
        sh_up = q8("ffn_up_shexp.weight");
        sh_down = q8("ffn_down_shexp.weight");
        // The validator accepts every routed type; the reference has dots for the shipped MTP
        // file's (Q4_K throughout) and the q2 model's (IQ2_XXS gate/up, Q2_K down).
        const bool q4 = gate_exps.type == ggml_type::q4_k && down_exps.type == ggml_type::q4_k;
        const bool q2 = gate_exps.type == ggml_type::iq2_xxs && down_exps.type == ggml_type::q2_k;
        require(up_exps.type == gate_exps.type && (q4 || q2),
                "mtp_head: routed experts are " + std::string(type_name(gate_exps.type)) + "/" +
                    std::string(type_name(up_exps.type)) + "/" + std::string(type_name(down_exps.type)) +
                    " (mtp.0.ffn_{gate,up,down}_exps.weight); the CPU reference supports q4_K/q4_K/q4_K and "
                    "iq2_xxs/iq2_xxs/q2_K");
    }

    // The attention sublayer of §2.4 for a window-only layer: engine.cpp's op order without the
    // compressor and indexer steps.
    void attention(mtp_state& st, std::int32_t pos, std::vector<float>& X) const {
        const int E = d.n_embd, hd = d.head_dim;
        const float eps = d.rms_eps;
        const auto n = [](int v) { return static_cast<std::size_t>(v); };
        std::vector<float> x_in(n(E)), xn(n(E)), qr(n(d.n_lora_q)), qn(n(d.n_lora_q)), q(n(d.q_dim())),
            kvr(n(hd)), o(n(d.q_dim())), low(n(d.lora_o_total())), out(n(E)), Y(X.size());
        const hc_split split = mtp_hc_pre(X.data(), hc_attn_fn, hc_attn_scale, hc_attn_base, d, x_in.data());
        rms_norm(x_in.data(), attn_norm, E, eps, xn.data());
        matvec_q8_0(q_a, xn.data(), E, d.n_lora_q, qr.data());
        rms_norm(qr.data(), q_a_norm, d.n_lora_q, eps, qn.data());
        matvec_q8_0(q_b, qn.data(), d.n_lora_q, d.q_dim(), q.data());
        head_rms_norm(q.data(), d.n_head, hd, eps);
        matvec_q8_0(kv, xn.data(), E, hd, kvr.data());
        rms_norm(kvr.data(), kv_norm, hd, eps, kvr.data());
        const auto upos = std::uint32_t(pos);
        rope_tail(q.data(), d.n_head, hd, d.n_rot, rope, upos, false);
        rope_tail(kvr.data(), 1, hd, d.n_rot, rope, upos, false);
        const std::size_t rb = std::size_t(row.bytes());
        model::encode_attention_row(row, kvr.data(), st.raw.data() + std::size_t(pos % d.n_swa) * rb);

        // The window oldest -> newest, as the engine passes it.
        const int n_raw = std::min(pos + 1, d.n_swa);
        std::vector<float> raw_f(n(n_raw) * n(hd));
        for (int i = 0; i < n_raw; ++i)
            model::decode_attention_row(row, st.raw.data() + std::size_t((pos + 1 - n_raw + i) % d.n_swa) * rb,
                                        raw_f.data() + n(i) * n(hd));
        attention_decode(q.data(), raw_f.data(), n_raw, nullptr, 0, nullptr, sinks, d.n_head, hd, d.n_rot, rope,
                         upos, o.data());

        const int gin = d.group_in(), blocks_per_row = gin / q8_0_block_size;
        for (int g = 0; g < d.n_out_group; ++g)
            matvec_q8_0(out_a + n(g) * n(d.n_lora_o) * n(blocks_per_row), o.data() + n(g) * n(gin), gin, d.n_lora_o,
                        low.data() + n(g) * n(d.n_lora_o));
        matvec_q8_0(out_b, low.data(), d.lora_o_total(), E, out.data());
        hc_post(out.data(), X.data(), split, E, d.n_hc, Y.data());
        X.swap(Y);
    }

    // The MoE sublayer of §2.7 with learned routing (the MTP block has no hash table).
    void ffn(std::vector<float>& X) const {
        const int E = d.n_embd;
        std::vector<float> x_in(static_cast<std::size_t>(E)), xn(static_cast<std::size_t>(E)), probs(std::size_t(d.n_expert)),
            moe(static_cast<std::size_t>(E)), shared(static_cast<std::size_t>(E)), Y(X.size());
        const hc_split split = mtp_hc_pre(X.data(), hc_ffn_fn, hc_ffn_scale, hc_ffn_base, d, x_in.data());
        rms_norm(x_in.data(), ffn_norm, E, d.rms_eps, xn.data());
        if (gate_inp.type == ggml_type::f16) {
            router_probs(static_cast<const std::uint16_t*>(gate_inp.data), xn.data(), E, d.n_expert, probs.data());
        } else {
            matvec_dense(gate_inp, xn.data(), E, d.n_expert, probs.data());
            for (float& p : probs) p = std::sqrt(softplus(p));  // router_probs' activation
        }
        const moe_route route =
            route_top_k(probs.data(), probs_bias, d.n_expert, d.n_expert_used, d.expert_weights_scale);
        if (gate_exps.type == ggml_type::q4_k)
            moe_routed(static_cast<const q4_k_block*>(gate_exps.data), static_cast<const q4_k_block*>(up_exps.data),
                            static_cast<const q4_k_block*>(down_exps.data), route, xn.data(), E, d.n_ff_exp,
                            d.swiglu_clamp_exp, moe.data());
        else
            moe_routed(static_cast<const iq2_xxs_block*>(gate_exps.data),
                       static_cast<const iq2_xxs_block*>(up_exps.data), static_cast<const q2_k_block*>(down_exps.data),
                       route, xn.data(), E, d.n_ff_exp, d.swiglu_clamp_exp, moe.data());
        shared_expert(sh_gate, sh_up, sh_down, xn.data(), E, d.n_ff_exp, d.swiglu_clamp_exp, shared.data());
        for (int i = 0; i < E; ++i) moe[static_cast<std::size_t>(i)] += shared[static_cast<std::size_t>(i)];
        hc_post(moe.data(), X.data(), split, E, d.n_hc, Y.data());
        X.swap(Y);
    }

    mtp_step step(mtp_state& st, std::int32_t token, const float* prev_hc, std::int32_t pos) const {
        require(token >= 0 && token < d.n_vocab,
                "mtp_head: token " + std::to_string(token) + " is outside the vocabulary of " + std::to_string(d.n_vocab));
        require(st.raw.size() == std::size_t(d.n_swa) * std::size_t(row.bytes()),
                "mtp_head: state was not made by this head's new_state()");
        require(pos == st.length, "mtp_head: draft at position " + std::to_string(pos) + " but the MTP state has length " +
                                      std::to_string(st.length) + " (rows are written in position order)");
        const int E = d.n_embd;
        const auto n = static_cast<std::size_t>(E);
        std::vector<float> e(n), Ep(n), hn(n), Hs(n), X(std::size_t(d.hc_dim()));
        const std::uint16_t* emb = token_embd + static_cast<std::size_t>(token) * n;
        for (int i = 0; i < E; ++i) e[static_cast<std::size_t>(i)] = f16_to_f32(emb[i]);
        rms_norm(e.data(), enorm, E, d.rms_eps, e.data());
        matvec_q8_0(e_proj, e.data(), E, E, Ep.data());
        for (int s = 0; s < d.n_hc; ++s) {
            rms_norm(prev_hc + static_cast<std::size_t>(s) * n, hnorm, E, d.rms_eps, hn.data());
            matvec_q8_0(h_proj, hn.data(), E, E, Hs.data());
            for (std::size_t i = 0; i < n; ++i) X[static_cast<std::size_t>(s) * n + i] = Ep[i] + Hs[i];
        }
        attention(st, pos, X);
        ffn(X);
        st.length = pos + 1;

        mtp_step out;
        std::vector<float> mixed(n);
        mtp_output_hc_mix(X.data(), hc_head_fn, hc_head_scale, hc_head_base, d, mixed.data());
        rms_norm(mixed.data(), norm, E, d.rms_eps, mixed.data());
        out.logits.resize(std::size_t(d.n_vocab));
        matvec_q8_0(output, mixed.data(), E, d.n_vocab, out.logits.data());
        out.hc = std::move(X);
        out.token = sample_argmax(out.logits.data(), d.n_vocab);
        return out;
    }
};

std::unique_ptr<mtp_head> mtp_head::load(const std::filesystem::path& path, const cpu_engine& base) {
    return std::make_unique<mtp_head>(gguf::file::open(path), base);
}

mtp_head::mtp_head(gguf::file file, const cpu_engine& base) : impl_(std::make_unique<impl>(std::move(file), base)) {}
mtp_head::~mtp_head() = default;

const model::model_dims& mtp_head::dims() const { return impl_->d; }

mtp_state mtp_head::new_state() const {
    mtp_state s;
    s.raw.assign(std::size_t(impl_->d.n_swa) * std::size_t(impl_->row.bytes()), 0);
    return s;
}

mtp_step mtp_head::draft(mtp_state& state, std::int32_t token, const float* prev_hc, std::int32_t pos) const {
    return impl_->step(state, token, prev_hc, pos);
}

std::vector<std::int32_t> mtp_head::greedy_draft(mtp_state& state, std::int32_t token, const float* prev_hc,
                                                 std::int32_t pos, int n) const {
    std::vector<std::int32_t> drafts;
    if (n <= 0) return drafts;
    mtp_step s = impl_->step(state, token, prev_hc, pos);
    drafts.push_back(s.token);
    mtp_state spec = state;  // speculative rows never reach the committed state
    for (int k = 1; k < n; ++k) {
        s = impl_->step(spec, s.token, s.hc.data(), pos + k);
        drafts.push_back(s.token);
    }
    return drafts;
}

}  // namespace ds4::ref
