#pragma once
// Prefill attention for one sequence's chunk of n_tok query tokens at positions p0 .. p0+n_tok-1
// (docs/model.md §2.4 steps 9-10) on tensor cores: mma.sync.m16n8k16, f16 operands, fp32 accumulation.
// MQA: all n_head heads use the same K=V row. Token t (position pos) sees the raw window rows
// max(0, pos-n_swa+1) .. pos and the compressed rows c < n_comp(pos) = (pos+1) / ratio (ratio 0:
// none), all of them or, on ratio-4 layers past top_k rows, the indexer's per-token selection
// (args.comp_sel: ascending lists, attended in 64-row runs).
// The head's sink joins the denominator; inverse RoPE on the output's last n_rot dims at pos.
// Rows are native kv_layout.hpp rows in pages (raw row at absolute position p in raw page table
// entry p / 64, compressed row c in entry c / 64), decoded to F16 in shared memory: exact, the
// stored values are F16 values (decode_attention_row).
//
// Contract: bounded. q * log2(e)/sqrt(head_dim) is rounded to F16 (relative 2^-11 per element)
// and p = exp2(s - m) is rounded to F16 for the P.V product (m: the running max, or on the wgmma
// loop a base within 8 of it, so p <= 2^8); scores, softmax state, sums and
// outputs are fp32 (ex2.approx). Row order differs from the reference (online softmax over 64-row
// tiles: raw pages ascending, then compressed pages ascending), so the result is not bitwise.
// Measured against an fp64 evaluation of the same formula on the same stored rows by ds4-validate
// (attention_prefill rows): relative L2 <= 3e-3 over a case, every element within 3e-2 absolute
// (outputs are convex combinations of rows of unit scale); NaN/Inf positions equal. The max
// difference to the sequential F32 reference is reported beside it.
// Graph contract: no allocation, no host synchronisation, no scratch; page tables are read on the
// device. Eager launches take p0 and n_tok as launch values; a captured launch reads them from
// args.chunk (device memory) and n_tok is the capacity: the grid is one CTA per capacity token and
// CTAs past the live count exit, so one graph serves every chunk of up to n_tok tokens at any p0.
// Per-token rows (args.tok_pos): rows of several sequences in one launch, each with its own
// position and page tables and the live count from device memory (the CUDA backend's sub-batch).
// Probes and opt-ins: prepare_attention_prefill(device) before capture.
// Shapes: head_dim 128 or 512, n_rot 64, n_head a multiple of 8 up to 64.
//
// Work split: one CTA per token (the tokens with most rows launch first). head_dim 512 on sm_90a
// runs attention_wgmma.cuh's loop (S and half of P.V by warpgroup 0, the other half by warpgroup
// 1, the exact row conversion two tiles ahead by warpgroups 2 and 3); elsewhere attention_mma.cuh's
// mma.sync loop (16 warps, 4 per 16-head group; cp.async-staged, exactly decoded F16 tiles), which
// is bound by shared-memory wavefronts (every head group re-reads the K=V tile and its q
// fragments). Both decode rows to the same exact F16 values; figures in bench/RESULTS.md.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/kernels/attention_mma.cuh"
#include "ds4/kernels/attention_wgmma.cuh"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int prefill_tile_rows = model::kv_page_rows;  // one page per K=V tile
inline constexpr int prefill_threads = 512;
inline constexpr int prefill_max_heads = 64;

struct attention_prefill_shape {
    int n_head = 0, head_dim = 0, n_rot = 0, n_swa = 0;
    int ratio = 0;  // compressed rows visible to pos: (pos + 1) / ratio; 0 = no compressed rows
};

