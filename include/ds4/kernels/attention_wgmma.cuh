#pragma once
// The tile loop of attention_mma.cuh on sm_90a warpgroup MMA (wgmma): same contract, same inputs
// (RowAt / ColOk / AllOk, q pre-scaled into shared memory, rows decoded exactly to F16),
// head_dim 512 only. Why: the mma.sync loop is bound by shared-memory wavefronts
// (every 16-head group re-reads q and the K=V tile through ldmatrix); wgmma reads a 64 x 16
// operand tile from shared memory once per warpgroup and keeps 64 x 256 accumulators in registers.
//
// 512 threads = 4 warpgroups. Warpgroup 0: S = q . K^T (64 heads x 64 rows, 32 wgmma k-steps
// from shared memory), online softmax in registers (a head's 64 columns live in one quad), P as
// F16 both in registers (its own P.V A operand) and in shared memory with alpha, then
// O[:, 0:256] += P . V. Warpgroup 1: O[:, 256:512] += P . V with P from shared memory. Warpgroups
// 2 and 3: load and convert tile i+2 (each a part of every row) while the others run tile i (two
// K=V buffers, two P buffers). The conversion bounds the loop (bench/RESULTS.md, 256K x 16: 958 us
// without it, ~1900 with one converting warpgroup, 1505 with two and conflict-free stores), so it
// gets two warps per scheduler and few registers each (setmaxnreg), and no accumulators.
// Shared memory holds q, K and P in the canonical no-swizzle "core matrix" layout (8 rows x 16
// bytes contiguous): element (r, c) of a [R][C] F16 matrix at ((r/8) * (C/8) + c/8) * 64 +
// (r%8) * 8 + c%8. The K=V tile serves as K-major B for S and as N-major B for P.V unchanged.
// Only compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); available_on(device) tells the host.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/kernels/attention_mma.cuh"
#include "ds4/kernels/attention_q16.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/wgmma.cuh"

namespace ds4::kernels::wgmma_detail {

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

// D += A . B with N = 128: A = 64 x 16 from shared memory (K-major), B = 16 x 128 from shared
// memory (N-major). P.V uses two of these per k-step rather than one N = 256 instruction: half
// the live accumulators per instruction, which a 128-register launch can compile.
__device__ __forceinline__ void wgmma_m64n128k16_ss_nb(float (&d)[16][4], std::uint64_t da, std::uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(da), "l"(db)
        : "memory");
}

// D += A . B with N = 128, A = 64 x 16 from registers (the mma.sync A fragment per warp), B = 16 x 128
// from shared memory (N-major).
__device__ __forceinline__ void wgmma_m64n128k16_rs_nb(float (&d)[16][4], const std::uint32_t (&a)[4], std::uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
}
#endif

inline constexpr int threads = 512;
// Online softmax: the running base moves only when a row's max exceeds it by more than this (exp2
// units), so P = 2^(s - base) <= 2^8 and most tiles skip the 128-register rescale.
inline constexpr float lazy_rescale = 8.0f;
// Registers per thread: 128 at launch (65536 / 512), then the converting warpgroups give some to
// warpgroups 0 (S, softmax, P fragments and half of O) and 1 (half of O). The split is a policy of
// the kernel (its epilogue and row walk change what each warpgroup needs; a spill in any region
// fails the build).
inline constexpr int regs_launch = 128;
template <int Mma, int Pv, int Convert>
struct reg_split {
    static_assert(Mma + Pv + 2 * Convert <= 4 * regs_launch, "the register file is shared, not grown");
    static_assert(Mma % 8 == 0 && Pv % 8 == 0 && Convert % 8 == 0, "setmaxnreg counts are multiples of 8");
    static constexpr int mma = Mma, pv = Pv, convert = Convert;
};
inline constexpr int D = 512, R = mma_detail::mma_rows;
inline constexpr int row_bytes = model::attention_row_layout{D, 64}.bytes();
inline constexpr std::size_t q_bytes = std::size_t(64) * D * 2, k_bytes = std::size_t(R) * D * 2;
inline constexpr std::size_t p_bytes = std::size_t(64) * R * 2, x_bytes = 64 * 4 * 2;  // P; alpha x 2 (then m, l)
// 64 floats of the calling kernel's own (its epilogue's tables); the loop never touches them.
inline constexpr std::size_t user_bytes = 64 * 4;
// q, two K=V tiles and two P tiles (tile i and i+1 in flight), the exchange, the kernel's floats.
inline constexpr std::size_t smem_bytes = q_bytes + 2 * k_bytes + 2 * p_bytes + x_bytes + user_bytes;

