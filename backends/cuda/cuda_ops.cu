#include "backends/cuda/cuda_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>

#include "backends/cuda/attention_split_option.hpp"
#include "backends/cuda/switch_option.hpp"
#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/kernels/attention_decode.cuh"
#include "ds4/kernels/attention_decode_mma.cuh"
#include "ds4/kernels/attention_prefill.cuh"
#include "ds4/kernels/compressor.cuh"
#include "ds4/kernels/embedding.cuh"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/gemm_f16_tc.cuh"
#include "ds4/kernels/matvec_f16_tc.cuh"
#include "ds4/kernels/gemm_q8_0.cuh"
#include "ds4/kernels/hyper_connection.cuh"
#include "ds4/kernels/hyper_connection_rows.cuh"
#include "ds4/kernels/hyper_connection_chunk.cuh"
#include "ds4/kernels/indexer.cuh"
#include "ds4/kernels/kv_store.cuh"
#include "ds4/kernels/matvec.cuh"
#include "ds4/kernels/moe.cuh"
#include "ds4/kernels/moe_gemm.cuh"
#include "ds4/kernels/norm_rope.cuh"
#include "ds4/kernels/quantize_act.cuh"
#include "ds4/kernels/sampling.cuh"

namespace ds4::cuda_backend {
namespace {

constexpr std::size_t sz(int v) { return static_cast<std::size_t>(v); }


// A chunk's tensor-core attention runs in launches of as many rows as this much split scratch
// holds (partials of 64 heads x 512 floats per row and slot: ~400 KB a row up to 64K tokens), so
// that a launch fills the GPU instead of 16 rows at a time.
constexpr std::size_t attn_chunk_scratch_budget = std::size_t(256) << 20;

// A device allocation owned by the op set; stream-ordered so that growing it between steps
// needs no device-wide synchronisation.
template <class T>
struct dev_array {
    T* p = nullptr;
    std::size_t n = 0;
    void alloc(std::size_t count, cudaStream_t s) {
        release(s);
        if (count == 0) return;
        cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&p), count * sizeof(T), s), "cudaMallocAsync workspace");
        n = count;
    }
    void zero(cudaStream_t s) {
        if (n) cuda_check(cudaMemsetAsync(p, 0, n * sizeof(T), s), "cudaMemsetAsync workspace");
    }
    void release(cudaStream_t s) {
        if (p) cudaFreeAsync(p, s);
        p = nullptr;
        n = 0;
    }
    std::uint64_t bytes() const { return n * sizeof(T); }
};

// One matrix of a matvec launch.
struct mv_out {
    const void* weights;
    const std::uint16_t* scales;  // Q8_0 only
    int rows;
    float* y;
    int y_stride;
    const std::int8_t* act_qs = nullptr;
    const float* act_d = nullptr;
    int act_stride = 0;
    int x_col = 0;  // the matrix's input starts at this column of x (matvec only)
};

// An RMSNorm folded into a Q8_0 matvec launch (matvec.cuh): the matrices multiply the
// normalised input, and `out` receives it for the other readers.
struct mv_norm {
    const float* weight = nullptr;
    float eps = 0.0f;
    float* out = nullptr;
};

// Weight bytes an op streams (op_profiler): Q8_0 is 34 bytes per 32 weights, IQ2_XXS 66 and
// Q2_K 84 per 256.
std::uint64_t q8_bytes(std::int64_t rows, std::int64_t in) { return std::uint64_t(rows * in / 32 * 34); }
std::uint64_t q8_bytes(const q8_matrix& m) { return q8_bytes(m.rows, m.in); }
std::uint64_t f16_bytes(std::int64_t rows, std::int64_t in) { return std::uint64_t(rows * in * 2); }
std::uint64_t hc_bytes(const model::model_dims& d) {
    return f16_bytes(2 * d.n_hc + d.n_hc * d.n_hc, std::int64_t(d.n_hc) * d.n_embd);
}
std::uint64_t moe_bytes(const model::model_dims& d, int rows) {
    const std::int64_t e = std::min<std::int64_t>(std::int64_t(rows) * d.n_expert_used, d.n_expert);
    const std::int64_t per_256 = std::int64_t(d.n_ff_exp) * d.n_embd / 256;
    const std::uint64_t routed = std::uint64_t(e * per_256 * (2 * 66 + 84));
    return f16_bytes(d.n_expert, d.n_embd) + routed + 3 * q8_bytes(d.n_ff_exp, d.n_embd);
}

// The MoE output of a chunk row: the routed slot sum plus the shared expert, one rounding, as
// moe.cuh's decode kernels finish it.
__global__ void moe_chunk_sum(const float* routed, const float* shared, float* out, int n_embd, int n_rows) {
    pdl_enter();
    const int r = int(blockIdx.y), i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
    if (r >= n_rows || i >= n_embd) return;
    const std::size_t k = std::size_t(r) * std::size_t(n_embd) + std::size_t(i);
    out[k] = add_rn(routed[k], shared[k]);
}

}  // namespace

struct cuda_ops::impl {
    cudaStream_t stream;
    int device = 0, sms = 1;
    kv_arenas kv;
    model::attention_row_layout attn_row;
    model::indexer_row_layout idx_row;
    // Activations, max_sub_rows rows each.
    dev_array<float> X, Y, x_in, xn, sub_out, qr, qn, q, o, low, kvv, ckv, cgate, ikv, igate, iq_raw, iw_raw, split,
        hc_partials, logits, act_d;
    // The sampler's normaliser scratch (kernels/sampling.cuh), one entry per logits row; its
    // counters start at zero and every launch leaves them there.
    dev_array<float> sampling_work;
    dev_array<std::int8_t> act_qs;
    dev_array<float> mv_partials;
    dev_array<unsigned> mv_counters;
    // The kv path runs on a second stream beside the q path (they read xn and nothing of each
    // other): its own matvec split-K workspace, a fork after attn_norm, a join before the
    // indexer or the attention. Off while the profiler times ops (its events are on `main`).
    cudaStream_t main = nullptr, side = nullptr;
    cudaEvent_t forked = nullptr, joined = nullptr;
    cudaEvent_t moe_ev[2] = {nullptr, nullptr};  // the MoE's shared expert on `side`
    cudaEvent_t ix_ev[2] = {nullptr, nullptr};   // the indexer's scalar scores on `side`
    bool side_pending = false, on_side = false;
    dev_array<float> side_partials;
    dev_array<unsigned> side_counters;
    // DS4_SIDE2=1: a decode step's compressors on a third stream (else after the kv store on
    // `side`): in the ratio-128 layers the one side path reached the attention's join 5.5 us after
    // the q path (decode timeline, 2K, H200), but with the experts launched after the router the
    // third stream lost: 117.9 against 119.9-120.3 tok/s at 2K (RESULTS, twenty-sixth session).
    cudaStream_t side2 = nullptr;
    cudaEvent_t joined2 = nullptr;
    bool side2_pending = false, on_side2 = false;
    dev_array<float> side2_partials;
    dev_array<unsigned> side2_counters;
    dev_array<std::uint8_t> gemm_ws;  // a chunk's quantized GEMM input
    dev_array<std::uint8_t> side_gemm_ws;  // the same for the side stream's GEMMs (the kv path)
    // The GEMM kernel per launch: kernels::pick_gemm_q8_0_variant's (the 64 x 128 tile) unless
    // DS4_GEMM_TILE=64|128|wgmma forces one (to measure another; wgmma: sm_90a's warpgroup-MMA
    // kernel, the same bits, not yet measured).
    std::optional<kernels::gemm_q8_0_variant> gemm_tile_forced;
    kernels::gemm_q8_0_variant gemm_variant(const kernels::gemm_q8_0_shape& s, int capacity) const {
        return gemm_tile_forced ? *gemm_tile_forced : kernels::pick_gemm_q8_0_variant(s, capacity, sms);
    }
    // MoE: one plan and scratch per row capacity (the scratch's counters are laid out per plan).
    std::vector<kernels::moe_decode_plan> moe_plans;
    std::vector<dev_array<std::uint8_t>> moe_scratch;
    // A chunk's routed experts as one grouped GEMM (moe_gemm.cuh) on the routes its 16-row
    // slices computed (prefill 494 -> 722 tok/s on the H200); DS4_MOE_GEMM=0: the slices run
    // the decode experts instead.
    bool moe_gemm = false;
    std::optional<kernels::moe_gemm_plan> moe_gemm_plan;
    dev_array<std::uint8_t> moe_gemm_ws;
    dev_array<std::int32_t> chunk_sel;
    dev_array<float> chunk_wts, chunk_shared, chunk_routed;
    dev_array<float> chunk_sh_g, chunk_sh_u;  // the shared expert's gate (then its SwiGLU) and up
    dev_array<float> chunk_router;            // router logits, then probabilities [rows][n_expert]
    dev_array<float> hc_flat, hc_mix;         // a chunk's HC pre: normalised flat state, its mix
    // Indexer and attention scratch, sized by reserve().
    int comp_cap = 0;
    dev_array<float> ix_q, ix_w, ix_scores;
    dev_array<unsigned> ix_hist, ix_sel_state, ix_block_counts;
    dev_array<std::uint8_t> ix_mask;
    dev_array<std::int32_t> ix_selected, ix_n_selected;
    // The int8 tensor-core scores' operands (exact; heads that miss their precondition take the
    // scalar scores): 7x faster than the scalar kernel at 256K tokens (bench/RESULTS.md).
    dev_array<std::int8_t> ix_q_int8;
    dev_array<float> ix_w_int8;
    dev_array<std::uint8_t> ix_head_int8;
    dev_array<std::uint8_t> attn_scratch;
    int attn_group = max_sub_rows;  // a chunk's rows per tensor-core attention launch (reserve())
    int min_ratio = 0;              // the smallest compression ratio of the model's layers
    // DS4_CHUNK_ATTN=1, tensor-core mode only: every sub-batch's attention is one
    // attention_prefill.cuh launch per layer over its rows (each row's own position and page
    // tables), chunks and decode rows alike, so a row's result still never depends on the
    // sub-batch it lands in; the default runs attention_decode_mma.cuh, a chunk in 16-row slices.
    bool rows_attention = false;