struct attention_prefill_args {
    const float* q;      // [n_tok][n_head][head_dim], after RoPE
    float* out;          // [n_tok][n_head][head_dim]
    const float* sinks;  // [n_head]
    const std::uint8_t* raw_pages;
    const std::int32_t* raw_page_table;  // entry p / 64 for the raw row at absolute position p
    const std::uint8_t* comp_pages;
    const std::int32_t* comp_page_table;  // entry c / 64 for compressed row c
    int p0 = 0, n_tok = 0;
    rope_params rope;
    // A launch captured into a graph reads {p0, live n_tok} here, on the device; n_tok above is
    // then the capacity (the grid), and CTAs past the live count exit. Null: p0 and n_tok above.
    const std::int32_t* chunk = nullptr;
    // The indexer's selection per token (ratio-4 layers past top_k compressed rows): comp_sel +
    // t * comp_sel_stride holds comp_nsel[t] ascending rows; a count of 0 (or no list) means every
    // row below n_comp(pos) is visible.
    const std::int32_t* comp_sel = nullptr;
    const std::int32_t* comp_nsel = nullptr;
    int comp_sel_stride = 0;
    // Rows of several sequences in one launch (a sub-batch as the CUDA backend lays it out, each
    // sequence's rows contiguous): tok_pos non-null gives token t's position (p0 and chunk are
    // unused) and its own page tables at raw_page_table + t * raw_table_stride and comp_page_table
    // + t * comp_table_stride; n_live (device memory, may be null) is the live token count, and
    // n_tok the grid's capacity. A token's result does not depend on the tokens beside it.
    const std::int32_t* tok_pos = nullptr;
    const std::int32_t* n_live = nullptr;
    int raw_table_stride = 0, comp_table_stride = 0;
};


namespace prefill_detail {

// The chunk a launch computes: from device memory when captured (args.chunk), else the launch
// values; per-token rows (args.tok_pos) count their live tokens from args.n_live.
struct live_chunk {
    int p0, n_tok;
    __device__ explicit live_chunk(const attention_prefill_args& a)
        : p0(a.chunk != nullptr ? a.chunk[0] : a.p0),
          n_tok(a.chunk != nullptr ? a.chunk[1] : a.n_live != nullptr ? a.n_live[0] : a.n_tok) {}
    __device__ int pos(const attention_prefill_args& a, int t) const { return a.tok_pos != nullptr ? a.tok_pos[t] : p0 + t; }
};

// What token t (position pos) sees, as 64-row tiles: the window first, in tiles that start at its
// first row raw_lo (so a full 128-row window is 2 tiles, not the 3 pages it spans), then the
// compressed rows in index order or 64-row runs of the selected list (rank range checked per row).
// One definition for both tile loops.
struct visible_rows {
    const attention_prefill_args* a;
    int pos, raw_lo, n_raw_tiles, n_vis, row_bytes;
    const std::int32_t* list;
    const std::int32_t *raw_table, *comp_table;  // token t's (strides 0: the sequence's one table)
    static constexpr int R = prefill_tile_rows;

    __device__ visible_rows(const attention_prefill_args& args, const attention_prefill_shape& s, int t, int p, int rb)
        : a(&args), pos(p), row_bytes(rb), raw_table(args.raw_page_table + std::int64_t(t) * args.raw_table_stride),
          comp_table(args.comp_page_table + std::int64_t(t) * args.comp_table_stride) {
        raw_lo = max(0, pos - s.n_swa + 1);
        const int n_comp = s.ratio > 0 ? (pos + 1) / s.ratio : 0;
        const int nsel = args.comp_sel != nullptr && n_comp > 0 ? args.comp_nsel[t] : 0;
        list = nsel > 0 ? args.comp_sel + std::int64_t(t) * args.comp_sel_stride : nullptr;
        n_vis = list != nullptr ? nsel : n_comp;
        n_raw_tiles = (pos - raw_lo) / R + 1;
    }
    __device__ int n_tiles() const { return n_raw_tiles + (n_vis + R - 1) / R; }
    __device__ const std::uint8_t* row(int tile, int r) const {
        if (tile < n_raw_tiles) {
            const unsigned idx = unsigned(raw_lo + tile * R + r);  // >= 0: shifts, not divisions
            if (idx > unsigned(pos)) return nullptr;
            return a->raw_pages + (std::int64_t(raw_table[idx / R]) * R + idx % R) * row_bytes;
        }
        const int rank = (tile - n_raw_tiles) * R + r;
        if (rank >= n_vis) return nullptr;
        const int idx = list != nullptr ? list[rank] : rank;
        return a->comp_pages + (std::int64_t(comp_table[idx / R]) * R + idx % R) * row_bytes;
    }
    __device__ bool col_ok(int tile, int col) const {
        if (tile >= n_raw_tiles) return (tile - n_raw_tiles) * R + col < n_vis;
        return raw_lo + tile * R + col <= pos;
    }
    __device__ bool all_ok(int tile) const {
        if (tile >= n_raw_tiles) return (tile - n_raw_tiles) * R + R <= n_vis;
        return raw_lo + tile * R + R - 1 <= pos;
    }
};

// The head's sink joins the denominator: 1 / (l + 2^(sink - m)) in exp2 units, stably.
__device__ __forceinline__ float sink_factor(float m, float l, float sink_log2) {
    const float M = fmaxf(m, sink_log2);
    const float w = exp2f(m - M);
    return w / (l * w + exp2f(sink_log2 - M));
}

}  // namespace prefill_detail

