#pragma once
// What the grouped MoE GEMM's kernels share (moe_gemm.cuh's mma.sync kernels and host side,
// moe_gemm_wgmma.cuh's sm_90a gate/up): the launch description (shape, arguments,
// workspace), the work items of its grids, and the staging of the pairs' Q8_K activations.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/launch.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_schedule.hpp"
#include "ds4/kernels/moe_weights.hpp"

namespace ds4::kernels {

inline constexpr int moe_gemm_max_rows = 4096;
inline constexpr int moe_gemm_pairs_cta = 64;    // pairs per CTA (mma N: 8 n-tiles over 4 warp rows)
inline constexpr int moe_gemm_threads = 512;     // 16 warps: 4 weight tiles x 4 quarters of the pairs
inline constexpr int moe_gemm_warp_pairs = 16;   // a warp's pairs: 2 n-tiles
inline constexpr int moe_gemm_sort_threads = 1024;

struct moe_gemm_shape {
    int n_embd = 4096, n_ff = 2048, n_expert = 256;
};

struct moe_gemm_args : moe_routed_weights {
    int n_rows = 0;                           // live rows (launch value), ignored with live_rows
    const std::int32_t* live_rows = nullptr;  // device live row count of a captured step
    const float* xn = nullptr;                // xn[r * x_stride + i]
    int x_stride = 0;
    const std::int32_t* sel = nullptr;        // [rows][6] expert of each pair (device)
    const float* wts = nullptr;               // [rows][6] its weight
    float clamp = 10.0f;
    float* out = nullptr;                     // out[r * out_stride + o]
    int out_stride = 0;
};

// Device pointers of the workspace, carved by moe_gemm_plan (every array 16-byte aligned).
struct moe_gemm_work {
    std::int8_t* xq;           // [cap][n_embd]
    float* xq_d;               // [cap][n_embd / 256]
    std::int32_t* offsets;     // [n_expert + 1]
    std::int32_t* sorted;      // [6 cap] pair ids grouped by expert
    std::int32_t* items;       // [max items][2]: (expert, first pair in its group), expert -1 = none
    float* mid;                // [6 cap][n_ff]
    std::int8_t* midq;         // [6 cap][n_ff]
    float* midq_d;             // [6 cap][n_ff / 256]
    std::int16_t* midq_bsums;  // [6 cap][n_ff / 16]
    float* ys;                 // [6 cap][n_embd]
};

struct moe_gemm_launch {
    moe_gemm_shape shape;
    int capacity = 0, n_rows = 0, max_items = 0;
    moe_gemm_args a;
    moe_gemm_work w;
};

namespace moe_gemm_detail {

__device__ __forceinline__ int live(const moe_gemm_launch& L) {
    return L.a.live_rows ? min(*L.a.live_rows, L.capacity) : L.n_rows;
}

__device__ __forceinline__ void mma_s8(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with an unsigned A (u8) and a signed B (s8).
__device__ __forceinline__ void mma_u8s8(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragments of m-tile mi from a decoded 32-row x 32-k tile stored [half][row][16] (as
// gemm_q8_0.cuh's stage layout: 32 consecutive words per register).
__device__ __forceinline__ void a_frag(const unsigned* tile, int mi, int lane, unsigned (&af)[4]) {
    af[0] = tile[64 * mi + lane];
    af[1] = tile[64 * mi + 32 + lane];
    af[2] = tile[128 + 64 * mi + lane];
    af[3] = tile[128 + 64 * mi + 32 + lane];
}

// Activation rows of 256 bytes (one Q8_K block), 16-byte chunks xor-swizzled by pair % 8.
__device__ __forceinline__ int act_offset(int pair, int chunk) { return pair * 256 + ((chunk ^ (pair & 7)) * 16); }

// Accumulator of a lane's output (row 16 mi + 8 h + g, pair 8 ni + 2 t + e) of its warp's tile.
__host__ __device__ constexpr int acc_index(int mi, int h, int ni, int e) {
    return ((mi * 2 + h) * (moe_gemm_warp_pairs / 8) + ni) * 2 + e;
}

// B fragment words of sub-block ib for pair row rr, lane (g, t).
__device__ __forceinline__ void b_frag(const std::uint8_t* sa, int rr, int ib, int t, unsigned& b0, unsigned& b1) {
    b0 = *reinterpret_cast<const unsigned*>(sa + act_offset(rr, 2 * ib) + 4 * t);
    b1 = *reinterpret_cast<const unsigned*>(sa + act_offset(rr, 2 * ib + 1) + 4 * t);
}

// Byte n (0..15) of a 16-byte vector by selects, not a local-memory copy indexed at run time.
__device__ __forceinline__ unsigned byte_of(const uint4& v, int n) {
    const unsigned w = n < 4 ? v.x : n < 8 ? v.y : n < 12 ? v.z : v.w;
    return (w >> (8 * (n % 4))) & 255u;
}

// This CTA's work item: expert e (-1: none), its group's pairs [first + p0, first + p0 + count).
struct work_item {
    int e, first, p0, count;
};
__device__ __forceinline__ work_item item_of(const moe_gemm_launch& L) {
    work_item it{L.w.items[2 * blockIdx.y], 0, L.w.items[2 * blockIdx.y + 1], 0};
    if (it.e >= 0) {
        it.first = L.w.offsets[it.e];
        it.count = min(L.w.offsets[it.e + 1] - it.first - it.p0, moe_gemm_pairs_cta);
    }
    return it;
}

// This thread's share of the pairs' activation copies, as element offsets of block 0 (block b adds
// 256 b quants and b scales): formed once per CTA, so that a block's copies are a few additions
// (the per-block address arithmetic was ~9% of the gate/up kernel's instructions). Offsets fit 32
// bits: at most 6 x 4096 rows of 4096 quants.
struct act_sources {
    static constexpr int chunks = moe_gemm_pairs_cta * 16 / moe_gemm_threads;
    std::uint32_t q[chunks];  // copy i: c = threadIdx.x + i * threads, pair c / 16, 16-byte piece c % 16
    std::uint32_t d;          // the scale of pair threadIdx.x (threads < pairs)
};
__device__ __forceinline__ act_sources act_sources_of(const std::int32_t* rows_of, int count, int row_bytes, int nb) {
    act_sources a;
#pragma unroll
    for (int i = 0; i < act_sources::chunks; ++i) {
        const int c = int(threadIdx.x) + i * moe_gemm_threads, p = c / 16;
        a.q[i] = std::uint32_t(p < count ? rows_of[p] : 0) * std::uint32_t(row_bytes) + std::uint32_t(c % 16) * 16u;
    }
    const int p = int(threadIdx.x) % moe_gemm_pairs_cta;
    a.d = std::uint32_t(p < count ? rows_of[p] : 0) * std::uint32_t(nb);
    return a;
}

// Issues the cp.async copies of block b of each pair's activation row (Q8_K quants) and its scale
// into a stage; pairs past the group are zero-filled (nothing is read for them).
__device__ __forceinline__ void stage_acts(const std::int8_t* q, const float* d, const act_sources& src, int count, int b,
                                           std::uint8_t* sa, float* sd) {
#pragma unroll
    for (int i = 0; i < act_sources::chunks; ++i) {
        const int c = int(threadIdx.x) + i * moe_gemm_threads, p = c / 16;
        cp_async::zfill<16>(sa + act_offset(p, c % 16), q + src.q[i] + std::uint32_t(b) * 256u, p < count);
    }
    if (threadIdx.x < moe_gemm_pairs_cta) {
        const int p = int(threadIdx.x);
        cp_async::zfill<4>(sd + p, d + src.d + std::uint32_t(b), p < count);
    }
}

// The k-block ring of the grouped MoE kernels: block b lands by cp.async in stage b % Stages,
// Stages - 1 blocks ahead of the one in use; issue(b, s) copies block b into stage s, use(b, s)
// consumes it. One barrier a block: when block b has landed every thread is past block b - 1,
// whose stage block b + Stages - 1 then takes.
template <int Stages, class Issue, class Use>
__device__ __forceinline__ void run_ring(int nb, Issue&& issue, Use&& use) {
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
        if (s < nb) issue(s, s);
        cp_async::commit();
    }
    for (int b = 0; b < nb; ++b) {
        cp_async::wait<Stages - 2>();
        __syncthreads();
        if (b + Stages - 1 < nb) issue(b + Stages - 1, (b + Stages - 1) % Stages);
        cp_async::commit();
        use(b, b % Stages);
    }
}

// One 32-row tile's IQ2_XXS block as stored (format/tiled.hpp), and the copies of each IQ2_XXS
// decode selector table entry in shared memory (a warp's 32 random lookups meet at most four to a
// bank; 8 copies keep the mma.sync gate/up CTA within sm_80's shared memory).
inline constexpr int gu_tile_bytes = 4 * 512;
inline constexpr int sel_copies = 8;

}  // namespace moe_gemm_detail

// The GEMM grids' work items: one per (expert, 64 pairs of its group), at most 6 cap / 64 + n_expert.
__host__ __device__ inline int moe_gemm_max_items(int capacity, int n_expert) {
    return (capacity * moe_slots + moe_gemm_pairs_cta - 1) / moe_gemm_pairs_cta + n_expert;
}

}  // namespace ds4::kernels
