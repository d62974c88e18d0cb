#pragma once
// The grouped MoE's gate/up and down (moe_gemm.cuh) on sm_90a warpgroup MMA: same contract
// (exact, every output equal to reference/moe's moe_routed bit for bit), same grids, work items,
// CTA tiles (gate/up: 64 f-rows of gate and of up x 64 pairs; down: 128 output rows x 64 pairs),
// decodes and epilogues as the mma.sync kernels; only the multiply changes. Why: the mma.sync
// loops issue ~12 instructions per m16n8k32 (gate/up: four IMAD for the sub-block scale, the A, B
// and scale loads) and run at ~0.5 instructions a clock per scheduler (bench/NOTES.md, twelfth
// session): 11-12% of the int8 peak. A wgmma m64n32k32 reads both operands from shared memory.
//
// Four warpgroups (moe_gemm_wgmma_layout.hpp): row half (gate or up; output rows 0-63 or 64-127)
// x pairs 0..31 or 32..63, 16 accumulators a thread. A warpgroup whose pairs are all past the group
// skips its multiply. Every thread decodes block b + 1 (into the core-matrix layout) while block
// b's wgmma run (run_blocks).
//   gate/up: the weights times their sub-block scale 2s + 1 (<= 1333) decode as two int8 digit
//     operands, 64 * hi + lo (moe_block_dot.hpp's split; four PRMT per 8 weights), so the 8
//     sub-blocks of a block chain on one accumulator per digit: 16 wgmma a block and no multiply
//     by the scale (the first form ran a fresh D per sub-block and 16 IMAD of bsum += sumi * (2s
//     + 1) after each, 128 a block, and was slower than the mma.sync kernel: twenty-ninth session).
//     bsum = 64 * hi + lo is the same integer, so the chain is the reference's.
//   down: the 8 k-steps of a block chained on one accumulator (q * scale <= 45 decoded), the min
//     term one u8 x s8 wgmma of [mins | 16 mins] against [16-sums & 15 | 16-sums >> 4].
// Operands written by threads (the decodes) or landed by cp.async are made visible to the async
// proxy (fence.proxy.async) before the barrier that precedes their wgmma.
// Only compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); moe_gemm_wgmma_available_on(device) tells
// the host. STATUS: emulated on the CPU (tests/moe_gemm_wgmma_emulation_test.cpp); down and the
// first gate/up form ran exact on an H100 (twenty-ninth session), the split gate/up is waiting
// for a GPU (plan options set_gate_up_wgmma / set_down_wgmma; DS4_MOE_WGMMA in the backend).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/per_device.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_gemm_down_parts.cuh"
#include "ds4/kernels/moe_gemm_gate_up_parts.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"
#include "ds4/kernels/moe_gemm_wgmma_layout.hpp"
#include "ds4/kernels/wgmma_operand.hpp"
#include "ds4/kernels/wgmma.cuh"
#include "ds4/kernels/wgmma_s8.cuh"

