#pragma once
// The grouped MoE's gate/up (moe_gemm.cuh) on sm_90a warpgroup MMA: same contract (exact, every
// output equal to reference/moe's moe_routed bit for bit), same grid, work items, CTA tile (64
// f-rows of gate and of up x 64 pairs) and epilogue as moe_gemm_gate_up_kernel; only the multiply
// changes. Why: the mma.sync loop issues ~12 instructions per m16n8k32 (four IMAD for the
// sub-block scale, the A, B and scale loads) and runs at ~0.5 instructions a clock per scheduler
// (bench/NOTES.md, twelfth session): 11-12% of the int8 peak. A wgmma m64n32k32 reads both
// operands from shared memory, so per 16 x 32 x 32 of a warp the loop is one wgmma, two scale
// loads and the 16 IMAD of bsum += sumi * (2s + 1), the one part every exact form keeps (the
// scale multiplies an integer sub-block sum; folding it into the weights would need 11-bit
// operands).
//
// Warpgroup wg (moe_gemm_wgmma_layout.hpp): gate or up rows (64) x pairs 0..31 or 32..63, 16
// accumulators a thread, a fresh D per sub-block (scale-d 0) in two register sets so that the
// wgmma of sub-block ib + 1 runs while the IMAD of sub-block ib do. A warpgroup whose pairs are
// all past the group skips its multiply. Every thread decodes block b + 1 (the same IQ2_XXS
// selector decode as the mma.sync kernel, into the core-matrix layout) while the first wgmma of
// block b runs. Operands written by threads (the decode) or landed by cp.async are made visible to
// the async proxy (fence.proxy.async) before the barrier that precedes their wgmma.
// Only compiled for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); moe_gemm_wgmma_available_on(device) tells
// the host. STATUS: built, not yet run on a GPU (DS4_MOE_WGMMA=1 selects it in the backend).
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
#include "ds4/kernels/moe_gemm_gate_up_parts.cuh"
#include "ds4/kernels/moe_gemm_launch.cuh"
#include "ds4/kernels/moe_gemm_wgmma_layout.hpp"
#include "ds4/kernels/wgmma.cuh"

namespace ds4::kernels {

namespace moe_gemm_wgmma_detail {

// Four stages: the raw weights of block b + 1 are decoded while block b multiplies, so a stage is
// consumed one block after it lands; four keep two blocks of loads in flight behind that.
inline constexpr int stages = 4;

struct stage {
    alignas(16) std::uint8_t act[moe_wg_operand_bytes];  // the pairs' Q8_K block (wgmma B)
    alignas(16) std::uint8_t raw[4][moe_gemm_detail::gu_tile_bytes];  // tiles 0, 1 gate, 2, 3 up
    float xd[moe_gemm_pairs_cta];
    std::uint32_t d2[4 * 32];  // the aligned word holding each row's F16 d
};
struct shared {
    union {
        stage st[stages];
        float res[2][moe_gemm_pairs_cta][64];  // gate and up results of the f-tile (after the loop)
    } u;
    alignas(16) std::uint8_t w[2][2][moe_wg_operand_bytes];  // [block % 2][gate, up] decoded rows (wgmma A)
    int ls[2][4 * 32][9];                                     // 2s + 1 of each row's sub-blocks (padded)
    float wd[2][4 * 32];                                      // F16 d of each row's block
    std::int32_t row[moe_gemm_pairs_cta];
    moe_gemm_detail::iq2_sel_tables sel;
};
inline constexpr int smem = int(sizeof(shared));
static_assert(smem <= 232448, "moe_gemm wgmma gate/up: a CTA's shared memory must fit sm_90's 227 KiB opt-in");
static_assert(moe_gemm_pairs_cta == moe_wg_rows && moe_gemm_threads == 4 * 128, "four warpgroups on a 64 x 64 tile");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// D = A . B (scale-d 0: the sub-block's sums from zero), m64n32k32 s8 x s8 -> s32, both operands
// K-major in shared memory.
__device__ __forceinline__ void mma_m64n32k32(int (&d)[16], std::uint64_t da, std::uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]),
          "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
        : "l"(da), "l"(db)
        : "memory");
}
#endif

