#pragma once
// RMSNorm, the per-head RMS norm and RoPE/YaRN on head tails (docs/model.md §2.4 steps 1-4), fused:
// one launch normalises every head of every row (optionally times a weight shared by the heads)
// and rotates each head's last n_rot values at the row's position. The same kernel is
//   RMSNorm with weight    (attn_norm, q_a_norm, ffn_norm, output_norm): 1 head of n, no RoPE;
//   q heads                 (head_rms_norm then rope_tail): n_head heads, no weight, RoPE;
//   kv                      (rms_norm with kv_norm then rope_tail): 1 head, weight, RoPE.
//
// Contract: exact. Equals reference/norm_rope bitwise: the sum of squares in the lane order of
// core/reduce.hpp (one block per head, block_lane_reduce), the scale by rms_scale_from_sum, out =
// (x*scale)*w or x*scale, then rope_rotate with rope_theta's iterated angle (core/rope.hpp).
// Graph contract: no allocation, no host synchronisation; positions and the live row count are
// read from device memory; the grid is (n_head, row capacity) and blocks of idle rows return.
// Shapes: any head_dim >= 1 and n_head >= 1; n_rot even, 0 <= n_rot <= head_dim. x may equal out
// (in place) when the strides agree.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4::kernels {

struct norm_rope_launch {
    const float* x = nullptr;  // x[r * x_stride + h * head_dim + i]
    float* out = nullptr;      // out[r * out_stride + h * head_dim + i]
    std::int64_t x_stride = 0, out_stride = 0;
    const float* weight = nullptr;  // [head_dim], shared by every head; null: no weight
    int n_head = 1, head_dim = 0;
    float eps = 1e-6f;
    int n_rot = 0;                        // 0: no RoPE
    rope_params rope{};
    const std::int32_t* pos = nullptr;    // [capacity] positions (RoPE only)
    const std::int32_t* n_rows = nullptr; // live rows (device); null: every row of the capacity
    bool inverse = false;                 // inverse RoPE (§2.4 step 10)
};

template <int Threads>
__global__ void __launch_bounds__(Threads) norm_rope_kernel(const __grid_constant__ norm_rope_launch a) {
    __shared__ double scratch[Threads];
    const int r = int(blockIdx.y), h = int(blockIdx.x), t = int(threadIdx.x);
    if (a.n_rows && r >= *a.n_rows) return;
    const float* x = a.x + r * a.x_stride + std::int64_t(h) * a.head_dim;
    float* out = a.out + r * a.out_stride + std::int64_t(h) * a.head_dim;
    const double ss = block_lane_reduce<Threads, double>(a.head_dim, [x](int i) { return square_f64(x[i]); }, scratch);
    const float scale = rms_scale_from_sum(ss, a.head_dim, a.eps);
    auto norm = [&](int i) {
        const float v = mul_rn(x[i], scale);
        return a.weight ? mul_rn(v, a.weight[i]) : v;
    };
    const int nope = a.head_dim - a.n_rot;
    for (int i = t; i < nope; i += Threads) out[i] = norm(i);
    if (a.n_rot == 0) return;
    const auto pos = std::uint32_t(a.pos[r]);
    for (int k = t; k < a.n_rot / 2; k += Threads) {
        float y0 = norm(nope + 2 * k), y1 = norm(nope + 2 * k + 1), sn, cs;
        sincos_f32(rope_theta(a.rope, pos, k), &sn, &cs);
        rope_rotate(y0, y1, cs, a.inverse ? -sn : sn);
        out[nope + 2 * k] = y0;
        out[nope + 2 * k + 1] = y1;
    }
}

// Block width by head length: a block streams its lanes, wider heads get more threads.
inline int norm_rope_threads(int head_dim) { return head_dim >= 2048 ? 256 : (head_dim >= 256 ? 128 : 32); }

inline void launch_norm_rope(const norm_rope_launch& a, int capacity, cudaStream_t stream) {
    require(a.x && a.out && a.head_dim >= 1 && a.n_head >= 1, "norm_rope: empty input or output");
    require(a.n_rot >= 0 && a.n_rot % 2 == 0 && a.n_rot <= a.head_dim,
            "norm_rope: n_rot = " + std::to_string(a.n_rot) + " for head_dim " + std::to_string(a.head_dim));
    require(a.n_rot == 0 || a.pos, "norm_rope: RoPE needs the positions");
    require(capacity >= 1 && capacity <= 65535, "norm_rope: row capacity " + std::to_string(capacity));
    const dim3 grid(unsigned(a.n_head), unsigned(capacity));
    switch (norm_rope_threads(a.head_dim)) {
        case 256: norm_rope_kernel<256><<<grid, 256, 0, stream>>>(a); break;
        case 128: norm_rope_kernel<128><<<grid, 128, 0, stream>>>(a); break;
        default: norm_rope_kernel<32><<<grid, 32, 0, stream>>>(a); break;
    }
    cuda_check_launch("norm_rope");
}

// RMSNorm with weight over n values per row (attn_norm, q_a_norm, ffn_norm, output_norm).
inline void launch_rms_norm(const float* x, std::int64_t x_stride, const float* weight, float* out,
                            std::int64_t out_stride, int n, float eps, const std::int32_t* n_rows, int capacity,
                            cudaStream_t stream) {
    norm_rope_launch a;
    a.x = x;
    a.out = out;
    a.x_stride = x_stride;
    a.out_stride = out_stride;
    a.weight = weight;
    a.head_dim = n;
    a.eps = eps;
    a.n_rows = n_rows;
    launch_norm_rope(a, capacity, stream);
}

}  // namespace ds4::kernels
