#pragma once
// KV store for decode and verify rows of many sequences (docs/model.md §2.4 steps 4-6, docs/README.md decision 6):
// the kv vector after its RMSNorm (F32, head_dim values) gets RoPE on its last n_rot dims at the
// row's position (core/rope.hpp, the layer's parameters), then the native row of kv_layout.hpp
// (E4M3 codes of the nope dims with block-64 power-of-two exponents, F16 RoPE tail, zero pad) is
// written into the sequence's page at row `pos` (raw rows are addressed by absolute position, as
// the CPU engine's kv_page_table::row_for_write(pos)).
//
// The kv vector's RMSNorm can be folded in (norm_weight set): the CTA computes the row's
// rms_scale in core/reduce.hpp's lane order (block_lane_reduce: the adds of rms_sum_squares) and
// stores (x * scale) * w, the bits of reference rms_norm, saving the kv_norm launch per layer.
// A row holding a NaN becomes NaN through that product, and a NaN made by arithmetic has the
// platform's sign (the GPU's canonical NaN is positive, x86 keeps an operand's): with the fold,
// NaN codes agree with the host as NaN, not in their sign bit.
//
// Contract: exact. The bytes equal model::encode_attention_row(ref rope_tail(kv)) on the host:
// the E4M3 encode is format/e4m3.hpp's integer rounding (no hardware FP8 conversion), the block
// amax a warp max of |x| (order-free: max of non-negative values, NaN ignored as max_num), the
// angle rope_theta (the same iterated product as rope_tail_inplace), the F16 tail f32_to_f16.
// harness/validate/attention_checks.cu compares bytes on edge values (ties, 448, smallest normal
// and subnormal, zero, -0, NaN, Inf) and random rows.
//
// Graph contract: no allocation, no host synchronisation; positions, sequence slots and page
// tables are read from device memory; the grid is the row capacity (one CTA per row, rows with a
// negative sequence slot or beyond *n_rows exit at once). Pages must exist before the launch
// (the engine allocates/copies pages on the host side of the step); a row whose page id is
// negative is not written.
// Shapes: head_dim = nope + n_rot, nope a multiple of 64 with nope/64 <= 7, n_rot = 64. Pages of
// kv_page_rows rows; page p starts at pages + p * kv_page_rows * row_bytes.
// Bytes per row: head_dim * 4 read + 4 + 4 + row_bytes written (592 B at flash).
#include <cuda_runtime.h>

#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int kv_store_threads = 256;  // 7 E4M3 block warps + the RoPE tail warp

struct kv_store_launch {
    const float* kv;              // [row_cap][head_dim]
    const std::int32_t* pos;      // [row_cap]
    const std::int32_t* seq;      // [row_cap] sequence slot, < 0 = idle row
    const std::int32_t* n_rows;   // live rows (device scalar), or nullptr for all row_cap
    const std::int32_t* page_table;  // [n_seq][table_stride] page ids, row pos in entry pos / kv_page_rows
    std::uint8_t* pages;
    int table_stride;
    model::attention_row_layout layout;
    rope_params rope;
    // Optional RMSNorm of kv before RoPE and encoding: [head_dim] weight (null: kv is normalised).
    const float* norm_weight = nullptr;
    float norm_eps = 0.0f;
    // n_rows, seq, pos and the page table are not written by the launch just before this one in
    // the stream (earlier launches are complete once this one runs, core/launch.hpp): they are read
    // before the PDL wait, so that past it the chain is kv's load, the norm and the stores. The
    // backend sets it (the step's uploads; the kv projection or GEMM comes before it).
    bool early_index = false;
};