template <int D, bool Staged>
__global__ void __launch_bounds__(prefill_threads, 1)
    attention_prefill_kernel(const __grid_constant__ attention_prefill_args a, attention_prefill_shape s) {
    pdl_enter();
    using namespace mma_detail;
    using G = mma_geometry<D>;
    constexpr int S = G::S, QD = G::QD, RB = G::row_bytes;
    static_assert(prefill_threads == mma_threads && prefill_tile_rows == mma_rows && G::R == mma_rows);
    const prefill_detail::live_chunk ck(a);
    const int t = ck.n_tok - 1 - static_cast<int>(blockIdx.x);  // most rows first
    if (t < 0) return;  // a captured launch's capacity past the live chunk (whole CTA)
    const int pos = ck.pos(a, t);
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    const int hg = warp / mma_detail::mma_parts, part = warp % mma_detail::mma_parts;

    extern __shared__ float4 prefill_smem[];
    // q (F32) * log2(e)/sqrt(D) -> F16 (scores in exp2 units); heads past n_head are zero.
    __half* qs = mma_q_smem<D>(prefill_smem);
    const float scale_log2 = 1.4426950408889634f / sqrtf(float(D));
    for (int i = tid; i < prefill_max_heads * (D / 4); i += prefill_threads) {
        const int h = i / (D / 4), d = 4 * (i % (D / 4));
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < s.n_head) x = *reinterpret_cast<const float4*>(a.q + (std::int64_t(t) * s.n_head + h) * D + d);
        *reinterpret_cast<uint2*>(qs + h * S + d) = make_uint2(pack_half2(x.x * scale_log2, x.y * scale_log2),
                                                             pack_half2(x.z * scale_log2, x.w * scale_log2));
    }

    const prefill_detail::visible_rows vis(a, s, t, pos, RB);
    mma_state<D> st;
    st.init();
    attend_tiles<D, Staged>(
        prefill_smem, vis.n_tiles(), s.n_head, [&](int tile, int r) { return vis.row(tile, r); },
        [&](int tile, int col) { return vis.col_ok(tile, col); }, [&](int tile) { return vis.all_ok(tile); }, st);
    if (hg * 16 >= s.n_head) return;

    // Sink, normalisation, inverse RoPE of the tail, store (m and l are in exp2 units).
    float pair_l[2];
    mma_group_l<D>(prefill_smem, st, pair_l);
    constexpr int nope = D - 64;
    const float log2e = 1.4426950408889634f;
    float fac[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float lsum = pair_l[rr];
        const int h = hg * 16 + g + 8 * rr;
        fac[rr] = prefill_detail::sink_factor(st.m[rr], lsum, h < s.n_head ? a.sinks[h] * log2e : 0.0f);
    }
#pragma unroll
    for (int j = 0; j < G::n_tiles_o; ++j) {
        const int d = part * QD + 8 * j + 2 * c;
        float sn = 0.0f, cs = 1.0f;
        if (d >= nope) sincos_f32(rope_theta(a.rope, static_cast<std::uint32_t>(pos), (d - nope) / 2), &sn, &cs);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const int h = hg * 16 + g + 8 * rr;
            float x0 = st.o[j][2 * rr] * fac[rr], x1 = st.o[j][2 * rr + 1] * fac[rr];
            if (d >= nope) rope_rotate(x0, x1, cs, -sn);
            if (h < s.n_head)
                *reinterpret_cast<float2*>(a.out + (std::int64_t(t) * s.n_head + h) * D + d) = make_float2(x0, x1);
        }
    }
}

