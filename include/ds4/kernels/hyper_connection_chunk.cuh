#pragma once
// HC pre for a prefill chunk's rows in one launch (docs/model.md §2.2): the RMS scale of each
// row's flat state, the 24 mix dots, the split with its Sinkhorn, x_in and the RMSNorm that
// follows, without the five launches and three round trips of the flat state through memory of
// the chunk path it replaces (hyper_connection_rows.cuh: norm, F16 GEMM, split, x_in, norm).
//
// A block takes 8 rows (kernels/hyper_connection_chunk_layout.hpp) and every segment of their
// state, so no block waits on another:
//   1. the rows' scales, as hc_pre_kernel's eight-row groups form them (hyper_connection.cuh's
//      hc_row_scales: core/reduce.hpp's lane order), while segment 0 lands in shared memory; or,
//      given hc_pre_launch::row_scale, those the hc post that wrote X formed in the same order;
//   2. per 512-input segment, through two cp.async stages: the rows' values scaled in place
//      (flat = x*scale, the reference's rms_norm_noweight), then warp w's outputs for all rows,
//      lane l the matvec order's slot l (16 products in order from 0.0f, mul then add), the
//      warp's butterflies by recursive halving (warp_halving.cuh), and the segment sum of each
//      (row, output) stored to the scratch at hc_pre_kernel's partial index;
//   3. hc_pre_kernel's finish itself (hc_finish_group: the segment sums in order from 0.0f, the
//      gates, the Sinkhorn, x_in and the folded norm).
// Contract: exact, the same bits as hc_pre_kernel and reference/hyper_connection (every step is
// theirs; tests/hyper_connection_chunk_emulation_test.cpp replays the layout and the halving on
// the CPU against the reference's mix).
// Cost model (flash, 2048 rows, H200): ~1.6 G mul/add instructions at full issue ~55 us, the
// state read three times (scale, dots, x_in) ~85 us at bandwidth, so ~100-120 us against ~410 us
// for the five launches. Two blocks per SM on sm_90 (80 KiB of stages each), one on sm_80.
// Graph contract: no allocation, no host synchronisation; the live row count is read on the
// device; the grid depends on the capacity only; the scratch is hc_pre_launch's (partials only:
// no arrival counter is touched). Shapes: hc_chunk_fits (n_hc <= 4, n_hc*n_embd a multiple of
// 16), 16-byte aligned X and fn; no folded hc post, no output mix.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/hyper_connection.cuh"
#include "ds4/kernels/hyper_connection_chunk_layout.hpp"
#include "ds4/kernels/warp_halving.cuh"

