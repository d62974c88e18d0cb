#pragma once
// STATUS: the CUDA backend's prefill chunks use it (default since 96b794f; DS4_MOE_GEMM=0 falls
// back to 16-row slices). Checks: ds4-validate --only moe_gemm, moe_gemm_test_gpu,
// moe_gemm_stages_test_gpu, moe_gemm_model_test_gpu (a forward pass's MoE inputs), the conformance
// suite; bench: moe_gemm_bench. bench/RESULTS.md has the runs.
//
// The routed experts of the MoE sublayer for prefill (docs/model.md §2.7) as grouped GEMMs on int8
// tensor cores, for 1..capacity rows whose 6 (row, slot) pairs already name their expert and
// weight (sel, wts: moe.cuh's route math, top-6 or hash):
//   sort     pairs counted and scattered by expert on the device (one CTA, no host round trip)
//   xq       Q8_K of every row (kernels/moe.cuh's warp quantizer)
//   gate/up  per expert: IQ2_XXS rows decoded to int8 in shared memory, x mma.sync m16n8k32 s8
//            against the pairs' xq; mid = silu(min(g, c)) * clamp(u, +-c) * w_s
//   midq     Q8_K of mid per pair (with the 16-sums)
//   down     per expert: Q2_K rows decoded to int8 (q * group scale <= 45) x midq; the min term
//            from the 16-sums as one u8 x s8 mma per output tile
//   out      sum over slots 0..5 in order, from 0.0f
//
// Contract: exact. Every output equals reference/moe's moe_routed for the same route, bit for bit.
//   IQ2_XXS: one mma per 32-weight sub-block gives sumi exactly; bsum = sum of sumi * (2s+1) in
//   integers; then the block's float chain sumf += (d_w * d_x) * bsum, result 0.125 * sumf.
//   Q2_K: the 8 mma of a block chain into isum = sum over groups of scale_g * (q . x), exact in
//   any order; summs = sum of bsums_g * min_g; sumf += dall * isum - dmin * summs, each product
//   rounded, in block order. Pairs are independent, so the order of pairs inside an expert's
//   group (set by atomics) never changes a bit.
// Graph contract: no allocation, no host synchronisation; the grids are functions of the plan's
//   capacity and shape; the live row count may come from device memory (live_rows). Expert ids
//   outside [0, n_expert) are skipped (their pair's output is unspecified; the route never makes one).
// Shapes: n_embd and n_ff multiples of 256; n_expert <= 256; capacity <= 4096 rows.
// Cost: the gate/up and down grids have one row of CTAs per work item (expert, 64 of its pairs),
// sized for the worst case (6 cap / 64 + n_expert): the unused ones exit at once. Each CTA streams
// its weight tiles and the pairs' activations through a cp.async ring (3 stages gate/up, 4 down)
// and decodes a block to int8 tiles in shared memory (IQ2_XXS through selector tables) while the
// next blocks load; gate/up decodes block b + 1 while it multiplies block b. One CTA of 16 warps
// per SM (8 warps issued ~0.45 instructions a clock per scheduler: H200 profile, bench/NOTES.md).
// The default gate/up and down are their fragment-decoding forms (moe_gemm_gate_up_regs.cuh,
// moe_gemm_down_regs.cuh: no decoded tile in shared memory, 8 warps, two CTAs per SM, the same
// bits); the tile kernels below remain for set_*_regs(false).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_gemm_down_parts.cuh"
#include "ds4/kernels/moe_gemm_gate_up_parts.cuh"
#include "ds4/kernels/moe_gemm_down_regs.cuh"
#include "ds4/kernels/moe_gemm_gate_up_regs.cuh"
#include "ds4/kernels/moe_gemm_wgmma.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"
#include "ds4/kernels/moe_schedule.hpp"
#include "ds4/kernels/moe_weights.hpp"
#include "ds4/kernels/quantize_q8_k.cuh"

namespace ds4::kernels {

// Counting sort of the live pairs by expert: offsets[e] .. offsets[e + 1] of `sorted`, and the
// work items of the GEMM grids (experts with no pair get none).
template <int = 0>
__global__ void __launch_bounds__(moe_gemm_sort_threads) moe_gemm_sort_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
    __shared__ int count[moe_max_experts + 1], cursor[moe_max_experts];
    const int n_pairs = moe_gemm_detail::live(L) * moe_slots, ne = L.shape.n_expert;
    for (int e = int(threadIdx.x); e <= ne; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = int(threadIdx.x); p < n_pairs; p += blockDim.x) {
        const int e = L.a.sel[p];
        if (e >= 0 && e < ne) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < ne; ++e) {
            const int c = count[e];
            cursor[e] = run;
            L.w.offsets[e] = run;
            run += c;
        }
        L.w.offsets[ne] = run;
        int n = 0;
        for (int e = 0; e < ne; ++e)
            for (int p0 = 0; p0 < count[e]; p0 += moe_gemm_pairs_cta) {
                L.w.items[2 * n] = e;
                L.w.items[2 * n + 1] = p0;
                ++n;
            }
        for (; n < L.max_items; ++n) L.w.items[2 * n] = -1;
    }
    __syncthreads();
    for (int p = int(threadIdx.x); p < n_pairs; p += blockDim.x) {
        const int e = L.a.sel[p];
        if (e >= 0 && e < ne) L.w.sorted[atomicAdd(&cursor[e], 1)] = p;
    }
}

