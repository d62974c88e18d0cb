// A CPU emulation of kernels/gemm_q8_0_wgmma.cuh: every stage's operands as its cp.async copies
// place them (wgmma_operand.hpp's layout, zero fill included), the scales as it stores them, the
// descriptors its warpgroups build for each block, wgmma from tests/support/wgmma_s8_emulation.hpp
// (the PTX ISA's descriptor, layout and fragment rules), the bias read-back and the reference
// chain with its segment ends; bitwise against format/row_dot.hpp's q8_0_row_dot. Shapes: weight
// rows off the 128-row CTA tile (a CTA with missing tiles), activation rows off the 64-row tile,
// in = 10 blocks (a partial second stage), 33 blocks (two segment ends, a partial last stage) and
// 16 blocks (the segment end on a stage end). It runs without a GPU and catches indexing and
// layout slips; ds4-validate's gemm_q8_0_wgmma rows run the kernel itself.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/gemm_q8_0_launch.hpp"
#include "ds4/kernels/gemm_q8_0_wgmma_tile.hpp"
#include "ds4/kernels/wgmma_desc.hpp"
#include "ds4/kernels/wgmma_operand.hpp"
#include "tests/support/gemm_q8_0_case.hpp"
#include "tests/support/wgmma_s8_emulation.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;

using gemm_wg::bw;
using gemm_wg::bx;
using gemm_wg::kb;
constexpr int n_wg = gemm_wg::n;

float bits_float(std::int32_t v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}