    bool exact = true;
    // The tensor-core attention's split size: 256 compressed rows, or DS4_ATTN_SPLIT, a measurement
    // knob (it changes the default mode's bits, the same for every row, so batch invariance and
    // prefill == steps still hold).
    int mma_split_rows = default_attention_split_rows;
    int chunk_rows = default_chunk_rows;
    bool f16_tc = false;  // DS4_F16_TC: chunk F16 projections on tensor cores (bounded)
    bool chunk_outputs = true;  // chunks may hold output rows (logits for chunk_rows rows); DS4_CHUNK_OUTPUTS=0: never
    // hc post folded into the next hc pre where the shape allows (decode sub-batches);
    // DS4_HC_FOLD=0: every hc post its own launch.
    bool hc_fold = true;
    bool hc_chunk = true;  // a chunk's hc pre in one launch (DS4_HC_CHUNK=0: five)
    // A chunk's hc post forms the rows' RMS scales for the next hc pre (one read of the state
    // less; the same bits); DS4_HC_POST_SCALES=0: the hc pre forms them.
    bool hc_post_scales = true;
    dev_array<float> hc_row_scale;  // [chunk_rows]
    // q also as the sm_90a tensor-core attention's F16 operand (kernels/attention_q16.hpp), written
    // by the q heads' norm_rope: the split kernel copies it instead of converting q (the same
    // bits). DS4_ATTN_Q16=0: the kernel converts q itself.
    dev_array<__half> q16;
    op_profiler prof;

    // The most compressed rows a ratio-`ratio` layer's tensor-core attention can see while
    // comp_cap bounds every row's count at the smallest ratio (pos + 1 < min_ratio (comp_cap + 1)):
    // an indexer layer sees its top_k list at most. Slots past it would be empty CTAs.
    int comp_visible(int ratio, int top_k) const {
        if (ratio <= 0 || min_ratio <= 0) return 0;
        const int bound = int((std::int64_t(min_ratio) * (comp_cap + 1) - 1) / ratio);
        return std::min(comp_cap, ratio == 4 ? std::min(bound, top_k) : bound);
    }

    impl(const model::model_dims& d, cudaStream_t s, int dev, kv_arenas k, bool ex)
        : stream(s), device(dev), kv(k), attn_row{d.head_dim, d.n_rot}, idx_row{d.indexer_head_dim}, main(s), exact(ex) {}

    // y = W x for the sub-batch's rows: the matvec kernels on a small sub-batch; on a chunk a
    // Q8_0 GEMM, or (F16) the matvec over slices of max_sub_rows rows.
    void mv(kernels::matvec_format fmt, const sub_batch& b, const float* x, int x_stride, int in,
            std::initializer_list<mv_out> outs) {
        if (b.capacity > max_sub_rows) {
            if (fmt == kernels::matvec_format::q8_0) return gemm(b, x, x_stride, in, outs);
            if (fmt == kernels::matvec_format::f16) return gemm_f16(b, x, x_stride, in, outs);
            for (int off = 0; off < b.n; off += max_sub_rows) {
                std::vector<mv_out> slice(outs);
                for (mv_out& m : slice) m.y += std::size_t(off) * std::size_t(m.y_stride);
                mv_rows(fmt, x + std::size_t(off) * std::size_t(x_stride), x_stride, in, std::min(max_sub_rows, b.n - off),
                        slice);
            }
            return;
        }
        mv_rows(fmt, x, x_stride, in, b.host_rows(), b.capacity, std::vector<mv_out>(outs));
    }
    void mv_rows(kernels::matvec_format fmt, const float* x, int x_stride, int in, int n_rows,
                 const std::vector<mv_out>& outs) {
        int cap = 1;
        while (cap < n_rows) cap *= 2;
        mv_rows(fmt, x, x_stride, in, n_rows, cap, outs);
    }
    void mv_rows(kernels::matvec_format fmt, const float* x, int x_stride, int in, int n_rows, int capacity,
                 const std::vector<mv_out>& outs, mv_norm norm = {}) {
        if (fmt == kernels::matvec_format::f16 && norm.weight == nullptr && f16_tc_rows(in, outs)) {
            // The decode twin of the chunks' tensor-core GEMM: the same bits for a row either way.
            kernels::gemm_f16_args g = f16_args(x, x_stride, in, n_rows, outs);
            kernels::matvec_f16_tc(g, stream);
            prof.count();
            return;
        }
        kernels::matvec_launch a;
        a.format = fmt;
        a.x = x;
        a.x_stride = x_stride;
        a.n_rows = n_rows;
        a.in = in;
        a.norm_weight = norm.weight;
        a.norm_eps = norm.eps;
        a.x_normed = norm.out;
        a.n_matrices = int(outs.size());
        int k = 0;
        for (const mv_out& m : outs) {
            a.m[k].weights = m.weights;
            a.m[k].scales = m.scales;
            a.m[k].rows = m.rows;
            a.m[k].y = m.y;
            a.m[k].y_stride = m.y_stride;
            a.m[k].act_qs = m.act_qs;
            a.m[k].act_d = m.act_d;
            a.m[k].act_stride = m.act_stride;
            a.m[k].x_col = m.x_col;
            ++k;
        }
        kernels::plan_matvec(a, capacity, sms);
        const kernels::matvec_workspace ws =
            on_side2  ? kernels::matvec_workspace{side2_partials.p, side2_partials.n, side2_counters.p, side2_counters.n}
            : on_side ? kernels::matvec_workspace{side_partials.p, side_partials.n, side_counters.p, side_counters.n}
                      : kernels::matvec_workspace{mv_partials.p, mv_partials.n, mv_counters.p, mv_counters.n};
        kernels::launch_matvec(a, capacity, ws, sms, stream);
        prof.count();
    }
    kernels::gemm_f16_args f16_args(const float* x, int x_stride, int in, int n_rows, std::span<const mv_out> outs) const {
        kernels::gemm_f16_args g;
        g.x = x;
        g.x_stride = x_stride;
        g.in = in;
        g.n_rows = n_rows;
        for (const mv_out& m : outs) {
            require(m.x_col == 0 && m.act_qs == nullptr, "cuda ops: internal error, an F16 projection with an input offset");
            g.m[g.n_matrices++] = {static_cast<const std::uint16_t*>(m.weights), m.rows, m.y, m.y_stride};
        }
        return g;
    }
    // Whether DS4_F16_TC puts an F16 launch on tensor cores: only where it has a full weight tile
    // (the HC mix, 24 rows over 16384 inputs, got 32 CTAs from the 128-row tile and ran 2.3x
    // slower than on CUDA cores), and the same rule for chunks and decode steps.
    bool f16_tc_rows(int in, std::span<const mv_out> outs) const {
        int w_rows = 0;
        for (const mv_out& m : outs) {
            if (m.x_col != 0 || m.act_qs != nullptr) return false;
            w_rows += m.rows;
        }
        return f16_tc && in % kernels::gemm_f16_tc_k == 0 && w_rows >= kernels::gemm_f16_tc_wn;
    }
    // The chunk's F16 projections that read x as one launch: in the matvec's order (exact), or
    // with DS4_F16_TC on tensor cores where the decode form is matvec_f16_tc (`decode_twin`: not the
    // router, whose decode logits moe_router_kernel computes in the matvec's order).
    void gemm_f16(const sub_batch& b, const float* x, int x_stride, int in, std::initializer_list<mv_out> outs,
                  bool decode_twin = true) {
        const kernels::gemm_f16_args g = f16_args(x, x_stride, in, b.n, outs);
        if (decode_twin && f16_tc_rows(in, outs))
            kernels::gemm_f16_tc(g, b.n, stream);
        else
            kernels::gemm_f16(g, b.n, stream);
        prof.count();
    }
    // The chunk's Q8_0 projections that read x (or their pre-quantized act_qs) as one GEMM launch.
    void gemm(const sub_batch& b, const float* x, int x_stride, int in, std::initializer_list<mv_out> outs) {
        kernels::gemm_q8_0_shape shape;
        shape.in = in;
        kernels::gemm_q8_0_args g;
        g.x = x;
        g.x_stride = x_stride;
        g.n_rows = b.n;
        for (const mv_out& m : outs) {
            shape.rows[shape.n_matrices] = m.rows;
            g.m[shape.n_matrices++] = {static_cast<const std::uint8_t*>(m.weights), m.scales, m.y, m.rows, m.y_stride,
                                       m.act_qs, m.act_d, m.act_stride};
        }
        const auto plan = kernels::gemm_q8_0_plan::make(shape, b.capacity, gemm_variant(shape, b.capacity));
        dev_array<std::uint8_t>& ws = on_side ? side_gemm_ws : gemm_ws;
        require(plan.workspace_bytes() <= ws.bytes(), "cuda ops: internal error, GEMM workspace too small");
        kernels::gemm_q8_0(plan, g, ws.p, stream);
        prof.count();
    }
    void q8(const sub_batch& b, const float* x, int x_stride, const q8_matrix& m, float* y, int y_stride) {
        mv(kernels::matvec_format::q8_0, b, x, x_stride, m.in, {{m.quants, m.scales, m.rows, y, y_stride}});
    }
    bool overlap() const { return side != nullptr && !prof.on(); }
    // Marks the point the side stream's next work starts from (after attn_norm).
    void fork() {
        if (!overlap()) return;
        cuda_check(cudaEventRecord(forked, main), "side stream fork");
    }
    // Ops between enter_side and leave_side go to the side stream (forked work only).
    void enter_side() {
        if (!overlap()) return;
        cuda_check(cudaStreamWaitEvent(side, forked, 0), "side stream wait");
        stream = side;
        on_side = true;
        side_pending = true;
    }
    void leave_side() {
        stream = main;
        on_side = on_side2 = false;
    }
    // From the side stream to the third one, from the same fork (no-op without it).
    void enter_side2() {
        if (!overlap() || side2 == nullptr) return;
        cuda_check(cudaStreamWaitEvent(side2, forked, 0), "third stream wait");
        stream = side2;
        on_side = false;
        on_side2 = true;
        side2_pending = true;
    }
    // The main stream waits for the side streams' work (idempotent).
    void join() {
        if (side2_pending) {
            cuda_check(cudaEventRecord(joined2, side2), "third stream join");
            cuda_check(cudaStreamWaitEvent(main, joined2, 0), "third stream join wait");
            side2_pending = false;
        }
        if (!side_pending) return;
        cuda_check(cudaEventRecord(joined, side), "side stream join");
        cuda_check(cudaStreamWaitEvent(main, joined, 0), "side stream join wait");
        side_pending = false;
    }
    void rms_norm(const sub_batch& b, const float* x, int n, const float* w, float* out, float eps) {
        kernels::launch_rms_norm(x, n, w, out, n, n, eps, b.n_live, b.capacity, stream);
        prof.count();
    }
};

