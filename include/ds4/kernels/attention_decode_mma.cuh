#pragma once
// Flash decode on tensor cores (mma.sync m16n8k16, f16 operands, fp32 accumulation): the same
// attention as attention_decode.cuh (docs/model.md §2.4 steps 9-10, MQA: the n_head query heads share
// one head_dim K=V row; raw window, then the compressed rows, sinks in the denominator, inverse
// RoPE on the output tail), for decode and verify rows of many sequences per launch, with the
// head dimension as the mma M dimension (64 heads = 4 m16 tiles) and 64 KV rows per tile as N.
//
// Why a second kernel: at 64 heads a 592-byte row carries 131 kFLOP (q.k and p.v over 512 dims),
// which CUDA-core FP32 cannot stream faster than ~300 GB/s; the exact kernel keeps the bitwise
// contract, this one the bandwidth. Its own bound: mma.sync f16 peaks at 642 TFLOP/s on the
// H200, i.e. 642e12 / 131072 * 592 B = 2.9 TB/s of KV rows (64% of the read ceiling) at 1 query
// row: that, not HBM, is the roofline of any mma.sync f16 kernel for this shape (the spec's 80%
// needs wgmma's ~990 TFLOP/s).
//
// Contract: bounded. q * log2(e)/sqrt(D) is rounded to F16 and p = exp2(s - m) to F16 for P.V
// (m: the running max, or on the wgmma loop a base within 8 of it, so p <= 2^8; stored K/V values are F16 values, decoded exactly by mma_detail::decode_row8_f16); scores,
// softmax state, sums and outputs are fp32 (ex2.approx). The fp32 row order differs from the
// exact kernel (online softmax over tiles of 64 visible rows).
// ds4-validate compares with the sequential F32 reference: relative L2 <= 3e-3 per case, every
// element within 3e-2 absolute (outputs are convex combinations of unit-scale rows), NaN/Inf
// positions equal.
//
// Visible rows: the raw window max(0, pos-n_swa+1) .. pos, and the compressed rows either from
// the indexer's ascending list (args.comp_sel / comp_nsel, when the count is > 0) or all of
// 0 .. tok_n_comp - 1. A mask is not taken (the list is what the indexer emits beside it).
// Split-KV with a fixed split size: the first raw_slots slots cover a query row's raw window in
// runs of raw_split rows, the next its visible compressed rows in runs of split_rows (by rank); the merge is attention_decode.cuh's
// (chunk order, no atomics), so a result depends on split_rows (a plan value) and never on the
// batch around it. Graph contract as attention_decode.cuh: geometry from the capacity, lengths,
// positions, lists and page tables from device memory, idle slots exit early after marking their
// partials empty. Scratch is attention_decode's layout (plan.scratch_bytes(), any contents).
// The wgmma/mma.sync choice and the shared-memory opt-ins are made per device by
// prepare_attention_decode_mma(device), called before capture (or by an eager launch).
//
// Work split: one CTA per (slot, query row, sequence) running the tile loop of attention_mma.cuh
// (16 warps, 4 per 16-head group; cp.async-staged, exactly decoded F16 tiles); about 180 KiB of
// shared memory, one CTA per SM; on devices with less opt-in shared memory (sm_80: 163 KiB) the
// tile is read without staging. Measured (H200, bench/RESULTS.md): bound by shared-memory
// wavefronts (q fragments and every K=V tile re-read by each of the 4 head groups), not by HBM.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/kernels/attention_decode.cuh"
#include "ds4/kernels/attention_mma.cuh"
#include "ds4/kernels/attention_split_plan.hpp"
#include "ds4/kernels/attention_wgmma.cuh"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int attn_mma_threads = 512;
inline constexpr int attn_mma_rows = attn_split_granule;  // visible rows per tile (the mma N extent per pass)

struct attention_decode_mma_plan {
    attention_decode_shape shape;
    attention_decode_capacity cap;  // max_comp counts visible rows: with the indexer's list, top_k
    int split_rows = 0;  // visible compressed rows per split slot, a multiple of 64
    int raw_split = 0;   // window rows per raw slot: min(split_rows, n_swa rounded up to 64)
    int raw_slots = 0, comp_slots = 0;

