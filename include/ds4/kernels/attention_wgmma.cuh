#pragma once
// The tile loop of attention_mma.cuh on sm_90a warpgroup MMA (wgmma): same contract, same inputs
// (RowAt / ColOk / AllOk, q pre-scaled into shared memory, rows decoded exactly to F16),
// head_dim 512 only. Why: the mma.sync loop is bound by shared-memory wavefronts
// (every 16-head group re-reads q and the K=V tile through ldmatrix); wgmma reads a 64 x 16
// operand tile from shared memory once per warpgroup and keeps 64 x 256 accumulators in registers.
//
// 384 threads = 3 warpgroups, one job each. Warpgroup 0: S = q . K^T (64 heads x 64 rows, 32
// wgmma k-steps from shared memory), online softmax in registers (a head's 64 columns live in one
// quad), P as F16 both in registers (its own P.V A operand) and in shared memory with alpha, then
// O[:, 0:256] += P . V. Warpgroup 1: O[:, 256:512] += P . V with P from shared memory. Warpgroup
// 2: loads and converts tile i+2 while the others run tile i (two K=V buffers, two P buffers).
// The conversion bounds the loop (H200, 256K x 16 decode: 958 us with no conversion at all, 2401
// with warpgroup 1 converting beside its half of P.V, 1895 with this converter of its own, which
// holds few registers (setmaxnreg) and no accumulators).
// Shared memory holds q, K and P in the canonical no-swizzle "core matrix" layout (8 rows x 16
// bytes contiguous): element (r, c) of a [R][C] F16 matrix at ((r/8) * (C/8) + c/8) * 64 +
// (r%8) * 8 + c%8. The K=V tile serves as K-major B for S and as N-major B for P.V unchanged.
// Only compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); available() tells the host.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/kernels/attention_mma.cuh"

namespace ds4::kernels::wgmma_detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
inline constexpr bool device_has_wgmma = true;
#else
inline constexpr bool device_has_wgmma = false;
#endif

// Shared-memory matrix descriptor, no swizzle: start address, leading (K-direction for K-major,
// K-direction core-matrix stride for N-major) and stride byte offsets, each >> 4.
__device__ __forceinline__ std::uint64_t smem_desc(const void* p, std::uint32_t lbo, std::uint32_t sbo) {
    const auto a = static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
    return std::uint64_t((a & 0x3ffffu) >> 4) | (std::uint64_t(lbo >> 4) << 16) | (std::uint64_t(sbo >> 4) << 32);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy shared-memory writes made visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
// Hands registers between warpgroups (whole warpgroup, immediate counts).
template <int N>
__device__ __forceinline__ void regs_grow() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void regs_shrink() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Half offset of element (r, c) in a core-matrix-layout matrix with C columns.
__device__ __forceinline__ int cm_offset(int r, int c, int C) { return ((r >> 3) * (C >> 3) + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// D (+)= A . B, A = 64 x 16 and B = 16 x 64 from shared memory (both K-major); accumulate 0 zeroes D.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], std::uint64_t da, std::uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(da), "l"(db), "r"(accumulate)
        : "memory");
}

// D += A . B, A = 64 x 16 from shared memory (K-major), B = 16 x 256 from shared memory (N-major).
__device__ __forceinline__ void wgmma_m64n256k16_ss_nb(float (&d)[32][4], std::uint64_t da, std::uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "l"(da), "l"(db)
        : "memory");
}

// D += A . B, A = 64 x 16 from registers (the mma.sync A fragment per warp), B = 16 x 256 from
// shared memory (N-major).
__device__ __forceinline__ void wgmma_m64n256k16_rs_nb(float (&d)[32][4], const std::uint32_t (&a)[4], std::uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]), "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]), "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]), "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
}
#endif