struct state {
    // Rows g, g + 8 of warp (w % 4) x dims 256 * (w / 4) + 128h + 8j + 2c (+1) in o[h][j]: two
    // N = 128 accumulator sets.
    float o[2][16][4];
    __device__ __forceinline__ float& at(int j, int e) { return o[j >> 4][j & 15][e]; }  // j = 16h + j
    __device__ __forceinline__ float at(int j, int e) const { return o[j >> 4][j & 15][e]; }
    float m[2], l[2];  // warpgroup 0: running max (exp2 units) and this thread's column sums
    // Rows g and g + 8 scaled by a0 and a1 (the online softmax's correction; skipped when both are 1).
    __device__ __forceinline__ void rescale(float a0, float a1) {
        if (a0 == 1.0f && a1 == 1.0f) return;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            at(j, 0) *= a0;
            at(j, 1) *= a0;
            at(j, 2) *= a1;
            at(j, 3) *= a1;
        }
    }
};

__device__ __forceinline__ __half* q_smem(float4* smem) { return reinterpret_cast<__half*>(smem); }
__device__ __forceinline__ float* x_smem(float4* smem) {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + q_bytes + 2 * k_bytes + 2 * p_bytes);
}
__device__ __forceinline__ float* user_smem(float4* smem) { return x_smem(smem) + x_bytes / 4; }

// q (F32, [64][512] rows of heads, already offset) * scale -> F16 core-matrix layout; rows past
// n_head zero. Warpgroups 0 and 1 only: the converting ones start on the first tiles meanwhile
// (attend_tiles waits for q in warpgroup 0 alone). Loads go out q_batch at a time before any
// store: through a generic pointer a global load may not pass an earlier shared store, and one
// round trip per 8 KiB made q's 128 KiB a prologue of 16 serial round trips per CTA. (Unrolling
// the batches too spilled in the prefill kernel.)
inline constexpr int q_threads = 256, q_batch = 8;

// Element i of q's 64 x 128 float4s: consecutive threads take 8 heads at one d first, so the 8-byte
// stores of a warp fill two 128-byte rows of core matrices (2 wavefronts; with d first, 16), and
// its loads still cover 8 heads x 64 contiguous bytes.
__device__ __forceinline__ void q_element(int i, int& h, int& d) {
    h = 8 * (i / (8 * (D / 4))) + (i & 7);
    d = 4 * ((i >> 3) % (D / 4));
}

__device__ __forceinline__ void load_q(float4* smem, const float* q, int n_head, float scale) {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid >= q_threads) return;
    __half* qs = q_smem(smem);
    constexpr int per_thread = 64 * (D / 4) / q_threads;
    static_assert(per_thread % q_batch == 0);
#pragma unroll 1
    for (int k0 = 0; k0 < per_thread; k0 += q_batch) {
        float4 x[q_batch];
#pragma unroll
        for (int k = 0; k < q_batch; ++k) {
            int h, d;
            q_element(tid + (k0 + k) * q_threads, h, d);
            x[k] = h < n_head ? __ldg(reinterpret_cast<const float4*>(q + std::int64_t(h) * D + d))
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < q_batch; ++k) {
            int h, d;
            q_element(tid + (k0 + k) * q_threads, h, d);
            *reinterpret_cast<uint2*>(qs + core_matrix_offset(h, d, D)) = make_uint2(
                mma_detail::pack_half2(x[k].x * scale, x[k].y * scale), mma_detail::pack_half2(x[k].z * scale, x[k].w * scale));
        }
    }
}