// Q8_K of `n` values per row (one warp per 256-block), as quantize_q8_k; bsums when asked.
template <int = 0>
__global__ void __launch_bounds__(256) moe_gemm_quantize_kernel(const float* x, std::int64_t x_stride, int n,
                                                                std::int8_t* q, float* d, std::int16_t* bsums,
                                                                const std::int32_t* live_rows, int n_rows, int per_row) {
    pdl_enter();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int b = int(blockIdx.x) * 8 + warp, r = int(blockIdx.y);
    const int live = (live_rows ? *live_rows : n_rows) * per_row;
    if (r >= live || b >= n / 256) return;
    float v[8];
    const float4* src = reinterpret_cast<const float4*>(x + r * x_stride + b * 256 + lane * 8);
    const float4 f0 = src[0], f1 = src[1];
    v[0] = f0.x, v[1] = f0.y, v[2] = f0.z, v[3] = f0.w, v[4] = f1.x, v[5] = f1.y, v[6] = f1.z, v[7] = f1.w;
    detail::warp_quantize_q8_k(v, lane, q + std::size_t(r) * n + b * 256, d + std::size_t(r) * (n / 256) + b,
                               bsums ? bsums + std::size_t(r) * (n / 16) + b * 16 : nullptr);
}

namespace moe_gemm_detail {

// The kernels' shared memory as typed structs: each array has the element type its code reads
// (the first version carved one buffer by hand, and the IQ2_XXS row scales, carved from an int
// pointer, were stored and read as int: every scale truncated to 0, every output 0).
//
// Each k-block's bytes (the weight tiles as stored, the pairs' activations and their scales) land
// in a ring of stages by cp.async, `stages - 1` blocks ahead of the one being multiplied: the first
// version loaded a block, waited, decoded, multiplied, with ~8 KiB per SM in flight and the DRAM
// round trip exposed at every block (moe_gemm at 4% of the int8 peak). One CTA of 16 warps per SM,
// each thread's 32 accumulators (16 integer, 16 float) within its 128 registers.
// Gate/up decodes block b + 1 into the second of two int8 tile buffers while it multiplies block b
// (one barrier per block): its ring is three deep so that both buffers fit sm_80's shared memory.
inline constexpr int gu_stages = 3, down_stages = 4;


struct act_stage {
    alignas(16) std::uint8_t a[moe_gemm_pairs_cta * 256];  // the pairs' Q8_K block, swizzled
    float xd[moe_gemm_pairs_cta];
};
struct gate_up_stage {
    alignas(16) std::uint8_t raw[4][gu_tile_bytes];  // tiles 0, 1 = gate rows f0.., 2, 3 = up rows
    act_stage act;
    std::uint32_t d2[4 * 32];                        // the aligned word holding each row's F16 d
};
struct gate_up_shared {
    union {
        gate_up_stage st[gu_stages];
        float res[2][moe_gemm_pairs_cta][64];  // gate and up results of the f-tile (after the loop)
    } u;
    // Two decoded blocks (b % 2): tiles [tile][sub-block][half][row][16], 2s + 1 of each weight
    // row's sub-block (rows padded: no conflicts), F16 d of each weight row's block.
    alignas(16) std::uint8_t w[2][4][8][1024];
    int ls[2][4 * 32][9];
    float wd[2][4 * 32];
    std::int32_t row[moe_gemm_pairs_cta];
    iq2_sel_tables sel;
};
struct down_stage {
    alignas(16) std::uint8_t raw[4][down_tile_bytes];
    act_stage act;
    alignas(16) std::int16_t bsums[moe_gemm_pairs_cta][16];
    std::uint32_t dd[4 * 32];  // d | dmin << 16 of each weight row's block
};
struct down_shared {
    down_stage st[down_stages];
    alignas(16) std::uint8_t w[4][8][1024];   // q * group scale, same tile layout
    // Per tile, the A operand of the min-term mma ([half][row][16], as w): k 0..15 the weight row's
    // 16 group mins, k 16..31 the same times 16 (u8, <= 240).
    alignas(16) std::uint8_t mins[4][2][32][16];
    float dd[4 * 32][2];                        // d, dmin of each weight row
    std::int32_t pair[moe_gemm_pairs_cta];
};
// Decode tasks (tile, row, sub-block): 4 x 32 x 8, two per thread; warp rows cover the pairs.
static_assert(moe_gemm_pairs_cta * 16 % moe_gemm_threads == 0 && 4 * 32 * 8 == 2 * moe_gemm_threads &&
              moe_gemm_threads / 32 == 4 * (moe_gemm_pairs_cta / moe_gemm_warp_pairs));
inline constexpr int gu_smem = int(sizeof(gate_up_shared));
inline constexpr int down_smem = int(sizeof(down_shared));
static_assert(gu_smem <= 166912 && down_smem <= 166912, "moe_gemm: a CTA's shared memory must fit sm_80's 163 KiB opt-in");

}  // namespace moe_gemm_detail

