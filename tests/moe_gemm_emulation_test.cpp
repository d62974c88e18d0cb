// A CPU emulation of kernels/moe_gemm.cuh: its sort, its shared-memory tiles (decoded IQ2_XXS /
// Q2_K rows, swizzled Q8_K activations) and every lane's fragment loads and outputs, with the
// mma from tests/support/mma_s8_emulation.hpp (the PTX fragment tables), bitwise against
// reference/moe's moe_routed. It runs without a GPU and catches indexing and fragment mistakes;
// it mirrors the kernels' code rather than running it, so a device-only slip (the first version
// stored the IQ2_XXS row scales through an int pointer) is moe_gemm_stages_test_gpu's to catch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_block_dot.hpp"
#include "reference/moe.hpp"
#include "tests/support/moe_gemm_problem.hpp"
#include "tests/support/moe_model_inputs.hpp"
#include "tests/support/mma_s8_emulation.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;
using test::make_problem;
using test::problem;
using test::q8k_rows;
using test::quantize_rows;

// The kernels' tiling: 16 warps, warp (wn = w % 4, wm = w / 4) on weight tile wn and pairs
// 16 wm .. +16 (two n-tiles), 16 outputs a lane.
constexpr int slots = test::moe_problem_slots, pairs_cta = 64, warps = 16, warp_pairs = 16, n_tiles = warp_pairs / 8,
              outs = 2 * 2 * n_tiles * 2;

