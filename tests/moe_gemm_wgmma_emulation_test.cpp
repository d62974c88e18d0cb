// A CPU emulation of kernels/moe_gemm_wgmma.cuh: its activation staging and IQ2_XXS decode
// (gate/up: the scaled weights' two digit operands) into the core-matrix layout (moe_gemm_wgmma_layout.hpp), the descriptors its warpgroups build
// for each k-step, the accumulator mapping of its float chain and epilogue, with wgmma from
// tests/support/wgmma_s8_emulation.hpp (the PTX ISA's descriptor, layout and fragment rules).
// Every pair's mid (silu(min(g, c)) * clamp(u, c) * w) must equal the one computed from the GGUF
// blocks with dot_iq2_xxs_q8_k, bit for bit. It runs without a GPU and catches indexing and layout
// slips; the down kernel's the same way, the whole layer against reference/moe's moe_routed.
// moe_gemm_wgmma rows of ds4-validate and moe_gemm_model_test_gpu run the kernels themselves.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_gemm_wgmma_layout.hpp"
#include "ds4/kernels/wgmma_operand.hpp"
#include "ds4/kernels/wgmma_desc.hpp"
#include "tests/support/moe_gemm_problem.hpp"
#include "tests/support/moe_model_inputs.hpp"
#include "tests/support/wgmma_s8_emulation.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;
using test::problem;

constexpr int slots = test::moe_problem_slots, pairs_cta = 64;
constexpr float clamp_c = 10.0f;

