#pragma once
// The model's forward pass (docs/model.md §2, §4, §9), written once for every backend.
//
// The program is a template over a layer-rule policy (which layers compress, by which ratio,
// which are hash-routed) and an op set. An op set is a small type with one member per step of
// the layer; the CPU reference backend implements it with the reference functions, the CUDA
// backend with kernel launches on a stream. A fused kernel (q_path in one launch, say) is one op
// of its set, never a second copy of the program.
//
// The program runs a whole batch of rows layer by layer: every op applies to every row of the
// batch. A row only reads KV rows at positions up to its own, and the KV path writes each
// sequence's rows in position order before attention reads them, so this order gives the same
// bits as running the rows one token at a time through every layer.
//
// An op set provides:
//   types    batch, layer_weights (with members hc_attn and hc_ffn), head_weights, mtp_weights
//   embed(b)                          token embeddings into the n_hc streams (§2.1)
//   hc_pre(b, hc) / hc_post(b, hc)    hyper-connection mix around a sublayer (§2.2, §2.3)
//   attn_norm(b, w)                   §2.4 step 1
//   q_path(b, w, ratio)               q_a, norm, q_b, per-head norm, RoPE (steps 2-4)
//   kv_path(b, w, il, ratio)          kv, norm, RoPE, native store, compressors (steps 4-7, §2.5)
//   indexer_select(b, w, il)          the indexer's per-row top-k of compressed rows (§2.6)
//   attention(b, w, il, ratio)        window + visible compressed rows with sinks (steps 9-10)
//   out_proj(b, w)                    grouped out_a, out_b (step 11)
//   ffn_norm(b, w), route(b, w, hashed), routed_experts(b, w), shared_expert(b, w)   §2.7
//   layer_done(b, il)                 per-layer bookkeeping (window pages that left the window)
//   output_head(b, head)              output HC mix, norm, vocabulary projection (§2.8)
//   mtp_input(b, mtp)                 the MTP block's input streams from token and previous HC (§4)
#include "ds4/model/shape.hpp"

namespace ds4::graph {

// The layer rules of the base model, read from its run-time dims (every shape, custom ones too).
struct base_layer_rules {
    const model::model_dims& d;
    int n_layer() const { return d.n_layer; }
    int ratio_of(int il) const { return d.ratio_of(il); }
    bool is_hash_layer(int il) const { return d.is_hash_layer(il); }
};

// The same rules fixed at compile time by a shape policy, for op sets specialised on one shape.
template <class Shape>
struct static_layer_rules {
    static constexpr int n_layer() { return Shape::n_layer; }
    static constexpr int ratio_of(int il) { return model::ratio_of<Shape>(il); }
    static constexpr bool is_hash_layer(int il) { return il < Shape::n_hash_layer; }
};

// The MTP block (§4): one layer with the semantics of a window-only layer (ratio 0, RoPE base
// 10000 without YaRN) and learned top-k routing (no hash table).
struct mtp_layer_rules {
    static constexpr int n_layer() { return 1; }
    static constexpr int ratio_of(int) { return 0; }
    static constexpr bool is_hash_layer(int) { return false; }
};

template <class Rules, class Ops>
void attention_sublayer(const Rules& rules, Ops& ops, typename Ops::batch& b,
                        const typename Ops::layer_weights& w, int il) {
    const int ratio = rules.ratio_of(il);
    ops.hc_pre(b, w.hc_attn);
    ops.attn_norm(b, w);
    ops.q_path(b, w, ratio);
    // The compressors run before attention so that a token sees a compressed row including itself.
    ops.kv_path(b, w, il, ratio);
    // Only ratio-4 layers have an indexer; it masks compressed rows once there are more than top_k.
    if (ratio == 4) ops.indexer_select(b, w, il);
    ops.attention(b, w, il, ratio);
    ops.out_proj(b, w);
    ops.hc_post(b, w.hc_attn);
}

template <class Rules, class Ops>
void ffn_sublayer(const Rules& rules, Ops& ops, typename Ops::batch& b, const typename Ops::layer_weights& w,
                  int il) {
    ops.hc_pre(b, w.hc_ffn);
    ops.ffn_norm(b, w);
    ops.route(b, w, rules.is_hash_layer(il));
    ops.routed_experts(b, w);
    ops.shared_expert(b, w);  // adds the shared expert's output to the routed sum: F = moe + shared
    ops.hc_post(b, w.hc_ffn);
}

template <class Rules, class Ops>
void decoder_layer(const Rules& rules, Ops& ops, typename Ops::batch& b, const typename Ops::layer_weights& w,
                   int il) {
    attention_sublayer(rules, ops, b, w, il);
    ffn_sublayer(rules, ops, b, w, il);
}

// The base model for a batch of rows: embedding, every layer, the output head for the rows that
// want output. The final HC state is in the batch for the op set to keep (the MTP input).
template <class Rules, class Ops>
void forward(const Rules& rules, Ops& ops, typename Ops::batch& b) {
    ops.embed(b);
    for (int il = 0; il < rules.n_layer(); ++il) {
        decoder_layer(rules, ops, b, ops.layer(il), il);
        ops.layer_done(b, il);
    }
    ops.output_head(b, ops.head());
}

// One MTP draft step for a batch of rows: the input streams from (token, previous HC state),
// the MTP block as a window-only layer, and the head with the MTP's own HC mix and norm.
template <class Ops>
void mtp_forward(Ops& ops, typename Ops::batch& b, const typename Ops::mtp_weights& m) {
    const mtp_layer_rules rules;
    ops.mtp_input(b, m);
    decoder_layer(rules, ops, b, m.block, 0);
    ops.layer_done(b, 0);
    ops.output_head(b, m.head);
}

}  // namespace ds4::graph