    // split_rows 0: pick one from the capacity for the current device's SM count (see
    // attention_split_plan.hpp for the cost it minimises).
    static attention_decode_mma_plan make(const attention_decode_shape& s, const attention_decode_capacity& c,
                                          int split_rows = 0) {
        require((s.head_dim == 128 || s.head_dim == 512) && s.n_rot == 64,
                "attention_decode_mma: head_dim must be 128 or 512 with n_rot 64");
        require(s.n_head > 0 && s.n_head <= 64 && s.n_swa > 0, "attention_decode_mma: 1..64 heads and n_swa > 0");
        require(c.n_seq > 0 && c.max_q >= 1 && c.max_q <= attn_max_q && c.max_comp >= 0,
                "attention_decode_mma: capacity needs n_seq > 0, 1 <= max_q <= 16, max_comp >= 0");
        require(split_rows >= 0 && split_rows % attn_mma_rows == 0, "attention_decode_mma: split_rows must be a multiple of 64");
        int dev = 0, n_sm = 132;
        if (split_rows == 0 && cudaGetDevice(&dev) == cudaSuccess)
            cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev);
        (void)cudaGetLastError();
        const attention_split sp = plan_attention_split(s.n_swa, double(c.n_seq) * double(c.max_q), c.max_comp, n_sm, split_rows);
        attention_decode_mma_plan p;
        p.shape = s;
        p.cap = c;
        p.split_rows = sp.split_rows;
        p.raw_split = sp.raw_split;
        p.raw_slots = sp.raw_slots;
        p.comp_slots = sp.comp_slots;
        return p;
    }
    int chunk_slots() const { return raw_slots + comp_slots; }
    std::size_t partial_count() const {
        return std::size_t(cap.n_seq) * std::size_t(chunk_slots()) * std::size_t(cap.max_q) * std::size_t(shape.n_head);
    }
    std::size_t scratch_bytes() const { return partial_count() * (8 + 4 * std::size_t(shape.head_dim)); }
};

namespace mma_decode_detail {

struct tile_source {
    const std::uint8_t* pages;
    const std::int32_t* table;  // this sequence's page table
    const std::int32_t* list;   // ascending compressed rows, or nullptr
    int first;                  // row (raw: absolute position) or rank of the split's first row
    bool raw;

    __device__ __forceinline__ const std::uint8_t* row(int rank, int row_bytes) const {
        const int idx = raw || list == nullptr ? first + rank : list[first + rank];
        const std::int32_t page = table[idx / attn_mma_rows];
        if (page < 0) return nullptr;
        return pages + (std::int64_t(page) * attn_mma_rows + idx % attn_mma_rows) * row_bytes;
    }
};

// Slot k's visible rows for token t of sequence s: [first, first + count) in raw positions (the
// first L.raw_chunks slots, raw_split rows each) or compressed ranks (split_rows each, from the
// indexer's list when it has one). Returns count (<= 0: nothing visible).
__device__ inline int slot_rows(const attention_decode_launch& L, int s, int k, int t, int pos, int split_rows, int raw_split,
                                tile_source& src) {
    if (k < L.raw_chunks) {
        const int first = max(0, pos - L.n_swa + 1) + k * raw_split;
        src = {L.a.raw_pages, L.a.raw_page_table + std::int64_t(s) * L.a.raw_table_stride, nullptr, first, true};
        return min(raw_split, pos - first + 1);
    }
    const int nsel = L.a.comp_sel != nullptr ? L.a.comp_nsel[t] : 0;
    const int n_vis = nsel > 0 ? nsel : L.a.tok_n_comp[t];
    const int first = (k - L.raw_chunks) * split_rows;
    src = {L.a.comp_pages, L.a.comp_page_table + std::int64_t(s) * L.a.comp_table_stride,
           nsel > 0 ? L.a.comp_sel + std::int64_t(t) * L.a.comp_sel_stride : nullptr, first, false};
    return min(split_rows, n_vis - first);
}

// This CTA's slot: blockIdx = (slot k, query row j, sequence s). False when there is nothing to
// attend (no such row, or an empty slot, whose partials it marks empty for the merge); otherwise
// the row's token t and the slot's rows.
__device__ inline bool open_slot(const attention_decode_launch& L, int split_rows, int raw_split, int& t, tile_source& src,
                                 int& count) {
    using namespace attn_detail;
    const int k = static_cast<int>(blockIdx.x), j = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
    seq_view sv;
    if (!load_seq(L, s, sv) || j >= sv.ntok) return false;
    t = sv.t0 + j;
    count = slot_rows(L, s, k, t, L.a.tok_pos[t], split_rows, raw_split, src);
    if (count > 0) return true;
    for (int h = static_cast<int>(threadIdx.x); h < L.n_head; h += static_cast<int>(blockDim.x))
        L.ml[partial_index(L, s, k, j, h)] = make_float2(-INFINITY, 0.0f);
    return false;
}

}  // namespace mma_decode_detail

