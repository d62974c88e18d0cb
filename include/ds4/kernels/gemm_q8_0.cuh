#pragma once
// Q8_0 x Q8_0 GEMM on int8 tensor cores for the dense projections of prefill (q_a, kv, q_b, the
// 8 grouped out_a, out_b, shared expert gate/up/down, the output head): y[r][o] = W[o] . x[r]
// for M = 1..capacity activation rows, over up to 8 matrices that read one input per launch.
//
// Contract: exact. Every output equals reference/matvec (format/row_dot.hpp order) bit for bit.
//   Each 32-wide block dot is one mma.sync m16n8k32 s8 step, so isum (|isum| <= 2^19) is exact
//   and so is float(isum): the 64 x 128 kernel converts it (I2FP); the 128 x 128 tile starts the
//   mma from a fixed bias, 1.5 * 2^23's bits + isum, read as a float less 1.5 * 2^23 (the I2FP
//   form spills there on sm_80). The thread that holds an accumulator then
//   applies the reference's scalar chain for its (row, output) in block order:
//   seg += (f16(w.d) * x.d) * isum, and acc += seg at every 16-block segment end, all RN.
//   Activations are Q8_0 act blocks (F32 scale, half-even): quantized by quantize_act.cuh into
//   the workspace (an exact launch before the GEMM), or read pre-quantized from the producer
//   (the out_a groups read slices of one quantized attention output).
// Graph contract: no allocation, no host synchronisation; the grid is a function of the plan's
//   capacity and shapes only when the live row count comes from device memory (live_rows);
//   prepare(device) raises the shared-memory limit before capture.
// Shapes: in % 32 == 0; weights in the tiled layout matvec.cuh reads (format/tiled.hpp), so the
//   backend keeps one copy; any row count per matrix; activation strides % 32 == 0.
//
// Validation history (bench/RESULTS.md): tile_128x128 first validated wrong on the H200
//   (5776165): its tile loader read gemm_detail's `ws_bytes` (the 64 x 128 kernel's) instead of
//   gemm_tile's, copying the activation scales 1 KB early; the stage carve is now gemm_tile::w_at
//   / x_at / ws_at / xs_at, shared by loaders, kernel and tests/gemm_q8_0_emulation_test.cpp. Since
//   the seventh session it is exact on every ds4-validate gemm/moe_gemm row.
// Kernels: gemm_q8_0_kernel (tile_64x128, the default: pick_gemm_q8_0_variant): 64 x 128 per
//   CTA, 3 stages. gemm_q8_0_tile_kernel (gemm_q8_0_variant::tile_128x128): 128 weight rows
//   x 128 activation rows per CTA, a 4-stage cp.async ring of 4 blocks per stage, 8 warps of 64 x
//   32, conflict-free ldmatrix fragment loads (gemm_q8_0_tile.hpp, emulated on the CPU by
//   tests/gemm_q8_0_emulation_test.cpp); faster than the 64 x 128 kernel once its grid filled two
//   waves in the seventh session (H200), slower at every shape since (H100, forty-third session).
// Cost (why it is not at the int8 peak): the exact chain costs 4 FP32 instructions per output
// and block (the conversion, two products, the sum) against 64 int8 ops of mma. At 128
// FP32 lanes per SM-clock against the measured mma.sync peak (1291 TOP/s = ~4900 int8 ops per
// SM-clock at 1.98 GHz) that caps any exact kernel near 128 / 4 * 64 / 4900 = ~40% of the peak,
// whatever the tiling; the tile kernel spends ~15% of its issue slots on loads and mma, so ~35%
// is its ceiling. 60% would need the chain below 2.7 FP32 instructions per output and block: no
// exact rewrite found (the bias subtraction cannot fold into the product, p * 1.5 * 2^23 is not
// exact; no FMA: rn(p * isum) is rounded before the sum).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/gemm_q8_0_launch.hpp"
#include "ds4/kernels/gemm_q8_0_tile.hpp"
#include "ds4/kernels/gemm_q8_0_wgmma.cuh"
#include "ds4/kernels/ldmatrix.cuh"
#include "ds4/kernels/quantize_act.cuh"