namespace ds4::kernels {

namespace moe_gemm_wgmma_detail {

// Four stages (down): the raw weights of block b + 1 are decoded while block b multiplies, so a
// stage is consumed one block after it lands; four keep two blocks of loads in flight behind that.
// Gate/up's two digit operands per matrix take the room of its fourth stage (three: one block of
// loads in flight beside the one being decoded).
inline constexpr int stages = 4, gu_wg_stages = 3;

struct wg_gu_stage {
    alignas(16) std::uint8_t act[wg_operand_bytes];  // the pairs' Q8_K block (wgmma B)
    alignas(16) std::uint8_t raw[4][moe_gemm_detail::gu_tile_bytes];  // tiles 0, 1 gate, 2, 3 up
    float xd[moe_gemm_pairs_cta];
    std::uint32_t d2[4 * 32];  // the aligned word holding each row's F16 d
};
struct wg_gu_shared {
    union {
        wg_gu_stage st[gu_wg_stages];
        float res[2][moe_gemm_pairs_cta][64];  // gate and up results of the f-tile (after the loop)
    } u;
    // [block % 2][gate, up][hi, lo]: the decoded rows times their sub-block scales as two digit
    // operands (wgmma A), 64 * hi + lo (moe_block_dot.hpp's split).
    alignas(16) std::uint8_t w[2][2][2][wg_operand_bytes];
    float wd[2][4 * 32];  // F16 d of each row's block
    std::int32_t row[moe_gemm_pairs_cta];
    iq2_xxs_split_words split[16];  // PRMT sources of each scale nibble
    moe_gemm_detail::iq2_sel_tables sel;
};
inline constexpr int gu_smem = int(sizeof(wg_gu_shared));
static_assert(gu_smem <= 232448, "moe_gemm wgmma gate/up: a CTA's shared memory must fit sm_90's 227 KiB opt-in");
static_assert(moe_gemm_pairs_cta == wg_rows && moe_gemm_threads == 4 * 128, "four warpgroups on a 64 x 64 tile");

// Down: the stage holds the pairs' midq block, the four tiles' Q2_K block as stored, the pairs'
// 16-sums and scales, the rows' d | dmin words.
struct wg_down_stage {
    alignas(16) std::uint8_t act[wg_operand_bytes];  // wgmma B
    alignas(16) std::uint8_t raw[4][moe_gemm_detail::down_tile_bytes];
    alignas(16) std::int16_t bsums[moe_gemm_pairs_cta][16];
    float xd[moe_gemm_pairs_cta];
    std::uint32_t dd[4 * 32];
};
struct wg_down_shared {
    wg_down_stage st[stages];
    alignas(16) std::uint8_t w[2][2][wg_operand_bytes];  // [block % 2][row half] q * scale (wgmma A)
    // The min term's operands, 64 x 32 bytes in the same layout (chunks 0 and 1): per row half
    // [16 mins | 16 x mins] (u8 A), per pair [16-sums & 15 | 16-sums >> 4] (s8 B).
    alignas(16) std::uint8_t mins[2][2][wg_rows * 32];
    alignas(16) std::uint8_t bs[2][wg_rows * 32];
    float dd[2][4 * 32][2];  // d, dmin of each row
    std::int32_t pair[moe_gemm_pairs_cta];
};
inline constexpr int down_smem = int(sizeof(wg_down_shared));
static_assert(down_smem <= 232448, "moe_gemm wgmma down: a CTA's shared memory must fit sm_90's 227 KiB opt-in");

// A thread's activation copies, formed once: two 16-byte pieces (wg_copy_row / piece) as
// element offsets of block 0 in the Q8_K rows and their places in the operand, and the scale of
// pair threadIdx.x (threads < 64).
struct wg_act_sources {
    static constexpr int copies = moe_gemm_pairs_cta * 16 / moe_gemm_threads;
    std::uint32_t src[copies];
    int dst[copies];
    bool live[copies];
    std::uint32_t d;
};
__device__ __forceinline__ wg_act_sources wg_act_sources_of(const std::int32_t* rows_of, int count, int row_bytes, int nb) {
    wg_act_sources a;
#pragma unroll
    for (int i = 0; i < wg_act_sources::copies; ++i) {
        const int c = int(threadIdx.x) + i * moe_gemm_threads, p = wg_copy_row(c), piece = wg_copy_chunk(c);
        a.live[i] = p < count;
        a.src[i] = std::uint32_t(a.live[i] ? rows_of[p] : 0) * std::uint32_t(row_bytes) + std::uint32_t(piece) * 16u;
        a.dst[i] = wg_offset(p, piece);
    }
    const int p = int(threadIdx.x) % moe_gemm_pairs_cta;
    a.d = std::uint32_t(p < count ? rows_of[p] : 0) * std::uint32_t(nb);
    return a;
}
// Block b of the pairs' rows (quants, scales) into a stage; pairs past the group zero-filled (their
// products are zero and never stored).
__device__ __forceinline__ void issue_wg_acts(const std::int8_t* q, const float* d, const wg_act_sources& a, int count, int b,
                                              std::uint8_t* act, float* xd) {
#pragma unroll
    for (int i = 0; i < wg_act_sources::copies; ++i) cp_async::zfill<16>(act + a.dst[i], q + a.src[i] + std::uint32_t(b) * 256u, a.live[i]);
    if (threadIdx.x < moe_gemm_pairs_cta) cp_async::zfill<4>(&xd[threadIdx.x], d + a.d + std::uint32_t(b), int(threadIdx.x) < count);
}

// The block loop of both kernels: `Stages - 1` blocks in flight through the cp.async ring, block
// b + 1 decoded while block b multiplies. multiply(b, decode_next) calls decode_next() once,
// between its wgmma issue and wait. At each barrier blocks up to b + 1 have landed, block b's
// decode is written, and every warpgroup is done with block b - 1 (its decode buffer and stage),
// so block b + Stages - 1 lands in that stage and block b + 1 decodes into that buffer. Landed copies and
// decode stores reach the async proxy through each writer's fence before the barrier.
template <int Stages, class Issue, class Decode, class Multiply>
__device__ __forceinline__ void run_blocks(int nb, Issue&& issue, Decode&& decode, Multiply&& multiply) {
    static_assert(Stages >= 3, "block b + 1 decodes while block b multiplies: two stages held, one landing");
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
        if (s < nb) issue(s, s);
        cp_async::commit();
    }
    cp_async::wait<Stages - 2>();
    __syncthreads();  // block 0 landed
    decode(0);
    for (int b = 0; b < nb; ++b) {
        cp_async::wait<Stages - 3>();
        wgmma_detail::fence_proxy_async();
        __syncthreads();
        if (b + Stages - 1 < nb) issue(b + Stages - 1, (b + Stages - 1) % Stages);
        cp_async::commit();
        multiply(b, [&] {
            if (b + 1 < nb) decode(b + 1);
        });
    }
    cp_async::wait<0>();
}

}  // namespace moe_gemm_wgmma_detail

