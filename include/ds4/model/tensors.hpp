#pragma once
// The tensor inventory of the shipped q2 model (docs/model.md §5.3) and of its MTP file (§4), as a
// function of the shape. For each tensor: its exact name, the type the shipped file uses (and
// ds4-synth writes), the types a loader accepts, its dims (ne0 first) and its presence rule.
// The validator and the synthetic generator both walk this one list, so a file ds4-synth
// writes is, by construction, a file the validator accepts.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/format/types.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::model {

enum class presence {
    always,      // every layer
    ratio4,      // layers with compress ratio 4 (indexer layers)
    compressed,  // layers with compress ratio != 0
    hash,        // layers L < n_hash_layer
    optional,    // may be absent (exp_probs_b.bias on the base model's non-hash layers)
};

constexpr std::string_view presence_name(presence p) {
    switch (p) {
        case presence::always: return "all";
        case presence::ratio4: return "ratio 4";
        case presence::compressed: return "ratio != 0";
        case presence::hash: return "L < n_hash";
        case presence::optional: return "optional";
    }
    return "?";
}

struct tensor_spec {
    std::string name;                      // full GGUF name, e.g. "blk.7.attn_q_b.weight"
    std::string base;                      // name without the "blk.L." / "mtp.0." prefix
    int layer = -1;                        // -1 for the global tensors
    ggml_type type = ggml_type::f32;       // what the shipped file uses
    std::vector<ggml_type> accepted;       // what a loader accepts (always contains `type`)
    std::vector<std::uint64_t> dims;       // ne0 first
    presence when = presence::always;
    std::string same_type_as;              // non-empty: must share its type with that tensor

    bool required() const { return when != presence::optional; }
    bool accepts(ggml_type t) const {
        for (ggml_type a : accepted)
            if (a == t) return true;
        return false;
    }
    std::uint64_t n_elements() const {
        std::uint64_t n = 1;
        for (std::uint64_t d : dims) n *= d;
        return n;
    }
    // Bytes of the tensor stored as `type` (every ne0 here is a whole number of blocks).
    std::uint64_t n_bytes() const { return bytes_as(type); }
    std::uint64_t bytes_as(ggml_type t) const {
        const auto g = geometry_of(static_cast<std::uint32_t>(t));
        require(g.has_value(), "tensor " + name + ": unknown type");
        return n_elements() / g->block_elems * g->block_bytes;
    }
};

// Routed experts may be any of these; gate and up must share one (ds4.c:2415-2418).
inline const std::vector<ggml_type>& routed_expert_types() {
    static const std::vector<ggml_type> types{ggml_type::iq2_xxs, ggml_type::q2_k, ggml_type::q4_k};
    return types;
}

namespace detail {

// Appends the tensors of one transformer block. `prefix` is "blk.L." or "mtp.0."; the MTP block
// is a window-only layer with a required router bias and its own expert/HC types (§4).
class block_builder {
public:
    block_builder(std::vector<tensor_spec>& out, const model_dims& d, std::string prefix, int layer)
        : out_(out), d_(d), prefix_(std::move(prefix)), layer_(layer) {}

    void add(std::string_view base, ggml_type type, std::vector<std::uint64_t> dims,
             presence when = presence::always, std::vector<ggml_type> accepted = {},
             std::string_view same_type_as = {}) {
        tensor_spec t;
        t.name = prefix_ + std::string(base);
        t.base = base;
        t.layer = layer_;
        t.type = type;
        t.accepted = accepted.empty() ? std::vector<ggml_type>{type} : std::move(accepted);
        t.dims = std::move(dims);
        t.when = when;
        if (!same_type_as.empty()) t.same_type_as = prefix_ + std::string(same_type_as);
        out_.push_back(std::move(t));
    }

