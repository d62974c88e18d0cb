#pragma once
// MoE FFN sublayer for decode and verify (docs/model.md §2.7), 1 to 16 activation rows:
//   router   logits = ffn_gate_inp . xn (F16, format/row_dot.hpp order); p = sqrt(softplus);
//            hash layers take tid2eid[token], others the biased top-6 (strict >, lower id wins
//            ties, slots by descending biased score); w_s = p_s / max(sum p, 2^-14) * 1.5
//   routed   xq = Q8_K(xn); per slot g = min(gate.xq, 10), u = clamp(up.xq, +-10) (IQ2_XXS),
//            mid = silu(g)*u*w_s, midq = Q8_K(mid), y_s = down.midq (Q2_K)
//   shared   Q8_0 gate+up (one matvec launch), mid = silu(min(g,10))*clamp(u,+-10), Q8_0 down
//   out      F = (sum over slots 0..5 in order, from 0.0f) + shared
//
// Contract: exact. Every output equals reference/moe (router_probs, route_top_k/route_hash,
// moe_routed, shared_expert) bit for bit. Each dot row is one lane's sequence of per-block
// integer dots; when the blocks of a row are spread over warps, the per-block terms
// (float(d_w*d_x) * float(isum)) go through shared memory and one lane adds them in block order.
// Inputs with NaN router logits select unspecified experts (the reference's insertion sort is
// not a total order there); everything else, NaN positions included, follows the reference.
//
// Expert ids never leave the device: the router writes slot tables that the expert items read.
// A "pair" is (row r, slot s), index 6r+s. The first pair naming an expert leads it: its items
// compute that expert's rows for every pair that names it (so an expert shared by several rows
// is streamed once), the others exit at once.
// Launches: three on the launch's stream, three beside them on the side stream (or all six in
// order on one stream):
//   main  router  (F16 router matvec + p; the last router CTA routes every row; Q8_K of xn; on
//                  sm_90 one cluster of 16 CTAs instead, CTA 0 routing from its shared memory)
//         experts (gate/up items, then down items, in one launch: see moe_schedule.hpp; the last
//                  gate/up CTA of a 256-row block quantizes it and counts it ready; a down item
//                  loads its first weights, then waits until its pair's 256-row blocks are ready)
//         finish  (slot sum + shared expert), after the side stream's join
//   side  shared gate+up matvec (Q8_0), shared SwiGLU, shared down matvec (Q8_0)
// The route was a separate single-CTA launch, and gate/up and down two launches: at one row the
// H200 spent 10.9 us in the route kernel (ncu) and ~3-5 us per dependent launch boundary, while
// the down weights (16.5 MB) could only start streaming once every gate/up CTA had finished.
// Graph contract: no allocation, no host synchronisation; token ids come from device memory, and
// so does the live row count of a captured step (launch's live_rows); scratch (one buffer from
// moe_decode_plan, zeroed once) holds counters that every launch leaves at zero; grids depend on
// the shapes and the row capacity only. moe_decode_plan::prepare(device) before capture.
// Shapes: n_embd, n_ff multiples of 256; n_expert <= 256; n_ff_shared multiple of 32.
// Bytes per step: 7,077,888 per distinct selected expert (tiled = GGUF size) + 28.8 MB router and
// shared expert. Parallelism: gate/up runs one CTA per (pair, 32-row tile) with the 16 blocks
// of a row split over 4 warps per matrix (a lane reloads each 16-byte piece of the next block
// as soon as it has decoded that piece of the current one), down one CTA per (pair, one or two
// 32-row output tiles: moe_schedule.hpp) with its 8 blocks over 8 warps, a lane holding one row
// of each tile, so even one row (6 experts) gives 384 + 768 items. Gate/up was measured at
// 830 GB/s (H200, ncu) with one shared copy of the 8-byte grid and sign-mask tables: random
// per-lane indices conflicted ~3-way per lookup. It now decodes from lane-private 32-bit
// selector tables (see the kernel) with two PRMTs and one dp4a per 4 weights. The experts
// launch holds 80 registers and 64 KB of shared memory: 3 CTAs per SM.
#include <cooperative_groups.h>
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/env_choice.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/core/smem_limit.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/check_in.cuh"
#include "ds4/kernels/cp_async.cuh"
#include "ds4/kernels/matvec.cuh"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_schedule.hpp"
#include "ds4/kernels/moe_weights.hpp"
#include "ds4/kernels/quantize_q8_k.cuh"

