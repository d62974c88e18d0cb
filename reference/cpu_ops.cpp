#include "reference/cpu_ops.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/model/tensors.hpp"
#include "reference/attention_split.hpp"
#include "reference/indexer.hpp"
#include "reference/matvec.hpp"
#include "reference/norm_rope.hpp"
#include "reference/parallel.hpp"

namespace ds4::ref {
namespace {

constexpr std::size_t sz(int v) { return static_cast<std::size_t>(v); }

// Dense matvec of an F16 or F32 weight (the reference's F16 and F32 orders).
void matvec_dense(const typed_weight& w, const float* x, int n_in, int n_out, float* y) {
    if (w.type == ggml_type::f16)
        matvec_f16(static_cast<const std::uint16_t*>(w.data), x, n_in, n_out, y);
    else
        matvec_f32(static_cast<const float*>(w.data), x, n_in, n_out, y);
}

// hc_pre with the fn's type open: an F16 fn is hyper_connection.cpp's hc_pre; an F32 fn runs
// the same norm, split and stream sum around the F32 matvec.
hc_split typed_hc_pre(const float* X, const hc_weights& hc, const model::model_dims& d, float* x_in) {
    if (hc.fn.type == ggml_type::f16)
        return ref::hc_pre(X, static_cast<const std::uint16_t*>(hc.fn.data), hc.scale, hc.base, d.n_embd, d.n_hc,
                           d.n_hc_sinkhorn_iter, d.rms_eps, d.hc_eps, x_in);
    std::vector<float> flat(sz(d.hc_dim())), mix(sz(d.hc_mix()));
    rms_norm_noweight(X, d.hc_dim(), d.rms_eps, flat.data());
    matvec_dense(hc.fn, flat.data(), d.hc_dim(), d.hc_mix(), mix.data());
    const hc_split s = hc_split_sinkhorn(mix.data(), hc.scale, hc.base, d.n_hc, d.n_hc_sinkhorn_iter, d.hc_eps);
    for (int i = 0; i < d.n_embd; ++i) {
        float acc = 0.0f;
        for (int h = 0; h < d.n_hc; ++h) acc += X[sz(h) * sz(d.n_embd) + sz(i)] * s.pre[h];
        x_in[i] = acc;
    }
    return s;
}

void typed_output_hc_mix(const float* X, const hc_weights& hc, const model::model_dims& d, float* e) {
    if (hc.fn.type == ggml_type::f16) {
        output_hc_mix(X, static_cast<const std::uint16_t*>(hc.fn.data), hc.scale, hc.base, d.n_embd, d.n_hc,
                      d.rms_eps, d.hc_eps, e);
        return;
    }
    std::vector<float> flat(sz(d.hc_dim()));
    float pre[hc_split::max_hc], w[hc_split::max_hc];
    rms_norm_noweight(X, d.hc_dim(), d.rms_eps, flat.data());
    matvec_dense(hc.fn, flat.data(), d.hc_dim(), d.n_hc, pre);
    for (int h = 0; h < d.n_hc; ++h) w[h] = sigmoid(pre[h] * hc.scale[0] + hc.base[h]) + d.hc_eps;
    for (int i = 0; i < d.n_embd; ++i) {
        float acc = 0.0f;
        for (int h = 0; h < d.n_hc; ++h) acc += X[sz(h) * sz(d.n_embd) + sz(i)] * w[h];
        e[i] = acc;
    }
}

// Binds names through an inventory, so every tensor read is one the validator checked.
class binder {
public:
    binder(const gguf::file& f, const std::vector<model::tensor_spec>& inventory, std::string who)
        : f_(f), who_(std::move(who)) {
        for (const model::tensor_spec& t : inventory) names_.insert(t.name);
    }
    const gguf::tensor_info* find(const std::string& name, bool optional = false) const {
        require(names_.count(name) == 1, who_ + ": '" + name + "' is not in the model inventory");
        const gguf::tensor_info* t = f_.find_tensor(name);
        require(t != nullptr || optional, who_ + ": tensor '" + name + "' is missing");
        return t;
    }
    // A tensor the reference reads in exactly one type: anything else is refused by name.
    const void* exact(const std::string& name, ggml_type type, bool optional = false) const {
        const gguf::tensor_info* t = find(name, optional);
        if (t == nullptr) return nullptr;
        require(t->type == type, who_ + ": tensor '" + name + "' is " + std::string(type_name(t->type)) +
                                     "; the CPU reference supports only " + std::string(type_name(type)));
        return t->data;
    }
    typed_weight typed(const std::string& name) const {
        const gguf::tensor_info* t = find(name);
        return {t->type, t->data};
    }
    const float* f32(const std::string& n, bool opt = false) const {
        return static_cast<const float*>(exact(n, ggml_type::f32, opt));
    }
    const std::uint16_t* f16(const std::string& n) const {
        return static_cast<const std::uint16_t*>(exact(n, ggml_type::f16));
    }
    const q8_0_block* q8(const std::string& n) const { return static_cast<const q8_0_block*>(exact(n, ggml_type::q8_0)); }
    const std::string& who() const { return who_; }

private:
    const gguf::file& f_;
    std::unordered_set<std::string> names_;
    std::string who_;
};

// The attention and FFN tensors every block has (base layers and the MTP block alike).
void bind_block(const binder& b, const std::string& p, layer_weights& w) {
    w.hc_attn = {b.typed(p + "hc_attn_fn.weight"), b.f32(p + "hc_attn_scale.weight"), b.f32(p + "hc_attn_base.weight")};
    w.hc_ffn = {b.typed(p + "hc_ffn_fn.weight"), b.f32(p + "hc_ffn_scale.weight"), b.f32(p + "hc_ffn_base.weight")};
    w.attn_norm = b.f32(p + "attn_norm.weight");
    w.q_a = b.q8(p + "attn_q_a.weight");
    w.q_a_norm = b.f32(p + "attn_q_a_norm.weight");
    w.q_b = b.q8(p + "attn_q_b.weight");
    w.kv = b.q8(p + "attn_kv.weight");
    w.kv_norm = b.f32(p + "attn_kv_a_norm.weight");
    w.sinks = b.f32(p + "attn_sinks.weight");
    w.out_a = b.q8(p + "attn_output_a.weight");
    w.out_b = b.q8(p + "attn_output_b.weight");
    w.ffn_norm = b.f32(p + "ffn_norm.weight");
    w.gate_inp = b.typed(p + "ffn_gate_inp.weight");
    w.gate_exps = b.typed(p + "ffn_gate_exps.weight");
    w.up_exps = b.typed(p + "ffn_up_exps.weight");
    w.down_exps = b.typed(p + "ffn_down_exps.weight");
    w.sh_gate = b.q8(p + "ffn_gate_shexp.weight");
    w.sh_up = b.q8(p + "ffn_up_shexp.weight");
    w.sh_down = b.q8(p + "ffn_down_shexp.weight");
    // The validator accepts more routed types than the reference has dots for: the q2 model's
    // (IQ2_XXS gate/up, Q2_K down) and the shipped MTP file's (Q4_K throughout).
    const bool q4 = w.gate_exps.type == ggml_type::q4_k && w.down_exps.type == ggml_type::q4_k;
    const bool q2 = w.gate_exps.type == ggml_type::iq2_xxs && w.down_exps.type == ggml_type::q2_k;
    require(w.up_exps.type == w.gate_exps.type && (q4 || q2),
            b.who() + ": routed experts of '" + p + "' are " + std::string(type_name(w.gate_exps.type)) + "/" +
                std::string(type_name(w.up_exps.type)) + "/" + std::string(type_name(w.down_exps.type)) +
                "; the CPU reference supports iq2_xxs/iq2_xxs/q2_K and q4_K/q4_K/q4_K");
    for (const typed_weight* t : {&w.hc_attn.fn, &w.hc_ffn.fn, &w.gate_inp})
        require(t->type == ggml_type::f16 || t->type == ggml_type::f32,
                b.who() + ": an HC fn or router of '" + p + "' is " + std::string(type_name(t->type)) +
                    "; the CPU reference supports f16 and f32");
}

rope_params window_rope(const model::model_dims& d) {
    return make_rope_params(d.rope_freq_base, 1.0f, false, d.n_rot, d.rope_orig_ctx, d.yarn_beta_fast,
                            d.yarn_beta_slow);
}

}  // namespace

model_weights bind_model_weights(const gguf::file& file, const model::model_dims& d) {
    const binder b(file, model::model_inventory(d), "cpu backend");
    model_weights m;
    m.token_embd = b.f16("token_embd.weight");
    m.head = {{b.typed("output_hc_fn.weight"), b.f32("output_hc_scale.weight"), b.f32("output_hc_base.weight")},
              b.f32("output_norm.weight"),
              b.q8("output.weight")};
    for (int il = 0; il < d.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        layer_weights w;
        bind_block(b, p, w);
        const int r = d.ratio_of(il);
        if (r != 0)
            w.attn_comp = {b.f16(p + "attn_compressor_kv.weight"), b.f16(p + "attn_compressor_gate.weight"),
                           b.f16(p + "attn_compressor_ape.weight"), b.f32(p + "attn_compressor_norm.weight")};
        if (r == 4) {
            w.idx_comp = {b.f16(p + "indexer_compressor_kv.weight"), b.f16(p + "indexer_compressor_gate.weight"),
                          b.f16(p + "indexer_compressor_ape.weight"), b.f32(p + "indexer_compressor_norm.weight")};
            w.idx_q_b = b.f16(p + "indexer.attn_q_b.weight");
            w.idx_proj = b.f16(p + "indexer.proj.weight");
        }
        // §10: whether the shipped file carries exp_probs_b.bias on hash layers is open; it is
        // never read there, so it is not bound there.
        if (d.is_hash_layer(il))
            w.tid2eid = static_cast<const std::int32_t*>(b.exact(p + "ffn_gate_tid2eid.weight", ggml_type::i32));
        else
            w.probs_bias = b.f32(p + "exp_probs_b.bias", true);
        // §2.4 step 4: compressed layers use base 160000 with YaRN, window-only layers 10000.
        w.rope = r != 0 ? make_rope_params(d.compress_rope_freq_base, 1.0f / d.rope_scale_factor, true, d.n_rot,
                                           d.rope_orig_ctx, d.yarn_beta_fast, d.yarn_beta_slow)
                        : window_rope(d);
        m.layers.push_back(w);
    }
    return m;
}

mtp_weights bind_mtp_weights(const gguf::file& mtp, const model::model_dims& d, const gguf::file& base) {
    const binder b(mtp, model::mtp_inventory(d), "mtp head");
    const binder bb(base, model::model_inventory(d), "mtp head (base model)");
    mtp_weights m;
    bind_block(b, "mtp.0.", m.block);
    m.block.probs_bias = b.f32("mtp.0.exp_probs_b.bias");  // §4: required in the MTP block
    m.block.rope = window_rope(d);  // §4: window-only semantics, base 10000 without YaRN
    m.e_proj = b.q8("mtp.0.e_proj.weight");
    m.h_proj = b.q8("mtp.0.h_proj.weight");
    m.enorm = b.f32("mtp.0.enorm.weight");
    m.hnorm = b.f32("mtp.0.hnorm.weight");
    // §4: the head mixes with the MTP's own HC weights and norm, then the BASE output matrix.
    m.head = {{b.typed("mtp.0.hc_head_fn.weight"), b.f32("mtp.0.hc_head_scale.weight"), b.f32("mtp.0.hc_head_base.weight")},
              b.f32("mtp.0.norm.weight"),
              bb.q8("output.weight")};
    return m;
}

std::vector<layer_kv> new_layers(const model::model_dims& d, model::kv_page_pool& attn, model::kv_page_pool& idx) {
    std::vector<layer_kv> layers;
    for (int il = 0; il < d.n_layer; ++il) {
        layer_kv k;
        k.raw = model::kv_page_table(attn);
        const int r = d.ratio_of(il);
        if (r != 0) {
            k.comp = model::kv_page_table(attn);
            k.attn_state = make_compressor_state(r, d.head_dim);
        }
        if (r == 4) {
            k.idx = model::kv_page_table(idx);
            k.idx_state = make_compressor_state(4, d.indexer_head_dim);
        }
        layers.push_back(std::move(k));
    }
    return layers;
}

std::vector<layer_kv> new_mtp_layers(model::kv_page_pool& attn) {
    std::vector<layer_kv> layers(1);
    layers[0].raw = model::kv_page_table(attn);
    return layers;
}

cpu_ops::cpu_ops(const model::model_dims& d, const model_weights& w, int retain)
    : d_(d), w_(w), attn_row_{d.head_dim, d.n_rot}, idx_row_{d.indexer_head_dim}, retain_(retain) {}

template <class F>
void cpu_ops::each_row(batch& b, F&& f) const {
    parallel_for(std::int64_t(b.rows.size()), [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) f(b.rows[std::size_t(i)]);
    });
}