namespace ds4::kernels {

// Three kernels that compute the same bits: the first 64 x 128 kernel, the pipelined 128 x 128
// tile (pick_gemm_q8_0_variant chooses between these two by grid size; gemm_bench and ds4-validate
// cover both), and sm_90a's warpgroup-MMA kernel (gemm_q8_0_wgmma.cuh: 128 weight x 64
// activation rows, asked for by name where gemm_q8_0_wgmma_available_on holds).
enum class gemm_q8_0_variant { tile_128x128, tile_64x128, wgmma_128x64 };
inline constexpr int gemm_q8_0_bm = 64;          // activation rows per CTA
inline constexpr int gemm_q8_0_tiles = 4;        // 32-row weight tiles per CTA (128 outputs)
inline constexpr int gemm_q8_0_bn = gemm_q8_0_tiles * tile_rows;
inline constexpr int gemm_q8_0_kb = 4;           // Q8_0 blocks per pipeline stage
inline constexpr int gemm_q8_0_stages = 3;
inline constexpr int gemm_q8_0_threads = 256;    // 8 warps: 4 weight tiles x 2 halves of the rows
static_assert(q8_0_segment_blocks % gemm_q8_0_kb == 0, "a stage never straddles a segment end");
namespace gemm_detail {

// Shared memory of one stage. Weights: the tiled bytes as stored, [tile][block][half][row][16],
// so A fragment registers are 32 consecutive words (no bank conflicts). Activations: [row][128
// bytes] with the 16-byte chunk index xor-ed by row % 8, so the 8 rows of a B fragment load hit
// 8 different chunks.
inline constexpr int w_bytes = gemm_q8_0_tiles * gemm_q8_0_kb * 1024;
inline constexpr int a_row_bytes = gemm_q8_0_kb * 32;
inline constexpr int a_bytes = gemm_q8_0_bm * a_row_bytes;
inline constexpr int ws_bytes = gemm_q8_0_bn * gemm_q8_0_kb * 2;
inline constexpr int as_bytes = gemm_q8_0_bm * gemm_q8_0_kb * 4;
inline constexpr int stage_bytes = w_bytes + a_bytes + ws_bytes + as_bytes;
inline constexpr int smem_bytes = stage_bytes * gemm_q8_0_stages;

using cp_async::smem_u32;

// D = C + A.B for one 32-wide block, C = c in all four elements: the bias's bits (the 128 x 128
// tile: float(isum) is then one FADD) or 0 (the 64 x 128 kernel: C is RZ, so no register quad is
// rebuilt per mma, and float(isum) is one I2FP; 2-4% faster there on the H100, and the same
// change spills 52 bytes of the 128 x 128 tile on sm_80).
__device__ __forceinline__ void mma_block(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// Stage loads: blocks [b0, b0 + kb) of the CTA's 4 weight tiles and 64 activation rows. Blocks
// past nb, tiles past the matrix and rows past the live count are zero-filled (a zero block adds
// nothing that is kept: the epilogue stops at nb, and dead rows/outputs are never stored).
__device__ __forceinline__ void load_stage(const gemm_q8_0_launch& a, const gemm_q8_0_matrix& m, int tile0, int tiles,
                                           int m0, int n_rows, int b0, std::uint8_t* st) {
    const int tid = int(threadIdx.x);
    std::uint8_t* sw = st;
    std::uint8_t* sa = st + w_bytes;
    auto* sws = reinterpret_cast<std::uint16_t*>(st + w_bytes + a_bytes);
    auto* sas = reinterpret_cast<float*>(st + w_bytes + a_bytes + ws_bytes);
#pragma unroll
    for (int i = 0; i < w_bytes / 16 / gemm_q8_0_threads; ++i) {
        const int c = tid + i * gemm_q8_0_threads;
        const int t = c / (gemm_q8_0_kb * 64), j = (c / 64) % gemm_q8_0_kb, within = c % 64;
        const int b = b0 + j;
        const bool ok = tile0 + t < tiles && b < a.nb;
        const std::uint8_t* src = ok ? m.quants + ((std::size_t(tile0 + t) * a.nb8 + b) * 1024 + within * 16) : m.quants;
        cp_async::zfill<16>(sw + c * 16, src, ok);
    }
#pragma unroll
    for (int i = 0; i < a_bytes / 16 / gemm_q8_0_threads; ++i) {
        const int c = tid + i * gemm_q8_0_threads;
        const int row = c / 8, ch = c % 8, b = b0 + ch / 2;
        const bool ok = m0 + row < n_rows && b < a.nb;
        const std::int8_t* src = ok ? m.act_qs + (std::size_t(m0 + row) * m.act_stride + b * 32 + (ch % 2) * 16) : m.act_qs;
        cp_async::zfill<16>(sa + row * a_row_bytes + ((ch ^ (row & 7)) * 16), src, ok);
    }
    if (tid < gemm_q8_0_bn) {
        // Four F16 scales of (tile, lane) are 8 consecutive bytes: b0 % 8 is 0 or 4.
        const int t = tid / 32, l = tid % 32;
        const bool ok = tile0 + t < tiles;
        const std::uint16_t* src =
            ok ? m.scales + ((std::size_t(tile0 + t) * (a.nb8 / 8) + b0 / 8) * 32 + l) * 8 + b0 % 8 : m.scales;
        cp_async::zfill<8>(sws + tid * gemm_q8_0_kb, src, ok);
    }
    {
        const int row = tid / gemm_q8_0_kb, j = tid % gemm_q8_0_kb;
        const bool ok = m0 + row < n_rows && b0 + j < a.nb;
        const float* src = ok ? m.act_d + (std::size_t(m0 + row) * (m.act_stride / 32) + b0 + j) : m.act_d;
        cp_async::zfill<4>(sas + tid, src, ok);
    }
}

}  // namespace gemm_detail

// Warp w: weight tile w % 4 (two m16 tiles of outputs) x activation rows 32 * (w / 4) .. +32
// (four n8 tiles). A lane holds 2 x 2 x 4 x 2 = 32 outputs: the weight row 16 mi + g + 8 h and
// the activation row 8 ni + 2 t + e (g = lane / 4, t = lane % 4), each with its running segment
// sum and row total.
// One CTA per SM by registers (~160: 64 float sums, the fragments, the stage addresses); two
// would cap them at 128, where ptxas spills.
template <int = 0>
__global__ void __launch_bounds__(gemm_q8_0_threads, 1) gemm_q8_0_kernel(const __grid_constant__ gemm_q8_0_launch a) {
    pdl_enter();
    extern __shared__ int4 gemm_smem[];
    auto* smem = reinterpret_cast<std::uint8_t*>(gemm_smem);
    const int n_rows = a.live_rows ? *a.live_rows : a.n_rows;
    const int m0 = int(blockIdx.x) * gemm_q8_0_bm;
    if (m0 >= n_rows) return;
    const gemm_q8_0_column col = gemm_q8_0_column_of(a, int(blockIdx.y));
    const gemm_q8_0_matrix& m = a.m[col.k];
    const int tiles = (m.rows + tile_rows - 1) / tile_rows;
    const int tile0 = col.index * gemm_q8_0_tiles;

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int wn = warp % gemm_q8_0_tiles, wm = warp / gemm_q8_0_tiles;
    const int g = lane / 4, t = lane % 4;

    // Output (mi, h, ni, e) at index ((mi * 2 + h) * 4 + ni) * 2 + e.
    constexpr int n_out = 32;
    float acc[n_out], seg[n_out];
#pragma unroll
    for (int i = 0; i < n_out; ++i) acc[i] = seg[i] = 0.0f;

    const int nk = (a.nb + gemm_q8_0_kb - 1) / gemm_q8_0_kb;
#pragma unroll
    for (int s = 0; s < gemm_q8_0_stages - 1; ++s) {
        if (s < nk) gemm_detail::load_stage(a, m, tile0, tiles, m0, n_rows, s * gemm_q8_0_kb, smem + s * gemm_detail::stage_bytes);
        cp_async::commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        cp_async::wait<gemm_q8_0_stages - 2>();
        __syncthreads();
        {
            const int next = kt + gemm_q8_0_stages - 1;
            if (next < nk)
                gemm_detail::load_stage(a, m, tile0, tiles, m0, n_rows, next * gemm_q8_0_kb,
                                        smem + (next % gemm_q8_0_stages) * gemm_detail::stage_bytes);
            cp_async::commit();
        }
        const std::uint8_t* st = smem + (kt % gemm_q8_0_stages) * gemm_detail::stage_bytes;
        const auto* sw = reinterpret_cast<const unsigned*>(st);
        const std::uint8_t* sa = st + gemm_detail::w_bytes;
        const auto* sws = reinterpret_cast<const std::uint16_t*>(st + gemm_detail::w_bytes + gemm_detail::a_bytes);
        const auto* sas = reinterpret_cast<const float*>(st + gemm_detail::w_bytes + gemm_detail::a_bytes + gemm_detail::ws_bytes);
#pragma unroll
        for (int j = 0; j < gemm_q8_0_kb; ++j) {
            const int b = kt * gemm_q8_0_kb + j;
            if (b >= a.nb) break;
            // A (weights, 16 x 32 row-major): rows g and g + 8 of m-tile mi, bytes 4t.. of each
            // half; in the tiled order those are words 64 mi + lane (+32) of each 512-byte half.
            const unsigned* wt = sw + (wn * gemm_q8_0_kb + j) * 256;
            unsigned af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                af[mi][0] = wt[64 * mi + lane];
                af[mi][1] = wt[64 * mi + 32 + lane];
                af[mi][2] = wt[128 + 64 * mi + lane];
                af[mi][3] = wt[128 + 64 * mi + 32 + lane];
            }
            float wd[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) wd[mi][h] = f16_operand(sws[(wn * 32 + 16 * mi + 8 * h + g) * gemm_q8_0_kb + j]);
            // One n8 tile at a time, its epilogue right after its mma: 8 accumulators live, not 32.
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                // B (activations, 32 x 8 column-major): row 8 ni + g, bytes 4t.. of each half.
                const int rr = wm * 32 + ni * 8 + g;
                const std::uint8_t* ar = sa + rr * gemm_detail::a_row_bytes + t * 4;
                const unsigned b0v = *reinterpret_cast<const unsigned*>(ar + (((2 * j) ^ (rr & 7)) * 16));
                const unsigned b1v = *reinterpret_cast<const unsigned*>(ar + (((2 * j + 1) ^ (rr & 7)) * 16));
                int d[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) gemm_detail::mma_block(d[mi], af[mi], b0v, b1v, 0);
                float xd[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) xd[e] = sas[(wm * 32 + ni * 8 + 2 * t + e) * gemm_q8_0_kb + j];
                // The reference's chain (format/q8_0.hpp dot_q8_0, row_dot.hpp segments).
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float isum = float(d[mi][2 * h + e]);
                            const float term = mul_rn(mul_rn(wd[mi][h], xd[e]), isum);
                            float& sg = seg[((mi * 2 + h) * 4 + ni) * 2 + e];
                            sg = add_rn(sg, term);
                        }
            }
            if ((b + 1) % q8_0_segment_blocks == 0 || b + 1 == a.nb) {
#pragma unroll
                for (int i = 0; i < n_out; ++i) {
                    acc[i] = add_rn(acc[i], seg[i]);
                    seg[i] = 0.0f;
                }
            }
        }
    }
    cp_async::wait<0>();
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int o = (tile0 + wn) * tile_rows + 16 * mi + 8 * h + g;
            if (o >= m.rows) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int r = m0 + wm * 32 + ni * 8 + 2 * t + e;
                    if (r < n_rows) m.y[std::size_t(r) * m.y_stride + o] = acc[((mi * 2 + h) * 4 + ni) * 2 + e];
                }
        }
}

