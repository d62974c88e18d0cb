#pragma once
// gemm_q8_0.cuh's Q8_0 x Q8_0 GEMM on sm_90a warpgroup MMA: same contract (exact, every output
// equal to reference/matvec's q8_0_row_dot order bit for bit), same launch (gemm_q8_0_launch:
// matrices, their 128-row CTA columns, live rows), same bias trick and scalar chain; only the
// multiply changes. Why: the mma.sync tile kernel runs at 11-13% of the int8 peak (bench/
// RESULTS.md) although its instruction count allows ~35%: a third of its time is fragment and
// stage loads (seventeenth session). wgmma reads both operands from shared memory, so per k-step a
// warp issues one wgmma and the chain.
//
// CTA: 128 weight rows (4 tiles) x 64 activation rows, 4 warpgroups (weight half h = wg % 2 x
// activation half ph = wg / 2), each a wgmma m64n32k32 per 32-wide block with 16 accumulators a
// thread. A stage holds 8 blocks (256 bytes of k) of both operands in wgmma_operand.hpp's layout,
// landed by cp.async straight from the tiled weights (a 16-byte piece of a tile row is one core
// matrix row) and the quantized activations, three stages deep. A block's wgmma starts from zero
// (scale-d 0) and the chain adds 1.5 * 2^23's bits to the int32 isum, reads that back as a float
// and subtracts the bias: float(isum) with no I2F (the mma.sync kernels start the mma from the
// bias instead; a preset accumulator here made ptxas copy registers under the async wgmma and
// serialise it). The chain then runs per output as the
// reference: seg += (f16(w.d) * x.d) * isum, acc += seg at every 16-block segment end, all RN.
// Two accumulator sets: block j + 1's wgmma runs while block j's chain does. Every stage issues
// all 8 wgmma (blocks past nb are zero-filled) so the wgmma never sit on a divergent path; the
// chain stops at nb.
// Only compiled for sm_90a; gemm_q8_0_wgmma_available_on(device) tells the host.
// STATUS: emulated on the CPU (tests/gemm_q8_0_wgmma_emulation_test.cpp); exact on an H100 but
// slower than the mma.sync tile (twenty-ninth session: 755 M warp instructions against the
// chain's 336 M); since then a stage's scales load once and full stages run the chain without a
// per-block test (gemm_q8_0_variant::wgmma_128x64; DS4_GEMM_TILE=wgmma in the CUDA backend).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/gemm_q8_0_launch.hpp"
#include "ds4/kernels/gemm_q8_0_wgmma_tile.hpp"
#include "ds4/kernels/half_at.cuh"
#include "ds4/kernels/wgmma.cuh"
#include "ds4/kernels/wgmma_s8.cuh"
#include "ds4/kernels/wgmma_operand.hpp"