// The same chunk on sm_90a warpgroup MMA (attention_wgmma.cuh), head_dim 512: warpgroups 0 and 1
// hold output dims 0..255 and 256..511, warpgroups 2 and 3 convert the rows. (A template only for
// linkage: this header may be included by several translation units.)
template <int D = 512>
__global__ void __launch_bounds__(wgmma_detail::threads, 1)
    attention_prefill_wgmma_kernel(const __grid_constant__ attention_prefill_args a, attention_prefill_shape s) {
    pdl_enter();
    static_assert(D == wgmma_detail::D, "the wgmma loop is head_dim 512");
    constexpr int nope = D - 64;
    const prefill_detail::live_chunk ck(a);
    const int t = ck.n_tok - 1 - static_cast<int>(blockIdx.x);  // most rows first
    if (t < 0) return;  // a captured launch's capacity past the live chunk (whole CTA)
    const int pos = ck.pos(a, t);
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3, wg = warp >> 2, wi = warp & 3;
    extern __shared__ float4 prefill_wgmma_smem[];
    const float log2e = 1.4426950408889634f;
    wgmma_detail::load_q(prefill_wgmma_smem, a.q + std::int64_t(t) * s.n_head * D, s.n_head, log2e / sqrtf(float(D)));
    const prefill_detail::visible_rows vis(a, s, t, pos, wgmma_detail::row_bytes);
    wgmma_detail::attend_tiles<wgmma_detail::reg_split<208, 160, 72>>(
        prefill_wgmma_smem, vis.n_tiles(), [&](int tile, int r) { return vis.row(tile, r); },
        [&](int tile, int col) { return vis.col_ok(tile, col); }, [&](int tile) { return vis.all_ok(tile); },
        [&](const wgmma_detail::state& st) {
            // Sink, normalisation, inverse RoPE of the tail, store (m and l are in exp2 units).
            // The tail's 32 rotations at pos: one per lane of warpgroup 1's first warp. Each of
            // warpgroup 1's threads used to compute 8 in sequence (~250 dependent instructions a
            // pair, double-precision range reduction included), which made this epilogue about as
            // long as a 6-tile token's whole tile loop (ncu, 4K chunk at 32K, ratio 128).
            float* rot = wgmma_detail::user_smem(prefill_wgmma_smem);
            if (wg == 1) {
                if (wi == 0) {
                    float sn, cs;
                    sincos_f32(rope_theta(a.rope, static_cast<std::uint32_t>(pos), lane), &sn, &cs);
                    rot[2 * lane] = cs;
                    rot[2 * lane + 1] = sn;
                }
                wgmma_detail::bar_sync(wgmma_detail::bar_user, 128);
            }
            const float* xs = wgmma_detail::x_smem(prefill_wgmma_smem);
            float fac[2];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const int h = 16 * wi + g + 8 * rr;
                fac[rr] = prefill_detail::sink_factor(xs[h], xs[64 + h], h < s.n_head ? a.sinks[h] * log2e : 0.0f);
            }
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const int d = 256 * wg + 8 * j + 2 * c;
                // The RoPE tail is dims >= nope: warpgroup 1's j >= 24 only.
                const bool tail = j >= (nope - 256) / 8 && wg == 1;
                float sn = 0.0f, cs = 1.0f;
                if (tail) {
                    cs = rot[d - nope];
                    sn = rot[d - nope + 1];
                }
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
                    const int h = 16 * wi + g + 8 * rr;
                    float x0 = st.at(j, 2 * rr) * fac[rr], x1 = st.at(j, 2 * rr + 1) * fac[rr];
                    if (tail) rope_rotate(x0, x1, cs, -sn);
                    if (h < s.n_head)
                        *reinterpret_cast<float2*>(a.out + (std::int64_t(t) * s.n_head + h) * D + d) = make_float2(x0, x1);
                }
            }
        });
}