template <int = 0>
__global__ void __launch_bounds__(moe_gemm_threads, 1)
    moe_gemm_gate_up_wgmma_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace moe_gemm_detail;
    using namespace moe_gemm_wgmma_detail;
    namespace wg = wgmma_detail;
    extern __shared__ int4 moe_gemm_wgmma_smem[];
    const work_item it = item_of(L);
    if (it.e < 0) return;
    const int e = it.e, first = it.first + it.p0, count = it.count;
    const int n_embd = L.shape.n_embd, nb = n_embd / 256;
    auto& sm = *reinterpret_cast<wg_gu_shared*>(moe_gemm_wgmma_smem);
    load_pair_rows(L, first, count, sm.row);
    fill_sel_tables(sm.sel);
    if (threadIdx.x < 16) sm.split[threadIdx.x] = iq2_xxs_split_words_of(int(threadIdx.x));
    __syncthreads();
    const int f0 = int(blockIdx.x) * 64;  // n_ff % 256 == 0: every tile row exists
    // This thread's copies, formed once: its weight chunk and scale word (as the mma.sync kernel),
    // and two activation pieces (wg_copy_row / piece) whose sources are element offsets of
    // block 0.
    const gate_up_sources wsrc = gate_up_sources_of(L, e, f0);
    const wg_act_sources asrc = wg_act_sources_of(sm.row, count, n_embd, nb);
    // Stage s <- block b: the 4 tiles' 2 KiB blocks, each row's scale word, the pairs' activations
    // (pairs past the group zero-filled: their products are zero and never stored).
    auto issue = [&](int b, int s) {
        wg_gu_stage& st = sm.u.st[s];
        issue_gate_up_weights(L, wsrc, b, st.raw, st.d2);
        issue_wg_acts(L.w.xq, L.w.xq_d, asrc, count, b, st.act, st.xd);
    };

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4, wv = warp % 4;
    const moe_wg_role role = moe_wg_role_of(warp / 4);
    const bool active = moe_wg_n * role.ph < count;  // uniform over the warpgroup
    const gate_up_task task = gate_up_task_of(warp, lane);
    // Block b's weight tiles times their sub-block scales, decoded from its stage into buffer b % 2
    // as the two digit operands in the core-matrix layout.
    auto decode = [&](int b) {
        const wg_gu_stage& st = sm.u.st[b % gu_wg_stages];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int tt = task.tile0 + k, r = 32 * (tt % 2) + task.row;
            const uint2 v = task_bytes(st.raw, tt, task);
            std::uint32_t hi[8], lo[8];
            decode_sub_block_split(sm.sel, sm.split[v.y >> 28], v, task.copy4, hi, lo);
            std::uint8_t* dh = &sm.w[b % 2][tt / 2][0][0];
            std::uint8_t* dl = &sm.w[b % 2][tt / 2][1][0];
            *reinterpret_cast<uint4*>(dh + wg_offset(r, 2 * task.ib)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            *reinterpret_cast<uint4*>(dh + wg_offset(r, 2 * task.ib + 1)) = make_uint4(hi[4], hi[5], hi[6], hi[7]);
            *reinterpret_cast<uint4*>(dl + wg_offset(r, 2 * task.ib)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            *reinterpret_cast<uint4*>(dl + wg_offset(r, 2 * task.ib + 1)) = make_uint4(lo[4], lo[5], lo[6], lo[7]);
            if (task.ib == 0) sm.wd[b % 2][tt * 32 + task.row] = block_d(st.d2[tt * 32 + task.row], b);
        }
    };

    // Rows of this thread's accumulators in the CTA's 128 weight rows (x % 4 < 2: r0, else r0 + 8).
    const int r0 = 64 * role.h + 16 * wv + g;
    int dh[16], dl[16];
    float sumf[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) dh[i] = dl[i] = 0, sumf[i] = 0.0f;

    run_blocks<gu_wg_stages>(nb, issue, decode, [&](int b, auto&& decode_next) {
        const wg_gu_stage& st = sm.u.st[b % gu_wg_stages];
        const int buf = b % 2;
        const std::uint64_t dah = wg::smem_desc(&sm.w[buf][role.h][0][0], wg_lbo, wg_sbo);
        const std::uint64_t dal = wg::smem_desc(&sm.w[buf][role.h][1][0], wg_lbo, wg_sbo);
        const std::uint64_t db = wg::smem_desc(st.act + wg_offset(moe_wg_n * role.ph, 0), wg_lbo, wg_sbo);
        constexpr std::uint64_t step = wg_kstep_bytes >> 4;  // a k-step in the descriptors' address field
        if (!active) {
            decode_next();
        } else {
            // The block's 8 sub-blocks chain on one accumulator per digit: 16 wgmma in flight while
            // this thread decodes the next block.
            wg::fence();
            wg::mma_m64n32k32<0>(dh, dah, db);
#pragma unroll
            for (int ib = 1; ib < 8; ++ib) wg::mma_m64n32k32<1>(dh, dah + step * ib, db + step * ib);
            wg::mma_m64n32k32<0>(dl, dal, db);
#pragma unroll
            for (int ib = 1; ib < 8; ++ib) wg::mma_m64n32k32<1>(dl, dal + step * ib, db + step * ib);
            wg::commit();
            decode_next();
            wg::wait<0>();
            wg::pin(dh);
            wg::pin(dl);
            // The block's float chain, as the reference: sumf += (d_w * d_x) * bsum, bsum = 64 hi + lo.
            const float wd0 = sm.wd[buf][r0], wd1 = sm.wd[buf][r0 + 8];
#pragma unroll
            for (int x = 0; x < 16; ++x) {
                const int bsum = dh[x] * 64 + dl[x];
                const float dd = mul_rn(x % 4 < 2 ? wd0 : wd1, st.xd[moe_wg_n * role.ph + wg_acc_col(t, x)]);
                sumf[x] = add_rn(sumf[x], mul_rn(dd, float(bsum)));
            }
        }
    });
    __syncthreads();  // the ring is free: res overlays it
    // Gate and up of one (row, pair) meet in shared memory.
    float* sres = &sm.u.res[0][0][0];  // [2][pair][64]
#pragma unroll
    for (int x = 0; x < 16; ++x) {
        const int fr = wg_acc_row(wv, g, x), pr = moe_wg_n * role.ph + wg_acc_col(t, x);
        sres[(role.h * moe_gemm_pairs_cta + pr) * 64 + fr] = mul_rn(0.125f, sumf[x]);
    }
    __syncthreads();
    gate_up_finish(L, sres, first, count, f0);
#else
    (void)L;
#endif
}

