#pragma once
// Device pieces shared by the tensor-core attention kernels (attention_prefill.cuh,
// attention_decode_mma.cuh): the m16n8k16 f16 mma wrapper (ldmatrix.cuh has ldmatrix), cp.async
// staging, and the fast exact decode of a native attention row segment into F16.
//
// Row decode contract: exact. decode_row8_f16 gives, for 8 consecutive dims of a stored row,
// the F16 bits of model::decode_attention_row's value (f16_round(e4m3_decode(code) * 2^e) for
// the nope dims, the stored F16 for the RoPE tail; NaN codes give an F16 NaN). Fast path: an
// E4M3 code widened exactly to F16 (sm_89+: the hardware cvt; sm_80: the code's low 7 bits
// shifted left by 7 are the F16 bits of e4m3 * 2^-8, exponent fields differing by the biases
// 15 - 7, subnormal codes landing on F16 subnormals with the same mantissa), then one F16
// multiply by a power of two: e4m3 * 2^e rounded once to F16, the reference's value, F16
// subnormals included. Valid while the multiplier is an F16 value; otherwise (and for NaN codes
// on sm_80) the element-wise reference path runs (finite KV blocks have e in -22..120, so only
// blocks with amax above ~28000 take it). ds4-validate (attention_row_decode) checks every code
// at every exponent against decode_attention_row on the device.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/core/smem_limit.hpp"

#include "ds4/core/half.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/kernels/ldmatrix.cuh"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels::mma_detail {

__device__ __forceinline__ void mma_16816(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                          std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
}

// 16-byte global -> shared copy that does not wait (cp.async.cg: L2 only, the rows are streamed).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const auto s = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// F16 bits of 2^k for k in [-24, 15] (F16 subnormals below -14).
__device__ __forceinline__ std::uint32_t f16_pow2_bits(int k) {
    return k >= -14 ? static_cast<std::uint32_t>(k + 15) << 10 : 1u << (k + 24);
}

// Two E4M3 codes in bytes 0 and 2 of `v` (bytes 1 and 3 zero) as the F16 bits of e4m3 * 2^-8:
// shifted left by 7, the magnitude lands on bits 7..13 and the sign on bit 14; adding bit 14 to
// itself moves the sign to bit 15.
__device__ __forceinline__ std::uint32_t e4m3_pair_as_f16_bits(std::uint32_t v) {
    const std::uint32_t x = v << 7;
    return x + (x & 0x40004000u);
}

// The fast path per architecture. sm_89+: cvt.rn.f16x2.e4m3x2 widens two codes exactly (NaN codes
// to F16 NaN), then one F16 multiply by 2^e, valid for e in [-24, 15]. sm_80: the bit identity
// above and a multiply by 2^(e+8), valid for e in [-32, 7], NaN codes sent to the element-wise path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
inline constexpr bool e4m3_native_cvt = true;
#else
inline constexpr bool e4m3_native_cvt = false;
#endif

// Multiplier of a block with exponent e for the fast path, as F16x2 bits; 0 when the block must
// take the element-wise path.
__device__ __forceinline__ std::uint32_t e4m3_block_multiplier(int e) {
    const int k = e4m3_native_cvt ? e : e + 8;
    if (k < -24 || k > 15) return 0u;
    const std::uint32_t b = f16_pow2_bits(k);
    return b | (b << 16);
}

// Two codes (the low 16 bits of `pair`) as F16x2 bits of e4m3 (sm_89+) or e4m3 * 2^-8 (sm_80).
__device__ __forceinline__ std::uint32_t e4m3x2_widen(std::uint32_t word, int which) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    std::uint32_t r;
    const unsigned short pair = static_cast<unsigned short>(which ? word >> 16 : word & 0xffffu);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(pair));
    return r;
#else
    return e4m3_pair_as_f16_bits(__byte_perm(word, 0u, which ? 0x4342 : 0x4140));
#endif
}