// Gate/up of one expert: CTA (f-tile of 64 rows, pair tile, expert). Warp w: tile w % 4 (tiles 0,
// 1 = gate rows, 2, 3 = up rows of the f-tile), pairs 16 * (w / 4) .. +16. Lane (g, t) holds
// outputs (row 16 mi + 8 h + g, pair 8 ni + 2 t + e) with their integer bsum and float sumf.
// Sixteen warps of at most 128 registers: four per scheduler to hide the mma and shared-memory
// latencies (eight warps of 193 registers issued ~0.45 instructions a clock), and a warp whose 16
// pairs are past the group skips its multiply.
template <int = 0>
__global__ void __launch_bounds__(moe_gemm_threads, 1)
    moe_gemm_gate_up_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
    using namespace moe_gemm_detail;
    extern __shared__ int4 moe_gemm_smem[];
    const work_item it = item_of(L);
    if (it.e < 0) return;
    const int e = it.e, first = it.first + it.p0, count = it.count;
    const int n_embd = L.shape.n_embd, nb = n_embd / 256;
    auto& sm = *reinterpret_cast<gate_up_shared*>(moe_gemm_smem);
    load_pair_rows(L, first, count, sm.row);
    fill_sel_tables(sm.sel);
    __syncthreads();
    const int f0 = int(blockIdx.x) * 64;  // n_ff % 256 == 0: every tile row exists
    // This thread's copies, formed once: its weight chunk and scale word, its share of the
    // activations.
    const gate_up_sources wsrc = gate_up_sources_of(L, e, f0);
    const act_sources asrc = act_sources_of(sm.row, count, n_embd, nb);
    // Stage s <- block b: the 4 tiles' 2 KiB blocks, each row's scale word, the pairs' activations.
    auto issue = [&](int b, int s) {
        gate_up_stage& st = sm.u.st[s];
        issue_gate_up_weights(L, wsrc, b, st.raw, st.d2);
        stage_acts(L.w.xq, L.w.xq_d, asrc, count, b, st.act.a, st.act.xd);
    };

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int wn = warp % 4, wm = warp / 4, g = lane / 4, t = lane % 4;
    const gate_up_task task = gate_up_task_of(warp, lane);
    constexpr int nacc = 2 * 2 * (moe_gemm_warp_pairs / 8) * 2;  // (mi, h, ni, e)
    int bsum[nacc];
    float sumf[nacc];
