#pragma once
// How kernels/hyper_connection_chunk.cuh lays out and divides a prefill chunk's HC pre, host and
// device, so that tests/hyper_connection_chunk_emulation_test.cpp replays the kernel's own maps
// on the CPU.
//
// A block takes a group of hc_chunk_rows rows and every segment of their flat state. Segment s
// passes through a shared-memory stage: the rows' 512 state values (then scaled in place to
// flat = x*scale) and the mix weights' 512 columns, both slot-major so that lane l of a warp, the
// matvec order's slot l (inputs [16l, 16l + 16) of the segment), reads consecutive 16-byte words:
//   x: float4 word (r*4 + q)*32 + l holds inputs 16l + 4q .. +3 of row r (q = 0..3);
//   w: 16-byte word (o*2 + q2)*32 + l holds inputs 16l + 8q2 .. +7 of mix output o (q2 = 0..1).
// Warp w computes outputs [w*P, (w+1)*P) (P = hc_chunk_outputs_per_warp) for all 8 rows: pair
// j = k*8 + r (output w*P + k, row r) is one of its 32 butterflies, and after the recursive
// halving (warp_halving.cuh) lane j holds pair j's segment sum.
#include <cstddef>

#include "ds4/core/host_device.hpp"
#include "ds4/format/row_dot.hpp"

namespace ds4::kernels {

inline constexpr int hc_chunk_rows = 8;      // rows per block (hc_pre_kernel's largest group)
inline constexpr int hc_chunk_threads = 256;  // 8 warps
inline constexpr int hc_chunk_warps = hc_chunk_threads / 32;
inline constexpr int hc_chunk_stages = 2;    // two stages: two blocks per SM on sm_90
inline constexpr int hc_chunk_pairs = 32;    // butterflies per warp and segment: one per lane

DS4_HD_INLINE constexpr int hc_chunk_outputs_per_warp(int n_mix) { return (n_mix + hc_chunk_warps - 1) / hc_chunk_warps; }

// Bytes of one stage: the rows' segment as floats, the weights' segment as halves.
DS4_HD_INLINE constexpr int hc_chunk_x_bytes() { return hc_chunk_rows * f16_segment * 4; }
DS4_HD_INLINE constexpr int hc_chunk_w_bytes(int n_mix) { return n_mix * f16_segment * 2; }
DS4_HD_INLINE constexpr int hc_chunk_stage_bytes(int n_mix) { return hc_chunk_x_bytes() + hc_chunk_w_bytes(n_mix); }
DS4_HD_INLINE constexpr int hc_chunk_smem_bytes(int n_mix) { return hc_chunk_stages * hc_chunk_stage_bytes(n_mix); }

// The float index in a stage's x of input i (0..511) of row r.
DS4_HD_INLINE constexpr int hc_chunk_x_index(int r, int i) {
    return ((r * 4 + (i / 4) % 4) * 32 + i / 16) * 4 + i % 4;
}
// The half index in a stage's w of input i (0..511) of mix output o.
DS4_HD_INLINE constexpr int hc_chunk_w_index(int o, int i) {
    return ((o * 2 + (i / 8) % 2) * 32 + i / 16) * 8 + i % 8;
}

// The 16-byte copies of a stage, numbered 0 .. n - 1 and spread over the threads: copy c of x is
// row c / 128, inputs 4 (c % 128) .. +3 (global order, contiguous per row); copy c of w is output
// c / 64, inputs 8 (c % 64) .. +7.
DS4_HD_INLINE constexpr int hc_chunk_x_copies() { return hc_chunk_rows * f16_segment / 4; }
DS4_HD_INLINE constexpr int hc_chunk_w_copies(int n_mix) { return n_mix * f16_segment / 8; }

// Which (output, row) lane j of warp w holds after the halving; output >= n_mix: none.
struct hc_chunk_pair {
    int output, row;
};
DS4_HD_INLINE hc_chunk_pair hc_chunk_pair_of(int warp, int j, int n_mix) {
    return {warp * hc_chunk_outputs_per_warp(n_mix) + j / hc_chunk_rows, j % hc_chunk_rows};
}

// Whether a launch of this shape fits the kernel: every warp's outputs in its 32 butterflies
// (n_mix <= 32, so n_hc <= 4), slots wholly inside or past the flat state (16-byte copies).
DS4_HD_INLINE constexpr bool hc_chunk_fits(int n_embd, int n_hc) {
    const int n_mix = 2 * n_hc + n_hc * n_hc;
    return n_embd >= 1 && n_hc >= 1 && hc_chunk_outputs_per_warp(n_mix) * hc_chunk_rows <= hc_chunk_pairs &&
           (n_hc * n_embd) % f16_lane_elems == 0;
}

}  // namespace ds4::kernels