void cpu_ops::prepare(batch& b) const {
    for (row_work& r : b.rows) {
        r.X.resize(sz(d_.hc_dim())), r.Y.resize(sz(d_.hc_dim()));
        r.x_in.resize(sz(d_.n_embd)), r.xn.resize(sz(d_.n_embd)), r.sub_out.resize(sz(d_.n_embd));
        r.shared.resize(sz(d_.n_embd));
        r.qr.resize(sz(d_.n_lora_q)), r.qn.resize(sz(d_.n_lora_q));
        r.q.resize(sz(d_.q_dim())), r.o.resize(sz(d_.q_dim())), r.low.resize(sz(d_.lora_o_total()));
        r.probs.resize(sz(d_.n_expert));
        if (r.wants_output) r.logits.resize(sz(d_.n_vocab));
    }
}

void cpu_ops::embed(batch& b) const {
    each_row(b, [&](row_work& r) {
        const std::uint16_t* emb = w_.token_embd + sz(r.token) * sz(d_.n_embd);
        for (int h = 0; h < d_.n_hc; ++h)
            for (int i = 0; i < d_.n_embd; ++i) r.X[sz(h) * sz(d_.n_embd) + sz(i)] = f16_to_f32(emb[i]);
    });
}

// §4: e = RMSNorm(token_embd[token]) * enorm; E = e_proj . e; for each stream s,
// input[s] = E + h_proj . (RMSNorm(prev_hc[s]) * hnorm).
void cpu_ops::mtp_input(batch& b, const mtp_weights& m) const {
    const int E = d_.n_embd;
    each_row(b, [&](row_work& r) {
        std::vector<float> e(sz(E)), Ep(sz(E)), hn(sz(E)), Hs(sz(E));
        const std::uint16_t* emb = w_.token_embd + sz(r.token) * sz(E);
        for (int i = 0; i < E; ++i) e[sz(i)] = f16_to_f32(emb[i]);
        rms_norm(e.data(), m.enorm, E, d_.rms_eps, e.data());
        matvec_q8_0(m.e_proj, e.data(), E, E, Ep.data());
        for (int s = 0; s < d_.n_hc; ++s) {
            rms_norm(r.prev_hc + sz(s) * sz(E), m.hnorm, E, d_.rms_eps, hn.data());
            matvec_q8_0(m.h_proj, hn.data(), E, E, Hs.data());
            for (int i = 0; i < E; ++i) r.X[sz(s) * sz(E) + sz(i)] = Ep[sz(i)] + Hs[sz(i)];
        }
    });
}

