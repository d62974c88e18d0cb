#pragma once
// The tiling of kernels/gemm_q8_0_wgmma.cuh, host and device, so that the CPU emulation
// (tests/gemm_q8_0_wgmma_emulation_test.cpp) replays the kernel's own copies and warpgroup roles:
// CTA 128 weight rows x 64 activation rows, stages of 8 Q8_0 blocks (256 bytes of k, one
// wgmma_operand.hpp operand), four warpgroups of m64n32.
#include "ds4/core/host_device.hpp"
#include "ds4/format/row_dot.hpp"

namespace ds4::kernels::gemm_wg {

inline constexpr int kb = 8;        // Q8_0 blocks per stage: 256 bytes of k, one operand's width
inline constexpr int stages = 3;
inline constexpr int bw = 128;      // weight rows per CTA
inline constexpr int bx = 64;       // activation rows per CTA
inline constexpr int n = 32;        // activation rows of a warpgroup's wgmma (N)
inline constexpr int threads = 512;
static_assert(q8_0_segment_blocks % kb == 0 || kb % q8_0_segment_blocks == 0, "segment ends fall on block boundaries");

// Weight copy c (0..2047) of a stage: operand h = c / 1024, chunk (c / 64) % 16 (block chunk / 2,
// half chunk % 2), row c % 64 (tile 2h + row / 32, lane row % 32): a warp copies one tile-half's
// 512 contiguous bytes into 512 contiguous bytes of the operand.
struct w_copy {
    int h, chunk, row;
};
DS4_HD_INLINE constexpr w_copy w_copy_of(int c) { return {c / 1024, (c / 64) % 16, c % 64}; }

// Warpgroup wg: weight half h, activation half ph (32 rows).
struct role {
    int h, ph;
};
DS4_HD_INLINE constexpr role role_of(int wg) { return {wg % 2, wg / 2}; }

}  // namespace ds4::kernels::gemm_wg