// After a wait: the accumulators are read only past this point (an empty asm that "writes" them,
// so the compiler cannot hoist their readers above the wgmma wait).
__device__ __forceinline__ void pin(int (&d)[16]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(d[i])::"memory");
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
    auto& sm = *reinterpret_cast<shared*>(moe_gemm_wgmma_smem);
    load_pair_rows(L, first, count, sm.row);
    fill_sel_tables(sm.sel);
    __syncthreads();
    const int f0 = int(blockIdx.x) * 64;  // n_ff % 256 == 0: every tile row exists
    // This thread's copies, formed once: its weight chunk and scale word (as the mma.sync kernel),
    // and two activation pieces (moe_wg_copy_pair / piece) whose sources are element offsets of
    // block 0.
    const gate_up_sources wsrc = gate_up_sources_of(L, e, f0);
    constexpr int act_copies = moe_gemm_pairs_cta * 16 / moe_gemm_threads;
    std::uint32_t asrc[act_copies];
    int adst[act_copies];
    bool alive[act_copies];
#pragma unroll
    for (int i = 0; i < act_copies; ++i) {
        const int c = int(threadIdx.x) + i * moe_gemm_threads, p = moe_wg_copy_pair(c), piece = moe_wg_copy_piece(c);
        alive[i] = p < count;
        asrc[i] = std::uint32_t(alive[i] ? sm.row[p] : 0) * std::uint32_t(n_embd) + std::uint32_t(piece) * 16u;
        adst[i] = moe_wg_offset(p, piece);
    }
    const int xd_p = int(threadIdx.x) % moe_gemm_pairs_cta;
    const std::uint32_t xd_src = std::uint32_t(xd_p < count ? sm.row[xd_p] : 0) * std::uint32_t(nb);
    // Stage s <- block b: the 4 tiles' 2 KiB blocks, each row's scale word, the pairs' activations
    // (pairs past the group zero-filled: their products are zero and never stored).
    auto issue = [&](int b, int s) {
        stage& st = sm.u.st[s];
        issue_gate_up_weights(L, wsrc, b, st.raw, st.d2);
#pragma unroll
        for (int i = 0; i < act_copies; ++i)
            cp_async::zfill<16>(st.act + adst[i], L.w.xq + asrc[i] + std::uint32_t(b) * 256u, alive[i]);
        if (threadIdx.x < moe_gemm_pairs_cta)
            cp_async::zfill<4>(&st.xd[threadIdx.x], L.w.xq_d + xd_src + std::uint32_t(b), xd_p < count);
    };

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t = lane % 4, wv = warp % 4;
    const moe_wg_role role = moe_wg_role_of(warp / 4);
    const bool active = moe_wg_n * role.ph < count;  // uniform over the warpgroup
    const gate_up_task task = gate_up_task_of(warp, lane);
    // Block b's weight tiles, decoded from its stage into buffer b % 2 in the core-matrix layout.
    auto decode = [&](int b) {
        const stage& st = sm.u.st[b % stages];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int tt = task.tile0 + k, r = 32 * (tt % 2) + task.row;
            const uint2 v = task_bytes(st.raw, tt, task);
            std::uint32_t w[8];
            decode_sub_block(sm.sel, v, task.copy4, w);
            std::uint8_t* dst = &sm.w[b % 2][tt / 2][0];
            *reinterpret_cast<uint4*>(dst + moe_wg_offset(r, 2 * task.ib)) = make_uint4(w[0], w[1], w[2], w[3]);
            *reinterpret_cast<uint4*>(dst + moe_wg_offset(r, 2 * task.ib + 1)) = make_uint4(w[4], w[5], w[6], w[7]);
            sm.ls[b % 2][tt * 32 + task.row][task.ib] = sub_block_scale(v);
            if (task.ib == 0) sm.wd[b % 2][tt * 32 + task.row] = block_d(st.d2[tt * 32 + task.row], b);
        }
    };

    // Rows of this thread's accumulators in the CTA's 128 weight rows (x % 4 < 2: r0, else r0 + 8).
    const int r0 = 64 * role.h + 16 * wv + g;
    int d0[16], d1[16], bsum[16];
    float sumf[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) d0[i] = d1[i] = bsum[i] = 0, sumf[i] = 0.0f;
    // bsum (+)= d * (2s + 1) of sub-block ib; the first sub-block of a block starts it.
    auto scale_add = [&](const int(&d)[16], int buf, int ib) {
        const int ls0 = sm.ls[buf][r0][ib], ls1 = sm.ls[buf][r0 + 8][ib];
#pragma unroll
        for (int x = 0; x < 16; ++x) bsum[x] = (ib == 0 ? 0 : bsum[x]) + d[x] * (x % 4 < 2 ? ls0 : ls1);
    };