void cpu_ops::hc_pre(batch& b, const hc_weights& hc) const {
    each_row(b, [&](row_work& r) { r.split = typed_hc_pre(r.X.data(), hc, d_, r.x_in.data()); });
}

void cpu_ops::hc_post(batch& b, const hc_weights&) const {
    each_row(b, [&](row_work& r) {
        ref::hc_post(r.sub_out.data(), r.X.data(), r.split, d_.n_embd, d_.n_hc, r.Y.data());
        r.X.swap(r.Y);
    });
}

void cpu_ops::attn_norm(batch& b, const layer_weights& w) const {
    each_row(b, [&](row_work& r) { rms_norm(r.x_in.data(), w.attn_norm, d_.n_embd, d_.rms_eps, r.xn.data()); });
}

void cpu_ops::q_path(batch& b, const layer_weights& w, int) const {
    each_row(b, [&](row_work& r) {
        matvec_q8_0(w.q_a, r.xn.data(), d_.n_embd, d_.n_lora_q, r.qr.data());
        rms_norm(r.qr.data(), w.q_a_norm, d_.n_lora_q, d_.rms_eps, r.qn.data());
        matvec_q8_0(w.q_b, r.qn.data(), d_.n_lora_q, d_.q_dim(), r.q.data());
        head_rms_norm(r.q.data(), d_.n_head, d_.head_dim, d_.rms_eps);
        rope_tail(r.q.data(), d_.n_head, d_.head_dim, d_.n_rot, w.rope, std::uint32_t(r.pos), false);
    });
}