namespace gemm_detail {

// Issues the cp.async copies of stage `st` (blocks b0 .. b0 + kb) of the pipelined kernel:
// weights and activations as gemm_q8_0_tile.hpp lays them out, activation scales. Tiles past the
// matrix, rows past the live count and blocks past nb are zero-filled, so their terms are exact
// zeros (0 * 0 scales, isum 0) that leave every kept sum unchanged.
// Every gemm_tile name is qualified here: a `using namespace gemm_tile` inside gemm_detail lets
// gemm_detail's own w_bytes / ws_bytes (the 64 x 128 kernel's) win the lookup.
__device__ __forceinline__ void issue_tile_stage(const gemm_q8_0_launch& a, const gemm_q8_0_matrix& m, int tile0, int tiles,
                                                 int m0, int n_rows, int b0, std::uint8_t* st) {
    namespace gt = gemm_tile;
    const int tid = int(threadIdx.x);
#pragma unroll
    for (int i = 0; i < gt::w_chunks; ++i) {
        const gt::w_chunk c = gt::w_chunk_of(tid + i * gt::threads);
        const int b = b0 + c.j;
        const bool ok = tile0 + c.t < tiles && b < a.nb;
        const std::uint8_t* src =
            ok ? m.quants + ((std::size_t(tile0 + c.t) * a.nb8 + b) * 2 + c.h) * 512 + c.l * 16 : m.quants;
        cp_async::zfill<16>(st + gt::w_dst(c), src, ok);
    }
#pragma unroll
    for (int i = 0; i < gt::x_chunks; ++i) {
        const gt::x_chunk c = gt::x_chunk_of(tid + i * gt::threads);
        const bool ok = m0 + c.r < n_rows && b0 + c.j < a.nb;
        const std::int8_t* src = ok ? m.act_qs + (std::size_t(m0 + c.r) * m.act_stride + (b0 + c.j) * 32 + c.h * 16) : m.act_qs;
        cp_async::zfill<16>(st + gt::x_dst(c), src, ok);
    }
#pragma unroll
    for (int i = 0; i < gt::xs_items; ++i) {
        const int it = tid + i * gt::threads, r = gt::xs_row(it), j = gt::xs_block(it);
        const bool ok = m0 + r < n_rows && b0 + j < a.nb;
        const float* src = ok ? m.act_d + (std::size_t(m0 + r) * (m.act_stride / 32) + b0 + j) : m.act_d;
        cp_async::zfill<4>(st + gt::xs_dst(j, r), src, ok);
    }
}

// The thread's two F16 weight scales of a stage (one 4-byte load, converted later so the load's
// latency hides behind a stage of mma): blocks past nb and tiles past the matrix read as the F16
// bits 0.
struct scale_pair {
    std::uint32_t bits = 0;
};
__device__ __forceinline__ scale_pair load_scale_pair(const gemm_q8_0_launch& a, const gemm_q8_0_matrix& m, int tile0,
                                                      int tiles, int b0) {
    namespace gt = gemm_tile;
    const int tid = int(threadIdx.x), row = gt::ws_row(tid), b = b0 + gt::ws_first_block(tid);
    const int t = row / tile_rows, l = row % tile_rows;
    scale_pair s;
    if (tile0 + t >= tiles || b >= a.nb) return s;
    s.bits = *reinterpret_cast<const std::uint32_t*>(m.scales + ((std::size_t(tile0 + t) * (a.nb8 / 8) + b0 / 8) * 32 + l) * 8 + b % 8);
    if (b + 1 >= a.nb) s.bits &= 0xffffu;
    return s;
}
__device__ __forceinline__ void store_scale_pair(const scale_pair& s, std::uint8_t* st) {
    namespace gt = gemm_tile;
    const int tid = int(threadIdx.x), row = gt::ws_row(tid), j = gt::ws_first_block(tid);
    *reinterpret_cast<float*>(st + gt::ws_dst(j, row)) = f16_operand(std::uint16_t(s.bits & 0xffffu));
    *reinterpret_cast<float*>(st + gt::ws_dst(j + 1, row)) = f16_operand(std::uint16_t(s.bits >> 16));
}

}  // namespace gemm_detail