namespace ds4::kernels {

namespace gemm_wg {

struct stage {
    alignas(16) std::uint8_t w[2][wg_operand_bytes];  // weight rows 0-63 and 64-127 (wgmma A)
    alignas(16) std::uint8_t x[wg_operand_bytes];     // activation rows (wgmma B)
    alignas(16) std::uint16_t ws[bw][kb];             // F16 weight scales as stored (a row's 8 are adjacent)
    float xs[kb][bx];                                 // activation scales (a lane's two columns adjacent)
};
// The outputs' totals live in shared memory ([accumulator][thread]: conflict-free), touched once
// per 16-block segment: in registers with the two accumulator sets and the segment sums they
// spilled at 128 registers.
inline constexpr int acc_bytes = 16 * threads * 4;
inline constexpr int smem_bytes = stages * int(sizeof(stage)) + acc_bytes;
static_assert(smem_bytes <= 232448, "gemm_q8_0 wgmma: a CTA's shared memory must fit sm_90's 227 KiB opt-in");

// Issues stage `st` (blocks b0 .. b0 + 7): both weight operands, the activation operand, the
// weight and activation scales. Tiles past the matrix, rows past the live count and blocks past
// nb are zero-filled: their products are zeros that are never kept (the chain stops at nb, dead
// rows and outputs are never stored).
__device__ __forceinline__ void issue_stage(const gemm_q8_0_launch& a, const gemm_q8_0_matrix& m, int tile0, int tiles, int m0,
                                            int n_rows, int b0, stage& st) {
    const int tid = int(threadIdx.x);
#pragma unroll
    for (int i = 0; i < 2 * wg_operand_bytes / 16 / threads; ++i) {
        const w_copy c = w_copy_of(tid + i * threads);
        const int tile = tile0 + 2 * c.h + c.row / 32, b = b0 + c.chunk / 2;
        const bool ok = tile < tiles && b < a.nb;
        const std::uint8_t* src = ok ? m.quants + ((std::size_t(tile) * a.nb8 + b) * 2 + c.chunk % 2) * 512 + (c.row % 32) * 16 : m.quants;
        cp_async::zfill<16>(st.w[c.h] + wg_offset(c.row, c.chunk), src, ok);
    }
#pragma unroll
    for (int i = 0; i < wg_operand_bytes / 16 / threads; ++i) {
        const int c = tid + i * threads, r = wg_copy_row(c), chunk = wg_copy_chunk(c), b = b0 + chunk / 2;
        const bool ok = m0 + r < n_rows && b < a.nb;
        const std::int8_t* src = ok ? m.act_qs + (std::size_t(m0 + r) * m.act_stride + b * 32 + (chunk % 2) * 16) : m.act_qs;
        cp_async::zfill<16>(st.x + wg_offset(r, chunk), src, ok);
    }
    if (tid < bw) {
        // A row's 8 scales of blocks b0 .. b0 + 7 (b0 % 8 == 0) are 16 consecutive bytes.
        const int tile = tile0 + tid / 32;
        const bool ok = tile < tiles;
        const std::uint16_t* src = ok ? m.scales + ((std::size_t(tile) * (a.nb8 / 8) + b0 / 8) * 32 + tid % 32) * 8 : m.scales;
        cp_async::zfill<16>(&st.ws[tid][0], src, ok);
    }
    {
        static_assert(bx * kb == threads, "one activation scale a thread");
        const int r = tid / kb, j = tid % kb;
        const bool ok = m0 + r < n_rows && b0 + j < a.nb;
        const float* src = ok ? m.act_d + (std::size_t(m0 + r) * (m.act_stride / 32) + b0 + j) : m.act_d;
        cp_async::zfill<4>(&st.xs[j][r], src, ok);
    }
}

}  // namespace gemm_wg

template <int = 0>
__global__ void __launch_bounds__(gemm_wg::threads, 1) gemm_q8_0_wgmma_kernel(const __grid_constant__ gemm_q8_0_launch a) {
    pdl_enter();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace gemm_wg;
    namespace wg = wgmma_detail;
    extern __shared__ int4 gemm_wgmma_smem[];
    auto* ring = reinterpret_cast<stage*>(gemm_wgmma_smem);
    const int n_rows = a.live_rows ? *a.live_rows : a.n_rows;
    const int m0 = int(blockIdx.x) * bx;
    if (m0 >= n_rows) return;
    const gemm_q8_0_column col = gemm_q8_0_column_of(a, int(blockIdx.y));
    const gemm_q8_0_matrix& m = a.m[col.k];
    const int tiles = (m.rows + tile_rows - 1) / tile_rows;
    const int tile0 = col.index * (bw / tile_rows);

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4, wv = warp % 4;
    const role rl = role_of(warp / 4);
    // This thread's outputs: weight rows r0 (x % 4 < 2) and r0 + 8 of the CTA's 128, activation
    // rows 32 ph + wg_acc_col(t, x) of its 64.
    const int r0 = 64 * rl.h + wg_acc_row(wv, g, 0);
    float* acc = reinterpret_cast<float*>(ring + stages) + threadIdx.x;  // acc[x * threads]
    float seg[16];
    int d0[16], d1[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i * threads] = seg[i] = 0.0f, d0[i] = d1[i] = 0;

    const int nk = (a.nb + kb - 1) / kb;
#pragma unroll
    for (int s = 0; s < stages - 1; ++s) {
        if (s < nk) issue_stage(a, m, tile0, tiles, m0, n_rows, s * kb, ring[s]);
        cp_async::commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        // Stage kt landed; every warpgroup is done with stage kt - 1, whose slot takes kt + stages - 1.
        cp_async::wait<stages - 2>();
        wg::fence_proxy_async();
        __syncthreads();
        if (kt + stages - 1 < nk) issue_stage(a, m, tile0, tiles, m0, n_rows, (kt + stages - 1) * kb, ring[(kt + stages - 1) % stages]);
        cp_async::commit();
        const stage& st = ring[kt % stages];
        const std::uint64_t da = wg::smem_desc(st.w[rl.h], wg_lbo, wg_sbo);
        const std::uint64_t db = wg::smem_desc(st.x + wg_offset(n * rl.ph, 0), wg_lbo, wg_sbo);
        constexpr std::uint64_t step = wg_kstep_bytes >> 4;
        const int b0 = kt * kb;
        auto start = [&](int (&d)[16], int j) {
            wg::fence();
            wg::mma_m64n32k32<0>(d, da + step * j, db + step * j);
            wg::commit();
        };
        // The stage's weight scales of rows r0 and r0 + 8 (8 halves each, 16 bytes): one load each,
        // converted per block without a branch (f16_operand: a NaN scale gives the same canonical
        // NaN product as f16_to_f32's payload would).
        const int4 ws0 = *reinterpret_cast<const int4*>(&st.ws[r0][0]);
        const int4 ws1 = *reinterpret_cast<const int4*>(&st.ws[r0 + 8][0]);
        // Block b0 + j's chain from its accumulators.
        auto chain = [&](int (&d)[16], int j) {
            const float wd0 = f16_operand(half_at(ws0, j)), wd1 = f16_operand(half_at(ws1, j));
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                // Columns 8c + 2t and 8c + 2t + 1: accumulators 4c .. 4c + 3 (rows r0, r0 + 8).
                const float2 xd = *reinterpret_cast<const float2*>(&st.xs[j][n * rl.ph + wg_acc_col(t, 4 * c)]);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int x = 4 * c + e;
                    const float isum = __int_as_float(d[x] + gemm_q8_0_bias_bits) - gemm_q8_0_bias_value;
                    const float term = mul_rn(mul_rn(e < 2 ? wd0 : wd1, e % 2 ? xd.y : xd.x), isum);
                    seg[x] = add_rn(seg[x], term);
                }
            }
        };
        auto flush = [&] {
#pragma unroll
            for (int x = 0; x < 16; ++x) {
                acc[x * threads] = add_rn(acc[x * threads], seg[x]);
                seg[x] = 0.0f;
            }
        };
        // A full stage (every stage but a short last one) runs the chain with no per-block test:
        // its segment ends are fixed by the stage index. A short stage tests each block (blocks past
        // nb add nothing). The two are separate instantiations of the stage body, so the full one
        // carries no branch.
        auto body = [&](auto full_tag) {
            constexpr bool full = decltype(full_tag)::value;
            auto step_chain = [&](int (&d)[16], int j) {
                const int b = b0 + j;
                if (!full && b >= a.nb) return;
                chain(d, j);
                if constexpr (full && kb >= q8_0_segment_blocks) {
                    if ((j + 1) % q8_0_segment_blocks == 0 || (j + 1 == kb && b + 1 == a.nb)) flush();
                } else if constexpr (full) {
                    if (j + 1 == kb && ((b + 1) % q8_0_segment_blocks == 0 || b + 1 == a.nb)) flush();
                } else if ((b + 1) % q8_0_segment_blocks == 0 || b + 1 == a.nb) {
                    flush();
                }
            };
            // Block j + 1's wgmma runs while block j's chain does.
            start(d0, 0);
#pragma unroll
            for (int j = 0; j < kb; j += 2) {
                start(d1, j + 1);
                wg::wait<1>();
                wg::pin(d0);
                step_chain(d0, j);
                if (j + 2 < kb) {
                    start(d0, j + 2);
                    wg::wait<1>();
                } else {
                    wg::wait<0>();
                }
                wg::pin(d1);
                step_chain(d1, j + 1);
            }
        };
        if (b0 + kb <= a.nb)
            body(std::true_type{});
        else
            body(std::false_type{});
    }
    cp_async::wait<0>();
#pragma unroll
    for (int x = 0; x < 16; ++x) {
        const int o = tile0 * tile_rows + 64 * rl.h + wg_acc_row(wv, g, x), r = m0 + n * rl.ph + wg_acc_col(t, x);
        if (o < m.rows && r < n_rows) m.y[std::size_t(r) * m.y_stride + o] = acc[x * threads];
    }
#else
    (void)a;
#endif
}

// Whether `device` runs gemm_q8_0_wgmma_kernel: sm_90a code in this build and the shared memory
// opt-in its CTA needs. Asked once per device (prepare_gemm_q8_0), never during a capture.
inline bool gemm_q8_0_wgmma_probe(int dev) {
    return wgmma_detail::smem_optin(dev) >= std::size_t(gemm_wg::smem_bytes) && wgmma_detail::runs_wgmma_code(dev);
}
inline per_device_once<bool>& gemm_q8_0_wgmma_availability() {
    static per_device_once<bool> a;
    return a;
}
inline bool gemm_q8_0_wgmma_available_on(int device) { return gemm_q8_0_wgmma_availability().get(device, gemm_q8_0_wgmma_probe); }

}  // namespace ds4::kernels