// q already in shared memory's form (attention_q16.hpp: written by the q heads' norm_rope): the
// token's 64 KiB copied as they are, 16 bytes a copy, all of a thread's copies in flight at once.
// Warpgroups 0 and 1 only, as load_q; the caller's proxy fence and barrier follow as there.
__device__ __forceinline__ void load_q16(float4* smem, const __half* q16) {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid >= q_threads) return;
    constexpr int per_thread = int(q_bytes / 16) / q_threads;
    char* dst = reinterpret_cast<char*>(q_smem(smem));
    const char* src = reinterpret_cast<const char*>(q16);
#pragma unroll
    for (int k = 0; k < per_thread; ++k) {
        const int i = tid + k * q_threads;
        cp_async::zfill<16>(dst + 16 * i, src + 16 * i, true);
    }
    cp_async::commit();
    cp_async::wait<0>();
}

// A tile's native rows -> F16 in the core-matrix layout, by the two converting warpgroups: every
// load first (one round trip per tile; a store to shared memory would order later loads after it),
// then convert. Four threads per row share the row's 16-byte words q + 4i (words 0..27: E4M3 codes,
// word q + 4i in block i; 28..35: the RoPE tail), so a warp's load covers 8 rows x 64 contiguous
// bytes and each quarter-warp's F16 store one 128-byte bank row (part_row below); part 0 takes i in {0, 1, 2, 7, 8}
// (3 code words and the tail), part 1 i in {3, 4, 5, 6} (4 code words). Two threads per row with
// 8-byte loads touched 16 rows per warp load (H200, 256K x 16: 2690 us with that mapping, 2401 us
// with this one, both with one converting warpgroup).
inline constexpr int n_code_words = (D - 64) / 16, n_blocks = n_code_words / 4, n_passes = R / 32;

template <int Part>
struct raw_part {
    static constexpr int n = Part == 0 ? 5 : 4;
    __host__ __device__ static constexpr int word(int j) { return Part == 0 ? (j < 3 ? j : j + 4) : j + 3; }  // i of q + 4i
    uint4 w[n];
    uint2 exps;
};

// t128 = 0..127 of the converting warpgroup: warp w takes rows 8w .. 8w + 7 (+ 32 * pass), lane l
// row 8w + l % 8 at word offset q = l / 8. Each quarter-warp (one shared-memory phase of a 16-byte
// store) then writes 8 rows of one core matrix column: one wavefront. With q = l % 4 (the first
// form) a phase held 4 rows x 4 core matrices 256 B apart, the same banks: 4 wavefronts each
// (ncu, H200: 16 wavefronts per STS.128, 44% of all shared wavefronts excessive). The warp's
// global loads cover the same 8 rows x 64 bytes either way.
__device__ __forceinline__ int part_row(int t128, int pass) { return 8 * (t128 >> 5) + (t128 & 7) + 32 * pass; }
__device__ __forceinline__ int part_word(int t128) { return (t128 >> 3) & 3; }

template <int Part>
__device__ __forceinline__ void load_part(raw_part<Part>& x, const std::uint8_t* src, int t128) {
    const model::attention_row_layout lay{D, 64};
    const int q = part_word(t128);
    // A missing row becomes zero codes at exponent 0 and a zero tail: it converts to zeros.
#pragma unroll
    for (int j = 0; j < raw_part<Part>::n; ++j)
        x.w[j] = src != nullptr ? __ldg(reinterpret_cast<const uint4*>(src + 16 * (q + 4 * raw_part<Part>::word(j))))
                                : make_uint4(0u, 0u, 0u, 0u);
    x.exps = src != nullptr ? __ldg(reinterpret_cast<const uint2*>(src + lay.exponent_offset())) : make_uint2(0u, 0u);
}