#pragma unroll
    for (int i = 0; i < nacc; ++i) sumf[i] = 0.0f;
    // Block b's weight tiles, decoded from its stage into tile buffer b % 2.
    auto decode = [&](int b) {
        const gate_up_stage& st = sm.u.st[b % gu_stages];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int tt = task.tile0 + k;
            const uint2 v = task_bytes(st.raw, tt, task);
            std::uint32_t w[8];
            decode_sub_block(sm.sel, v, task.copy4, w);
            std::uint8_t* dst = &sm.w[b % 2][tt][task.ib][0] + task.row * 16;
            *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
            *reinterpret_cast<uint4*>(dst + 512) = make_uint4(w[4], w[5], w[6], w[7]);
            sm.ls[b % 2][tt * 32 + task.row][task.ib] = sub_block_scale(v);
            if (task.ib == 0) sm.wd[b % 2][tt * 32 + task.row] = block_d(st.d2[tt * 32 + task.row], b);
        }
    };
    // Block b's products from tile buffer b % 2 and its stage's activations.
    auto multiply = [&](int b) {
        const gate_up_stage& st = sm.u.st[b % gu_stages];
        // A warp whose 32 pairs are all past the group has nothing to multiply (a 1024-row chunk
        // averages 24 pairs per expert).
        if (wm * moe_gemm_warp_pairs < count) {
#pragma unroll
            for (int i = 0; i < nacc; ++i) bsum[i] = 0;
            // Two sub-blocks per unrolled body, as in down (no spill at 128 registers, sm_80 too).
#pragma unroll 2
            for (int ib = 0; ib < 8; ++ib) {
                const unsigned* tile = reinterpret_cast<const unsigned*>(&sm.w[b % 2][wn][ib][0]);
                unsigned af[2][4];
                a_frag(tile, 0, lane, af[0]);
                a_frag(tile, 1, lane, af[1]);
                int ls[2][2];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                    for (int h = 0; h < 2; ++h) ls[mi][h] = sm.ls[b % 2][wn * 32 + 16 * mi + 8 * h + g][ib];
#pragma unroll
                for (int ni = 0; ni < moe_gemm_warp_pairs / 8; ++ni) {
                    unsigned b0, b1;
                    b_frag(st.act.a, wm * moe_gemm_warp_pairs + ni * 8 + g, ib, t, b0, b1);
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) {
                        int d[4] = {0, 0, 0, 0};
                        mma_s8(d, af[mi], b0, b1);
#pragma unroll
                        for (int h = 0; h < 2; ++h)
#pragma unroll
                            for (int ee = 0; ee < 2; ++ee) bsum[acc_index(mi, h, ni, ee)] += d[2 * h + ee] * ls[mi][h];
                    }
                }
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float wd = sm.wd[b % 2][wn * 32 + 16 * mi + 8 * h + g];
#pragma unroll
                    for (int ni = 0; ni < moe_gemm_warp_pairs / 8; ++ni)
#pragma unroll
                        for (int ee = 0; ee < 2; ++ee) {
                            const int i = acc_index(mi, h, ni, ee);
                            const float dd = mul_rn(wd, st.act.xd[wm * moe_gemm_warp_pairs + ni * 8 + 2 * t + ee]);
                            sumf[i] = add_rn(sumf[i], mul_rn(dd, float(bsum[i])));
                        }
                }
        }
    };
#pragma unroll
    for (int s = 0; s < gu_stages - 1; ++s) {
        if (s < nb) issue(s, s);
        cp_async::commit();
    }
    cp_async::wait<gu_stages - 2>();
    __syncthreads();  // block 0 landed
    decode(0);
    for (int b = 0; b < nb; ++b) {
        // Blocks up to b + 1 landed; every warp decoded block b and is done with block b - 1's
        // stage and tile buffer, so block b + 2 can land in that stage and b + 1 decode into it.
        cp_async::wait<gu_stages - 3>();
        __syncthreads();
        if (b + gu_stages - 1 < nb) issue(b + gu_stages - 1, (b + gu_stages - 1) % gu_stages);
        cp_async::commit();
        if (b + 1 < nb) decode(b + 1);
        multiply(b);
    }
    cp_async::wait<0>();
    __syncthreads();  // the ring is free: res overlays it
    // Gate and up of one (row, pair) meet in shared memory.
    float* sres = &sm.u.res[0][0][0];  // [2][pair][64]
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int ni = 0; ni < moe_gemm_warp_pairs / 8; ++ni)
#pragma unroll
                for (int ee = 0; ee < 2; ++ee) {
                    const int fr = 32 * (wn % 2) + 16 * mi + 8 * h + g, pr = wm * moe_gemm_warp_pairs + ni * 8 + 2 * t + ee;
                    sres[((wn / 2) * moe_gemm_pairs_cta + pr) * 64 + fr] = mul_rn(0.125f, sumf[acc_index(mi, h, ni, ee)]);
                }
    __syncthreads();
    gate_up_finish(L, sres, first, count, f0);
}