// The fast path alone: exact when m2 != 0 and, on sm_80, no code is a NaN.
__device__ __forceinline__ uint4 decode_e4m3x8_f16_fast(uint2 codes, std::uint32_t m2) {
    const std::uint32_t src[4] = {e4m3x2_widen(codes.x, 0), e4m3x2_widen(codes.x, 1), e4m3x2_widen(codes.y, 0),
                                  e4m3x2_widen(codes.y, 1)};
    std::uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&src[i]), *reinterpret_cast<const __half2*>(&m2));
        w[i] = *reinterpret_cast<const std::uint32_t*>(&v);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// 8 codes -> the exact F16 of code * 2^e for each (see the header); m2 from e4m3_block_multiplier.
__device__ __forceinline__ uint4 decode_e4m3x8_f16(uint2 codes, std::uint32_t m2, int e) {
    // sm_80 only: a NaN code (low 7 bits all set) would widen to a finite value.
    const bool nan = !e4m3_native_cvt &&
                     ((((codes.x & 0x7f7f7f7fu) + 0x01010101u) | ((codes.y & 0x7f7f7f7fu) + 0x01010101u)) & 0x80808080u) != 0;
    if (m2 != 0u && !nan) return decode_e4m3x8_f16_fast(codes, m2);
    const float sc = exp2i(e);
    std::uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const std::uint32_t word = i < 4 ? codes.x : codes.y;
        h[i] = f32_to_f16(mul_rn(e4m3_decode(static_cast<std::uint8_t>(word >> (8 * (i & 3)))), sc));
    }
    return make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
}

// The exact F16 of 8 stored values at dims d .. d+7 of a native row (see the header).
__device__ __forceinline__ uint4 decode_row8_f16(const std::uint8_t* row, const model::attention_row_layout& lay,
                                                 int d) {
    const int nope = lay.n_nope();
    if (d >= nope) return *reinterpret_cast<const uint4*>(row + lay.rope_offset() + 2 * (d - nope));
    const int e = static_cast<std::int8_t>(row[lay.exponent_offset() + d / e4m3_block_size]);
    return decode_e4m3x8_f16(*reinterpret_cast<const uint2*>(row + d), e4m3_block_multiplier(e), e);
}

// A tile of R native rows -> F16 rows of stride S halves in shared memory, rows >= n_valid (or
// whose pointer is null) zero. Thread mapping: T = Threads / R threads per row (4 or 8), thread q
// of a row taking the 8-dim groups q, q + T, ..., so it reads one row's block exponents once.
// RowPtr: int r -> const uint8_t*.
template <int D, int R, int S, int Threads, class RowPtr>
__device__ __forceinline__ void decode_tile_f16(__half* ks, int n_valid, int tid, RowPtr&& row_ptr) {
    constexpr int T = Threads / R, nope = D - 64, per_thread = D / 8 / T;
    static_assert((T == 4 || T == 8) && Threads == T * R, "4 or 8 threads per row, one pass");
    static_assert(nope % (8 * T) == 0, "RoPE groups start at a whole step");
    const model::attention_row_layout lay{D, 64};
    const int r = tid / T, q = tid % T;
    uint4* dst = reinterpret_cast<uint4*>(ks + r * S);
    const std::uint8_t* row = r < n_valid ? row_ptr(r) : nullptr;
    if (row == nullptr) {
#pragma unroll
        for (int i = 0; i < per_thread; ++i) dst[q + T * i] = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    // Group g = q + T*i covers dims 8g .. 8g+7: block 8g/64 = (T*i)/8 (q < T <= 8), and g is a RoPE
    // group exactly when i >= nope/(8T): both compile-time per i.
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
        const int g = q + T * i, d = 8 * g;
        if (i >= nope / (8 * T)) {
            dst[g] = *reinterpret_cast<const uint4*>(row + lay.rope_offset() + 2 * (d - nope));
        } else {
            const int e = static_cast<std::int8_t>(row[lay.exponent_offset() + (T * i) / 8]);
            dst[g] = decode_e4m3x8_f16(*reinterpret_cast<const uint2*>(row + d), e4m3_block_multiplier(e), e);
        }
    }
}

