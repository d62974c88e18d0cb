#pragma once
// The CUDA op set of the layer program (ds4/graph/layer_program.hpp): every op is kernel launches
// on one stream over a sub-batch of rows, reading
// activations from a workspace allocated once and per-row inputs (tokens, positions, page tables,
// visible compressed-row counts) from device memory the backend uploads per step. Every kernel
// but the tensor-core attention equals its reference function bit for bit; in exact mode the
// attention is attention_decode.cuh, whose fixed split order the CPU op set replays
// (reference/attention_split), so the op set computes the CPU reference's bits.
//
// A sub-batch's rows are in the backend's order: each sequence's rows contiguous and in position
// order. Every per-row array has `capacity` entries (a power of two); rows past n are idle.
// Small sub-batches (capacity <= max_sub_rows, any rows) run the decode kernels as they are. Chunk
// sub-batches (up to chunk_rows rows, none of which wants output: prefill) run the dense Q8_0
// projections as int8 tensor-core GEMMs (gemm_q8_0.cuh), the F16 ones as gemm_f16.cuh, the routed
// MoE as moe_gemm.cuh, the row-wise kernels once over the chunk, and the attention in launches of
// up to attn_group rows (exact mode: slices of max_sub_rows rows). Every kernel computes each row
// alone and exactly (the tensor-core attention by its fixed split), so a row's result never
// depends on the sub-batch it lands in.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cuda/device_weights.hpp"
#include "backends/cuda/op_profiler.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::kernels {
struct hc_pre_launch;
}

namespace ds4::cuda_backend {

inline constexpr int max_sub_rows = 16;
inline constexpr int default_chunk_rows = 2048;

// The position an idle row carries in a step's upos array (the compressor skips it): defined in
// cuda_ops.cu, so that the backend's host code does not include the compressor's kernels.
std::uint32_t compressor_idle_position();

// One sequence's compressor state on the device: per compressed layer, the live frontier and a
// ring of `ring` saved frontiers (truncate's history), each kv then score, rows x width floats.
struct compressor_slots {
    struct layer {
        float* attn = nullptr;  // (1 + ring) x 2 x attn_floats: slot 0 live, slot 1 + (pos % ring) saved
        float* idx = nullptr;
        std::size_t attn_floats = 0, idx_floats = 0;  // rows x width of one of kv / score
    };
    std::vector<layer> layers;
    int ring = 0;
    float* block = nullptr;  // the one allocation every layer's pointers above point into
};

// A sequence's run of rows inside a sub-batch.
struct sequence_run {
    int first_row = 0, n_rows = 0;
    std::int32_t first_pos = 0;
    std::int32_t save_from = 0;  // rows at positions >= save_from save their frontier first
    const compressor_slots* state = nullptr;
    // The first row saves, and the backend saved every layer's frontier for it before the
    // sub-batch ran: kv_path skips that save.
    bool first_saved = false;
    // The rows nobody can roll back to (before save_from): a chunk's compressors take them in one
    // chunk launch, and the rest one row after another, each saving its frontier first.
    int plain_rows() const { return std::clamp(save_from - first_pos, 0, n_rows); }
};

struct sub_batch {
    int n = 0, capacity = 1;
    // Device arrays of `capacity` entries (the first n live) unless noted.
    const std::int32_t* n_live = nullptr;   // scalar: n
    const std::int32_t* tokens = nullptr;
    const std::int32_t* pos = nullptr;
    const std::uint32_t* upos = nullptr;    // positions, idle rows = compressor_idle
    const std::int32_t* row_slot = nullptr; // r for live rows, -1 idle (kv_store's sequence slot)
    const std::int32_t* one = nullptr;      // 1 for live rows, 0 idle (attention query rows)
    const std::int32_t* iota = nullptr;     // r
    const std::int32_t* n_comp = nullptr;   // [n_layer][capacity] compressed rows each row sees
    // Per-row page tables, [n_layer][capacity][stride]: every row of a sequence holds its table.
    const std::int32_t* raw_tables = nullptr;
    const std::int32_t* comp_tables = nullptr;
    const std::int32_t* idx_tables = nullptr;
    // Every row's sequence state block (compressor_slots::block; idle rows null): the decode
    // compressor finds each row's frontier through it on the device.
    float* const* row_state = nullptr;
    // The compressors' run form: run_rows[r] is the length of the run of one sequence's rows it
    // takes in order starting at row r (0 elsewhere): a decode sub-batch's whole runs, a chunk
    // sub-batch's rows from plain_rows() on (after the chunk launch, tail_runs); save_slot[r] >= 0
    // is the frontier slot row r saves into before its compressor update (a run's later rows; a
    // first row's save is done before the sub-batch, for every layer at once).
    const std::int32_t* run_rows = nullptr;
    const std::int32_t* save_slot = nullptr;
    int raw_stride = 1, comp_stride = 1;
    int max_comp = 0;  // the largest n_comp of any row and layer
    bool any_output = true;  // false: no row wants output, the head is skipped (prefill chunks)
    std::vector<sequence_run> runs;
    // Every run is at most max_sub_rows rows (decode rows, or a decode row and its verify rows):
    // the compressors take one launch for all rows, through row_state, a run's rows in order in
    // one block with their frontier saves described by run_rows and save_slot, and nothing in the
    // sub-batch depends on which sequences fill it or how its rows split into runs (a captured
    // graph replays for any of them).
    bool decode = false;
    bool multi_row_runs = false;  // some run has several rows (decode path: the compressors' run form)
    // A chunk sub-batch's rows that save their frontiers go through the run form, one launch a
    // run, not a chunk launch and one or two copies each (DS4_COMPRESSOR_TAIL=0: the latter).
    bool tail_runs = false;
    // Captured by capacity (graph_key): a launch that takes a host row count gets `capacity`
    // (host_rows); the kernels mask idle rows through n_live, or compute them into rows nobody
    // reads (the matvecs: rows are independent, nothing is indexed by an activation).
    bool bucketed = false;
    int host_rows() const { return bucketed ? capacity : n; }
    // Activations: X and Y swap at every hc post.
    float* X = nullptr;
    float* Y = nullptr;
    // The last sublayer's hc post is owed to the next hc pre, which folds it in: X is the state
    // before that hc post (cuda_ops::hc_post).
    bool post_owed = false;
    // The last hc post (a chunk's) formed X's row scales into the op set's buffer, which the next
    // chunk hc pre reads instead of forming them (kernels::hc_post_launch::row_scale).
    bool scales_ready = false;
};

class cuda_ops {
public:
    using batch = sub_batch;
    using layer_weights = cuda_backend::layer_weights;
    using head_weights = cuda_backend::head_weights;
    struct mtp_weights {};  // the CUDA backend has no drafter yet

