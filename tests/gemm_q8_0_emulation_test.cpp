// A CPU emulation of kernels/gemm_q8_0.cuh's pipelined kernel (gemm_q8_0_tile_kernel), built on
// its own index functions (kernels/gemm_q8_0_tile.hpp): every stage's shared-memory bytes as the
// loader places them (zero fill included), every lane's 8-byte fragment loads fed to the mma
// model of tests/support/mma_s8_emulation.hpp (the PTX fragment tables), the bias read-back, the
// reference chain and the segment ends at stage boundaries; bitwise against format/row_dot.hpp's
// q8_0_row_dot. Shapes: a partial last row tile and weight tile, in = 21 blocks (a segment end
// inside, a zero-padded last stage), and in = 40 blocks (two segment ends, no padding).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/gemm_q8_0_tile.hpp"
#include "tests/support/mma_s8_emulation.hpp"

namespace {

using namespace ds4;
namespace gt = ds4::kernels::gemm_tile;

constexpr std::int32_t bias_bits = 0x4b400000;  // gemm_q8_0.cuh: 1.5 * 2^23
constexpr float bias_value = 12582912.0f;

std::uint32_t word_at(const std::uint8_t* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
float float_bits(std::int32_t i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

struct case_data {
    int rows, in, n_rows;
    std::vector<q8_0_block> w;         // [rows][nb]
    std::vector<q8_0_act_block> x;     // [n_rows][nb]
    q8_0_tiled_layout L;
    std::vector<std::uint8_t> quants;  // tiled
    std::vector<std::uint16_t> scales;
    std::vector<std::int8_t> act_qs;   // split layout, stride in
    std::vector<float> act_d;          // stride in / 32
};

case_data make_case(std::mt19937_64& g, int rows, int in, int n_rows) {
    case_data c{rows, in, n_rows, {}, {}, q8_0_tiled_layout::make(rows, in), {}, {}, {}, {}};
    const int nb = in / 32;
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(in));
    c.w.resize(std::size_t(rows) * nb);
    for (int r = 0; r < rows; ++r) {
        for (auto& e : v) e = n01(g) * 0.05f;
        quantize_q8_0(v.data(), c.w.data() + std::size_t(r) * nb, std::size_t(in));
    }
    c.quants.resize(c.L.quant_bytes());
    c.scales.resize(c.L.scale_count());
    repack_q8_0(c.L, c.w.data(), c.quants.data(), c.scales.data());
    c.x.resize(std::size_t(n_rows) * nb);
    c.act_qs.resize(std::size_t(n_rows) * in);
    c.act_d.resize(std::size_t(n_rows) * nb);
    for (int r = 0; r < n_rows; ++r) {
        for (auto& e : v) e = n01(g) * (r % 3 == 0 ? 30.0f : 1.0f);
        quantize_q8_0_act(v.data(), c.x.data() + std::size_t(r) * nb, in);
        for (int b = 0; b < nb; ++b) {
            const q8_0_act_block& xb = c.x[std::size_t(r) * nb + b];
            std::memcpy(c.act_qs.data() + std::size_t(r) * in + b * 32, xb.qs, 32);
            c.act_d[std::size_t(r) * nb + b] = xb.d;
        }
    }
    return c;
}

// One stage's shared memory, filled as gemm_detail::issue_tile_stage and the scale pairs fill it.
struct stage {
    std::vector<std::uint8_t> w = std::vector<std::uint8_t>(gt::w_bytes), x = std::vector<std::uint8_t>(gt::x_bytes);
    std::vector<float> ws = std::vector<float>(gt::kb * gt::bw), xs = std::vector<float>(gt::kb * gt::bx);
};

void fill_stage(const case_data& c, int tile0, int m0, int b0, stage& s) {
    const int nb = c.in / 32, tiles = c.L.tiles;
    for (int tid = 0; tid < gt::threads; ++tid) {
        for (int i = 0; i < gt::w_chunks; ++i) {
            const gt::w_chunk k = gt::w_chunk_of(tid + i * gt::threads);
            const int b = b0 + k.j;
            const bool ok = tile0 + k.t < tiles && b < nb;
            std::uint8_t* dst = s.w.data() + gt::w_offset(k.j, 32 * k.t + k.l, 16 * k.h);
            if (ok) std::memcpy(dst, c.quants.data() + ((std::size_t(tile0 + k.t) * c.L.nb8 + b) * 2 + k.h) * 512 + k.l * 16, 16);
            else std::memset(dst, 0, 16);
        }
        for (int i = 0; i < gt::x_chunks; ++i) {
            const gt::x_chunk k = gt::x_chunk_of(tid + i * gt::threads);
            const bool ok = m0 + k.r < c.n_rows && b0 + k.j < nb;
            std::uint8_t* dst = s.x.data() + gt::x_offset(k.j, k.r, 16 * k.h);
            if (ok) std::memcpy(dst, c.act_qs.data() + std::size_t(m0 + k.r) * c.in + (b0 + k.j) * 32 + k.h * 16, 16);
            else std::memset(dst, 0, 16);
        }
        for (int i = 0; i < gt::xs_items; ++i) {
            const int it = tid + i * gt::threads, r = gt::xs_row(it), j = gt::xs_block(it);
            const bool ok = m0 + r < c.n_rows && b0 + j < nb;
            s.xs[std::size_t(gt::xs_index(j, r))] = ok ? c.act_d[std::size_t(m0 + r) * nb + b0 + j] : 0.0f;
        }
        const int row = gt::ws_row(tid), j = gt::ws_first_block(tid), t = row / tile_rows, l = row % tile_rows;
        for (int q = 0; q < 2; ++q) {
            const int b = b0 + j + q;
            const bool ok = tile0 + t < tiles && b < nb;
            const std::uint16_t h = ok ? c.scales[((std::size_t(tile0 + t) * (c.L.nb8 / 8) + b0 / 8) * 32 + l) * 8 + b % 8] : 0;
            s.ws[std::size_t(gt::ws_index(j + q, row))] = ok ? f16_to_f32(h) : 0.0f;
        }
    }
}

// y[r][o] for every live row and weight row, CTA by CTA, warp by warp, lane by lane.
std::vector<float> emulate(const case_data& c) {
    const int nb = c.in / 32, nk = (nb + gt::kb - 1) / gt::kb;
    std::vector<float> y(std::size_t(c.n_rows) * c.rows, -1.0f);
    stage s;
    for (int m0 = 0; m0 < c.n_rows; m0 += gt::bx)
        for (int tile0 = 0; tile0 < c.L.tiles; tile0 += gt::bw / tile_rows) {
            std::vector<float> acc(std::size_t(gt::threads) * gt::lane_outputs, 0.0f), seg(acc.size(), 0.0f);
            for (int kt = 0; kt < nk; ++kt) {
                fill_stage(c, tile0, m0, kt * gt::kb, s);
                for (int warp = 0; warp < gt::threads / 32; ++warp) {
                    const int wn = warp % 2, wm = warp / 2;
                    for (int j = 0; j < gt::kb; ++j)
                        for (int mi = 0; mi < 4; ++mi)
                            for (int ni = 0; ni < 4; ++ni) {
                                test::mma_s8_warp w;
                                for (int lane = 0; lane < 32; ++lane) {
                                    const int g = lane / 4, t = lane % 4;
                                    const std::uint8_t* r0 = s.w.data() + gt::a_offset(j, wn, mi, 0, g, t);
                                    const std::uint8_t* r8 = s.w.data() + gt::a_offset(j, wn, mi, 1, g, t);
                                    gt::a_regs(word_at(r0), word_at(r0 + 4), word_at(r8), word_at(r8 + 4), w.a[lane]);
                                    const std::uint8_t* xb = s.x.data() + gt::b_offset(j, wm, ni, g, t);
                                    w.b[lane][0] = word_at(xb);
                                    w.b[lane][1] = word_at(xb + 4);
                                    for (int q = 0; q < 4; ++q) w.c[lane][q] = bias_bits;
                                }
                                test::mma_m16n8k32_s8(w);
                                for (int lane = 0; lane < 32; ++lane) {
                                    const int g = lane / 4, t = lane % 4;
                                    const float* wd = s.ws.data() + gt::wd_index(j, wn, mi, g);
                                    const float* xd = s.xs.data() + gt::xd_index(j, wm, ni, t);
                                    for (int h = 0; h < 2; ++h)
                                        for (int e = 0; e < 2; ++e) {
                                            const float isum = float_bits(w.c[lane][2 * h + e]) - bias_value;
                                            const float term = mul_rn(mul_rn(wd[h], xd[e]), isum);
                                            float& sg = seg[std::size_t((warp * 32 + lane) * gt::lane_outputs + gt::out_index(mi, h, ni, e))];
                                            sg = add_rn(sg, term);
                                        }
                                }
                            }
                }
                if (((kt + 1) * gt::kb) % q8_0_segment_blocks == 0 || kt + 1 == nk)
                    for (std::size_t i = 0; i < acc.size(); ++i) {
                        acc[i] = add_rn(acc[i], seg[i]);
                        seg[i] = 0.0f;
                    }
            }
            for (int warp = 0; warp < gt::threads / 32; ++warp)
                for (int lane = 0; lane < 32; ++lane) {
                    const int wn = warp % 2, wm = warp / 2, g = lane / 4, t = lane % 4;
                    for (int mi = 0; mi < 4; ++mi)
                        for (int h = 0; h < 2; ++h) {
                            const int o = tile0 * tile_rows + gt::out_weight_row(wn, mi, h, g);
                            if (o >= c.rows) continue;
                            for (int ni = 0; ni < 4; ++ni)
                                for (int e = 0; e < 2; ++e) {
                                    const int r = m0 + gt::out_act_row(wm, ni, e, t);
                                    if (r < c.n_rows)
                                        y[std::size_t(r) * c.rows + o] =
                                            acc[std::size_t((warp * 32 + lane) * gt::lane_outputs + gt::out_index(mi, h, ni, e))];
                                }
                        }
                }
        }
    return y;
}

std::size_t mismatches(const case_data& c) {
    const std::vector<float> y = emulate(c);
    const int nb = c.in / 32;
    std::size_t bad = 0;
    for (int r = 0; r < c.n_rows; ++r)
        for (int o = 0; o < c.rows; ++o) {
            const float want = q8_0_row_dot(c.w.data() + std::size_t(o) * nb, c.x.data() + std::size_t(r) * nb, nb);
            bad += std::memcmp(&want, &y[std::size_t(r) * c.rows + o], 4) != 0;
        }
    return bad;
}

}  // namespace

TEST_CASE("gemm_q8_0's pipelined tile kernel, emulated on the CPU, equals q8_0_row_dot bitwise") {
    std::mt19937_64 g(1201);
    CHECK(mismatches(make_case(g, 200, 21 * 32, 150)) == 0);  // partial tiles, padded last stage
    CHECK(mismatches(make_case(g, 96, 40 * 32, 1)) == 0);     // one row, two segment ends
}

TEST_CASE("the tile layout's index maps are bijections onto their buffers") {
    std::vector<int> w(gt::w_bytes, 0), x(gt::x_bytes, 0), xs(gt::kb * gt::bx, 0), ws(gt::kb * gt::bw, 0);
    for (int c = 0; c < gt::w_bytes / 16; ++c) {
        const gt::w_chunk k = gt::w_chunk_of(c);
        for (int i = 0; i < 16; ++i) ++w[std::size_t(gt::w_offset(k.j, 32 * k.t + k.l, 16 * k.h + i))];
    }
    for (int c = 0; c < gt::x_bytes / 16; ++c) {
        const gt::x_chunk k = gt::x_chunk_of(c);
        for (int i = 0; i < 16; ++i) ++x[std::size_t(gt::x_offset(k.j, k.r, 16 * k.h + i))];
    }
    for (int i = 0; i < gt::kb * gt::bx; ++i) ++xs[std::size_t(gt::xs_index(gt::xs_block(i), gt::xs_row(i)))];
    for (int tid = 0; tid < gt::threads; ++tid)
        for (int q = 0; q < 2; ++q) ++ws[std::size_t(gt::ws_index(gt::ws_first_block(tid) + q, gt::ws_row(tid)))];
    auto all_once = [](const std::vector<int>& v) {
        for (int n : v)
            if (n != 1) return false;
        return true;
    };
    CHECK(all_once(w));
    CHECK(all_once(x));
    CHECK(all_once(xs));
    CHECK(all_once(ws));
}