// One code word (dims 16u .. 16u + 15, block exponent e) with the element-wise path where the block
// needs it (an exponent outside the multiply's range). Out of line: inlined at every word, that
// path made the kernel ~50k lines of PTX and the converting loop slower (2131 -> 1895 us when
// moved out). A template only for linkage: this header may be included by several translation units.
template <int = 0>
__device__ __noinline__ void store_word_exact(__half* ks, uint4 w, int e, int r, int u) {
    const std::uint32_t m2 = mma_detail::e4m3_block_multiplier(e);
    *reinterpret_cast<uint4*>(ks + core_matrix_offset(r, 16 * u, D)) = mma_detail::decode_e4m3x8_f16(make_uint2(w.x, w.y), m2, e);
    *reinterpret_cast<uint4*>(ks + core_matrix_offset(r, 16 * u + 8, D)) = mma_detail::decode_e4m3x8_f16(make_uint2(w.z, w.w), m2, e);
}

// The loaded words -> exact F16. sm_90a widens NaN codes exactly, so a block takes the fast path
// whenever its multiplier exists.
template <int Part>
__device__ __forceinline__ void store_part(__half* ks, const raw_part<Part>& x, int pass, int t128) {
    constexpr model::attention_row_layout lay{D, 64};
    static_assert(lay.rope_offset() == 16 * n_code_words && lay.exponent_offset() == 16 * (n_code_words + 8) &&
                      lay.bytes() % 16 == 0 && R % 32 == 0,
                  "words 0..27 codes, 28..35 RoPE, 16-byte aligned rows, 32 rows per pass");
    const int q = part_word(t128), r = part_row(t128, pass);
#pragma unroll
    for (int j = 0; j < raw_part<Part>::n; ++j) {
        const int i = raw_part<Part>::word(j), u = q + 4 * i;
        const uint4 w = x.w[j];
        if (i < n_blocks) {
            const int e = static_cast<std::int8_t>(((i < 4 ? x.exps.x : x.exps.y) >> (8 * (i & 3))) & 0xffu);
            const std::uint32_t m2 = mma_detail::e4m3_block_multiplier(e);
            if (m2 != 0u) {
                *reinterpret_cast<uint4*>(ks + core_matrix_offset(r, 16 * u, D)) = mma_detail::decode_e4m3x8_f16_fast(make_uint2(w.x, w.y), m2);
                *reinterpret_cast<uint4*>(ks + core_matrix_offset(r, 16 * u + 8, D)) =
                    mma_detail::decode_e4m3x8_f16_fast(make_uint2(w.z, w.w), m2);
            } else {
                store_word_exact<>(ks, w, e, r, u);
            }
        } else {  // RoPE tail: F16 dims D - 64 + 8 (u - 28) .. + 7
            *reinterpret_cast<uint4*>(ks + core_matrix_offset(r, D - 64 + 8 * (u - n_code_words), D)) = w;
        }
    }
}

// Named barriers (0 is __syncthreads), one of each pair per tile parity so that no barrier sees
// the arrivals of tile i+2 before tile i's completed: "K=V tile ready" (2 and 3 -> 0), "P and alpha
// ready" (0 -> 1), "K=V buffer and P free" (0 and 1 -> 2 and 3), and "q in place" (0 and 1 -> 0).
inline constexpr int bar_k_ready = 1, bar_p_ready = 3, bar_k_free = 5, bar_start = 7, bar_out = 8;
inline constexpr int bar_user = 9;  // free for a kernel's epilogue (finish)

