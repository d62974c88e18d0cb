#pragma once
// Where kernels/gemm_q8_0.cuh's pipelined kernel keeps each byte of a stage in shared memory and
// which bytes each lane hands to mma.sync m16n8k32 s8: host and device, so the CPU emulation
// (tests/gemm_q8_0_emulation_test.cpp) runs the kernel's own index math without a GPU.
//
// CTA: 128 weight rows (4 tiles of 32) x 128 activation rows, 8 warps: warp w owns weight rows
// 64 (w % 2) .. +64 (4 m16 tiles) and activation rows 32 (w / 2) .. +32 (4 n8 tiles).
// Stage (kb = 4 Q8_0 blocks), each array [block j][row]:
//   W  [j][128 weight rows][32 bytes]  the block's 32 quants in k order
//   X  [j][128 act rows][32 bytes]
//   WS [j][128] F32 weight scales, row 16 m + 8 h + g stored at 16 m + 2 g + h
//   XS [j][128] F32 activation scales
// Fragments: ldmatrix.x4, one per m16 tile of A and one per two n8 tiles of B, each register
// landing where mma.sync m16n8k32 reads it (k in the mma's own order). A row's two 16-byte halves
// swap slots in rows 4..7 of every 8, so each 8-row ldmatrix phase is conflict-free. (Two 8-byte
// loads per row, the first layout, put a row's k words into registers that the mma wants
// interleaved with the row 8 below: ptxas copied every A quad before each mma, ~16% of the
// loop's instructions.) The scale layouts make the two scales a lane needs (rows g, g + 8;
// activation rows 2t, 2t + 1) one 8-byte load.
#include <cstdint>

#include "ds4/core/host_device.hpp"