namespace ds4::kernels {

inline constexpr int moe_warps = 8;

// Scratch carved from one buffer by moe_decode_plan (every array 16-byte aligned).
struct moe_scratch {
    float* probs;             // [R][n_expert] sqrt(softplus(router logit))
    float* sh_g;              // [R][n_ff_shared]
    float* sh_u;
    float* sh_mid;
    float* sh_out;            // [R][n_embd]
    std::int32_t* sel;        // [6R]
    float* wts;               // [6R]
    std::int8_t* xq;          // [R][n_embd]
    float* xq_d;              // [R][n_embd/256]
    float* mid;               // [6R][n_ff]
    std::int8_t* midq;        // [6R][n_ff]
    float* midq_d;            // [6R][n_ff/256]
    std::int16_t* midq_bsums; // [6R][n_ff/16]
    float* ys;                // [6R][n_embd]
    unsigned* gu_counters;    // [6R][n_ff/256] gate/up CTAs done per 256-row block of mid
    unsigned* ready;          // [6R] 256-row blocks of the pair's midq quantized
    unsigned* seen;           // [6R] down items past their wait on `ready`
    unsigned* route_counter;  // [1] router CTAs done
    unsigned* ticket;         // [1] the experts launch's next ticket
    float* mv_partials;       // matvec split-K scratch of the shared expert's launches
    unsigned* mv_counters;
    std::size_t mv_partial_floats, mv_counter_count;
    float* side_partials;     // the shared expert's when it runs on a second stream
    unsigned* side_counters;
};

struct moe_expert_launch {
    moe_shape shape;
    int n_rows = 1;
    int capacity = 1;
    const std::int32_t* live_rows = nullptr;  // device live row count (captured steps); null: n_rows
    const std::int32_t* tokens = nullptr;  // [n_rows] device
    const float* xn = nullptr;             // xn[r * x_stride + i]
    int x_stride = 0;
    float* out = nullptr;                  // out[r * out_stride + o]
    int out_stride = 0;
    moe_weights w;
    moe_scratch s;
    int down_tiles = 1;  // 32-row output tiles per down item (moe_schedule.hpp), the plan's choice
    // The finish releases the next launch before its own wait (see moe_finish_kernel).
    bool finish_releases_early = false;
};

namespace detail {

// The rows a launch computes: read on the device when the step is captured with a live count.
__device__ __forceinline__ int live_rows(const moe_expert_launch& a) {
    return a.live_rows != nullptr ? min(*a.live_rows, a.capacity) : a.n_rows;
}

// Whether pair p leads its expert, and the pairs that name it (in pair order) into smem.
__device__ __forceinline__ bool collect_pairs(const std::int32_t* sel, int n_pairs, int p, int* match, int* n_match) {
    if (threadIdx.x == 0) {
        const int e = sel[p];
        bool lead = true;
        for (int q = 0; q < p; ++q) lead &= sel[q] != e;
        int n = 0;
        if (lead)
            for (int q = p; q < n_pairs; ++q)
                if (sel[q] == e) match[n++] = q;
        *n_match = n;
    }
    __syncthreads();
    return *n_match > 0;
}

// The top-6 (or the hash row) and the slot weights of row r by one warp, p = the row's router
// probabilities in shared memory. Six rounds of a warp argmax in moe_route_before's order give
// the reference's insertion-sort list; each lane keeps its 8 biased scores in registers across
// the rounds. bias: a.w.bias or a copy of it; hash_sel: the row's tid2eid entries read already
// (a hash layer), or null to read them here.
__device__ __forceinline__ void route_row_given(const moe_expert_launch& a, int r, const float* p, int lane,
                                                const float* bias, const std::int32_t* hash_sel) {
    const moe_shape& sh = a.shape;
    int sel[moe_slots];
    if (a.w.tid2eid) {
        if (hash_sel) {
            for (int s = 0; s < moe_slots; ++s) sel[s] = hash_sel[s];
        } else {
            const std::int32_t tok = a.tokens[r];
            for (int s = 0; s < moe_slots; ++s) sel[s] = a.w.tid2eid[std::size_t(tok) * moe_slots + s];
        }
    } else {
        constexpr int per_lane = moe_max_experts / 32;
        float v[per_lane];
#pragma unroll
        for (int k = 0; k < per_lane; ++k) {
            const int e = lane + 32 * k;
            v[k] = e >= sh.n_expert ? -__int_as_float(0x7f800000) : (bias ? add_rn(p[e], bias[e]) : p[e]);
        }
        unsigned taken = 0;  // bit k: expert lane + 32k already selected
        for (int s = 0; s < moe_slots; ++s) {
            float bv = -__int_as_float(0x7f800000);
            int be = 0x7fffffff;
#pragma unroll
            for (int k = 0; k < per_lane; ++k) {
                const int e = lane + 32 * k;
                if (e < sh.n_expert && !((taken >> k) & 1u) && moe_route_before(v[k], e, bv, be)) {
                    bv = v[k];
                    be = e;
                }
            }
            for (int off = 16; off > 0; off /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                const int oe = __shfl_xor_sync(0xffffffffu, be, off);
                if (moe_route_before(ov, oe, bv, be)) {
                    bv = ov;
                    be = oe;
                }
            }
            sel[s] = be;
            if (be % 32 == lane) taken |= 1u << (be / 32);
        }
    }
    if (lane == 0) {
        float ps[moe_slots], ws[moe_slots];
        for (int s = 0; s < moe_slots; ++s) ps[s] = p[sel[s]];
        moe_route_weights(ps, a.w.weight_scale, ws);
        for (int s = 0; s < moe_slots; ++s) {
            a.s.sel[r * moe_slots + s] = sel[s];
            a.s.wts[r * moe_slots + s] = ws[s];
        }
    }
    __syncwarp();
}

// The same from a.s.probs, through the warp's shared buffer p.
__device__ __forceinline__ void route_row(const moe_expert_launch& a, int r, float* p, int lane) {
    const moe_shape& sh = a.shape;
    for (int e = lane; e < sh.n_expert; e += 32) p[e] = __ldcg(a.s.probs + std::size_t(r) * sh.n_expert + e);
    __syncwarp();
    route_row_given(a, r, p, lane, a.w.bias, nullptr);
}

// IQ2_XXS gate and up for one 32-row tile of one expert: warps 0-3 gate, 4-7 up, each a quarter
// of the 256-blocks of the row. The last CTA of a 256-row block quantizes mid to Q8_K and counts
// the block ready for the pair's down items.
// Decode tables (moe_block_dot.hpp): grid selectors [256] and sign selectors [128], 32-bit,
// one copy per lane at word entry*32 + lane, so a lane reads only its own bank and the random
// per-lane indices never conflict (one wavefront per lookup; one shared copy cost ~3 per 8-byte
// lookup, the limit the first ncu profile showed). 48 KB per CTA, 3 CTAs per H200 SM.
inline constexpr int moe_gu_grid_words = 256 * 32;
inline constexpr std::size_t moe_gu_table_bytes = std::size_t(256 + 128) * 32 * 4;

__device__ __forceinline__ void fill_gate_up_tables(int4* smem4) {
    for (int entry = threadIdx.x; entry < 256 + 128; entry += blockDim.x) {
        const std::uint32_t v = entry < 256 ? iq2_xxs_grid_sel(entry) : iq2_xxs_sign_sel(entry - 256);
        const int4 v4 = make_int4(int(v), int(v), int(v), int(v));
#pragma unroll
        for (int k = 0; k < 8; ++k) smem4[entry * 8 + (k + entry) % 8] = v4;
    }
}

__device__ __forceinline__ void gate_up_item(const moe_expert_launch& a, int p, int tile, const int* match,
                                             int n_match, int4* smem4, bool tables_ready, bool* last) {
    const moe_shape& sh = a.shape;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nb = sh.n_embd / 256;
    const auto L = iq2_xxs_tiled_layout{sh.n_ff, sh.n_embd, nb, (nb + 7) / 8 * 8, sh.n_ff / tile_rows};
    const std::size_t eq = L.quant_bytes(), es = L.scale_count();
    const int mat = warp / 4, quarter = warp % 4;
    const int bpw = (nb + 3) / 4;
    const int b0 = quarter * bpw, b1 = min(b0 + bpw, nb);
    const int e = a.s.sel[p];
    const std::uint8_t* wq = (mat ? a.w.up_q : a.w.gate_q) + std::size_t(e) * eq;
    const std::uint16_t* wd = (mat ? a.w.up_d : a.w.gate_d) + std::size_t(e) * es;
    const int row = tile * tile_rows + lane;
    // The warp's steps are (pair chunk, block) chunk-major. Piece k of step i+1's block loads into
    // cur[k] as soon as step i has decoded piece k, so a lane's loads overlap its decoding
    // instead of waiting a full round trip per block (a second register copy of the block
    // spilled at the 80 registers that 3 CTAs per SM allow).
    const int n_blk = b1 > b0 ? b1 - b0 : 0;
    const int steps = n_blk * ((n_match + moe_pair_chunk - 1) / moe_pair_chunk);
    uint4 cur[4];
    std::uint16_t d_cur = 0;
    // Piece k of block b of this lane's row: 16 bytes at (b*4 + k)*512 past the row's first.
    const auto* wrow = reinterpret_cast<const uint4*>(wq + L.quant_offset(row, 0, 0));
    auto piece_at = [&](int b, int k) { return __ldcs(wrow + (b * 4 + k) * 32); };
    // Its F16 scales: 8 blocks per 16 bytes, 256 halves per group of 8 blocks.
    const std::uint16_t* wd_row = wd + L.scale_index(row, 0);
    auto load_block = [&](int b) {
#pragma unroll
        for (int k = 0; k < 4; ++k) cur[k] = piece_at(b, k);
        d_cur = wd_row[(b / 8) * 256 + b % 8];
    };
    // The first block's loads are in flight while the CTA fills its tables.
    if (steps > 0) load_block(b0);
    // Tables: uint4 i holds lanes 4(i%8)..+3 of entry i/8. A thread derives each of its entries
    // once (an 8-step bit loop) and stores the 8 copies; filling by uint4 made 8 threads derive
    // every entry again, ~2K instructions per thread, as many as the CTA's decoding at one row.
    // Thread t starts at copy t%8, so 8 threads of a store phase hit 8 different bank groups.
    // A CTA of the first wave built them before its pdl_wait (moe_experts_kernel).
    if (!tables_ready) fill_gate_up_tables(smem4);
    const auto* gtab = reinterpret_cast<const std::uint8_t*>(smem4);
    const auto* stab = gtab + std::size_t(moe_gu_grid_words) * 4;
    auto* terms = reinterpret_cast<float*>(smem4 + moe_gu_table_bytes / 16);  // [2][nb][chunk][32]
    const std::uint8_t* glane = gtab + lane * 4;
    const std::uint8_t* slane = stab + lane * 4;
    __syncthreads();

    int step = 0;
    for (int c0 = 0; c0 < n_match; c0 += moe_pair_chunk) {
        const int nc = min(moe_pair_chunk, n_match - c0);
        // The chunk's first activation row, once per chunk.
        const std::int8_t* x0row = a.s.xq + std::size_t(match[c0] / moe_slots) * sh.n_embd;
        for (int b = b0; b < b1; ++b, ++step) {
            const bool has_next = step + 1 < steps;
            const int b_next = b0 + (step + 1) % (n_blk > 0 ? n_blk : 1);
            // f16_to_f32, not f16_operand: the latter's schedule spilled at this kernel's 80 registers.
            const float d = f16_to_f32(d_cur);
            if (has_next) d_cur = wd_row[(b_next / 8) * 256 + b_next % 8];
            int bsum[moe_pair_chunk] = {};
#pragma unroll
            for (int ib = 0; ib < 8; ++ib) {
                // The first pair's activations are loaded before the decode, so their L1 round
                // trip overlaps it (loaded after it, each sub-block waited for them).
                const auto* x0p = reinterpret_cast<const uint4*>(x0row + b * 256 + ib * 32);
                const uint4 x00 = __ldg(x0p), x01 = __ldg(x0p + 1);
                const uint4& v = cur[ib / 2];
                const std::uint32_t a0 = ib % 2 ? v.z : v.x, a1 = ib % 2 ? v.w : v.y;
                std::uint32_t w[8];
#pragma unroll
                for (int l = 0; l < 4; ++l) {
                    // Entry i of the lane's copy is 128 i bytes past the lane's first word: one
                    // PRMT (or mask) for the grid index and one IMAD for the address; the OR of
                    // lane4 and the table base's add cost a third instruction per lookup.
                    const std::uint32_t gi = l == 0 ? a0 & 255u : l == 3 ? a0 >> 24 : byte_perm(a0, 0u, 0x4440u | l);
                    const std::uint32_t si = (a1 >> (7 * l)) & 127u;
                    const std::uint32_t sel = *reinterpret_cast<const std::uint32_t*>(glane + gi * 128u) |
                                              *reinterpret_cast<const std::uint32_t*>(slane + si * 128u);
                    iq2_xxs_group_decode(sel, w[2 * l], w[2 * l + 1]);
                }
                const int mul = int(2 * (a1 >> 28) + 1);
                if (ib % 2 == 1 && has_next) cur[ib / 2] = piece_at(b_next, ib / 2);
                {
                    const std::uint32_t x[8] = {x00.x, x00.y, x00.z, x00.w, x01.x, x01.y, x01.z, x01.w};
                    bsum[0] += iq2_xxs_sub_dot(w, x) * mul;
                }
#pragma unroll
                for (int j = 1; j < moe_pair_chunk; ++j) {
                    if (j >= nc) break;
                    const int r = match[c0 + j] / moe_slots;
                    const auto* xr = reinterpret_cast<const uint4*>(a.s.xq + std::size_t(r) * sh.n_embd + b * 256 + ib * 32);
                    const uint4 x0 = __ldg(xr), x1 = __ldg(xr + 1);
                    const std::uint32_t x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                    bsum[j] += iq2_xxs_sub_dot(w, x) * mul;
                }
            }
#pragma unroll
            for (int j = 0; j < moe_pair_chunk; ++j) {
                if (j >= nc) break;
                const int r = match[c0 + j] / moe_slots;
                const float dd = mul_rn(d, a.s.xq_d[r * nb + b]);
                terms[((mat * nb + b) * moe_pair_chunk + j) * 32 + lane] = mul_rn(dd, float(bsum[j]));
            }
        }
        __syncthreads();
        // Warp j finishes pair j of the chunk: block terms in block order, then the SwiGLU.
        if (warp < nc) {
            const int q = match[c0 + warp];
            float g = 0.0f, u = 0.0f;
            for (int b = 0; b < nb; ++b) {
                g = add_rn(g, terms[((0 * nb + b) * moe_pair_chunk + warp) * 32 + lane]);
                u = add_rn(u, terms[((1 * nb + b) * moe_pair_chunk + warp) * 32 + lane]);
            }
            g = fminf(mul_rn(0.125f, g), a.w.clamp);
            u = fmaxf(fminf(mul_rn(0.125f, u), a.w.clamp), -a.w.clamp);
            a.s.mid[std::size_t(q) * sh.n_ff + row] = mul_rn(mul_rn(silu(g), u), a.s.wts[q]);
        }
        __syncthreads();
    }

    // Q8_K of mid needs the 256 rows of 8 tiles: the CTA that completes a block quantizes it.
    const int kb = tile / 8, nkb = sh.n_ff / 256;
    if (!check_in(a.s.gu_counters + p * nkb + kb, 8u, last)) return;
    for (int j = warp; j < n_match; j += moe_warps) {
        const int q = match[j];
        const float* m = a.s.mid + std::size_t(q) * sh.n_ff + kb * 256 + 8 * lane;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __ldcg(m + i);
        warp_quantize_q8_k(v, lane, a.s.midq + std::size_t(q) * sh.n_ff + kb * 256, a.s.midq_d + q * nkb + kb,
                           a.s.midq_bsums + std::size_t(q) * (sh.n_ff / 16) + kb * 16);
    }
    // Publish the block to the down items of p: the barrier orders every thread's stores before
    // thread 0's device-scope release add.
    __syncthreads();
    if (threadIdx.x == 0)
        cuda::atomic_ref<unsigned, cuda::thread_scope_device>(a.s.ready[p]).fetch_add(1u, cuda::memory_order_release);
}

// Q2_K down for one item (T = a.down_tiles 32-row output tiles) of one expert, warp w on blocks
// [w*bpw, ...): y_s for every pair that names the expert. The first block's weights load before
// the wait for the pair's midq, so the down weights stream while the last gate/up items finish.
// A lane computes row l of each of the item's tiles. With one tile its weights load into
// registers; two tiles' 40 words spilled the kernel's 80 registers, so they go through shared
// memory by cp.async, which costs ~7% on the one-tile item (BM_moe_decode rows:1 43.8 -> 46.9
// us with one tile that way): the plan takes two tiles only where halving the items wins.
template <int T>
__device__ __forceinline__ void down_item(const moe_expert_launch& a, int p, int item, const int* match, int n_match,
                                          int4* smem4) {
    static_assert(T >= 1 && T <= moe_down_tiles_max && moe_pair_chunk * T <= moe_warps);
    const moe_shape& sh = a.shape;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nb = sh.n_ff / 256;
    // Shared memory (moe_decode_plan::experts_smem): the terms [nb][chunk][T][32]; per warp one
    // block of one pair's midq (64 words), then its 16 bsums (8 words); with two tiles, per warp
    // the lanes' weight pieces of the block in hand [T][5][32] (16 bytes each, lane innermost:
    // conflict-free), then their dd words [T][32].
    char* sm = reinterpret_cast<char*>(smem4);
    auto* terms = reinterpret_cast<float*>(sm);
    sm += std::size_t(nb) * moe_pair_chunk * T * 32 * 4;
    std::uint32_t* xs = reinterpret_cast<std::uint32_t*>(sm) + warp * 72;
    sm += moe_warps * 72 * 4;
    uint4* wst = reinterpret_cast<uint4*>(sm) + warp * T * 5 * 32;
    sm += moe_warps * T * 5 * 32 * 16;
    std::uint32_t* wdd_s = reinterpret_cast<std::uint32_t*>(sm) + warp * T * 32;
    const auto L = q2_k_tiled_layout{sh.n_embd, sh.n_ff, nb, (nb + 3) / 4 * 4, sh.n_embd / tile_rows};
    const int t0 = item * T, nt = T == 1 ? 1 : min(T, L.tiles - t0);  // an item starts below L.tiles
    const int e = a.s.sel[p];
    const std::uint8_t* wq = a.w.down_q + std::size_t(e) * L.quant_bytes();
    const std::uint32_t* wdd = a.w.down_dd + std::size_t(e) * L.dd_count();
    const int bpw = (nb + moe_warps - 1) / moe_warps;
    const int b0 = warp * bpw, b1 = min(b0 + bpw, nb);
    std::uint32_t wr[T == 1 ? 20 : 1];  // one tile: the lane's block in registers
    std::uint32_t ddr = 0;
    auto load_block = [&](int b) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t >= nt) continue;
            const int row = (t0 + t) * tile_rows + lane;
            if constexpr (T == 1) {
#pragma unroll
                for (int k = 0; k < 5; ++k) {
                    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(wq + L.quant_offset(row, b, k)));
                    wr[4 * k] = v.x;
                    wr[4 * k + 1] = v.y;
                    wr[4 * k + 2] = v.z;
                    wr[4 * k + 3] = v.w;
                }
                ddr = wdd[L.dd_index(row, b)];
            } else {
#pragma unroll
                for (int k = 0; k < 5; ++k)
                    cp_async::zfill<16>(wst + (t * 5 + k) * 32 + lane, wq + L.quant_offset(row, b, k), true);
                cp_async::zfill<4>(wdd_s + t * 32 + lane, wdd + L.dd_index(row, b), true);
            }
        }
        if constexpr (T > 1) cp_async::commit();
    };
    if (b0 < b1) load_block(b0);
    if (threadIdx.x == 0) {
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> ready(a.s.ready[p]);
        while (ready.load(cuda::memory_order_acquire) < unsigned(nb)) __nanosleep(128);
        // The last of the pair's down items to get past the wait leaves both counters at zero.
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> seen(a.s.seen[p]);
        if (seen.fetch_add(1u, cuda::memory_order_relaxed) == unsigned(moe_down_items(L.tiles, T)) - 1u) {
            seen.store(0u, cuda::memory_order_relaxed);
            ready.store(0u, cuda::memory_order_relaxed);
        }
    }
    // Thread 0's device-scope acquire, then the barrier, orders every thread's later midq reads
    // (ld.cg, through L2) after the producers' release: no fence here. A fence.sc on every thread
    // held 12% of the launch's stall samples (ncu, one row) and waited on the prefetched weights.
    __syncthreads();
    bool loaded = b0 < b1;
    for (int c0 = 0; c0 < n_match; c0 += moe_pair_chunk) {
        const int nc = min(moe_pair_chunk, n_match - c0);
        for (int b = b0; b < b1; ++b) {
            if (!loaded) load_block(b);
            loaded = false;
            if constexpr (T > 1) cp_async::wait<0>();  // a lane reads back only its own pieces
            // One pair at a time keeps one block of activation loads live (register budget).
#pragma unroll 1
            for (int j = 0; j < nc; ++j) {
                const int q = match[c0 + j];
                // midq was written by other CTAs of this launch: read through L2 (ld.cg), staged
                // in the warp's buffer so the dot reads it as shared-memory broadcasts.
                __syncwarp();
                const uint2 v = __ldcg(reinterpret_cast<const uint2*>(a.s.midq + std::size_t(q) * sh.n_ff + b * 256) + lane);
                xs[2 * lane] = v.x;
                xs[2 * lane + 1] = v.y;
                if (lane < 8)
                    xs[64 + lane] = __ldcg(reinterpret_cast<const unsigned*>(
                                               a.s.midq_bsums + std::size_t(q) * (sh.n_ff / 16) + b * 16) + lane);
                const float xd = __ldcg(a.s.midq_d + q * nb + b);
                __syncwarp();
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    if (t >= nt) continue;
                    std::uint32_t ws[T == 1 ? 1 : 20];
                    std::uint32_t dd = ddr;
                    if constexpr (T > 1) {
#pragma unroll
                        for (int k = 0; k < 5; ++k) {
                            const uint4 v = wst[(t * 5 + k) * 32 + lane];
                            ws[4 * k] = v.x;
                            ws[4 * k + 1] = v.y;
                            ws[4 * k + 2] = v.z;
                            ws[4 * k + 3] = v.w;
                        }
                        dd = wdd_s[t * 32 + lane];
                    }
                    const std::uint32_t* w = T == 1 ? wr : ws;
                    int isum, summs;
                    q2_k_block_isum(w, w + 4, xs, reinterpret_cast<const std::int16_t*>(xs + 64), isum, summs);
                    const float wd = f16_operand(std::uint16_t(dd & 0xffffu)), wm = f16_operand(std::uint16_t(dd >> 16));
                    const float dall = mul_rn(xd, wd), dmin = mul_rn(xd, wm);
                    terms[((b * moe_pair_chunk + j) * T + t) * 32 + lane] =
                        sub_rn(mul_rn(dall, float(isum)), mul_rn(dmin, float(summs)));
                }
            }
        }
        __syncthreads();
        // Warp (j, t) sums pair j's terms of tile t in block order.
        const int j = warp / T, t = warp % T;
        if (j < nc && t < nt) {
            const int q = match[c0 + j];
            float y = 0.0f;
            for (int b = 0; b < nb; ++b) y = add_rn(y, terms[((b * moe_pair_chunk + j) * T + t) * 32 + lane]);
            a.s.ys[std::size_t(q) * sh.n_embd + (t0 + t) * tile_rows + lane] = y;
        }
        __syncthreads();
    }
}