// The converting warpgroups run up to two tiles ahead (both buffers); warpgroups 0 and 1 free tile
// i's buffers after their P.V(i), which is what lets tile i+2 in. Pass 1's loads wait for pass 0's
// stores (one pass of words fits the 64 registers). Neither an L2 prefetch of tile i+2's rows at
// the start of tile i (bulk prefetch, one row per thread; H200 256K x 16: 1540 -> 1815 us) nor
// pass 1 staged by cp.async into the last 18.5 KiB of shared memory before the buffer wait (1540
// -> 1571 us) made this loop faster.
template <int Part, class RowAt>
__device__ __forceinline__ void convert_tiles(__half* kbuf, int n_tiles, int t128, RowAt&& row_at) {
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int b = tile & 1;
        // Pass 0's loads go out before the wait for the buffer; pass 1's after pass 0's stores
        // (the other converting warpgroup's work covers that round trip).
        // Both passes' rows are looked up first: a row pointer may take dependent loads (a selected
        // list, a page table), which then overlap the buffer wait and pass 0.
        static_assert(n_passes == 2, "two row pointers");
        const std::uint8_t* src0 = row_at(tile, part_row(t128, 0));
        const std::uint8_t* src1 = row_at(tile, part_row(t128, 1));
        raw_part<Part> x;
        load_part(x, src0, t128);
        if (tile >= 2) bar_sync(bar_k_free + b, threads);
        store_part(kbuf + b * R * D, x, 0, t128);
        asm volatile("" ::: "memory");  // pass 1's loads not hoisted above pass 0: 64 registers
        load_part(x, src1, t128);
        store_part(kbuf + b * R * D, x, 1, t128);
        fence_proxy_async();
        bar_arrive(bar_k_ready + b, 384);
    }
}

// Warpgroup 0's l for rows g and g + 8, quad-summed, published to every thread of the CTA:
// l of head h lands in x_smem()[64 + h], m in x_smem()[h]. Warpgroups 0 and 1, after their last tile.
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

