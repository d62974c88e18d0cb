#pragma once
// The decode twin of kernels/gemm_f16_tc.cuh: F16 weights x F32 activations for 1-16 rows with
// exactly the GEMM's arithmetic, so that a row gives the same bits whether it runs in a prefill
// chunk (gemm_f16_tc) or in a decode step (this), the engine's batch invariance.
//
// Contract: the GEMM's, bit for bit. Per 512-input segment an m16n8k8 TF32 accumulator starts at
// zero and takes, for each 8-input step in order, the mma of hi = tf32(x) then of lo = tf32(x - hi)
// against the F16 weights as TF32; the output is ((0.0f + seg_0) + seg_1) + ... in segment order.
// The activation rows sit in rows 0..15 of the mma's A (row r of the launch in row r), the
// weights' 8 rows in its columns; an mma's output element depends on its own row and column
// only, so where a row sits in the tile does not change its bits.
//
// Layout: a warp computes one (8 weight rows, segment) item for every activation row: it stages
// the 8 rows' 1 KB segment pieces in shared memory with 16-byte loads (16 in flight a lane), then
// chains the segment's 128 mma on one accumulator. A CTA of 8 warps covers 8 / segments row
// groups (one group, looping over segments, when there are more than 8) and adds the segment
// results in order from shared memory.
// Shapes: in a multiple of 32 (as the GEMM), 1..16 rows, x rows 16-byte aligned, weights 16-byte
// aligned. Graph contract: no allocation, no host synchronisation; the grid depends on the
// shapes only (rows past the live count compute garbage the caller never reads).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/gemm_f16_tc.cuh"