std::uint32_t word_at(const std::uint8_t* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

int act_offset(int pair, int chunk) { return pair * 256 + ((chunk ^ (pair & 7)) * 16); }

// Gathered activations of one block for a CTA's 64 pairs (as gather_acts).
void gather(const q8k_rows& a, int n, const std::vector<int>& rows_of, int count, int b, std::vector<std::uint8_t>& sa,
            std::vector<float>& sd) {
    for (int c = 0; c < pairs_cta * 16; ++c) {
        const int p = c / 16, ch = c % 16;
        for (int i = 0; i < 16; ++i)
            sa[std::size_t(act_offset(p, ch) + i)] =
                p < count ? std::uint8_t(a.q[std::size_t(rows_of[std::size_t(p)]) * n + b * 256 + ch * 16 + i]) : 0;
    }
    for (int p = 0; p < pairs_cta; ++p) sd[std::size_t(p)] = p < count ? a.d[std::size_t(rows_of[std::size_t(p)]) * (n / 256) + b] : 0.0f;
}

// The A registers of m-tile mi from a tile stored [half][row][16] (the kernels' a_frag).
void load_a(test::mma_s8_warp& w, const std::uint8_t* tile, int mi) {
    for (int lane = 0; lane < 32; ++lane) {
        w.a[lane][0] = word_at(tile + 4 * (64 * mi + lane));
        w.a[lane][1] = word_at(tile + 4 * (64 * mi + 32 + lane));
        w.a[lane][2] = word_at(tile + 4 * (128 + 64 * mi + lane));
        w.a[lane][3] = word_at(tile + 4 * (128 + 64 * mi + 32 + lane));
    }
}

// The warp tiling of both GEMMs: warp (wn, wm) multiplies tile wn's sub-block ib with pairs
// 16 wm .. +16; `out(lane, mi, h, ni, e, value)` receives D of (row 16 mi + 8 h + g, pair
// 8 ni + 2 t + e) and `acc(lane, mi, ni)` gives the C the warp starts from.
template <class Acc, class Out>
void warp_mma(const std::uint8_t* tile, const std::vector<std::uint8_t>& sa, int wm, int ib, Acc acc, Out out) {
    for (int ni = 0; ni < n_tiles; ++ni)
        for (int mi = 0; mi < 2; ++mi) {
            test::mma_s8_warp w;
            load_a(w, tile, mi);
            for (int lane = 0; lane < 32; ++lane) {
                const int g = lane / 4, t = lane % 4;
                const int rr = wm * warp_pairs + ni * 8 + g;
                w.b[lane][0] = word_at(sa.data() + act_offset(rr, 2 * ib) + 4 * t);
                w.b[lane][1] = word_at(sa.data() + act_offset(rr, 2 * ib + 1) + 4 * t);
                for (int x = 0; x < 4; ++x) w.c[lane][x] = acc(lane, mi, ni, x / 2, x % 2);
            }
            test::mma_m16n8k32_s8(w);
            for (int lane = 0; lane < 32; ++lane)
                for (int x = 0; x < 4; ++x) out(lane, mi, ni, x / 2, x % 2, w.c[lane][x]);
        }
}

int out_index(int mi, int h, int ni, int e) { return ((mi * 2 + h) * n_tiles + ni) * 2 + e; }

std::vector<float> emulate(const problem& P) {
    const int n_embd = P.n_embd, n_ff = P.n_ff, ne = P.ne, n_pairs = P.rows * slots;
    // Sort (any order inside an expert's group gives the same bits).
    const auto [offsets, sorted] = test::group_pairs(P);
    std::vector<std::pair<int, int>> items;
    for (int e = 0; e < ne; ++e)
        for (int p0 = 0; p0 < offsets[std::size_t(e) + 1] - offsets[std::size_t(e)]; p0 += pairs_cta) items.push_back({e, p0});

    const q8k_rows xq = quantize_rows(P.x, P.rows, n_embd);
    std::vector<float> mid(std::size_t(n_pairs) * n_ff, 0.0f);
    const auto& lay = P.GL;
    const std::size_t qe = lay.quant_bytes(), de = lay.scale_count();
    std::vector<std::uint8_t> sw(4 * 8 * 1024), sa(pairs_cta * 256);
    std::vector<float> sxd(pairs_cta);

    // Gate/up.
    for (auto [e, p0] : items) {
        const int first = offsets[std::size_t(e)] + p0;
        const int count = std::min(offsets[std::size_t(e) + 1] - first, pairs_cta);
        std::vector<int> srow(pairs_cta, 0);
        for (int p = 0; p < count; ++p) srow[std::size_t(p)] = sorted[std::size_t(first + p)] / slots;
        const int nb = n_embd / 256;
        for (int f0 = 0; f0 < n_ff; f0 += 64) {
            std::vector<int> sls(4 * 32 * 8);
            std::vector<float> swd(4 * 32);
            std::vector<float> sumf(warps * 32 * outs, 0.0f);  // [warp][lane][i]
            for (int b = 0; b < nb; ++b) {
                for (int task = 0; task < 4 * 32 * 8; ++task) {
                    const int tt = task / 256, row = (task / 8) % 32, ib = task % 8;
                    const bool up = tt >= 2;
                    const int f = f0 + 32 * (tt % 2) + row;
                    const std::uint8_t* q = (up ? P.uq : P.gq).data() + std::size_t(e) * qe;
                    const std::uint16_t* dsc = (up ? P.ud : P.gd).data() + std::size_t(e) * de;
                    std::uint32_t a0 = 0, a1 = 0;
                    if (f < n_ff) {
                        a0 = word_at(q + lay.quant_offset(f, b, ib / 2) + (ib % 2) * 8);
                        a1 = word_at(q + lay.quant_offset(f, b, ib / 2) + (ib % 2) * 8 + 4);
                    }
                    std::uint8_t* dst = sw.data() + (tt * 8 + ib) * 1024 + row * 16;
                    for (int l = 0; l < 4; ++l) {
                        std::uint32_t w0, w1;
                        iq2_xxs_group_decode(iq2_xxs_grid_sel(int((a0 >> (8 * l)) & 255u)) |
                                                 iq2_xxs_sign_sel(int((a1 >> (7 * l)) & 127u)),
                                             w0, w1);
                        if (f >= n_ff) w0 = w1 = 0;
                        std::memcpy(dst + (l / 2) * 512 + (l % 2) * 8, &w0, 4);
                        std::memcpy(dst + (l / 2) * 512 + (l % 2) * 8 + 4, &w1, 4);
                    }
                    sls[std::size_t((tt * 32 + row) * 8 + ib)] = int(2 * (a1 >> 28) + 1);
                    if (ib == 0) swd[std::size_t(tt * 32 + row)] = f < n_ff ? f16_to_f32(dsc[lay.scale_index(f, b)]) : 0.0f;
                }
                gather(xq, n_embd, srow, count, b, sa, sxd);
                for (int warp = 0; warp < warps; ++warp) {
                    const int wn = warp % 4, wm = warp / 4;
                    std::vector<int> bsum(32 * outs, 0);
                    for (int ib = 0; ib < 8; ++ib) {
                        const std::uint8_t* tile = sw.data() + (wn * 8 + ib) * 1024;
                        warp_mma(
                            tile, sa, wm, ib, [](int, int, int, int, int) { return 0; },
                            [&](int lane, int mi, int ni, int h, int ee, int d) {
                                const int g = lane / 4;
                                const int ls = sls[std::size_t((wn * 32 + 16 * mi + 8 * h + g) * 8 + ib)];
                                bsum[std::size_t(lane * outs + out_index(mi, h, ni, ee))] += d * ls;
                            });
                    }
                    for (int lane = 0; lane < 32; ++lane) {
                        const int g = lane / 4, t = lane % 4;
                        for (int mi = 0; mi < 2; ++mi)
                            for (int h = 0; h < 2; ++h) {
                                const float wd = swd[std::size_t(wn * 32 + 16 * mi + 8 * h + g)];
                                for (int ni = 0; ni < n_tiles; ++ni)
                                    for (int ee = 0; ee < 2; ++ee) {
                                        const int i = out_index(mi, h, ni, ee);
                                        const float dd = mul_rn(wd, sxd[std::size_t(wm * warp_pairs + ni * 8 + 2 * t + ee)]);
                                        float& s = sumf[std::size_t((warp * 32 + lane) * outs + i)];
                                        s = add_rn(s, mul_rn(dd, float(bsum[std::size_t(lane * outs + i)])));
                                    }
                            }
                    }
                }
            }
            std::vector<float> sres(2 * pairs_cta * 64, 0.0f);
            for (int warp = 0; warp < warps; ++warp) {
                const int wn = warp % 4, wm = warp / 4;
                for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane / 4, t = lane % 4;
                    for (int mi = 0; mi < 2; ++mi)
                        for (int h = 0; h < 2; ++h)
                            for (int ni = 0; ni < n_tiles; ++ni)
                                for (int ee = 0; ee < 2; ++ee) {
                                    const int fr = 32 * (wn % 2) + 16 * mi + 8 * h + g, pr = wm * warp_pairs + ni * 8 + 2 * t + ee;
                                    sres[std::size_t(((wn / 2) * pairs_cta + pr) * 64 + fr)] =
                                        mul_rn(0.125f, sumf[std::size_t((warp * 32 + lane) * outs + out_index(mi, h, ni, ee))]);
                                }
                }
            }
            for (int i = 0; i < count * 64; ++i) {
                const int pr = i / 64, fr = i % 64, f = f0 + fr;
                if (f >= n_ff) continue;
                const int pair = sorted[std::size_t(first + pr)];
                const float gv = std::fmin(sres[std::size_t(pr * 64 + fr)], 10.0f);
                const float uv = std::fmax(std::fmin(sres[std::size_t((pairs_cta + pr) * 64 + fr)], 10.0f), -10.0f);
                mid[std::size_t(pair) * n_ff + f] = mul_rn(mul_rn(silu(gv), uv), P.w[std::size_t(pair)]);
            }
        }
    }

    // Down.
    const q8k_rows mq = quantize_rows(mid, n_pairs, n_ff);
    std::vector<float> ys(std::size_t(n_pairs) * n_embd, 0.0f);
    const auto& dl = P.DL;
    const int nbd = n_ff / 256;
    for (auto [e, p0] : items) {
        const int first = offsets[std::size_t(e)] + p0;
        const int count = std::min(offsets[std::size_t(e) + 1] - first, pairs_cta);
        std::vector<int> spair(pairs_cta, 0);
        for (int p = 0; p < count; ++p) spair[std::size_t(p)] = sorted[std::size_t(first + p)];
        const std::uint8_t* q = P.dq.data() + std::size_t(e) * dl.quant_bytes();
        const std::uint32_t* ddv = P.ddd.data() + std::size_t(e) * dl.dd_count();
        for (int o0 = 0; o0 < n_embd; o0 += 128) {
            std::vector<float> sumf(warps * 32 * outs, 0.0f);
            std::vector<std::uint8_t> smin(4 * 2 * 32 * 16);  // per tile [half][row][16]: mins, 16 x mins
            std::vector<float> sdd(4 * 32 * 2);
            std::vector<std::int16_t> sbs(pairs_cta * 16);
            for (int b = 0; b < nbd; ++b) {
                for (int task = 0; task < 4 * 32 * 8; ++task) {
                    const int tt = task / 256, row = (task / 8) % 32, ib = task % 8, k = ib / 4, j = ib % 4;
                    const int o = o0 + 32 * tt + row;
                    const bool ok = o < n_embd;
                    std::uint8_t scb[16] = {};
                    if (ok) std::memcpy(scb, q + dl.quant_offset(o, b, 0), 16);
                    std::uint8_t* dst = sw.data() + (tt * 8 + ib) * 1024 + row * 16;
                    for (int h = 0; h < 2; ++h) {
                        std::uint32_t v[4] = {};
                        if (ok) std::memcpy(v, q + dl.quant_offset(o, b, 1 + 2 * k + h), 16);
                        const unsigned s = scb[8 * k + 2 * j + h] & 15u;
                        for (auto& x : v) x = ((x >> (2 * j)) & 0x03030303u) * s;
                        std::memcpy(dst + h * 512, v, 16);
                    }
                    if (ib == 0) {
                        for (int gg = 0; gg < 16; ++gg) {
                            smin[std::size_t(((tt * 2 + 0) * 32 + row) * 16 + gg)] = std::uint8_t(scb[gg] >> 4);
                            smin[std::size_t(((tt * 2 + 1) * 32 + row) * 16 + gg)] = std::uint8_t(scb[gg] & 0xf0u);
                        }
                        const std::uint32_t dv = ok ? ddv[dl.dd_index(o, b)] : 0u;
                        sdd[std::size_t((tt * 32 + row) * 2)] = f16_to_f32(std::uint16_t(dv & 0xffffu));
                        sdd[std::size_t((tt * 32 + row) * 2 + 1)] = f16_to_f32(std::uint16_t(dv >> 16));
                    }
                }
                gather(mq, n_ff, spair, count, b, sa, sxd);
                for (int i = 0; i < pairs_cta * 16; ++i) {
                    const int p = i / 16, gg = i % 16;
                    sbs[std::size_t(i)] = p < count ? mq.bsums[std::size_t(spair[std::size_t(p)]) * (n_ff / 16) + b * 16 + gg] : std::int16_t(0);
                }
                for (int warp = 0; warp < warps; ++warp) {
                    const int wn = warp % 4, wm = warp / 4;
                    std::vector<int> isum(32 * outs, 0);
                    for (int ib = 0; ib < 8; ++ib) {
                        const std::uint8_t* tile = sw.data() + (wn * 8 + ib) * 1024;
                        warp_mma(
                            tile, sa, wm, ib,
                            [&](int lane, int mi, int ni, int h, int ee) { return isum[std::size_t(lane * outs + out_index(mi, h, ni, ee))]; },
                            [&](int lane, int mi, int ni, int h, int ee, int d) { isum[std::size_t(lane * outs + out_index(mi, h, ni, ee))] = d; });
                    }
                    // The min term as the kernel forms it: the u8 mma of tile wn's [mins | 16 mins]
                    // against each pair's 16-sums split as [bsum & 15 | bsum >> 4] (byte_perm'd).
                    std::vector<int> summs(32 * outs, 0);
                    for (int ni = 0; ni < n_tiles; ++ni)
                        for (int mi = 0; mi < 2; ++mi) {
                            test::mma_s8_warp w;
                            load_a(w, smin.data() + std::size_t(wn) * 1024, mi);
                            for (int lane = 0; lane < 32; ++lane) {
                                const int g = lane / 4, t = lane % 4, pr = wm * warp_pairs + ni * 8 + g;
                                std::uint32_t vx, vy;
                                std::memcpy(&vx, &sbs[std::size_t(pr * 16 + 4 * t)], 4);
                                std::memcpy(&vy, &sbs[std::size_t(pr * 16 + 4 * t + 2)], 4);
                                w.b[lane][0] = byte_perm(vx & 0x000f000fu, vy & 0x000f000fu, 0x6420u);
                                w.b[lane][1] = byte_perm((vx >> 4) & 0x00ff00ffu, (vy >> 4) & 0x00ff00ffu, 0x6420u);
                            }
                            test::mma_m16n8k32_s8(w, true);
                            for (int lane = 0; lane < 32; ++lane)
                                for (int x = 0; x < 4; ++x) summs[std::size_t(lane * outs + out_index(mi, x / 2, ni, x % 2))] = w.c[lane][x];
                        }
                    for (int lane = 0; lane < 32; ++lane) {
                        const int g = lane / 4, t = lane % 4;
                        for (int mi = 0; mi < 2; ++mi)
                            for (int h = 0; h < 2; ++h) {
                                const int wr = wn * 32 + 16 * mi + 8 * h + g;
                                const float wd = sdd[std::size_t(wr * 2)], wmin = sdd[std::size_t(wr * 2 + 1)];
                                for (int ni = 0; ni < n_tiles; ++ni)
                                    for (int ee = 0; ee < 2; ++ee) {
                                        const int i = out_index(mi, h, ni, ee), pr = wm * warp_pairs + ni * 8 + 2 * t + ee;
                                        const float xd = sxd[std::size_t(pr)];
                                        const float dall = mul_rn(xd, wd), dmin = mul_rn(xd, wmin);
                                        float& s = sumf[std::size_t((warp * 32 + lane) * outs + i)];
                                        s = add_rn(s, sub_rn(mul_rn(dall, float(isum[std::size_t(lane * outs + i)])),
                                                             mul_rn(dmin, float(summs[std::size_t(lane * outs + i)]))));
                                    }
                            }
                    }
                }
            }
            for (int warp = 0; warp < warps; ++warp) {
                const int wn = warp % 4, wm = warp / 4;
                for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane / 4, t = lane % 4;
                    for (int mi = 0; mi < 2; ++mi)
                        for (int h = 0; h < 2; ++h) {
                            const int o = o0 + wn * 32 + 16 * mi + 8 * h + g;
                            if (o >= n_embd) continue;
                            for (int ni = 0; ni < n_tiles; ++ni)
                                for (int ee = 0; ee < 2; ++ee) {
                                    const int pr = wm * warp_pairs + ni * 8 + 2 * t + ee;
                                    if (pr < count)
                                        ys[std::size_t(spair[std::size_t(pr)]) * n_embd + o] =
                                            sumf[std::size_t((warp * 32 + lane) * outs + out_index(mi, h, ni, ee))];
                                }
                        }
                }
            }
        }
    }
    return test::slot_sum(ys, P.rows, n_embd);
}