// Down of one expert on warpgroup MMA: CTA (128 output rows, 64 pairs, expert), as
// moe_gemm_down_kernel. Warpgroup (row half h, pair half ph) chains the 8 k-steps of a block into
// isum on one accumulator (the Q2_K quants decode to q * scale <= 45, so no per-step scale), and
// the min term is one u8 x s8 wgmma of [mins | 16 mins] against [16-sums & 15 | 16-sums >> 4]
// (moe_gemm_down_parts.cuh). Every thread decodes block b + 1 while block b's wgmma run.
template <int = 0>
__global__ void __launch_bounds__(moe_gemm_threads, 1)
    moe_gemm_down_wgmma_kernel(const __grid_constant__ moe_gemm_launch L) {
    pdl_enter();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace moe_gemm_detail;
    using namespace moe_gemm_wgmma_detail;
    namespace wg = wgmma_detail;
    extern __shared__ int4 moe_gemm_wgmma_smem[];
    const work_item it = item_of(L);
    if (it.e < 0) return;
    const int e = it.e, first = it.first + it.p0, count = it.count;
    const int n_embd = L.shape.n_embd, n_ff = L.shape.n_ff, nb = n_ff / 256;
    auto& sm = *reinterpret_cast<wg_down_shared*>(moe_gemm_wgmma_smem);
    load_pairs(L, first, count, sm.pair);
    __syncthreads();
    const int o0 = int(blockIdx.x) * 128;  // n_embd % 256 == 0: every tile row exists
    const down_sources wsrc = down_sources_of(L, e, o0, sm.pair, count);
    const wg_act_sources asrc = wg_act_sources_of(sm.pair, count, n_ff, nb);
    auto issue = [&](int b, int s) {
        wg_down_stage& st = sm.st[s];
        issue_down_weights(L, wsrc, b, count, st.raw, st.dd, st.bsums);
        issue_wg_acts(L.w.midq, L.w.midq_d, asrc, count, b, st.act, st.xd);
    };

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4, wv = warp % 4;
    const moe_wg_role role = moe_wg_role_of(warp / 4);
    const bool active = moe_wg_n * role.ph < count;  // uniform over the warpgroup
    // Block b's tiles into buffer b % 2: warp w decodes sub-block w % 8 of tiles 2 (w / 8) and
    // 2 (w / 8) + 1, lane = row; threads < 128 also form one (pair, chunk) of the min term's B.
    auto decode = [&](int b) {
        const wg_down_stage& st = sm.st[b % stages];
        const int buf = b % 2, ib = warp % 8, row = lane;
#pragma unroll
        for (int kt = 0; kt < 2; ++kt) {
            const int tt = 2 * (warp / 8) + kt, r = 32 * (tt % 2) + row;
            const uint4 sc = q2_k_scales(st.raw[tt], row);
            std::uint8_t* dst = &sm.w[buf][tt / 2][0];
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<uint4*>(dst + wg_offset(r, 2 * ib + h)) = decode_q2_k_half(st.raw[tt], sc, row, ib, h);
            if (ib == 0) {
                *reinterpret_cast<uint4*>(&sm.mins[buf][tt / 2][wg_offset(r, 0)]) = q2_k_mins(sc);
                *reinterpret_cast<uint4*>(&sm.mins[buf][tt / 2][wg_offset(r, 1)]) = q2_k_mins16(sc);
                const std::uint32_t dv = st.dd[tt * 32 + row];
                sm.dd[buf][tt * 32 + row][0] = f16_operand(std::uint16_t(dv & 0xffffu));
                sm.dd[buf][tt * 32 + row][1] = f16_operand(std::uint16_t(dv >> 16));
            }
        }
        if (threadIdx.x < 2 * moe_gemm_pairs_cta) {
            const int p = int(threadIdx.x) % moe_gemm_pairs_cta, hi = int(threadIdx.x) / moe_gemm_pairs_cta;
            const uint4 a = *reinterpret_cast<const uint4*>(&st.bsums[p][0]), c = *reinterpret_cast<const uint4*>(&st.bsums[p][8]);
            const uint2 v0 = make_uint2(a.x, a.y), v1 = make_uint2(a.z, a.w), v2 = make_uint2(c.x, c.y), v3 = make_uint2(c.z, c.w);
            const uint4 out = hi ? make_uint4(bsums_hi(v0), bsums_hi(v1), bsums_hi(v2), bsums_hi(v3))
                                 : make_uint4(bsums_lo(v0), bsums_lo(v1), bsums_lo(v2), bsums_lo(v3));
            *reinterpret_cast<uint4*>(&sm.bs[buf][wg_offset(p, hi)]) = out;
        }
    };

    int isum[16], summs[16];
    float sumf[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) isum[i] = summs[i] = 0, sumf[i] = 0.0f;
    run_blocks<stages>(nb, issue, decode, [&](int b, auto&& decode_next) {
        const wg_down_stage& st = sm.st[b % stages];
        const int buf = b % 2;
        if (!active) {
            decode_next();
        } else {
            const std::uint64_t da = wg::smem_desc(&sm.w[buf][role.h][0], wg_lbo, wg_sbo);
            const std::uint64_t db = wg::smem_desc(st.act + wg_offset(moe_wg_n * role.ph, 0), wg_lbo, wg_sbo);
            const std::uint64_t dm = wg::smem_desc(&sm.mins[buf][role.h][0], wg_lbo, wg_sbo);
            const std::uint64_t dbs = wg::smem_desc(&sm.bs[buf][wg_offset(moe_wg_n * role.ph, 0)], wg_lbo, wg_sbo);
            constexpr std::uint64_t step = wg_kstep_bytes >> 4;
            wg::fence();
            wg::mma_m64n32k32<0>(isum, da, db);
#pragma unroll
            for (int ib = 1; ib < 8; ++ib) wg::mma_m64n32k32<1>(isum, da + step * ib, db + step * ib);
            wg::mma_m64n32k32<0, true>(summs, dm, dbs);
            wg::commit();
            decode_next();
            wg::wait<0>();
            wg::pin(isum);
            wg::pin(summs);
            // The block's float chain, as the reference: sumf += dall * isum - dmin * summs.
#pragma unroll
            for (int x = 0; x < 16; ++x) {
                const int wr = 64 * role.h + wg_acc_row(wv, g, x);
                const float xd = st.xd[moe_wg_n * role.ph + wg_acc_col(t, x)];
                const float dall = mul_rn(xd, sm.dd[buf][wr][0]), dmin = mul_rn(xd, sm.dd[buf][wr][1]);
                sumf[x] = add_rn(sumf[x], sub_rn(mul_rn(dall, float(isum[x])), mul_rn(dmin, float(summs[x]))));
            }
        }
    });
#pragma unroll
    for (int x = 0; x < 16; ++x) {
        const int o = o0 + 64 * role.h + wg_acc_row(wv, g, x), pr = moe_wg_n * role.ph + wg_acc_col(t, x);
        if (pr < count) L.w.ys[std::size_t(sm.pair[pr]) * n_embd + o] = sumf[x];
    }
#else
    (void)L;
#endif
}

// Whether `device` runs the wgmma kernels: sm_90a code in this build and the shared memory opt-in
// their CTAs need. Asked once per device (prepare_moe_gemm), never during a capture.
inline bool moe_gemm_wgmma_probe(int dev) {
    const int need = moe_gemm_wgmma_detail::gu_smem > moe_gemm_wgmma_detail::down_smem ? moe_gemm_wgmma_detail::gu_smem
                                                                                         : moe_gemm_wgmma_detail::down_smem;
    return wgmma_detail::smem_optin(dev) >= std::size_t(need) && wgmma_detail::runs_wgmma_code(dev);
}
inline per_device_once<bool>& moe_gemm_wgmma_availability() {
    static per_device_once<bool> a;
    return a;
}
inline bool moe_gemm_wgmma_available_on(int device) { return moe_gemm_wgmma_availability().get(device, moe_gemm_wgmma_probe); }

}  // namespace ds4::kernels