// Shared memory one launch needs (opt-in above 48 KiB): about 200 KiB at head_dim 512 with the
// staged tile (sm_90), 162 KiB without it (sm_80's 163 KiB limit). Probes the current device
// (once): call it before capture.
inline std::size_t attention_prefill_smem_bytes(int head_dim) {
    const int dev = current_device();
    if (head_dim == 512 && wgmma_detail::available_on(dev)) return wgmma_detail::smem_bytes;
    const bool big = head_dim == 512;
    return big ? mma_detail::mma_geometry<512>::smem(mma_detail::mma_staged_fits_on<512>(dev))
               : mma_detail::mma_geometry<128>::smem(mma_detail::mma_staged_fits_on<128>(dev));
}

namespace prefill_detail {

template <int D, bool Staged>
void launch(const attention_prefill_shape& s, const attention_prefill_args& args, cudaStream_t stream) {
    constexpr int smem = static_cast<int>(mma_detail::mma_geometry<D>::smem(Staged));
    raise_smem_limit(attention_prefill_kernel<D, Staged>, smem, "attention_prefill smem", stream);
    launch_kernel("attention_prefill_kernel", attention_prefill_kernel<D, Staged>, args.n_tok, prefill_threads, smem,
                  stream, args, s);
    cuda_check_launch("attention_prefill");
}

template <int D>
void launch(const attention_prefill_shape& s, const attention_prefill_args& args, cudaStream_t stream) {
    if (mma_detail::mma_staged_fits<D>()) launch<D, true>(s, args, stream);
    else launch<D, false>(s, args, stream);
}

inline void launch_wgmma(const attention_prefill_shape& s, const attention_prefill_args& args, cudaStream_t stream) {
    constexpr int smem = static_cast<int>(wgmma_detail::smem_bytes);
    raise_smem_limit(attention_prefill_wgmma_kernel<>, smem, "attention_prefill_wgmma smem", stream);
    launch_kernel("attention_prefill_wgmma_kernel", attention_prefill_wgmma_kernel<>, args.n_tok, wgmma_detail::threads,
                  smem, stream, args, s);
    cuda_check_launch("attention_prefill_wgmma");
}

}  // namespace prefill_detail

// One chunk's attention on `stream`. All of args' pointers are device memory.
inline void attention_prefill(const attention_prefill_shape& s, const attention_prefill_args& args, cudaStream_t stream) {
    require((s.head_dim == 128 || s.head_dim == 512) && s.n_rot == 64,
            "attention_prefill: head_dim must be 128 or 512 with n_rot 64");
    require(s.n_head > 0 && s.n_head % 8 == 0 && s.n_head <= prefill_max_heads,
            "attention_prefill: n_head must be a multiple of 8 up to 64");
    require(s.n_swa > 0 && s.ratio >= 0 && args.p0 >= 0 && args.n_tok >= 0, "attention_prefill: bad shape or chunk");
    if (args.n_tok == 0) return;
    if (s.head_dim == 512 && wgmma_detail::available(stream, "attention_prefill")) prefill_detail::launch_wgmma(s, args, stream);
    else if (s.head_dim == 512) prefill_detail::launch<512>(s, args, stream);
    else prefill_detail::launch<128>(s, args, stream);
}

// Every probe and shared-memory opt-in attention_prefill needs on `device`, for both head dims:
// call once per device before capturing a launch.
inline void prepare_attention_prefill(int device) {
    with_device(device, [&] {
        if (wgmma_detail::available_on(device))
            raise_smem_limit(attention_prefill_wgmma_kernel<>, wgmma_detail::smem_bytes, "attention_prefill_wgmma smem");
        mma_detail::raise_mma_smem<512>(device, attention_prefill_kernel<512, true>, attention_prefill_kernel<512, false>,
                                        "attention_prefill smem");
        mma_detail::raise_mma_smem<128>(device, attention_prefill_kernel<128, true>, attention_prefill_kernel<128, false>,
                                        "attention_prefill smem");
    });
}

}  // namespace ds4::kernels