void check_emulation(const problem& P) {
    CHECK(test::differing_rows(test::reference_routed(P), emulate(P), P.rows, P.n_embd) == 0);
}

void check_emulation(int ne, int rows, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    check_emulation(make_problem(g, 512, 512, ne, rows));
}

}  // namespace

TEST_CASE("moe_gemm emulated on a real forward pass's MoE inputs equals reference/moe bitwise") {
    // The prompt of the CUDA conformance case that failed with DS4_MOE_GEMM=1 (exact mode, tiny
    // model of seed 1, 40 rows, suite seed 320307584: random_tokens(b, seed + 11 + 40, 40)).
    // Equal here, so that failure is not in what this emulation mirrors (indexing, fragments,
    // the order of every float operation); moe_gemm_model_test_gpu runs the kernels on them.
    const int n = 40;
    const auto tokens = test::conformance_tokens(320307584u + 11u + unsigned(n), n, model::tiny_shape::n_vocab);
    const std::vector<problem> layers = test::forward_moe_problems(1, tokens);
    for (std::size_t il = 0; il < layers.size(); ++il) {
        CAPTURE(il);
        check_emulation(layers[il]);
    }
}

TEST_CASE("moe_gemm's tiles and fragments, emulated on the CPU, equal reference/moe bitwise") {
    check_emulation(12, 7, 20261201);  // experts 7..11 may get no pair; a row names one expert twice
    check_emulation(9, 30, 7);         // ~20 pairs per expert
}