// Row r of xn to Q8_K (a.s.xq, a.s.xq_d) by the CTA's warps, a 256-block per warp at a time (the
// IQ2_XXS dot needs no bsums).
__device__ __forceinline__ void quantize_xn_row(const moe_expert_launch& a, int r) {
    const moe_shape& sh = a.shape;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    const int nb = sh.n_embd / 256;
    for (int b = warp; b < nb; b += n_warps) {
        const float* x = a.xn + std::size_t(r) * a.x_stride + b * 256 + 8 * lane;
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = x[i];
        warp_quantize_q8_k(v, lane, a.s.xq + std::size_t(r) * sh.n_embd + b * 256, a.s.xq_d + r * nb + b, nullptr);
    }
}

}  // namespace detail

// The kernels below are templates only for linkage: this header may be included by several
// translation units, and a __global__ function cannot be inline.

// Router: CTAs [0, router_ctas) compute the F16 logits of rpc experts (a warp per (expert,
// 512-segment), as matvec_f16_kernel and format/row_dot.hpp) and store p = sqrt(softplus); the
// last of them routes every live row, a warp per row. CTAs past router_ctas quantize one row of
// xn to Q8_K each (the IQ2_XXS dot needs no bsums).
// The minimum of one CTA per SM is stated because without it ptxas for sm_80 held the kernel at
// 40 registers and spilled 16 bytes (the CI build treats spills as errors).
template <int = 0>
__global__ void __launch_bounds__(moe_warps * 32, 1) moe_router_kernel(const __grid_constant__ moe_expert_launch a,
                                                                       int router_ctas) {
    // Before the wait (core/launch.hpp): a router CTA's expert rows of F16 weights toward L2.
    if (threadIdx.x == 0 && int(blockIdx.x) < router_ctas) {
        const int segs = (a.shape.n_embd + f16_segment - 1) / f16_segment, rpc = f16_rows_per_cta(segs);
        const int e0 = int(blockIdx.x) * rpc, n = min(rpc, a.shape.n_expert - e0);
        if (n > 0) prefetch_l2(a.w.router + std::size_t(e0) * a.shape.n_embd, std::size_t(n) * a.shape.n_embd * 2);
    }
    pdl_enter();
    extern __shared__ int4 smem4[];
    __shared__ float p_row[moe_warps][moe_max_experts];
    __shared__ bool last;
    const moe_shape& sh = a.shape;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_live = detail::live_rows(a);
    if (int(blockIdx.x) >= router_ctas) {
        const int r = int(blockIdx.x) - router_ctas;
        if (r < n_live) detail::quantize_xn_row(a, r);
        return;
    }
    auto* part = reinterpret_cast<float*>(smem4);  // [rpc * segments][capacity]
    const int segments = (sh.n_embd + f16_segment - 1) / f16_segment;
    const int rpc = f16_rows_per_cta(segments);
    const int e0 = int(blockIdx.x) * rpc, pairs = rpc * segments, R = a.capacity;
    for (int q = warp; q < pairs; q += moe_warps) {
        const int e = e0 + q / segments, s = q % segments;
        const int i0 = s * f16_segment + lane * f16_lane_elems;
        const bool live = e < sh.n_expert && i0 < sh.n_embd;
        float wf[16];
        if (live) detail::f16_lane_weights(a.w.router + std::size_t(e) * sh.n_embd + i0, wf);
        for (int r = 0; r < n_live; ++r) {
            const float v = detail::f16_segment_sum(wf, a.xn + std::size_t(r) * a.x_stride + i0, live);
            if (lane == 0) part[q * R + r] = v;
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < rpc * R; t += blockDim.x) {
        const int le = t / R, r = t % R, e = e0 + le;
        if (e >= sh.n_expert || r >= n_live) continue;
        float acc = 0.0f;
        for (int s = 0; s < segments; ++s) acc = add_rn(acc, part[(le * segments + s) * R + r]);
        a.s.probs[std::size_t(r) * sh.n_expert + e] = __fsqrt_rn(softplus(acc));
    }
    if (!check_in(a.s.route_counter, unsigned(router_ctas), &last)) return;
    for (int r = warp; r < n_live; r += moe_warps) detail::route_row(a, r, p_row[warp], lane);
}

// The router as one cluster of moe_router_cluster_ctas CTAs (sm_90): CTA k copies the F16 rows of
// experts [k rpc, (k + 1) rpc) into its shared memory before its PDL wait (no kernel writes
// weights), then forms their logits and p as moe_router_kernel does (the same segment sums added
// in the same order: the same bits) and stores each p into CTA 0's shared memory as well as
// a.s.probs. Past the cluster barrier CTA 0 routes every live row from there, a warp per row,
// while the others quantize xn's rows to Q8_K (with_xq). What this removes from the step is
// moe_router_kernel's device-scope check-in of 256 CTAs and its routing CTA's read of the
// probabilities back through L2 (the H100 probe, fortieth session: logits stored 4.1-4.5 us
// after the first CTA's wait, the check-in 1.4-2.3 us, the route 2.2-2.9 us). Measured in the
// model (H200, full flash file, 2K): decode 148.2 tok/s against 144.9 with the 256-CTA router
// (bench/RESULTS.md, fifty-third session); in moe_bench alone it is no faster (its weights' staging
// has no predecessor to hide behind).
// Shared memory: [rpc][n_embd] F16 weights | [rpc * segments][capacity] segment sums |
// [capacity][n_expert] p | [n_expert] bias | [capacity][6] hash slots (the last three used in
// CTA 0 only: its route then reads nothing through L2 past the barrier; the bias is copied
// before the wait, the hash rows' tid2eid entries read while the logits run). The grid is the
// one cluster, of 32 warps a CTA: a CTA holds 16 times the (expert, segment) pairs of a
// moe_router_kernel CTA, so its logits are bound by issue (H100 probe: 9.6 us at 8 warps, 5.5 us
// at 32 with x read per pair); each warp keeps one segment of x in registers and runs four
// experts' chains and butterflies side by side.
inline constexpr int moe_router_cluster_ctas = 16;
inline constexpr int moe_router_cluster_warps = 32;
// Plans of more rows keep moe_router_kernel: the cluster's logits grow with the rows on 16 SMs
// (the 32-warp form before x in registers, moe_bench BM_moe_decode side:1 on the H100: 47.3 /
// 134.0 / 546.0 us at 1 / 4 / 16 rows against 43.2 / 117.8 / 465.7).
inline constexpr int moe_router_cluster_max_rows = 1;

template <int = 0>
__global__ void __launch_bounds__(moe_router_cluster_warps * 32, 1)
    moe_router_cluster_kernel(const __grid_constant__ moe_expert_launch a, int rpc, bool with_xq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ int4 smem4[];
    const moe_shape& sh = a.shape;
    constexpr int n_warps = moe_router_cluster_warps, batch = 4;
    const int rank = int(blockIdx.x), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int e0 = rank * rpc, n_here = max(0, min(rpc, sh.n_expert - e0));
    const int row_pieces = sh.n_embd / 8;  // 16-byte pieces of one expert row
    const int segments = (sh.n_embd + f16_segment - 1) / f16_segment, R = a.capacity;
    const auto* w = reinterpret_cast<const std::uint16_t*>(smem4);
    float* part = reinterpret_cast<float*>(smem4 + std::size_t(rpc) * row_pieces);
    float* p_all = part + std::size_t(rpc) * segments * R;
    float* bias_s = p_all + std::size_t(R) * sh.n_expert;
    auto* hash_s = reinterpret_cast<std::int32_t*>(bias_s + sh.n_expert);
    const int4* src = reinterpret_cast<const int4*>(a.w.router + std::size_t(e0) * sh.n_embd);
    for (int c = threadIdx.x; c < n_here * row_pieces; c += blockDim.x) cp_async::zfill<16>(smem4 + c, src + c, true);
    if (rank == 0 && a.w.bias)
        for (int e = threadIdx.x; e < sh.n_expert; e += blockDim.x) cp_async::zfill<4>(bias_s + e, a.w.bias + e, true);
    cp_async::commit();
    pdl_enter();
    const int n_live = detail::live_rows(a);
    if (rank == 0 && a.w.tid2eid)
        for (int t = threadIdx.x; t < n_live * moe_slots; t += blockDim.x)
            hash_s[t] = a.w.tid2eid[std::size_t(a.tokens[t / moe_slots]) * moe_slots + t % moe_slots];
    cp_async::wait<0>();
    __syncthreads();
    // Warp w keeps segment s = w % segments of x in registers and takes experts w / segments +
    // j * stride (the host launches this form only where segments divides the warp count).
    const int s = warp % segments, stride = n_warps / segments;
    const int i0 = s * f16_segment + lane * f16_lane_elems;
    const bool lane_live = i0 < sh.n_embd;
    for (int r = 0; r < n_live; ++r) {
        float4 xf[4];
        if (lane_live)
#pragma unroll
            for (int i = 0; i < 4; ++i) xf[i] = __ldg(reinterpret_cast<const float4*>(a.xn + std::size_t(r) * a.x_stride + i0) + i);
        for (int le0 = warp / segments; le0 < n_here; le0 += batch * stride) {
            float v[batch];
#pragma unroll
            for (int k = 0; k < batch; ++k) {
                const int le = le0 + k * stride;
                v[k] = 0.0f;
                if (lane_live && le < n_here) {
                    const int4* wl = reinterpret_cast<const int4*>(w + std::size_t(le) * sh.n_embd + i0);
                    float wf[16];
                    detail::f16_lane_floats(wl[0], wl[1], wf);
                    v[k] = detail::f16_lane_dot(wf, [&](int i) { return xf[i]; });
                }
            }
#pragma unroll
            for (int k = 0; k < batch; ++k) v[k] = detail::f16_warp_sum(v[k]);
            if (lane == 0)
#pragma unroll
                for (int k = 0; k < batch; ++k)
                    if (le0 + k * stride < n_here) part[((le0 + k * stride) * segments + s) * R + r] = v[k];
        }
    }
    __syncthreads();
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    float* p0 = cluster.map_shared_rank(p_all, 0);
    for (int t = threadIdx.x; t < n_here * n_live; t += blockDim.x) {
        const int le = t / n_live, r = t % n_live, e = e0 + le;
        float acc = 0.0f;
        for (int s = 0; s < segments; ++s) acc = add_rn(acc, part[(le * segments + s) * R + r]);
        const float p = __fsqrt_rn(softplus(acc));
        a.s.probs[std::size_t(r) * sh.n_expert + e] = p;
        p0[r * sh.n_expert + e] = p;
    }
    // Arrive (release: the stores into CTA 0), then CTA 0 waits for every CTA's; the others
    // quantize first and wait last, so that no CTA leaves the cluster while its barrier is open.
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    if (rank == 0) {
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        for (int r = warp; r < n_live; r += n_warps)
            detail::route_row_given(a, r, p_all + r * sh.n_expert, lane, a.w.bias ? bias_s : nullptr,
                                    a.w.tid2eid ? hash_s + r * moe_slots : nullptr);
        return;
    }
    if (with_xq)
        for (int r = rank - 1; r < n_live; r += moe_router_cluster_ctas - 1) detail::quantize_xn_row(a, r);
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    (void)a;
    (void)rpc;
    (void)with_xq;
#endif
}

// Routes of a prefill chunk's rows from their router logits, computed by one F16 GEMM in the
// router's order (kernels/gemm_f16.cuh: the same per-segment butterfly and segment sum as the
// router launch above, so the same bits): p = sqrt(softplus(logit)) in place, then route_row; a
// warp per row. a.s.probs is the logits array; a.s.sel, a.s.wts receive the routes.
template <int = 0>
__global__ void __launch_bounds__(moe_warps * 32) moe_route_rows_kernel(const __grid_constant__ moe_expert_launch a) {
    pdl_enter();
    __shared__ float p_row[moe_warps][moe_max_experts];
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int r = int(blockIdx.x) * moe_warps + warp, ne = a.shape.n_expert;
    if (r >= a.n_rows) return;  // warp-uniform, and the kernel has no block barrier
    for (int e = lane; e < ne; e += 32) {
        float& v = a.s.probs[std::size_t(r) * ne + e];
        v = __fsqrt_rn(softplus(v));
    }
    __syncwarp();
    detail::route_row(a, r, p_row[warp], lane);
}

// The shared expert's SwiGLU, mid = silu(min(g, clamp)) * clamp(u, +-clamp), for rows below
// n_rows; the shared down matvec quantizes it to Q8_0.
template <int = 0>
__global__ void moe_shared_act_kernel(const float* g, const float* u, float* mid, int n, int n_rows, float clamp) {
    pdl_enter();
    const int r = blockIdx.y, f = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (r >= n_rows || f >= n) return;
    const std::size_t i = std::size_t(r) * n + f;
    mid[i] = swiglu_clamped(g[i], u[i], clamp);
}

// The routed experts: gate/up and down items in one launch, in ticket order (moe_schedule.hpp).
// T: the down items' tiles (a.down_tiles), a kernel each so that the one-tile instance compiles
// without the two-tile path (in one kernel both cost the one-row launch ~1 us: 43.7 -> 44.7 us,
// BM_moe_decode rows:1 side:1, H200).
template <int T = 1>
__global__ void __launch_bounds__(moe_warps * 32, 3) moe_experts_kernel(const __grid_constant__ moe_expert_launch a) {
    extern __shared__ int4 smem4[];
    __shared__ int match[moe_slots * matvec_max_rows];
    __shared__ int n_match;
    __shared__ bool last;
    __shared__ unsigned ticket;
    const moe_shape& sh = a.shape;
    const int pairs = a.capacity * moe_slots, gu_tiles = sh.n_ff / tile_rows;
    const int dn_tiles = moe_down_items(sh.n_embd / tile_rows, T);
    // Before the wait (core/launch.hpp; shared memory only): the CTAs likely to draw gate/up
    // tickets (the first ones to start) build the decode tables while the router runs. Tickets,
    // not block indices, assign items, so a CTA that guessed wrong only builds them again or
    // overwrites them.
    const bool tables_ready = int(blockIdx.x) < pairs * gu_tiles;
    if (tables_ready) detail::fill_gate_up_tables(smem4);
    pdl_enter();
    if (threadIdx.x == 0) {
        // Every CTA takes exactly one ticket, so the one that draws the last has seen every other
        // draw and may reset the counter for the next launch.
        const unsigned total = unsigned(moe_item_count(pairs, gu_tiles, dn_tiles));
        const unsigned t = atomicAdd(a.s.ticket, 1u);
        if (t == total - 1u) atomicExch(a.s.ticket, 0u);
        ticket = t;
    }
    __syncthreads();
    const moe_item it = moe_item_at(int(ticket), pairs, gu_tiles, dn_tiles);
    const int n_pairs = detail::live_rows(a) * moe_slots;
    if (it.pair >= n_pairs) return;
    if (!detail::collect_pairs(a.s.sel, n_pairs, it.pair, match, &n_match)) return;
    if (it.down)
        detail::down_item<T>(a, it.pair, it.tile, match, n_match, smem4);
    else
        detail::gate_up_item(a, it.pair, it.tile, match, n_match, smem4, tables_ready, &last);
}

// F = the six slots in order + the shared expert, per live row.
template <int = 0>
__global__ void moe_finish_kernel(const __grid_constant__ moe_expert_launch a) {
    // The one exception to core/launch.hpp's order, where the launch asks for it: this grid's few
    // CTAs are all resident, and its wait lasts as long as the experts and the side stream's
    // shared expert, so releasing the next launch (the next hc pre) first lets that launch's CTAs
    // arrive and do their pre-wait work in the experts' tail instead of after this grid's ~1 us of
    // work (the decode timeline had hc pre starting 0.75 us before the finish ended). Ordering is
    // kept: the next launch's own wait is on this grid's completion, which follows this wait.
    if (a.finish_releases_early) pdl_launch_dependents();
    pdl_enter();
    const int r = blockIdx.y, o = int(blockIdx.x * blockDim.x + threadIdx.x);
    const int n = a.shape.n_embd;
    if (r >= detail::live_rows(a) || o >= n) return;
    float ys[moe_slots];
#pragma unroll
    for (int s = 0; s < moe_slots; ++s) ys[s] = a.s.ys[std::size_t(r * moe_slots + s) * n + o];
    a.out[std::size_t(r) * a.out_stride + o] = moe_slot_sum(ys, a.s.sh_out[std::size_t(r) * n + o]);
}

// ---- host side -----------------------------------------------------------------------------

// The most dynamic shared memory a moe_router_cluster_kernel launch may ask for on `device`: 0
// where it does not run (before sm_90, or no GPC takes a cluster of 16 CTAs at the device's
// largest opt-in). The first call opts the kernel into clusters of 16 and that shared memory.
inline std::size_t router_cluster_smem_limit(int device) {
    static per_device_once<std::size_t> limit;
    return limit.get(device, [](int dev) {
        std::size_t bytes = 0;
        with_device(dev, [&] {
            int major = 0;
            cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
            if (major < 9) return;
            const auto kernel = moe_router_cluster_kernel<>;
            cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                       "moe router cluster size");
            const std::size_t most = max_dynamic_smem(kernel);
            raise_smem_limit(kernel, most, "moe router cluster smem");
            cudaLaunchAttribute attr{};
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = moe_router_cluster_ctas;
            attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
            cudaLaunchConfig_t cfg{};
            cfg.gridDim = dim3(moe_router_cluster_ctas);
            cfg.blockDim = dim3(moe_router_cluster_warps * 32);
            cfg.dynamicSmemBytes = most;
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
            int clusters = 0;
            if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) bytes = most;
            (void)cudaGetLastError();  // a refused query leaves no sticky error
        });
        return bytes;
    });
}

