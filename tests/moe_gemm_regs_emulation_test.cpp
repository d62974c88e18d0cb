// A CPU emulation of kernels/moe_gemm_gate_up_regs.cuh and moe_gemm_down_regs.cuh: every lane's
// A words formed from the stored weight bytes as the kernels form them (no decoded tile), its B
// words read through the kernels' shared-memory swizzles, the mma from
// tests/support/mma_s8_emulation.hpp (the PTX fragment tables), then the kernels' float chains;
// bitwise against reference/moe's moe_routed. It checks the k order the gate/up lanes use (grid
// group t of a sub-block in lane t, its B bytes 8t..8t+7) without a GPU; it mirrors the kernels'
// code rather than running it (ds4-validate's moe_gemm_regs rows run them).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/byte_perm.hpp"
#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_block_dot.hpp"
#include "tests/support/mma_s8_emulation.hpp"
#include "tests/support/moe_gemm_problem.hpp"
#include "tests/support/moe_model_inputs.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;
using test::problem;
using test::q8k_rows;

constexpr int slots = test::moe_problem_slots, pairs_cta = 64, warps = 8, nt = pairs_cta / 8;

std::uint32_t word_at(const std::uint8_t* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The two kernels' activation swizzles (16-byte chunk positions of pair p's 256-byte block).
int act_at_gate_up(int p, int c) { return p * 256 + ((c ^ (2 * (p & 7))) * 16); }
int act_at_down(int p, int c) { return p * 256 + ((c ^ (p & 7)) * 16); }

template <class At>
void gather(const q8k_rows& a, int n, const std::vector<int>& rows_of, int count, int b, At at, std::vector<std::uint8_t>& sa,
            std::vector<float>& sd) {
    for (int c = 0; c < pairs_cta * 16; ++c) {
        const int p = c / 16, ch = c % 16;
        for (int i = 0; i < 16; ++i)
            sa[std::size_t(at(p, ch) + i)] =
                p < count ? std::uint8_t(a.q[std::size_t(rows_of[std::size_t(p)]) * n + b * 256 + ch * 16 + i]) : 0;
    }
    for (int p = 0; p < pairs_cta; ++p) sd[std::size_t(p)] = p < count ? a.d[std::size_t(rows_of[std::size_t(p)]) * (n / 256) + b] : 0.0f;
}

struct item {
    int e, first, count;
};
std::vector<item> items_of(const std::vector<int>& offsets, int ne) {
    std::vector<item> v;
    for (int e = 0; e < ne; ++e)
        for (int p0 = 0; p0 < offsets[std::size_t(e) + 1] - offsets[std::size_t(e)]; p0 += pairs_cta) {
            const int first = offsets[std::size_t(e)] + p0;
            v.push_back({e, first, std::min(offsets[std::size_t(e) + 1] - first, pairs_cta)});
        }
    return v;
}

