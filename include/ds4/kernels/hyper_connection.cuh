#pragma once
// Hyper-connection pre and post (docs/model.md §2.2, §2.3) and the output head's HC mix (§2.8).
// The HC state of a row is n_hc streams of n_embd floats, stream-major (X[h*n_embd + d]).
//   hc pre, two launches:
//     1. mix: each block takes RB rows and a run of 512-element segments of the flat state:
//        it computes the rows' RMS scales over n_hc*n_embd (16384 on flash) and the F16 dot
//        partials of those segments for all 24 mix outputs, one warp per (output, segment);
//     2. finish: per row, the ordered sum of the segment partials (the mix: thread o sums output
//        o's partials from shared memory), the gates and the Sinkhorn combine matrix (one
//        thread; written once per row for hc post), and the weighted stream sum
//        x_in[d] = sum_h X[h][d]*pre[h], one thread per d.
//   hc post, one launch: Y[j][d] = F[d]*post[j] + sum_i M[i][j]*X[i][d].
//   output HC mix: the two pre launches with n_hc outputs and the stable-sigmoid gates.
//
// Contract: exact. Equals reference/hyper_connection bitwise: the sum of squares in the lane
// order of core/reduce.hpp (streamed chunk by chunk through add_thread_chunk, which adds each
// lane's terms in the same order as block_lane_reduce); flat = X*scale, then the F16 matvec
// order of format/row_dot.hpp (lane l of a warp sums 16 elements in order, the xor butterfly as
// shuffles, segments added in order from zero); the scalar parts are core/hyper_connection.hpp
// itself, called as they are (n_hc = 4 a constant only so that they unroll).
// Graph contract: no allocation, no host synchronisation; the live row count is read from device
// memory; grids are functions of the row capacity and the shape only; the scratch (segment
// partials) and the split buffer come from the caller.
// Shapes: 1 <= n_hc <= 8; any n_embd (16-byte vector loads of fn and the state where rows
// allow, scalar otherwise); rows up to 65535.
//
// Block geometry: RB rows (1, 2, 4 or 8) share each fn load (the 786 KB mix weight is read
// capacity/RB times, from L2 after the first), and each row's scale is recomputed by every block
// of its row group (a 64 KB L2 read) so that no launch waits on another for it; blocks per row
// group shrink as the capacity grows to bound that recomputation.
// Cost (decode, batch 1, flash): the latency chains, not the bytes, bound both launches.
//   mix: 32 blocks; a warp's fn loads (3 items) are issued before the scale so their DRAM
//   latency overlaps it; the scale is one batch of 16 vector loads per thread, a 64-long double
//   chain and the block combine (the RB rows of a group run on their own thread groups at once).
//   finish: the 768 partials come in as one coalesced tile (3 loads per thread in flight, not
//   768 loads walked by one thread: with that, hc pre measured 91 us per call), 24 threads add
//   32 values each, and the Sinkhorn runs on one thread in registers (n_hc = 4 unrolled; a few
//   us expected). Target for both launches: ~15 us (bench/hyper_connection_bench BM_hc_pre/1).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds4/core/cuda_check.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/hyper_connection.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/row_dot.hpp"

namespace ds4::kernels {

inline constexpr int hc_threads = 256;
inline constexpr int hc_warps = hc_threads / 32;

struct hc_pre_launch {
    const float* X = nullptr;         // [capacity][n_hc][n_embd]
    const std::uint16_t* fn = nullptr;  // [n_mix][n_hc*n_embd] F16 (GGUF row-major)
    const float* scale = nullptr;     // F32[3] (pre) or F32[1] (output mix)
    const float* base = nullptr;      // F32[n_mix]
    int n_embd = 0, n_hc = 4, iters = 20;
    float rms_eps = 1e-6f, hc_eps = 1e-6f;
    bool output_mix = false;          // §2.8: n_mix = n_hc, sigmoid_stable gates, no Sinkhorn
    float* x_in = nullptr;            // [capacity][x_in_stride]: x_in (pre) or e (output mix)
    std::int64_t x_in_stride = 0;
    float* split = nullptr;           // [capacity][n_mix]: pre, post, comb (pre only; hc post reads it)
    float* partials = nullptr;        // scratch, hc_partial_floats() floats
    const std::int32_t* n_rows = nullptr;  // live rows (device); null: every row of the capacity

