#pragma once
// The reduction order of one matvec row, shared by reference/matvec and kernels/matvec.cuh.
//
// docs/model.md §7 states the upstream order as one sequential chain per row. A chain of 256 Q8_0
// blocks (in = 8192) or 16384 F16 products per row cannot keep the H200's memory system busy
// from a single lane, so ds4 fixes a segmented order by constants (docs/README.md decision 1: "the order
// is fixed by constants and the reference can replay it"):
//   Q8_0 x Q8_0-act: segments of 16 blocks (512 inputs); inside a segment the sequential
//     per-block order of dot_q8_0; segment partials added in segment order.
//   F16 x F32: segments of 512 inputs; inside a segment 32 lane partials, lane l summing
//     elements [16l, 16l+16) sequentially (acc += f16(w)*x, no FMA); the 32 partials combined
//     by the xor butterfly 16, 8, 4, 2, 1 (what a warp shuffle reduction computes on every
//     lane); segment results added in segment order.
// Against upstream's single chain this moves results by rounding only (a few ulp of the row's
// magnitude); against our kernels it is bit-exact by construction.
#include <cstdint>

#include "ds4/core/half.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/format/q8_0.hpp"

namespace ds4 {

inline constexpr int q8_0_segment_blocks = 16;
inline constexpr int f16_segment = 512;
inline constexpr int f16_lane_elems = 16;
inline constexpr int f16_lanes = f16_segment / f16_lane_elems;

DS4_HD_INLINE float q8_0_row_dot(const q8_0_block* w, const q8_0_act_block* x, int nblocks) {
    float acc = 0.0f;
    for (int s = 0; s < nblocks; s += q8_0_segment_blocks) {
        const int n = nblocks - s < q8_0_segment_blocks ? nblocks - s : q8_0_segment_blocks;
        acc = acc + dot_q8_0(w + s, x + s, n);
    }
    return acc;
}

// One lane's partial of an F16 segment: elements [begin, end) in order.
DS4_HD_INLINE float f16_lane_partial(const std::uint16_t* w, const float* x, int begin, int end) {
    float acc = 0.0f;
    for (int i = begin; i < end; ++i) acc = acc + f16_to_f32(w[i]) * x[i];
    return acc;
}

// The butterfly a warp computes with __shfl_xor_sync over offsets 16..1; every lane ends with
// the same value because float addition is commutative.
DS4_HD_INLINE float lane_tree_sum(float (&v)[f16_lanes]) {
    for (int off = f16_lanes / 2; off > 0; off /= 2) {
        float next[f16_lanes];
        for (int l = 0; l < f16_lanes; ++l) next[l] = v[l] + v[l ^ off];
        for (int l = 0; l < f16_lanes; ++l) v[l] = next[l];
    }
    return v[0];
}

DS4_HD_INLINE float f16_row_dot(const std::uint16_t* w, const float* x, int n) {
    float acc = 0.0f;
    for (int s = 0; s < n; s += f16_segment) {
        float lanes[f16_lanes];
        for (int l = 0; l < f16_lanes; ++l) {
            int b = s + l * f16_lane_elems, e = b + f16_lane_elems;
            if (b > n) b = n;
            if (e > n) e = n;
            lanes[l] = f16_lane_partial(w, x, b, e);
        }
        acc = acc + lane_tree_sum(lanes);
    }
    return acc;
}

}  // namespace ds4