std::vector<float> emulate(const problem& P) {
    const int n_embd = P.n_embd, n_ff = P.n_ff, n_pairs = P.rows * slots;
    const auto [offsets, sorted] = test::group_pairs(P);
    const std::vector<item> items = items_of(offsets, P.ne);
    const q8k_rows xq = test::quantize_rows(P.x, P.rows, n_embd);
    std::vector<float> mid(std::size_t(n_pairs) * n_ff, 0.0f);
    std::vector<std::uint8_t> sa(pairs_cta * 256);
    std::vector<float> sxd(pairs_cta);

    // Gate/up: warp w on tile w / 2, rows r0 = 16 (w % 2) + g and r0 + 8; lane t decodes grid
    // group t of both rows.
    const auto& GL = P.GL;
    for (const item& it : items) {
        std::vector<int> srow(pairs_cta, 0);
        for (int p = 0; p < it.count; ++p) srow[std::size_t(p)] = sorted[std::size_t(it.first + p)] / slots;
        const int n_live = (it.count + 7) / 8, nb = n_embd / 256;
        for (int f0 = 0; f0 < n_ff; f0 += 64) {
            std::vector<float> sumf(std::size_t(warps) * 32 * nt * 4, 0.0f);
            for (int b = 0; b < nb; ++b) {
                gather(xq, n_embd, srow, it.count, b, act_at_gate_up, sa, sxd);
                for (int warp = 0; warp < warps; ++warp) {
                    const int tt = warp / 2;
                    const bool up = tt >= 2;
                    const std::uint8_t* raw = (up ? P.uq : P.gq).data() + std::size_t(it.e) * GL.quant_bytes() +
                                              GL.quant_offset(f0 + 32 * (tt % 2), b, 0);
                    const std::uint16_t* dsc = (up ? P.ud : P.gd).data() + std::size_t(it.e) * GL.scale_count();
                    std::vector<int> bsum(32 * nt * 4, 0);
                    for (int ib = 0; ib < 8; ++ib) {
                        test::mma_s8_warp w[nt];
                        int ls[32][2];
                        for (int lane = 0; lane < 32; ++lane) {
                            const int g = lane / 4, t = lane % 4, r0 = 16 * (warp % 2) + g;
                            std::uint32_t a[4];
                            for (int h = 0; h < 2; ++h) {
                                const std::uint8_t* v = raw + (ib / 2) * 512 + (r0 + 8 * h) * 16 + (ib % 2) * 8;
                                const std::uint32_t vx = word_at(v), vy = word_at(v + 4);
                                iq2_xxs_group_decode(iq2_xxs_grid_sel(int((vx >> (8 * t)) & 255u)) |
                                                         iq2_xxs_sign_sel(int((vy >> (7 * t)) & 127u)),
                                                     a[h], a[2 + h]);
                                ls[lane][h] = int(2 * (vy >> 28) + 1);
                            }
                            for (int n = 0; n < n_live; ++n) {
                                for (int r = 0; r < 4; ++r) w[n].a[lane][r] = a[r];
                                const std::uint8_t* bp = sa.data() + act_at_gate_up(8 * n + g, 2 * ib + t / 2) + (8 * t) % 16;
                                w[n].b[lane][0] = word_at(bp);
                                w[n].b[lane][1] = word_at(bp + 4);
                            }
                        }
                        for (int n = 0; n < n_live; ++n) {
                            test::mma_m16n8k32_s8(w[n]);
                            for (int lane = 0; lane < 32; ++lane)
                                for (int x = 0; x < 4; ++x) bsum[std::size_t((lane * nt + n) * 4 + x)] += w[n].c[lane][x] * ls[lane][x / 2];
                        }
                    }
                    for (int lane = 0; lane < 32; ++lane) {
                        const int g = lane / 4, t = lane % 4, r0 = 16 * (warp % 2) + g;
                        for (int n = 0; n < n_live; ++n)
                            for (int x = 0; x < 4; ++x) {
                                const int f = f0 + 32 * (tt % 2) + r0 + 8 * (x / 2);
                                const float wd = f16_to_f32(dsc[GL.scale_index(f, b)]);
                                const float dd = mul_rn(wd, sxd[std::size_t(8 * n + 2 * t + x % 2)]);
                                float& s = sumf[std::size_t(((warp * 32 + lane) * nt + n) * 4 + x)];
                                s = add_rn(s, mul_rn(dd, float(bsum[std::size_t((lane * nt + n) * 4 + x)])));
                            }
                    }
                }
            }
            std::vector<float> sres(2 * pairs_cta * 64, 0.0f);
            for (int warp = 0; warp < warps; ++warp)
                for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane / 4, t = lane % 4, tt = warp / 2, fr = 32 * (tt % 2) + 16 * (warp % 2) + g;
                    for (int n = 0; n < nt; ++n)
                        for (int x = 0; x < 4; ++x)
                            sres[std::size_t(((tt / 2) * pairs_cta + 8 * n + 2 * t + x % 2) * 64 + fr + 8 * (x / 2))] =
                                mul_rn(0.125f, sumf[std::size_t(((warp * 32 + lane) * nt + n) * 4 + x)]);
                }
            for (int i = 0; i < it.count * 64; ++i) {
                const int pr = i / 64, fr = i % 64;
                const int pair = sorted[std::size_t(it.first + pr)];
                const float gv = std::fmin(sres[std::size_t(pr * 64 + fr)], 10.0f);
                const float uv = std::fmax(std::fmin(sres[std::size_t((pairs_cta + pr) * 64 + fr)], 10.0f), -10.0f);
                mid[std::size_t(pair) * n_ff + f0 + fr] = mul_rn(mul_rn(silu(gv), uv), P.w[std::size_t(pair)]);
            }
        }
    }

    // Down: warp w on tile w / 2, rows r0, r0 + 8; lane t's A words are word t of the row's
    // pieces, times the group scale; the min term from the row's scale bytes.
    const q8k_rows mq = test::quantize_rows(mid, n_pairs, n_ff);
    std::vector<float> ys(std::size_t(n_pairs) * n_embd, 0.0f);
    const auto& DL = P.DL;
    const int nbd = n_ff / 256;
    for (const item& it : items) {
        std::vector<int> spair(pairs_cta, 0);
        for (int p = 0; p < it.count; ++p) spair[std::size_t(p)] = sorted[std::size_t(it.first + p)];
        const int n_live = (it.count + 7) / 8;
        for (int o0 = 0; o0 < n_embd; o0 += 128) {
            std::vector<float> sumf(std::size_t(warps) * 32 * nt * 4, 0.0f);
            for (int b = 0; b < nbd; ++b) {
                gather(mq, n_ff, spair, it.count, b, act_at_down, sa, sxd);
                for (int warp = 0; warp < warps; ++warp) {
                    const int tt = warp / 2;
                    const std::uint8_t* raw = P.dq.data() + std::size_t(it.e) * DL.quant_bytes() + DL.quant_offset(o0 + 32 * tt, b, 0);
                    std::vector<int> isum(32 * nt * 4, 0);
                    for (int ib = 0; ib < 8; ++ib) {
                        const int k = ib / 4, j = ib % 4, gr = 8 * k + 2 * j;
                        for (int n = 0; n < n_live; ++n) {
                            test::mma_s8_warp w;
                            for (int lane = 0; lane < 32; ++lane) {
                                const int g = lane / 4, t = lane % 4, r0 = 16 * (warp % 2) + g;
                                for (int r = 0; r < 4; ++r) {
                                    const int row = r0 + 8 * (r % 2), h = r / 2;
                                    const std::uint32_t q = word_at(raw + (1 + 2 * k + h) * 512 + row * 16 + 4 * t);
                                    w.a[lane][r] = ((q >> (2 * j)) & 0x03030303u) * (raw[row * 16 + gr + h] & 15u);
                                }
                                w.b[lane][0] = word_at(sa.data() + act_at_down(8 * n + g, 2 * ib) + 4 * t);
                                w.b[lane][1] = word_at(sa.data() + act_at_down(8 * n + g, 2 * ib + 1) + 4 * t);
                                for (int x = 0; x < 4; ++x) w.c[lane][x] = isum[std::size_t((lane * nt + n) * 4 + x)];
                            }
                            test::mma_m16n8k32_s8(w);
                            for (int lane = 0; lane < 32; ++lane)
                                for (int x = 0; x < 4; ++x) isum[std::size_t((lane * nt + n) * 4 + x)] = w.c[lane][x];
                        }
                    }
                    for (int n = 0; n < n_live; ++n) {
                        test::mma_s8_warp w;
                        for (int lane = 0; lane < 32; ++lane) {
                            const int g = lane / 4, t = lane % 4, r0 = 16 * (warp % 2) + g;
                            for (int h = 0; h < 2; ++h) {
                                const std::uint32_t sw = word_at(raw + (r0 + 8 * h) * 16 + 4 * t);
                                w.a[lane][h] = (sw >> 4) & 0x0f0f0f0fu;
                                w.a[lane][2 + h] = sw & 0xf0f0f0f0u;
                            }
                            const int pr = 8 * n + g;
                            std::int16_t bs[4];
                            for (int i = 0; i < 4; ++i)
                                bs[i] = pr < it.count ? mq.bsums[std::size_t(spair[std::size_t(pr)]) * (n_ff / 16) + b * 16 + 4 * t + i]
                                                      : std::int16_t(0);
                            std::uint32_t vx, vy;
                            std::memcpy(&vx, bs, 4);
                            std::memcpy(&vy, bs + 2, 4);
                            w.b[lane][0] = byte_perm(vx & 0x000f000fu, vy & 0x000f000fu, 0x6420u);
                            w.b[lane][1] = byte_perm((vx >> 4) & 0x00ff00ffu, (vy >> 4) & 0x00ff00ffu, 0x6420u);
                        }
                        test::mma_m16n8k32_s8(w, true);
                        for (int lane = 0; lane < 32; ++lane) {
                            const int g = lane / 4, t = lane % 4, r0 = 16 * (warp % 2) + g;
                            for (int x = 0; x < 4; ++x) {
                                const int o = o0 + 32 * tt + r0 + 8 * (x / 2);
                                const std::uint32_t dv = P.ddd[std::size_t(it.e) * DL.dd_count() + DL.dd_index(o, b)];
                                const float xd = sxd[std::size_t(8 * n + 2 * t + x % 2)];
                                const float dall = mul_rn(xd, f16_to_f32(std::uint16_t(dv & 0xffffu)));
                                const float dmin = mul_rn(xd, f16_to_f32(std::uint16_t(dv >> 16)));
                                float& s = sumf[std::size_t(((warp * 32 + lane) * nt + n) * 4 + x)];
                                s = add_rn(s, sub_rn(mul_rn(dall, float(isum[std::size_t((lane * nt + n) * 4 + x)])),
                                                     mul_rn(dmin, float(w.c[lane][x]))));
                            }
                        }
                    }
                }
            }
            for (int warp = 0; warp < warps; ++warp)
                for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane / 4, t = lane % 4, r0 = 16 * (warp % 2) + g;
                    for (int n = 0; n < nt; ++n)
                        for (int x = 0; x < 4; ++x) {
                            const int pr = 8 * n + 2 * t + x % 2, o = o0 + 32 * (warp / 2) + r0 + 8 * (x / 2);
                            if (pr < it.count)
                                ys[std::size_t(spair[std::size_t(pr)]) * n_embd + o] = sumf[std::size_t(((warp * 32 + lane) * nt + n) * 4 + x)];
                        }
                }
        }
    }
    return test::slot_sum(ys, P.rows, n_embd);
}

void check_emulation(int ne, int rows, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    const problem P = test::make_problem(g, 512, 512, ne, rows);
    CHECK(test::differing_rows(test::reference_routed(P), emulate(P), P.rows, P.n_embd) == 0);
}

}  // namespace

TEST_CASE("moe_gemm's fragment-decoding kernels, emulated on the CPU, equal reference/moe bitwise") {
    check_emulation(12, 7, 20261206);  // experts 7..11 may get no pair; a row names one expert twice
    check_emulation(9, 30, 11);        // ~20 pairs per expert: three live n-tiles
    check_emulation(6, 80, 5);         // ~80 pairs per expert: a full item and a partial one each
}
