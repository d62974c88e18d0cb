#pragma once
// F16 weights x F32 activations for many rows at once (prefill chunks: the compressor, indexer
// and head-weight projections), on CUDA cores, in the matvec's reduction order.
//
// Contract: exact. Every output equals reference/matvec's f16 row dot (format/row_dot.hpp) bit for
// bit, so a chunk's projections equal the single-row decode steps' (the engine's batch
// invariance): per 512-input segment, lane slot l sums inputs [16l, 16l + 16) in order from 0.0f
// (mul then add, no FMA); the 32 slot partials meet in the xor butterfly 16, 8, 4, 2, 1; segment
// results are added in order from 0.0f. Tensor cores cannot keep that order, so this is the
// matvec's arithmetic with the weights and activations staged once per CTA tile in shared memory
// instead of re-read per 16 rows.
//
// Layout: a warp is the 32 lane slots of one segment for an 8 x 8 tile of (weight row, activation
// row) outputs: each thread runs 64 chains of 16 products on its slot. The butterfly is taken by
// recursive halving (at offset o a lane keeps the half of its outputs its bit o selects and adds the
// partner's value of the same output): the same sums as the full butterfly, since a + b == b + a,
// in 62 shuffles for 64 outputs instead of 320. A lane then holds outputs 2 lane and 2 lane + 1 of
// the tile. 12 warps: 4 along weight rows x 3 along activation rows (a 32 x 24 CTA tile), three
// warps per scheduler to hide the shared-memory and add latencies (8 warps issued at 0.6 per
// clock; 16 spill at 128 registers); half segments (8 inputs of every slot) staged by cp.async
// four deep, 40 KiB each.
// Shapes: in a multiple of 16 (a slot is wholly inside or past the input, past it adds 0.0f as
// the matvec's idle lanes do); x rows 16-byte aligned (x_stride a multiple of 4); any row counts.
// Graph contract: no allocation, no host synchronisation; the grid depends on the capacity only
// when live_rows is given.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/warp_halving.cuh"

