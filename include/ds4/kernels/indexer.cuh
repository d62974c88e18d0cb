#pragma once
// The indexer of ratio-4 layers (docs/model.md §2.6) for decode, many sequences per launch:
//   prepare  q_h = QAT(RoPE_tail64(q_raw_h, pos)) per head (q_raw = indexer.attn_q_b . qn, the F16
//            matvec of kernels/matvec.cuh run by the caller); w_h = w_raw_h * 1/sqrtf(128*n_head)
//            (w_raw = indexer.proj . xn, same matvec launch as the other attention-norm readers)
//   scores   score[c] = sum_{h ascending} relu(k_c . q_h) * w_h over the native E2M1 key rows
//   select   the top_k rows, lower index first on equal scores, as a mask and an ascending list
// Active only when n_comp > top_k (read from device memory); otherwise n_selected = 0 (every
// compressed row visible) and nothing else is written.
//
// Contract: exact. Prepared q/w and scores equal ref::indexer_queries/_head_weights/_scores bit
// for bit. Scores take one of two paths, both exact:
//  - int8 tensor cores (mma.sync m16n8k32 s8, sm_80 and sm_90), when the launch carries the int8
//    scratch: doubled E2M1 codes shifted by their block's exponent above the row's smallest are
//    int8, the 128-dim dot is an exact int32, and the reference's float dot, relu, products and
//    ordered head sum follow from it bit for bit (kernels/indexer_int8.hpp has the argument and
//    the CPU proof is tests/indexer_test.cpp). Each score is summed over its heads in order by one
//    thread after a shared-memory transpose of the accumulators.
//    Precondition, over the blocks that hold a nonzero code: a key's block exponents lie within 3
//    of their minimum and in [-23, 13]; a query head's lie within 3 of their minimum eqmin, with
//    -124 <= eqmin <= 95, and w_h = 0 or 2^-103 <= |w_h * 2^(eqmin-2)| <= 2^86. A key that fails is
//    scored by the scalar dots inside the same CTA; a head that fails sends its whole sequence to
//    the scalar kernel (the prepare kernel writes per-head flags, both score kernels read them).
//  - scalar FP32 on CUDA cores, the fallback and the only path without the int8 scratch: each
//    dot runs the reference's sequential order over the 128 dims in one thread (keys decoded as
//    decode_indexer_row), and each score sums its heads in order in one thread.
// The selection is exact given the scores: a 4-pass radix select (8 bits per pass) over the
// order-preserving integer keys of the scores (-0 taken as +0, so equal floats tie), histograms
// spread over all blocks with integer atomics (order-free), then the rows above the threshold
// plus the first E rows equal to it in index order (block scans, block totals summed in order):
// the set of ref::indexer_top_k. NaN scores are outside the contract (the reference's order is
// not total there). A capacity of one select block (<= 1024 rows) runs the same steps in one CTA
// per sequence with the keys in registers: one launch instead of six. (A 512 x 40 form for up to
// 20,480 rows lost 5.8% of the whole model's decode at 64K on the H200: one SM for ~16K keys.)
// Graph contract: positions and n_comp from device memory; grids from the capacities (the
// path per sequence is chosen on the device, both score kernels are always launched and exit
// early where the other one owns the sequence); scratch (histograms zero on entry and left
// zero, select state, block counts, int8 queries/weights/flags) from the caller.
// Shapes: n_head <= 64, head dim 128 (key rows of 80 bytes; the int8 path reads them 16 bytes at
// a time), any n_comp_capacity, top_k >= 1.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/launch.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/kernels/compressor.cuh"
#include "ds4/kernels/indexer_int8.hpp"
#include "ds4/model/kv_layout.hpp"

