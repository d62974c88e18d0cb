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
// the tile. 8 warps: 4 along weight rows x 2 along activation rows (a 32 x 16 CTA tile); segments
// staged by cp.async two deep.
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
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/cp_async.cuh"

namespace ds4::kernels {

inline constexpr int gemm_f16_max_matrices = 8;
inline constexpr int gemm_f16_wm = 32;  // weight rows per CTA
inline constexpr int gemm_f16_xn = 16;  // activation rows per CTA
inline constexpr int gemm_f16_threads = 256;

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

inline constexpr int seg_w_bytes = gemm_f16_wm * f16_segment * 2;  // 32 KiB
inline constexpr int seg_x_bytes = gemm_f16_xn * f16_segment * 4;  // 32 KiB
inline constexpr int stages = 2;
inline constexpr int smem_bytes = stages * (seg_w_bytes + seg_x_bytes);

// One segment in shared memory, slot-major so that the 32 lanes of a warp read consecutive 16-byte
// words: weights [row][part 0..1][slot][8 halves], activations [row][part 0..3][slot][4 floats].
struct stage {
    alignas(16) std::uint8_t w[seg_w_bytes];
    alignas(16) std::uint8_t x[seg_x_bytes];
};

// One butterfly level on the 2 HALF outputs a lane holds: it keeps the half its lane bit `off`
// selects, adding the partner's value of the same output (partner = lane ^ off).
template <int HALF>
__device__ __forceinline__ void halve(float* v, int lane, int off) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int j = 0; j < HALF; ++j) {
        const float keep = upper ? v[HALF + j] : v[j];
        const float send = upper ? v[j] : v[HALF + j];
        v[j] = add_rn(keep, __shfl_xor_sync(0xffffffffu, send, off));
    }
}

}  // namespace gemm_f16_detail

template <int = 0>
__global__ void __launch_bounds__(gemm_f16_threads, 1) gemm_f16_kernel(const __grid_constant__ gemm_f16_launch L) {
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
    const int in = a.in, segments = (in + f16_segment - 1) / f16_segment;

    // Stage s <- segment seg: 16-byte chunk c of a row's segment lands at its slot-major place.
    auto issue = [&](int seg, int s) {
        const int base = seg * f16_segment;
        for (int i = int(threadIdx.x); i < gemm_f16_wm * 64; i += gemm_f16_threads) {
            const int r = i / 64, c = i % 64, e = base + 8 * c;  // 8 halves per chunk
            const bool ok = w0 + r < m.rows && e < in;
            cp_async::zfill<16>(st[s].w + r * 1024 + (c % 2) * 512 + (c / 2) * 16,
                   m.w + std::size_t(ok ? w0 + r : 0) * in + (ok ? e : 0), ok);
        }
        for (int i = int(threadIdx.x); i < gemm_f16_xn * 128; i += gemm_f16_threads) {
            const int r = i / 128, c = i % 128, e = base + 4 * c;  // 4 floats per chunk
            const bool ok = x0 + r < n_live && e < in;
            cp_async::zfill<16>(st[s].x + r * 2048 + (c % 4) * 512 + (c / 4) * 16,
                   a.x + std::size_t(ok ? x0 + r : 0) * a.x_stride + (ok ? e : 0), ok);
        }
    };

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int wr0 = (warp % 4) * 8, xr0 = (warp / 4) * 8;
    float acc[2] = {0.0f, 0.0f};
    issue(0, 0);
    cp_async::commit();
    for (int seg = 0; seg < segments; ++seg) {
        cp_async::wait<0>();
        __syncthreads();  // segment seg landed; every warp is done with the other stage
        if (seg + 1 < segments) issue(seg + 1, (seg + 1) % stages);
        cp_async::commit();
        const stage& S = st[seg % stages];
        float v[64];
#pragma unroll
        for (int j = 0; j < 64; ++j) v[j] = 0.0f;
        // The slot's 16 inputs in order, four at a time: part q of the activations, half of part
        // q / 2 of the weights.
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float4 xv[8];
#pragma unroll
            for (int r = 0; r < 8; ++r)
                xv[r] = *reinterpret_cast<const float4*>(S.x + (xr0 + r) * 2048 + q * 512 + lane * 16);
#pragma unroll
            for (int wr = 0; wr < 8; ++wr) {
                const uint2 h = *reinterpret_cast<const uint2*>(S.w + (wr0 + wr) * 1024 + (q / 2) * 512 + lane * 16 + (q % 2) * 8);
                const float wf[4] = {f16_operand(std::uint16_t(h.x & 0xffffu)), f16_operand(std::uint16_t(h.x >> 16)),
                                     f16_operand(std::uint16_t(h.y & 0xffffu)), f16_operand(std::uint16_t(h.y >> 16))};
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
        // Recursive halving over offsets 16..1: 64 -> 2 outputs per lane.
        halve<32>(v, lane, 16);
        halve<16>(v, lane, 8);
        halve<8>(v, lane, 4);
        halve<4>(v, lane, 2);
        halve<2>(v, lane, 1);
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

// One launch on `stream` for every matrix of `a` (all read the same x). `capacity`: the rows the
// grid covers (n_rows when 0); with live_rows the live count is read on the device.
inline void gemm_f16(const gemm_f16_args& a, int capacity, cudaStream_t stream) {
    const int cap = capacity > 0 ? capacity : a.n_rows;
    require(a.live_rows != nullptr || (a.n_rows >= 1 && a.n_rows <= cap),
            "gemm_f16: n_rows " + std::to_string(a.n_rows) + " outside 1..capacity " + std::to_string(cap));
    require(a.in >= 16 && a.in % 16 == 0, "gemm_f16: in = " + std::to_string(a.in) + " must be a positive multiple of 16");
    require(a.x != nullptr && a.x_stride >= a.in && a.x_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.x) % 16 == 0,
            "gemm_f16: x must be 16-byte aligned with x_stride >= in and a multiple of 4");
    require(a.n_matrices >= 1 && a.n_matrices <= gemm_f16_max_matrices,
            "gemm_f16: " + std::to_string(a.n_matrices) + " matrices (1..8)");
    gemm_f16_launch L;
    L.a = a;
    L.capacity = cap;
    L.tile_begin[0] = 0;
    for (int k = 0; k < a.n_matrices; ++k) {
        const gemm_f16_matrix& m = a.m[k];
        require(m.w != nullptr && m.y != nullptr && m.rows >= 1 && m.y_stride >= m.rows &&
                    reinterpret_cast<std::uintptr_t>(m.w) % 16 == 0,
                "gemm_f16: matrix " + std::to_string(k) + " needs 16-byte aligned weights, an output, rows >= 1 and y_stride >= rows");
        L.tile_begin[k + 1] = L.tile_begin[k] + (m.rows + gemm_f16_wm - 1) / gemm_f16_wm;
    }
    raise_smem_limit(gemm_f16_kernel<>, gemm_f16_detail::smem_bytes, "gemm_f16 smem", stream);
    const dim3 grid(unsigned(L.tile_begin[a.n_matrices]), unsigned((cap + gemm_f16_xn - 1) / gemm_f16_xn));
    gemm_f16_kernel<><<<grid, gemm_f16_threads, gemm_f16_detail::smem_bytes, stream>>>(L);
    cuda_check_launch("gemm_f16");
}

}  // namespace ds4::kernels