// The shared-memory opt-ins of every MoE launch on `device` (the experts launch raised to the
// device's maximum, so any shape is covered; the matvecs' too): call once per device before capture.
inline void prepare_moe(int device) {
    prepare_matvec(device);
    with_device(device, [&] {
        raise_smem_limit(moe_experts_kernel<1>, max_dynamic_smem(moe_experts_kernel<1>), "moe experts smem");
        raise_smem_limit(moe_experts_kernel<2>, max_dynamic_smem(moe_experts_kernel<2>), "moe experts smem");
    });
    (void)router_cluster_smem_limit(device);
}

// moe_route_rows_kernel for n_rows rows: `logits` [n_rows][n_expert] become the probabilities;
// sel and wts [n_rows][6] receive the routes (tokens: the hash layers' input ids, else unused).
inline void launch_moe_route_rows(const moe_shape& shape, const moe_weights& w, float* logits, const std::int32_t* tokens,
                                  int n_rows, std::int32_t* sel, float* wts, cudaStream_t stream) {
    require(n_rows >= 1 && logits && sel && wts, "moe: route rows needs rows, logits, sel and wts");
    require(w.tid2eid == nullptr || tokens != nullptr, "moe: a hash-routed layer needs the rows' tokens");
    moe_expert_launch a;
    a.shape = shape;
    a.n_rows = n_rows;
    a.capacity = n_rows;
    a.tokens = tokens;
    a.w = w;
    a.s = moe_scratch{};
    a.s.probs = logits;
    a.s.sel = sel;
    a.s.wts = wts;
    launch_kernel("moe_route_rows_kernel", moe_route_rows_kernel<>, unsigned((n_rows + moe_warps - 1) / moe_warps),
                  moe_warps * 32, 0, stream, a);
    cuda_check_launch("moe route rows");
}