std::uint32_t word_at(const std::uint8_t* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Shared memory of the emulated CTA: the activation operand at 0, decoded weights of buffer
// `buf`, matrix h (gate 0, up 1) after it, 16 KiB each.
constexpr std::uint32_t act_base = 0;
constexpr std::uint32_t w_base(int buf, int h) { return std::uint32_t(wg_operand_bytes * (1 + 2 * buf + h)); }
// Gate/up's decoded operands: buffer buf, matrix h, digit (hi 0, lo 1).
constexpr std::uint32_t w_split_base(int buf, int h, int digit) { return std::uint32_t(wg_operand_bytes * (1 + 4 * buf + 2 * h + digit)); }

// Block b of the CTA's pairs' Q8_K rows (rows_of[p], p < count; zeros past) as the kernels'
// issue_wg_acts places them: 1024 copies of 16 bytes, and the scales.
void stage_acts(const test::q8k_rows& a, int n, const std::vector<int>& rows_of, int count, int b, std::vector<std::uint8_t>& smem,
                float (&xd)[pairs_cta]) {
    for (int c = 0; c < pairs_cta * 16; ++c) {
        const int p = wg_copy_row(c), piece = wg_copy_chunk(c);
        for (int i = 0; i < 16; ++i)
            smem[act_base + std::uint32_t(wg_offset(p, piece) + i)] =
                p < count ? std::uint8_t(a.q[std::size_t(rows_of[std::size_t(p)]) * n + b * 256 + piece * 16 + i]) : 0;
    }
    for (int p = 0; p < pairs_cta; ++p) xd[p] = p < count ? a.d[std::size_t(rows_of[std::size_t(p)]) * (n / 256) + b] : 0.0f;
}

// mid[pair][f] as the kernel computes it, for every live pair.
std::vector<float> emulate_mid(const problem& P) {
    const int n_embd = P.n_embd, n_ff = P.n_ff, ne = P.ne, n_pairs = P.rows * slots, nb = n_embd / 256;
    // Sort (any order inside an expert's group gives the same bits).
    const auto [offsets, sorted] = test::group_pairs(P);
    const test::q8k_rows xq = test::quantize_rows(P.x, P.rows, n_embd);
    std::vector<float> mid(std::size_t(n_pairs) * n_ff, 0.0f);
    const auto& lay = P.GL;
    const std::size_t qe = lay.quant_bytes(), de = lay.scale_count();
    std::vector<std::uint8_t> smem(std::size_t(wg_operand_bytes) * 9);
    const std::uint64_t step = wg_kstep_bytes >> 4;

    for (int e = 0; e < ne; ++e)
        for (int p0 = 0; p0 < offsets[std::size_t(e) + 1] - offsets[std::size_t(e)]; p0 += pairs_cta) {
            const int first = offsets[std::size_t(e)] + p0;
            const int count = std::min(offsets[std::size_t(e) + 1] - first, pairs_cta);
            std::vector<int> srow(pairs_cta, 0);
            for (int p = 0; p < count; ++p) srow[std::size_t(p)] = sorted[std::size_t(first + p)] / slots;
            for (int f0 = 0; f0 < n_ff; f0 += 64) {
                float wd[2][128] = {}, xd[pairs_cta] = {};
                std::vector<float> sumf(4 * 128 * 16, 0.0f);  // [warpgroup][thread][x]
                for (int b = 0; b < nb; ++b) {
                    const int buf = b % 2;
                    stage_acts(xq, n_embd, srow, count, b, smem, xd);
                    // Decode tasks (tile tt, row, sub-block ib), as decode().
                    for (int tt = 0; tt < 4; ++tt)
                        for (int row = 0; row < 32; ++row)
                            for (int ib = 0; ib < 8; ++ib) {
                                const int f = f0 + 32 * (tt % 2) + row, r = 32 * (tt % 2) + row;
                                const std::uint8_t* q = (tt >= 2 ? P.uq : P.gq).data() + std::size_t(e) * qe;
                                const std::uint16_t* dsc = (tt >= 2 ? P.ud : P.gd).data() + std::size_t(e) * de;
                                const std::uint32_t a0 = word_at(q + lay.quant_offset(f, b, ib / 2) + (ib % 2) * 8);
                                const std::uint32_t a1 = word_at(q + lay.quant_offset(f, b, ib / 2) + (ib % 2) * 8 + 4);
                                std::uint32_t hi[8], lo[8];
                                const iq2_xxs_split_words sw = iq2_xxs_split_words_of(int(a1 >> 28));
                                for (int l = 0; l < 4; ++l)
                                    iq2_xxs_group_decode_split(sw,
                                                               iq2_xxs_grid_sel(int((a0 >> (8 * l)) & 255u)) |
                                                                   iq2_xxs_sign_sel(int((a1 >> (7 * l)) & 127u)),
                                                               hi[2 * l], hi[2 * l + 1], lo[2 * l], lo[2 * l + 1]);
                                for (int half = 0; half < 2; ++half) {
                                    const std::uint32_t off = std::uint32_t(wg_offset(r, 2 * ib + half));
                                    std::memcpy(&smem[w_split_base(buf, tt / 2, 0) + off], hi + 4 * half, 16);
                                    std::memcpy(&smem[w_split_base(buf, tt / 2, 1) + off], lo + 4 * half, 16);
                                }
                                if (ib == 0) wd[buf][tt * 32 + row] = f16_to_f32(dsc[lay.scale_index(f, b)]);
                            }
                    // Each warpgroup's eight k-steps and the block's float chain.
                    for (int wgi = 0; wgi < 4; ++wgi) {
                        const moe_wg_role role = moe_wg_role_of(wgi);
                        if (moe_wg_n * role.ph >= count) continue;
                        // Each digit's 8 sub-blocks chained on one accumulator; bsum = 64 hi + lo.
                        std::vector<std::int32_t> bsum(128 * 16, 0), dh, dl;
                        const std::uint64_t dah = wgmma_desc_bits(w_split_base(buf, role.h, 0), wg_lbo, wg_sbo);
                        const std::uint64_t dal = wgmma_desc_bits(w_split_base(buf, role.h, 1), wg_lbo, wg_sbo);
                        const std::uint64_t db =
                            wgmma_desc_bits(act_base + std::uint32_t(wg_offset(moe_wg_n * role.ph, 0)), wg_lbo, wg_sbo);
                        for (int ib = 0; ib < 8; ++ib) {
                            test::wgmma_m64nNk32_s8(smem, dah + step * std::uint64_t(ib), db + step * std::uint64_t(ib), moe_wg_n, dh, ib > 0);
                            test::wgmma_m64nNk32_s8(smem, dal + step * std::uint64_t(ib), db + step * std::uint64_t(ib), moe_wg_n, dl, ib > 0);
                        }
                        for (std::size_t i = 0; i < bsum.size(); ++i) bsum[i] = 64 * dh[i] + dl[i];
                        for (int th = 0; th < 128; ++th)
                            for (int x = 0; x < 16; ++x) {
                                const int r = 64 * role.h + wg_acc_row(th / 32, th % 32 / 4, x);
                                const int pr = moe_wg_n * role.ph + wg_acc_col(th % 4, x);
                                const float dd = mul_rn(wd[buf][r], xd[pr]);
                                float& s = sumf[std::size_t((wgi * 128 + th) * 16 + x)];
                                s = add_rn(s, mul_rn(dd, float(bsum[std::size_t(th * 16 + x)])));
                            }
                    }
                }
                std::vector<float> sres(2 * pairs_cta * 64, 0.0f);
                for (int wgi = 0; wgi < 4; ++wgi) {
                    const moe_wg_role role = moe_wg_role_of(wgi);
                    for (int th = 0; th < 128; ++th)
                        for (int x = 0; x < 16; ++x) {
                            const int fr = wg_acc_row(th / 32, th % 32 / 4, x), pr = moe_wg_n * role.ph + wg_acc_col(th % 4, x);
                            sres[std::size_t((role.h * pairs_cta + pr) * 64 + fr)] = mul_rn(0.125f, sumf[std::size_t((wgi * 128 + th) * 16 + x)]);
                        }
                }
                for (int i = 0; i < count * 64; ++i) {
                    const int pr = i / 64, fr = i % 64, f = f0 + fr;
                    const int pair = sorted[std::size_t(first + pr)];
                    const float gv = std::fmin(sres[std::size_t(pr * 64 + fr)], clamp_c);
                    const float uv = std::fmax(std::fmin(sres[std::size_t((pairs_cta + pr) * 64 + fr)], clamp_c), -clamp_c);
                    mid[std::size_t(pair) * n_ff + f] = mul_rn(mul_rn(silu(gv), uv), P.w[std::size_t(pair)]);
                }
            }
        }
    return mid;
}

// The layer's output as the wgmma kernels compute it: the emulated mid, its Q8_K, the down kernel's
// staging, Q2_K decode (q * group scale), min-term operands, wgmma chain and float chain, then the
// slot sum in order.
std::vector<float> emulate_routed(const problem& P) {
    const int n_embd = P.n_embd, n_ff = P.n_ff, n_pairs = P.rows * slots, nb = n_ff / 256;
    const auto [offsets, sorted] = test::group_pairs(P);
    const std::vector<float> mid = emulate_mid(P);
    const test::q8k_rows mq = test::quantize_rows(mid, n_pairs, n_ff);
    const auto& dl = P.DL;
    std::vector<std::uint8_t> smem(std::size_t(wg_operand_bytes) * 5 + 6 * 2048);
    const std::uint32_t mins_base = std::uint32_t(wg_operand_bytes) * 5, bs_base = mins_base + 4 * 2048;
    const std::uint64_t step = wg_kstep_bytes >> 4;
    std::vector<float> ys(std::size_t(n_pairs) * n_embd, 0.0f);
    for (int e = 0; e < P.ne; ++e)
        for (int p0 = 0; p0 < offsets[std::size_t(e) + 1] - offsets[std::size_t(e)]; p0 += pairs_cta) {
            const int first = offsets[std::size_t(e)] + p0;
            const int count = std::min(offsets[std::size_t(e) + 1] - first, pairs_cta);
            std::vector<int> spair(pairs_cta, 0);
            for (int p = 0; p < count; ++p) spair[std::size_t(p)] = sorted[std::size_t(first + p)];
            const std::uint8_t* q = P.dq.data() + std::size_t(e) * dl.quant_bytes();
            const std::uint32_t* ddv = P.ddd.data() + std::size_t(e) * dl.dd_count();
            for (int o0 = 0; o0 < n_embd; o0 += 128) {
                float dd[2][128][2] = {}, xd[pairs_cta] = {};
                std::vector<float> sumf(4 * 128 * 16, 0.0f);
                for (int b = 0; b < nb; ++b) {
                    const int buf = b % 2;
                    stage_acts(mq, n_ff, spair, count, b, smem, xd);
                    for (int tt = 0; tt < 4; ++tt)
                        for (int row = 0; row < 32; ++row) {
                            const int o = o0 + 32 * tt + row, r = 32 * (tt % 2) + row;
                            std::uint8_t scb[16];
                            std::memcpy(scb, q + dl.quant_offset(o, b, 0), 16);
                            for (int ib = 0; ib < 8; ++ib)
                                for (int h = 0; h < 2; ++h) {
                                    const int k = ib / 4, j = ib % 4;
                                    std::uint32_t v[4];
                                    std::memcpy(v, q + dl.quant_offset(o, b, 1 + 2 * k + h), 16);
                                    const unsigned sc = scb[8 * k + 2 * j + h] & 15u;
                                    for (auto& x : v) x = ((x >> (2 * j)) & 0x03030303u) * sc;
                                    std::memcpy(&smem[w_base(buf, tt / 2) + std::uint32_t(wg_offset(r, 2 * ib + h))], v, 16);
                                }
                            const std::uint32_t mb = mins_base + std::uint32_t((2 * buf + tt / 2) * 2048);
                            for (int gg = 0; gg < 16; ++gg) {
                                smem[mb + std::uint32_t(wg_offset(r, 0) + gg)] = std::uint8_t(scb[gg] >> 4);
                                smem[mb + std::uint32_t(wg_offset(r, 1) + gg)] = std::uint8_t(scb[gg] & 0xf0u);
                            }
                            const std::uint32_t dv = ddv[dl.dd_index(o, b)];
                            dd[buf][tt * 32 + row][0] = f16_to_f32(std::uint16_t(dv & 0xffffu));
                            dd[buf][tt * 32 + row][1] = f16_to_f32(std::uint16_t(dv >> 16));
                        }
                    // The min term's B: each pair's 16-sums as [bsum & 15 | bsum >> 4], bytes.
                    const std::uint32_t bb = bs_base + std::uint32_t(buf * 2048);
                    for (int p = 0; p < pairs_cta; ++p)
                        for (int gg = 0; gg < 16; ++gg) {
                            const int bsum = p < count ? mq.bsums[std::size_t(spair[std::size_t(p)]) * (n_ff / 16) + b * 16 + gg] : 0;
                            smem[bb + std::uint32_t(wg_offset(p, 0) + gg)] = std::uint8_t(bsum & 15);
                            smem[bb + std::uint32_t(wg_offset(p, 1) + gg)] = std::uint8_t((bsum >> 4) & 0xff);
                        }
                    for (int wgi = 0; wgi < 4; ++wgi) {
                        const moe_wg_role role = moe_wg_role_of(wgi);
                        if (moe_wg_n * role.ph >= count) continue;
                        const std::uint32_t pair_off = std::uint32_t(wg_offset(moe_wg_n * role.ph, 0));
                        const std::uint64_t da = wgmma_desc_bits(w_base(buf, role.h), wg_lbo, wg_sbo);
                        const std::uint64_t db = wgmma_desc_bits(act_base + pair_off, wg_lbo, wg_sbo);
                        std::vector<std::int32_t> isum, summs;
                        for (int ib = 0; ib < 8; ++ib)
                            test::wgmma_m64nNk32_s8(smem, da + step * std::uint64_t(ib), db + step * std::uint64_t(ib), moe_wg_n, isum, ib > 0);
                        test::wgmma_m64nNk32_s8(smem, wgmma_desc_bits(mins_base + std::uint32_t((2 * buf + role.h) * 2048), wg_lbo, wg_sbo),
                                                wgmma_desc_bits(bb + pair_off, wg_lbo, wg_sbo), moe_wg_n, summs, false, true);
                        for (int th = 0; th < 128; ++th)
                            for (int x = 0; x < 16; ++x) {
                                const int wr = 64 * role.h + wg_acc_row(th / 32, th % 32 / 4, x);
                                const float xv = xd[moe_wg_n * role.ph + wg_acc_col(th % 4, x)];
                                const float dall = mul_rn(xv, dd[buf][wr][0]), dmin = mul_rn(xv, dd[buf][wr][1]);
                                float& sf = sumf[std::size_t((wgi * 128 + th) * 16 + x)];
                                sf = add_rn(sf, sub_rn(mul_rn(dall, float(isum[std::size_t(th * 16 + x)])),
                                                       mul_rn(dmin, float(summs[std::size_t(th * 16 + x)]))));
                            }
                    }
                }
                for (int wgi = 0; wgi < 4; ++wgi) {
                    const moe_wg_role role = moe_wg_role_of(wgi);
                    for (int th = 0; th < 128; ++th)
                        for (int x = 0; x < 16; ++x) {
                            const int o = o0 + 64 * role.h + wg_acc_row(th / 32, th % 32 / 4, x);
                            const int pr = moe_wg_n * role.ph + wg_acc_col(th % 4, x);
                            if (pr < count) ys[std::size_t(spair[std::size_t(pr)]) * n_embd + o] = sumf[std::size_t((wgi * 128 + th) * 16 + x)];
                        }
                }
            }
        }
    return test::slot_sum(ys, P.rows, n_embd);
}

// The same from the GGUF blocks: dot_iq2_xxs_q8_k of each expert row against the row's Q8_K.
std::vector<float> reference_mid(const problem& P) {
    const int n_embd = P.n_embd, n_ff = P.n_ff, nb = n_embd / 256;
    std::vector<float> mid(std::size_t(P.rows) * slots * n_ff, 0.0f);
    std::vector<q8_k_block> xq(static_cast<std::size_t>(nb));
    for (int r = 0; r < P.rows; ++r) {
        quantize_q8_k(P.x.data() + std::size_t(r) * n_embd, xq.data(), n_embd);
        for (int s = 0; s < slots; ++s) {
            const int pair = r * slots + s, e = P.sel[std::size_t(pair)];
            for (int f = 0; f < n_ff; ++f) {
                const std::size_t row = (std::size_t(e) * n_ff + f) * nb;
                const float g = dot_iq2_xxs_q8_k(P.gate.data() + row, xq.data(), nb);
                const float u = dot_iq2_xxs_q8_k(P.upw.data() + row, xq.data(), nb);
                mid[std::size_t(pair) * n_ff + f] =
                    mul_rn(mul_rn(silu(std::fmin(g, clamp_c)), std::fmax(std::fmin(u, clamp_c), -clamp_c)), P.w[std::size_t(pair)]);
            }
        }
    }
    return mid;
}

int differing(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    int n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
    return n;
}

}  // namespace