namespace ds4::kernels {

inline constexpr int indexer_dim = 128;
inline constexpr int indexer_max_heads = 64;
inline constexpr int indexer_threads = 256;
inline constexpr int indexer_score_keys = 32;       // keys per scores CTA (one per lane)
inline constexpr int indexer_select_items = 4;      // scores per thread in the select kernels
inline constexpr int indexer_select_block = indexer_threads * indexer_select_items;
inline constexpr int indexer_radix_passes = 4;
inline constexpr int indexer_int8_warps = 4;
inline constexpr int indexer_int8_threads = 32 * indexer_int8_warps;
inline constexpr int indexer_int8_step = 32;        // keys per warp step: 4 mma n-tiles of 8
// CTAs per SM of the int8 kernel: three (12 warps) cap it at 168 registers, where it needs
// ~190 unbounded; sm_90 fits (nvcc 13, no spills, 32-bit shared addresses for the product
// transpose), sm_80 takes two (189 registers).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define DS4_INDEXER_INT8_MIN_BLOCKS 2
#else
#define DS4_INDEXER_INT8_MIN_BLOCKS 3
#endif
// Row stride of the [key][head] product transpose: 68 = 4 mod 32 makes the accumulator stores
// (keys 2t, banks 8t + g) and the 16-byte row loads (8 keys, banks 4 * key) conflict-free.
inline constexpr int indexer_int8_prod_stride = indexer_max_heads + 4;

struct indexer_launch {
    int n_head = 0, top_k = 0;
    int n_seq = 0;             // sequence capacity (grid)
    int n_comp_capacity = 0;   // rows per sequence the scratch holds (grid)
    const std::uint32_t* pos = nullptr;    // [n_seq], compressor_idle = no token
    const std::int32_t* n_comp = nullptr;  // [n_seq] compressed rows now stored
    const float* q_raw = nullptr;          // q_raw + s * q_stride: n_head*128 values
    int q_stride = 0;
    const float* w_raw = nullptr;          // w_raw + s * w_stride: n_head values
    int w_stride = 0;
    float w_scale = 0;                     // 1.0f / sqrtf(float(128 * n_head)), as the reference
    rope_params rope;
    float* q = nullptr;                    // [n_seq][n_head*128] prepared queries
    float* w = nullptr;                    // [n_seq][n_head] prepared head weights
    kv_pages keys;                         // indexer key rows (indexer_row_layout{128})
    float* scores = nullptr;               // [n_seq][n_comp_capacity]
    unsigned* hist = nullptr;              // [n_seq][4][256], zero; left zero
    unsigned* sel_state = nullptr;         // [n_seq][5][2]
    unsigned* block_counts = nullptr;      // [n_seq][select_blocks][2]
    std::uint8_t* mask = nullptr;          // [n_seq][n_comp_capacity]: 1 = selected (rows < n_comp)
    std::int32_t* selected = nullptr;      // [n_seq][top_k]: selected rows, ascending
    std::int32_t* n_selected = nullptr;    // [n_seq]: top_k, or 0 when every row is visible
    // int8 tensor-core scores (all three or none; none = scalar scores only; 8-byte aligned):
    std::int8_t* q_int8 = nullptr;         // [n_seq][64][128] query operands Q8
    float* w_int8 = nullptr;               // [n_seq][64] w_h * 2^(eqmin_h - 2)
    std::uint8_t* head_int8 = nullptr;     // [n_seq][64] 1 = the head meets the precondition
};

DS4_HD_INLINE int indexer_select_blocks(int n_comp_capacity) {
    return (n_comp_capacity + indexer_select_block - 1) / indexer_select_block;
}

namespace detail {

__device__ __forceinline__ bool indexer_active(const indexer_launch& a, int seq, int& n) {
    n = a.n_comp[seq];
    return a.pos[seq] != compressor_idle && n > a.top_k;
}

// Whether every head of the sequence meets the int8 precondition (the prepare kernel's flags).
// Every thread of the block calls; needs blockDim.x >= n_head.
__device__ __forceinline__ bool indexer_seq_int8(const indexer_launch& a, int seq) {
    const int t = int(threadIdx.x);
    return __syncthreads_and(t >= a.n_head || a.head_int8[std::size_t(seq) * indexer_max_heads + t] != 0) != 0;
}

// Order-preserving key: larger float, larger key; -0 maps with +0.
__device__ __forceinline__ unsigned score_key(float s) {
    unsigned u = float_bits(s);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace detail

// The kernels below are templates only for linkage: this header may be included by several
// translation units, and a __global__ function cannot be inline.

// One CTA per (head, sequence), one thread per dim.
template <int = 0>
__global__ void __launch_bounds__(indexer_dim) indexer_prepare_kernel(const __grid_constant__ indexer_launch a) {
    pdl_enter();
    __shared__ float x[indexer_dim];
    const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
    int n;
    if (!detail::indexer_active(a, seq, n)) return;
    x[tid] = a.q_raw[std::size_t(seq) * a.q_stride + std::size_t(h) * indexer_dim + tid];
    if (tid == 0) a.w[std::size_t(seq) * a.n_head + h] = mul_rn(a.w_raw[std::size_t(seq) * a.w_stride + h], a.w_scale);
    __syncthreads();
    if (tid < 32) {
        float sn, cs;
        sincos_f32(rope_theta(a.rope, a.pos[seq], tid), &sn, &cs);
        rope_rotate(x[64 + 2 * tid], x[64 + 2 * tid + 1], cs, sn);
    }
    __syncthreads();
    static_assert(indexer_dim == 128, "the indexer's Hadamard is 128 wide");
    detail::hadamard128_block(x, tid);
    // E2M1 round trip per 32-value block: one warp per block.
    const float v = mul_rn(x[tid], 0.08838834764831845f);
    const float amax = detail::warp_max_num(max_num(0.0f, abs_exact(v)));
    const int e = ceil_log2(div_rn(max_num(amax, e2m1_amax_floor), e2m1_max));
    const std::uint8_t code = e2m1_encode_scaled(v, exp2i(-e));
    a.q[std::size_t(seq) * a.n_head * indexer_dim + std::size_t(h) * indexer_dim + tid] =
        mul_rn(e2m1_decode(code), exp2i(e));
    if (a.q_int8 == nullptr) return;
    // The int8 operands and the head's precondition (indexer_int8.hpp): block exponents and
    // nonzero blocks meet in shared memory, every thread derives eqmin.
    __shared__ int block_e[4], block_nz[4];
    const bool nz = __any_sync(0xffffffffu, (code & 7u) != 0);
    if ((tid & 31) == 0) {
        block_e[tid >> 5] = e;
        block_nz[tid >> 5] = nz ? 1 : 0;
    }
    __syncthreads();
    const int be[4] = {block_e[0], block_e[1], block_e[2], block_e[3]};
    const unsigned mask = unsigned(block_nz[0]) | unsigned(block_nz[1]) << 1 | unsigned(block_nz[2]) << 2 |
                          unsigned(block_nz[3]) << 3;
    const indexer_query_int8 qm =
        indexer_query_int8_of(be, mask, mul_rn(a.w_raw[std::size_t(seq) * a.w_stride + h], a.w_scale));
    const std::size_t hh = std::size_t(seq) * indexer_max_heads + h;
    a.q_int8[hh * indexer_dim + tid] = static_cast<std::int8_t>(indexer_int8_value(code, e - qm.eqmin));
    if (tid == 0) {
        a.w_int8[hh] = qm.w8;
        a.head_int8[hh] = qm.exact ? 1 : 0;
    }
}

namespace detail {

// Whether the sequence's scores are the scalar kernel's: active, and not every head inside the
// int8 precondition (or no int8 scratch). One thread per sequence.
__device__ __forceinline__ bool indexer_scalar_seq(const indexer_launch& a, int seq, int& n) {
    if (!indexer_active(a, seq, n)) return false;
    if (a.head_int8 == nullptr) return true;
    const std::uint8_t* f = a.head_int8 + std::size_t(seq) * indexer_max_heads;
    bool all = true;
    for (int h = 0; h < a.n_head; ++h) all = all && f[h] != 0;
    return !all;
}

}  // namespace detail

// Scalar scores, 32 keys per group, lane = key; warp w computes heads w, w+8, ... (up to 8 per
// thread), each dot sequential over the 128 dims. Key rows sit in shared memory rotated by the key
// index so the 32 lanes reading dim i hit 32 banks; queries are broadcast.
// Scheduling: the groups of the sequences this kernel owns (active and not on the int8 path) are
// numbered across the batch, 256 sequences at a time (a thread per sequence, a block scan of the
// group counts), and CTA b takes the b-th contiguous share, so that one fallback sequence in a
// large batch still spreads over the whole grid, and a batch on the int8 path costs one pass.
template <int = 0>
__global__ void __launch_bounds__(indexer_threads) indexer_scores_kernel(const __grid_constant__ indexer_launch a) {
    pdl_enter();
    using scan_t = cub::BlockScan<unsigned, indexer_threads>;
    __shared__ float qs[indexer_max_heads * indexer_dim];
    // Later: products [head][key]; between groups the scan's storage and the owner broadcast
    // (the two arrays already fill the 48 KB of static shared memory).
    __shared__ __align__(16) float ks[indexer_score_keys * indexer_dim];
    static_assert(sizeof(typename scan_t::TempStorage) <= sizeof(ks) - 16, "scan storage inside ks");
    auto& scan_tmp = *reinterpret_cast<typename scan_t::TempStorage*>(ks);
    int* owner = reinterpret_cast<int*>(ks) + indexer_score_keys * indexer_dim - 4;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int per_thread = indexer_max_heads / (indexer_threads / 32);
    int loaded = -1;  // sequence whose queries sit in qs
    for (int s0 = 0; s0 < a.n_seq; s0 += indexer_threads) {
        int n = 0;
        const bool mine = s0 + tid < a.n_seq && detail::indexer_scalar_seq(a, s0 + tid, n);
        const unsigned groups = mine ? unsigned((n + indexer_score_keys - 1) / indexer_score_keys) : 0u;
        unsigned start, total;
        __syncthreads();  // ks is no longer read
        scan_t(scan_tmp).ExclusiveSum(groups, start, total);
        const unsigned hi = unsigned((unsigned long long)total * (blockIdx.x + 1) / gridDim.x);
        unsigned l = unsigned((unsigned long long)total * blockIdx.x / gridDim.x);
        while (l < hi) {
            // The sequence that owns group l broadcasts itself; this CTA takes its groups up to hi.
            __syncthreads();
            if (groups != 0 && start <= l && l < start + groups) {
                owner[0] = s0 + tid;
                owner[1] = int(start);
                owner[2] = n;
                owner[3] = int(start + groups);
            }
            __syncthreads();
            const int seq = owner[0], sn = owner[2];
            const unsigned first = unsigned(owner[1]), end = unsigned(owner[3]) < hi ? unsigned(owner[3]) : hi;
            for (; l < end; ++l) {
                const int c0 = int(l - first) * indexer_score_keys;
                __syncthreads();  // the owner broadcast, the previous group's products and queries are read
                if (seq != loaded) {
                    const float* q = a.q + std::size_t(seq) * a.n_head * indexer_dim;
                    for (int i = tid; i < a.n_head * indexer_dim; i += indexer_threads) qs[i] = q[i];
                    loaded = seq;
                }
                for (int f = tid; f < indexer_score_keys * indexer_dim; f += indexer_threads) {
                    const int c = f / indexer_dim, i = f % indexer_dim;
                    float v = 0.0f;
                    if (c0 + c < sn) {
                        // decode_indexer_row: code * 2^e, then the F16 round.
                        const std::uint8_t* row = kv_page_row(a.keys, seq, c0 + c);
                        const std::uint8_t code = std::uint8_t((row[i / 2] >> (4 * (i & 1))) & 0xfu);
                        const int e = static_cast<std::int8_t>(row[64 + i / e2m1_block_size]);
                        v = f16_round(mul_rn(e2m1_decode(code), exp2i(e)));
                    }
                    ks[c * indexer_dim + ((i + c) & (indexer_dim - 1))] = v;
                }
                __syncthreads();
                float acc[per_thread];
                for (int k = 0; k < per_thread; ++k) acc[k] = 0.0f;
                const float* krow = ks + lane * indexer_dim;
#pragma unroll 4
                for (int i = 0; i < indexer_dim; ++i) {
                    const float kv = krow[(i + lane) & (indexer_dim - 1)];
#pragma unroll
                    for (int k = 0; k < per_thread; ++k) {
                        const int h = warp + 8 * k;
                        if (h < a.n_head) acc[k] = add_rn(acc[k], mul_rn(kv, qs[h * indexer_dim + i]));
                    }
                }
                __syncthreads();
                float* prod = ks;  // [head][key]
                const float* w = a.w + std::size_t(seq) * a.n_head;
#pragma unroll
                for (int k = 0; k < per_thread; ++k) {
                    const int h = warp + 8 * k;
                    if (h < a.n_head) prod[h * indexer_score_keys + lane] = mul_rn(acc[k] > 0.0f ? acc[k] : 0.0f, w[h]);
                }
                __syncthreads();
                if (warp == 0 && c0 + lane < sn) {
                    float sum = 0.0f;
                    for (int h = 0; h < a.n_head; ++h) sum = add_rn(sum, prod[h * indexer_score_keys + lane]);
                    a.scores[std::size_t(seq) * a.n_comp_capacity + c0 + lane] = sum;
                }
            }
        }
    }
}

namespace detail {

__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

// 16-byte shared-memory store and load at a 32-bit shared address (the compiler keeps generic
// pointers into shared memory as 64-bit registers otherwise).
__device__ __forceinline__ void st_shared_f4(unsigned addr, const float4& v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

__device__ __forceinline__ float4 ld_shared_f4(unsigned addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr)
                 : "memory");
    return v;
}

// The first k-step: C is `c` in all four elements (a loop-invariant register), so the
// accumulators need no initialising moves.
__device__ __forceinline__ void mma_s8_16832_from(int (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, int c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// A lane's key bytes of one warp step (32 keys from `base`, inside one page since base is a
// multiple of 32, so rows are `rows` + key * row_bytes): block t of key 8j + g for n-tile j, and
// the exponent word of key 8t + g, whose precondition this lane evaluates. Keys at or past
// `live` (= n - base) read as zero.
struct int8_step_rows {
    uint4 code[4];
    unsigned exps;
};

__device__ __forceinline__ uint4 int8_load_block(const std::uint8_t* rows, int rb, int live, int key, int t) {
    if (key >= live) return make_uint4(0, 0, 0, 0);
    return __ldg(reinterpret_cast<const uint4*>(rows + key * rb + 16 * t));
}

__device__ __forceinline__ unsigned int8_load_exponents(const std::uint8_t* rows, int rb, int live, int key) {
    if (key >= live) return 0u;
    return __ldg(reinterpret_cast<const unsigned*>(rows + key * rb + 64));
}

// The 16 B of one key block as the four B-fragment pairs of the four k-steps.
__device__ __forceinline__ void int8_key_fragments(const uint4& c, const indexer_int8_table& tb, unsigned (&b)[4][2]) {
    indexer_codes_to_int8(c.x, tb, b[0][0], b[0][1]);
    indexer_codes_to_int8(c.y, tb, b[1][0], b[1][1]);
    indexer_codes_to_int8(c.z, tb, b[2][0], b[2][1]);
    indexer_codes_to_int8(c.w, tb, b[3][0], b[3][1]);
}

}  // namespace detail

// Scores on int8 tensor cores (indexer_int8.hpp), one CTA per `chunk` keys of one sequence, each
// warp 32 keys per step. mma m16n8k32: A = queries (4 m-tiles of 16 heads, in registers for the
// whole CTA), B = keys (4 n-tiles of 8), K = 128 dims as 4 k-steps. The dims are permuted the
// same way on both sides so that lane (g, t) holds block t of its key: k-step s takes dims
// 32t + 8s .. 32t + 8s + 7 of lane t, i.e. the word s of the block's 16 bytes, so one 16-byte load
// and one shift (one byte-permute table) serve a lane's whole key. The heads are permuted too:
// m-tile i rows g / g + 8 are heads 8g + 2i / 8g + 2i + 1, so each lane's accumulators cover 8
// consecutive heads of its 2 keys per n-tile. Accumulators start at 2^23's bits; the relu'd
// product with w8 is one FMA, written to shared memory [key][head] as two 16-byte stores per key
// (padded rows, chunk order of indexer_prod_chunk_pos), then lane k sums key k's 64 products in
// head order (16 16-byte loads) and scales by 2^ekmin. Keys outside the precondition get the
// scalar dots from the whole warp (heads lane and lane + 32, the reference's order) as true
// products with scale 1.
// Cost per key (warp instructions): 2 mma; ~5.5 of nibble conversion (11 per code word: 6 PRMT,
// 5 selector ops); 4 of relu (IMNMX) and FMA; 0.5 STS.128; 0.5 LDS.128 + 2 FADD for the head
// sum; the rest loads, key precondition, shuffles. PTX of one 32-key step: ~985 instructions,
// against ~1300 before this layout (64 STS.32, a rolled head-sum loop, branchy precondition),
// whose SASS measured 27.5 per key on an H200: predicted ~20 per key, ~8 SM cycles per key at
// the 54-60% issue efficiency seen (~32 G keys/s). The shared-memory transpose is 512 B per
// key, 4 SM cycles at 128 B/clk, conflict-free in both directions.
template <int = 0>
__global__ void __launch_bounds__(indexer_int8_threads, DS4_INDEXER_INT8_MIN_BLOCKS)
    indexer_scores_int8_kernel(const __grid_constant__ indexer_launch a, int chunk) {
    pdl_enter();
    static_assert(indexer_int8_threads >= indexer_max_heads, "indexer_seq_int8 reads one head per thread");
    __shared__ __align__(16) float prod[indexer_int8_warps][indexer_int8_step * indexer_int8_prod_stride];
    __shared__ float kdec[indexer_int8_warps][indexer_dim];
    const int seq = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int n;
    if (!detail::indexer_active(a, seq, n)) return;
    if (!detail::indexer_seq_int8(a, seq)) return;
    const int c_begin = blockIdx.x * chunk;
    if (c_begin >= n) return;
    const int c_end = min(n, c_begin + chunk);
    constexpr unsigned full = 0xffffffffu;
    constexpr int ps = indexer_int8_prod_stride;

    // A fragments: m-tile i rows g / g + 8 = heads 8g + 2i / 8g + 2i + 1; k-step s cols 4t.. and
    // 16 + 4t.. = dims 32t + 8s + 0..3 and 4..7 (8 contiguous bytes). Padding heads are zero.
    unsigned qa[4][4][4];
    float w8[4][2], c8[4][2];
    const std::int8_t* q8 = a.q_int8 + std::size_t(seq) * indexer_max_heads * indexer_dim;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int head = 8 * g + 2 * i + hr;
            const bool live = head < a.n_head;
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const uint2 v = live ? *reinterpret_cast<const uint2*>(q8 + head * indexer_dim + 32 * t + 8 * s)
                                     : make_uint2(0, 0);
                qa[i][s][hr] = v.x;
                qa[i][s][2 + hr] = v.y;
            }
            w8[i][hr] = live ? a.w_int8[std::size_t(seq) * indexer_max_heads + head] : 0.0f;
            c8[i][hr] = mul_rn(w8[i][hr], -indexer_int8_bias_value);
        }

    float* pw = prod[warp];
    float* kd = kdec[warp];
    // This lane's product stores: keys 8j + 2t + kk, head chunks 2g + q (heads 8g + 4q .. + 3).
    // Per quarter-warp (g = 2p, 2p + 1; t = 0..3) the 16-byte bank group is
    // (2t + kk + pos(2g + q)) mod 8 (stride 68 = 17 groups = 1 mod 8), and pos(4p + 2 + q) - pos(4p + q)
    // is odd, so the 8 lanes hit 8 groups; the head-sum loads (8 consecutive keys, same chunk) too.
    const unsigned pst0 = detail::smem_addr(pw + 2 * t * ps + 4 * indexer_prod_chunk_pos(2 * g));
    const unsigned pst1 = detail::smem_addr(pw + 2 * t * ps + 4 * indexer_prod_chunk_pos(2 * g + 1));
    const unsigned pld = detail::smem_addr(pw + lane * ps);
    const int stride = indexer_int8_warps * indexer_int8_step;
    int base = c_begin + warp * indexer_int8_step;
    // One step of loads in flight per warp: the next step's block of n-tile j is requested as
    // soon as this step's is converted, which keeps one copy of the 17 registers live.
    const int rb = a.keys.row_bytes;
    detail::int8_step_rows cur{}, nxt{};
    if (base < c_end) {
        const std::uint8_t* rows = kv_page_row(a.keys, seq, base);
#pragma unroll
        for (int j = 0; j < 4; ++j) cur.code[j] = detail::int8_load_block(rows, rb, n - base, 8 * j + g, t);
        cur.exps = detail::int8_load_exponents(rows, rb, n - base, 8 * t + g);
    }
    for (; base < c_end; base += stride) {
        const bool more = base + stride < c_end;
        const std::uint8_t* next_rows = more ? kv_page_row(a.keys, seq, base + stride) : nullptr;
        if (more) nxt.exps = detail::int8_load_exponents(next_rows, rb, n - base - stride, 8 * t + g);
        // Key precondition: lane (g, t) for key 8t + g; nonzero blocks from one ballot per n-tile
        // (bit 4g + b = block b of key 8j + g).
        unsigned nzb[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint4 c = cur.code[j];
            nzb[j] = __ballot_sync(full, ((c.x | c.y | c.z | c.w) & 0x77777777u) != 0);
        }
        const unsigned mine = t == 0 ? nzb[0] : (t == 1 ? nzb[1] : (t == 2 ? nzb[2] : nzb[3]));
        const unsigned meta = indexer_key_meta_of(cur.exps, (mine >> (4 * g)) & 15u);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const unsigned mj = __shfl_sync(full, meta, 4 * g + j);
            unsigned b[4][2];
            detail::int8_key_fragments(cur.code[j], indexer_int8_table_for(indexer_meta_shift(mj, t)), b);
            if (more) nxt.code[j] = detail::int8_load_block(next_rows, rb, n - base - stride, 8 * j + g, t);
            int acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) detail::mma_s8_16832_from(acc[i], qa[i][0], b[0][0], b[0][1], indexer_int8_bias);
#pragma unroll
            for (int s = 1; s < 4; ++s)
#pragma unroll
                for (int i = 0; i < 4; ++i) detail::mma_s8_16832(acc[i], qa[i][s], b[s][0], b[s][1]);
            // C: rows g / g + 8 of m-tile i = heads 8g + 2i / 8g + 2i + 1 (acc[i][r], hr = r / 2),
            // cols 2t / 2t + 1 = keys 8j + 2t + kk (kk = r % 2). Chunk q of key kk holds heads
            // 8g + 4q + 0..3 = m-tiles 2q, 2q + 1, rows g and g + 8 each.
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    float4 v;
                    v.x = indexer_int8_product(acc[2 * q][kk], w8[2 * q][0], c8[2 * q][0]);
                    v.y = indexer_int8_product(acc[2 * q][2 + kk], w8[2 * q][1], c8[2 * q][1]);
                    v.z = indexer_int8_product(acc[2 * q + 1][kk], w8[2 * q + 1][0], c8[2 * q + 1][0]);
                    v.w = indexer_int8_product(acc[2 * q + 1][2 + kk], w8[2 * q + 1][1], c8[2 * q + 1][1]);
                    detail::st_shared_f4((q == 0 ? pst0 : pst1) + 4 * (8 * j + kk) * ps, v);
                }
        }
        __syncwarp();
        // Lane = key from here: its precondition word comes from lane 4 * (key % 8) + key / 8.
        const unsigned mk = __shfl_sync(full, meta, 4 * (lane & 7) + (lane >> 3));
        const bool live = base + lane < c_end;
        unsigned bad = __ballot_sync(full, live && !indexer_meta_exact(mk));
        while (bad != 0) {
            const int key = __ffs(bad) - 1;
            bad &= bad - 1;
            const std::uint8_t* row = kv_page_row(a.keys, seq, base + key);
            for (int i = lane; i < indexer_dim; i += 32) {
                const std::uint8_t code = std::uint8_t((row[i / 2] >> (4 * (i & 1))) & 0xfu);
                kd[i] = f16_round(mul_rn(e2m1_decode(code), exp2i(static_cast<std::int8_t>(row[64 + i / e2m1_block_size]))));
            }
            __syncwarp();
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int h = lane + 32 * hh;
                float p = 0.0f;
                if (h < a.n_head) {
                    const float* qh = a.q + (std::size_t(seq) * a.n_head + h) * indexer_dim;
                    float d = 0.0f;
#pragma unroll 1
                    for (int i = 0; i < indexer_dim; i += 4) {
                        const float4 qv = *reinterpret_cast<const float4*>(qh + i);
                        d = add_rn(d, mul_rn(kd[i], qv.x));
                        d = add_rn(d, mul_rn(kd[i + 1], qv.y));
                        d = add_rn(d, mul_rn(kd[i + 2], qv.z));
                        d = add_rn(d, mul_rn(kd[i + 3], qv.w));
                    }
                    p = mul_rn(d > 0.0f ? d : 0.0f, a.w[std::size_t(seq) * a.n_head + h]);
                }
                pw[key * ps + indexer_prod_offset(h)] = p;
            }
            __syncwarp();
        }
        // The ordered head sum of key `lane` (padding heads and fallback keys hold +0 / true p):
        // chunk c = heads 4c .. 4c + 3, at its permuted place in the row.
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < indexer_max_heads / 4; ++c) {
            const float4 v = detail::ld_shared_f4(pld + 16 * indexer_prod_chunk_pos(c));
            s = add_rn(add_rn(add_rn(add_rn(s, v.x), v.y), v.z), v.w);
        }
        if (live) {
            const float scale = indexer_meta_exact(mk) ? exp2i(indexer_meta_ekmin(mk)) : 1.0f;
            a.scores[std::size_t(seq) * a.n_comp_capacity + base + lane] = mul_rn(s, scale);
        }
        __syncwarp();
        cur = nxt;
    }
}

