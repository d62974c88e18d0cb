#pragma once
// A host model of one warpgroup's wgmma.mma_async.sync.aligned.m64nNk32.s32.s8.s8 with both
// operands in shared memory (K-major, no swizzle), written from the PTX ISA (not from any kernel):
//   descriptor: start address >> 4 in bits 0-13, leading byte offset (LBO) >> 4 in bits 16-29,
//     stride byte offset (SBO) >> 4 in bits 32-45;
//   K-major, no swizzle: 8-row x 16-byte core matrices, contiguous; element (row, k) of the
//     operand at start + (row / 8) SBO + (k / 16) LBO + (row % 8) 16 + k % 16 (A: row = m, B: row = n);
//   D (64 x N, s32), warp w of the warpgroup, lane (g = lane / 4, t = lane % 4), register x:
//     row 16 w + g + 8 ((x / 2) % 2), column 8 (x / 4) + 2 t + x % 2.
// The CPU emulations of the wgmma kernels feed it the descriptors their threads build over a byte
// array standing for shared memory (address 0 = its first byte).
#include <cstdint>
#include <vector>

namespace ds4::test {

struct wgmma_operand {
    std::uint32_t start, lbo, sbo;
};

inline wgmma_operand decode_desc(std::uint64_t d) {
    return {std::uint32_t(d & 0x3fffu) << 4, std::uint32_t((d >> 16) & 0x3fffu) << 4, std::uint32_t((d >> 32) & 0x3fffu) << 4};
}

inline std::uint8_t operand_byte(const std::vector<std::uint8_t>& smem, const wgmma_operand& o, int row, int k) {
    const std::uint32_t a = o.start + std::uint32_t(row / 8) * o.sbo + std::uint32_t(k / 16) * o.lbo + std::uint32_t(row % 8) * 16u +
                            std::uint32_t(k % 16);
    return smem.at(a);
}

// d[w][lane][x] = (accumulate ? d : 0) + sum over k < 32 of A(m, k) B(n, k) for the (m, n) register x
// of lane `lane` of warp w holds; n_cols = N (a multiple of 8). B is s8; A is s8, or u8 (the
// .u8.s8 form) with a_unsigned.
inline void wgmma_m64nNk32_s8(const std::vector<std::uint8_t>& smem, std::uint64_t da, std::uint64_t db, int n_cols,
                              std::vector<std::int32_t>& d, bool accumulate, bool a_unsigned = false) {
    const wgmma_operand A = decode_desc(da), B = decode_desc(db);
    const int regs = n_cols / 2;  // N / 8 column groups x 4
    d.resize(std::size_t(4 * 32 * regs));
    for (int w = 0; w < 4; ++w)
        for (int lane = 0; lane < 32; ++lane)
            for (int x = 0; x < regs; ++x) {
                const int g = lane / 4, t = lane % 4;
                const int m = 16 * w + g + 8 * ((x / 2) % 2), n = 8 * (x / 4) + 2 * t + x % 2;
                std::int32_t s = 0;
                for (int k = 0; k < 32; ++k) {
                    const std::uint8_t a = operand_byte(smem, A, m, k);
                    s += (a_unsigned ? std::int32_t(a) : std::int32_t(std::int8_t(a))) * std::int32_t(std::int8_t(operand_byte(smem, B, n, k)));
                }
                std::int32_t& out = d[std::size_t((w * 32 + lane) * regs + x)];
                out = accumulate ? out + s : s;
            }
}

}  // namespace ds4::test
