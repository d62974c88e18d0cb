#pragma once
// RMSNorm, the per-head RMS norm and RoPE/YaRN on head tails (docs/model.md §2.4 steps 1-4), fused:
// one launch normalises every head of every row (optionally times a weight shared by the heads)
// and rotates each head's last n_rot values at the row's position. The same kernel is
//   RMSNorm with weight    (attn_norm, q_a_norm, ffn_norm, output_norm): 1 head of n, no RoPE;
//   q heads                 (head_rms_norm then rope_tail): n_head heads, no weight, RoPE;
//   kv                      (rms_norm with kv_norm then rope_tail): 1 head, weight, RoPE.
//
// Contract: exact. Equals reference/norm_rope bitwise: the sum of squares in the lane order of
// core/reduce.hpp (one block per head: add_thread_chunk + group_lane_combine on aligned shapes,
// block_lane_reduce otherwise; the same adds in the same order), the scale by rms_scale_from_sum,
// out = (x*scale)*w or x*scale, then rope_rotate with rope_theta's iterated angle (core/rope.hpp).
// Cost: on aligned shapes each thread issues all its loads (x, weight) before the first add, so a
// row is one memory round trip, a chain of (head_dim/4/threads)*4 double adds, the block combine
// and the stores (expected ~3 us for one 4096 row at batch 1, one block; the scalar form
// measured ~12 us); odd shapes (head_dim or n_rot not a multiple of 4, unaligned rows, heads past
// 16384) take the scalar form.
// Graph contract: no allocation, no host synchronisation; positions and the live row count are
// read from device memory; the grid is (n_head, row capacity) and blocks of idle rows return.
// Shapes: any head_dim >= 1 and n_head >= 1; n_rot even, 0 <= n_rot <= head_dim. x may equal out
// (in place) when the strides agree.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/kernels/attention_q16.hpp"

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
    // Optional (q heads of head_dim 512, at most 64 heads; the vector kernel): out also written as
    // the tensor-core attention's F16 operand (attention_q16.hpp), row r at q16 + r*q16_token_halves.
    __half* q16 = nullptr;
};

template <int Threads>
__global__ void __launch_bounds__(Threads) norm_rope_kernel(const __grid_constant__ norm_rope_launch a) {
    pdl_enter();
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

// The vector form of norm_rope_kernel (the launcher picks it when every row and head is 16-byte
// aligned, head_dim and n_rot are multiples of 4 and head_dim <= 4*Threads*Chunks): thread t
// loads its chunks t + Threads*m (and the weight's) up front, all in flight at once, sums them in
// the lane order through add_thread_chunk (core/reduce.hpp: the same adds as block_lane_reduce),
// and writes each chunk from its registers. The scalar kernel walks the head twice, and its
// output loop cannot lift a trip's loads above the previous trip's store (out may alias x): 16
// serial round trips at 4096 on one block, the batch-1 cost. A chunk past the unrotated part
// holds two whole RoPE pairs (the part's length is a multiple of 4), so each thread writes only
// what it read: in place stays safe.
template <int Threads, int Chunks>
__global__ void __launch_bounds__(Threads) norm_rope_vec_kernel(const __grid_constant__ norm_rope_launch a) {
    pdl_enter();
    __shared__ double scratch[Threads];
    const int r = int(blockIdx.y), h = int(blockIdx.x), t = int(threadIdx.x);
    if (a.n_rows && r >= *a.n_rows) return;
    const int n = a.head_dim;
    const float* x = a.x + r * a.x_stride + std::int64_t(h) * n;
    float* out = a.out + r * a.out_stride + std::int64_t(h) * n;
    float4 xv[Chunks], wv[Chunks];
#pragma unroll
    for (int m = 0; m < Chunks; ++m) {
        xv[m] = load_chunk(x, t + Threads * m, n, true);
        if (a.weight) wv[m] = load_chunk(a.weight, t + Threads * m, n, true);
    }
    double v[lanes_per_thread<Threads>] = {};
#pragma unroll
    for (int m = 0; m < Chunks; ++m)  // head_dim % 4 == 0 (norm_rope_vec_ok): whole chunks
        if ((t + Threads * m) * reduce_chunk < n)
            add_whole_chunk<Threads>(v, m, [&](int k) { return square_f64(float4_at(xv[m], k)); });
    const float scale = rms_scale_from_sum(group_lane_combine<Threads>(v, scratch, t), n, a.eps);
    const int nope = n - a.n_rot;
    const auto pos = a.n_rot ? std::uint32_t(a.pos[r]) : 0u;
#pragma unroll
    for (int m = 0; m < Chunks; ++m) {
        const int i0 = (t + Threads * m) * reduce_chunk;
        if (i0 >= n) continue;
        float y[reduce_chunk];
#pragma unroll
        for (int e = 0; e < reduce_chunk; ++e) {
            y[e] = mul_rn(float4_at(xv[m], e), scale);
            if (a.weight) y[e] = mul_rn(y[e], float4_at(wv[m], e));
        }
        if (i0 >= nope) {
#pragma unroll
            for (int p = 0; p < reduce_chunk / 2; ++p) {
                const int k = (i0 - nope) / 2 + p;
                float sn, cs;
                sincos_f32(rope_theta(a.rope, pos, k), &sn, &cs);
                rope_rotate(y[2 * p], y[2 * p + 1], cs, a.inverse ? -sn : sn);
            }
        }
        reinterpret_cast<float4*>(out)[i0 / reduce_chunk] = make_float4(y[0], y[1], y[2], y[3]);
        if (a.q16 != nullptr) {
            // Four consecutive dims of one head row: 8 contiguous bytes of the core-matrix layout.
            const float sc = attention_q_scale_log2(n);
            const __half2 lo = __floats2half2_rn(y[0] * sc, y[1] * sc), hi = __floats2half2_rn(y[2] * sc, y[3] * sc);
            __half* q16 = a.q16 + std::int64_t(r) * q16_token_halves(n) + core_matrix_offset(h, i0, n);
            reinterpret_cast<uint2*>(q16)[0] =
                make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi));
        }
    }
}