// Sum over the 4 lanes of a quad (the lanes holding one mma accumulator row), the same bits in each.
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// 2^x on the MUFU unit (inputs are <= 0 or -inf here; subnormal results flush to 0).
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- The tile loop both tensor-core attention kernels run ----
//
// 512 threads, 16 warps; the 4 warps of group p own heads 16p .. 16p+15 (the mma M dimension).
// Scores: warp `part` of the group computes S for its 16 of the tile's 64 rows over all D dims;
// the group exchanges its row maxima (so all four hold the same running max), writes
// p = exp2(s - m) as F16 into a shared P tile, and each warp then multiplies the whole P (16 x 64)
// by V for its quarter of the output dims. All warps keep equal m and their own column sums l
// (summed across the group at the end, in part order). Group hand-offs use named barriers (128
// threads), tile hand-offs the CTA barrier. Four warps per scheduler hide the mma, ldmatrix and
// MUFU latencies that two could not (measured: 27% tensor-pipe use with 8 warps). Tiles of 64 KV
// rows are staged raw by cp.async (the next tile's bytes in flight during this tile's mma) when
// Staged, and decoded once per CTA to F16. q must be pre-scaled by log2(e)/sqrt(D) when written
// to shared memory (scores in exp2 units).
inline constexpr int mma_threads = 512;
inline constexpr int mma_rows = model::kv_page_rows;  // KV rows per tile
inline constexpr int mma_parts = 4;                   // warps per head group

template <int D>
struct mma_geometry {
    static_assert(D == 128 || D == 512, "tensor-core attention: head_dim 128 or 512");
    static constexpr int R = mma_rows;
    static constexpr int QD = D / mma_parts;   // output dims per warp
    static constexpr int S = D + 8;            // halves per smem row: 4-bank skew, conflict-free ldmatrix
    static constexpr int PS = R + 8;           // halves per P row
    static constexpr int n_tiles_o = QD / 8;   // n8 output tiles per warp
    static constexpr int row_bytes = model::attention_row_layout{D, 64}.bytes();
    static constexpr std::size_t q_bytes = std::size_t(64) * S * 2;
    static constexpr std::size_t k_bytes = std::size_t(R) * S * 2;
    static constexpr std::size_t p_bytes = std::size_t(4) * 16 * PS * 2;  // one P tile per group
    static constexpr std::size_t x_bytes = std::size_t(16) * 16 * 4;      // row maxima / sums per warp
    static constexpr std::size_t stage_bytes = std::size_t(R) * row_bytes;
    static constexpr std::size_t smem(bool staged) {
        return q_bytes + k_bytes + p_bytes + x_bytes + (staged ? stage_bytes : 0);
    }
};

template <int D>
struct mma_state {
    float o[mma_geometry<D>::n_tiles_o][4];
    float m[2], l[2];  // rows g and g + 8 of the group's 16 heads; l is this thread's columns only

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int j = 0; j < mma_geometry<D>::n_tiles_o; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

// Shared memory: [64][S] q halves (filled by the caller), then K, P, the group exchange, the stage.
template <int D>
__device__ __forceinline__ __half* mma_q_smem(float4* smem) {
    return reinterpret_cast<__half*>(smem);
}
template <int D>
__device__ __forceinline__ float* mma_x_smem(float4* smem) {
    using G = mma_geometry<D>;
    return reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + G::q_bytes + G::k_bytes + G::p_bytes);
}

// Barrier of the 4 warps of head group p (ids 1..4; 0 is __syncthreads).
__device__ __forceinline__ void group_barrier(int p) {
    asm volatile("bar.sync %0, 128;" ::"r"(p + 1) : "memory");
}

// The group's l for rows g and g + 8, summed over the quad and then over the 4 warps in part
// order (the same bits in every warp).
template <int D>
__device__ __forceinline__ void mma_group_l(float4* smem, const mma_state<D>& st, float (&l)[2]) {
    const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2;
    const int hg = warp / mma_parts;
    float* xs = mma_x_smem<D>(smem);
    const float v[2] = {quad_sum(st.l[0]), quad_sum(st.l[1])};
    group_barrier(hg);  // every warp of the group is done reading the tile loop's maxima
    if ((lane & 3) == 0) {
        xs[warp * 16 + g] = v[0];
        xs[warp * 16 + g + 8] = v[1];
    }
    group_barrier(hg);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < mma_parts; ++w) t += xs[(hg * mma_parts + w) * 16 + g + 8 * rr];
        l[rr] = t;
    }
}

