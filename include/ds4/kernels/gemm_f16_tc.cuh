#pragma once
// F16 weights x F32 activations for many rows at once on TF32 tensor cores (mma.sync m16n8k8,
// sm_80+): the prefill chunks' F16 projections (compressors, indexer, router, HC mix) with a
// bounded contract, where kernels/gemm_f16.cuh keeps the matvec's order exactly on CUDA cores.
//
// Contract: bounded, deterministic, batch invariant among its own launches and with its decode
// twin kernels/matvec_f16_tc.cuh (1-16 rows, the same arithmetic). An F16 weight is
// exact in TF32; an activation x is split into hi = tf32(x) and lo = tf32(x - hi) (round to
// nearest; x - hi is exact), so x ~ hi + lo to about 2^-22 relative. Per 512-input segment the
// output starts at 0 and takes, for each 8-input step in order, the mma of hi then the mma of lo;
// the segment results are added in order from 0.0f. An output depends only on its own weight row
// and activation row (a tensor-core dot does not mix rows), so the result never depends on how
// many rows share the launch or where a row sits in its tile. It differs from the f16 row dot
// (format/row_dot.hpp) by the split's rounding and the tensor cores' accumulation order:
// |y - y_ref| <= 2^-12 * sum_i |w_i x_i| (ds4-validate's gemm_f16_tc rows measure the error
// against that bound; docs/kernels.md). A non-finite activation makes every output of its row
// that reads it NaN (x - hi is NaN for x = +-inf).
//
// Layout: a CTA covers 64 activation rows x 128 weight rows over 32-input stages, staged by
// cp.async three deep (x rows padded to 36 floats, weight rows to 40 halves: the fragment loads
// are free of bank conflicts); 8 warps of 32 x 32 (2 x 4 mma tiles, 16 mma a step).
// Shapes: in a multiple of 32; x rows 16-byte aligned (x_stride a multiple of 4); weights
// 16-byte aligned; any row counts. Graph contract: no allocation, no host synchronisation; with
// live_rows the grid depends on the capacity only.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/gemm_f16.cuh"