inline constexpr int threads = 384;
// Registers per thread: 168 at launch (65536 / 384), then warpgroups 1 and 2 give 8 and 56 to
// warpgroup 0 (S, softmax, P fragments and half of O).
inline constexpr int regs_launch = 168, regs_mma = 232, regs_pv = 160, regs_convert = 112;
static_assert(regs_mma + regs_pv + regs_convert == 3 * regs_launch, "the register file is shared, not grown");
inline constexpr int D = 512, R = mma_detail::mma_rows;
inline constexpr int row_bytes = model::attention_row_layout{D, 64}.bytes();
inline constexpr std::size_t q_bytes = std::size_t(64) * D * 2, k_bytes = std::size_t(R) * D * 2;
inline constexpr std::size_t p_bytes = std::size_t(64) * R * 2, x_bytes = 64 * 4 * 2;  // P; alpha x 2 (then m, l)
// q, two K=V tiles and two P tiles (tile i and i+1 in flight), the exchange.
inline constexpr std::size_t smem_bytes = q_bytes + 2 * k_bytes + 2 * p_bytes + x_bytes;

struct state {
    float o[32][4];    // rows g, g + 8 of warp (w % 4) x dims 256 * (w / 4) + 8j + 2c (+1)
    float m[2], l[2];  // warpgroup 0: running max (exp2 units) and this thread's column sums
};

__device__ __forceinline__ __half* q_smem(float4* smem) { return reinterpret_cast<__half*>(smem); }
__device__ __forceinline__ float* x_smem(float4* smem) {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + q_bytes + 2 * k_bytes + 2 * p_bytes);
}

// q (F32, [64][512] rows of heads, already offset) * scale -> F16 core-matrix layout; rows past
// n_head zero. All threads of the CTA.
__device__ __forceinline__ void load_q(float4* smem, const float* q, int n_head, float scale) {
    __half* qs = q_smem(smem);
    for (int i = static_cast<int>(threadIdx.x); i < 64 * (D / 4); i += threads) {
        const int h = i / (D / 4), d = 4 * (i % (D / 4));
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < n_head) x = *reinterpret_cast<const float4*>(q + std::int64_t(h) * D + d);
        *reinterpret_cast<uint2*>(qs + cm_offset(h, d, D)) =
            make_uint2(mma_detail::pack_half2(x.x * scale, x.y * scale), mma_detail::pack_half2(x.z * scale, x.w * scale));
    }
}

// A tile's native rows -> F16 in the core-matrix layout, by the 128 threads of warpgroup 2: every
// load first (one round trip per tile; a store to shared memory would order later loads after it),
// then convert. Four threads per row read the row's 16-byte words q, q+4, ..., q+32 (words 0..27:
// E4M3 codes, one word of each 64-dim block per thread; 28..35: the RoPE tail), so a warp's load
// covers 8 rows x 64 contiguous bytes and its F16 stores hit 4 distinct 128-byte bank rows. Two
// threads per row with 8-byte loads touched 16 rows per warp load (H200, 256K x 16: 2690 us with
// that mapping, 2401 us with this one; 958 us with no decode at all, so the decode still bounds
// the loop).
struct raw_rows {
    static constexpr int n_rows = R / 32, n_words = 9, n_code_words = (D - 64) / 16;
    uint4 w[n_rows][n_words];
    uint2 exps[n_rows];
};

// t128 = 0..127 of the converting warpgroup: rows t128 / 4 + 32k, word offset t128 % 4.
template <class RowAt>
__device__ __forceinline__ void load_raw(raw_rows& x, int tile, int t128, RowAt&& row_at) {
    const model::attention_row_layout lay{D, 64};
    const int q = t128 & 3;
#pragma unroll
    for (int k = 0; k < raw_rows::n_rows; ++k) {
        const std::uint8_t* src = row_at(tile, (t128 >> 2) + 32 * k);
        // A missing row becomes zero codes at exponent 0 and a zero tail: it converts to zeros.
#pragma unroll
        for (int i = 0; i < raw_rows::n_words; ++i)
            x.w[k][i] = src != nullptr ? __ldg(reinterpret_cast<const uint4*>(src + 16 * (q + 4 * i))) : make_uint4(0u, 0u, 0u, 0u);
        x.exps[k] = src != nullptr ? __ldg(reinterpret_cast<const uint2*>(src + lay.exponent_offset())) : make_uint2(0u, 0u);
    }
}