    __host__ __device__ int n_mix() const { return output_mix ? n_hc : 2 * n_hc + n_hc * n_hc; }
    __host__ __device__ int n_flat() const { return n_hc * n_embd; }
    __host__ __device__ int segments() const { return (n_flat() + f16_segment - 1) / f16_segment; }
};

struct hc_post_launch {
    const float* F = nullptr;      // sublayer output [capacity][F_stride]
    std::int64_t F_stride = 0;
    const float* X = nullptr;      // [capacity][n_hc][n_embd]
    const float* split = nullptr;  // from hc pre
    float* Y = nullptr;            // [capacity][n_hc][n_embd], must not alias X
    int n_embd = 0, n_hc = 4;
    const std::int32_t* n_rows = nullptr;
};

inline std::size_t hc_partial_floats(const hc_pre_launch& a, int capacity) {
    return std::size_t(capacity) * a.n_mix() * a.segments();
}

namespace detail {

__device__ __forceinline__ int live_rows(const std::int32_t* n_rows, int capacity) {
    return n_rows ? min(*n_rows, capacity) : capacity;
}

// Row-group size and blocks per row group as functions of the capacity (see the header). The row
// group is a power of two dividing hc_threads: each row of it gets its own thread group for the
// scale.
__host__ __device__ inline int hc_rows_per_block(int capacity) {
    return capacity >= 8 ? 8 : (capacity >= 4 ? 4 : (capacity >= 2 ? 2 : 1));
}
inline int hc_blocks_per_group(int capacity, int segments) {
    int b = 256 / capacity;
    b = b < 4 ? 4 : (b > 32 ? 32 : b);
    return b < segments ? b : segments;
}

// fn items whose loads a warp issues before the scale (at capacity 1 a warp has 3 items).
inline constexpr int hc_fn_preload = 4;
// Chunks a scale thread loads per batch, all in flight together: 16 (one batch for a 16384 row)
// when one row has all 256 threads, 8 when the rows share them (register room for 4 rows).
template <int RB>
inline constexpr int hc_scale_batch = RB == 1 ? 16 : 8;

// A lane's 16 F16 weights of one (output, segment) item as raw halves: two 16-byte loads when the
// row allows, scalar loads otherwise (halves past the flat length are 0 and never used).
struct hc_fn_lane {
    int4 lo, hi;
};

__device__ __forceinline__ hc_fn_lane hc_load_fn(const std::uint16_t* w, int cnt, bool vec) {
    if (vec && cnt == f16_lane_elems)
        return {__ldg(reinterpret_cast<const int4*>(w)), __ldg(reinterpret_cast<const int4*>(w) + 1)};
    std::uint32_t p[f16_lane_elems / 2];
#pragma unroll
    for (int k = 0; k < f16_lane_elems / 2; ++k) {
        const std::uint32_t h0 = 2 * k < cnt ? w[2 * k] : 0u, h1 = 2 * k + 1 < cnt ? w[2 * k + 1] : 0u;
        p[k] = h0 | (h1 << 16);
    }
    return {make_int4(int(p[0]), int(p[1]), int(p[2]), int(p[3])), make_int4(int(p[4]), int(p[5]), int(p[6]), int(p[7]))};
}

// The scale of each of the block's rows: row g on threads [g*G, (g+1)*G), G = hc_threads/RB, all
// rows' double chains at once. Each thread streams its chunks t + G*m in batches of
// hc_scale_batch vector loads and adds them through add_thread_chunk: the lane order of
// core/reduce.hpp, the same adds as block_lane_reduce (reduce.hpp says why the orders agree).
template <int RB>
__device__ __forceinline__ void hc_row_scales(const hc_pre_launch& a, int r0, int rows, double* scratch, float* scale_s) {
    constexpr int G = hc_threads / RB;
    const int g = int(threadIdx.x) / G, t = int(threadIdx.x) % G, nf = a.n_flat();
    const bool vec = nf % reduce_chunk == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0;
    double v[lanes_per_thread<G>] = {};
    if (g < rows) {
        const float* x = a.X + std::int64_t(r0 + g) * nf;
        constexpr int batch = hc_scale_batch<RB>;
        for (int b = 0; (t + G * b * batch) * reduce_chunk < nf; ++b) {
            const int m0 = b * batch;
            float4 q[batch];
#pragma unroll
            for (int i = 0; i < batch; ++i) q[i] = load_chunk(x, t + G * (m0 + i), nf, vec);
#pragma unroll
            for (int i = 0; i < batch; ++i)
                add_thread_chunk<G>(v, t, m0 + i, nf, [&](int k) { return square_f64(float4_at(q[i], k % reduce_chunk)); });
        }
    }
    const double ss = group_lane_combine<G>(v, scratch + g * G, t);
    if (t == 0 && g < rows) scale_s[g] = rms_scale_from_sum(ss, nf, a.rms_eps);
}

template <int RB>
__global__ void __launch_bounds__(hc_threads) hc_mix_kernel(const __grid_constant__ hc_pre_launch a, int capacity) {
    static_assert(hc_threads % RB == 0 && hc_threads / RB >= 32);
    __shared__ double scratch[hc_threads];
    __shared__ float scale_s[RB];
    const int n_live = live_rows(a.n_rows, capacity);
    const int r0 = int(blockIdx.y) * RB;
    if (r0 >= n_live) return;
    const int rows = min(RB, n_live - r0);
    const int nf = a.n_flat(), n_seg = a.segments(), n_mix = a.n_mix();
    const int per_block = (n_seg + int(gridDim.x) - 1) / int(gridDim.x);
    const int s0 = int(blockIdx.x) * per_block, s1 = min(s0 + per_block, n_seg);
    const int n_items = max(0, s1 - s0) * n_mix;  // (segment, output), output fastest; warp w takes w, w + 8, ...
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const bool vec = nf % 8 == 0 && reinterpret_cast<std::uintptr_t>(a.X) % 16 == 0;
    auto fn_of = [&](int item) {
        const int s = s0 + item / n_mix, o = item % n_mix, e0 = s * f16_segment + lane * f16_lane_elems;
        return hc_load_fn(a.fn + std::int64_t(o) * nf + e0, max(0, min(f16_lane_elems, nf - e0)), vec);
    };
    // The weights do not depend on the scale: their (DRAM) loads go out first and overlap it.
    hc_fn_lane pre[hc_fn_preload];
#pragma unroll
    for (int k = 0; k < hc_fn_preload; ++k)
        if (warp + hc_warps * k < n_items) pre[k] = fn_of(warp + hc_warps * k);
    hc_row_scales<RB>(a, r0, rows, scratch, scale_s);
    __syncthreads();
    auto dot = [&](int item, const hc_fn_lane& wl) {
        const int s = s0 + item / n_mix, o = item % n_mix;
        const int e0 = s * f16_segment + lane * f16_lane_elems;
        const int cnt = max(0, min(f16_lane_elems, nf - e0));
        const auto* h0 = reinterpret_cast<const std::uint16_t*>(&wl.lo);
        const auto* h1 = reinterpret_cast<const std::uint16_t*>(&wl.hi);
        float wf[f16_lane_elems];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            wf[e] = f16_to_f32(h0[e]);
            wf[8 + e] = f16_to_f32(h1[e]);
        }
        for (int rr = 0; rr < rows; ++rr) {
            const float* x = a.X + std::int64_t(r0 + rr) * nf + e0;
            float xs[f16_lane_elems];
            if (vec && cnt == f16_lane_elems) {
#pragma unroll
                for (int k = 0; k < f16_lane_elems / 4; ++k) {
                    const float4 q = __ldg(reinterpret_cast<const float4*>(x) + k);
                    xs[4 * k] = q.x, xs[4 * k + 1] = q.y, xs[4 * k + 2] = q.z, xs[4 * k + 3] = q.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < f16_lane_elems; ++e) xs[e] = e < cnt ? __ldg(x + e) : 0.0f;
            }
            const float sc = scale_s[rr];
            float q = 0.0f;
#pragma unroll
            for (int e = 0; e < f16_lane_elems; ++e)
                if (e < cnt) q = add_rn(q, mul_rn(wf[e], mul_rn(xs[e], sc)));
#pragma unroll
            for (int off = f16_lanes / 2; off > 0; off /= 2) q = add_rn(q, __shfl_xor_sync(0xffffffffu, q, off));
            if (lane == 0) a.partials[(std::int64_t(r0 + rr) * n_mix + o) * n_seg + s] = q;
        }
    };
#pragma unroll
    for (int k = 0; k < hc_fn_preload; ++k)
        if (warp + hc_warps * k < n_items) dot(warp + hc_warps * k, pre[k]);
    for (int item = warp + hc_warps * hc_fn_preload; item < n_items; item += hc_warps) dot(item, fn_of(item));
}

// Segments of the partials staged per pass of the finish kernel, and its largest mix.
inline constexpr int hc_seg_tile = 32;
inline constexpr int hc_max_mix = 2 * hc_split::max_hc + hc_split::max_hc * hc_split::max_hc;
inline constexpr int hc_tile_loads = (hc_max_mix * hc_seg_tile + hc_threads - 1) / hc_threads;

// NHC: n_hc as a constant (4 on flash), so that the split's loops unroll and its arrays live in
// registers (the same function, the same operations); 0 reads n_hc at run time.
template <int NHC>
__global__ void __launch_bounds__(hc_threads) hc_finish_kernel(const __grid_constant__ hc_pre_launch a, int capacity) {
    // Padded rows: thread o reads tile[o][s] for s ascending without bank conflicts.
    __shared__ float tile[hc_max_mix * (hc_seg_tile + 1)];
    __shared__ float mix_s[hc_max_mix];
    __shared__ float w_s[hc_split::max_hc];
    const int r = int(blockIdx.y);
    if (r >= live_rows(a.n_rows, capacity)) return;
    const int n_hc = NHC ? NHC : a.n_hc;
    const int n_mix = a.output_mix ? n_hc : 2 * n_hc + n_hc * n_hc, n_seg = a.segments();
    const int tid = int(threadIdx.x), d = int(blockIdx.x) * hc_threads + tid;
    // This thread's stream values, loaded first: their latency overlaps the mix.
    float xv[hc_split::max_hc];
    const float* X = a.X + std::int64_t(r) * n_hc * a.n_embd + d;
#pragma unroll
    for (int h = 0; h < (NHC ? NHC : hc_split::max_hc); ++h) xv[h] = h < n_hc && d < a.n_embd ? X[std::int64_t(h) * a.n_embd] : 0.0f;
    // The mix: thread o < n_mix sums its segment partials, ascending from 0.0f, out of shared
    // tiles that the whole block loads coalesced (all of a tile's loads in flight at once).
    const float* p = a.partials + std::int64_t(r) * n_mix * n_seg;
    float acc = 0.0f;
    for (int t0 = 0; t0 < n_seg; t0 += hc_seg_tile) {
        const int ts = min(hc_seg_tile, n_seg - t0);
        float v[hc_tile_loads];
#pragma unroll
        for (int k = 0; k < hc_tile_loads; ++k) {
            const int i = tid + k * hc_threads;
            if (i < n_mix * ts) v[k] = p[std::int64_t(i / ts) * n_seg + t0 + i % ts];
        }
#pragma unroll
        for (int k = 0; k < hc_tile_loads; ++k) {
            const int i = tid + k * hc_threads;
            if (i < n_mix * ts) tile[(i / ts) * (hc_seg_tile + 1) + i % ts] = v[k];
        }
        __syncthreads();
        if (tid < n_mix)
            for (int s = 0; s < ts; ++s) acc = add_rn(acc, tile[tid * (hc_seg_tile + 1) + s]);
        __syncthreads();
    }
    if (tid < n_mix) mix_s[tid] = acc;
    __syncthreads();
    if (tid == 0) {
        float mix[hc_max_mix];
#pragma unroll
        for (int o = 0; o < (NHC ? 2 * NHC + NHC * NHC : hc_max_mix); ++o) mix[o] = o < n_mix ? mix_s[o] : 0.0f;
        if (a.output_mix) {
            for (int h = 0; h < n_hc; ++h) w_s[h] = hc_output_weight(mix[h], a.scale[0], a.base[h], a.hc_eps);
        } else {
            const hc_split sp = hc_split_sinkhorn(mix, a.scale, a.base, n_hc, a.iters, a.hc_eps);
            for (int h = 0; h < n_hc; ++h) w_s[h] = sp.pre[h];
            if (blockIdx.x == 0) {
                float* out = a.split + std::int64_t(r) * n_mix;
                for (int h = 0; h < n_hc; ++h) {
                    out[h] = sp.pre[h];
                    out[n_hc + h] = sp.post[h];
                }
                for (int k = 0; k < n_hc * n_hc; ++k) out[2 * n_hc + k] = sp.comb[k];
            }
        }
    }
    __syncthreads();
    if (d >= a.n_embd) return;
    a.x_in[r * a.x_in_stride + d] = hc_weighted_sum(xv, 1, w_s, n_hc);
}

// A template only for linkage: this header may be included by several translation units, and a
// __global__ function cannot be inline.
template <int = 0>
__global__ void __launch_bounds__(hc_threads) hc_post_kernel(const __grid_constant__ hc_post_launch a, int capacity) {
    __shared__ hc_split s;
    const int r = int(blockIdx.y);
    if (r >= live_rows(a.n_rows, capacity)) return;
    const int n_mix = 2 * a.n_hc + a.n_hc * a.n_hc;
    const float* sp = a.split + std::int64_t(r) * n_mix;
    for (int k = int(threadIdx.x); k < n_mix; k += hc_threads) {
        if (k < a.n_hc) s.pre[k] = sp[k];
        else if (k < 2 * a.n_hc) s.post[k - a.n_hc] = sp[k];
        else s.comb[k - 2 * a.n_hc] = sp[k];
    }
    __syncthreads();
    const int d = int(blockIdx.x) * hc_threads + int(threadIdx.x);
    if (d >= a.n_embd) return;
    const std::int64_t base = std::int64_t(r) * a.n_hc * a.n_embd + d;
    const float f = a.F[r * a.F_stride + d];
    for (int j = 0; j < a.n_hc; ++j) a.Y[base + std::int64_t(j) * a.n_embd] = hc_post_element(f, a.X + base, a.n_embd, s, a.n_hc, j);
}

inline void check_rows(int capacity, const char* who) {
    require(capacity >= 1 && capacity <= 65535, std::string(who) + ": row capacity " + std::to_string(capacity));
}

}  // namespace detail