namespace ds4::kernels {

inline constexpr int matvec_f16_tc_warps = 8;
inline constexpr int matvec_f16_tc_max_rows = 16;

namespace matvec_f16_tc_detail {

inline constexpr int w_pitch = f16_segment + 8;  // halves: fragment reads free of bank conflicts
inline constexpr int warp_w_halves = 8 * w_pitch;
// Shared memory: each warp's staged weights, then the segment results [group][segment][16][8].
inline std::size_t smem_bytes(int segments) {
    const int groups = segments >= matvec_f16_tc_warps ? 1 : matvec_f16_tc_warps / segments;
    return std::size_t(matvec_f16_tc_warps) * warp_w_halves * 2 + std::size_t(groups) * segments * 16 * 8 * 4;
}

}  // namespace matvec_f16_tc_detail

template <int = 0>
__global__ void __launch_bounds__(matvec_f16_tc_warps * 32) matvec_f16_tc_kernel(const __grid_constant__ gemm_f16_launch L) {
    using namespace matvec_f16_tc_detail;
    using gemm_f16_tc_detail::mma_tf32;
    using gemm_f16_tc_detail::to_tf32;
    extern __shared__ int4 matvec_f16_tc_smem[];
    const gemm_f16_args& a = L.a;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int segments = (a.in + f16_segment - 1) / f16_segment;
    const int gpc = segments >= matvec_f16_tc_warps ? 1 : matvec_f16_tc_warps / segments;
    auto* wsm = reinterpret_cast<std::uint16_t*>(matvec_f16_tc_smem) + warp * warp_w_halves;
    auto* part = reinterpret_cast<float*>(reinterpret_cast<std::uint16_t*>(matvec_f16_tc_smem) +
                                          matvec_f16_tc_warps * warp_w_halves);
    int k = 0;
    while (k + 1 < a.n_matrices && int(blockIdx.x) >= L.tile_begin[k + 1]) ++k;
    const gemm_f16_matrix& m = a.m[k];
    const int row0 = (int(blockIdx.x) - L.tile_begin[k]) * gpc * 8;
    const int g = lane >> 2, t = lane & 3;
    const int n_rows = L.capacity;  // every row of the launch (the twin of the GEMM's live rows)
    // Items of this warp: (group, segment) = (warp / segments, warp % segments) when segments
    // <= 8, else (0, warp + 8 j).
    const int group = segments >= matvec_f16_tc_warps ? 0 : warp / segments;
    const int s_first = segments >= matvec_f16_tc_warps ? warp : warp % segments;
    const int s_step = segments >= matvec_f16_tc_warps ? matvec_f16_tc_warps : segments;
    const bool warp_live = group < gpc;
    const int n0 = row0 + group * 8;
    bool waited = false;
    for (int s = s_first; warp_live && s < segments; s += s_step) {
        const int e0 = s * f16_segment, len = min(f16_segment, a.in - e0);
        // Stage the 8 rows' pieces: chunk c (16 bytes) of row j at wsm[j * w_pitch + 8 c].
        __syncwarp();
#pragma unroll 4
        for (int i = lane; i < 8 * (f16_segment / 8); i += 32) {
            const int j = i / (f16_segment / 8), c = i % (f16_segment / 8);
            int4 v = make_int4(0, 0, 0, 0);
            if (n0 + j < m.rows && 8 * c < len)
                v = __ldcs(reinterpret_cast<const int4*>(m.w + std::size_t(n0 + j) * a.in + e0 + 8 * c));
            *reinterpret_cast<int4*>(wsm + j * w_pitch + 8 * c) = v;
        }
        // Weights are never written by a kernel: only the activations wait (core/launch.hpp).
        if (!waited) {
            pdl_wait();
            waited = true;
        }
        __syncwarp();
        const float* x_lo = a.x + std::size_t(g) * a.x_stride + e0 + t;
        const float* x_hi = a.x + std::size_t(g + 8) * a.x_stride + e0 + t;
        const bool lo_live = g < n_rows, hi_live = g + 8 < n_rows;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        static_assert(gemm_f16_tc_k % 32 == 0, "the launch's input multiple covers four steps");
        // Four 8-input steps at a time (len is a multiple of 32): their 16 activation loads issue
        // together, so one L2 round trip is exposed per four steps of the mma chain, not per step.
        for (int k32 = 0; k32 < len; k32 += 32) {
            float v[4][4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int k0 = k32 + 8 * u;
                v[u][0] = lo_live ? x_lo[k0] : 0.0f, v[u][1] = hi_live ? x_hi[k0] : 0.0f;
                v[u][2] = lo_live ? x_lo[k0 + 4] : 0.0f, v[u][3] = hi_live ? x_hi[k0 + 4] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                std::uint32_t hi[4], lo[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    hi[e] = to_tf32(v[u][e]);
                    lo[e] = to_tf32(v[u][e] - __uint_as_float(hi[e]));
                }
                const std::uint16_t* wr = wsm + g * w_pitch + k32 + 8 * u + t;
                const std::uint32_t b0 = __float_as_uint(f16_operand(wr[0])), b1 = __float_as_uint(f16_operand(wr[4]));
                mma_tf32(d, hi, b0, b1);
                mma_tf32(d, lo, b0, b1);
            }
        }
        // D element e: activation row g (+8 for e >= 2), weight row n0 + 2t + (e & 1).
        float* out = part + (std::size_t(group) * segments + s) * 128;
#pragma unroll
        for (int e = 0; e < 4; ++e) out[(g + 8 * (e >> 1)) * 8 + 2 * t + (e & 1)] = d[e];
    }
    if (!waited) pdl_wait();
    pdl_launch_dependents();
    __syncthreads();
    // Thread (group, row r, column c) adds its output's segment results in order from 0.0f.
    for (int i = int(threadIdx.x); i < gpc * n_rows * 8; i += int(blockDim.x)) {
        const int gr = i / (n_rows * 8), r = i / 8 % n_rows, c = i % 8, row = row0 + gr * 8 + c;
        if (row >= m.rows) continue;
        float acc = 0.0f;
        for (int s = 0; s < segments; ++s) acc = __fadd_rn(acc, part[(std::size_t(gr) * segments + s) * 128 + r * 8 + c]);
        m.y[std::size_t(r) * m.y_stride + row] = acc;
    }
}

inline void prepare_matvec_f16_tc(int device, int in) {
    const int segments = (in + f16_segment - 1) / f16_segment;
    with_device(device, [&] {
        raise_smem_limit(matvec_f16_tc_kernel<>, matvec_f16_tc_detail::smem_bytes(segments), "matvec_f16_tc smem");
    });
}

// One launch on `stream` for every matrix of `a` (all read the same x) over a.n_rows rows
// (1..16; every one computed: a captured step passes its capacity).
inline void matvec_f16_tc(const gemm_f16_args& a, cudaStream_t stream) {
    require(a.n_rows >= 1 && a.n_rows <= matvec_f16_tc_max_rows,
            "matvec_f16_tc: n_rows " + std::to_string(a.n_rows) + " outside 1..16");
    require(a.live_rows == nullptr, "matvec_f16_tc: computes every row of the launch (no live_rows)");
    const int segments = (a.in + f16_segment - 1) / f16_segment;
    const int gpc = segments >= matvec_f16_tc_warps ? 1 : matvec_f16_tc_warps / segments;
    const gemm_f16_launch L = make_gemm_f16_launch(a, a.n_rows, 8 * gpc, gemm_f16_tc_k, "matvec_f16_tc");
    const std::size_t smem = matvec_f16_tc_detail::smem_bytes(segments);
    raise_smem_limit(matvec_f16_tc_kernel<>, smem, "matvec_f16_tc smem", stream);
    launch_kernel("matvec_f16_tc_kernel", matvec_f16_tc_kernel<>, dim3(unsigned(L.tile_begin[a.n_matrices])),
                  matvec_f16_tc_warps * 32, smem, stream, L);
    cuda_check_launch("matvec_f16_tc");
}

}  // namespace ds4::kernels