// One row's code words -> F16 with the element-wise path wherever a block needs it (a block
// exponent outside the multiply's range). Out of line: the converting loop stays a few hundred
// instructions (with the element-wise code inlined 28 times it spanned tens of KiB of SASS).
struct raw_codes {
    uint4 w[raw_rows::n_code_words / 4];
    uint2 exps;
};
// (A template only for linkage: this header may be included by several translation units.)
template <int = 0>
__device__ __noinline__ void store_codes_exact(__half* ks, raw_codes x, int r, int q) {
#pragma unroll
    for (int i = 0; i < raw_rows::n_code_words / 4; ++i) {
        const int u = q + 4 * i;
        const int e = static_cast<std::int8_t>(((i < 4 ? x.exps.x : x.exps.y) >> (8 * (i & 3))) & 0xffu);
        const std::uint32_t m2 = mma_detail::e4m3_block_multiplier(e);
        *reinterpret_cast<uint4*>(ks + cm_offset(r, 16 * u, D)) = mma_detail::decode_e4m3x8_f16(make_uint2(x.w[i].x, x.w[i].y), m2, e);
        *reinterpret_cast<uint4*>(ks + cm_offset(r, 16 * u + 8, D)) =
            mma_detail::decode_e4m3x8_f16(make_uint2(x.w[i].z, x.w[i].w), m2, e);
    }
}

// The loaded words -> exact F16 in the core-matrix layout. sm_90a widens NaN codes exactly, so
// a row takes the fast path when every block's multiplier exists.
__device__ __forceinline__ void store_raw(__half* ks, const raw_rows& x, int t128) {
    constexpr model::attention_row_layout lay{D, 64};
    static_assert(lay.rope_offset() == 16 * raw_rows::n_code_words && lay.exponent_offset() == 16 * (raw_rows::n_code_words + 8) &&
                      lay.bytes() % 16 == 0 && R == 64,
                  "words 0..27 codes, 28..35 RoPE, 16-byte aligned rows, 32 rows per pass");
    constexpr int n_blocks = raw_rows::n_code_words / 4;
    const int q = t128 & 3;
#pragma unroll
    for (int k = 0; k < raw_rows::n_rows; ++k) {
        const int r = (t128 >> 2) + 32 * k;
        std::uint32_t m2[n_blocks];
        bool fast = true;
#pragma unroll
        for (int i = 0; i < n_blocks; ++i) {
            const int e = static_cast<std::int8_t>(((i < 4 ? x.exps[k].x : x.exps[k].y) >> (8 * (i & 3))) & 0xffu);
            m2[i] = mma_detail::e4m3_block_multiplier(e);
            fast = fast && m2[i] != 0u;
        }
        if (fast) {
#pragma unroll
            for (int i = 0; i < n_blocks; ++i) {  // codes: dims 16u .. 16u + 15 of block i
                const int u = q + 4 * i;
                *reinterpret_cast<uint4*>(ks + cm_offset(r, 16 * u, D)) =
                    mma_detail::decode_e4m3x8_f16_fast(make_uint2(x.w[k][i].x, x.w[k][i].y), m2[i]);
                *reinterpret_cast<uint4*>(ks + cm_offset(r, 16 * u + 8, D)) =
                    mma_detail::decode_e4m3x8_f16_fast(make_uint2(x.w[k][i].z, x.w[k][i].w), m2[i]);
            }
        } else {
            raw_codes rc;
#pragma unroll
            for (int i = 0; i < n_blocks; ++i) rc.w[i] = x.w[k][i];
            rc.exps = x.exps[k];
            store_codes_exact<>(ks, rc, r, q);
        }
#pragma unroll
        for (int i = n_blocks; i < raw_rows::n_words; ++i) {  // RoPE tail: F16 dims D - 64 + 8 (u - 28) .. + 7
            const int u = q + 4 * i;
            *reinterpret_cast<uint4*>(ks + cm_offset(r, D - 64 + 8 * (u - raw_rows::n_code_words), D)) = x.w[k][i];
        }
    }
}

template <class RowAt>
__device__ __forceinline__ void decode_tile(__half* ks, int tile, int t128, RowAt&& row_at) {
    raw_rows x;
    load_raw(x, tile, t128, row_at);
    store_raw(ks, x, t128);
}

// Named barriers (0 is __syncthreads), one of each pair per tile parity so that no barrier sees
// the arrivals of tile i+2 before tile i's completed: "K=V tile ready" (2 -> 0), "P and alpha
// ready" (0 -> 1), "K=V buffer and P free" (0 and 1 -> 2), and "q in place" (all).
inline constexpr int bar_k_ready = 1, bar_p_ready = 3, bar_k_free = 5, bar_start = 7, bar_out = 8;