// Every warpgroup ends inside this function: warpgroups 0 and 1 publish m and l and then run
// finish(st) (their output epilogue; st.at(j, e) holds dims 256 * wg + 8j + 2c (+1)); the
// converting ones exit after their last tile. Registers per warpgroup come from setmaxnreg, and the
// accumulators must never be live where a smaller budget applies (before the growth, or in code
// the converting warpgroups also reach), hence no code after this call.
template <class Regs, class RowAt, class ColOk, class AllOk, class Finish>
__device__ __forceinline__ void attend_tiles(float4* smem, int n_tiles, RowAt&& row_at, ColOk&& col_ok, AllOk&& all_ok,
                                             Finish&& finish) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int wg = warp >> 2, wi = warp & 3, g = lane >> 2, c = lane & 3;
    __half* qs = q_smem(smem);
    __half* kbuf = qs + 64 * D;  // two [R][D] tiles
    __half* pbuf = kbuf + 2 * R * D;  // two [64][R] tiles
    float* alpha_s = x_smem(smem);  // [2][64]
    state st;
    const auto init_state = [&st] {
#pragma unroll
        for (int j = 0; j < 32; ++j) st.at(j, 0) = st.at(j, 1) = st.at(j, 2) = st.at(j, 3) = 0.0f;
        st.m[0] = st.m[1] = -INFINITY;
        st.l[0] = st.l[1] = 0.0f;
    };
    const int h0 = 16 * wi + g;
    // After warpgroup 0's or 1's P.V of a tile: wait for it, then free the tile's buffers for tile
    // + 2 if there is one.
    const auto end_tile = [&](int tile, int b) {
        commit();
        wait_all();
        if (tile + 2 < n_tiles) bar_arrive(bar_k_free + b, threads);
    };
    // Warpgroup 0's or 1's end: m and l published, its epilogue, exit.
    const auto end_warpgroup = [&] {
        publish_l(smem, st);
        finish(static_cast<const state&>(st));
        asm volatile("exit;\n");
    };
    // q was written through the generic proxy by warpgroups 0 and 1; wgmma reads it through the
    // async one, in warpgroup 0.
    if (wg < 2) fence_proxy_async();
    if (wg >= 2) {
        regs_shrink<Regs::convert>();
        if (wg == 2) convert_tiles<0>(kbuf, n_tiles, tid - 256, row_at);
        else convert_tiles<1>(kbuf, n_tiles, tid - 384, row_at);
        asm volatile("exit;\n");
    } else if (wg == 0) {
        bar_sync(bar_start, q_threads);
        regs_grow<Regs::mma>();
        init_state();
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int b = tile & 1;
            const __half* ks = kbuf + b * R * D;
            __half* ps = pbuf + b * 64 * R;
            bar_sync(bar_k_ready + b, 384);
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            fence();
            // k-step k0 starts 16 * k0 bytes in: k0 in the descriptor's address field (>> 4).
            const std::uint64_t dq = smem_desc(qs, 128, 64 * 128), dk = smem_desc(ks, 128, 64 * 128);
#pragma unroll
            for (int k0 = 0; k0 < D; k0 += 16) wgmma_m64n64k16_ss(s, dq + k0, dk + k0, k0 > 0);
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
                // The base stays put unless the max grew by more than lazy_rescale (P <= 2^8 in F16
                // then): the accumulators are rescaled only on those jumps, not at every new max.
                const bool keep = mx - st.m[rr] <= lazy_rescale;  // false from -inf (inf or NaN)
                const float base = keep ? st.m[rr] : (mx == -INFINITY ? 0.0f : mx);
                alpha[rr] = keep ? 1.0f : mma_detail::ex2_approx(st.m[rr] - base);
                if (!keep) st.m[rr] = mx;
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
                *reinterpret_cast<std::uint32_t*>(ps + core_matrix_offset(h0, col, R)) = pa[kk][0];
                *reinterpret_cast<std::uint32_t*>(ps + core_matrix_offset(h0 + 8, col, R)) = pa[kk][1];
                *reinterpret_cast<std::uint32_t*>(ps + core_matrix_offset(h0, col + 8, R)) = pa[kk][2];
                *reinterpret_cast<std::uint32_t*>(ps + core_matrix_offset(h0 + 8, col + 8, R)) = pa[kk][3];
            }
            if (c == 0) {
                alpha_s[64 * b + h0] = alpha[0];
                alpha_s[64 * b + h0 + 8] = alpha[1];
            }
            fence_proxy_async();
            bar_arrive(bar_p_ready + b, 256);
            st.rescale(alpha[0], alpha[1]);
            fence();
            // V rows 16kk.. at dims 128h..: (128kk + 16h) core matrices of 128 bytes in.
            const std::uint64_t dv = smem_desc(ks, (D / 8) * 128, 128);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int h = 0; h < 2; ++h) wgmma_m64n128k16_rs_nb(st.o[h], pa[kk], dv + 1024 * kk + 128 * h);
            end_tile(tile, b);
        }
        end_warpgroup();
    } else {
        bar_arrive(bar_start, q_threads);
        regs_grow<Regs::pv>();
        init_state();
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int b = tile & 1;
            const __half* ks = kbuf + b * R * D;
            const __half* ps = pbuf + b * 64 * R;
            bar_sync(bar_p_ready + b, 256);
            st.rescale(alpha_s[64 * b + h0], alpha_s[64 * b + h0 + 8]);
            fence();
            const std::uint64_t dp = smem_desc(ps, 128, (R / 8) * 128), dv = smem_desc(ks, (D / 8) * 128, 128);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
                for (int h = 0; h < 2; ++h) wgmma_m64n128k16_ss_nb(st.o[h], dp + 16 * kk, dv + 1024 * kk + 256 + 128 * h);
            end_tile(tile, b);
        }
        end_warpgroup();
    }
#else
    (void)smem, (void)n_tiles, (void)row_at, (void)col_ok, (void)all_ok, (void)finish;
#endif
}

// Whether `device` runs the wgmma loop: an sm_90 device and a build with sm_90a code (a probe
// kernel reports what was compiled for the device). Asked once per device, for every thread; the
// probe allocates, launches and copies, so it runs in prepare_attention_*(device) or an eager
// launch, never inside a stream capture.
inline bool probe_on(int dev) { return smem_optin(dev) >= smem_bytes && runs_wgmma_code(dev); }

inline per_device_once<bool>& availability() {
    static per_device_once<bool> a;
    return a;
}

inline bool available_on(int device) {
    return availability().get(device, probe_on);
}

// From a launch on `stream`: `kernel` names it in the error a capture on an unprepared device gets.
inline bool available(cudaStream_t stream, const char* kernel) {
    const int dev = current_device();
    require_prepared(availability().ready(dev), stream, kernel, "prepare_attention_decode / prepare_attention_prefill");
    return available_on(dev);
}

}  // namespace ds4::kernels::wgmma_detail