namespace ds4::kernels {

namespace detail {

template <int NHC>
__global__ void __launch_bounds__(hc_chunk_threads, 2)
    hc_pre_chunk_kernel(const __grid_constant__ hc_pre_launch a, int capacity) {
    constexpr int n_mix = 2 * NHC + NHC * NHC;
    constexpr int P = hc_chunk_outputs_per_warp(n_mix);
    constexpr int stage_bytes = hc_chunk_stage_bytes(n_mix);
    constexpr int x_words = hc_chunk_x_copies(), w_words = hc_chunk_w_copies(n_mix);
    static_assert(P * hc_chunk_rows <= hc_chunk_pairs, "a warp's outputs x rows must fit its 32 butterflies");
    static_assert(hc_chunk_threads == hc_threads && hc_chunk_rows <= hc_max_group_rows,
                  "the finish is hc_pre_kernel's: its block size and group limit");
    static_assert(x_words % hc_chunk_threads == 0, "whole x copies per thread");
    extern __shared__ int4 hc_chunk_smem[];
    __shared__ double scratch[hc_chunk_threads];
    __shared__ float scale_s[hc_chunk_rows];
    pdl_enter();
    const int r0 = int(blockIdx.x) * hc_chunk_rows;
    const int n_live = live_rows(a.n_rows, capacity);
    if (r0 >= n_live) return;
    const int rows = min(hc_chunk_rows, n_live - r0);
    const int nf = a.n_flat(), n_seg = a.segments();
    const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
    auto* smem = reinterpret_cast<std::uint8_t*>(hc_chunk_smem);
    auto stage_x = [&](int st) { return reinterpret_cast<float*>(smem + st * stage_bytes); };
    auto stage_w = [&](int st) { return reinterpret_cast<std::uint16_t*>(smem + st * stage_bytes + hc_chunk_x_bytes()); };
    // Segment s into stage st; rows past the live ones and inputs past the state are zero-filled
    // (a zero slot's chain is 0.0f, as the matvec's idle lanes add). Thread tid's copies k share
    // their inputs: x copy tid + 256k is row tid / 128 + 2k, w copy tid + 256k output tid / 64 + 4k.
    constexpr int x_row_step = hc_chunk_threads / (f16_segment / 4), w_row_step = hc_chunk_threads / (f16_segment / 8);
    const int xr = tid / (f16_segment / 4), xi = 4 * (tid % (f16_segment / 4));
    const int wo = tid / (f16_segment / 8), wi = 8 * (tid % (f16_segment / 8));
    const float* xsrc = a.X + std::int64_t(r0 + xr) * nf + xi;
    const std::uint16_t* wsrc = a.fn + std::int64_t(wo) * nf + wi;
    const int xdst = hc_chunk_x_index(xr, xi), wdst = hc_chunk_w_index(wo, wi);
    auto issue = [&](int s, int st) {
        float* xs = stage_x(st) + xdst;
        std::uint16_t* ws = stage_w(st) + wdst;
        const int e_seg = s * f16_segment;
#pragma unroll
        for (int k = 0; k < x_words / hc_chunk_threads; ++k) {
            const bool ok = xr + x_row_step * k < rows && e_seg + xi < nf;
            cp_async::zfill<16>(xs + k * (hc_chunk_x_index(x_row_step, 0) - hc_chunk_x_index(0, 0)),
                                ok ? xsrc + std::int64_t(x_row_step * k) * nf + e_seg : a.X, ok);
        }
#pragma unroll
        for (int k = 0; k < (w_words + hc_chunk_threads - 1) / hc_chunk_threads; ++k) {
            if (wo + w_row_step * k >= n_mix) break;
            const bool ok = e_seg + wi < nf;
            cp_async::zfill<16>(ws + k * (hc_chunk_w_index(w_row_step, 0) - hc_chunk_w_index(0, 0)),
                                ok ? wsrc + std::int64_t(w_row_step * k) * nf + e_seg : a.fn, ok);
        }
    };
    issue(0, 0);
    cp_async::commit();
    // The scales: formed by the hc post that wrote X where it did (the same lane order), which
    // saves this block a read of its rows' state before the first segment.
    if (a.row_scale) {
        if (tid < rows) scale_s[tid] = a.row_scale[r0 + tid];
    } else {
        hc_row_scales<hc_chunk_rows>(a, r0, rows, scratch, scale_s, nullptr, 0, 0);
    }
    for (int s = 0; s < n_seg; ++s) {
        cp_async::wait<0>();
        // Segment s landed; every warp is done with the other stage (segment s - 1); the scales
        // are written.
        __syncthreads();
        if (s + 1 < n_seg) issue(s + 1, (s + 1) % hc_chunk_stages);
        cp_async::commit();
        float* xs = stage_x(s % hc_chunk_stages);
        // flat = x*scale, once per stage (word w of x is row w / 128).
#pragma unroll
        for (int k = 0; k < x_words / hc_chunk_threads; ++k) {
            const int wd = tid + hc_chunk_threads * k, r = wd / (f16_segment / 4);
            if (r >= rows) continue;
            auto* p = reinterpret_cast<float4*>(xs) + wd;
            const float4 q = *p;
            const float sc = scale_s[r];
            *p = make_float4(mul_rn(q.x, sc), mul_rn(q.y, sc), mul_rn(q.z, sc), mul_rn(q.w, sc));
        }
        __syncthreads();
        const auto* wv = reinterpret_cast<const uint4*>(stage_w(s % hc_chunk_stages));
        float wf[P][f16_lane_elems];
#pragma unroll
        for (int k = 0; k < P; ++k) {
            const int o = warp * P + k;
            const uint4 lo = o < n_mix ? wv[(o * 2) * 32 + lane] : make_uint4(0u, 0u, 0u, 0u);
            const uint4 hi = o < n_mix ? wv[(o * 2 + 1) * 32 + lane] : make_uint4(0u, 0u, 0u, 0u);
            const std::uint32_t u[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                wf[k][2 * e] = f16_operand(std::uint16_t(u[e] & 0xffffu));
                wf[k][2 * e + 1] = f16_operand(std::uint16_t(u[e] >> 16));
            }
        }
        float v[hc_chunk_pairs];
        const auto* xv = reinterpret_cast<const float4*>(xs) + lane;
#pragma unroll
        for (int r = 0; r < hc_chunk_rows; ++r) {
            float x[f16_lane_elems];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 t = xv[(r * 4 + q) * 32];
                x[4 * q] = t.x, x[4 * q + 1] = t.y, x[4 * q + 2] = t.z, x[4 * q + 3] = t.w;
            }
#pragma unroll
            for (int k = 0; k < P; ++k) {
                float c = 0.0f;
#pragma unroll
                for (int e = 0; e < f16_lane_elems; ++e) c = add_rn(c, mul_rn(wf[k][e], x[e]));
                v[k * hc_chunk_rows + r] = c;
            }
        }
#pragma unroll
        for (int j = P * hc_chunk_rows; j < hc_chunk_pairs; ++j) v[j] = 0.0f;
        warp_halve<16>(v, lane, 16);
        warp_halve<8>(v, lane, 8);
        warp_halve<4>(v, lane, 4);
        warp_halve<2>(v, lane, 2);
        warp_halve<1>(v, lane, 1);
        const hc_chunk_pair pr = hc_chunk_pair_of(warp, lane, n_mix);
        if (lane < P * hc_chunk_rows && pr.output < n_mix && pr.row < rows)
            a.partials[hc_partial_index(r0 + pr.row, pr.output, s, n_mix, n_seg)] = v[0];
    }
    cp_async::wait<0>();
    // Every segment sum is stored (the finish reads them through L2, ld.cg) and every warp is
    // done with the stages.
    __syncthreads();
    hc_finish_group<NHC, hc_fin_batch, false>(a, r0, rows, nullptr);
}

}  // namespace detail