// Sequential over the batch: rows of one sequence are contiguous and in position order, and
// each compressor step reads the frontier the previous token left.
void cpu_ops::kv_path(batch& b, const layer_weights& w, int il, int ratio) const {
    const int hd = d_.head_dim;
    std::vector<float> kv(sz(hd)), comp_row(sz(hd)), idx_row(sz(d_.indexer_head_dim));
    for (row_work& r : b.rows) {
        layer_kv& k = (*r.kv)[sz(il)];
        const auto upos = std::uint32_t(r.pos);
        matvec_q8_0(w.kv, r.xn.data(), d_.n_embd, hd, kv.data());
        rms_norm(kv.data(), w.kv_norm, hd, d_.rms_eps, kv.data());
        rope_tail(kv.data(), 1, hd, d_.n_rot, w.rope, upos, false);
        // Steps 5-6: the E4M3 + F16 encode is the reference's kv_row_as_stored (kv_layout's contract).
        model::encode_attention_row(attn_row_, kv.data(), k.raw.row_for_write(r.pos));
        if (ratio != 0 && retain_ > 0) {
            k.history.push_back({r.pos, k.attn_state, k.idx_state, k.n_comp});
            if (int(k.history.size()) > retain_) k.history.pop_front();
        }
        // Step 7: compressed rows come out already in stored form; re-encoding them is exact.
        const bool attn_emit = ratio != 0 && compressor_step(k.attn_state, w.attn_comp, r.xn.data(), d_.n_embd, upos,
                                                             w.rope, d_.n_rot, compressed_row_kind::attention,
                                                             d_.rms_eps, comp_row.data());
        const bool idx_emit = ratio == 4 && compressor_step(k.idx_state, w.idx_comp, r.xn.data(), d_.n_embd, upos,
                                                            w.rope, d_.n_rot, compressed_row_kind::indexer,
                                                            d_.rms_eps, idx_row.data());
        // Both ratio-4 compressors emit on the same tokens, so row c of either cache is window c.
        require(ratio != 4 || attn_emit == idx_emit, "cpu backend: indexer compressor out of step");
        if (attn_emit) model::encode_attention_row(attn_row_, comp_row.data(), k.comp.row_for_write(k.n_comp));
        if (idx_emit) model::encode_indexer_row(idx_row_, idx_row.data(), k.idx.row_for_write(k.n_comp));
        if (attn_emit) ++k.n_comp;
        r.n_comp_visible = k.n_comp;
    }
}