#pragma unroll
    for (int s = 0; s < stages - 1; ++s) {
        if (s < nb) issue(s, s);
        cp_async::commit();
    }
    cp_async::wait<stages - 2>();
    __syncthreads();  // block 0 landed
    decode(0);
    for (int b = 0; b < nb; ++b) {
        // Blocks up to b + 1 landed; block b's decode is written; every warpgroup is done with block
        // b - 1 (its tile buffer and stage), so block b + 3 lands in that stage and b + 1 decodes
        // into that buffer.
        cp_async::wait<stages - 3>();
        wg::fence_proxy_async();  // this thread's decode stores and landed copies, for the wgmma
        __syncthreads();
        if (b + stages - 1 < nb) issue(b + stages - 1, (b + stages - 1) % stages);
        cp_async::commit();
        const stage& st = sm.u.st[b % stages];
        const int buf = b % 2;
        const std::uint64_t da = wg::smem_desc(&sm.w[buf][role.h][0], moe_wg_lbo, moe_wg_sbo);
        const std::uint64_t db = wg::smem_desc(st.act + moe_wg_offset(moe_wg_n * role.ph, 0), moe_wg_lbo, moe_wg_sbo);
        constexpr std::uint64_t step = moe_wg_kstep_bytes >> 4;  // a k-step in the descriptors' address field
        if (!active) {
            if (b + 1 < nb) decode(b + 1);
        } else {
            wg::fence();
            mma_m64n32k32(d0, da, db);
            wg::commit();
            if (b + 1 < nb) decode(b + 1);
            // Sub-blocks in pairs: the wgmma of the next runs while this one's IMAD do.
#pragma unroll
            for (int ib = 0; ib < 8; ib += 2) {
                wg::fence();
                mma_m64n32k32(d1, da + step * (ib + 1), db + step * (ib + 1));
                wg::commit();
                wg::wait<1>();
                pin(d0);
                scale_add(d0, buf, ib);
                if (ib + 2 < 8) {
                    wg::fence();
                    mma_m64n32k32(d0, da + step * (ib + 2), db + step * (ib + 2));
                    wg::commit();
                    wg::wait<1>();
                } else {
                    wg::wait<0>();
                }
                pin(d1);
                scale_add(d1, buf, ib + 1);
            }
            // The block's float chain, as the reference: sumf += (d_w * d_x) * bsum.
#pragma unroll
            for (int x = 0; x < 16; ++x) {
                const float wd = sm.wd[buf][r0 + 8 * ((x % 4) / 2)];
                const float dd = mul_rn(wd, st.xd[moe_wg_n * role.ph + moe_wg_acc_pair(t, x)]);
                sumf[x] = add_rn(sumf[x], mul_rn(dd, float(bsum[x])));
            }
        }
    }
    cp_async::wait<0>();
    __syncthreads();  // the ring is free: res overlays it
    // Gate and up of one (row, pair) meet in shared memory.
    float* sres = &sm.u.res[0][0][0];  // [2][pair][64]
#pragma unroll
    for (int x = 0; x < 16; ++x) {
        const int fr = moe_wg_acc_row(wv, g, x), pr = moe_wg_n * role.ph + moe_wg_acc_pair(t, x);
        sres[(role.h * moe_gemm_pairs_cta + pr) * 64 + fr] = mul_rn(0.125f, sumf[x]);
    }
    __syncthreads();
    gate_up_finish(L, sres, first, count, f0);
#else
    (void)L;
#endif
}

// Whether `device` runs moe_gemm_gate_up_wgmma_kernel: sm_90a code in this build and the shared
// memory opt-in its CTA needs. Asked once per device (prepare_moe_gemm), never during a capture.
inline bool moe_gemm_wgmma_probe(int dev) {
    return wgmma_detail::smem_optin(dev) >= std::size_t(moe_gemm_wgmma_detail::smem) && wgmma_detail::runs_wgmma_code(dev);
}
inline per_device_once<bool>& moe_gemm_wgmma_availability() {
    static per_device_once<bool> a;
    return a;
}
inline bool moe_gemm_wgmma_available_on(int device) { return moe_gemm_wgmma_availability().get(device, moe_gemm_wgmma_probe); }

}  // namespace ds4::kernels