// Down of one expert: CTA (128 output rows, pair tile, expert); the same warp tiling (tile w % 4 of
// 32 output rows, pairs 16 * (w / 4) .. +16). The Q2_K quants decode to q * scale_g (<= 45) so the
// 8 mma of a block chain into isum.
template <int = 0>
__global__ void __launch_bounds__(moe_gemm_threads, 1)
    moe_gemm_down_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
    using namespace moe_gemm_detail;
    extern __shared__ int4 moe_gemm_smem[];
    const work_item it = item_of(L);
    if (it.e < 0) return;
    const int e = it.e, first = it.first + it.p0, count = it.count;
    const int n_embd = L.shape.n_embd, n_ff = L.shape.n_ff, nb = n_ff / 256;
    auto& sm = *reinterpret_cast<down_shared*>(moe_gemm_smem);
    load_pairs(L, first, count, sm.pair);
    __syncthreads();
    const int o0 = int(blockIdx.x) * 128;  // n_embd % 256 == 0: every tile row exists
    // This thread's copies, formed once: its weight chunks, scale word and 16-sums, its share of
    // the activations.
    const down_sources wsrc = down_sources_of(L, e, o0, sm.pair, count);
    const act_sources asrc = act_sources_of(sm.pair, count, n_ff, nb);
    auto issue = [&](int b, int s) {
        down_stage& st = sm.st[s];
        issue_down_weights(L, wsrc, b, count, st.raw, st.dd, st.bsums);
        stage_acts(L.w.midq, L.w.midq_d, asrc, count, b, st.act.a, st.act.xd);
    };

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int wn = warp % 4, wm = warp / 4, g = lane / 4, t = lane % 4;
    constexpr int nacc = 2 * 2 * (moe_gemm_warp_pairs / 8) * 2;  // (mi, h, ni, e)
    float sumf[nacc];
#pragma unroll
    for (int i = 0; i < nacc; ++i) sumf[i] = 0.0f;
    run_ring<down_stages>(nb, issue, [&](int b, int s) {
        const down_stage& st = sm.st[s];
        // Decode: warp w is k-step ib = 4k + j = w % 8 of tiles 2 (w / 8) and 2 (w / 8) + 1, lane =
        // row: halves h = 0, 1 are the 16-byte pieces 1 + 2k + h shifted by 2j, times the scale of
        // group 8k + 2j + h.
        {
            const int ib = warp % 8, row = lane;
#pragma unroll
            for (int kt = 0; kt < 2; ++kt) {
                const int tt = 2 * (warp / 8) + kt;
                const uint4 sc = q2_k_scales(st.raw[tt], row);
                std::uint8_t* dst = &sm.w[tt][ib][0] + row * 16;
#pragma unroll
                for (int h = 0; h < 2; ++h) *reinterpret_cast<uint4*>(dst + h * 512) = decode_q2_k_half(st.raw[tt], sc, row, ib, h);
                if (ib == 0) {
                    *reinterpret_cast<uint4*>(&sm.mins[tt][0][row][0]) = q2_k_mins(sc);
                    *reinterpret_cast<uint4*>(&sm.mins[tt][1][row][0]) = q2_k_mins16(sc);
                    const std::uint32_t dv = st.dd[tt * 32 + row];
                    sm.dd[tt * 32 + row][0] = f16_operand(std::uint16_t(dv & 0xffffu));
                    sm.dd[tt * 32 + row][1] = f16_operand(std::uint16_t(dv >> 16));
                }
            }
        }
        __syncthreads();
        if (wm * moe_gemm_warp_pairs < count) {
            int isum[nacc];
#pragma unroll
            for (int i = 0; i < nacc; ++i) isum[i] = 0;
            // Fully unrolled (with the min term's mma in place of 8 dp2a per output it fits 128
            // registers; before, it spilled and ran two k-steps per body).
#pragma unroll
            for (int ib = 0; ib < 8; ++ib) {
                const unsigned* tile = reinterpret_cast<const unsigned*>(&sm.w[wn][ib][0]);
                unsigned af[2][4];
                a_frag(tile, 0, lane, af[0]);
                a_frag(tile, 1, lane, af[1]);
#pragma unroll
                for (int ni = 0; ni < moe_gemm_warp_pairs / 8; ++ni) {
                    unsigned b0, b1;
                    b_frag(st.act.a, wm * moe_gemm_warp_pairs + ni * 8 + g, ib, t, b0, b1);
#pragma unroll
                    for (int mi = 0; mi < 2; ++mi) {
                        int d[4];
#pragma unroll
                        for (int x = 0; x < 4; ++x) d[x] = isum[acc_index(mi, x / 2, ni, x % 2)];
                        mma_s8(d, af[mi], b0, b1);
#pragma unroll
                        for (int x = 0; x < 4; ++x) isum[acc_index(mi, x / 2, ni, x % 2)] = d[x];
                    }
                }
            }
            // summs = sum over groups g of bsum_g * min_g, one mma per output tile: with bsum_g =
            // 16 hi_g + lo_g (hi_g = bsum_g >> 4 in [-128, 127], lo_g = bsum_g & 15), the u8 row
            // [min_0..15 | 16 min_0..15] against the s8 column [lo_0..15 | hi_0..15] is
            // sum min_g lo_g + 16 min_g hi_g, the same integer (exact; 8 dp2a per output before).
            unsigned am[2][4];
            const unsigned* mt = reinterpret_cast<const unsigned*>(&sm.mins[wn][0][0][0]);
            a_frag(mt, 0, lane, am[0]);
            a_frag(mt, 1, lane, am[1]);
#pragma unroll
            for (int ni = 0; ni < moe_gemm_warp_pairs / 8; ++ni) {
                // Column g of the B operand: pair 8 ni + g, groups 4t..4t+3 (lo) and the same (hi).
                const uint2 v = *reinterpret_cast<const uint2*>(&st.bsums[wm * moe_gemm_warp_pairs + ni * 8 + g][4 * t]);
                const unsigned blo = bsums_lo(v), bhi = bsums_hi(v);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    int summs[4] = {0, 0, 0, 0};
                    mma_u8s8(summs, am[mi], blo, bhi);
#pragma unroll
                    for (int x = 0; x < 4; ++x) {
                        const int h = x / 2, ee = x % 2, i = acc_index(mi, h, ni, ee);
                        const int wr = wn * 32 + 16 * mi + 8 * h + g;
                        const float xd = st.act.xd[wm * moe_gemm_warp_pairs + ni * 8 + 2 * t + ee];
                        const float dall = mul_rn(xd, sm.dd[wr][0]), dmin = mul_rn(xd, sm.dd[wr][1]);
                        sumf[i] = add_rn(sumf[i], sub_rn(mul_rn(dall, float(isum[i])), mul_rn(dmin, float(summs[x]))));
                    }
                }
            }
        }
    });
    cp_async::wait<0>();
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int o = o0 + wn * 32 + 16 * mi + 8 * h + g;
#pragma unroll
            for (int ni = 0; ni < moe_gemm_warp_pairs / 8; ++ni)