TEST_CASE("moe_gemm's wgmma gate/up, emulated on the CPU, equals the GGUF blocks' dots bitwise") {
    std::mt19937_64 g(20261205);
    // 7 rows over 12 experts: groups of 1..7 pairs (the second pair half idle); 50 rows over 6
    // experts: groups of ~50 (both pair halves live, the second partly); 80 rows over 6: groups
    // beyond 64 pairs span two work items. (Routes name 6 distinct experts a row: ne >= 6.)
    for (auto [ne, rows] : {std::pair{12, 7}, std::pair{6, 50}, std::pair{6, 80}}) {
        CAPTURE(ne);
        CAPTURE(rows);
        const problem P = test::make_problem(g, 512, 512, ne, rows);
        CHECK(differing(emulate_mid(P), reference_mid(P)) == 0);
    }
}

TEST_CASE("moe_gemm's wgmma gate/up and down, emulated on the CPU, equal reference/moe bitwise") {
    std::mt19937_64 g(20261206);
    for (auto [ne, rows] : {std::pair{12, 7}, std::pair{6, 50}}) {
        CAPTURE(ne);
        CAPTURE(rows);
        const problem P = test::make_problem(g, 512, 512, ne, rows);
        CHECK(test::differing_rows(test::reference_routed(P), emulate_routed(P), P.rows, P.n_embd) == 0);
    }
}