namespace detail {

using select_scan = cub::BlockScan<unsigned, indexer_threads>;
using select_reduce = cub::BlockReduce<unsigned, indexer_threads>;

// From the histogram of pass p (digit at bits 24-8p) and the rank still to find, the digit that
// holds it and the rank inside that digit. All threads call; the result is in shared memory.
__device__ __forceinline__ void pick_digit(const unsigned* hist, unsigned krem, unsigned& digit_s, unsigned& krem_s,
                                           typename select_scan::TempStorage& tmp) {
    const int t = threadIdx.x;
    // L2 reads: the single-CTA select reads a histogram its own atomics built in this launch.
    const unsigned cnt = __ldcg(hist + (255 - t));
    unsigned incl;
    select_scan(tmp).InclusiveSum(cnt, incl);
    const unsigned excl = incl - cnt;
    if (excl < krem && incl >= krem) {
        digit_s = unsigned(255 - t);
        krem_s = krem - excl;
    }
    __syncthreads();
}

// The select state before pass `pass` (prefix of the threshold key, rank within it), from the
// state before the previous pass and its histogram. Written to shared memory.
__device__ __forceinline__ void select_state_for(const indexer_launch& a, int seq, int pass, unsigned& prefix_s,
                                                 unsigned& krem_s, typename select_scan::TempStorage& tmp) {
    if (pass == 0) {
        if (threadIdx.x == 0) {
            prefix_s = 0;
            krem_s = unsigned(a.top_k);
        }
        __syncthreads();
        return;
    }
    __shared__ unsigned digit_s;
    const unsigned* st = a.sel_state + (std::size_t(seq) * 5 + (pass - 1)) * 2;
    const unsigned prev_prefix = st[0], prev_krem = st[1];
    pick_digit(a.hist + (std::size_t(seq) * indexer_radix_passes + (pass - 1)) * 256, prev_krem, digit_s, krem_s, tmp);
    if (threadIdx.x == 0) prefix_s = prev_prefix | (digit_s << (24 - 8 * (pass - 1)));
    __syncthreads();
}

// The select kernels' bodies, for select block `blk` of sequence `seq`: each kernel below runs
// one on its grid. Every return before a barrier is uniform over the CTA.

// Pass `pass` of the radix select: histogram of the next 8 bits of the keys that match the
// prefix found so far. Block 0 records the state the pass started from.
__device__ __forceinline__ void select_hist_block(const indexer_launch& a, int seq, int blk, int pass) {
    __shared__ unsigned h[256];
    __shared__ unsigned prefix_s, krem_s;
    __shared__ typename select_scan::TempStorage tmp;
    const int tid = threadIdx.x;
    int n;
    if (!indexer_active(a, seq, n)) return;
    const int base = blk * indexer_select_block;
    if (base >= n) return;
    h[tid] = 0;
    select_state_for(a, seq, pass, prefix_s, krem_s, tmp);
    if (blk == 0 && tid == 0) {
        unsigned* st = a.sel_state + (std::size_t(seq) * 5 + pass) * 2;
        st[0] = prefix_s;
        st[1] = krem_s;
    }
    const unsigned mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
    const int shift = 24 - 8 * pass;
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        if (c < n) {
            const unsigned key = score_key(scores[c]);
            if ((key & mask) == prefix_s) atomicAdd(&h[(key >> shift) & 255u], 1u);
        }
    }
    __syncthreads();
    if (h[tid]) atomicAdd(&a.hist[(std::size_t(seq) * indexer_radix_passes + pass) * 256 + tid], h[tid]);
}

