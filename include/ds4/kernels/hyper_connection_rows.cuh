#pragma once
// The tail of HC pre for a prefill chunk's rows, once their mix is known: the split (pre, post and
// the Sinkhorn-normalised comb, core/hyper_connection.hpp's hc_split_sinkhorn) and the weighted
// stream sum x_in[d] = sum_h X[h][d] * pre[h].
//
// A chunk's HC pre is five launches instead of hyper_connection.cuh's one (which is built for
// decode rows: its blocks share a row's 16384-long dot through partials and check-ins): the
// unweighted RMSNorm of each row's flat state (norm_rope.cuh), the mix as one F16 GEMM
// (gemm_f16.cuh, the matvec's order), this file's two, and the sublayer's RMSNorm of x_in. Each step is
// the reference's own (reference/hyper_connection.cpp: rms_norm_noweight, matvec_f16,
// hc_split_sinkhorn, weighted_stream_sum), so the contract is the same: exact.
// Cost: two launches. The split runs one row per thread (the Sinkhorn's ~40 dependent
// normalisations are a latency chain: 2048 rows side by side take about one row's time; a block
// per row with thread 0 in the Sinkhorn took 156 us at 2048 rows on the H200), then a block per
// row writes x_in from the row's state and its pre gates.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/hyper_connection.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/hyper_connection.cuh"
#include "ds4/kernels/norm_rope.cuh"

namespace ds4::kernels {

struct hc_split_rows_launch {
    const float* mix = nullptr;  // [rows][n_mix] the F16 mix of the normalised flat state
    const float* X = nullptr;    // [rows][n_hc][n_embd]
    const float* scale = nullptr;  // F32[3]
    const float* base = nullptr;   // F32[n_mix]
    int n_embd = 0, n_hc = 4, iters = 20;
    float hc_eps = 1e-6f;
    float* split = nullptr;  // [rows][n_mix]: pre, post, comb (hc post reads it)
    float* x_in = nullptr;   // [rows][x_in_stride]
    std::int64_t x_in_stride = 0;
    const std::int32_t* n_rows = nullptr;  // live rows (device)

    __host__ __device__ int n_mix() const { return 2 * n_hc + n_hc * n_hc; }
};

inline constexpr int hc_split_rows_threads = 64;  // rows per split block: spread over the SMs

template <int = 0>
__global__ void __launch_bounds__(hc_split_rows_threads) hc_split_rows_kernel(const __grid_constant__ hc_split_rows_launch a) {
    pdl_enter();
    const int r = int(blockIdx.x) * hc_split_rows_threads + int(threadIdx.x), n_mix = a.n_mix();
    if (r >= *a.n_rows) return;
    const hc_split s = hc_split_sinkhorn(a.mix + std::int64_t(r) * n_mix, a.scale, a.base, a.n_hc, a.iters, a.hc_eps);
    float* out = a.split + std::int64_t(r) * n_mix;
    for (int h = 0; h < a.n_hc; ++h) {
        out[h] = s.pre[h];
        out[a.n_hc + h] = s.post[h];
    }
    for (int i = 0; i < a.n_hc * a.n_hc; ++i) out[2 * a.n_hc + i] = s.comb[i];
}

template <int = 0>
__global__ void __launch_bounds__(256) hc_x_in_rows_kernel(const __grid_constant__ hc_split_rows_launch a) {
    pdl_enter();
    __shared__ float pre[hc_split::max_hc];
    const int r = int(blockIdx.x);
    if (r >= *a.n_rows) return;
    if (int(threadIdx.x) < a.n_hc) pre[threadIdx.x] = a.split[std::int64_t(r) * a.n_mix() + threadIdx.x];
    __syncthreads();
    const float* X = a.X + std::int64_t(r) * a.n_hc * a.n_embd;
    for (int d = int(threadIdx.x); d < a.n_embd; d += int(blockDim.x))
        a.x_in[std::int64_t(r) * a.x_in_stride + d] = hc_weighted_sum(X + d, a.n_embd, pre, a.n_hc);
}

inline void launch_hc_split_rows(const hc_split_rows_launch& a, int capacity, cudaStream_t stream) {
    require(a.mix && a.X && a.scale && a.base && a.split && a.x_in && a.n_rows, "hc split rows: a null input or output");
    require(a.n_hc >= 1 && a.n_hc <= hc_split::max_hc && a.n_embd >= 1 && a.x_in_stride >= a.n_embd,
            "hc split rows: n_hc " + std::to_string(a.n_hc) + " (1..8), n_embd >= 1, x_in_stride >= n_embd");
    require(capacity >= 1, "hc split rows: capacity " + std::to_string(capacity));
    launch_kernel("hc_split_rows_kernel", hc_split_rows_kernel<>,
                  unsigned((capacity + hc_split_rows_threads - 1) / hc_split_rows_threads), hc_split_rows_threads, 0,
                  stream, a);
    cuda_check_launch("hc split rows");
    launch_kernel("hc_x_in_rows_kernel", hc_x_in_rows_kernel<>, unsigned(capacity), 256, 0, stream, a);
    cuda_check_launch("hc x_in rows");
}

// A chunk's whole HC pre as these five launches: the unweighted RMSNorm of each row's flat state
// into `flat` ([capacity][n_hc*n_embd]), the mix as one gemm_f16 launch into `mix`
// ([capacity][n_mix]), the split and x_in, then with a.norm_weight the sublayer's RMSNorm into
// a.norm_out. `a` is hc pre's one-launch description (hyper_connection.cuh; its partials and
// folds unused); the outputs are its outputs, bit for bit. gemm_f16's shared-memory opt-in must
// be raised (prepare_gemm_f16) before a capture.
inline void launch_hc_pre_rows(const hc_pre_launch& a, float* flat, float* mix, int capacity, cudaStream_t stream) {
    require(!a.output_mix && !a.post_F && a.n_rows, "hc pre rows: no output mix, no folded hc post, live rows on the device");
    require(flat && mix, "hc pre rows: null flat or mix scratch");
    const int n_flat = a.n_flat(), n_mix = a.n_mix();
    launch_rms_norm(a.X, n_flat, nullptr, flat, n_flat, n_flat, a.rms_eps, a.n_rows, capacity, stream);
    gemm_f16_args g;
    g.x = flat;
    g.x_stride = n_flat;
    g.in = n_flat;
    g.live_rows = a.n_rows;
    g.n_matrices = 1;
    g.m[0] = {a.fn, n_mix, mix, n_mix};
    gemm_f16(g, capacity, stream);
    hc_split_rows_launch s;
    s.mix = mix;
    s.X = a.X;
    s.scale = a.scale;
    s.base = a.base;
    s.n_embd = a.n_embd;
    s.n_hc = a.n_hc;
    s.iters = a.iters;
    s.hc_eps = a.hc_eps;
    s.split = a.split;
    s.x_in = a.x_in;
    s.x_in_stride = a.x_in_stride;
    s.n_rows = a.n_rows;
    launch_hc_split_rows(s, capacity, stream);
    if (a.norm_weight != nullptr)
        launch_rms_norm(a.x_in, a.x_in_stride, a.norm_weight, a.norm_out, a.norm_stride, a.n_embd, a.norm_eps, a.n_rows,
                        capacity, stream);
}

}  // namespace ds4::kernels