    struct kv_arenas {
        std::uint8_t* attn = nullptr;  // pages of attention rows (raw and compressed)
        std::uint8_t* idx = nullptr;   // pages of indexer rows
    };

    // exact: attention_decode.cuh (the CPU reference's bits); otherwise the tensor-core
    // attention_decode_mma.cuh (bounded, batch-invariant by its fixed split), or with
    // DS4_CHUNK_ATTN=1 attention_prefill.cuh, one launch per sub-batch (bounded, each row alone).
    // chunk_rows: the largest chunk sub-batch (the activations are sized for it).
    cuda_ops(const model::model_dims& d, const model_weights& w, kv_arenas kv, cudaStream_t stream, int device,
             bool exact, int chunk_rows = default_chunk_rows);
    // The KV page arenas, for an op set constructed before its pools (the backend sizes the pools
    // from the memory the op set's workspace leaves). Before the first step only.
    void set_kv(kv_arenas kv);
    int chunk_rows() const;
    // Whether a chunk may hold rows that want output (its head and logits cover the chunk).
    bool chunk_outputs() const;
    ~cuda_ops();
    cuda_ops(const cuda_ops&) = delete;
    cuda_ops& operator=(const cuda_ops&) = delete;

    // Sizes the per-step scratch (attention partials, indexer scores) for compressed-row counts
    // up to max_comp; grows stream-ordered, never shrinks.
    void reserve(int max_comp);
    // The compressed-row capacity reserve() has sized the scratch for (its buffers move only
    // when it grows).
    int comp_capacity() const;
    // Activation buffers for a sub-batch; logits land in logits() [capacity][n_vocab].
    void bind(sub_batch& b) const;
    const float* logits() const;
    float* logits();  // the same buffer, for the sampler adjustments added in place
    // The sampler's scratch for the rows of logits() (kernels::sampling_launch::work).
    float* sampling_work();
    std::uint64_t scratch_bytes() const;

    // The op timing (off unless the backend turns it on); the backend marks its steps and its
    // own ops (input upload, sampling) in it too.
    op_profiler& profiler();
    const op_profiler& profiler() const;

    const layer_weights& layer(int il) const { return w_.layers[std::size_t(il)]; }
    const head_weights& head() const { return w_.head; }

    void embed(batch& b);
    void hc_pre(batch& b, const hc_mix& hc);  // launched by the norm after it (attn_norm, ffn_norm)
    void hc_post(batch& b, const hc_mix& hc);
    void attn_norm(batch& b, const layer_weights& w);
    void q_path(batch& b, const layer_weights& w, int ratio);
    void kv_path(batch& b, const layer_weights& w, int il, int ratio);
    void indexer_select(batch& b, const layer_weights& w, int il);
    void attention(batch& b, const layer_weights& w, int il, int ratio);
    void out_proj(batch& b, const layer_weights& w);
    void ffn_norm(batch& b, const layer_weights& w);
    void route(batch& b, const layer_weights& w, bool hashed);
    void routed_experts(batch&, const layer_weights&) {}  // in route's MoE launches
    void shared_expert(batch&, const layer_weights&) {}   // in route's MoE launches
    void layer_done(batch&, int) {}                         // pages are dropped by the backend
    void output_head(batch& b, const head_weights& h);

private:
    // The indexer's q projection (indexer_select launches it before the join).
    void launch_indexer_q(batch& b, const layer_weights& w);
    // norm_weight: the RMSNorm of x_in into xn folded into the launch (null: none).
    void launch_hc(batch& b, const hc_mix& hc, bool output_mix, const float* norm_weight);
    kernels::hc_pre_launch hc_launch_of(const batch& b, const hc_mix& hc, bool output_mix, const float* norm_weight) const;
    // hc post as its own launch (where no hc pre folds it in).
    void launch_hc_post(batch& b);
    // The hc pre named by the last hc_pre(), launched with the norm that follows it.
    void hc_pre_with_norm(batch& b, const float* norm_weight);
    struct impl;
    const model::model_dims& d_;
    const model_weights& w_;
    std::unique_ptr<impl> p_;
    const hc_mix* pending_hc_ = nullptr;
};

}  // namespace ds4::cuda_backend
