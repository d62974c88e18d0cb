#pragma once
// Host/device layout of moe_gemm_wgmma.cuh's shared-memory operands and warpgroup roles,
// so that the CPU emulation (tests/moe_gemm_wgmma_emulation_test.cpp) replays the kernel's own
// index math against an independent model of what wgmma reads.
//
// Both operands of a k-block are 64-row x 256-byte K-major int8 matrices in the canonical
// no-swizzle "core matrix" layout: a core matrix is 8 rows x 16 bytes, contiguous (128 bytes);
// chunk c (bytes 16c..16c+15 of k) of row r sits at (8c + r / 8) * 128 + (r % 8) * 16. Core
// matrices adjacent in K are 1024 bytes apart (the descriptor's leading byte offset), adjacent
// 8-row groups 128 bytes (its stride byte offset); the k-step ib (32 bytes, chunks 2ib and
// 2ib + 1) starts 2048 ib bytes in. A decode task's 16 rows of one chunk are 256 contiguous bytes
// (no bank conflicts), and a 16-byte cp.async piece lands whole.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels {

inline constexpr int moe_wg_rows = 64;                       // rows of an operand matrix (M of A, pairs of B)
inline constexpr int moe_wg_operand_bytes = moe_wg_rows * 256;  // one k-block (256 bytes a row)
inline constexpr std::uint32_t moe_wg_lbo = 1024;            // next core matrix in K
inline constexpr std::uint32_t moe_wg_sbo = 128;             // next 8 rows
inline constexpr int moe_wg_kstep_bytes = 2048;              // one 32-byte k-step (two chunks)
inline constexpr int moe_wg_n = 32;                          // pairs of a warpgroup's wgmma (N)

DS4_HD_INLINE constexpr int moe_wg_offset(int row, int chunk) { return (chunk * 8 + row / 8) * 128 + (row % 8) * 16; }

// Warpgroup wg of the gate/up CTA: weight rows of matrix h (0 gate, 1 up: 64 f-rows each) against
// pairs 32 ph .. 32 ph + 31. Pairs-half 0 comes first so a group of at most 32 pairs keeps two
// warpgroups busy and skips the other two.
struct moe_wg_role {
    int h, ph;
};
DS4_HD_INLINE constexpr moe_wg_role moe_wg_role_of(int wg) { return {wg & 1, wg >> 1}; }

// Accumulator x (0..15) of lane (g = lane / 4, t = lane % 4) of warp w (0..3) in the warpgroup,
// as wgmma's m64nNk32 D fragment places it: weight row and pair (within the warpgroup's 64 x 32).
DS4_HD_INLINE constexpr int moe_wg_acc_row(int w, int g, int x) { return 16 * w + g + 8 * ((x % 4) / 2); }
DS4_HD_INLINE constexpr int moe_wg_acc_pair(int t, int x) { return 8 * (x / 4) + 2 * t + x % 2; }

// The 16-byte activation pieces of a CTA's block: copy c (0..1023) of 64 pairs x 16 pieces is
// pair (c / 2) % 64, piece 2 (c / 128) + c % 2: a warp's copies are 16 pairs x 2 pieces (each
// pair's 32-byte sector read whole), their destinations 256 contiguous bytes per piece.
DS4_HD_INLINE constexpr int moe_wg_copy_pair(int c) { return (c / 2) % 64; }
DS4_HD_INLINE constexpr int moe_wg_copy_piece(int c) { return 2 * (c / 128) + c % 2; }

}  // namespace ds4::kernels