#pragma unroll
                for (int ee = 0; ee < 2; ++ee) {
                    const int pr = wm * moe_gemm_warp_pairs + ni * 8 + 2 * t + ee;
                    if (pr < count) L.w.ys[std::size_t(sm.pair[pr]) * n_embd + o] = sumf[acc_index(mi, h, ni, ee)];
                }
        }
}

// out[r][o] = sum over slots in order from 0.0f.
template <int = 0>
__global__ void __launch_bounds__(256) moe_gemm_slot_sum_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
    const int r = int(blockIdx.y), o = int(blockIdx.x) * 256 + int(threadIdx.x);
    if (r >= moe_gemm_detail::live(L) || o >= L.shape.n_embd) return;
    float acc = 0.0f;
    for (int s = 0; s < moe_slots; ++s) acc = add_rn(acc, L.w.ys[std::size_t(r * moe_slots + s) * L.shape.n_embd + o]);
    L.a.out[std::size_t(r) * L.a.out_stride + o] = acc;
}

// ---- host side -----------------------------------------------------------------------------

class moe_gemm_plan {
public:
    static moe_gemm_plan make(const moe_gemm_shape& s, int capacity) {
        require(s.n_embd > 0 && s.n_ff > 0 && s.n_embd % 256 == 0 && s.n_ff % 256 == 0,
                "moe_gemm: n_embd " + std::to_string(s.n_embd) + " and n_ff " + std::to_string(s.n_ff) +
                    " must be positive multiples of 256");
        require(s.n_expert >= 1 && s.n_expert <= moe_max_experts, "moe_gemm: n_expert = " + std::to_string(s.n_expert) + " (1..256)");
        require(capacity >= 1 && capacity <= moe_gemm_max_rows, "moe_gemm: capacity " + std::to_string(capacity) + " (1..4096)");
        moe_gemm_plan p;
        p.shape_ = s;
        p.cap_ = capacity;
        return p;
    }
    int capacity() const { return cap_; }
    const moe_gemm_shape& shape() const { return shape_; }
    // Gate/up and down on sm_90a warpgroup MMA (moe_gemm_wgmma.cuh) instead of mma.sync: same
    // contract, same bits. The launch requires a device where moe_gemm_wgmma_available_on holds.
    void set_gate_up_wgmma(bool on) { gate_up_wgmma_ = on; }
    void set_down_wgmma(bool on) { down_wgmma_ = on; }
    // Gate/up and down with the weights decoded into the mma fragments (moe_gemm_gate_up_regs.cuh,
    // moe_gemm_down_regs.cuh), the default: the same contract and bits as the tile kernels
    // (set_*_regs(false)), 23% faster at 2048 rows on an H100; the wgmma kernels take precedence
    // where both are set.
    void set_gate_up_regs(bool on) { gate_up_regs_ = on; }
    void set_down_regs(bool on) { down_regs_ = on; }
    bool gate_up_regs() const { return gate_up_regs_; }
    bool down_regs() const { return down_regs_; }
    bool gate_up_wgmma() const { return gate_up_wgmma_; }
    bool down_wgmma() const { return down_wgmma_; }
    std::size_t workspace_bytes() const { return carve(nullptr).second; }
    static void prepare(int device) {
        with_device(device, [device] {
            raise_smem_limit(moe_gemm_gate_up_kernel<>, moe_gemm_detail::gu_smem, "moe_gemm gate/up smem");
            raise_smem_limit(moe_gemm_down_kernel<>, moe_gemm_detail::down_smem, "moe_gemm down smem");
            raise_smem_limit(moe_gemm_gate_up_regs_kernel<>, moe_gu_regs_detail::smem, "moe_gemm gate/up regs smem");
            raise_smem_limit(moe_gemm_down_regs_kernel<>, moe_down_regs_detail::smem, "moe_gemm down regs smem");
            if (moe_gemm_wgmma_available_on(device)) {
                raise_smem_limit(moe_gemm_gate_up_wgmma_kernel<>, moe_gemm_wgmma_detail::gu_smem, "moe_gemm wgmma gate/up smem");
                raise_smem_limit(moe_gemm_down_wgmma_kernel<>, moe_gemm_wgmma_detail::down_smem, "moe_gemm wgmma down smem");
            }
        });
    }
    // The workspace's arrays at `base`, and the bytes they take.
    std::pair<moe_gemm_work, std::size_t> carve(void* base) const {
        std::size_t off = 0;
        auto take = [&](std::size_t bytes) {
            void* p = base ? static_cast<std::uint8_t*>(base) + off : nullptr;
            off += (bytes + 255) / 256 * 256;
            return p;
        };
        const std::size_t pairs = std::size_t(cap_) * moe_slots;
        moe_gemm_work w;
        w.xq = static_cast<std::int8_t*>(take(std::size_t(cap_) * shape_.n_embd));
        w.xq_d = static_cast<float*>(take(std::size_t(cap_) * (shape_.n_embd / 256) * 4));
        w.offsets = static_cast<std::int32_t*>(take(std::size_t(shape_.n_expert + 1) * 4));
        w.sorted = static_cast<std::int32_t*>(take(pairs * 4));
        w.items = static_cast<std::int32_t*>(take(std::size_t(moe_gemm_max_items(cap_, shape_.n_expert)) * 8));
        w.mid = static_cast<float*>(take(pairs * shape_.n_ff * 4));
        w.midq = static_cast<std::int8_t*>(take(pairs * shape_.n_ff));
        w.midq_d = static_cast<float*>(take(pairs * (shape_.n_ff / 256) * 4));
        w.midq_bsums = static_cast<std::int16_t*>(take(pairs * (shape_.n_ff / 16) * 2));
        w.ys = static_cast<float*>(take(pairs * shape_.n_embd * 4));
        return {w, off};
    }

private:
    moe_gemm_shape shape_;
    int cap_ = 0;
    bool gate_up_wgmma_ = false, down_wgmma_ = false, gate_up_regs_ = true, down_regs_ = true;
};