// The kernel is a template only for linkage: this header may be included by several
// translation units, and a __global__ function cannot be inline.
template <int = 0>
__global__ void __launch_bounds__(kv_store_threads) kv_store_kernel(const __grid_constant__ kv_store_launch a) {
    const int row = static_cast<int>(blockIdx.x);
    const model::attention_row_layout L = a.layout;
    const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
    // The thread's pair of the norm weights (weights: before the wait): block `warp`'s values
    // 2*lane and 2*lane+1, or the RoPE tail's pair `lane`.
    const int k_pair = warp < L.n_blocks() ? warp * e4m3_block_size / 2 + lane
                       : warp == L.n_blocks() && lane < L.n_rot / 2 ? L.n_nope() / 2 + lane
                                                                     : -1;
    float2 nw = make_float2(1.0f, 1.0f);
    if (a.norm_weight && k_pair >= 0) nw = reinterpret_cast<const float2*>(a.norm_weight)[k_pair];
    int pos = -1;
    std::uint8_t* dst = nullptr;
    const auto index = [&] {
        if (a.n_rows && row >= *a.n_rows) return;
        const int s = a.seq[row];
        const int p = a.pos[row];
        if (s < 0 || p < 0) return;
        const std::int32_t page = a.page_table[std::int64_t(s) * a.table_stride + p / model::kv_page_rows];
        if (page < 0) return;
        pos = p;
        dst = a.pages + (std::int64_t(page) * model::kv_page_rows + p % model::kv_page_rows) * L.bytes();
    };
    if (a.early_index) index();
    pdl_enter();
    if (!a.early_index) index();
    if (dst == nullptr) return;
    const float* x = a.kv + std::int64_t(row) * (L.n_nope() + L.n_rot);
    // Every return above is uniform over the block, so all threads reach the reduction's barriers.
    float scale = 1.0f;
    if (a.norm_weight) {
        __shared__ double scratch[kv_store_threads];
        const double ss = block_lane_reduce<kv_store_threads, double>(
            L.n_nope() + L.n_rot, [x](int i) { return square_f64(x[i]); }, scratch);
        scale = rms_scale_from_sum(ss, L.n_nope() + L.n_rot, a.norm_eps);
    }
    // Values 2k and 2k+1 as the reference's norm leaves them; k is the thread's k_pair (nw's).
    auto pair = [&](int k) {
        float2 v = reinterpret_cast<const float2*>(x)[k];
        if (a.norm_weight) v = make_float2(mul_rn(mul_rn(v.x, scale), nw.x), mul_rn(mul_rn(v.y, scale), nw.y));
        return v;
    };
    if (warp < L.n_blocks()) {
        // Block `warp`: lane owns values 2*lane and 2*lane+1.
        const float2 v = pair(warp * e4m3_block_size / 2 + lane);
        float amax = max_num(abs_exact(v.x), abs_exact(v.y));
        for (int o = 16; o > 0; o >>= 1) amax = max_num(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        amax = max_num(amax, e4m3_amax_floor);
        const int e = ceil_log2(div_rn(amax, e4m3_max));
        const float inv_scale = exp2i(-e);
        const std::uint8_t c0 = e4m3_encode_scaled(v.x, inv_scale);
        const std::uint8_t c1 = e4m3_encode_scaled(v.y, inv_scale);
        reinterpret_cast<std::uint16_t*>(dst + warp * e4m3_block_size)[lane] =
            static_cast<std::uint16_t>(c0 | (c1 << 8));
        if (lane == 0) dst[L.exponent_offset() + warp] = static_cast<std::uint8_t>(model::kv_exponent_byte(e));
    } else if (warp == L.n_blocks()) {
        // The RoPE tail: lane k rotates pair k (n_rot = 64), then the zero pad after the exponents.
        if (lane < L.n_rot / 2) {
            const float2 v = pair(L.n_nope() / 2 + lane);
            float x0 = v.x, x1 = v.y, sn, cs;
            sincos_f32(rope_theta(a.rope, static_cast<std::uint32_t>(pos), lane), &sn, &cs);
            rope_rotate(x0, x1, cs, sn);
            const std::uint32_t h = std::uint32_t(f32_to_f16(x0)) | (std::uint32_t(f32_to_f16(x1)) << 16);
            reinterpret_cast<std::uint32_t*>(dst + L.rope_offset())[lane] = h;
        }
        for (int i = L.exponent_offset() + L.n_blocks() + lane; i < L.bytes(); i += 32) dst[i] = 0;
    }
}

// Stores rows [0, row_cap) (those live per n_rows/seq) on `stream`. kv, pos, seq, n_rows and the
// page table are device pointers; nothing is read on the host.
inline void kv_store(const kv_store_launch& a, int row_cap, cudaStream_t stream) {
    require(a.layout.n_rot == 64 && a.layout.n_nope() % e4m3_block_size == 0 && a.layout.n_blocks() >= 1 &&
                a.layout.n_blocks() < kv_store_threads / 32,
            "kv_store: head_dim must be 64*k + 64 with k in 1..7");
    if (row_cap <= 0) return;
    launch_kernel("kv_store_kernel", kv_store_kernel<>, row_cap, kv_store_threads, 0, stream, a);
    cuda_check_launch("kv_store");
}

}  // namespace ds4::kernels
