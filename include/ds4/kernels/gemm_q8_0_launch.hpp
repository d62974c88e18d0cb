#pragma once
// What the Q8_0 x Q8_0 GEMM kernels share (gemm_q8_0.cuh's mma.sync kernels and host side,
// gemm_q8_0_wgmma.cuh's sm_90a kernel): the matrices of a launch, the plan's shape, the launch
// arguments and the bias that turns an int32 block sum into its float without I2F.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels {

inline constexpr int gemm_q8_0_max_matrices = 8;

// 1.5 * 2^23: bias + isum stays in [2^23, 2^24), where the float's ulp is 1.
inline constexpr std::int32_t gemm_q8_0_bias_bits = 0x4b400000;
inline constexpr float gemm_q8_0_bias_value = 12582912.0f;

struct gemm_q8_0_matrix {
    const std::uint8_t* quants = nullptr;   // tiled quants (format/tiled.hpp)
    const std::uint16_t* scales = nullptr;  // tiled F16 scales
    float* y = nullptr;                     // y[r * y_stride + o]
    int rows = 0, y_stride = 0;
    // Pre-quantized activations (quantize_act's split layout: qs[r * act_stride + i], d[r *
    // act_stride / 32 + b]); null: the launch's x, quantized into the workspace.
    const std::int8_t* act_qs = nullptr;
    const float* act_d = nullptr;
    int act_stride = 0;
};

// The shapes a plan is made for: the input width and each matrix's output rows.
struct gemm_q8_0_shape {
    int in = 0;
    int n_matrices = 0;
    int rows[gemm_q8_0_max_matrices] = {};
};

struct gemm_q8_0_args {
    const float* x = nullptr;  // x[r * x_stride + i], read when a matrix has no act_qs
    int x_stride = 0;
    int n_rows = 0;            // live rows (launch value); ignored when live_rows is given
    const std::int32_t* live_rows = nullptr;  // device: live rows of a captured step (grid covers the capacity)
    gemm_q8_0_matrix m[gemm_q8_0_max_matrices];
};

struct gemm_q8_0_launch {
    int in = 0, nb = 0, nb8 = 0, n_rows = 0, n_matrices = 0;
    const std::int32_t* live_rows = nullptr;
    gemm_q8_0_matrix m[gemm_q8_0_max_matrices];
    int cta_begin[gemm_q8_0_max_matrices + 1] = {};  // prefix of 128-row CTA columns per matrix
};

// The matrix of CTA column `col` (blockIdx.y) and the column's index inside that matrix.
struct gemm_q8_0_column {
    int k, index;
};
DS4_HD_INLINE gemm_q8_0_column gemm_q8_0_column_of(const gemm_q8_0_launch& a, int col) {
    int k = 0;
    while (k + 1 < a.n_matrices && col >= a.cta_begin[k + 1]) ++k;
    return {k, col - a.cta_begin[k]};
}

}  // namespace ds4::kernels