// RowAt(tile, r) -> the native row r of `tile`, or nullptr for a row no query of this CTA sees;
// ColOk(tile, col) -> whether column col (row) of `tile` is visible to this CTA's query row;
// AllOk(tile) -> whether every column is (skips the per-column test).
template <int D, bool Staged, class RowAt, class ColOk, class AllOk>
__device__ __forceinline__ void attend_tiles(float4* smem, int n_tiles, int n_head, RowAt&& row_at, ColOk&& col_ok,
                                             AllOk&& all_ok, mma_state<D>& st) {
    using G = mma_geometry<D>;
    constexpr int R = G::R, S = G::S, PS = G::PS, RB = G::row_bytes, CH = RB / 16, NC = R / mma_parts;
    const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3, hg = warp / mma_parts, part = warp % mma_parts;
    const int lr = lane & 7, lm = lane >> 3;
    const bool active = hg * 16 < n_head;
    const __half* qs = mma_q_smem<D>(smem);
    __half* ks = const_cast<__half*>(qs) + 64 * S;
    __half* ps = ks + R * S + hg * 16 * PS;  // this group's P tile [16][PS]
    float* xs = mma_x_smem<D>(smem);         // [16 warps][16] row maxima
    std::uint8_t* stage = reinterpret_cast<std::uint8_t*>(xs + 16 * 16);

    auto issue_tile = [&](int tile) {
        for (int i = tid; i < R * CH; i += mma_threads) {
            const int r = i / CH, off = 16 * (i % CH);
            const std::uint8_t* row = row_at(tile, r);
            if (row != nullptr) cp_async16(stage + r * RB + off, row + off);
        }
        cp_async_commit();
    };
    if constexpr (Staged) {
        if (n_tiles > 0) issue_tile(0);
    }

    for (int tile = 0; tile < n_tiles; ++tile) {
        if constexpr (Staged) cp_async_wait_all();
        __syncthreads();  // staged bytes landed; the previous tile's K and P consumed
        decode_tile_f16<D, R, S, mma_threads>(ks, R, tid, [&](int r) -> const std::uint8_t* {
            const std::uint8_t* row = row_at(tile, r);
            if constexpr (Staged) return row != nullptr ? stage + r * RB : nullptr;
            else return row;
        });
        __syncthreads();
        if constexpr (Staged) {
            if (tile + 1 < n_tiles) issue_tile(tile + 1);
        }
        if (!active) continue;

        // S for rows g, g+8 (heads) x this warp's 16 columns: A = q by ldmatrix.x4, B = K rows by
        // ldmatrix.x4 (two n8 tiles per load).
        float sc[2][4];
#pragma unroll
        for (int jn = 0; jn < 2; ++jn) sc[jn][0] = sc[jn][1] = sc[jn][2] = sc[jn][3] = 0.0f;
        {
            const __half* qa = qs + (hg * 16 + (lm & 1) * 8 + lr) * S + (lm >> 1) * 8;
            const __half* kb = ks + (part * NC + (lm >> 1) * 8 + lr) * S + (lm & 1) * 8;
#pragma unroll 8
            for (int k0 = 0; k0 < D; k0 += 16) {
                std::uint32_t a[4], b[4];
                ldmatrix_x4(a, qa + k0);
                ldmatrix_x4(b, kb + k0);
                mma_16816(sc[0], a[0], a[1], a[2], a[3], b[0], b[1]);
                mma_16816(sc[1], a[0], a[1], a[2], a[3], b[2], b[3]);
            }
        }
        if (!all_ok(tile)) {
#pragma unroll
            for (int jn = 0; jn < 2; ++jn)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (!col_ok(tile, part * NC + 8 * jn + 2 * c + (e & 1))) sc[jn][e] = -INFINITY;
        }
        // Row maxima over the tile: own 16 columns, then the group's through shared memory.
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float v = fmaxf(fmaxf(sc[0][2 * rr], sc[0][2 * rr + 1]), fmaxf(sc[1][2 * rr], sc[1][2 * rr + 1]));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
            v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
            if (c == 0) xs[warp * 16 + g + 8 * rr] = v;
        }
        group_barrier(hg);
        float alpha[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float mx = st.m[rr];
#pragma unroll
            for (int w = 0; w < mma_parts; ++w) mx = fmaxf(mx, xs[(hg * mma_parts + w) * 16 + g + 8 * rr]);
            const float b = mx == -INFINITY ? 0.0f : mx;  // nothing visible yet: p = 0, no NaN
            alpha[rr] = ex2_approx(st.m[rr] - b);
            st.m[rr] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int jn = 0; jn < 2; ++jn) {
                sc[jn][2 * rr] = ex2_approx(sc[jn][2 * rr] - b);
                sc[jn][2 * rr + 1] = ex2_approx(sc[jn][2 * rr + 1] - b);
                sum += sc[jn][2 * rr] + sc[jn][2 * rr + 1];
            }
            st.l[rr] = st.l[rr] * alpha[rr] + sum;
        }
        // P (F16) into the group's tile: rows g and g + 8, this warp's columns.