namespace ds4::kernels {

inline constexpr int gemm_f16_tc_xm = 64;    // activation rows per CTA
inline constexpr int gemm_f16_tc_wn = 128;   // weight rows per CTA
inline constexpr int gemm_f16_tc_k = 32;     // inputs per stage
inline constexpr int gemm_f16_tc_threads = 256;

namespace gemm_f16_tc_detail {

inline constexpr int x_pitch = gemm_f16_tc_k + 4;  // floats
inline constexpr int w_pitch = gemm_f16_tc_k + 8;  // halves
inline constexpr int stages = 3;
inline constexpr int x_bytes = gemm_f16_tc_xm * x_pitch * 4;  // 9 KiB
inline constexpr int w_bytes = gemm_f16_tc_wn * w_pitch * 2;  // 10 KiB
inline constexpr int smem_bytes = stages * (x_bytes + w_bytes);
inline constexpr int steps_per_segment = f16_segment / gemm_f16_tc_k;
static_assert(f16_segment % gemm_f16_tc_k == 0);

struct stage {
    alignas(16) float x[gemm_f16_tc_xm * x_pitch];
    alignas(16) std::uint16_t w[gemm_f16_tc_wn * w_pitch];
};

__device__ __forceinline__ std::uint32_t to_tf32(float v) {
    std::uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace gemm_f16_tc_detail

template <int = 0>
__global__ void __launch_bounds__(gemm_f16_tc_threads) gemm_f16_tc_kernel(const __grid_constant__ gemm_f16_launch L) {
    using namespace gemm_f16_tc_detail;
    extern __shared__ int4 gemm_f16_tc_smem[];
    auto* st = reinterpret_cast<stage*>(gemm_f16_tc_smem);
    const gemm_f16_args& a = L.a;
    int k = 0;
    while (k + 1 < a.n_matrices && int(blockIdx.x) >= L.tile_begin[k + 1]) ++k;
    const gemm_f16_matrix& m = a.m[k];
    const int w0 = (int(blockIdx.x) - L.tile_begin[k]) * gemm_f16_tc_wn;
    const int x0 = int(blockIdx.y) * gemm_f16_tc_xm;
    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int n_steps = a.in / gemm_f16_tc_k;

    // This thread's copies a stage: 2 x chunks (row tid / 8 + 32 j, 16-byte column tid % 8) and
    // 2 weight chunks (row tid / 4 + 64 j, column tid % 4).
    auto load_w = [&](int s, int step) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int r = tid / 4 + 64 * j, c = tid % 4;
            const bool ok = w0 + r < m.rows;
            const std::uint16_t* src = m.w + std::size_t(ok ? w0 + r : 0) * a.in + step * gemm_f16_tc_k + 8 * c;
            cp_async::zfill<16>(st[s].w + r * w_pitch + 8 * c, src, ok);
        }
    };
    // Weights are never written by a kernel: the first stages' weight loads go out before the
    // PDL wait.
    for (int s = 0; s < stages - 1 && s < n_steps; ++s) load_w(s, s);
    pdl_enter();
    const int n_live = a.live_rows ? min(*a.live_rows, L.capacity) : a.n_rows;
    if (x0 >= n_live) {
        cp_async::wait<0>();
        return;
    }
    auto load_x = [&](int s, int step) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int r = tid / 8 + 32 * j, c = tid % 8;
            const bool ok = x0 + r < n_live;
            const float* src = a.x + std::size_t(ok ? x0 + r : 0) * a.x_stride + step * gemm_f16_tc_k + 4 * c;
            cp_async::zfill<16>(st[s].x + r * x_pitch + 4 * c, src, ok);
        }
    };
    for (int s = 0; s < stages - 1; ++s) {
        if (s < n_steps) load_x(s, s);
        cp_async::commit();  // group s: stage s's x (group 0 also holds the early weight loads)
    }

    const int wm = warp >> 2, wn = warp & 3;  // warp tile: x rows 32 wm.., weight rows 32 wn..
    const int g = lane >> 2, t = lane & 3;
    float seg[2][4][4] = {}, total[2][4][4] = {};
    for (int step = 0; step < n_steps; ++step) {
        cp_async::wait<stages - 2>();
        __syncthreads();
        // The stage the previous iteration read is free: refill it with step + stages - 1.
        {
            const int next = step + stages - 1;
            if (next < n_steps) {
                load_w(next % stages, next);
                load_x(next % stages, next);
            }
            cp_async::commit();
        }
        const stage& S = st[step % stages];
#pragma unroll
        for (int kk = 0; kk < gemm_f16_tc_k; kk += 8) {
            std::uint32_t hi[2][4], lo[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const float* xr = S.x + (32 * wm + 16 * mi + g) * x_pitch + kk + t;
                const float v[4] = {xr[0], xr[8 * x_pitch], xr[4], xr[8 * x_pitch + 4]};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    hi[mi][e] = to_tf32(v[e]);
                    lo[mi][e] = to_tf32(v[e] - __uint_as_float(hi[mi][e]));
                }
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const std::uint16_t* wr = S.w + (32 * wn + 8 * ni + g) * w_pitch + kk + t;
                const std::uint32_t b0 = __float_as_uint(f16_operand(wr[0]));
                const std::uint32_t b1 = __float_as_uint(f16_operand(wr[4]));
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    mma_tf32(seg[mi][ni], hi[mi], b0, b1);
                    mma_tf32(seg[mi][ni], lo[mi], b0, b1);
                }
            }
        }
        if ((step + 1) % steps_per_segment == 0 || step + 1 == n_steps) {
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        total[mi][ni][e] = __fadd_rn(total[mi][ni][e], seg[mi][ni][e]);
                        seg[mi][ni][e] = 0.0f;
                    }
        }
    }
    cp_async::wait<0>();
    // D element e of tile (mi, ni): x row g (+8 for e >= 2), weight row 2t + (e & 1).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = x0 + 32 * wm + 16 * mi + g + 8 * (e >> 1);
                const int row = w0 + 32 * wn + 8 * ni + 2 * t + (e & 1);
                if (r < n_live && row < m.rows) m.y[std::size_t(r) * m.y_stride + row] = total[mi][ni][e];
            }
}

inline void prepare_gemm_f16_tc(int device) {
    with_device(device, [] {
        raise_smem_limit(gemm_f16_tc_kernel<>, gemm_f16_tc_detail::smem_bytes, "gemm_f16_tc smem");
    });
}

// One launch on `stream` for every matrix of `a` (all read the same x), the bounded contract
// above. `capacity`: the rows the grid covers (n_rows when 0); with live_rows the live count is
// read on the device.
inline void gemm_f16_tc(const gemm_f16_args& a, int capacity, cudaStream_t stream) {
    const gemm_f16_launch L = make_gemm_f16_launch(a, capacity, gemm_f16_tc_wn, gemm_f16_tc_k, "gemm_f16_tc");
    raise_smem_limit(gemm_f16_tc_kernel<>, gemm_f16_tc_detail::smem_bytes, "gemm_f16_tc smem", stream);
    const dim3 grid(unsigned(L.tile_begin[a.n_matrices]), unsigned((L.capacity + gemm_f16_tc_xm - 1) / gemm_f16_tc_xm));
    launch_kernel("gemm_f16_tc_kernel", gemm_f16_tc_kernel<>, grid, gemm_f16_tc_threads, gemm_f16_tc_detail::smem_bytes,
                  stream, L);
    cuda_check_launch("gemm_f16_tc");
}

}  // namespace ds4::kernels