// A second stream for the shared expert (and the two events the fork and join use); stream null:
// everything on the launch's stream.
struct moe_side {
    cudaStream_t stream = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
};

// The shared expert's two matvec launches and the scratch layout of one (shape, capacity); built
// once, then launched every step with the live pointers.
class moe_decode_plan {
public:
    moe_decode_plan(const moe_shape& s, int capacity, int sm_count) : shape_(s), capacity_(capacity), sms_(sm_count) {
        require(s.n_embd % 256 == 0 && s.n_ff % 256 == 0 && s.n_ff_shared % 32 == 0,
                "moe: n_embd " + std::to_string(s.n_embd) + " and n_ff " + std::to_string(s.n_ff) +
                    " must be multiples of 256, n_ff_shared of 32");
        require(s.n_expert >= moe_slots && s.n_expert <= moe_max_experts,
                "moe: n_expert = " + std::to_string(s.n_expert) + " (6..256)");
        require(matvec_capacity_for(capacity) == capacity, "moe: capacity must be 1, 2, 4, 8 or 16");
        shared_up_.format = matvec_format::q8_0;
        shared_up_.in = s.n_embd;
        shared_up_.n_matrices = 2;
        for (int k = 0; k < 2; ++k) {
            shared_up_.m[k].rows = s.n_ff_shared;
            shared_up_.m[k].y_stride = s.n_ff_shared;
        }
        shared_down_.format = matvec_format::q8_0;
        shared_down_.in = s.n_ff_shared;
        shared_down_.n_matrices = 1;
        shared_down_.m[0].rows = s.n_embd;
        shared_down_.m[0].y_stride = s.n_embd;
        std::size_t pf = 0, cc = 0;
        for (matvec_launch* l : {&shared_up_, &shared_down_}) {
            l->n_rows = capacity;
            const auto req = plan_matvec(*l, capacity, sm_count);
            pf = req.partial_floats > pf ? req.partial_floats : pf;
            cc = req.counter_count > cc ? req.counter_count : cc;
        }
        // Two tiles per down item from moe_down2_min_capacity rows of capacity (moe_schedule.hpp);
        // DS4_MOE_DOWN_TILES=1|2 forces one (A/B).
        const int forced_tiles = env_choice("DS4_MOE_DOWN_TILES", {1, 2});
        down_tiles_ = forced_tiles ? forced_tiles : capacity >= moe_down2_min_capacity ? 2 : 1;
        const int segments = (s.n_embd + f16_segment - 1) / f16_segment;
        router_rpc_ = f16_rows_per_cta(segments);
        router_ctas_ = (s.n_expert + router_rpc_ - 1) / router_rpc_;
        router_smem_ = std::size_t(router_rpc_) * segments * capacity * sizeof(float);
        segments_ = segments;
        cluster_rpc_ = (s.n_expert + moe_router_cluster_ctas - 1) / moe_router_cluster_ctas;
        cluster_smem_ = std::size_t(cluster_rpc_) * s.n_embd * 2 + std::size_t(cluster_rpc_) * segments * capacity * 4 +
                        std::size_t(capacity) * s.n_expert * 4 + std::size_t(s.n_expert) * 4 +
                        std::size_t(capacity) * moe_slots * 4;
        const std::size_t R = std::size_t(capacity), P = R * moe_slots;
        std::size_t off = 0;
        auto take = [&](std::size_t bytes) {
            const std::size_t o = off;
            off += (bytes + 15) / 16 * 16;
            return o;
        };
        o_.probs = take(R * s.n_expert * 4);
        o_.sh_g = take(R * s.n_ff_shared * 4);
        o_.sh_u = take(R * s.n_ff_shared * 4);
        o_.sh_mid = take(R * s.n_ff_shared * 4);
        o_.sh_out = take(R * s.n_embd * 4);
        o_.sel = take(P * 4);
        o_.wts = take(P * 4);
        o_.xq = take(R * s.n_embd);
        o_.xq_d = take(R * (s.n_embd / 256) * 4);
        o_.mid = take(P * s.n_ff * 4);
        o_.midq = take(P * s.n_ff);
        o_.midq_d = take(P * (s.n_ff / 256) * 4);
        o_.midq_bsums = take(P * (s.n_ff / 16) * 2);
        o_.ys = take(P * s.n_embd * 4);
        o_.mv_partials = take(pf * 4);
        o_.side_partials = take(pf * 4);
        mv_partial_floats_ = pf;
        // Counters last: a caller zeroes the whole buffer once; the kernels keep them at zero.
        o_.gu_counters = take(P * (s.n_ff / 256) * 4);
        o_.ready = take(P * 4);
        o_.seen = take(P * 4);
        o_.route_counter = take(4);
        o_.ticket = take(4);
        o_.mv_counters = take(cc * 4);
        o_.side_counters = take(cc * 4);
        mv_counter_count_ = cc;
        bytes_ = off;
    }