TEST_CASE("the wgmma emulation's operand layout and fragments, hand-worked") {
    // A: row m holds m + 1 in every byte; B: row n (a pair) holds 1 in bytes k < 16, 2 above. With
    // the kernel's offsets, D(m, n) = (m + 1) (16 + 32) = 48 (m + 1).
    std::vector<std::uint8_t> smem(2 * std::size_t(wg_operand_bytes));
    for (int r = 0; r < 64; ++r)
        for (int k = 0; k < 256; ++k) {
            smem[std::size_t(wg_offset(r, k / 16) + k % 16)] = std::uint8_t(r + 1);
            smem[std::size_t(wg_operand_bytes + wg_offset(r, k / 16) + k % 16)] = std::uint8_t(k % 32 < 16 ? 1 : 2);
        }
    std::vector<std::int32_t> d;
    test::wgmma_m64nNk32_s8(smem, wgmma_desc_bits(0, wg_lbo, wg_sbo),
                            wgmma_desc_bits(std::uint32_t(wg_operand_bytes), wg_lbo, wg_sbo), 32, d, false);
    // Warp 2, lane 13 (g 3, t 1), register 6: row 32 + 3 + 8 = 43, column 8 + 2 + 0.
    CHECK(d[std::size_t((2 * 32 + 13) * 16 + 6)] == 48 * 44);
    CHECK(wg_acc_row(2, 3, 6) == 43);
    CHECK(wg_acc_col(1, 6) == 10);
    // The k-step advance in the address field moves A to bytes 32..63 of every row: unchanged here,
    // but a wrong step (a byte count instead of >> 4) would leave the operand's 32 KiB.
    test::wgmma_m64nNk32_s8(smem, wgmma_desc_bits(0, wg_lbo, wg_sbo) + (wg_kstep_bytes >> 4),
                            wgmma_desc_bits(std::uint32_t(wg_operand_bytes), wg_lbo, wg_sbo) + (wg_kstep_bytes >> 4), 32,
                            d, false);
    CHECK(d[0] == 48);
    // Every copy of the staging lands once: 64 pairs x 16 pieces.
    std::vector<int> seen(64 * 16, 0);
    for (int c = 0; c < 1024; ++c) ++seen[std::size_t(wg_copy_row(c) * 16 + wg_copy_chunk(c))];
    CHECK(std::count(seen.begin(), seen.end(), 1) == 1024);
}