    // The tensors every block has, in the order llama.cpp-style converters emit them.
    void common(bool mtp, ggml_type expert_gate_up, ggml_type expert_down) {
        using enum ggml_type;
        const std::uint64_t e = static_cast<std::uint64_t>(d_.n_embd);
        // The base model stores HC mixers as F16; the MTP file stores them as F32 (its name says
        // "F32"), and ds4 accepts either there.
        const ggml_type hc_fn = mtp ? f32 : f16;
        const std::vector<ggml_type> hc_fn_ok = mtp ? std::vector{f16, f32} : std::vector{f16};
        const auto hc = static_cast<std::uint64_t>(d_.hc_dim());
        const auto mix = static_cast<std::uint64_t>(d_.hc_mix());
        add("hc_attn_fn.weight", hc_fn, {hc, mix}, presence::always, hc_fn_ok);
        add("hc_attn_scale.weight", f32, {3});
        add("hc_attn_base.weight", f32, {mix});
        add("attn_norm.weight", f32, {e});
        add("attn_q_a.weight", q8_0, {e, u(d_.n_lora_q)});
        add("attn_q_a_norm.weight", f32, {u(d_.n_lora_q)});
        add("attn_q_b.weight", q8_0, {u(d_.n_lora_q), u(d_.q_dim())});
        add("attn_kv.weight", q8_0, {e, u(d_.head_dim)});
        add("attn_kv_a_norm.weight", f32, {u(d_.head_dim)});
        add("attn_sinks.weight", f32, {u(d_.n_head)});
        // Grouped output projection (§2.4 step 11): each group's input is its heads' outputs
        // (n_head/n_out_group x head_dim); rows g*n_lora_o.. of the output belong to group g.
        add("attn_output_a.weight", q8_0, {u(d_.group_in()), u(d_.lora_o_total())});
        add("attn_output_b.weight", q8_0, {u(d_.lora_o_total()), e});
        if (!mtp) compressors();
        add("hc_ffn_fn.weight", hc_fn, {hc, mix}, presence::always, hc_fn_ok);
        add("hc_ffn_scale.weight", f32, {3});
        add("hc_ffn_base.weight", f32, {mix});
        add("ffn_norm.weight", f32, {e});
        add("ffn_gate_inp.weight", mtp ? f32 : f16, {e, u(d_.n_expert)}, presence::always,
            mtp ? std::vector{f16, f32} : std::vector{f16});
        // The HF checkpoint carries a router bias only on learned-routing layers; the MTP block
        // requires it (ds4.c mtp_weights_bind).
        if (mtp)
            add("exp_probs_b.bias", f32, {u(d_.n_expert)});
        else if (!d_.is_hash_layer(layer_))
            add("exp_probs_b.bias", f32, {u(d_.n_expert)}, presence::optional);
        // Experts are [in, out, n_expert]: expert e is one contiguous [in, out] slab, which is
        // what lets a kernel read only the six selected experts (§5.3 expert slicing).
        const auto ff = u(d_.n_ff_exp), ne = u(d_.n_expert);
        add("ffn_gate_exps.weight", expert_gate_up, {e, ff, ne}, presence::always, routed_expert_types());
        add("ffn_up_exps.weight", expert_gate_up, {e, ff, ne}, presence::always, routed_expert_types(),
            "ffn_gate_exps.weight");
        add("ffn_down_exps.weight", expert_down, {ff, e, ne}, presence::always, routed_expert_types());
        add("ffn_gate_shexp.weight", q8_0, {e, ff});
        add("ffn_up_shexp.weight", q8_0, {e, ff});
        add("ffn_down_shexp.weight", q8_0, {ff, e});
        // Row t of the hash table is token t's six experts, in slot order.
        if (!mtp && d_.is_hash_layer(layer_))
            add("ffn_gate_tid2eid.weight", i32, {u(d_.n_expert_used), u(d_.n_vocab)}, presence::hash);
    }

private:
    static std::uint64_t u(int v) { return static_cast<std::uint64_t>(v); }

