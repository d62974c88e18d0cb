#pragma once
// A host model of one warp's mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (and the .u8.s8 form,
// A unsigned), written from the PTX ISA's fragment tables (not from any kernel): which lane holds
// which A, B, C/D elements. The CPU emulations of the int8 tensor-core kernels feed it the
// registers their lanes would load, so a fragment mapping that disagrees with the hardware's fails
// without a GPU.
//   A (16 x 32, row-major), register r = 0..3 of lane (g = lane / 4, t = lane % 4), byte i:
//     row g + 8 (r % 2), column 4 t + i + 16 (r / 2)
//   B (32 x 8, column-major), register r = 0..1, byte i: row (k) 4 t + i + 16 r, column g
//   C/D (16 x 8), register r = 0..3: row g + 8 (r / 2), column 2 t + r % 2
#include <cstdint>

namespace ds4::test {

struct mma_s8_warp {
    std::uint32_t a[32][4] = {};
    std::uint32_t b[32][2] = {};
    std::int32_t c[32][4] = {};  // in: the accumulator; out: D
};

inline int mma_s8_byte(std::uint32_t w, int i) { return int(std::int8_t(std::uint8_t(w >> (8 * i)))); }

inline int mma_u8_byte(std::uint32_t w, int i) { return int(std::uint8_t(w >> (8 * i))); }

// a_unsigned: the .u8.s8 form (A's bytes 0..255).
inline void mma_m16n8k32_s8(mma_s8_warp& w, bool a_unsigned = false) {
    int A[16][32], B[32][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; ++r)
            for (int i = 0; i < 4; ++i)
                A[g + 8 * (r % 2)][4 * t + i + 16 * (r / 2)] = a_unsigned ? mma_u8_byte(w.a[lane][r], i) : mma_s8_byte(w.a[lane][r], i);
        for (int r = 0; r < 2; ++r)
            for (int i = 0; i < 4; ++i) B[4 * t + i + 16 * r][g] = mma_s8_byte(w.b[lane][r], i);
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; ++r) {
            const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
            std::int32_t s = w.c[lane][r];
            for (int k = 0; k < 32; ++k) s += A[row][k] * B[k][col];
            w.c[lane][r] = s;
        }
    }
}

}  // namespace ds4::test