// Block width by head length: a block streams its lanes, wider heads get more threads.
inline int norm_rope_threads(int head_dim) { return head_dim >= 2048 ? 256 : (head_dim >= 256 ? 128 : 32); }

namespace detail {
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
}  // namespace detail

// Whether the vector kernel applies: whole chunks everywhere, the chunk count per thread bounded
// by Chunks (see the launcher).
inline bool norm_rope_vec_ok(const norm_rope_launch& a, int threads, int chunks) {
    return a.head_dim % 4 == 0 && a.n_rot % 4 == 0 && a.x_stride % 4 == 0 && a.out_stride % 4 == 0 &&
           detail::aligned16(a.x) && detail::aligned16(a.out) && (!a.weight || detail::aligned16(a.weight)) &&
           a.head_dim <= 4 * threads * chunks;
}

inline void launch_norm_rope(const norm_rope_launch& a, int capacity, cudaStream_t stream) {
    require(a.x && a.out && a.head_dim >= 1 && a.n_head >= 1, "norm_rope: empty input or output");
    require(a.n_rot >= 0 && a.n_rot % 2 == 0 && a.n_rot <= a.head_dim,
            "norm_rope: n_rot = " + std::to_string(a.n_rot) + " for head_dim " + std::to_string(a.head_dim));
    require(a.n_rot == 0 || a.pos, "norm_rope: RoPE needs the positions");
    require(capacity >= 1 && capacity <= 65535, "norm_rope: row capacity " + std::to_string(capacity));
    const dim3 grid(unsigned(a.n_head), unsigned(capacity));
    require(!a.q16 || (a.head_dim == 512 && a.n_head <= q16_rows && norm_rope_vec_ok(a, 128, 4) &&
                       detail::aligned16(a.q16)),
            "norm_rope: the F16 attention operand needs head_dim 512, at most 64 heads and aligned rows");
    // Chunks per thread: up to 2 below 256 (32 threads), 4 below 2048 (128), 4 or 16 above (256).
    const int threads = norm_rope_threads(a.head_dim);
    if (threads == 32 && norm_rope_vec_ok(a, 32, 2)) {
        launch_kernel("norm_rope_vec_kernel", norm_rope_vec_kernel<32, 2>, grid, 32, 0, stream, a);
    } else if (threads == 128 && norm_rope_vec_ok(a, 128, 4)) {
        launch_kernel("norm_rope_vec_kernel", norm_rope_vec_kernel<128, 4>, grid, 128, 0, stream, a);
    } else if (threads == 256 && norm_rope_vec_ok(a, 256, 4)) {
        launch_kernel("norm_rope_vec_kernel", norm_rope_vec_kernel<256, 4>, grid, 256, 0, stream, a);
    } else if (threads == 256 && norm_rope_vec_ok(a, 256, 16)) {
        launch_kernel("norm_rope_vec_kernel", norm_rope_vec_kernel<256, 16>, grid, 256, 0, stream, a);
    } else switch (threads) {
        case 256: launch_kernel("norm_rope_kernel", norm_rope_kernel<256>, grid, 256, 0, stream, a); break;
        case 128: launch_kernel("norm_rope_kernel", norm_rope_kernel<128>, grid, 128, 0, stream, a); break;
        default: launch_kernel("norm_rope_kernel", norm_rope_kernel<32>, grid, 32, 0, stream, a); break;
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