// §2.6: the indexer masks compressed rows only once a row sees more than top_k of them.
void cpu_ops::indexer_select(batch& b, const layer_weights& w, int il) const {
    each_row(b, [&](row_work& r) {
        r.mask.clear();
        const int n_comp = int(r.n_comp_visible);
        if (n_comp <= d_.indexer_top_k) return;
        const layer_kv& k = (*r.kv)[sz(il)];
        std::vector<float> keys(sz(n_comp) * sz(d_.indexer_head_dim));
        for (int c = 0; c < n_comp; ++c)
            model::decode_indexer_row(idx_row_, k.idx.row(c), keys.data() + sz(c) * sz(d_.indexer_head_dim));
        r.mask = indexer_mask(w.idx_q_b, w.idx_proj, r.qn.data(), r.xn.data(), keys.data(), n_comp, d_.n_lora_q,
                              d_.n_embd, d_.n_indexer_head, d_.indexer_top_k, std::uint32_t(r.pos), w.rope);
    });
}

// Steps 9-10: raw window oldest -> newest, then the visible compressed rows ascending, in the
// fixed split order of kernels/attention_decode.cuh (spec decision 1: the reference replays the
// kernel's order), so the CUDA backend's exact mode gives these bits. The split's chunks are
// fixed by compressed-row index, so the rows go in whole with the indexer's mask.
void cpu_ops::attention(batch& b, const layer_weights& w, int il, int ratio) const {
    const int hd = d_.head_dim;
    each_row(b, [&](row_work& r) {
        const layer_kv& k = (*r.kv)[sz(il)];
        const int n_raw = std::min(r.pos + 1 - r.window_start, d_.n_swa);
        std::vector<float> raw_f(sz(n_raw) * sz(hd));
        for (int i = 0; i < n_raw; ++i)
            model::decode_attention_row(attn_row_, k.raw.row(r.pos + 1 - n_raw + i), raw_f.data() + sz(i) * sz(hd));
        const int n_comp = ratio != 0 ? int(r.n_comp_visible) : 0;
        const bool masked = ratio == 4 && !r.mask.empty();
        std::vector<float> comp_f(sz(n_comp) * sz(hd));
        for (int c = 0; c < n_comp; ++c) model::decode_attention_row(attn_row_, k.comp.row(c), comp_f.data() + sz(c) * sz(hd));
        attention_decode_split(r.q.data(), raw_f.data(), n_raw, comp_f.data(), n_comp, masked ? r.mask.data() : nullptr,
                               w.sinks, d_.n_head, hd, d_.n_rot, w.rope, std::uint32_t(r.pos), r.o.data());
    });
}