// After the last pass: the threshold key T and E, the number of rows equal to T to take; each
// block counts its rows above and equal to T.
__device__ __forceinline__ void select_count_block(const indexer_launch& a, int seq, int blk) {
    __shared__ unsigned prefix_s, krem_s;
    __shared__ typename select_scan::TempStorage tmp;
    __shared__ typename select_reduce::TempStorage rtmp;
    const int tid = threadIdx.x;
    int n;
    if (!indexer_active(a, seq, n)) return;
    const int base = blk * indexer_select_block;
    if (base >= n) return;
    select_state_for(a, seq, indexer_radix_passes, prefix_s, krem_s, tmp);
    const unsigned T = prefix_s;
    if (blk == 0 && tid == 0) {
        unsigned* st = a.sel_state + (std::size_t(seq) * 5 + 4) * 2;
        st[0] = T;
        st[1] = krem_s;
    }
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    unsigned gt = 0, eq = 0;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        if (c < n) {
            const unsigned key = score_key(scores[c]);
            gt += key > T;
            eq += key == T;
        }
    }
    gt = select_reduce(rtmp).Sum(gt);
    __syncthreads();
    eq = select_reduce(rtmp).Sum(eq);
    if (tid == 0) {
        unsigned* bc = a.block_counts + (std::size_t(seq) * indexer_select_blocks(a.n_comp_capacity) + blk) * 2;
        bc[0] = gt;
        bc[1] = eq;
    }
}