// Raises the kernel's shared-memory opt-in on `device` (before any capture) and asks for the
// largest carveout, so that two blocks share an SM.
template <int NHC = 4>
inline void prepare_hc_pre_chunk(int device) {
    with_device(device, [] {
        constexpr int bytes = hc_chunk_smem_bytes(2 * NHC + NHC * NHC);
        raise_smem_limit(detail::hc_pre_chunk_kernel<NHC>, bytes, "hc_pre_chunk smem");
        cuda_check(cudaFuncSetAttribute(reinterpret_cast<const void*>(detail::hc_pre_chunk_kernel<NHC>),
                                        cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
                   "hc_pre_chunk carveout");
    });
}

// HC pre of up to `capacity` rows (a.n_rows live on the device) in one launch: x_in, the split
// and, with norm_weight, the RMSNorm after it; the same outputs and bits as launch_hc_pre.
template <int NHC = 4>
inline void launch_hc_pre_chunk(const hc_pre_launch& a, int capacity, cudaStream_t stream) {
    static_assert(NHC >= 1 && NHC <= 4, "hc_pre_chunk: n_hc 1..4 (every warp's outputs in its butterflies)");
    detail::check_rows(capacity, "hc_pre_chunk");
    require(a.n_hc == NHC, "hc_pre_chunk: n_hc = " + std::to_string(a.n_hc) + ", the launch is compiled for " +
                               std::to_string(NHC));
    require(hc_chunk_fits(a.n_embd, a.n_hc),
            "hc_pre_chunk: n_hc * n_embd = " + std::to_string(a.n_hc * a.n_embd) + " must be a positive multiple of 16");
    require(a.X && a.fn && a.scale && a.base && a.x_in && a.split && a.partials, "hc_pre_chunk: null input, output or scratch");
    require(!a.output_mix && !a.post_F, "hc_pre_chunk: no output mix and no folded hc post");
    require(!a.norm_weight || a.norm_out, "hc_pre_chunk: a folded norm without its output");
    require(reinterpret_cast<std::uintptr_t>(a.fn) % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0,
            "hc_pre_chunk: X and fn must be 16-byte aligned");
    constexpr int bytes = hc_chunk_smem_bytes(2 * NHC + NHC * NHC);
    raise_smem_limit(detail::hc_pre_chunk_kernel<NHC>, bytes, "hc_pre_chunk smem", stream);
    const unsigned grid = unsigned((capacity + hc_chunk_rows - 1) / hc_chunk_rows);
    launch_kernel("hc_pre_chunk_kernel", detail::hc_pre_chunk_kernel<NHC>, grid, hc_chunk_threads, bytes, stream, a,
                  capacity);
    cuda_check_launch("hc_pre_chunk");
}

}  // namespace ds4::kernels