template <int D, bool Staged>
__global__ void __launch_bounds__(attn_mma_threads, 1)
    attention_decode_mma_kernel(const __grid_constant__ attention_decode_launch L, int split_rows, int raw_split) {
    pdl_enter();
    static_assert(attn_mma_threads == mma_detail::mma_threads && attn_mma_rows == mma_detail::mma_rows);
    using namespace attn_detail;
    using namespace mma_detail;
    using G = mma_geometry<D>;
    constexpr int R = G::R, S = G::S, QD = G::QD, RB = G::row_bytes;
    const int k = static_cast<int>(blockIdx.x), j = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    const int hg = warp / mma_detail::mma_parts, part = warp % mma_detail::mma_parts;
    int t, count;
    mma_decode_detail::tile_source src{};
    if (!mma_decode_detail::open_slot(L, split_rows, raw_split, t, src, count)) return;
    const int n_tiles = (count + R - 1) / R;

    extern __shared__ float4 mma_decode_smem[];
    // q (F32) * log2(e)/sqrt(D) -> F16, so the scores come out in exp2 units; heads past n_head are zero.
    __half* qs = mma_q_smem<D>(mma_decode_smem);
    const float scale_log2 = attention_q_scale_log2(D);
    for (int i = tid; i < 64 * (D / 4); i += mma_threads) {
        const int h = i / (D / 4), d = 4 * (i % (D / 4));
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < L.n_head) x = *reinterpret_cast<const float4*>(L.a.q + (std::int64_t(t) * L.n_head + h) * D + d);
        *reinterpret_cast<uint2*>(qs + h * S + d) = make_uint2(pack_half2(x.x * scale_log2, x.y * scale_log2),
                                                             pack_half2(x.z * scale_log2, x.w * scale_log2));
    }
    mma_state<D> st;
    st.init();
    attend_tiles<D, Staged>(
        mma_decode_smem, n_tiles, L.n_head,
        [&](int tile, int r) -> const std::uint8_t* {
            const int rank = tile * R + r;
            return rank < count ? src.row(rank, RB) : nullptr;
        },
        [&](int tile, int col) { return tile * R + col < count; }, [&](int tile) { return tile * R + R <= count; }, st);
    const bool active = hg * 16 < L.n_head;
    if (!active) return;

    // Partial (m, l, o) per head in the natural-log units attention_merge_kernel expects.
    float pair_l[2];
    mma_group_l<D>(mma_decode_smem, st, pair_l);
    const float ln2 = 0.6931471805599453f;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const float lsum = pair_l[rr];
        const int h = hg * 16 + g + 8 * rr;
        if (h >= L.n_head) continue;
        const std::size_t pi = partial_index(L, s, k, j, h);
        const bool empty = !(lsum > 0.0f) && st.m[rr] == -INFINITY;
        if (part == 0 && c == 0) L.ml[pi] = empty ? make_float2(-INFINITY, 0.0f) : make_float2(st.m[rr] * ln2, lsum);
        if (empty) continue;
#pragma unroll
        for (int jn = 0; jn < G::n_tiles_o; ++jn) {
            const int d = part * QD + 8 * jn + 2 * c;
            *reinterpret_cast<float2*>(L.po + pi * D + d) = make_float2(st.o[jn][2 * rr], st.o[jn][2 * rr + 1]);
        }
    }
}

// The same split step on sm_90a warpgroup MMA (attention_wgmma.cuh), head_dim 512.
template <int = 0>
__global__ void __launch_bounds__(wgmma_detail::threads, 1)
    attention_decode_wgmma_kernel(const __grid_constant__ attention_decode_launch L, int split_rows, int raw_split) {
    pdl_enter();
    using namespace attn_detail;
    constexpr int D = 512, R = attn_mma_rows, RB = wgmma_detail::row_bytes;
    const int k = static_cast<int>(blockIdx.x), j = static_cast<int>(blockIdx.y), s = static_cast<int>(blockIdx.z);
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3, wg = warp >> 2, wi = warp & 3;
    int t, count;
    mma_decode_detail::tile_source src{};
    if (!mma_decode_detail::open_slot(L, split_rows, raw_split, t, src, count)) return;
    extern __shared__ float4 wgmma_decode_smem[];
    if (L.a.q16 != nullptr)
        wgmma_detail::load_q16(wgmma_decode_smem, L.a.q16 + std::int64_t(t) * q16_token_halves(D));
    else
        wgmma_detail::load_q(wgmma_decode_smem, L.a.q + std::int64_t(t) * L.n_head * D, L.n_head,
                             attention_q_scale_log2(D));
    wgmma_detail::attend_tiles<wgmma_detail::reg_split<208, 160, 72>>(
        wgmma_decode_smem, (count + R - 1) / R,
        [&](int tile, int r) -> const std::uint8_t* {
            const int rank = tile * R + r;
            return rank < count ? src.row(rank, RB) : nullptr;
        },
        [&](int tile, int col) { return tile * R + col < count; }, [&](int tile) { return tile * R + R <= count; },
        [&](const wgmma_detail::state& st) {
            // Partial (m, l, o) per head in the natural-log units attention_merge_kernel expects.
            const float* xs = wgmma_detail::x_smem(wgmma_decode_smem);
            const float ln2 = 0.6931471805599453f;
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const int h = 16 * wi + g + 8 * rr;
                if (h >= L.n_head) continue;
                const float m = xs[h], l = xs[64 + h];
                const std::size_t pi = partial_index(L, s, k, j, h);
                const bool empty = !(l > 0.0f) && m == -INFINITY;
                if (wg == 0 && c == 0) L.ml[pi] = empty ? make_float2(-INFINITY, 0.0f) : make_float2(m * ln2, l);
                if (empty) continue;
#pragma unroll
                for (int jn = 0; jn < 32; ++jn) {
                    const int d = 256 * wg + 8 * jn + 2 * c;
                    *reinterpret_cast<float2*>(L.po + pi * D + d) = make_float2(st.at(jn, 2 * rr), st.at(jn, 2 * rr + 1));
                }
            }
        });
}