// The mask and the ascending list: a row is taken when its key is above T, or equal to T and
// among the first E such rows in index order. Block 0 also clears the histograms.
__device__ __forceinline__ void select_write_block(const indexer_launch& a, int seq, int blk) {
    __shared__ typename select_scan::TempStorage tmp;
    __shared__ typename select_reduce::TempStorage rtmp;
    __shared__ unsigned gt_before_s, eq_before_s;
    const int tid = threadIdx.x;
    int n;
    const bool active = indexer_active(a, seq, n);
    if (blk == 0 && tid == 0) a.n_selected[seq] = active ? a.top_k : 0;
    if (!active) return;
    const int base = blk * indexer_select_block;
    if (base >= n) return;
    if (blk == 0)
        for (int i = tid; i < indexer_radix_passes * 256; i += indexer_threads)
            a.hist[std::size_t(seq) * indexer_radix_passes * 256 + i] = 0;
    const unsigned* st = a.sel_state + (std::size_t(seq) * 5 + 4) * 2;
    const unsigned T = st[0], E = st[1];
    const unsigned* bc = a.block_counts + std::size_t(seq) * indexer_select_blocks(a.n_comp_capacity) * 2;
    unsigned gt_b = 0, eq_b = 0;
    for (int b = tid; b < blk; b += indexer_threads) {
        gt_b += bc[2 * b];
        eq_b += bc[2 * b + 1];
    }
    gt_b = select_reduce(rtmp).Sum(gt_b);
    __syncthreads();
    eq_b = select_reduce(rtmp).Sum(eq_b);
    if (tid == 0) {
        gt_before_s = gt_b;
        eq_before_s = eq_b;
    }
    __syncthreads();
    const unsigned eq_before = eq_before_s;
    const unsigned sel_before = gt_before_s + (eq_before < E ? eq_before : E);
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    unsigned key[indexer_select_items];
    unsigned n_eq = 0;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        key[k] = c < n ? score_key(scores[c]) : 0u;
        n_eq += c < n && key[k] == T;
    }
    unsigned eq_rank;
    select_scan(tmp).ExclusiveSum(n_eq, eq_rank);
    eq_rank += eq_before;
    bool sel[indexer_select_items];
    unsigned n_sel = 0;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        sel[k] = false;
        if (c < n) {
            if (key[k] > T) sel[k] = true;
            else if (key[k] == T) sel[k] = eq_rank++ < E;
        }
        n_sel += sel[k];
    }
    __syncthreads();
    unsigned at;
    select_scan(tmp).ExclusiveSum(n_sel, at);
    at += sel_before;
    std::uint8_t* mask = a.mask + std::size_t(seq) * a.n_comp_capacity;
    std::int32_t* list = a.selected + std::size_t(seq) * a.top_k;
    for (int k = 0; k < indexer_select_items; ++k) {
        const int c = base + tid * indexer_select_items + k;
        if (c < n) {
            mask[c] = sel[k] ? 1 : 0;
            if (sel[k]) list[at++] = c;
        }
    }
}

}  // namespace detail