    // Device scratch to allocate once (256-byte aligned, zero-filled once by the caller).
    std::size_t scratch_bytes() const { return bytes_; }
    int capacity() const { return capacity_; }

    // Whether the experts launch starts under PDL while the router runs (the default: its CTAs
    // build their decode tables meanwhile) or only once the router has completed. Early, its
    // CTAs take every SM slot while they wait, so the shared expert's later launches on the side
    // stream find none until experts CTAs exit.
    void set_experts_early(bool early) { experts_early_ = early; }

    // Whether the router runs as one cluster (moe_router_cluster_kernel; the default) where the
    // device takes it, or as moe_router_kernel. The same bits either way.
    void set_router_cluster(bool cluster) { router_cluster_ = cluster; }

    // Whether the finish launch releases the next launch before its own wait (moe_finish_kernel).
    void set_finish_releases_early(bool early) { finish_releases_early_ = early; }
    const moe_shape& shape() const { return shape_; }

    moe_scratch carve(void* base) const {
        auto* b = static_cast<std::uint8_t*>(base);
        moe_scratch s;
        s.probs = reinterpret_cast<float*>(b + o_.probs);
        s.sh_g = reinterpret_cast<float*>(b + o_.sh_g);
        s.sh_u = reinterpret_cast<float*>(b + o_.sh_u);
        s.sh_mid = reinterpret_cast<float*>(b + o_.sh_mid);
        s.sh_out = reinterpret_cast<float*>(b + o_.sh_out);
        s.sel = reinterpret_cast<std::int32_t*>(b + o_.sel);
        s.wts = reinterpret_cast<float*>(b + o_.wts);
        s.xq = reinterpret_cast<std::int8_t*>(b + o_.xq);
        s.xq_d = reinterpret_cast<float*>(b + o_.xq_d);
        s.mid = reinterpret_cast<float*>(b + o_.mid);
        s.midq = reinterpret_cast<std::int8_t*>(b + o_.midq);
        s.midq_d = reinterpret_cast<float*>(b + o_.midq_d);
        s.midq_bsums = reinterpret_cast<std::int16_t*>(b + o_.midq_bsums);
        s.ys = reinterpret_cast<float*>(b + o_.ys);
        s.gu_counters = reinterpret_cast<unsigned*>(b + o_.gu_counters);
        s.ready = reinterpret_cast<unsigned*>(b + o_.ready);
        s.seen = reinterpret_cast<unsigned*>(b + o_.seen);
        s.route_counter = reinterpret_cast<unsigned*>(b + o_.route_counter);
        s.ticket = reinterpret_cast<unsigned*>(b + o_.ticket);
        s.mv_partials = reinterpret_cast<float*>(b + o_.mv_partials);
        s.mv_counters = reinterpret_cast<unsigned*>(b + o_.mv_counters);
        s.mv_partial_floats = mv_partial_floats_;
        s.mv_counter_count = mv_counter_count_;
        s.side_partials = reinterpret_cast<float*>(b + o_.side_partials);
        s.side_counters = reinterpret_cast<unsigned*>(b + o_.side_counters);
        return s;
    }

