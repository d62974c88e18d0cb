#pragma once
// The shared-memory operand layout the int8 wgmma kernels use (moe_gemm_wgmma.cuh,
// gemm_q8_0_wgmma.cuh), host and device so that CPU emulations replay the kernels' own index
// math: a 64-row x 256-byte K-major int8 matrix in the canonical no-swizzle "core matrix" layout.
// A core matrix is 8 rows x 16 bytes, contiguous (128 bytes); chunk c (bytes 16c..16c+15 of k) of
// row r sits at (8c + r / 8) * 128 + (r % 8) * 16. Core matrices adjacent in K are 1024 bytes
// apart (the descriptor's leading byte offset), adjacent 8-row groups 128 bytes (its stride byte
// offset); the k-step s (32 bytes, chunks 2s and 2s + 1) starts 2048 s bytes in. 16 rows of one
// chunk are 256 contiguous bytes (a decode's or a copy's stores meet no bank conflict), and a
// 16-byte cp.async piece lands whole.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels {

inline constexpr int wg_rows = 64;                        // rows of an operand matrix
inline constexpr int wg_operand_bytes = wg_rows * 256;    // 256 bytes of k a row
inline constexpr std::uint32_t wg_lbo = 1024;             // next core matrix in K
inline constexpr std::uint32_t wg_sbo = 128;              // next 8 rows
inline constexpr int wg_kstep_bytes = 2048;               // one 32-byte k-step (two chunks)

DS4_HD_INLINE constexpr int wg_offset(int row, int chunk) { return (chunk * 8 + row / 8) * 128 + (row % 8) * 16; }

// Accumulator x of lane (g = lane / 4, t = lane % 4) of warp w (0..3) in the warpgroup, as
// wgmma's m64nNk32 D fragment places it: row (of A, 0..63) and column (of B, 0..N-1).
DS4_HD_INLINE constexpr int wg_acc_row(int w, int g, int x) { return 16 * w + g + 8 * ((x % 4) / 2); }
DS4_HD_INLINE constexpr int wg_acc_col(int t, int x) { return 8 * (x / 4) + 2 * t + x % 2; }

// The 16-byte pieces of a 64-row operand filled by 1024 copies: copy c is row (c / 2) % 64,
// chunk 2 (c / 128) + c % 2, so a warp's copies are 16 rows x 2 chunks (each row's 32-byte sector
// read whole) and their destinations 256 contiguous bytes per chunk.
DS4_HD_INLINE constexpr int wg_copy_row(int c) { return (c / 2) % 64; }
DS4_HD_INLINE constexpr int wg_copy_chunk(int c) { return 2 * (c / 128) + c % 2; }

}  // namespace ds4::kernels
