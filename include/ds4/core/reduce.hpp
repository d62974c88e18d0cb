#pragma once
// The fixed order of the long reductions that are not matvecs: RMSNorm's sum of squares (in
// double) and the log-softmax normaliser (in float). Shared by reference/ and the kernels (spec
// decision 1: "where a kernel needs a parallel order, the order is fixed by constants and the
// reference can replay it").
//
// The order: 256 lanes; element i belongs to chunk c = i / 4 and chunk c to lane c % 256; each
// lane sums the terms of its chunks in index order from zero (acc = acc + term, one rounding per
// add); the 256 lane sums are combined by the xor butterfly 128, 64, ..., 1 (what a block of any
// power-of-two width <= 256 computes with a register step per offset at or above its width and
// shuffles below 32). A kernel thread streams its lane with 16-byte loads, coalesced.
//
// Why not the sequential chain of docs/model.md: a 16384-long dependent chain of double adds costs
// ~70 us on one GPU thread, per HC pre, 86 times per token. Against the chain this moves the
// double sum by rounding only (the float scale almost never changes); squares of floats are
// exact in double, so an RMS term is order-free and only the additions round.
#include <cmath>
#include <cstdint>

#include "ds4/core/host_device.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"

namespace ds4 {

inline constexpr int reduce_lanes = 256;
inline constexpr int reduce_chunk = 4;

DS4_HD_INLINE double add_f64(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

DS4_HD_INLINE float add_of(float a, float b) { return add_rn(a, b); }
DS4_HD_INLINE double add_of(double a, double b) { return add_f64(a, b); }

// The butterfly over `lanes` (a power of two, 1..256) partial sums in place; returns the total.
// Every lane of the butterfly ends with the same value because addition is commutative, so
// v[l] + v[l + off] for l < off is the whole of it.
template <class T>
DS4_HD_INLINE T lane_butterfly(T* v, int lanes) {
    for (int off = lanes / 2; off > 0; off /= 2)
        for (int l = 0; l < off; ++l) v[l] = add_of(v[l], v[l + off]);
    return v[0];
}

// One chunk added to a lane's running sum: term(e) for e = 0 .. min(valid, 4) - 1, in order.
template <class T, class Term>
DS4_HD_INLINE T chunk_partial(T acc, int valid, Term term) {
    for (int e = 0; e < reduce_chunk && e < valid; ++e) acc = add_of(acc, term(e));
    return acc;
}

// One lane's sum: its chunks (lane, lane + 256, ...) in index order from zero.
template <class T, class Term>
DS4_HD_INLINE T lane_partial(int lane, int n, Term term) {
    T acc = T(0);
    for (int c = lane; c * reduce_chunk < n; c += reduce_lanes)
        acc = chunk_partial(acc, n - c * reduce_chunk, [&](int e) { return term(c * reduce_chunk + e); });
    return acc;
}

// The same lane sums with a thread's chunks visited in a streaming order. Thread t of a group of
// Threads (a power of two, 1..256) owns lanes t + Threads*j, j < lanes_per_thread; lane
// t + Threads*j's k-th chunk is chunk t + Threads*m with m = j + lanes_per_thread*k. So visiting
// m = 0, 1, ... and adding chunk m to lane sum m % lanes_per_thread adds every lane's chunks in
// index order: the lane_partial values, bit for bit. A kernel can thus load a thread's chunks as
// 16-byte vectors (chunk m at float4 index t + Threads*m, coalesced across the group), all in
// flight before the first add.
template <int Threads>
inline constexpr int lanes_per_thread = reduce_lanes / Threads;

// Adds chunk m of thread t (term(i) for its elements i < n) to the thread's lane sums v.
template <int Threads, class T, class Term>
DS4_HD_INLINE void add_thread_chunk(T (&v)[lanes_per_thread<Threads>], int t, int m, int n, Term term) {
    const int c = t + Threads * m;
    if (c * reduce_chunk >= n) return;
    // Unsigned: with m = 16*b + i the slot folds to a constant (a register, not memory).
    T& acc = v[unsigned(m) % unsigned(lanes_per_thread<Threads>)];
    acc = chunk_partial(acc, n - c * reduce_chunk, [&](int e) { return term(c * reduce_chunk + e); });
}

// add_thread_chunk for a chunk the caller knows lies wholly inside the row (n % 4 == 0 and the
// chunk starts before n): the same four adds, term(e) for e = 0..3, without the per-element
// bounds and index arithmetic (about 12 instructions and a branch per element in a kernel's
// streaming loop). The caller skips chunks past the row.
template <int Threads, class T, class Term>
DS4_HD_INLINE void add_whole_chunk(T (&v)[lanes_per_thread<Threads>], int m, Term term) {
    T& acc = v[unsigned(m) % unsigned(lanes_per_thread<Threads>)];
    acc = add_of(add_of(add_of(add_of(acc, term(0)), term(1)), term(2)), term(3));
}

// The whole reduction, sequentially: what the reference calls.
template <class T, class Term>
DS4_HD_INLINE T lane_tree_reduce(int n, Term term) {
    T lanes[reduce_lanes];
    for (int l = 0; l < reduce_lanes; ++l) lanes[l] = lane_partial<T>(l, n, term);
    return lane_butterfly(lanes, reduce_lanes);
}

// x^2 in double: exact for every float (24-bit significand squared fits in 53 bits).
DS4_HD_INLINE double square_f64(float x) { return mul_f64(double(x), double(x)); }

DS4_HD_INLINE double rms_sum_squares(const float* x, int n) {
    return lane_tree_reduce<double>(n, [x](int i) { return square_f64(x[i]); });
}

// 1/sqrtf((float)(ss / n) + eps): the mean rounded to float once, sqrtf and the division each
// correctly rounded on both sides.
DS4_HD_INLINE float rms_scale_from_sum(double ss, int n, float eps) {
#if defined(__CUDA_ARCH__)
    return div_rn(1.0f, __fsqrt_rn(add_rn(__double2float_rn(__ddiv_rn(ss, double(n))), eps)));
#else
    return 1.0f / std::sqrt(float(ss / double(n)) + eps);
#endif
}

DS4_HD_INLINE float rms_scale(const float* x, int n, float eps) {
    return rms_scale_from_sum(rms_sum_squares(x, n), n, eps);
}

// The log-softmax normaliser's sum: exp_f32(l_i - m) in the lane order above.
DS4_HD_INLINE float sum_exp_shifted(const float* l, int n, float m) {
    return lane_tree_reduce<float>(n, [l, m](int i) { return exp_f32(sub_rn(l[i], m)); });
}

#if defined(__CUDACC__)
// The lane order on one block of Threads threads (a power of two, 32..256): thread t owns lanes
// t + Threads*j (j < 256/Threads) and combines them in registers (the butterfly's offsets at or
// above Threads), then across warps through `scratch` (Threads values of T in shared memory),
// then by shuffles. Every thread of the block must call it; all return the same total, and all
// reads made by term() are complete when any thread returns.
//
// group_lane_combine is the combining half on its own: thread t (< Threads) of a warp-aligned
// group holds its lane sums v; scratch is the group's own Threads values. Every thread of the
// block must call it the same number of times (its barriers are the block's), so one block may
// reduce several groups' rows at once.
template <int Threads, class T>
__device__ __forceinline__ T group_lane_combine(T (&v)[lanes_per_thread<Threads>], T* scratch, int t) {
    static_assert(Threads >= 32 && Threads <= reduce_lanes && (Threads & (Threads - 1)) == 0);
    T acc = lane_butterfly(v, lanes_per_thread<Threads>);
#pragma unroll
    for (int off = Threads / 2; off >= 32; off /= 2) {
        scratch[t] = acc;
        __syncthreads();
        acc = add_of(acc, scratch[t ^ off]);
        __syncthreads();
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc = add_of(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    return acc;
}

template <int Threads, class T, class Term>
__device__ __forceinline__ T block_lane_reduce(int n, Term term, T* scratch) {
    const int t = int(threadIdx.x);
    T v[lanes_per_thread<Threads>];
#pragma unroll
    for (int j = 0; j < lanes_per_thread<Threads>; ++j) v[j] = lane_partial<T>(t + Threads * j, n, term);
    return group_lane_combine<Threads>(v, scratch, t);
}

// Element e (0..3) of a float4 (e a constant after unrolling: a register, not memory).
__device__ __forceinline__ float float4_at(const float4& q, int e) {
    return e == 0 ? q.x : (e == 1 ? q.y : (e == 2 ? q.z : q.w));
}

// Chunk c of x (elements 4c..4c+3; those >= n read as zero and never added): one 16-byte load
// when `vec` (x 16-byte aligned and n % 4 == 0), scalar loads otherwise.
__device__ __forceinline__ float4 load_chunk(const float* x, int c, int n, bool vec) {
    const int i = c * reduce_chunk;
    if (i >= n) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (vec) return reinterpret_cast<const float4*>(x)[c];
    return make_float4(x[i], i + 1 < n ? x[i + 1] : 0.0f, i + 2 < n ? x[i + 2] : 0.0f, i + 3 < n ? x[i + 3] : 0.0f);
}
#endif

}  // namespace ds4