    // The shared-memory opt-ins this plan's launches need on `device`: call before capturing a step.
    void prepare(int device) const { prepare_moe(device); }

    // One MoE step: xn [n_rows][x_stride] -> out [n_rows][out_stride], tokens [n_rows] on the
    // device (read only by hash layers). Router, experts and finish on `stream`; the shared
    // expert's three launches on side.stream when given (forked at the start, joined before the
    // finish, which adds its output), else on `stream` too.
    // A step captured into a graph passes live_rows (device memory, 1..capacity): the launch then
    // covers the capacity, the shared-expert matvecs compute every row (rows are independent;
    // idle rows read whatever xn holds and their results are ignored), the router and expert
    // kernels skip rows past the live count, and n_rows is ignored.
    void launch(const moe_weights& w, const float* xn, int x_stride, const std::int32_t* tokens, int n_rows,
                float* out, int out_stride, void* scratch, cudaStream_t stream,
                const std::int32_t* live_rows = nullptr, const moe_side& side = {}) const {
        require(side.stream == nullptr || (side.ev[0] && side.ev[1]), "moe: a side stream needs its two events");
        const moe_expert_launch a = make_launch(w, xn, x_stride, tokens, n_rows, out, out_stride, carve(scratch),
                                                live_rows);
        if (side.stream) {
            cuda_check(cudaEventRecord(side.ev[0], stream), "moe side fork");
            cuda_check(cudaStreamWaitEvent(side.stream, side.ev[0], 0), "moe side fork wait");
        }
        launch_router(a, true, stream);
        if (side.stream) launch_shared(a, side.stream, true);
        else launch_shared(a, stream, false);
        const std::size_t smem = experts_smem();
        const auto kernel = a.down_tiles == 2 ? moe_experts_kernel<2> : moe_experts_kernel<1>;
        raise_smem_limit(kernel, smem, "moe experts smem", stream);
        const int items = moe_item_count(capacity_ * moe_slots, shape_.n_ff / tile_rows,
                                         moe_down_items(shape_.n_embd / tile_rows, a.down_tiles));
        if (experts_early_)
            launch_kernel("moe_experts_kernel", kernel, items, moe_warps * 32, smem, stream, a);
        else
            launch_kernel_after("moe_experts_kernel", kernel, items, moe_warps * 32, smem, stream, a);
        cuda_check_launch("moe experts");
        if (side.stream) {
            cuda_check(cudaEventRecord(side.ev[1], side.stream), "moe side join");
            cuda_check(cudaStreamWaitEvent(stream, side.ev[1], 0), "moe side join wait");
        }
        launch_kernel("moe_finish_kernel", moe_finish_kernel<>,
                      dim3(unsigned((shape_.n_embd + 255) / 256), unsigned(capacity_)), 256, 0, stream, a);
        cuda_check_launch("moe finish");
    }

