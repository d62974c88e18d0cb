#pragma once
// Q8_0 activation quantization for producers whose consumer reads pre-quantized input: the
// grouped attention output projection (out_a, docs/model.md §2.4 step 11). Its 8 groups each read a
// different slice of the attention output, so matvec.cuh cannot quantize a shared x in-kernel;
// this kernel quantizes the whole row once into matvec's split layout (int8 qs[r*n + i], F32
// scales d[r*(n/32) + b]) and group g then passes act_qs = qs + g*group_in, act_d = d +
// g*group_in/32, act_stride = n.
//
// Contract: exact. Equals quantize_q8_0_act (format/q8_0.hpp): two lanes per 32-value block
// (matvec's quantize_half_block; a max is exact in any order), round-half-even, F32 scale.
// Graph contract: no allocation, no host synchronisation; the live row count is read from device
// memory; the grid is a function of the row capacity and n only.
// Shapes: n % 32 == 0; x rows 16-byte aligned (x_stride % 4 == 0).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/kernels/quantize_q8_0_lanes.cuh"

namespace ds4::kernels {

inline constexpr int quantize_act_threads = 256;

struct quantize_act_launch {
    const float* x = nullptr;  // x[r * x_stride + i]
    std::int64_t x_stride = 0;
    int n = 0;
    std::int8_t* qs = nullptr;  // [capacity][n]
    float* d = nullptr;         // [capacity][n / 32]
    const std::int32_t* n_rows = nullptr;  // live rows (device); null: every row of the capacity
};

// A template only for linkage: this header may be included by several translation units, and a
// __global__ function cannot be inline.
template <int = 0>
__global__ void __launch_bounds__(quantize_act_threads) quantize_act_kernel(const __grid_constant__ quantize_act_launch a) {
    pdl_enter();
    const int r = int(blockIdx.y);
    if (a.n_rows && r >= *a.n_rows) return;
    // Every lane of a warp takes part in the pair max shuffle; lanes past the end quantize zeros
    // and write nothing.
    const int half = int(blockIdx.x) * quantize_act_threads + int(threadIdx.x);
    const bool live = half * 16 < a.n;
    float v[16];
    detail::load_16(a.x + r * a.x_stride + (live ? half * 16 : 0), live, v);
    const std::int64_t o = std::int64_t(r) * a.n + half * 16;
    detail::quantize_half_block(v, live ? a.qs + o : nullptr,
                                live && half % 2 == 0 ? a.d + std::int64_t(r) * (a.n / 32) + half / 2 : nullptr);
}

inline void launch_quantize_act(const quantize_act_launch& a, int capacity, cudaStream_t stream) {
    require(a.x && a.qs && a.d, "quantize_act: null input or output");
    require(a.n > 0 && a.n % 32 == 0, "quantize_act: n = " + std::to_string(a.n) + " is not a multiple of 32");
    require(a.x_stride % 4 == 0, "quantize_act: x rows must be 16-byte aligned");
    require(capacity >= 1 && capacity <= 65535, "quantize_act: row capacity " + std::to_string(capacity));
    const int halves = a.n / 16;
    const dim3 grid(unsigned((halves + quantize_act_threads - 1) / quantize_act_threads), unsigned(capacity));
    launch_kernel("quantize_act_kernel", quantize_act_kernel<>, grid, quantize_act_threads, 0, stream, a);
    cuda_check_launch("quantize_act");
}

}  // namespace ds4::kernels