template <int = 0>
__global__ void __launch_bounds__(indexer_threads)
    indexer_select_hist_kernel(const __grid_constant__ indexer_launch a, int pass) {
    pdl_enter();
    detail::select_hist_block(a, int(blockIdx.y), int(blockIdx.x), pass);
}

template <int = 0>
__global__ void __launch_bounds__(indexer_threads) indexer_select_count_kernel(const __grid_constant__ indexer_launch a) {
    pdl_enter();
    detail::select_count_block(a, int(blockIdx.y), int(blockIdx.x));
}

template <int = 0>
__global__ void __launch_bounds__(indexer_threads) indexer_select_write_kernel(const __grid_constant__ indexer_launch a) {
    pdl_enter();
    detail::select_write_block(a, int(blockIdx.y), int(blockIdx.x));
}

// The whole selection of a sequence in one CTA, with every intermediate in registers and shared
// memory: a thread loads its ITEMS consecutive keys once, each radix pass histograms the keys that
// match the prefix so far in shared memory (one add per group of equal digits in a warp: in the
// first passes most keys share their top bits) and scans it from the top digit down, then the
// count and the write run on the keys in hand. The six-launch bodies above keep their state in
// global memory between launches; run in order in one CTA they put ~10 L2 round trips on the chain
// (7 us a ratio-4 layer at 2K on the H200). The set selected is the same (the top_k keys, lower
// index first among equal keys: defined by the scores alone), and the histograms, select state and
// block counts are left untouched (zero, as given). Capacities up to THREADS * ITEMS.
template <int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS) indexer_select_single_kernel(const __grid_constant__ indexer_launch a) {
    static_assert(THREADS >= 256 && THREADS % 32 == 0, "a thread per histogram bin");
    using scan = cub::BlockScan<unsigned, THREADS>;
    pdl_enter();
    __shared__ unsigned h[256];
    __shared__ unsigned digit_s, krem_s;
    __shared__ typename scan::TempStorage tmp;
    const int seq = int(blockIdx.y), tid = int(threadIdx.x), lane = tid % 32;
    int n;
    const bool active = detail::indexer_active(a, seq, n);
    if (tid == 0) a.n_selected[seq] = active ? a.top_k : 0;
    if (!active) return;
    const float* scores = a.scores + std::size_t(seq) * a.n_comp_capacity;
    const int base = tid * ITEMS;
    unsigned key[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) key[k] = base + k < n ? detail::score_key(scores[base + k]) : 0u;
    unsigned prefix = 0, krem = unsigned(a.top_k);
#pragma unroll 1
    for (int pass = 0; pass < indexer_radix_passes; ++pass) {
        const unsigned mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
        const int shift = 24 - 8 * pass;
        if (tid < 256) h[tid] = 0;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const bool in = base + k < n && (key[k] & mask) == prefix;
            const unsigned bin = in ? (key[k] >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&h[bin], unsigned(__popc(peers)));
        }
        __syncthreads();
        // Digits from the top down (thread t < 256 holds digit 255 - t; the others add nothing):
        // the first whose inclusive count reaches krem holds the threshold.
        const unsigned cnt = tid < 256 ? h[255 - tid] : 0u;
        unsigned incl;
        scan(tmp).InclusiveSum(cnt, incl);
        if (tid < 256 && incl - cnt < krem && incl >= krem) {
            digit_s = unsigned(255 - tid);
            krem_s = krem - (incl - cnt);
        }
        __syncthreads();
        prefix |= digit_s << shift;
        krem = krem_s;
    }
    // T = prefix; take every key above it and the first krem equal to it in index order.
    const unsigned T = prefix, E = krem;
    unsigned n_eq = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) n_eq += base + k < n && key[k] == T;
    unsigned eq_rank;
    scan(tmp).ExclusiveSum(n_eq, eq_rank);
    static_assert(ITEMS <= 64, "one bit of the taken mask per item");
    std::uint64_t sel = 0;  // bit k: item k taken
    unsigned n_sel = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        bool take = false;
        if (base + k < n) {
            if (key[k] > T) take = true;
            else if (key[k] == T) take = eq_rank++ < E;
        }
        sel |= std::uint64_t(take) << k;
        n_sel += take;
    }
    __syncthreads();
    unsigned at;
    scan(tmp).ExclusiveSum(n_sel, at);
    std::uint8_t* mask = a.mask + std::size_t(seq) * a.n_comp_capacity;
    std::int32_t* list = a.selected + std::size_t(seq) * a.top_k;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
        if (base + k < n) {
            const bool take = (sel >> k) & 1u;
            mask[base + k] = take ? 1 : 0;
            if (take) list[at++] = base + k;
        }
    }
}