#pragma unroll
        for (int jn = 0; jn < 2; ++jn) {
            const int col = part * NC + 8 * jn + 2 * c;
            *reinterpret_cast<std::uint32_t*>(ps + g * PS + col) = pack_half2(sc[jn][0], sc[jn][1]);
            *reinterpret_cast<std::uint32_t*>(ps + (g + 8) * PS + col) = pack_half2(sc[jn][2], sc[jn][3]);
        }
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // the running max moved
#pragma unroll
            for (int jn = 0; jn < G::n_tiles_o; ++jn) {
                st.o[jn][0] *= alpha[0];
                st.o[jn][1] *= alpha[0];
                st.o[jn][2] *= alpha[1];
                st.o[jn][3] *= alpha[1];
            }
        }
        group_barrier(hg);
        // O += P . V over this warp's output dims: A = P by ldmatrix.x4, V[row][d] by ldmatrix.trans.
#pragma unroll
        for (int kk = 0; kk < R / 16; ++kk) {
            std::uint32_t p[4];
            ldmatrix_x4(p, ps + ((lm & 1) * 8 + lr) * PS + 16 * kk + (lm >> 1) * 8);
            const __half* vb = ks + (16 * kk + (lm & 1) * 8 + lr) * S + part * G::QD + (lm >> 1) * 8;
#pragma unroll
            for (int jn = 0; jn < G::n_tiles_o; jn += 2) {
                std::uint32_t b[4];
                ldmatrix_x4_trans(b, vb + 8 * jn);
                mma_16816(st.o[jn], p[0], p[1], p[2], p[3], b[0], b[1]);
                mma_16816(st.o[jn + 1], p[0], p[1], p[2], p[3], b[2], b[3]);
            }
        }
    }
}

// Whether `device` grants the staged variant's shared memory: an attribute, asked once per
// device and remembered for every thread.
template <int D>
bool mma_staged_fits_on(int device) {
    static per_device_once<bool> fits;
    return fits.get(device, [](int dev) {
        int optin = 0;
        cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "smem opt-in");
        return std::size_t(optin) >= mma_geometry<D>::smem(true);
    });
}

template <int D>
bool mma_staged_fits() {
    return mma_staged_fits_on<D>(current_device());
}

// A prepare's opt-in for the variant launches pick on `device` (staged when it fits); a device
// that cannot hold even the unstaged one is left to the launch to report.
template <int D, class Kernel>
void raise_mma_smem(int device, Kernel* staged, Kernel* unstaged, const char* what) {
    if (mma_geometry<D>::smem(false) > smem_optin_limit()) return;
    if (mma_staged_fits_on<D>(device)) raise_smem_limit(staged, mma_geometry<D>::smem(true), what);
    else raise_smem_limit(unstaged, mma_geometry<D>::smem(false), what);
}

}  // namespace ds4::kernels::mma_detail