namespace ds4::kernels::gemm_tile {

inline constexpr int bw = 128;        // weight rows per CTA
inline constexpr int bx = 128;        // activation rows per CTA
inline constexpr int kb = 4;          // Q8_0 blocks per stage
inline constexpr int stages = 4;
inline constexpr int threads = 256;
inline constexpr int w_bytes = kb * bw * 32;
inline constexpr int x_bytes = kb * bx * 32;
inline constexpr int ws_bytes = kb * bw * 4;
inline constexpr int xs_bytes = kb * bx * 4;
inline constexpr int stage_bytes = w_bytes + x_bytes + ws_bytes + xs_bytes;
inline constexpr int smem_bytes = stage_bytes * stages;
// The carve of a stage, bytes from its start. The loaders and the kernel both offset by these
// (never by a bare `ws_bytes`: gemm_q8_0.cuh's gemm_detail has its own w_bytes / ws_bytes for the
// 64 x 128 kernel, and inside gemm_detail those hid these through `using namespace gemm_tile`,
// which put the activation scales 1 KB early: the H200 failure of 5776165).
inline constexpr int w_at = 0;
inline constexpr int x_at = w_at + w_bytes;
inline constexpr int ws_at = x_at + x_bytes;
inline constexpr int xs_at = ws_at + ws_bytes;
static_assert(xs_at + xs_bytes == stage_bytes, "the four arrays fill a stage");
static_assert(x_at % 16 == 0 && ws_at % 16 == 0 && xs_at % 16 == 0 && stage_bytes % 16 == 0,
              "16-byte cp.async destinations and 8-byte fragment loads stay aligned in every stage");
static_assert(smem_bytes <= 163 * 1024, "fits sm_80's 163 KB opt-in (sm_90: 227 KB)");

// The ring: k-stage s (blocks kb s .. kb s + kb) lives in slot s % stages. The prologue issues
// k-stages 0 .. stages - 2, one commit group each (empty past nk). Iteration kt waits until at
// most ring_pending groups are outstanding (then k-stage kt has landed), passes a barrier (every
// thread is done with iteration kt - 1), issues k-stage kt + stages - 1 into the slot k-stage
// kt - 1 used and commits (empty past nk), reads slot kt, and at its end stores the refill's
// weight scales into that same refill slot. tests/gemm_q8_0_emulation_test.cpp replays this.
inline constexpr int ring_pending = stages - 2;
DS4_HD_INLINE int ring_slot(int s) { return s % stages; }
DS4_HD_INLINE int ring_refill(int kt) { return kt + stages - 1; }
// Loader work per thread and stage: 16-byte chunks of W and X, 4-byte act scales, weight-scale pairs.
inline constexpr int w_chunks = w_bytes / 16 / threads;
inline constexpr int x_chunks = x_bytes / 16 / threads;
inline constexpr int xs_items = kb * bx / threads;
static_assert(w_bytes % (16 * threads) == 0 && x_bytes % (16 * threads) == 0 && (kb * bx) % threads == 0);
static_assert(bw * kb == 2 * threads, "each thread stages two weight scales");

// W chunk c (0 .. w_bytes / 16): tile t, block j, lane l (row 32 t + l), half h; h fastest, then
// l, so a warp reads two 256-byte runs of the tiled source and writes 512 contiguous bytes.
struct w_chunk {
    int t, j, l, h;
};
DS4_HD_INLINE w_chunk w_chunk_of(int c) { return {c / (64 * kb), (c / 64) % kb, (c / 2) % 32, c % 2}; }
// A row's two 16-byte halves swap places in rows 4..7 of every 8 (half h at slot h ^ (row / 4 % 2)),
// so the 8 rows of one ldmatrix phase (16 bytes each, one half) land on 8 different bank quads.
DS4_HD_INLINE int half_slot(int row, int h) { return h ^ ((row >> 2) & 1); }
DS4_HD_INLINE int w_offset(int j, int row, int byte) { return (j * bw + row) * 32 + 16 * half_slot(row, byte >> 4) + (byte & 15); }

// X chunk c: activation row r, block j, half h (h fastest, then r).
struct x_chunk {
    int j, r, h;
};
DS4_HD_INLINE x_chunk x_chunk_of(int c) { return {c / (2 * bx), (c / 2) % bx, c % 2}; }
DS4_HD_INLINE int x_offset(int j, int r, int byte) { return (j * bx + r) * 32 + 16 * half_slot(r, byte >> 4) + (byte & 15); }

// Act-scale item i: row r, block j (j fastest: a row's kb scales are adjacent in global memory).
DS4_HD_INLINE int xs_row(int i) { return i / kb; }
DS4_HD_INLINE int xs_block(int i) { return i % kb; }
DS4_HD_INLINE int xs_index(int j, int r) { return j * bx + r; }

// Weight-scale pair of thread `tid`: row tid / 2, blocks 2 (tid % 2) and 2 (tid % 2) + 1.
DS4_HD_INLINE int ws_row(int tid) { return tid / 2; }
DS4_HD_INLINE int ws_first_block(int tid) { return 2 * (tid % 2); }
DS4_HD_INLINE int ws_index(int j, int row) { return j * bw + (row & ~15) + ((row & 7) << 1) + ((row >> 3) & 1); }

// Stage byte offsets of the loaders' destinations, the carve applied once: the kernel's loaders
// and the CPU emulation both write through these.
DS4_HD_INLINE int w_dst(const w_chunk& c) { return w_at + w_offset(c.j, 32 * c.t + c.l, 16 * c.h); }
DS4_HD_INLINE int x_dst(const x_chunk& c) { return x_at + x_offset(c.j, c.r, 16 * c.h); }
DS4_HD_INLINE int xs_dst(int j, int r) { return xs_at + 4 * xs_index(j, r); }
DS4_HD_INLINE int ws_dst(int j, int row) { return ws_at + 4 * ws_index(j, row); }
// The 8-byte scale pairs: weight rows (16 mi + g, 16 mi + 8 + g), activation rows (8 ni + 2t, +1).
DS4_HD_INLINE int wd_index(int j, int wn, int mi, int g) { return j * bw + 64 * wn + 16 * mi + 2 * g; }
DS4_HD_INLINE int xd_index(int j, int wm, int ni, int t) { return xs_index(j, 32 * wm + 8 * ni + 2 * t); }
// ldmatrix.x4 fragments (k in mma.sync's own order): lane l gives the row address of row l % 8 of
// matrix q = l / 8 and gets back, in register q, row l / 4 of matrix q, bytes 4 (l % 4) .. + 3.
// A of m16 tile mi: matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31),
// (rows 8-15, k 16-31) = registers a0..a3 of m16n8k32.
DS4_HD_INLINE int a_ldm_offset(int j, int wn, int mi, int lane) {
    const int q = lane >> 3;
    return w_offset(j, 64 * wn + 16 * mi + 8 * (q & 1) + (lane & 7), 16 * (q >> 1));
}
// B of n8 tiles 2p and 2p + 1 (activation rows 32 wm + 16 p ..): matrices (tile 2p, k 0-15),
// (tile 2p, k 16-31), (tile 2p + 1, k 0-15), (tile 2p + 1, k 16-31) = b0, b1 of each tile.
DS4_HD_INLINE int b_ldm_offset(int j, int wm, int p, int lane) {
    const int q = lane >> 3;
    return x_offset(j, 32 * wm + 8 * (2 * p + (q >> 1)) + (lane & 7), 16 * (q & 1));
}
// The accumulator (mi, h, ni, e) of a lane: weight row and activation row inside the CTA tile.
inline constexpr int lane_outputs = 64;
DS4_HD_INLINE int out_index(int mi, int h, int ni, int e) { return ((mi * 2 + h) * 4 + ni) * 2 + e; }
DS4_HD_INLINE int out_weight_row(int wn, int mi, int h, int g) { return 64 * wn + 16 * mi + 8 * h + g; }
DS4_HD_INLINE int out_act_row(int wm, int ni, int e, int t) { return 32 * wm + 8 * ni + 2 * t + e; }

}  // namespace ds4::kernels::gemm_tile