inline void check_indexer_launch(const indexer_launch& a) {
    require(a.n_head >= 1 && a.n_head <= indexer_max_heads && a.top_k >= 1 && a.n_seq >= 1 &&
                a.n_comp_capacity >= 1,
            "indexer: n_head " + std::to_string(a.n_head) + " (1..64), top_k " + std::to_string(a.top_k));
    const int int8 = (a.q_int8 != nullptr) + (a.w_int8 != nullptr) + (a.head_int8 != nullptr);
    require(int8 == 0 || int8 == 3, "indexer: the int8 scratch (q_int8, w_int8, head_int8) is all or nothing");
    require(a.q_int8 == nullptr || a.keys.row_bytes % 16 == 0,
            "indexer: int8 scores need 16-byte key rows, got " + std::to_string(a.keys.row_bytes));
}

// Keys per int8 CTA: about 2048 CTAs over the capacity (the per-CTA query setup is 8 KB of
// fragment loads, so more keys per CTA at large batch), from one to 16 steps of every warp.
inline int indexer_int8_chunk(const indexer_launch& a) {
    const long long unit = indexer_int8_warps * indexer_int8_step;
    const long long keys = (long long)a.n_comp_capacity * a.n_seq;
    long long c = ((keys + 2047) / 2048 + unit - 1) / unit * unit;
    c = c < unit ? unit : (c > 16 * unit ? 16 * unit : c);
    return int(c);
}