// The pipelined kernel (gemm_q8_0_variant::tile_128x128): a CTA multiplies 128 weight rows by 128
// activation rows through a 4-stage cp.async ring of 4 blocks per stage (gemm_q8_0_tile.hpp has
// the layouts). Per 32-wide block a warp issues 16 mma (4 m16 x 4 n8) from 4 + 2 ldmatrix.x4
// fragment loads and 4 + 4 eight-byte scale loads, then applies the reference chain to its 64
// outputs per lane (4 FP32 instructions per output and block). Measured on the H200 (bench/NOTES.md,
// seventeenth session) no one part bounds it: without the chain, without the mma or without the
// global loads the kernel runs 1.27-1.56x faster, and 16 warps of 32 x 32 ran no faster than 8.
// Segments end only at stage ends (16 % kb == 0) or at the last stage, whose zero-padded blocks
// add exact zeros.
// One CTA per SM: 64 running sums + 64 segment sums per lane and the fragments (~200 registers).
template <int = 0>
__global__ void __launch_bounds__(gemm_tile::threads, 1) gemm_q8_0_tile_kernel(const __grid_constant__ gemm_q8_0_launch a) {
    pdl_enter();
    using namespace gemm_tile;
    static_assert(q8_0_segment_blocks % kb == 0, "a stage never straddles a segment end");
    static_assert(bw == gemm_q8_0_bn, "the plan's cta_begin counts 128-row CTA columns for both kernels");
    extern __shared__ int4 gemm_tile_smem[];
    auto* smem = reinterpret_cast<std::uint8_t*>(gemm_tile_smem);
    const int n_rows = a.live_rows ? *a.live_rows : a.n_rows;
    const int m0 = int(blockIdx.x) * bx;
    if (m0 >= n_rows) return;
    const gemm_q8_0_column col = gemm_q8_0_column_of(a, int(blockIdx.y));
    const gemm_q8_0_matrix& m = a.m[col.k];
    const int tiles = (m.rows + tile_rows - 1) / tile_rows;
    const int tile0 = col.index * (bw / tile_rows);

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int wn = warp % 2, wm = warp / 2, g = lane / 4, t = lane % 4;

    float acc[lane_outputs], seg[lane_outputs];
#pragma unroll
    for (int i = 0; i < lane_outputs; ++i) acc[i] = seg[i] = 0.0f;

    const int nk = (a.nb + kb - 1) / kb;
#pragma unroll
    for (int s = 0; s < stages - 1; ++s) {
        if (s < nk) {
            std::uint8_t* st = smem + ring_slot(s) * stage_bytes;
            gemm_detail::issue_tile_stage(a, m, tile0, tiles, m0, n_rows, s * kb, st);
            gemm_detail::store_scale_pair(gemm_detail::load_scale_pair(a, m, tile0, tiles, s * kb), st);
        }
        cp_async::commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
        cp_async::wait<ring_pending>();
        __syncthreads();
        // Stage kt + stages - 1 refills the buffer stage kt - 1 used: every thread is past it.
        const int next = ring_refill(kt);
        gemm_detail::scale_pair next_scales;
        if (next < nk) {
            gemm_detail::issue_tile_stage(a, m, tile0, tiles, m0, n_rows, next * kb, smem + ring_slot(next) * stage_bytes);
            next_scales = gemm_detail::load_scale_pair(a, m, tile0, tiles, next * kb);
        }
        cp_async::commit();

        const std::uint8_t* st = smem + ring_slot(kt) * stage_bytes;
        const std::uint8_t* sw = st + w_at;
        const std::uint8_t* sx = st + x_at;
        const auto* sws = reinterpret_cast<const float*>(st + ws_at);
        const auto* sxs = reinterpret_cast<const float*>(st + xs_at);
        // Two blocks per iteration: fully unrolled over the stage, ptxas hoists the later blocks'
        // fragments and spills at 255 registers (sm_90a); one block per iteration leaves ~175
        // moves around the loop edge (3.5% slower on every real shape).
#pragma unroll 2
        for (int j = 0; j < kb; ++j) {
            std::uint32_t bq[2][4];  // B of n8 tiles 2p, 2p + 1: b0, b1 of each
            float2 xd[4];
#pragma unroll
            for (int p = 0; p < 2; ++p) ldmatrix_x4(bq[p], sx + b_ldm_offset(j, wm, p, lane));
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) xd[ni] = *reinterpret_cast<const float2*>(sxs + xd_index(j, wm, ni, t));
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                // A one m16 tile at a time (every tile's A live at once spills).
                std::uint32_t af[4];
                ldmatrix_x4(af, sw + a_ldm_offset(j, wn, mi, lane));
                const float2 wd = *reinterpret_cast<const float2*>(sws + wd_index(j, wn, mi, g));
                const float wdh[2] = {wd.x, wd.y};
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) {
                    int d[4];
                    gemm_detail::mma_block(d, af, bq[ni / 2][2 * (ni % 2)], bq[ni / 2][2 * (ni % 2) + 1], gemm_q8_0_bias_bits);
                    const float xde[2] = {xd[ni].x, xd[ni].y};
                    // The reference's chain (format/q8_0.hpp dot_q8_0, row_dot.hpp segments).
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const float isum = __int_as_float(d[2 * h + e]) - gemm_q8_0_bias_value;
                            const float term = mul_rn(mul_rn(wdh[h], xde[e]), isum);
                            float& sg = seg[out_index(mi, h, ni, e)];
                            sg = add_rn(sg, term);
                        }
                }
            }
        }
        if (next < nk) gemm_detail::store_scale_pair(next_scales, smem + ring_slot(next) * stage_bytes);
        if (((kt + 1) * kb) % q8_0_segment_blocks == 0 || kt + 1 == nk) {
#pragma unroll
            for (int i = 0; i < lane_outputs; ++i) {
                acc[i] = add_rn(acc[i], seg[i]);
                seg[i] = 0.0f;
            }
        }
    }
    cp_async::wait<0>();
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int o = tile0 * tile_rows + out_weight_row(wn, mi, h, g);
            if (o >= m.rows) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int r = m0 + out_act_row(wm, ni, e, t);
                    if (r < n_rows) m.y[std::size_t(r) * m.y_stride + o] = acc[out_index(mi, h, ni, e)];
                }
        }
}