cuda_ops::cuda_ops(const model::model_dims& d, const model_weights& w, kv_arenas kv, cudaStream_t stream, int device,
                   bool exact, int chunk_rows)
    : d_(d), w_(w), p_(std::make_unique<impl>(d, stream, device, kv, exact)) {
    impl& p = *p_;
    require(chunk_rows >= max_sub_rows && chunk_rows <= kernels::moe_gemm_max_rows,
            "cuda ops: chunk rows " + std::to_string(chunk_rows) + " outside 16.." +
                std::to_string(kernels::moe_gemm_max_rows));
    p.chunk_rows = chunk_rows;
    for (int r : d.compress_ratios)
        if (r > 0) p.min_ratio = p.min_ratio == 0 ? r : std::min(p.min_ratio, r);
    cuda_check(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    kernels::prepare_matvec(device);
    kernels::prepare_moe(device);
    kernels::prepare_attention_decode(device);
    if (!exact) kernels::prepare_attention_decode_mma(device);
    p.mma_split_rows = attention_split_rows(std::getenv("DS4_ATTN_SPLIT"));
    if (const char* c = std::getenv("DS4_CHUNK_ATTN"); c != nullptr && std::string(c) == "1" && !exact) {
        require((d.head_dim == 128 || d.head_dim == 512) && d.n_rot == 64 && d.n_head % 8 == 0 && d.n_head <= 64,
                "cuda ops: DS4_CHUNK_ATTN=1 needs head_dim 128 or 512, n_rot 64 and n_head a multiple of 8 up to 64");
        p.rows_attention = true;
        kernels::prepare_attention_prefill(device);
    }
    kernels::prepare_gemm_q8_0(device);
    kernels::prepare_gemm_f16(device);
    // Activations for a chunk; logits only for a small sub-batch (a chunk wants no output).
    const std::size_t R = sz(chunk_rows);
    const int n_mix = 2 * d.n_hc + d.n_hc * d.n_hc;
    const int c_width = 2 * d.head_dim, i_width = 2 * d.indexer_head_dim;
    p.X.alloc(R * sz(d.hc_dim()), stream);
    p.Y.alloc(R * sz(d.hc_dim()), stream);
    for (dev_array<float>* a : {&p.x_in, &p.xn, &p.sub_out}) a->alloc(R * sz(d.n_embd), stream);
    p.qr.alloc(R * sz(d.n_lora_q), stream);
    p.qn.alloc(R * sz(d.n_lora_q), stream);
    p.q.alloc(R * sz(d.q_dim()), stream);
    if (!exact && d.head_dim == 512 && d.n_rot == 64 && d.n_head <= kernels::q16_rows &&
        kernels::wgmma_detail::available_on(device) &&
        switch_option("DS4_ATTN_Q16", std::getenv("DS4_ATTN_Q16"), true)) {
        p.q16.alloc(R * sz(kernels::q16_token_halves(d.head_dim)), stream);
        p.q16.zero(stream);  // head rows past n_head are never written and must read as zero
    }
    p.o.alloc(R * sz(d.q_dim()), stream);
    p.low.alloc(R * sz(d.lora_o_total()), stream);
    p.kvv.alloc(R * sz(d.head_dim), stream);
    p.ckv.alloc(R * sz(c_width), stream);
    p.cgate.alloc(R * sz(c_width), stream);
    p.ikv.alloc(R * sz(i_width), stream);
    p.igate.alloc(R * sz(i_width), stream);
    p.iq_raw.alloc(R * sz(d.n_indexer_head) * kernels::indexer_dim, stream);
    p.iw_raw.alloc(R * sz(d.n_indexer_head), stream);
    p.split.alloc(R * sz(n_mix), stream);
    p.hc_flat.alloc(R * sz(d.n_hc) * sz(d.n_embd), stream);
    p.hc_mix.alloc(R * sz(n_mix), stream);
    kernels::hc_pre_launch hl;
    hl.n_embd = d.n_embd;
    hl.n_hc = d.n_hc;
    p.hc_partials.alloc(kernels::hc_partial_floats(hl, chunk_rows), stream);
    p.hc_partials.zero(stream);  // its arrival counters start at zero; every hc pre leaves them so
    // Chunks that hold output rows (many decode rows through the GEMMs) need logits for every
    // chunk row (530 MB at 1024 rows on the flash shape).
    p.chunk_outputs = switch_option("DS4_CHUNK_OUTPUTS", std::getenv("DS4_CHUNK_OUTPUTS"), true);
    p.hc_fold = switch_option("DS4_HC_FOLD", std::getenv("DS4_HC_FOLD"), true);
    // A chunk's hc pre in one launch (kernels/hyper_connection_chunk.cuh, exact: the same bits)
    // instead of five: 368 against 439 us at 2048 rows on an H100; DS4_HC_CHUNK=0 runs the five.
    p.hc_chunk = switch_option("DS4_HC_CHUNK", std::getenv("DS4_HC_CHUNK"), true) && d.n_hc == 4 &&
                 kernels::hc_chunk_fits(d.n_embd, d.n_hc);
    if (p.hc_chunk) kernels::prepare_hc_pre_chunk(device);
    p.hc_post_scales = p.hc_chunk && switch_option("DS4_HC_POST_SCALES", std::getenv("DS4_HC_POST_SCALES"), true) &&
                       kernels::hc_post_forms_scales(d.n_embd, d.n_hc);
    if (p.hc_post_scales) p.hc_row_scale.alloc(sz(chunk_rows), stream);
    // DS4_F16_TC=1 (default mode only): the F16 projections of 128 rows or more (compressors with
    // the indexer's head weights, the indexer's q_b) on TF32 tensor cores, chunks through
    // kernels/gemm_f16_tc.cuh and decode steps through its twin matvec_f16_tc.cuh (bounded
    // against the reference, the same bits for a row in either).
    p.f16_tc = !exact && switch_option("DS4_F16_TC", std::getenv("DS4_F16_TC"), false);
    if (p.f16_tc) {
        kernels::prepare_gemm_f16_tc(device);
        kernels::prepare_matvec_f16_tc(device, d.n_embd);
    }
    if (const char* t = std::getenv("DS4_GEMM_TILE"); t != nullptr && *t != '\0') {
        const std::string v(t);
        require(v == "64" || v == "128" || v == "wgmma", "DS4_GEMM_TILE='" + v + "': expected 64, 128 or wgmma");
        if (v == "wgmma")
            require(kernels::gemm_q8_0_wgmma_available_on(device),
                    "DS4_GEMM_TILE=wgmma: device " + std::to_string(device) +
                        " cannot run the wgmma Q8_0 GEMM (it needs an sm_90 device and a build with sm_90a code)");
        p.gemm_tile_forced = v == "64" ? kernels::gemm_q8_0_variant::tile_64x128
                             : v == "128" ? kernels::gemm_q8_0_variant::tile_128x128
                                          : kernels::gemm_q8_0_variant::wgmma_128x64;
    }
    p.logits.alloc(sz(p.chunk_outputs ? chunk_rows : max_sub_rows) * sz(d.n_vocab), stream);
    p.sampling_work.alloc(kernels::sampling_work_floats(p.chunk_outputs ? chunk_rows : max_sub_rows), stream);
    p.sampling_work.zero(stream);
    p.act_qs.alloc(R * sz(d.q_dim()), stream);
    p.act_d.alloc(R * sz(d.q_dim() / 32), stream);

    // Matvec split-K scratch: the largest requirement of any launch shape this op set plans.
    std::size_t pf = 0, cc = 0;
    auto need = [&](kernels::matvec_format fmt, int in, std::initializer_list<int> rows) {
        kernels::matvec_launch a;
        a.format = fmt;
        a.in = in;
        a.n_rows = max_sub_rows;
        a.n_matrices = int(rows.size());
        int k = 0;
        for (int r : rows) a.m[k++].rows = r;
        const auto req = kernels::plan_matvec(a, max_sub_rows, p.sms);
        pf = std::max(pf, req.partial_floats);
        cc = std::max(cc, req.counter_count);
    };
    using kernels::matvec_format;
    need(matvec_format::q8_0, d.n_embd, {d.n_lora_q});
    need(matvec_format::q8_0, d.n_lora_q, {d.q_dim()});
    need(matvec_format::q8_0, d.n_embd, {d.head_dim});
    need(matvec_format::q8_0, d.lora_o_total(), {d.n_embd});
    need(matvec_format::q8_0, d.n_embd, {d.n_vocab});
    {
        kernels::matvec_launch a;
        a.format = matvec_format::q8_0;
        a.in = d.group_in();
        a.n_rows = max_sub_rows;
        a.n_matrices = d.n_out_group;
        for (int g = 0; g < d.n_out_group; ++g) {
            a.m[g].rows = d.n_lora_o;
            a.m[g].x_col = g * d.group_in();
        }
        const auto req = kernels::plan_matvec(a, max_sub_rows, p.sms);
        pf = std::max(pf, req.partial_floats);
        cc = std::max(cc, req.counter_count);
    }
    p.mv_partials.alloc(std::max<std::size_t>(pf, 1), stream);
    p.mv_counters.alloc(std::max<std::size_t>(cc, 1), stream);
    p.mv_counters.zero(stream);
    p.side_partials.alloc(std::max<std::size_t>(pf, 1), stream);
    p.side_counters.alloc(std::max<std::size_t>(cc, 1), stream);
    p.side_counters.zero(stream);
    p.side2_partials.alloc(std::max<std::size_t>(pf, 1), stream);
    p.side2_counters.alloc(std::max<std::size_t>(cc, 1), stream);
    p.side2_counters.zero(stream);
    if (const char* o = std::getenv("DS4_CUDA_OVERLAP"); o == nullptr || std::string(o) != "0") {
        // DS4_SIDE_PRIORITY=1: the side stream at the device's highest priority, so that its
        // pending CTAs take SM slots ahead of the main stream's (A/B; off by default). Captured
        // launches carry it into the graph (core/launch.hpp, core/cuda_graph.hpp).
        if (switch_option("DS4_SIDE_PRIORITY", std::getenv("DS4_SIDE_PRIORITY"), false)) {
            int least = 0, greatest = 0;
            cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
            cuda_check(cudaStreamCreateWithPriority(&p.side, cudaStreamNonBlocking, greatest),
                       "cudaStreamCreate side (priority)");
            mark_stream_priorities();
        } else {
            cuda_check(cudaStreamCreateWithFlags(&p.side, cudaStreamNonBlocking), "cudaStreamCreate side");
        }
        if (switch_option("DS4_SIDE2", std::getenv("DS4_SIDE2"), false)) {
            int priority = 0;
            cuda_check(cudaStreamGetPriority(p.side, &priority), "cudaStreamGetPriority side");
            cuda_check(cudaStreamCreateWithPriority(&p.side2, cudaStreamNonBlocking, priority), "cudaStreamCreate third");
            cuda_check(cudaEventCreateWithFlags(&p.joined2, cudaEventDisableTiming), "cudaEventCreate third join");
        }
        cuda_check(cudaEventCreateWithFlags(&p.forked, cudaEventDisableTiming), "cudaEventCreate fork");
        cuda_check(cudaEventCreateWithFlags(&p.joined, cudaEventDisableTiming), "cudaEventCreate join");
        for (cudaEvent_t& e : p.moe_ev) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate moe");
        for (cudaEvent_t& e : p.ix_ev) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate indexer");
    }
    // The chunk GEMMs quantize inputs of up to max(n_embd, n_lora_q, lora_o_total, n_ff_exp) wide.
    const int widest = std::max({d.n_embd, d.n_lora_q, d.lora_o_total(), d.n_ff_exp});
    p.gemm_ws.alloc(R * sz(widest) + R * sz(widest / 32) * sizeof(float) + 256, stream);
    p.side_gemm_ws.alloc(R * sz(d.n_embd) + R * sz(d.n_embd / 32) * sizeof(float) + 256, stream);

    require(d.n_out_group <= kernels::matvec_max_matrices,
            "cuda backend: " + std::to_string(d.n_out_group) + " output groups, more than one matvec launch takes");
    const kernels::moe_shape ms{d.n_embd, d.n_ff_exp, d.n_ff_exp, d.n_expert};
    for (int cap = 1; cap <= max_sub_rows; cap *= 2) {
        p.moe_plans.emplace_back(ms, cap, p.sms);
        // The experts launch waits for the router to complete, leaving the SM slots to the side
        // stream's shared expert meanwhile: 117.8-118.0 against 114.5-115.3 tok/s at 2K (H200,
        // twenty-sixth session). DS4_MOE_EXPERTS_EARLY=1 launches it under PDL beside the router.
        p.moe_plans.back().set_experts_early(
            switch_option("DS4_MOE_EXPERTS_EARLY", std::getenv("DS4_MOE_EXPERTS_EARLY"), false));
        // DS4_ROUTER_CLUSTER=0: the router as 256 CTAs and a check-in instead of one cluster (A/B).
        p.moe_plans.back().set_router_cluster(
            switch_option("DS4_ROUTER_CLUSTER", std::getenv("DS4_ROUTER_CLUSTER"), true));
        // DS4_MOE_FINISH_EARLY=0: the MoE finish releases the next hc pre only after its wait (A/B).
        p.moe_plans.back().set_finish_releases_early(
            switch_option("DS4_MOE_FINISH_EARLY", std::getenv("DS4_MOE_FINISH_EARLY"), true));
        p.moe_scratch.emplace_back();
        p.moe_scratch.back().alloc(p.moe_plans.back().scratch_bytes(), stream);
        p.moe_scratch.back().zero(stream);
    }
    if (const char* g = std::getenv("DS4_MOE_GEMM"); g == nullptr || std::string(g) != "0") {
        p.moe_gemm = true;
        kernels::prepare_moe_gemm(device);
        p.moe_gemm_plan = kernels::moe_gemm_plan::make({d.n_embd, d.n_ff_exp, d.n_expert}, chunk_rows);
        // DS4_MOE_WGMMA=1 (or gate_up, or down): the routed gate/up and down on sm_90a warpgroup
        // MMA (moe_gemm_wgmma.cuh), the same bits as the mma.sync kernels; off until measured.
        if (const char* v = std::getenv("DS4_MOE_WGMMA"); v != nullptr && std::string(v) != "0") {
            const std::string w(v);
            require(w == "1" || w == "gate_up" || w == "down",
                    "DS4_MOE_WGMMA='" + w + "': expected 0, 1 (gate/up and down), gate_up or down");
            require(kernels::moe_gemm_wgmma_available_on(device),
                    "DS4_MOE_WGMMA=" + w + ": device " + std::to_string(device) +
                        " cannot run the wgmma MoE kernels (they need an sm_90 device and a build with sm_90a code)");
            p.moe_gemm_plan->set_gate_up_wgmma(w != "down");
            p.moe_gemm_plan->set_down_wgmma(w != "gate_up");
        }
        // DS4_MOE_REGS: the routed gate/up and down with the weights decoded into the mma fragments
        // (moe_gemm_*_regs.cuh), the default (1); 0 runs the tile kernels, gate_up or down one of
        // each. The same bits either way.
        if (const char* v = std::getenv("DS4_MOE_REGS"); v != nullptr) {
            const std::string w(v);
            require(w == "0" || w == "1" || w == "gate_up" || w == "down",
                    "DS4_MOE_REGS='" + w + "': expected 0, 1 (gate/up and down), gate_up or down");
            p.moe_gemm_plan->set_gate_up_regs(w == "1" || w == "gate_up");
            p.moe_gemm_plan->set_down_regs(w == "1" || w == "down");
        }
        p.moe_gemm_ws.alloc(p.moe_gemm_plan->workspace_bytes() + 256, stream);
        p.chunk_sel.alloc(R * kernels::moe_slots, stream);
        p.chunk_wts.alloc(R * kernels::moe_slots, stream);
        p.chunk_shared.alloc(R * sz(d.n_embd), stream);
        p.chunk_routed.alloc(R * sz(d.n_embd), stream);
        p.chunk_sh_g.alloc(R * sz(d.n_ff_exp), stream);
        p.chunk_sh_u.alloc(R * sz(d.n_ff_exp), stream);
        p.chunk_router.alloc(R * sz(d.n_expert), stream);
    }
    p.ix_q.alloc(R * sz(d.n_indexer_head) * kernels::indexer_dim, stream);
    p.ix_w.alloc(R * sz(d.n_indexer_head), stream);
    p.ix_hist.alloc(R * kernels::indexer_radix_passes * 256, stream);
    p.ix_hist.zero(stream);
    p.ix_sel_state.alloc(R * 5 * 2, stream);
    p.ix_selected.alloc(R * sz(std::max(d.indexer_top_k, 1)), stream);
    p.ix_n_selected.alloc(R, stream);
    p.ix_q_int8.alloc(R * kernels::indexer_max_heads * kernels::indexer_dim, stream);
    p.ix_w_int8.alloc(R * kernels::indexer_max_heads, stream);
    p.ix_head_int8.alloc(R * kernels::indexer_max_heads, stream);
    reserve(0);
}

cuda_ops::~cuda_ops() {
    // Stream-ordered frees; the backend synchronises its stream before destroying it.
    impl& p = *p_;
    for (dev_array<float>* a : {&p.X, &p.Y, &p.x_in, &p.xn, &p.sub_out, &p.qr, &p.qn, &p.q, &p.o, &p.low, &p.kvv,
                                &p.ckv, &p.cgate, &p.ikv, &p.igate, &p.iq_raw, &p.iw_raw, &p.split, &p.hc_partials,
                                &p.logits, &p.act_d, &p.mv_partials, &p.ix_q, &p.ix_w, &p.ix_scores, &p.hc_flat,
                                &p.hc_mix, &p.sampling_work, &p.hc_row_scale})
        a->release(p.stream);
    p.act_qs.release(p.stream);
    p.q16.release(p.stream);
    p.mv_counters.release(p.stream);
    p.side_partials.release(p.stream);
    p.side_counters.release(p.stream);
    p.side2_partials.release(p.stream);
    p.side2_counters.release(p.stream);
    p.gemm_ws.release(p.stream);
    p.side_gemm_ws.release(p.stream);
    p.moe_gemm_ws.release(p.stream);
    p.chunk_sel.release(p.stream);
    for (dev_array<float>* a : {&p.chunk_wts, &p.chunk_shared, &p.chunk_routed, &p.chunk_sh_g, &p.chunk_sh_u,
                                 &p.chunk_router})
        a->release(p.stream);
    if (p.side) {
        cudaStreamSynchronize(p.side);
        cudaEventDestroy(p.forked);
        cudaEventDestroy(p.joined);
        for (cudaEvent_t e : p.moe_ev) cudaEventDestroy(e);
        for (cudaEvent_t e : p.ix_ev) cudaEventDestroy(e);
        cudaStreamDestroy(p.side);
    }
    if (p.side2) {
        cudaStreamSynchronize(p.side2);
        cudaEventDestroy(p.joined2);
        cudaStreamDestroy(p.side2);
    }
    for (auto& s : p.moe_scratch) s.release(p.stream);
    for (dev_array<unsigned>* a : {&p.ix_hist, &p.ix_sel_state, &p.ix_block_counts}) a->release(p.stream);
    p.ix_mask.release(p.stream);
    p.ix_selected.release(p.stream);
    p.ix_n_selected.release(p.stream);
    p.ix_q_int8.release(p.stream);
    p.ix_w_int8.release(p.stream);
    p.ix_head_int8.release(p.stream);
    p.attn_scratch.release(p.stream);
}

void cuda_ops::reserve(int max_comp) {
    impl& p = *p_;
    // Capacities in steps of 256 rows, so that a growing context re-sizes rarely; the results
    // never depend on them (chunks and selections are fixed by row indices).
    const int cap = std::max(256, (max_comp + 255) / 256 * 256);
    if (cap <= p.comp_cap) return;
    p.comp_cap = cap;
    // The indexer runs once over a chunk; the attention in slices of max_sub_rows rows.
    const std::size_t R = sz(p.chunk_rows);
    p.ix_scores.alloc(R * sz(cap), p.stream);
    p.ix_mask.alloc(R * sz(cap), p.stream);
    p.ix_block_counts.alloc(R * sz(kernels::indexer_select_blocks(cap)) * 2, p.stream);
    const kernels::attention_decode_shape shape{d_.n_head, d_.head_dim, d_.n_rot, d_.n_swa};
    std::size_t bytes = kernels::attention_decode_plan::make(shape, {max_sub_rows, 1, cap}).scratch_bytes();
    if (!p.exact) {
        int vis = 0;
        for (int r : d_.compress_ratios)
            if (r > 0) vis = std::max(vis, p.comp_visible(r, d_.indexer_top_k));
        const auto per_row = kernels::attention_decode_mma_plan::make(shape, {1, 1, vis}, p.mma_split_rows).scratch_bytes();
        p.attn_group = int(std::clamp<std::size_t>(attn_chunk_scratch_budget / per_row / max_sub_rows * max_sub_rows,
                                                   max_sub_rows, std::size_t(p.chunk_rows)));
        bytes = std::max(bytes, per_row * sz(p.attn_group));
    }
    p.attn_scratch.alloc(bytes, p.stream);
}

std::uint32_t compressor_idle_position() { return kernels::compressor_idle; }

int cuda_ops::comp_capacity() const { return p_->comp_cap; }
int cuda_ops::chunk_rows() const { return p_->chunk_rows; }
bool cuda_ops::chunk_outputs() const { return p_->chunk_outputs; }

void cuda_ops::bind(sub_batch& b) const {
    b.X = p_->X.p;
    b.Y = p_->Y.p;
}

const float* cuda_ops::logits() const { return p_->logits.p; }
float* cuda_ops::logits() { return p_->logits.p; }
float* cuda_ops::sampling_work() { return p_->sampling_work.p; }
void cuda_ops::set_kv(kv_arenas kv) { p_->kv = kv; }

op_profiler& cuda_ops::profiler() { return p_->prof; }
const op_profiler& cuda_ops::profiler() const { return p_->prof; }

std::uint64_t cuda_ops::scratch_bytes() const {
    const impl& p = *p_;
    std::uint64_t b = 0;
    for (const dev_array<float>* a : {&p.X, &p.Y, &p.x_in, &p.xn, &p.sub_out, &p.qr, &p.qn, &p.q, &p.o, &p.low, &p.kvv,
                                      &p.ckv, &p.cgate, &p.ikv, &p.igate, &p.iq_raw, &p.iw_raw, &p.split,
                                      &p.hc_partials, &p.logits, &p.act_d, &p.mv_partials, &p.ix_q, &p.ix_w,
                                      &p.ix_scores, &p.hc_flat, &p.hc_mix, &p.chunk_wts, &p.chunk_shared,
                                      &p.chunk_routed, &p.chunk_sh_g, &p.chunk_sh_u, &p.chunk_router, &p.sampling_work,
                                      &p.hc_row_scale})
        b += a->bytes();
    for (const auto& s : p.moe_scratch) b += s.bytes();
    return b + p.chunk_sel.bytes() + p.moe_gemm_ws.bytes() + p.act_qs.bytes() + p.mv_counters.bytes() +
           p.ix_hist.bytes() + p.ix_sel_state.bytes() + p.ix_block_counts.bytes() + p.ix_mask.bytes() +
           p.ix_selected.bytes() + p.ix_n_selected.bytes() + p.attn_scratch.bytes();
}

void cuda_ops::embed(batch& b) {
    b.post_owed = false;  // a new state: nothing of an earlier forward is owed
    b.scales_ready = false;
    op_scope sc(p_->prof, p_->stream, op_family::embed, f16_bytes(b.n, d_.n_embd));
    kernels::embedding_launch a;
    a.table = w_.token_embd;
    a.tokens = b.tokens;
    a.X = b.X;
    a.n_vocab = d_.n_vocab;
    a.n_embd = d_.n_embd;
    a.n_hc = d_.n_hc;
    a.n_rows = b.n_live;
    kernels::launch_embedding(a, b.capacity, p_->stream);
    p_->prof.count();
}

// The hc pre launch of a sub-batch, without a folded hc post: x_in and the split (or the output
// mix's e), and the RMSNorm that reads x_in next folded in (xn = (x_in * scale) * norm_weight).
kernels::hc_pre_launch cuda_ops::hc_launch_of(const batch& b, const hc_mix& hc, bool output_mix,
                                               const float* norm_weight) const {
    kernels::hc_pre_launch a;
    a.X = b.X;
    a.fn = hc.fn;
    a.scale = hc.scale;
    a.base = hc.base;
    a.n_embd = d_.n_embd;
    a.n_hc = d_.n_hc;
    a.iters = d_.n_hc_sinkhorn_iter;
    a.rms_eps = d_.rms_eps;
    a.hc_eps = d_.hc_eps;
    a.output_mix = output_mix;
    a.x_in = p_->x_in.p;
    a.x_in_stride = d_.n_embd;
    a.split = output_mix ? nullptr : p_->split.p;
    a.partials = p_->hc_partials.p;
    a.n_rows = b.n_live;
    a.norm_weight = norm_weight;
    a.norm_out = p_->xn.p;
    a.norm_stride = d_.n_embd;
    a.norm_eps = d_.rms_eps;
    return a;
}

// HC pre (into x_in and the split) or the output head's mix (into x_in, no split).
void cuda_ops::launch_hc(batch& b, const hc_mix& hc, bool output_mix, const float* norm_weight) {
    if (b.capacity > max_sub_rows && !output_mix) {
        // A chunk: in one launch (kernels/hyper_connection_chunk.cuh), or with DS4_HC_CHUNK=0 the
        // flat state's RMSNorm, the mix as one F16 GEMM, the split, x_in and the sublayer's norm
        // (kernels/hyper_connection_rows.cuh); the one-launch kernel below shares each row's dot
        // across blocks, which a chunk's rows do not need. The same bits either way.
        require(!b.post_owed, "cuda ops: internal error, an hc post owed to a chunk's hc pre");
        kernels::hc_pre_launch a = hc_launch_of(b, hc, false, norm_weight);
        if (p_->hc_chunk && b.scales_ready) a.row_scale = p_->hc_row_scale.p;
        b.scales_ready = false;
        if (p_->hc_chunk) {
            kernels::launch_hc_pre_chunk(a, b.capacity, p_->stream);
            p_->prof.count();
        } else {
            kernels::launch_hc_pre_rows(a, p_->hc_flat.p, p_->hc_mix.p, b.capacity, p_->stream);
            for (int k = 0; k < (norm_weight != nullptr ? 5 : 4); ++k) p_->prof.count();
        }
        return;
    }
    b.scales_ready = false;
    kernels::hc_pre_launch a = hc_launch_of(b, hc, output_mix, norm_weight);
    // The hc post that hc_post() left owed, folded in: this launch forms Y from X, the sublayer
    // output and the previous split, mixes it, and stores it for the next sublayer.
    const bool fold = b.post_owed;
    if (fold) {
        a.post_F = p_->sub_out.p;
        a.post_F_stride = d_.n_embd;
        a.post_split = p_->split.p;
        a.post_Y = b.Y;
    }
    kernels::launch_hc_pre(a, b.capacity, p_->stream);
    p_->prof.count();
    if (fold) {
        std::swap(b.X, b.Y);
        b.post_owed = false;
    }
}

// HC pre's launch carries the RMSNorm the layer program runs right after it (attn_norm,
// ffn_norm): hc_pre only names its weights and the norm op launches both, one launch less per
// sublayer (the profile counts that launch as hc_pre).
void cuda_ops::hc_pre(batch&, const hc_mix& hc) { pending_hc_ = &hc; }

void cuda_ops::hc_pre_with_norm(batch& b, const float* norm_weight) {
    require(pending_hc_ != nullptr, "cuda ops: internal error, a norm without the hc pre before it");
    op_scope sc(p_->prof, p_->stream, op_family::hc_pre, hc_bytes(d_));
    launch_hc(b, *pending_hc_, false, norm_weight);
    pending_hc_ = nullptr;
}

// Where the next hc pre can fold it in (kernels::hc_pre_folds_post: decode sub-batches of the
// flash shape), hc post is left owed to it (launch_hc); otherwise it runs here.
void cuda_ops::hc_post(batch& b, const hc_mix&) {
    if (p_->hc_fold && kernels::hc_pre_folds_post(d_.n_embd, d_.n_hc, b.capacity)) {
        b.post_owed = true;
        return;
    }
    launch_hc_post(b);
}

void cuda_ops::launch_hc_post(batch& b) {
    op_scope sc(p_->prof, p_->stream, op_family::hc_post, 0);
    kernels::hc_post_launch a;
    a.F = p_->sub_out.p;
    a.F_stride = d_.n_embd;
    a.X = b.X;
    a.split = p_->split.p;
    a.Y = b.Y;
    a.n_embd = d_.n_embd;
    a.n_hc = d_.n_hc;
    a.n_rows = b.n_live;
    // A chunk's hc post forms the scales its next (chunk) hc pre needs.
    b.scales_ready = p_->hc_post_scales && b.capacity > max_sub_rows;
    if (b.scales_ready) {
        a.row_scale = p_->hc_row_scale.p;
        a.rms_eps = d_.rms_eps;
    }
    kernels::launch_hc_post(a, b.capacity, p_->stream);
    p_->prof.count();
    std::swap(b.X, b.Y);
}

void cuda_ops::attn_norm(batch& b, const layer_weights& w) {
    hc_pre_with_norm(b, w.attn_norm);
    p_->fork();
}

void cuda_ops::q_path(batch& b, const layer_weights& w, int) {
    impl& p = *p_;
    op_scope sc(p.prof, p.stream, op_family::q_path, q8_bytes(w.q_a) + q8_bytes(w.q_b));
    p.q8(b, p.xn.p, d_.n_embd, w.q_a, p.qr.p, d_.n_lora_q);
    if (b.capacity <= max_sub_rows) {
        // q_a_norm folded into q_b's launch (one launch less on the critical path per layer);
        // its first CTA stores qn for the indexer's q_b.
        p.mv_rows(kernels::matvec_format::q8_0, p.qr.p, d_.n_lora_q, d_.n_lora_q, b.host_rows(), b.capacity,
                  {{w.q_b.quants, w.q_b.scales, w.q_b.rows, p.q.p, d_.q_dim()}},
                  {w.q_a_norm, d_.rms_eps, p.qn.p});
    } else {
        p.rms_norm(b, p.qr.p, d_.n_lora_q, w.q_a_norm, p.qn.p, d_.rms_eps);
        p.q8(b, p.qn.p, d_.n_lora_q, w.q_b, p.q.p, d_.q_dim());
    }
    kernels::norm_rope_launch a;
    a.x = p.q.p;
    a.out = p.q.p;
    a.x_stride = a.out_stride = d_.q_dim();
    a.n_head = d_.n_head;
    a.head_dim = d_.head_dim;
    a.eps = d_.rms_eps;
    a.n_rot = d_.n_rot;
    a.rope = w.rope;
    a.pos = b.pos;
    a.n_rows = b.n_live;
    a.q16 = p.q16.p;
    kernels::launch_norm_rope(a, b.capacity, p.stream);
    p.prof.count();
}

void cuda_ops::kv_path(batch& b, const layer_weights& w, int il, int ratio) {
    impl& p = *p_;
    struct side_guard {
        impl& p;
        explicit side_guard(impl& q) : p(q) { p.enter_side(); }
        ~side_guard() { p.leave_side(); }
    } on_side(p);
    const int hd = d_.head_dim;
    std::optional<op_scope> sc(std::in_place, p.prof, p.stream, op_family::kv_path, q8_bytes(w.kv));
    p.q8(b, p.xn.p, d_.n_embd, w.kv, p.kvv.p, hd);
    kernels::kv_store_launch ks{};
    // kv_norm folded into the store (its launch gone from the side stream).
    ks.norm_weight = w.kv_norm;
    ks.norm_eps = d_.rms_eps;
    ks.early_index = true;  // positions, slots and tables: the step's uploads
    ks.kv = p.kvv.p;
    ks.pos = b.pos;
    ks.seq = b.row_slot;
    ks.n_rows = b.n_live;
    ks.page_table = b.raw_tables + std::size_t(il) * b.capacity * b.raw_stride;
    ks.pages = p.kv.attn;
    ks.table_stride = b.raw_stride;
    ks.layout = p.attn_row;
    ks.rope = w.rope;
    kernels::kv_store(ks, b.capacity, p.stream);
    p.prof.count();
    if (ratio == 0) return;

    // Compressor projections (F16, one launch for both compressors of a ratio-4 layer); a decode
    // step's run on the third stream beside the kv store.
    const int cw = (ratio == 4 ? 2 : 1) * hd, iw = 2 * d_.indexer_head_dim;
    sc.reset();
    if (b.decode) p.enter_side2();
    const int nh = d_.n_indexer_head;
    sc.emplace(p.prof, p.stream, op_family::compressor,
               f16_bytes(2 * cw + (ratio == 4 ? 2 * iw + nh : 0), d_.n_embd));
    using kernels::matvec_format;
    // A ratio-4 layer's indexer head weights read xn too: they ride in the compressors' launch on
    // this stream instead of a launch of their own on the main stream after the join.
    if (ratio == 4)
        p.mv(matvec_format::f16, b, p.xn.p, d_.n_embd, d_.n_embd,
             {{w.attn_comp.wkv, nullptr, cw, p.ckv.p, cw},
              {w.attn_comp.wgate, nullptr, cw, p.cgate.p, cw},
              {w.idx_comp.wkv, nullptr, iw, p.ikv.p, iw},
              {w.idx_comp.wgate, nullptr, iw, p.igate.p, iw},
              {w.idx_proj, nullptr, nh, p.iw_raw.p, nh}});
    else
        p.mv(matvec_format::f16, b, p.xn.p, d_.n_embd, d_.n_embd,
             {{w.attn_comp.wkv, nullptr, cw, p.ckv.p, cw}, {w.attn_comp.wgate, nullptr, cw, p.cgate.p, cw}});

    // Each sequence's rows in order: a chunk launch for the rows nobody can roll back to, then
    // the rows that first save the frontier they start from (truncate's history): one run-form
    // launch (tail_runs), or a launch and a copy per row.
    const std::size_t cap = std::size_t(b.capacity);
    auto stream_of = [&](const compressor_slots& state, kernels::compressor_kind kind, int first) {
        const compressor_slots::layer& st = state.layers[std::size_t(il)];
        kernels::compressor_stream c;
        const bool idx = kind == kernels::compressor_kind::indexer;
        c.kind = kind;
        c.ratio = ratio;
        c.head_dim = idx ? d_.indexer_head_dim : hd;
        c.n_rot = d_.n_rot;
        const compressor_mats& m = idx ? w.idx_comp : w.attn_comp;
        c.ape = m.ape;
        c.norm = m.norm;
        const int width = idx ? iw : cw;
        c.kv = (idx ? p.ikv.p : p.ckv.p) + std::size_t(first) * width;
        c.gate = (idx ? p.igate.p : p.cgate.p) + std::size_t(first) * width;
        c.proj_stride = width;
        const std::size_t floats = idx ? st.idx_floats : st.attn_floats;
        c.state_kv = idx ? st.idx : st.attn;
        c.state_score = c.state_kv + floats;
        c.state_stride = floats;
        c.out.pool = idx ? p.kv.idx : p.kv.attn;
        c.out.table = (idx ? b.idx_tables : b.comp_tables) + (std::size_t(il) * cap + std::size_t(first)) * b.comp_stride;
        c.out.table_stride = b.comp_stride;
        c.out.row_bytes = idx ? p.idx_row.bytes() : p.attn_row.bytes();
        c.rope = w.rope;
        c.eps = d_.rms_eps;
        return c;
    };
    // The run form: block r takes run_rows[r] rows in order through the state row_state[r] points
    // to, each later row saving its frontier (save_slot) first. Rows from `first` on; the layout
    // of `state`'s block is every sequence's.
    auto run_form = [&](const compressor_slots& state, int first, int n_seq, bool runs) {
        kernels::compressor_decode_launch a;
        a.n_streams = ratio == 4 ? 2 : 1;
        for (int i = 0; i < a.n_streams; ++i) {
            const auto kind = i == 0 ? kernels::compressor_kind::attention : kernels::compressor_kind::indexer;
            kernels::compressor_stream& c = a.s[i];
            c = stream_of(state, kind, first);
            c.row_state = b.row_state + first;
            c.row_kv_offset = std::size_t(c.state_kv - state.block);
            c.row_score_offset = std::size_t(c.state_score - state.block);
            c.state_kv = c.state_score = nullptr;
            c.state_stride = 0;
        }
        a.pos = b.upos + first;
        a.n_seq = n_seq;
        if (runs) {
            a.run_rows = b.run_rows + first;
            a.save_slot = b.save_slot + first;
        }
        kernels::launch_compressor_decode(a, p.stream);
        p.prof.count();
    };
    if (b.decode) {
        run_form(*b.runs.front().state, 0, b.capacity, b.multi_row_runs);
        return;
    }
    for (const sequence_run& run : b.runs) {
        const compressor_slots::layer& st = run.state->layers[std::size_t(il)];
        auto launch = [&](int first, int n) {
            kernels::compressor_prefill_launch a;
            a.s[0] = stream_of(*run.state, kernels::compressor_kind::attention, first);
            a.n_streams = 1;
            if (ratio == 4) {
                a.s[1] = stream_of(*run.state, kernels::compressor_kind::indexer, first);
                a.n_streams = 2;
            }
            a.pos0 = b.upos + first;
            a.seq = 0;
            a.n_tokens = n;
            kernels::launch_compressor_prefill(a, p.stream);
            p.prof.count();
        };
        const int n_plain = run.plain_rows();
        if (n_plain > 0) launch(run.first_row, n_plain);
        if (b.tail_runs) {
            if (n_plain < run.n_rows) run_form(*run.state, run.first_row + n_plain, 1, true);
            continue;
        }
        for (int k = n_plain; k < run.n_rows; ++k) {
            const int slot = 1 + (run.first_pos + k) % run.state->ring;
            auto save = [&](float* base, std::size_t floats) {
                if (base == nullptr) return;
                cuda_check(cudaMemcpyAsync(base + std::size_t(slot) * 2 * floats, base, 2 * floats * sizeof(float),
                                           cudaMemcpyDeviceToDevice, p.stream),
                           "compressor frontier save");
                p.prof.count();
            };
            if (k == 0 && run.first_saved) {
                launch(run.first_row, 1);
                continue;
            }
            save(st.attn, st.attn_floats);
            if (ratio == 4) save(st.idx, st.idx_floats);
            launch(run.first_row + k, 1);
        }
    }
}

void cuda_ops::launch_indexer_q(batch& b, const layer_weights& w) {
    impl& p = *p_;
    const int nh = d_.n_indexer_head;
    op_scope sc(p.prof, p.stream, op_family::indexer, f16_bytes(std::int64_t(nh) * kernels::indexer_dim, d_.n_lora_q));
    p.mv(kernels::matvec_format::f16, b, p.qn.p, d_.n_lora_q, d_.n_lora_q,
         {{w.idx_q_b, nullptr, nh * kernels::indexer_dim, p.iq_raw.p, nh * kernels::indexer_dim}});
}

void cuda_ops::indexer_select(batch& b, const layer_weights& w, int il) {
    impl& p = *p_;
    const int nh = d_.n_indexer_head;
    // The q projection reads qn only (the main stream's), so it runs before the join, beside the
    // side stream's compressors; the head weights came with the compressors (kv_path).
    launch_indexer_q(b, w);
    op_scope sc(p.prof, p.stream, op_family::indexer, 0);
    p.join();
    // Rows with no more than top_k compressed rows get no selection written: every row visible.
    // Only the exact attention reads the mask (the tensor-core kernels take the list and its
    // count), so only exact mode resets it: a memset node between the join and the indexer held
    // the indexer ~12 us a ratio-4 layer in the decode graph (bench/NOTES.md, 2026-12-04).
    if (p.exact) {
        cuda_check(cudaMemsetAsync(p.ix_mask.p, 1, std::size_t(b.capacity) * sz(p.comp_cap), p.stream),
                   "indexer mask reset");
        p.prof.count();
    }
    kernels::indexer_launch a;
    a.n_head = nh;
    a.top_k = d_.indexer_top_k;
    a.n_seq = b.capacity;
    a.n_comp_capacity = p.comp_cap;
    a.pos = b.upos;
    a.n_comp = b.n_comp + std::size_t(il) * b.capacity;
    a.q_raw = p.iq_raw.p;
    a.q_stride = nh * kernels::indexer_dim;
    a.w_raw = p.iw_raw.p;
    a.w_stride = nh;
    a.w_scale = 1.0f / std::sqrt(float(kernels::indexer_dim * nh));
    a.rope = w.rope;
    a.q = p.ix_q.p;
    a.w = p.ix_w.p;
    a.keys.pool = p.kv.idx;
    a.keys.table = b.idx_tables + std::size_t(il) * b.capacity * b.comp_stride;
    a.keys.table_stride = b.comp_stride;
    a.keys.row_bytes = p.idx_row.bytes();
    a.scores = p.ix_scores.p;
    a.hist = p.ix_hist.p;
    a.sel_state = p.ix_sel_state.p;
    a.block_counts = p.ix_block_counts.p;
    a.mask = p.ix_mask.p;
    a.selected = p.ix_selected.p;
    a.n_selected = p.ix_n_selected.p;
    a.q_int8 = p.ix_q_int8.p;
    a.w_int8 = p.ix_w_int8.p;
    a.head_int8 = p.ix_head_int8.p;
    // The scalar scores kernel (the int8 path's fallback, idle on well-formed keys) beside the int8
    // one on the side stream, joined above: one launch less on the ratio-4 layer's chain.
    kernels::indexer_side side;
    if (p.overlap()) side = {p.side, {p.ix_ev[0], p.ix_ev[1]}};
    kernels::launch_indexer(a, p.stream, side);
    p.prof.count();
}

void cuda_ops::attention(batch& b, const layer_weights& w, int il, int ratio) {
    impl& p = *p_;
    p.join();
    op_scope sc(p.prof, p.stream, op_family::attention, 0);
    if (p.rows_attention) {
        // One launch over the sub-batch: row r's query, output, position, page tables and
        // indexer list are the sub-batch's row r (its tables start at raw entry raw_base, which
        // no row's window reads below); rows past n_live exit.
        kernels::attention_prefill_args a{};
        a.q = p.q.p;
        a.out = p.o.p;
        a.sinks = w.sinks;
        a.raw_pages = p.kv.attn;
        a.raw_page_table = b.raw_tables + std::size_t(il) * b.capacity * b.raw_stride;
        a.raw_table_stride = b.raw_stride;
        a.comp_pages = p.kv.attn;
        a.comp_page_table = b.comp_tables + std::size_t(il) * b.capacity * b.comp_stride;
        a.comp_table_stride = b.comp_stride;
        a.tok_pos = b.pos;
        a.n_live = b.n_live;
        a.n_tok = b.capacity;
        a.rope = w.rope;
        if (ratio == 4) {  // the indexer's ascending lists; a count of 0: every row
            a.comp_sel = p.ix_selected.p;
            a.comp_nsel = p.ix_n_selected.p;
            a.comp_sel_stride = d_.indexer_top_k;
        }
        kernels::attention_prefill({d_.n_head, d_.head_dim, d_.n_rot, d_.n_swa, ratio}, a, p.stream);
        p.prof.count();
        return;
    }
    const kernels::attention_decode_shape shape{d_.n_head, d_.head_dim, d_.n_rot, d_.n_swa};
    // Sequence slots [s0, s0 + slots) of the sub-batch (one row each): a small sub-batch in one
    // launch, a chunk in slices. The query, position, count, mask and selection arrays stay
    // indexed by the sub-batch's row, which seq_tok0 (iota) names; the tables and the slot
    // arrays start at the slice.
    auto launch = [&](int s0, int slots) {
        kernels::attention_decode_capacity capacity{slots, 1, p.comp_cap};
        kernels::attention_decode_args a{};
        a.q = p.q.p;
        a.out = p.o.p;
        a.sinks = w.sinks;
        a.raw_pages = p.kv.attn;
        a.raw_page_table = b.raw_tables + (std::size_t(il) * b.capacity + std::size_t(s0)) * b.raw_stride;
        a.comp_pages = p.kv.attn;
        a.comp_page_table = b.comp_tables + (std::size_t(il) * b.capacity + std::size_t(s0)) * b.comp_stride;
        a.seq_tok0 = b.iota + s0;
        a.seq_ntok = b.one + s0;
        a.tok_pos = b.pos;
        a.tok_n_comp = b.n_comp + std::size_t(il) * b.capacity;
        a.raw_table_stride = b.raw_stride;
        a.comp_table_stride = b.comp_stride;
        a.rope = w.rope;
        p.prof.count();
        if (p.exact) {
            a.comp_mask = ratio == 4 ? p.ix_mask.p : nullptr;
            a.comp_mask_stride = p.comp_cap;
            kernels::attention_decode(kernels::attention_decode_plan::make(shape, capacity), a, p.attn_scratch.p,
                                      p.stream);
            return;
        }
        // Tensor cores: the indexer's ascending list instead of the mask (a count of 0: every row),
        // and only the slots a row of this layer can fill (the merge skips empty ones, so the
        // slot count never changes a result).
        capacity.max_comp = p.comp_visible(ratio, d_.indexer_top_k);
        a.comp_mask = nullptr;
        a.q16 = p.q16.p;
        if (ratio == 4) {
            a.comp_sel = p.ix_selected.p;
            a.comp_nsel = p.ix_n_selected.p;
            a.comp_sel_stride = d_.indexer_top_k;
        }
        kernels::attention_decode_mma(kernels::attention_decode_mma_plan::make(shape, capacity, p.mma_split_rows), a,
                                      p.attn_scratch.p, p.stream);
    };
    if (b.capacity <= max_sub_rows) return launch(0, b.capacity);
    // A chunk: exact mode in 16-row slices (its scratch is sized for those), tensor cores in
    // groups of attn_group rows.
    const int group = p.exact ? max_sub_rows : p.attn_group;
    for (int off = 0; off < b.n; off += group) launch(off, p.exact ? max_sub_rows : std::min(group, b.n - off));
}

void cuda_ops::out_proj(batch& b, const layer_weights& w) {
    impl& p = *p_;
    const int qd = d_.q_dim(), gin = d_.group_in();
    op_scope sc(p.prof, p.stream, op_family::out_proj, q8_bytes(w.out_a) + q8_bytes(w.out_b));
    // Group g: rows [g * n_lora_o, (g + 1) * n_lora_o) of out_a on its slice of the heads.
    const auto L = q8_0_tiled_layout::make(w.out_a.rows, w.out_a.in);
    const std::size_t tiles_per_group = std::size_t(d_.n_lora_o / tile_rows);
    if (b.capacity > max_sub_rows) {
        // The GEMM reads the chunk's o quantized once; the matvec below quantizes in-kernel.
        kernels::quantize_act_launch qa;
        qa.x = p.o.p;
        qa.x_stride = qd;
        qa.n = qd;
        qa.qs = p.act_qs.p;
        qa.d = p.act_d.p;
        qa.n_rows = b.n_live;
        kernels::launch_quantize_act(qa, b.capacity, p.stream);
        p.prof.count();
        kernels::gemm_q8_0_shape shape;
        shape.in = gin;
        shape.n_matrices = d_.n_out_group;
        kernels::gemm_q8_0_args g;
        g.n_rows = b.n;
        for (int k = 0; k < d_.n_out_group; ++k) {
            shape.rows[k] = d_.n_lora_o;
            g.m[k] = {w.out_a.quants + std::size_t(k) * tiles_per_group * L.nb8 * 1024,
                      w.out_a.scales + std::size_t(k) * tiles_per_group * L.nb8 * 32,
                      p.low.p + std::size_t(k) * d_.n_lora_o,
                      d_.n_lora_o,
                      d_.lora_o_total(),
                      p.act_qs.p + std::size_t(k) * gin,
                      p.act_d.p + std::size_t(k) * (gin / 32),
                      qd};
        }
        kernels::gemm_q8_0(kernels::gemm_q8_0_plan::make(shape, b.capacity, p.gemm_variant(shape, b.capacity)), g, p.gemm_ws.p, p.stream);
        p.prof.count();
        p.q8(b, p.low.p, d_.lora_o_total(), w.out_b, p.sub_out.p, d_.n_embd);
        return;
    }
    // Every group's matvec in one launch, each quantizing its own heads of o in-kernel (x_col):
    // no quantize_act launch between the attention and out_a.
    std::vector<mv_out> groups;
    for (int g = 0; g < d_.n_out_group; ++g)
        groups.push_back({w.out_a.quants + std::size_t(g) * tiles_per_group * L.nb8 * 1024,
                          w.out_a.scales + std::size_t(g) * tiles_per_group * L.nb8 * 32, d_.n_lora_o,
                          p.low.p + std::size_t(g) * d_.n_lora_o, d_.lora_o_total(), nullptr, nullptr, 0, g * gin});
    p.mv_rows(kernels::matvec_format::q8_0, p.o.p, qd, gin, b.host_rows(), b.capacity, groups);
    p.q8(b, p.low.p, d_.lora_o_total(), w.out_b, p.sub_out.p, d_.n_embd);
}

void cuda_ops::ffn_norm(batch& b, const layer_weights& w) { hc_pre_with_norm(b, w.ffn_norm); }

void cuda_ops::route(batch& b, const layer_weights& w, bool hashed) {
    impl& p = *p_;
    op_scope sc(p.prof, p.stream, op_family::moe, moe_bytes(d_, b.n));
    p.prof.count();
    kernels::moe_weights mw = w.moe;
    if (!hashed) mw.tid2eid = nullptr;
    if (b.capacity > max_sub_rows && p.moe_gemm) {
        // The router logits of every row as one F16 GEMM and the routes from them, the shared
        // expert as two Q8_0 GEMMs around its SwiGLU, the routed experts as one grouped GEMM,
        // then the sum.
        p.gemm_f16(b, p.xn.p, d_.n_embd, d_.n_embd, {{mw.router, nullptr, d_.n_expert, p.chunk_router.p, d_.n_expert}},
                   false);
        kernels::launch_moe_route_rows(p.moe_plans.front().shape(), mw, p.chunk_router.p, b.tokens, b.n, p.chunk_sel.p,
                                       p.chunk_wts.p, p.stream);
        p.prof.count();
        const int nfs = d_.n_ff_exp;
        p.mv(kernels::matvec_format::q8_0, b, p.xn.p, d_.n_embd, d_.n_embd,
             {{mw.sh_gate_q, mw.sh_gate_d, nfs, p.chunk_sh_g.p, nfs}, {mw.sh_up_q, mw.sh_up_d, nfs, p.chunk_sh_u.p, nfs}});
        launch_kernel("moe_shared_act_kernel", kernels::moe_shared_act_kernel<>,
                      dim3(unsigned((nfs + 255) / 256), unsigned(b.n)), 256, 0, p.stream, p.chunk_sh_g.p, p.chunk_sh_u.p,
                      p.chunk_sh_g.p, nfs, b.n, mw.clamp);
        cuda_check_launch("moe chunk shared swiglu");
        p.prof.count();
        p.mv(kernels::matvec_format::q8_0, b, p.chunk_sh_g.p, nfs, nfs,
             {{mw.sh_down_q, mw.sh_down_d, d_.n_embd, p.chunk_shared.p, d_.n_embd}});
        kernels::moe_gemm_args g;
        g.n_rows = b.n;
        g.xn = p.xn.p;
        g.x_stride = d_.n_embd;
        g.sel = p.chunk_sel.p;
        g.wts = p.chunk_wts.p;
        static_cast<kernels::moe_routed_weights&>(g) = mw;
        g.clamp = mw.clamp;
        g.out = p.chunk_routed.p;
        g.out_stride = d_.n_embd;
        void* ws = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(p.moe_gemm_ws.p) + 255) / 256 * 256);
        kernels::moe_gemm(*p.moe_gemm_plan, g, ws, p.stream);
        p.prof.count();
        launch_kernel("moe_chunk_sum", moe_chunk_sum, dim3(unsigned((d_.n_embd + 255) / 256), unsigned(b.n)), 256, 0,
                      p.stream, p.chunk_routed.p, p.chunk_shared.p, p.sub_out.p, d_.n_embd, b.n);
        cuda_check_launch("moe chunk sum");
        p.prof.count();
        return;
    }
    // A chunk in slices of max_sub_rows rows (the decode plans' limit).
    for (int off = 0; off < b.n; off += max_sub_rows) {
        const int rows = b.capacity > max_sub_rows ? std::min(max_sub_rows, b.n - off) : b.host_rows();
        int k = 0;
        while ((1 << k) < (b.capacity > max_sub_rows ? rows : b.capacity)) ++k;
        const std::size_t x_off = std::size_t(off) * sz(d_.n_embd);
        kernels::moe_side side;
        if (p.overlap()) side = {p.side, {p.moe_ev[0], p.moe_ev[1]}};
        p.moe_plans[std::size_t(k)].launch(mw, p.xn.p + x_off, d_.n_embd, b.tokens + off, rows, p.sub_out.p + x_off,
                                           d_.n_embd, p.moe_scratch[std::size_t(k)].p, p.stream,
                                           b.bucketed ? b.n_live : nullptr, side);
        p.prof.count();
    }
}

void cuda_ops::output_head(batch& b, const head_weights& h) {
    if (!b.any_output) {
        if (b.post_owed) launch_hc_post(b);  // the final state, complete for whoever reads it
        return;
    }
    require(b.capacity <= max_sub_rows || p_->chunk_outputs, "cuda ops: internal error, a chunk sub-batch wants output");
    impl& p = *p_;
    op_scope sc(p.prof, p.stream, op_family::output_head, hc_bytes(d_) + q8_bytes(h.output));
    launch_hc(b, h.hc, true, h.norm);  // the output norm folded in
    p.q8(b, p.xn.p, d_.n_embd, h.output, p.logits.p, d_.n_vocab);
}

}  // namespace ds4::cuda_backend