inline void prepare_moe_gemm(int device) { moe_gemm_plan::prepare(device); }

// Six launches on `stream`: sort, Q8_K of xn, gate/up, Q8_K of mid, down, slot sum.
inline void moe_gemm(const moe_gemm_plan& plan, const moe_gemm_args& a, void* workspace, cudaStream_t stream) {
    const int cap = plan.capacity();
    const moe_gemm_shape& s = plan.shape();
    const int n_rows = a.live_rows ? cap : a.n_rows;
    require(n_rows >= 1 && n_rows <= cap, "moe_gemm: n_rows " + std::to_string(n_rows) + " outside 1..capacity");
    require(a.xn && a.sel && a.wts && a.out && a.gate_q && a.gate_d && a.up_q && a.up_d && a.down_q && a.down_dd,
            "moe_gemm: a null input, weight or output");
    require(a.x_stride >= s.n_embd && a.x_stride % 4 == 0 && a.out_stride >= s.n_embd,
            "moe_gemm: x_stride must be >= n_embd and a multiple of 4, out_stride >= n_embd");
    require(workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % 256 == 0,
            "moe_gemm: the workspace (plan.workspace_bytes()) must be given and 256-byte aligned");
    moe_gemm_launch L;
    L.shape = s;
    L.capacity = cap;
    L.n_rows = n_rows;
    L.a = a;
    L.w = plan.carve(workspace).first;
    L.max_items = moe_gemm_max_items(cap, s.n_expert);
    raise_smem_limit(moe_gemm_gate_up_kernel<>, moe_gemm_detail::gu_smem, "moe_gemm gate/up", stream);
    raise_smem_limit(moe_gemm_down_kernel<>, moe_gemm_detail::down_smem, "moe_gemm down", stream);
    launch_kernel("moe_gemm_sort_kernel", moe_gemm_sort_kernel<>, 1, moe_gemm_sort_threads, 0, stream, L);
    cuda_check_launch("moe_gemm sort");
    launch_kernel("moe_gemm_quantize_kernel", moe_gemm_quantize_kernel<>,
                  dim3(unsigned((s.n_embd / 256 + 7) / 8), unsigned(n_rows)), 256, 0, stream, a.xn, a.x_stride, s.n_embd,
                  L.w.xq, L.w.xq_d, nullptr, a.live_rows, n_rows, 1);
    cuda_check_launch("moe_gemm quantize x");
    const unsigned items = unsigned(L.max_items);
    if (plan.gate_up_wgmma() || plan.down_wgmma()) {
        const int dev = current_device();
        require_prepared(moe_gemm_wgmma_availability().ready(dev), stream, "moe_gemm wgmma kernels", "prepare_moe_gemm");
        require(moe_gemm_wgmma_available_on(dev), "moe_gemm: the plan asks for the wgmma kernels, which device " +
                                                      std::to_string(dev) + " cannot run (they need sm_90a code and " +
                                                      std::to_string(moe_gemm_wgmma_detail::down_smem) + " bytes of shared memory a CTA)");
    }
    if (plan.gate_up_wgmma()) {
        raise_smem_limit(moe_gemm_gate_up_wgmma_kernel<>, moe_gemm_wgmma_detail::gu_smem, "moe_gemm wgmma gate/up", stream);
        launch_kernel("moe_gemm_gate_up_wgmma_kernel", moe_gemm_gate_up_wgmma_kernel<>,
                      dim3(unsigned((s.n_ff + 63) / 64), items), moe_gemm_threads, moe_gemm_wgmma_detail::gu_smem, stream, L);
    } else if (plan.gate_up_regs()) {
        raise_smem_limit(moe_gemm_gate_up_regs_kernel<>, moe_gu_regs_detail::smem, "moe_gemm gate/up regs", stream);
        launch_kernel("moe_gemm_gate_up_regs_kernel", moe_gemm_gate_up_regs_kernel<>, dim3(unsigned((s.n_ff + 63) / 64), items),
                      moe_gu_regs_threads, moe_gu_regs_detail::smem, stream, L);
    } else {
        launch_kernel("moe_gemm_gate_up_kernel", moe_gemm_gate_up_kernel<>, dim3(unsigned((s.n_ff + 63) / 64), items),
                      moe_gemm_threads, moe_gemm_detail::gu_smem, stream, L);
    }
    cuda_check_launch("moe_gemm gate/up");
    launch_kernel("moe_gemm_quantize_kernel", moe_gemm_quantize_kernel<>,
                  dim3(unsigned((s.n_ff / 256 + 7) / 8), unsigned(n_rows * moe_slots)), 256, 0, stream, L.w.mid, s.n_ff,
                  s.n_ff, L.w.midq, L.w.midq_d, L.w.midq_bsums, a.live_rows, n_rows, moe_slots);
    cuda_check_launch("moe_gemm quantize mid");
    if (plan.down_wgmma()) {
        raise_smem_limit(moe_gemm_down_wgmma_kernel<>, moe_gemm_wgmma_detail::down_smem, "moe_gemm wgmma down", stream);
        launch_kernel("moe_gemm_down_wgmma_kernel", moe_gemm_down_wgmma_kernel<>, dim3(unsigned((s.n_embd + 127) / 128), items),
                      moe_gemm_threads, moe_gemm_wgmma_detail::down_smem, stream, L);
    } else if (plan.down_regs()) {
        raise_smem_limit(moe_gemm_down_regs_kernel<>, moe_down_regs_detail::smem, "moe_gemm down regs", stream);
        launch_kernel("moe_gemm_down_regs_kernel", moe_gemm_down_regs_kernel<>, dim3(unsigned((s.n_embd + 127) / 128), items),
                      moe_down_regs_threads, moe_down_regs_detail::smem, stream, L);
    } else {
        launch_kernel("moe_gemm_down_kernel", moe_gemm_down_kernel<>, dim3(unsigned((s.n_embd + 127) / 128), items),
                      moe_gemm_threads, moe_gemm_detail::down_smem, stream, L);
    }
    cuda_check_launch("moe_gemm down");
    launch_kernel("moe_gemm_slot_sum_kernel", moe_gemm_slot_sum_kernel<>,
                  dim3(unsigned((s.n_embd + 255) / 256), unsigned(n_rows)), 256, 0, stream, L);
    cuda_check_launch("moe_gemm slot sum");
}

}  // namespace ds4::kernels