// HC pre (output_mix = false) or the output head's mix (output_mix = true): two launches.
inline void launch_hc_pre(const hc_pre_launch& a, int capacity, cudaStream_t stream) {
    detail::check_rows(capacity, "hc_pre");
    require(a.n_hc >= 1 && a.n_hc <= hc_split::max_hc, "hc_pre: n_hc = " + std::to_string(a.n_hc));
    require(a.n_embd >= 1, "hc_pre: n_embd = " + std::to_string(a.n_embd));
    require(a.X && a.fn && a.scale && a.base && a.x_in && a.partials, "hc_pre: null input, output or scratch");
    require(a.output_mix || a.split, "hc_pre: null split buffer");
    require(reinterpret_cast<std::uintptr_t>(a.fn) % 16 == 0, "hc_pre: fn must be 16-byte aligned");
    const int rb = detail::hc_rows_per_block(capacity);
    const dim3 mix_grid(unsigned(detail::hc_blocks_per_group(capacity, a.segments())), unsigned((capacity + rb - 1) / rb));
    switch (rb) {
        case 8: detail::hc_mix_kernel<8><<<mix_grid, hc_threads, 0, stream>>>(a, capacity); break;
        case 4: detail::hc_mix_kernel<4><<<mix_grid, hc_threads, 0, stream>>>(a, capacity); break;
        case 2: detail::hc_mix_kernel<2><<<mix_grid, hc_threads, 0, stream>>>(a, capacity); break;
        default: detail::hc_mix_kernel<1><<<mix_grid, hc_threads, 0, stream>>>(a, capacity); break;
    }
    cuda_check_launch("hc_mix");
    const dim3 grid(unsigned((a.n_embd + hc_threads - 1) / hc_threads), unsigned(capacity));
    if (a.n_hc == 4) detail::hc_finish_kernel<4><<<grid, hc_threads, 0, stream>>>(a, capacity);
    else detail::hc_finish_kernel<0><<<grid, hc_threads, 0, stream>>>(a, capacity);
    cuda_check_launch("hc_finish");
}

inline void launch_hc_post(const hc_post_launch& a, int capacity, cudaStream_t stream) {
    detail::check_rows(capacity, "hc_post");
    require(a.n_hc >= 1 && a.n_hc <= hc_split::max_hc, "hc_post: n_hc = " + std::to_string(a.n_hc));
    require(a.F && a.X && a.split && a.Y && a.n_embd >= 1, "hc_post: null input or output");
    require(a.X != a.Y, "hc_post: Y may not alias X");
    const dim3 grid(unsigned((a.n_embd + hc_threads - 1) / hc_threads), unsigned(capacity));
    detail::hc_post_kernel<><<<grid, hc_threads, 0, stream>>>(a, capacity);
    cuda_check_launch("hc_post");
}

}  // namespace ds4::kernels