// ---- host side -----------------------------------------------------------------------------

// The plan for a set of matrices sharing one input, at a row capacity: the grid, and the
// workspace for the quantized input (int8 [capacity][in], then F32 scales [capacity][in / 32]).
class gemm_q8_0_plan {
public:
    static gemm_q8_0_plan make(const gemm_q8_0_shape& s, int capacity,
                               gemm_q8_0_variant variant = gemm_q8_0_variant::tile_64x128) {
        require(s.in > 0 && s.in % 32 == 0, "gemm_q8_0: in = " + std::to_string(s.in) + " is not a positive multiple of 32");
        require(s.n_matrices >= 1 && s.n_matrices <= gemm_q8_0_max_matrices, "gemm_q8_0: 1..8 matrices per launch");
        require(capacity >= 1 && capacity <= 65535 && (capacity + gemm_q8_0_bm - 1) / gemm_q8_0_bm <= 65535,
                "gemm_q8_0: row capacity " + std::to_string(capacity) + " outside 1..65535");
        gemm_q8_0_plan p;
        p.shape_ = s;
        p.capacity_ = capacity;
        p.variant_ = variant;
        p.cta_begin_[0] = 0;
        for (int k = 0; k < s.n_matrices; ++k) {
            require(s.rows[k] >= 1, "gemm_q8_0: matrix " + std::to_string(k) + " has no rows");
            const int tiles = (s.rows[k] + tile_rows - 1) / tile_rows;
            p.cta_begin_[k + 1] = p.cta_begin_[k] + (tiles + gemm_q8_0_tiles - 1) / gemm_q8_0_tiles;
        }
        require(p.cta_begin_[s.n_matrices] <= 65535, "gemm_q8_0: more than 65535 column CTAs");
        return p;
    }
    const gemm_q8_0_shape& shape() const { return shape_; }
    int capacity() const { return capacity_; }
    gemm_q8_0_variant variant() const { return variant_; }
    // Activation rows per CTA of the plan's kernel.
    int row_tile() const {
        return variant_ == gemm_q8_0_variant::tile_128x128 ? gemm_tile::bx
               : variant_ == gemm_q8_0_variant::wgmma_128x64 ? gemm_wg::bx
                                                             : gemm_q8_0_bm;
    }
    std::size_t act_qs_bytes() const { return std::size_t(capacity_) * shape_.in; }
    std::size_t workspace_bytes() const { return act_qs_bytes() + std::size_t(capacity_) * (shape_.in / 32) * sizeof(float); }
    // Raises both kernels' shared-memory limits on `device`: before capture.
    static void prepare(int device) {
        with_device(device, [device] {
            raise_smem_limit(gemm_q8_0_kernel<>, gemm_detail::smem_bytes, "gemm_q8_0 smem");
            raise_smem_limit(gemm_q8_0_tile_kernel<>, gemm_tile::smem_bytes, "gemm_q8_0 tile smem");
            if (gemm_q8_0_wgmma_available_on(device))
                raise_smem_limit(gemm_q8_0_wgmma_kernel<>, gemm_wg::smem_bytes, "gemm_q8_0 wgmma smem");
        });
    }
    // Shared-memory bytes per CTA of the plan's kernel, for occupancy reports.
    std::size_t smem_bytes() const {
        return variant_ == gemm_q8_0_variant::tile_128x128   ? std::size_t(gemm_tile::smem_bytes)
               : variant_ == gemm_q8_0_variant::wgmma_128x64 ? std::size_t(gemm_wg::smem_bytes)
                                                             : std::size_t(gemm_detail::smem_bytes);
    }
    const int* cta_begin() const { return cta_begin_; }

private:
    gemm_q8_0_shape shape_;
    int capacity_ = 0;
    gemm_q8_0_variant variant_ = gemm_q8_0_variant::tile_64x128;
    int cta_begin_[gemm_q8_0_max_matrices + 1] = {};
};