// The scalar kernel's grid: one CTA per 32-key group of the capacity, at most 1024 (two waves of
// four 48 KB CTAs per SM on an H200; each CTA then loops over its share).
inline int indexer_scalar_blocks(const indexer_launch& a) {
    const long long groups =
        (long long)a.n_seq * ((a.n_comp_capacity + indexer_score_keys - 1) / indexer_score_keys);
    return int(groups < 1024 ? groups : 1024);
}

// The selection alone, over a.scores (radix passes, counts, write): 6 launches, or one when the
// capacity fits one select block (indexer_select_single_kernel).
inline void launch_indexer_select(const indexer_launch& a, cudaStream_t stream) {
    check_indexer_launch(a);
    if (indexer_select_blocks(a.n_comp_capacity) == 1) {
        launch_kernel("indexer_select_single_kernel",
                      indexer_select_single_kernel<indexer_threads, indexer_select_items>, dim3(1, a.n_seq),
                      indexer_threads, 0, stream, a);
        cuda_check_launch("indexer_select_single");
        return;
    }
    const dim3 grid(indexer_select_blocks(a.n_comp_capacity), a.n_seq);
    for (int pass = 0; pass < indexer_radix_passes; ++pass) {
        launch_kernel("indexer_select_hist_kernel", indexer_select_hist_kernel<>, grid, indexer_threads, 0, stream, a,
                      pass);
        cuda_check_launch("indexer_select_hist");
    }
    launch_kernel("indexer_select_count_kernel", indexer_select_count_kernel<>, grid, indexer_threads, 0, stream, a);
    cuda_check_launch("indexer_select_count");
    launch_kernel("indexer_select_write_kernel", indexer_select_write_kernel<>, grid, indexer_threads, 0, stream, a);
    cuda_check_launch("indexer_select_write");
}

// A second stream for the scalar scores kernel: it owns only the sequences the int8 kernel does
// not (none, where every head meets the int8 precondition, and it then exits at once), so it can
// run beside the int8 kernel instead of after it, off the chain prepare -> scores -> select.
// ev: the fork (after prepare) and the join (before the select), created by the caller.
struct indexer_side {
    cudaStream_t stream = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
};

// The scores alone, from the prepared q/w (and int8 operands): the int8 kernel when the launch
// carries its scratch, and the scalar kernel for the sequences it does not own, after it on
// `stream` or beside it on side.stream. 1-2 launches.
inline void launch_indexer_scores(const indexer_launch& a, cudaStream_t stream, const indexer_side& side = {}) {
    check_indexer_launch(a);
    require(side.stream == nullptr || (side.ev[0] && side.ev[1]), "indexer: a side stream needs its two events");
    auto scalar = [&](cudaStream_t s) {
        launch_kernel("indexer_scores_kernel", indexer_scores_kernel<>, indexer_scalar_blocks(a), indexer_threads, 0, s,
                      a);
        cuda_check_launch("indexer_scores");
    };
    if (a.q_int8 == nullptr) return scalar(stream);
    const bool beside = side.stream != nullptr;
    if (beside) {
        cuda_check(cudaEventRecord(side.ev[0], stream), "indexer side fork");
        cuda_check(cudaStreamWaitEvent(side.stream, side.ev[0], 0), "indexer side fork wait");
        scalar(side.stream);
    }
    const int chunk = indexer_int8_chunk(a);
    const int blocks = (a.n_comp_capacity + chunk - 1) / chunk;
    launch_kernel("indexer_scores_int8_kernel", indexer_scores_int8_kernel<>, dim3(blocks, a.n_seq),
                  indexer_int8_threads, 0, stream, a, chunk);
    cuda_check_launch("indexer_scores_int8");
    if (!beside) return scalar(stream);
    cuda_check(cudaEventRecord(side.ev[1], side.stream), "indexer side join");
    cuda_check(cudaStreamWaitEvent(stream, side.ev[1], 0), "indexer side join wait");
}

// prepare, scores, select: 8 launches (9 with the int8 scratch), 3 (4) when the select takes one.
inline void launch_indexer(const indexer_launch& a, cudaStream_t stream, const indexer_side& side = {}) {
    check_indexer_launch(a);
    launch_kernel("indexer_prepare_kernel", indexer_prepare_kernel<>, dim3(a.n_head, a.n_seq), indexer_dim, 0, stream,
                  a);
    cuda_check_launch("indexer_prepare");
    launch_indexer_scores(a, stream, side);
    launch_indexer_select(a, stream);
}

}  // namespace ds4::kernels