namespace mma_decode_detail {

template <int D, bool Staged>
void launch_split(const attention_decode_mma_plan& plan, const attention_decode_launch& L, cudaStream_t stream) {
    constexpr int smem = static_cast<int>(mma_detail::mma_geometry<D>::smem(Staged));
    raise_smem_limit(attention_decode_mma_kernel<D, Staged>, smem, "attention_decode_mma smem", stream);
    launch_kernel("attention_decode_mma_kernel", attention_decode_mma_kernel<D, Staged>,
                  dim3(plan.chunk_slots(), plan.cap.max_q, plan.cap.n_seq), attn_mma_threads, smem, stream, L,
                  plan.split_rows, plan.raw_split);
    cuda_check_launch("attention_decode_mma");
}

}  // namespace mma_decode_detail

// One attention step on `stream`: the tensor-core split kernel, then attention_decode.cuh's merge.
inline void attention_decode_mma(const attention_decode_mma_plan& plan, const attention_decode_args& args, void* scratch,
                                 cudaStream_t stream) {
    require(args.comp_mask == nullptr, "attention_decode_mma: pass the indexer's selected list (comp_sel), not a mask");
    const auto& s = plan.shape;
    const attention_decode_launch L =
        attn_detail::make_launch(s, plan.cap, args, scratch, plan.partial_count(), plan.chunk_slots(), plan.raw_slots, 1);
    using namespace mma_decode_detail;
    if (s.head_dim == 512 && wgmma_detail::available(stream, "attention_decode_mma")) {
        constexpr int smem = static_cast<int>(wgmma_detail::smem_bytes);
        raise_smem_limit(attention_decode_wgmma_kernel<>, smem, "attention_decode_wgmma smem", stream);
        launch_kernel("attention_decode_wgmma_kernel", attention_decode_wgmma_kernel<>,
                      dim3(plan.chunk_slots(), plan.cap.max_q, plan.cap.n_seq), wgmma_detail::threads, smem, stream, L,
                      plan.split_rows, plan.raw_split);
        cuda_check_launch("attention_decode_wgmma");
    } else if (s.head_dim == 512) {
        if (mma_detail::mma_staged_fits<512>()) launch_split<512, true>(plan, L, stream);
        else launch_split<512, false>(plan, L, stream);
    } else {
        if (mma_detail::mma_staged_fits<128>()) launch_split<128, true>(plan, L, stream);
        else launch_split<128, false>(plan, L, stream);
    }
    attn_detail::launch_merge(s, plan.cap, L, stream);
}

// Every probe and shared-memory opt-in attention_decode_mma needs on `device` (the wgmma check
// and the split kernel of each head_dim, plus attention_decode's own split kernel): call once per
// device before capturing a launch.
inline void prepare_attention_decode_mma(int device) {
    prepare_attention_decode(device);
    with_device(device, [&] {
        if (wgmma_detail::available_on(device))
            raise_smem_limit(attention_decode_wgmma_kernel<>, wgmma_detail::smem_bytes, "attention_decode_wgmma smem");
        mma_detail::raise_mma_smem<512>(device, attention_decode_mma_kernel<512, true>,
                                        attention_decode_mma_kernel<512, false>, "attention_decode_mma smem");
        mma_detail::raise_mma_smem<128>(device, attention_decode_mma_kernel<128, true>,
                                        attention_decode_mma_kernel<128, false>, "attention_decode_mma smem");
    });
}

}  // namespace ds4::kernels