namespace ds4::kernels {

inline constexpr int gemm_f16_max_matrices = 8;
inline constexpr int gemm_f16_wm = 32;  // weight rows per CTA
inline constexpr int gemm_f16_xn = 24;  // activation rows per CTA
inline constexpr int gemm_f16_threads = 384;

struct gemm_f16_matrix {
    const std::uint16_t* w = nullptr;  // [rows][in] F16, as in the GGUF
    int rows = 0;
    float* y = nullptr;  // y[r * y_stride + row]
    int y_stride = 0;
};

struct gemm_f16_args {
    const float* x = nullptr;  // x[r * x_stride + i]
    int x_stride = 0;
    int in = 0;
    int n_rows = 0;                           // live rows (launch value), ignored with live_rows
    const std::int32_t* live_rows = nullptr;  // device live row count of a captured step
    int n_matrices = 0;
    gemm_f16_matrix m[gemm_f16_max_matrices];
};

struct gemm_f16_launch {
    gemm_f16_args a;
    int tile_begin[gemm_f16_max_matrices + 1];  // first weight tile (blockIdx.x) of each matrix
    int capacity = 0;
};

namespace gemm_f16_detail {

// A stage holds half a segment: inputs [8 h, 8 h + 8) of every slot l (16 l .. 16 l + 15), h = 0, 1.
inline constexpr int half_w_bytes = gemm_f16_wm * (f16_segment / 2) * 2;  // 16 KiB
inline constexpr int half_x_bytes = gemm_f16_xn * (f16_segment / 2) * 4;  // 24 KiB
inline constexpr int stages = 4;
inline constexpr int smem_bytes = stages * (half_w_bytes + half_x_bytes);  // 160 KiB
static_assert(smem_bytes <= 166912, "gemm_f16: a CTA's shared memory must fit sm_80's 163 KiB opt-in");
// 16-byte copies per thread and stage (the last weight one only on the first threads).
inline constexpr int w_chunks = (gemm_f16_wm * 32 + gemm_f16_threads - 1) / gemm_f16_threads;
inline constexpr int x_chunks = gemm_f16_xn * 64 / gemm_f16_threads;
static_assert(x_chunks * gemm_f16_threads == gemm_f16_xn * 64 && gemm_f16_threads % 64 == 0);

// Slot-major so that the 32 lanes of a warp read consecutive 16-byte words: weights [row][slot][8
// halves], activations [row][part 0..1][slot][4 floats].
struct stage {
    alignas(16) std::uint8_t w[half_w_bytes];
    alignas(16) std::uint8_t x[half_x_bytes];
};

}  // namespace gemm_f16_detail

template <int = 0>
__global__ void __launch_bounds__(gemm_f16_threads, 1) gemm_f16_kernel(const __grid_constant__ gemm_f16_launch L) {
    pdl_enter();
    using namespace gemm_f16_detail;
    extern __shared__ int4 gemm_f16_smem[];
    auto* st = reinterpret_cast<stage*>(gemm_f16_smem);
    const gemm_f16_args& a = L.a;
    const int n_live = a.live_rows ? min(*a.live_rows, L.capacity) : a.n_rows;
    const int x0 = int(blockIdx.y) * gemm_f16_xn;
    if (x0 >= n_live) return;
    int k = 0;
    while (k + 1 < a.n_matrices && int(blockIdx.x) >= L.tile_begin[k + 1]) ++k;
    const gemm_f16_matrix& m = a.m[k];
    const int w0 = (int(blockIdx.x) - L.tile_begin[k]) * gemm_f16_wm;
    const int in = a.in, units = 2 * ((in + f16_segment - 1) / f16_segment);
    const int tid = int(threadIdx.x);

    // This thread's copies: weight chunk j = (row tid / 32 + 12 j, slot tid % 32), activation chunk
    // j = (row tid / 64 + 6 j, part tid / 32 % 2, slot tid % 32); only the row changes with j, so
    // one base pointer each. A row past the matrix or the live rows is zero-filled.
    constexpr int w_row_step = gemm_f16_threads / 32, x_row_step = gemm_f16_threads / 64;
    const int slot = tid % 32, wr = tid / 32, xr = tid / 64, xp = tid / 32 % 2;
    const std::uint16_t* wsrc = m.w + std::size_t(w0 + wr) * in + 16 * slot;
    const float* xsrc = a.x + std::size_t(x0 + xr) * a.x_stride + 16 * slot + 4 * xp;
    const int woff = wr * (half_w_bytes / gemm_f16_wm) + slot * 16;
    const int xoff = xr * (half_x_bytes / gemm_f16_xn) + xp * 512 + slot * 16;
    // Stage s <- unit u: half u % 2 of segment u / 2. A slot is wholly inside or past the input.
    auto issue = [&](int u, int s) {
        const int e0 = (u / 2) * f16_segment + 8 * (u % 2);
        const bool in_ok = e0 + 16 * slot < in;
        std::uint8_t* sw = st[s].w + woff;
        std::uint8_t* sx = st[s].x + xoff;
#pragma unroll
        for (int j = 0; j < w_chunks; ++j) {
            if (wr + j * w_row_step >= gemm_f16_wm) break;
            const bool ok = in_ok && w0 + wr + j * w_row_step < m.rows;
            cp_async::zfill<16>(sw + j * w_row_step * (half_w_bytes / gemm_f16_wm),
                                ok ? wsrc + std::size_t(j * w_row_step) * in + e0 : m.w, ok);
        }
#pragma unroll
        for (int j = 0; j < x_chunks; ++j) {
            const bool ok = in_ok && x0 + xr + j * x_row_step < n_live;
            cp_async::zfill<16>(sx + j * x_row_step * (half_x_bytes / gemm_f16_xn),
                                ok ? xsrc + std::size_t(j * x_row_step) * a.x_stride + e0 : a.x, ok);
        }
    };

    const int warp = tid / 32, lane = tid % 32;
    const int wr0 = (warp % (gemm_f16_wm / 8)) * 8, xr0 = (warp / (gemm_f16_wm / 8)) * 8;
    float acc[2] = {0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < stages - 1; ++s) {
        if (s < units) issue(s, s);
        cp_async::commit();
    }
    for (int seg = 0; seg < units / 2; ++seg) {
        float v[64];
#pragma unroll
        for (int j = 0; j < 64; ++j) v[j] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int u = 2 * seg + h;
            cp_async::wait<stages - 2>();
            __syncthreads();  // unit u landed; every warp is done with unit u - 1's stage
            if (u + stages - 1 < units) issue(u + stages - 1, (u + stages - 1) % stages);
            cp_async::commit();
            const stage& S = st[u % stages];
            // The slot's 8 inputs of this half in order, four at a time (part q).
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                float4 xv[8];
#pragma unroll
                for (int r = 0; r < 8; ++r)
                    xv[r] = *reinterpret_cast<const float4*>(S.x + (xr0 + r) * (half_x_bytes / gemm_f16_xn) + q * 512 + lane * 16);
#pragma unroll
                for (int wr = 0; wr < 8; ++wr) {
                    const uint2 hw = *reinterpret_cast<const uint2*>(S.w + (wr0 + wr) * (half_w_bytes / gemm_f16_wm) + lane * 16 + q * 8);
                    const float wf[4] = {f16_operand(std::uint16_t(hw.x & 0xffffu)), f16_operand(std::uint16_t(hw.x >> 16)),
                                         f16_operand(std::uint16_t(hw.y & 0xffffu)), f16_operand(std::uint16_t(hw.y >> 16))};
#pragma unroll
                    for (int r = 0; r < 8; ++r) {
                        float& c = v[wr * 8 + r];
                        c = add_rn(c, mul_rn(wf[0], xv[r].x));
                        c = add_rn(c, mul_rn(wf[1], xv[r].y));
                        c = add_rn(c, mul_rn(wf[2], xv[r].z));
                        c = add_rn(c, mul_rn(wf[3], xv[r].w));
                    }
                }
            }
        }
        // Recursive halving over offsets 16..1: 64 -> 2 outputs per lane.
        warp_halve<32>(v, lane, 16);
        warp_halve<16>(v, lane, 8);
        warp_halve<8>(v, lane, 4);
        warp_halve<4>(v, lane, 2);
        warp_halve<2>(v, lane, 1);
        acc[0] = add_rn(acc[0], v[0]);
        acc[1] = add_rn(acc[1], v[1]);
    }
    cp_async::wait<0>();
    // Lane l holds tile outputs j = 2l, 2l + 1: weight row j / 8, activation row j % 8.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int j = 2 * lane + e, row = w0 + wr0 + j / 8, r = x0 + xr0 + j % 8;
        if (row < m.rows && r < n_live) m.y[std::size_t(r) * m.y_stride + row] = acc[e];
    }
}