    // Where launch_route leaves each row's results (rows [0, n_rows) of the call).
    struct route_outputs {
        std::int32_t* sel = nullptr;  // [rows][6] expert of each slot
        float* wts = nullptr;         // [rows][6] its weight
        float* sh_out = nullptr;      // [rows][n_embd] the shared expert's output
    };
    // The router, the route (top-6 or hash) and the shared expert only: four launches. The routed
    // experts are then the caller's (the prefill path's grouped GEMM, moe_gemm.cuh); the layer's
    // output is add_rn(routed slot sum, sh_out), as launch() computes it.
    void launch_route(const moe_weights& w, const float* xn, int x_stride, const std::int32_t* tokens, int n_rows,
                      void* scratch, const route_outputs& o, cudaStream_t stream) const {
        require(o.sel && o.wts && o.sh_out, "moe: launch_route needs sel, wts and sh_out outputs");
        moe_scratch s = carve(scratch);
        s.sel = o.sel;
        s.wts = o.wts;
        s.sh_out = o.sh_out;
        const moe_expert_launch a = make_launch(w, xn, x_stride, tokens, n_rows, nullptr, 0, s, nullptr);
        launch_router(a, false, stream);
        launch_shared(a, stream, false);
    }

    // The router and the route only (one launch): sel and wts of rows [0, n_rows). The prefill path
    // runs the shared expert over the whole chunk as GEMMs (shared_act below between them).
    void launch_router_only(const moe_weights& w, const float* xn, int x_stride, const std::int32_t* tokens, int n_rows,
                            void* scratch, std::int32_t* sel, float* wts, cudaStream_t stream) const {
        require(sel && wts, "moe: launch_router_only needs sel and wts outputs");
        moe_scratch s = carve(scratch);
        s.sel = sel;
        s.wts = wts;
        launch_router(make_launch(w, xn, x_stride, tokens, n_rows, nullptr, 0, s, nullptr), false, stream);
    }

private:
    moe_expert_launch make_launch(const moe_weights& w, const float* xn, int x_stride, const std::int32_t* tokens,
                                  int n_rows, float* out, int out_stride, const moe_scratch& s,
                                  const std::int32_t* live_rows) const {
        if (live_rows != nullptr) n_rows = capacity_;
        require(n_rows >= 1 && n_rows <= capacity_, "moe: n_rows " + std::to_string(n_rows) + " outside 1..capacity");
        moe_expert_launch a;
        a.shape = shape_;
        a.n_rows = n_rows;
        a.capacity = capacity_;
        a.live_rows = live_rows;
        a.tokens = tokens;
        a.xn = xn;
        a.x_stride = x_stride;
        a.out = out;
        a.out_stride = out_stride;
        a.w = w;
        a.s = s;
        a.down_tiles = down_tiles_;
        a.finish_releases_early = finish_releases_early_;
        return a;
    }

    // The router launch; with_xq adds one CTA per row of capacity for Q8_K of xn.
    void launch_router(const moe_expert_launch& a, bool with_xq, cudaStream_t stream) const {
        const bool cluster_fits = capacity_ <= moe_router_cluster_max_rows && moe_router_cluster_warps % segments_ == 0;
        if (router_cluster_ && cluster_fits && cluster_smem_ <= router_cluster_smem_limit(current_device())) {
            launch_kernel_cluster("moe_router_cluster_kernel", moe_router_cluster_kernel<>, moe_router_cluster_ctas,
                                  moe_router_cluster_warps * 32, cluster_smem_, moe_router_cluster_ctas, stream, a, cluster_rpc_,
                                  with_xq);
            cuda_check_launch("moe router (cluster)");
            return;
        }
        const int grid = router_ctas_ + (with_xq ? capacity_ : 0);
        launch_kernel("moe_router_kernel", moe_router_kernel<>, grid, moe_warps * 32, router_smem_, stream, a,
                      router_ctas_);
        cuda_check_launch("moe router");
    }

    // Shared gate+up matvec, SwiGLU, shared down matvec on `stream`, with the side stream's own
    // matvec workspace when `side` (the main stream's launches may run at the same time).
    void launch_shared(const moe_expert_launch& a, cudaStream_t stream, bool side) const {
        const moe_scratch& s = a.s;
        const matvec_workspace ws = side ? matvec_workspace{s.side_partials, s.mv_partial_floats, s.side_counters,
                                                            s.mv_counter_count}
                                         : matvec_workspace{s.mv_partials, s.mv_partial_floats, s.mv_counters,
                                                            s.mv_counter_count};
        launch_matvec(bound(shared_up_, a.xn, a.x_stride, a.n_rows,
                            {{a.w.sh_gate_q, a.w.sh_gate_d, s.sh_g}, {a.w.sh_up_q, a.w.sh_up_d, s.sh_u}}),
                      capacity_, ws, sms_, stream);
        launch_kernel("moe_shared_act_kernel", moe_shared_act_kernel<>,
                      dim3(unsigned((shape_.n_ff_shared + 255) / 256), unsigned(capacity_)), 256, 0, stream, s.sh_g,
                      s.sh_u, s.sh_mid, shape_.n_ff_shared, a.n_rows, a.w.clamp);
        cuda_check_launch("moe shared swiglu");
        launch_matvec(bound(shared_down_, s.sh_mid, shape_.n_ff_shared, a.n_rows, {{a.w.sh_down_q, a.w.sh_down_d, s.sh_out}}),
                      capacity_, ws, sms_, stream);
    }

    // A planned Q8_0 launch bound to this step's input and matrices (weights, scales, output).
    struct q8_matrix {
        const std::uint8_t* q;
        const std::uint16_t* d;
        float* y;
    };
    static matvec_launch bound(const matvec_launch& plan, const float* x, int x_stride, int n_rows,
                               std::initializer_list<q8_matrix> ms) {
        matvec_launch l = plan;
        l.n_rows = n_rows;
        l.x = x;
        l.x_stride = x_stride;
        int k = 0;
        for (const q8_matrix& m : ms) {
            l.m[k].weights = m.q;
            l.m[k].scales = m.d;
            l.m[k].y = m.y;
            ++k;
        }
        return l;
    }

    std::size_t experts_smem() const {
        const std::size_t gate_up = detail::moe_gu_table_bytes + std::size_t(2) * (shape_.n_embd / 256) * moe_pair_chunk * 32 * 4;
        const std::size_t down = std::size_t(shape_.n_ff / 256) * moe_pair_chunk * moe_down_tiles_max * 32 * 4 +
                                 std::size_t(moe_warps) * 72 * 4 + std::size_t(moe_warps) * moe_down_tiles_max * (5 * 32 * 16 + 32 * 4);
        return gate_up > down ? gate_up : down;
    }
    struct offsets {
        std::size_t probs, sh_g, sh_u, sh_mid, sh_out, sel, wts, xq, xq_d, mid, midq, midq_d, midq_bsums, ys,
            gu_counters, ready, seen, route_counter, ticket, mv_partials, mv_counters, side_partials, side_counters;
    };
    moe_shape shape_;
    int capacity_, sms_;
    int router_rpc_ = 1, router_ctas_ = 0, cluster_rpc_ = 1, segments_ = 1;
    bool router_cluster_ = true;
    std::size_t cluster_smem_ = 0;
    int down_tiles_ = 1;
    bool experts_early_ = true;
    bool finish_releases_early_ = false;
    std::size_t router_smem_ = 0;
    matvec_launch shared_up_, shared_down_;
    offsets o_{};
    std::size_t mv_partial_floats_ = 0, mv_counter_count_ = 0, bytes_ = 0;
};

}  // namespace ds4::kernels