// Warpgroup 2 runs up to two tiles ahead (both buffers); warpgroups 0 and 1 free tile i's buffers
// after their P.V(i), which is what lets tile i+2 in.
template <class RowAt, class ColOk, class AllOk>
__device__ __forceinline__ void attend_tiles(float4* smem, int n_tiles, RowAt&& row_at, ColOk&& col_ok, AllOk&& all_ok,
                                             state& st) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, c = lane & 3;
    __half* qs = q_smem(smem);
    __half* kbuf = qs + 64 * D;  // two [R][D] tiles
    __half* pbuf = kbuf + 2 * R * D;  // two [64][R] tiles
    float* alpha_s = x_smem(smem);  // [2][64]
#pragma unroll
    for (int j = 0; j < 32; ++j) st.o[j][0] = st.o[j][1] = st.o[j][2] = st.o[j][3] = 0.0f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.0f;
    if (n_tiles <= 0) {
        // Nothing to attend: the converting warpgroup ends here as it would after its last tile,
        // so that publish_l's 256-thread barrier sees warpgroups 0 and 1 only.
        if (wg == 2) asm volatile("exit;\n");
        return;
    }
    // q was written through the generic proxy by every thread; wgmma reads it through the async one.
    fence_proxy_async();
    bar_sync(bar_start, threads);
    const int h0 = 16 * wi + g;
    if (wg == 2) {
        regs_shrink<regs_convert>();
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int b = tile & 1;
            if (tile >= 2) bar_sync(bar_k_free + b, threads);
            decode_tile(kbuf + b * R * D, tile, tid - 256, row_at);
            fence_proxy_async();
            bar_arrive(bar_k_ready + b, 256);
        }
        // Done: ending the thread here keeps the accumulators out of this warpgroup's registers (the
        // code after attend_tiles is warpgroups 0 and 1 only; see publish_l).
        asm volatile("exit;\n");
    } else if (wg == 0) {
        regs_grow<regs_mma>();
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int b = tile & 1;
            const __half* ks = kbuf + b * R * D;
            __half* ps = pbuf + b * 64 * R;
            bar_sync(bar_k_ready + b, 256);
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            fence();
#pragma unroll
            for (int k0 = 0; k0 < D; k0 += 16)
                wgmma_m64n64k16_ss(s, smem_desc(qs + (k0 / 8) * 64, 128, 64 * 128), smem_desc(ks + (k0 / 8) * 64, 128, 64 * 128),
                                   k0 > 0);
            commit();
            wait_all();
            if (!all_ok(tile)) {
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (!col_ok(tile, 8 * j + 2 * c + (e & 1))) s[j][e] = -INFINITY;
            }
            float alpha[2];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                float mx = st.m[rr];
#pragma unroll
                for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * rr], s[j][2 * rr + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float base = mx == -INFINITY ? 0.0f : mx;
                alpha[rr] = mma_detail::ex2_approx(st.m[rr] - base);
                st.m[rr] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    s[j][2 * rr] = mma_detail::ex2_approx(s[j][2 * rr] - base);
                    s[j][2 * rr + 1] = mma_detail::ex2_approx(s[j][2 * rr + 1] - base);
                    sum += s[j][2 * rr] + s[j][2 * rr + 1];
                }
                st.l[rr] = st.l[rr] * alpha[rr] + sum;
            }
            // P as F16: this warpgroup's A fragments, and the core-matrix copy for warpgroup 1.
            std::uint32_t pa[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                pa[kk][0] = mma_detail::pack_half2(s[2 * kk][0], s[2 * kk][1]);
                pa[kk][1] = mma_detail::pack_half2(s[2 * kk][2], s[2 * kk][3]);
                pa[kk][2] = mma_detail::pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[kk][3] = mma_detail::pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                const int col = 16 * kk + 2 * c;
                *reinterpret_cast<std::uint32_t*>(ps + cm_offset(h0, col, R)) = pa[kk][0];
                *reinterpret_cast<std::uint32_t*>(ps + cm_offset(h0 + 8, col, R)) = pa[kk][1];
                *reinterpret_cast<std::uint32_t*>(ps + cm_offset(h0, col + 8, R)) = pa[kk][2];
                *reinterpret_cast<std::uint32_t*>(ps + cm_offset(h0 + 8, col + 8, R)) = pa[kk][3];
            }
            if (c == 0) {
                alpha_s[64 * b + h0] = alpha[0];
                alpha_s[64 * b + h0 + 8] = alpha[1];
            }
            fence_proxy_async();
            bar_arrive(bar_p_ready + b, 256);
            if (alpha[0] != 1.0f || alpha[1] != 1.0f) {
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    st.o[j][0] *= alpha[0];
                    st.o[j][1] *= alpha[0];
                    st.o[j][2] *= alpha[1];
                    st.o[j][3] *= alpha[1];
                }
            }
            fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wgmma_m64n256k16_rs_nb(st.o, pa[kk], smem_desc(ks + (2 * kk) * (D / 8) * 64, (D / 8) * 128, 128));
            commit();
            wait_all();
            if (tile + 2 < n_tiles) bar_arrive(bar_k_free + b, threads);
        }
    } else {
        regs_shrink<regs_pv>();
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int b = tile & 1;
            const __half* ks = kbuf + b * R * D;
            const __half* ps = pbuf + b * 64 * R;
            bar_sync(bar_p_ready + b, 256);
            const float a0 = alpha_s[64 * b + h0], a1 = alpha_s[64 * b + h0 + 8];
            if (a0 != 1.0f || a1 != 1.0f) {
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    st.o[j][0] *= a0;
                    st.o[j][1] *= a0;
                    st.o[j][2] *= a1;
                    st.o[j][3] *= a1;
                }
            }
            fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                wgmma_m64n256k16_ss_nb(st.o, smem_desc(ps + (2 * kk) * 64, 128, (R / 8) * 128),
                                       smem_desc(ks + ((2 * kk) * (D / 8) + 32) * 64, (D / 8) * 128, 128));
            commit();
            wait_all();
            if (tile + 2 < n_tiles) bar_arrive(bar_k_free + b, threads);
        }
    }
