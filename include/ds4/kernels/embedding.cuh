#pragma once
// Token embedding (docs/model.md §9 step 0): row r's token id selects an F16 row of token_embd, which
// becomes every one of the n_hc hyper-connection streams of X[r] (X[r][h][d] = f16(emb[t][d]),
// stream-major like the reference engine's X).
//
// Contract: exact (an F16 -> F32 widening is exact). A token id outside [0, n_vocab) fills its
// row of X with NaN, so a corrupt id cannot pass silently as a valid embedding.
// Graph contract: no allocation, no host synchronisation; token ids and the live row count are
// read from device memory; the grid is a function of the row capacity and n_embd only.
// Shapes: n_embd % 8 == 0 (16-byte rows of 8 halves), any n_vocab, 1 <= n_hc <= 8.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"

namespace ds4::kernels {

inline constexpr int embedding_threads = 128;

struct embedding_launch {
    const std::uint16_t* table = nullptr;  // token_embd, [n_vocab][n_embd] F16 (16-byte aligned)
    const std::int32_t* tokens = nullptr;  // [capacity]
    float* X = nullptr;                    // X[r * n_hc * n_embd + h * n_embd + d] (16-byte aligned)
    int n_vocab = 0, n_embd = 0, n_hc = 4;
    const std::int32_t* n_rows = nullptr;  // live rows (device); null: every row of the capacity
};

// A template only for linkage: this header may be included by several translation units, and a
// __global__ function cannot be inline.
template <int = 0>
__global__ void __launch_bounds__(embedding_threads) embedding_kernel(const __grid_constant__ embedding_launch a) {
    pdl_enter();
    const int r = int(blockIdx.y);
    if (a.n_rows && r >= *a.n_rows) return;
    const int g = int(blockIdx.x) * embedding_threads + int(threadIdx.x);  // group of 8 values
    if (g * 8 >= a.n_embd) return;
    const std::int32_t tok = a.tokens[r];
    float v[8];
    if (tok >= 0 && tok < a.n_vocab) {
        const int4 raw = __ldg(reinterpret_cast<const int4*>(a.table + std::int64_t(tok) * a.n_embd) + g);
        const auto* h = reinterpret_cast<const std::uint16_t*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = f16_to_f32(h[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = bits_float(0x7fc00000u);
    }
    float* row = a.X + std::int64_t(r) * a.n_hc * a.n_embd + g * 8;
    for (int s = 0; s < a.n_hc; ++s) {
        float4* dst = reinterpret_cast<float4*>(row + std::int64_t(s) * a.n_embd);
        dst[0] = make_float4(v[0], v[1], v[2], v[3]);
        dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

inline void launch_embedding(const embedding_launch& a, int capacity, cudaStream_t stream) {
    require(a.table && a.tokens && a.X, "embedding: null table, tokens or X");
    require(a.n_embd > 0 && a.n_embd % 8 == 0, "embedding: n_embd = " + std::to_string(a.n_embd) + " is not a multiple of 8");
    require(a.n_hc >= 1 && a.n_hc <= 8, "embedding: n_hc = " + std::to_string(a.n_hc));
    require(a.n_vocab > 0, "embedding: empty vocabulary");
    require(capacity >= 1 && capacity <= 65535, "embedding: row capacity " + std::to_string(capacity));
    const int groups = a.n_embd / 8;
    const dim3 grid(unsigned((groups + embedding_threads - 1) / embedding_threads), unsigned(capacity));
    launch_kernel("embedding_kernel", embedding_kernel<>, grid, embedding_threads, 0, stream, a);
    cuda_check_launch("embedding");
}

}  // namespace ds4::kernels