// y[r][o] as the kernel computes it ([n_rows][rows]).
std::vector<float> emulate(const test::case_data& c) {
    const int nb = c.in / 32, nb8 = c.L.nb8, tiles = c.L.tiles, nk = (nb + kb - 1) / kb;
    std::vector<float> y(std::size_t(c.n_rows) * c.rows, 0.0f);
    // Shared memory: weight operands h = 0, 1 at 16 KiB h, the activation operand after them.
    std::vector<std::uint8_t> smem(3 * std::size_t(wg_operand_bytes));
    const std::uint32_t x_at = 2 * wg_operand_bytes;
    const std::uint64_t step = wg_kstep_bytes >> 4;
    for (int m0 = 0; m0 < c.n_rows; m0 += bx)
        for (int tile0 = 0; tile0 < tiles; tile0 += bw / tile_rows) {
            std::vector<float> acc(4 * 128 * 16, 0.0f), seg(4 * 128 * 16, 0.0f);  // [warpgroup][thread][x]
            for (int kt = 0; kt < nk; ++kt) {
                const int b0 = kt * kb;
                std::uint16_t ws[bw][kb] = {};
                float xs[kb][bx] = {};
                // Weight copies: operand h, chunk (block chunk / 2, half chunk % 2), row.
                for (int cc = 0; cc < 2 * wg_operand_bytes / 16; ++cc) {
                    const gemm_wg::w_copy w = gemm_wg::w_copy_of(cc);
                    const int h = w.h, chunk = w.chunk, row = w.row;
                    const int tile = tile0 + 2 * h + row / 32, b = b0 + chunk / 2;
                    const bool ok = tile < tiles && b < nb;
                    const std::size_t src = ((std::size_t(tile) * nb8 + b) * 2 + chunk % 2) * 512 + (row % 32) * 16;
                    for (int i = 0; i < 16; ++i)
                        smem[std::size_t(h) * wg_operand_bytes + std::size_t(wg_offset(row, chunk) + i)] = ok ? c.quants[src + std::size_t(i)] : 0;
                }
                for (int cc = 0; cc < 1024; ++cc) {
                    const int r = wg_copy_row(cc), chunk = wg_copy_chunk(cc), b = b0 + chunk / 2;
                    const bool ok = m0 + r < c.n_rows && b < nb;
                    for (int i = 0; i < 16; ++i)
                        smem[x_at + std::uint32_t(wg_offset(r, chunk) + i)] =
                            ok ? std::uint8_t(c.act_qs[std::size_t(m0 + r) * c.in + std::size_t(b * 32 + (chunk % 2) * 16 + i)]) : 0;
                }
                for (int row = 0; row < bw; ++row) {
                    const int tile = tile0 + row / 32;
                    for (int j = 0; j < kb; ++j)
                        ws[row][j] = tile < tiles ? c.scales[((std::size_t(tile) * (nb8 / 8) + b0 / 8) * 32 + row % 32) * 8 + j] : 0;
                }
                for (int r = 0; r < bx; ++r)
                    for (int j = 0; j < kb; ++j)
                        xs[j][r] = m0 + r < c.n_rows && b0 + j < nb ? c.act_d[std::size_t(m0 + r) * nb + b0 + j] : 0.0f;
                for (int wgi = 0; wgi < 4; ++wgi) {
                    const int h = gemm_wg::role_of(wgi).h, ph = gemm_wg::role_of(wgi).ph;
                    const std::uint64_t da = wgmma_desc_bits(std::uint32_t(h * wg_operand_bytes), wg_lbo, wg_sbo);
                    const std::uint64_t db = wgmma_desc_bits(x_at + std::uint32_t(wg_offset(n_wg * ph, 0)), wg_lbo, wg_sbo);
                    for (int j = 0; j < kb; ++j) {
                        std::vector<std::int32_t> d;
                        test::wgmma_m64nNk32_s8(smem, da + step * std::uint64_t(j), db + step * std::uint64_t(j), n_wg, d, false);
                        const int b = b0 + j;
                        if (b >= nb) continue;
                        for (int th = 0; th < 128; ++th)
                            for (int x = 0; x < 16; ++x) {
                                const int row = 64 * h + wg_acc_row(th / 32, th % 32 / 4, x), col = n_wg * ph + wg_acc_col(th % 4, x);
                                const float isum = bits_float(d[std::size_t(th * 16 + x)] + gemm_q8_0_bias_bits) - gemm_q8_0_bias_value;
                                const float term = mul_rn(mul_rn(f16_to_f32(ws[row][j]), xs[j][col]), isum);
                                float& sg = seg[std::size_t((wgi * 128 + th) * 16 + x)];
                                sg = add_rn(sg, term);
                                if ((b + 1) % q8_0_segment_blocks == 0 || b + 1 == nb) {
                                    float& ac = acc[std::size_t((wgi * 128 + th) * 16 + x)];
                                    ac = add_rn(ac, sg);
                                    sg = 0.0f;
                                }
                            }
                    }
                }
            }
            for (int wgi = 0; wgi < 4; ++wgi)
                for (int th = 0; th < 128; ++th)
                    for (int x = 0; x < 16; ++x) {
                        const int o = tile0 * tile_rows + 64 * gemm_wg::role_of(wgi).h + wg_acc_row(th / 32, th % 32 / 4, x);
                        const int r = m0 + n_wg * gemm_wg::role_of(wgi).ph + wg_acc_col(th % 4, x);
                        if (o < c.rows && r < c.n_rows) y[std::size_t(r) * c.rows + o] = acc[std::size_t((wgi * 128 + th) * 16 + x)];
                    }
        }
    return y;
}

int differing(const test::case_data& c, const std::vector<float>& y) {
    const int nb = c.in / 32;
    int bad = 0;
    for (int r = 0; r < c.n_rows; ++r)
        for (int o = 0; o < c.rows; ++o) {
            const float want = q8_0_row_dot(c.w.data() + std::size_t(o) * nb, c.x.data() + std::size_t(r) * nb, nb);
            const float got = y[std::size_t(r) * c.rows + o];
            bad += std::memcmp(&want, &got, 4) != 0;
        }
    return bad;
}

}  // namespace

TEST_CASE("gemm_q8_0's wgmma kernel, emulated on the CPU, equals q8_0_row_dot bitwise") {
    std::mt19937_64 g(20261207);
    for (auto [rows, in, n_rows] : {std::tuple{200, 320, 70}, std::tuple{64, 1056, 1}, std::tuple{130, 512, 65}}) {
        CAPTURE(rows);
        CAPTURE(in);
        CAPTURE(n_rows);
        const test::case_data c = test::make_case(g, rows, in, n_rows);
        CHECK(differing(c, emulate(c)) == 0);
    }
}
