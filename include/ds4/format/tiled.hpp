#pragma once
// Repacked weight layouts read by kernels/matvec.cuh and kernels/moe.cuh (docs/README.md decision 5).
// GGML blocks as stored (34-byte Q8_0, 66-byte IQ2_XXS, 84-byte Q2_K) are not 16-byte aligned
// and cap a warp's loads at about a third of the H200's bandwidth; the tiled layouts give every
// warp load 16 bytes per lane, 512 contiguous bytes per warp, and put the 32 rows of a tile one
// per lane so that a row's sequential block order runs inside one lane with no shuffles. F16
// matrices need no repack: their rows are already 16-byte aligned runs.
//
//   q8_0 tiled: tiles of 32 rows; per tile, per block b (padded to a multiple of 8), per half h,
//     lane l holds qs[16h .. 16h+16) of row 32t+l:   quants[((t*nb8 + b)*2 + h)*512 + l*16]
//     scales (F16) per 8 blocks: lane l's 8 scales in 16 bytes:  scales[((t*nb8/8 + g)*32 + l)*8 + j]
//   iq2_xxs tiled (kernels/moe.cuh): tiles of 32 rows; per tile, per 256-block b, per 16-byte
//     piece p (4 per block: sub-blocks 2p, 2p+1), lane l holds qs bytes [16p, 16p+16) of row 32t+l:
//     quants[((t*nb + b)*4 + p)*512 + l*16]; the F16 d per 8 blocks like q8_0's scales.
//   q2_k tiled (kernels/moe.cuh): per tile, per block b, 5 pieces of 16 bytes: piece 0 = the 16
//     scale/min bytes, pieces 1..4 = qs[16(p-1) .. 16p): quants[((t*nb + b)*5 + p)*512 + l*16];
//     d | dmin << 16 per 4 blocks in 16 bytes: dd[((t*nb4/4 + b/4)*32 + l)*4 + b%4].
// Rows past the matrix end are zero-filled; they are computed and never written.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "ds4/core/error.hpp"
#include "ds4/core/host_device.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_0.hpp"

namespace ds4 {

inline constexpr int tile_rows = 32;

struct q8_0_tiled_layout {
    int rows = 0, in = 0, nb = 0, nb8 = 0, tiles = 0;

    static q8_0_tiled_layout make(int rows, int in) {
        require(rows > 0 && in > 0 && in % 32 == 0,
                "q8_0 tiled layout: in = " + std::to_string(in) + " must be a positive multiple of 32");
        q8_0_tiled_layout l;
        l.rows = rows;
        l.in = in;
        l.nb = in / 32;
        l.nb8 = (l.nb + 7) / 8 * 8;
        l.tiles = (rows + tile_rows - 1) / tile_rows;
        return l;
    }
    DS4_HD std::size_t quant_bytes() const { return std::size_t(tiles) * nb8 * 1024; }
    DS4_HD std::size_t scale_count() const { return std::size_t(tiles) * nb8 * 32; }
    DS4_HD std::size_t quant_offset(int row, int block, int half) const {
        const int t = row / tile_rows, l = row % tile_rows;
        return ((std::size_t(t) * nb8 + block) * 2 + half) * 512 + std::size_t(l) * 16;
    }
    DS4_HD std::size_t scale_index(int row, int block) const {
        const int t = row / tile_rows, l = row % tile_rows;
        return ((std::size_t(t) * (nb8 / 8) + block / 8) * 32 + l) * 8 + block % 8;
    }
};

// GGUF rows [rows][nb] blocks -> tiled quants/scales (both buffers pre-sized by the layout).
inline void repack_q8_0(const q8_0_tiled_layout& L, const q8_0_block* src, std::uint8_t* quants,
                        std::uint16_t* scales) {
    std::memset(quants, 0, L.quant_bytes());
    std::memset(scales, 0, L.scale_count() * sizeof(std::uint16_t));
    for (int r = 0; r < L.rows; ++r)
        for (int b = 0; b < L.nb; ++b) {
            const q8_0_block& blk = src[std::size_t(r) * L.nb + b];
            std::memcpy(quants + L.quant_offset(r, b, 0), blk.qs, 16);
            std::memcpy(quants + L.quant_offset(r, b, 1), blk.qs + 16, 16);
            scales[L.scale_index(r, b)] = blk.d;
        }
}

// The inverse, for tests: the GGUF block at (row, block) of a tiled matrix.
inline q8_0_block tiled_block(const q8_0_tiled_layout& L, const std::uint8_t* quants, const std::uint16_t* scales,
                              int row, int block) {
    q8_0_block b;
    b.d = scales[L.scale_index(row, block)];
    std::memcpy(b.qs, quants + L.quant_offset(row, block, 0), 16);
    std::memcpy(b.qs + 16, quants + L.quant_offset(row, block, 1), 16);
    return b;
}

// IQ2_XXS: the 64 quant bytes of a block split from its F16 d, so a lane's loads are four
// 16-byte pieces per block and the scales of 8 blocks one 16-byte load.
struct iq2_xxs_tiled_layout {
    int rows = 0, in = 0, nb = 0, nb8 = 0, tiles = 0;