inline void prepare_gemm_q8_0(int device) { gemm_q8_0_plan::prepare(device); }

// The kernel for a shape at a row capacity on `sms` multiprocessors. The seventh session (H200)
// had the 128 x 128 tile ~25% faster once its grid filled two waves and up to 2x slower below;
// since the 64 x 128 kernel's later work it is the faster at every dense shape of the model at
// 2048 and 4096 rows (H100, bench/RESULTS.md forty-third session: 1-10%; whole-model prefill
// +1.2%), and it always was below two waves. The 128 x 128 tile stays for DS4_GEMM_TILE=128.
inline gemm_q8_0_variant pick_gemm_q8_0_variant(const gemm_q8_0_shape&, int, int) { return gemm_q8_0_variant::tile_64x128; }

// One launch (two when x must be quantized first). `workspace` holds plan.workspace_bytes()
// (16-byte aligned; unused when every matrix reads pre-quantized activations).
inline void gemm_q8_0(const gemm_q8_0_plan& plan, const gemm_q8_0_args& args, void* workspace, cudaStream_t stream) {
    const gemm_q8_0_shape& s = plan.shape();
    const int cap = plan.capacity();
    const int n_rows = args.live_rows ? cap : args.n_rows;
    require(n_rows >= 1 && n_rows <= cap, "gemm_q8_0: n_rows " + std::to_string(n_rows) + " outside 1..capacity " + std::to_string(cap));
    gemm_q8_0_launch L;
    L.in = s.in;
    L.nb = s.in / 32;
    L.nb8 = (L.nb + 7) / 8 * 8;
    L.n_rows = n_rows;
    L.live_rows = args.live_rows;
    L.n_matrices = s.n_matrices;
    for (int k = 0; k <= s.n_matrices; ++k) L.cta_begin[k] = plan.cta_begin()[k];
    bool quantize = false;
    for (int k = 0; k < s.n_matrices; ++k) {
        gemm_q8_0_matrix m = args.m[k];
        const std::string which = "gemm_q8_0: matrix " + std::to_string(k);
        require(m.quants && m.scales && m.y, which + ": null weights or output");
        require(m.rows == s.rows[k], which + ": " + std::to_string(m.rows) + " rows, the plan has " + std::to_string(s.rows[k]));
        require(m.y_stride >= m.rows, which + ": y_stride below the row count");
        require(reinterpret_cast<std::uintptr_t>(m.quants) % 16 == 0 && reinterpret_cast<std::uintptr_t>(m.scales) % 16 == 0,
                which + ": tiled weights must be 16-byte aligned");
        if (m.act_qs == nullptr) {
            quantize = true;
            m.act_qs = static_cast<const std::int8_t*>(workspace);
            m.act_d = reinterpret_cast<const float*>(static_cast<const std::uint8_t*>(workspace) + plan.act_qs_bytes());
            m.act_stride = s.in;
        } else {
            require(m.act_d != nullptr, which + ": act_qs without act_d");
            require(m.act_stride >= s.in && m.act_stride % 32 == 0, which + ": act_stride must be >= in and a multiple of 32");
            require(reinterpret_cast<std::uintptr_t>(m.act_qs) % 16 == 0 && reinterpret_cast<std::uintptr_t>(m.act_d) % 4 == 0,
                    which + ": pre-quantized activations must be 16-byte (qs) and 4-byte (d) aligned");
        }
        L.m[k] = m;
    }
    if (quantize) {
        require(workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % 16 == 0,
                "gemm_q8_0: the workspace (plan.workspace_bytes()) must be given and 16-byte aligned");
        require(args.x != nullptr && args.x_stride >= s.in, "gemm_q8_0: null x or x_stride below in");
        quantize_act_launch q;
        q.x = args.x;
        q.x_stride = args.x_stride;
        q.n = s.in;
        q.qs = static_cast<std::int8_t*>(workspace);
        q.d = reinterpret_cast<float*>(static_cast<std::uint8_t*>(workspace) + plan.act_qs_bytes());
        q.n_rows = args.live_rows;
        launch_quantize_act(q, n_rows, stream);
    }
    const int bm = plan.row_tile();
    const dim3 grid(unsigned((n_rows + bm - 1) / bm), unsigned(L.cta_begin[s.n_matrices]));
    if (plan.variant() == gemm_q8_0_variant::wgmma_128x64) {
        const int dev = current_device();
        require_prepared(gemm_q8_0_wgmma_availability().ready(dev), stream, "gemm_q8_0_wgmma_kernel", "prepare_gemm_q8_0");
        require(gemm_q8_0_wgmma_available_on(dev), "gemm_q8_0: the plan asks for the wgmma kernel, which device " +
                                                      std::to_string(dev) + " cannot run (it needs sm_90a code and " +
                                                      std::to_string(gemm_wg::smem_bytes) + " bytes of shared memory a CTA)");
        raise_smem_limit(gemm_q8_0_wgmma_kernel<>, gemm_wg::smem_bytes, "gemm_q8_0 wgmma", stream);
        launch_kernel("gemm_q8_0_wgmma_kernel", gemm_q8_0_wgmma_kernel<>, grid, gemm_wg::threads, gemm_wg::smem_bytes, stream, L);
    } else if (plan.variant() == gemm_q8_0_variant::tile_128x128) {
        raise_smem_limit(gemm_q8_0_tile_kernel<>, gemm_tile::smem_bytes, "gemm_q8_0 tile", stream);
        launch_kernel("gemm_q8_0_tile_kernel", gemm_q8_0_tile_kernel<>, grid, gemm_tile::threads, gemm_tile::smem_bytes,
                      stream, L);
    } else {
        raise_smem_limit(gemm_q8_0_kernel<>, gemm_detail::smem_bytes, "gemm_q8_0", stream);
        launch_kernel("gemm_q8_0_kernel", gemm_q8_0_kernel<>, grid, gemm_q8_0_threads, gemm_detail::smem_bytes, stream,
                      L);
    }
    cuda_check_launch("gemm_q8_0");
}

}  // namespace ds4::kernels