inline void prepare_gemm_f16(int device) {
    with_device(device, [] { raise_smem_limit(gemm_f16_kernel<>, gemm_f16_detail::smem_bytes, "gemm_f16 smem"); });
}

// The checked launch of `a` for a kernel whose CTAs cover `tile_rows` weight rows and whose
// input length is a multiple of `in_multiple` (`who` names the kernel in errors). `capacity`:
// the rows the grid covers (n_rows when 0).
inline gemm_f16_launch make_gemm_f16_launch(const gemm_f16_args& a, int capacity, int tile_rows, int in_multiple,
                                            const std::string& who) {
    const int cap = capacity > 0 ? capacity : a.n_rows;
    require(a.live_rows != nullptr || (a.n_rows >= 1 && a.n_rows <= cap),
            who + ": n_rows " + std::to_string(a.n_rows) + " outside 1..capacity " + std::to_string(cap));
    require(a.in >= in_multiple && a.in % in_multiple == 0,
            who + ": in = " + std::to_string(a.in) + " must be a positive multiple of " + std::to_string(in_multiple));
    require(a.x != nullptr && a.x_stride >= a.in && a.x_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.x) % 16 == 0,
            who + ": x must be 16-byte aligned with x_stride >= in and a multiple of 4");
    require(a.n_matrices >= 1 && a.n_matrices <= gemm_f16_max_matrices,
            who + ": " + std::to_string(a.n_matrices) + " matrices (1..8)");
    gemm_f16_launch L;
    L.a = a;
    L.capacity = cap;
    L.tile_begin[0] = 0;
    for (int k = 0; k < a.n_matrices; ++k) {
        const gemm_f16_matrix& m = a.m[k];
        require(m.w != nullptr && m.y != nullptr && m.rows >= 1 && m.y_stride >= m.rows &&
                    reinterpret_cast<std::uintptr_t>(m.w) % 16 == 0,
                who + ": matrix " + std::to_string(k) +
                    " needs 16-byte aligned weights, an output, rows >= 1 and y_stride >= rows");
        L.tile_begin[k + 1] = L.tile_begin[k] + (m.rows + tile_rows - 1) / tile_rows;
    }
    return L;
}

// One launch on `stream` for every matrix of `a` (all read the same x). `capacity`: the rows the
// grid covers (n_rows when 0); with live_rows the live count is read on the device.
inline void gemm_f16(const gemm_f16_args& a, int capacity, cudaStream_t stream) {
    const gemm_f16_launch L = make_gemm_f16_launch(a, capacity, gemm_f16_wm, 16, "gemm_f16");
    raise_smem_limit(gemm_f16_kernel<>, gemm_f16_detail::smem_bytes, "gemm_f16 smem", stream);
    const dim3 grid(unsigned(L.tile_begin[a.n_matrices]), unsigned((L.capacity + gemm_f16_xn - 1) / gemm_f16_xn));
    launch_kernel("gemm_f16_kernel", gemm_f16_kernel<>, grid, gemm_f16_threads, gemm_f16_detail::smem_bytes, stream, L);
    cuda_check_launch("gemm_f16");
}

}  // namespace ds4::kernels