    static iq2_xxs_tiled_layout make(int rows, int in) {
        require(rows > 0 && in > 0 && in % 256 == 0,
                "iq2_xxs tiled layout: in = " + std::to_string(in) + " must be a positive multiple of 256");
        iq2_xxs_tiled_layout l;
        l.rows = rows;
        l.in = in;
        l.nb = in / 256;
        l.nb8 = (l.nb + 7) / 8 * 8;
        l.tiles = (rows + tile_rows - 1) / tile_rows;
        return l;
    }
    DS4_HD std::size_t quant_bytes() const { return std::size_t(tiles) * nb * 4 * 512; }
    DS4_HD std::size_t scale_count() const { return std::size_t(tiles) * nb8 * 32; }
    DS4_HD std::size_t quant_offset(int row, int block, int piece) const {
        const int t = row / tile_rows, l = row % tile_rows;
        return ((std::size_t(t) * nb + block) * 4 + piece) * 512 + std::size_t(l) * 16;
    }
    DS4_HD std::size_t scale_index(int row, int block) const {
        const int t = row / tile_rows, l = row % tile_rows;
        return ((std::size_t(t) * (nb8 / 8) + block / 8) * 32 + l) * 8 + block % 8;
    }
};

inline void repack_iq2_xxs(const iq2_xxs_tiled_layout& L, const iq2_xxs_block* src, std::uint8_t* quants,
                           std::uint16_t* scales) {
    std::memset(quants, 0, L.quant_bytes());
    std::memset(scales, 0, L.scale_count() * sizeof(std::uint16_t));
    for (int r = 0; r < L.rows; ++r)
        for (int b = 0; b < L.nb; ++b) {
            const iq2_xxs_block& blk = src[std::size_t(r) * L.nb + b];
            for (int p = 0; p < 4; ++p) std::memcpy(quants + L.quant_offset(r, b, p), blk.qs + 8 * p, 16);
            scales[L.scale_index(r, b)] = blk.d;
        }
}

inline iq2_xxs_block tiled_block(const iq2_xxs_tiled_layout& L, const std::uint8_t* quants,
                                 const std::uint16_t* scales, int row, int block) {
    iq2_xxs_block b;
    b.d = scales[L.scale_index(row, block)];
    for (int p = 0; p < 4; ++p) std::memcpy(b.qs + 8 * p, quants + L.quant_offset(row, block, p), 16);
    return b;
}

// Q2_K: the 84-byte block as five 16-byte pieces (scales, then qs in four quarters) and its
// two F16 super-scales packed per 4 blocks, so no lane load straddles a block boundary.
struct q2_k_tiled_layout {
    int rows = 0, in = 0, nb = 0, nb4 = 0, tiles = 0;

    static q2_k_tiled_layout make(int rows, int in) {
        require(rows > 0 && in > 0 && in % 256 == 0,
                "q2_k tiled layout: in = " + std::to_string(in) + " must be a positive multiple of 256");
        q2_k_tiled_layout l;
        l.rows = rows;
        l.in = in;
        l.nb = in / 256;
        l.nb4 = (l.nb + 3) / 4 * 4;
        l.tiles = (rows + tile_rows - 1) / tile_rows;
        return l;
    }
    DS4_HD std::size_t quant_bytes() const { return std::size_t(tiles) * nb * 5 * 512; }
    DS4_HD std::size_t dd_count() const { return std::size_t(tiles) * nb4 * 32; }
    DS4_HD std::size_t quant_offset(int row, int block, int piece) const {
        const int t = row / tile_rows, l = row % tile_rows;
        return ((std::size_t(t) * nb + block) * 5 + piece) * 512 + std::size_t(l) * 16;
    }
    DS4_HD std::size_t dd_index(int row, int block) const {
        const int t = row / tile_rows, l = row % tile_rows;
        return ((std::size_t(t) * (nb4 / 4) + block / 4) * 32 + l) * 4 + block % 4;
    }
};

inline void repack_q2_k(const q2_k_tiled_layout& L, const q2_k_block* src, std::uint8_t* quants, std::uint32_t* dd) {
    std::memset(quants, 0, L.quant_bytes());
    std::memset(dd, 0, L.dd_count() * sizeof(std::uint32_t));
    for (int r = 0; r < L.rows; ++r)
        for (int b = 0; b < L.nb; ++b) {
            const q2_k_block& blk = src[std::size_t(r) * L.nb + b];
            std::memcpy(quants + L.quant_offset(r, b, 0), blk.scales, 16);
            for (int p = 0; p < 4; ++p) std::memcpy(quants + L.quant_offset(r, b, 1 + p), blk.qs + 16 * p, 16);
            dd[L.dd_index(r, b)] = std::uint32_t(blk.d) | (std::uint32_t(blk.dmin) << 16);
        }
}

inline q2_k_block tiled_block(const q2_k_tiled_layout& L, const std::uint8_t* quants, const std::uint32_t* dd,
                              int row, int block) {
    q2_k_block b;
    std::memcpy(b.scales, quants + L.quant_offset(row, block, 0), 16);
    for (int p = 0; p < 4; ++p) std::memcpy(b.qs + 16 * p, quants + L.quant_offset(row, block, 1 + p), 16);
    const std::uint32_t v = dd[L.dd_index(row, block)];
    b.d = std::uint16_t(v & 0xffffu);
    b.dmin = std::uint16_t(v >> 16);
    return b;
}

}  // namespace ds4
