#pragma once
// The CPU reference's op set for the layer program of ds4/graph/layer_program.hpp: each op is
// the reference functions of one step of docs/model.md §2, applied to every row of a batch.
// Rows are independent except in kv_path, which runs each sequence's rows in position order
// (the compressors carry state from token to token); the other ops split rows over threads,
// each row computed by the same sequential code, so thread count never changes a bit.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "ds4/core/rope.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/gguf/reader.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/shape.hpp"
#include "reference/compressor.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/moe.hpp"

namespace ds4::ref {

// A weight whose GGML type the file chooses among those the validator allows (the MTP file's
// HC fns and router are F16 or F32; routed experts are the q2 model's or Q4_K).
struct typed_weight {
    ggml_type type = ggml_type::f32;
    const void* data = nullptr;
};

struct hc_weights {
    typed_weight fn;
    const float* scale = nullptr;
    const float* base = nullptr;
};

struct layer_weights {
    hc_weights hc_attn, hc_ffn;
    const float* attn_norm = nullptr;
    const q8_0_block* q_a = nullptr;
    const float* q_a_norm = nullptr;
    const q8_0_block* q_b = nullptr;
    const q8_0_block* kv = nullptr;
    const float* kv_norm = nullptr;
    const float* sinks = nullptr;
    const q8_0_block* out_a = nullptr;
    const q8_0_block* out_b = nullptr;
    compressor_weights attn_comp{};
    compressor_weights idx_comp{};
    const std::uint16_t* idx_q_b = nullptr;
    const std::uint16_t* idx_proj = nullptr;
    const float* ffn_norm = nullptr;
    typed_weight gate_inp;
    const float* probs_bias = nullptr;  // optional (treated as 0)
    typed_weight gate_exps, up_exps, down_exps;
    const q8_0_block* sh_gate = nullptr;
    const q8_0_block* sh_up = nullptr;
    const q8_0_block* sh_down = nullptr;
    const std::int32_t* tid2eid = nullptr;
    rope_params rope{};
};

struct head_weights {
    hc_weights hc;  // the output HC mix (fn [n_hc*n_embd, n_hc], scale [1], base [n_hc])
    const float* norm = nullptr;
    const q8_0_block* output = nullptr;
};

struct mtp_weights {
    layer_weights block;
    head_weights head;
    const q8_0_block* e_proj = nullptr;
    const q8_0_block* h_proj = nullptr;
    const float* enorm = nullptr;
    const float* hnorm = nullptr;
};

// Every tensor of the base model bound by its inventory name (the validator checked each).
struct model_weights {
    const std::uint16_t* token_embd = nullptr;
    std::vector<layer_weights> layers;
    head_weights head;
};
model_weights bind_model_weights(const gguf::file& file, const model::model_dims& d);
mtp_weights bind_mtp_weights(const gguf::file& mtp, const model::model_dims& d, const gguf::file& base);

// The compressors' state of one layer just before the token at `pos`: what truncate() restores.
struct frontier {
    std::int32_t pos = 0;
    compressor_state attn_state, idx_state;
    std::int64_t n_comp = 0;
};

// One layer's KV of one sequence: paged native rows and the compressors' F32 frontiers (§3.1),
// with the frontiers of the last `retain` tokens for rollback.
struct layer_kv {
    model::kv_page_table raw, comp, idx;
    compressor_state attn_state, idx_state;
    std::int64_t n_comp = 0;
    std::deque<frontier> history;
};

// The layers of a new sequence: empty tables over the pools, compressors at their initial state.
std::vector<layer_kv> new_layers(const model::model_dims& d, model::kv_page_pool& attn, model::kv_page_pool& idx);
// The MTP block's window: one layer of raw rows.
std::vector<layer_kv> new_mtp_layers(model::kv_page_pool& attn);

// One row of a batch: where it writes, and its activations between ops.
struct row_work {
    std::vector<layer_kv>* kv = nullptr;  // the sequence's layers (the MTP's own single layer)
    std::int32_t pos = 0;
    std::int32_t token = 0;
    bool wants_output = false;
    std::int32_t window_start = 0;    // the first position the raw window may hold (MTP restarts)
    std::vector<float> X, Y, x_in, xn, qr, qn, q, o, low, sub_out, shared, probs, logits;
    hc_split split{};
    moe_route route{};
    std::int64_t n_comp_visible = 0;  // compressed rows emitted up to and including this row
    std::vector<std::uint8_t> mask;   // indexer selection (empty: every compressed row)
    const float* prev_hc = nullptr;   // MTP input: the previous HC state
};

class cpu_ops {
public:
    struct batch {
        std::vector<row_work> rows;  // each sequence's rows contiguous and in position order
    };
    using layer_weights = ref::layer_weights;
    using head_weights = ref::head_weights;
    using mtp_weights = ref::mtp_weights;

    // `retain` extra raw rows stay past the window so that truncate() can roll back.
    cpu_ops(const model::model_dims& d, const model_weights& w, int retain);

    void prepare(batch& b) const;  // sizes every row's buffers
    const layer_weights& layer(int il) const { return w_.layers[std::size_t(il)]; }
    const head_weights& head() const { return w_.head; }

    void embed(batch& b) const;
    void mtp_input(batch& b, const mtp_weights& m) const;
    void hc_pre(batch& b, const hc_weights& hc) const;
    void hc_post(batch& b, const hc_weights& hc) const;
    void attn_norm(batch& b, const layer_weights& w) const;
    void q_path(batch& b, const layer_weights& w, int ratio) const;
    void kv_path(batch& b, const layer_weights& w, int il, int ratio) const;
    void indexer_select(batch& b, const layer_weights& w, int il) const;
    void attention(batch& b, const layer_weights& w, int il, int ratio) const;
    void out_proj(batch& b, const layer_weights& w) const;
    void ffn_norm(batch& b, const layer_weights& w) const;
    void route(batch& b, const layer_weights& w, bool hashed) const;
    void routed_experts(batch& b, const layer_weights& w) const;
    void shared_expert(batch& b, const layer_weights& w) const;
    void layer_done(batch& b, int il) const;
    void output_head(batch& b, const head_weights& h) const;

private:
    template <class F>
    void each_row(batch& b, F&& f) const;

    const model::model_dims& d_;
    const model_weights& w_;
    model::attention_row_layout attn_row_;
    model::indexer_row_layout idx_row_;
    int retain_;
};

}  // namespace ds4::ref