TEST_CASE("the mma emulation's A registers, hand-worked") {
    // Register r of every lane holds 1 + r in all four bytes, B is all ones.
    test::mma_s8_warp w;
    for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < 4; ++r) w.a[lane][r] = 0x01010101u * std::uint32_t(1 + r);
        w.b[lane][0] = w.b[lane][1] = 0x01010101u;
    }
    test::mma_m16n8k32_s8(w);
    // Row g: k 0..15 hold 1 (register 0), k 16..31 hold 3 (register 2): 16 + 48 = 64.
    // Row g + 8: registers 1 and 3: 2 * 16 + 4 * 16 = 96.
    CHECK(w.c[0][0] == 64);
    CHECK(w.c[0][2] == 96);
}

TEST_CASE("the mma emulation's u8 A form, hand-worked") {
    // Every A byte 0xf0 and B all ones: 32 products of 240 (u8) or of -16 (s8) per output.
    test::mma_s8_warp u, s;
    for (int lane = 0; lane < 32; ++lane) {
        for (int r = 0; r < 4; ++r) u.a[lane][r] = s.a[lane][r] = 0xf0f0f0f0u;
        u.b[lane][0] = u.b[lane][1] = s.b[lane][0] = s.b[lane][1] = 0x01010101u;
    }
    test::mma_m16n8k32_s8(u, true);
    test::mma_m16n8k32_s8(s);
    CHECK(u.c[5][3] == 32 * 240);
    CHECK(s.c[5][3] == 32 * -16);
}

TEST_CASE("sel_table_offset addresses entry (w >> pos) & mask, copy c, as the index arithmetic does") {
    std::mt19937 rng(11);
    for (int n = 0; n < 2000; ++n) {
        const std::uint32_t w = rng(), c = rng() % 8;
        for (int l = 0; l < 4; ++l) {
            CHECK(ds4::kernels::sel_table_offset<3>(w, 8 * l, 255u, 4 * c) == (((w >> (8 * l)) & 255u) * 8 + c) * 4);
            CHECK(ds4::kernels::sel_table_offset<3>(w, 7 * l, 127u, 4 * c) == (((w >> (7 * l)) & 127u) * 8 + c) * 4);
        }
    }
}