    // Attention compressor (ratio != 0) and indexer (ratio 4), §2.5-2.6.
    void compressors() {
        using enum ggml_type;
        const int r = d_.ratio_of(layer_);
        if (r == 0) return;
        const std::uint64_t e = u(d_.n_embd);
        // The ratio-4 compressor projects two halves (previous and current window) per token,
        // hence twice the width; ape holds one w-wide positional bias per position in the window.
        const auto w = u(d_.compressor_width(r, d_.head_dim));
        add("attn_compressor_ape.weight", f16, {w, u(r)}, presence::compressed);
        add("attn_compressor_kv.weight", f16, {e, w}, presence::compressed);
        add("attn_compressor_gate.weight", f16, {e, w}, presence::compressed);
        add("attn_compressor_norm.weight", f32, {u(d_.head_dim)}, presence::compressed);
        if (r != 4) return;
        // The indexer has its own ratio-4 compressor over 128-wide keys, and a q projection from
        // the same low-rank q (qn) the attention uses.
        const auto iw = u(d_.compressor_width(4, d_.indexer_head_dim));
        add("indexer.attn_q_b.weight", f16, {u(d_.n_lora_q), u(d_.indexer_q_dim())}, presence::ratio4);
        add("indexer.proj.weight", f16, {e, u(d_.n_indexer_head)}, presence::ratio4);
        add("indexer_compressor_ape.weight", f16, {iw, 4}, presence::ratio4);
        add("indexer_compressor_kv.weight", f16, {e, iw}, presence::ratio4);
        add("indexer_compressor_gate.weight", f16, {e, iw}, presence::ratio4);
        add("indexer_compressor_norm.weight", f32, {u(d_.indexer_head_dim)}, presence::ratio4);
    }

    std::vector<tensor_spec>& out_;
    const model_dims& d_;
    std::string prefix_;
    int layer_;
};

}  // namespace detail

// The base model: token_embd, the blocks in layer order, then the output head.
// (The shipped file's own order is not part of the contract: ds4 finds tensors by name.)
inline std::vector<tensor_spec> model_inventory(const model_dims& d) {
    using enum ggml_type;
    require(static_cast<int>(d.compress_ratios.size()) >= d.n_layer,
            "model_inventory: compress_ratios has fewer entries than n_layer");
    std::vector<tensor_spec> out;
    const auto e = static_cast<std::uint64_t>(d.n_embd), v = static_cast<std::uint64_t>(d.n_vocab);
    const auto hc = static_cast<std::uint64_t>(d.hc_dim()), nhc = static_cast<std::uint64_t>(d.n_hc);
    detail::block_builder global(out, d, "", -1);
    global.add("token_embd.weight", f16, {e, v});
    for (int il = 0; il < d.n_layer; ++il)
        detail::block_builder(out, d, "blk." + std::to_string(il) + ".", il).common(false, iq2_xxs, q2_k);
    global.add("output_hc_base.weight", f32, {nhc});
    global.add("output_hc_fn.weight", f16, {hc, nhc});
    global.add("output_hc_scale.weight", f32, {1});
    global.add("output_norm.weight", f32, {e});
    global.add("output.weight", q8_0, {e, v});
    return out;
}

// The MTP file (§4): the head projections, its own HC head, and one window-only block. It has no
// embedding or output matrix of its own (it reuses the base model's).
inline std::vector<tensor_spec> mtp_inventory(const model_dims& d) {
    using enum ggml_type;
    std::vector<tensor_spec> out;
    const auto e = static_cast<std::uint64_t>(d.n_embd);
    const auto hc = static_cast<std::uint64_t>(d.hc_dim()), nhc = static_cast<std::uint64_t>(d.n_hc);
    // The MTP block is layer n_layer of the HF checkpoint: window-only, learned routing.
    detail::block_builder b(out, d, "mtp.0.", d.n_layer);
    b.add("e_proj.weight", q8_0, {e, e});
    b.add("h_proj.weight", q8_0, {e, e});
    b.add("enorm.weight", f32, {e});
    b.add("hnorm.weight", f32, {e});
    b.add("norm.weight", f32, {e});
    b.add("hc_head_base.weight", f32, {nhc});
    b.add("hc_head_fn.weight", f32, {hc, nhc}, presence::always, {f16, f32});
    b.add("hc_head_scale.weight", f32, {1});
    b.common(true, q4_k, q4_k);
    return out;
}

inline std::uint64_t total_bytes(const std::vector<tensor_spec>& inventory) {
    std::uint64_t n = 0;
    for (const tensor_spec& t : inventory) n += t.n_bytes();
    return n;
}

}  // namespace ds4::model