// Step 11: group g's heads are one contiguous input; its n_lora_o rows of out_a follow.
void cpu_ops::out_proj(batch& b, const layer_weights& w) const {
    const int gin = d_.group_in(), blocks_per_row = gin / q8_0_block_size;
    each_row(b, [&](row_work& r) {
        for (int g = 0; g < d_.n_out_group; ++g)
            matvec_q8_0(w.out_a + sz(g) * sz(d_.n_lora_o) * sz(blocks_per_row), r.o.data() + sz(g) * sz(gin), gin,
                        d_.n_lora_o, r.low.data() + sz(g) * sz(d_.n_lora_o));
        matvec_q8_0(w.out_b, r.low.data(), d_.lora_o_total(), d_.n_embd, r.sub_out.data());
    });
}

void cpu_ops::ffn_norm(batch& b, const layer_weights& w) const {
    each_row(b, [&](row_work& r) { rms_norm(r.x_in.data(), w.ffn_norm, d_.n_embd, d_.rms_eps, r.xn.data()); });
}

void cpu_ops::route(batch& b, const layer_weights& w, bool hashed) const {
    each_row(b, [&](row_work& r) {
        if (w.gate_inp.type == ggml_type::f16) {
            router_probs(static_cast<const std::uint16_t*>(w.gate_inp.data), r.xn.data(), d_.n_embd, d_.n_expert,
                         r.probs.data());
        } else {
            matvec_dense(w.gate_inp, r.xn.data(), d_.n_embd, d_.n_expert, r.probs.data());
            for (float& p : r.probs) p = std::sqrt(softplus(p));  // router_probs' activation
        }
        r.route = hashed ? route_hash(r.probs.data(), w.tid2eid + sz(r.token) * sz(d_.n_expert_used), d_.n_expert_used,
                                      d_.expert_weights_scale)
                         : route_top_k(r.probs.data(), w.probs_bias, d_.n_expert, d_.n_expert_used,
                                       d_.expert_weights_scale);
    });
}

void cpu_ops::routed_experts(batch& b, const layer_weights& w) const {
    each_row(b, [&](row_work& r) {
        if (w.gate_exps.type == ggml_type::q4_k)
            moe_routed(static_cast<const q4_k_block*>(w.gate_exps.data), static_cast<const q4_k_block*>(w.up_exps.data),
                       static_cast<const q4_k_block*>(w.down_exps.data), r.route, r.xn.data(), d_.n_embd, d_.n_ff_exp,
                       d_.swiglu_clamp_exp, r.sub_out.data());
        else
            moe_routed(static_cast<const iq2_xxs_block*>(w.gate_exps.data),
                       static_cast<const iq2_xxs_block*>(w.up_exps.data), static_cast<const q2_k_block*>(w.down_exps.data),
                       r.route, r.xn.data(), d_.n_embd, d_.n_ff_exp, d_.swiglu_clamp_exp, r.sub_out.data());
    });
}

void cpu_ops::shared_expert(batch& b, const layer_weights& w) const {
    each_row(b, [&](row_work& r) {
        ref::shared_expert(w.sh_gate, w.sh_up, w.sh_down, r.xn.data(), d_.n_embd, d_.n_ff_exp, d_.swiglu_clamp_exp,
                           r.shared.data());
        for (int i = 0; i < d_.n_embd; ++i) r.sub_out[sz(i)] += r.shared[sz(i)];
    });
}

// Raw rows that left the window (and the rollback margin) give their pages back; a snapshot
// keeps the last n_swa.
void cpu_ops::layer_done(batch& b, int il) const {
    for (row_work& r : b.rows)
        (*r.kv)[sz(il)].raw.drop_before(std::int64_t(r.pos) + 1 - d_.n_swa - retain_);
}

void cpu_ops::output_head(batch& b, const head_weights& h) const {
    each_row(b, [&](row_work& r) {
        if (!r.wants_output) return;
        std::vector<float> e(sz(d_.n_embd));
        typed_output_hc_mix(r.X.data(), h.hc, d_, e.data());
        rms_norm(e.data(), h.norm, d_.n_embd, d_.rms_eps, e.data());
        matvec_q8_0(h.output, e.data(), d_.n_embd, d_.n_vocab, r.logits.data());
    });
}

}  // namespace ds4::ref