#else
    (void)smem, (void)n_tiles, (void)row_at, (void)col_ok, (void)all_ok, (void)st;
#endif
}

// Warpgroup 0's l for rows g and g + 8, quad-summed, published to every thread of the CTA:
// l of head h lands in x_smem()[64 + h]. Call after attend_tiles, by warpgroups 0 and 1 (the
// converting warpgroup has exited).
__device__ __forceinline__ void publish_l(float4* smem, const state& st) {
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2;
    float* xs = x_smem(smem);
    bar_sync(bar_out, 256);  // warpgroup 1 is done reading the last tile's alpha
    if (warp < 4) {
        const float v[2] = {mma_detail::quad_sum(st.l[0]), mma_detail::quad_sum(st.l[1])};
        if ((lane & 3) == 0) {
            xs[64 + 16 * warp + g] = v[0];
            xs[64 + 16 * warp + g + 8] = v[1];
            xs[16 * warp + g] = st.m[0];
            xs[16 * warp + g + 8] = st.m[1];
        }
    }
    bar_sync(bar_out, 256);
}

template <int = 0>
__global__ void probe_kernel(int* out) { *out = device_has_wgmma ? 1 : 0; }

// Whether the current device runs the wgmma loop: an sm_90 device and a build with sm_90a code
// (asked once per thread; a probe kernel reports what was compiled for the device).
inline bool available() {
    static thread_local int avail = -1;
    if (avail < 0) {
        avail = 0;
        int dev = 0, major = 0, optin = 0;
        cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
        cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cc major");
        cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "smem opt-in");
        if (major == 9 && std::size_t(optin) >= smem_bytes) {
            int* d = nullptr;
            cuda_check(cudaMalloc(&d, sizeof(int)), "wgmma probe");
            probe_kernel<><<<1, 1>>>(d);
            int h = 0;
            const cudaError_t e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
            cudaFree(d);
            avail = e == cudaSuccess && h == 1 ? 1 : 0;
            (void)cudaGetLastError();
        }
    }
    return avail == 1;
}

}  // namespace ds4::kernels::wgmma_detail
