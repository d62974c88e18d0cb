// A CPU emulation of kernels/moe.cuh's decode decomposition, bitwise against reference/moe:
//   router  a warp per (expert, 512-segment): 32 lane partials, the xor butterfly, segments in
//           order, p = sqrt(softplus); the route as a warp's six argmax rounds (lane-local best
//           over experts lane + 32k, then the butterfly with moe_route_before);
//   experts the items of the experts launch run in ticket order (moe_item_at) with its counters
//           (gu_counters, ready, seen, ticket), each lane's IQ2_XXS / Q2_K block dots from the
//           tiled layouts, block terms summed in block order, the slot sum with moe_slot_sum;
//   schedule a machine with few CTA slots that starts CTAs in ticket order and runs them in random
//           order never reaches a state where every resident CTA waits (no deadlock).
// It mirrors the kernels rather than running them; moe_test_gpu and ds4-validate --only moe run
// the kernels themselves against the same reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/math.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_block_dot.hpp"
#include "ds4/kernels/moe_schedule.hpp"
#include "reference/moe.hpp"
#include "tests/support/moe_gemm_problem.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;

constexpr int slots = moe_slots;
constexpr int lanes = 32;

std::uint32_t word_at(const std::uint8_t* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

bool same_bits(float a, float b) { return float_bits(a) == float_bits(b); }

// ---- router ----------------------------------------------------------------------------------

// moe_router_kernel's logit of expert e for one activation row: warp (e, s) has lane l sum its
// 16 elements in order; the butterfly 16..1 (every lane adds its partner's value at once); the
// CTA adds segments in order.
float router_logit(const std::uint16_t* w, const float* x, int n_embd) {
    const int segments = (n_embd + f16_segment - 1) / f16_segment;
    float acc = 0.0f;
    for (int s = 0; s < segments; ++s) {
        float v[lanes];
        for (int l = 0; l < lanes; ++l) {
            const int i0 = s * f16_segment + l * f16_lane_elems;
            v[l] = 0.0f;
            if (i0 < n_embd)
                for (int k = 0; k < f16_lane_elems; ++k) v[l] = add_rn(v[l], mul_rn(f16_to_f32(w[i0 + k]), x[i0 + k]));
        }
        for (int off = lanes / 2; off > 0; off /= 2) {
            float next[lanes];
            for (int l = 0; l < lanes; ++l) next[l] = add_rn(v[l], v[l ^ off]);
            std::copy(next, next + lanes, v);
        }
        acc = add_rn(acc, v[0]);
    }
    return acc;
}

// route_row's biased top-6: lane l holds experts l + 32k; each round a lane-local best, then the
// shuffle butterfly (each lane keeps the better of its value and its partner's, all at once).
void route_row(const float* p, const float* bias, int n_expert, int (&sel)[slots]) {
    constexpr int per_lane = moe_max_experts / lanes;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    float v[lanes][per_lane];
    for (int l = 0; l < lanes; ++l)
        for (int k = 0; k < per_lane; ++k) {
            const int e = l + lanes * k;
            v[l][k] = e >= n_expert ? neg_inf : (bias ? add_rn(p[e], bias[e]) : p[e]);
        }
    unsigned taken[lanes] = {};
    for (int s = 0; s < slots; ++s) {
        float bv[lanes];
        int be[lanes];
        for (int l = 0; l < lanes; ++l) {
            bv[l] = neg_inf;
            be[l] = 0x7fffffff;
            for (int k = 0; k < per_lane; ++k) {
                const int e = l + lanes * k;
                if (e < n_expert && !((taken[l] >> k) & 1u) && moe_route_before(v[l][k], e, bv[l], be[l])) {
                    bv[l] = v[l][k];
                    be[l] = e;
                }
            }
        }
        for (int off = lanes / 2; off > 0; off /= 2) {
            float nv[lanes];
            int ne[lanes];
            for (int l = 0; l < lanes; ++l) {
                nv[l] = bv[l];
                ne[l] = be[l];
                if (moe_route_before(bv[l ^ off], be[l ^ off], bv[l], be[l])) {
                    nv[l] = bv[l ^ off];
                    ne[l] = be[l ^ off];
                }
            }
            std::copy(nv, nv + lanes, bv);
            std::copy(ne, ne + lanes, be);
        }
        for (int l = 0; l < lanes; ++l) CHECK(be[l] == be[0]);  // the butterfly agrees on every lane
        sel[s] = be[0];
        taken[be[0] % lanes] |= 1u << (be[0] / lanes);
    }
}

struct router_case {
    int n_embd, n_expert;
    bool ties, bias;
};

void check_router(std::mt19937_64& g, const router_case& c) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<std::uint16_t> w(std::size_t(c.n_expert) * c.n_embd);
    for (auto& v : w) v = f32_to_f16(0.05f * n01(g));
    std::vector<float> bias;
    if (c.bias) {
        bias.resize(c.n_expert);
        for (auto& b : bias) b = c.ties ? 0.25f * float(g() % 3) : 0.1f * n01(g);
    }
    if (c.ties)  // 8 experts with one router row: equal logits, so the order falls to the ids
        for (int e : {3, 5, 6, 9, 17, 31, 33, 38})
            if (e < c.n_expert) {
                std::copy(w.begin(), w.begin() + c.n_embd, w.begin() + std::ptrdiff_t(e) * c.n_embd);
                if (c.bias) bias[e] = 0.5f;
            }
    for (int row = 0; row < 6; ++row) {
        std::vector<float> x(c.n_embd), p(c.n_expert), want(c.n_expert);
        const float scale = std::ldexp(1.0f, int(g() % 5) - 2);
        for (auto& v : x) v = scale * n01(g);
        for (int e = 0; e < c.n_expert; ++e)
            p[e] = std::sqrt(softplus(router_logit(w.data() + std::size_t(e) * c.n_embd, x.data(), c.n_embd)));
        ref::router_probs(w.data(), x.data(), c.n_embd, c.n_expert, want.data());
        int bad = 0;
        for (int e = 0; e < c.n_expert; ++e) bad += same_bits(p[e], want[e]) ? 0 : 1;
        CHECK(bad == 0);
        int sel[slots];
        route_row(p.data(), c.bias ? bias.data() : nullptr, c.n_expert, sel);
        const ref::moe_route r = ref::route_top_k(want.data(), c.bias ? bias.data() : nullptr, c.n_expert, slots, 1.5f);
        float ps[slots], ws[slots];
        for (int s = 0; s < slots; ++s) ps[s] = p[sel[s]];
        moe_route_weights(ps, 1.5f, ws);
        for (int s = 0; s < slots; ++s) {
            CHECK(sel[s] == r.expert[s]);
            CHECK(same_bits(ws[s], r.weight[s]));
        }
        // Hash layers: the slots as stored (one expert twice, as tid2eid allows), same weights.
        const std::int32_t hash_row[slots] = {c.n_expert - 1, 0, 7 % c.n_expert, 0, 2, c.n_expert / 2};
        const ref::moe_route h = ref::route_hash(want.data(), hash_row, slots, 1.5f);
        for (int s = 0; s < slots; ++s) ps[s] = p[hash_row[s]];
        moe_route_weights(ps, 1.5f, ws);
        for (int s = 0; s < slots; ++s) CHECK(same_bits(ws[s], h.weight[s]));
    }
}

// ---- experts ---------------------------------------------------------------------------------

struct scratch {
    std::vector<std::int8_t> xq;
    std::vector<float> xq_d, mid, midq_d, ys;
    std::vector<std::int8_t> midq;
    std::vector<std::int16_t> bsums;
    std::vector<unsigned> gu_counters, ready, seen;
    unsigned ticket = 0;
};

// collect_pairs: whether pair p leads its expert, and the pairs naming it in pair order.
bool collect_pairs(const std::vector<std::int32_t>& sel, int n_pairs, int p, std::vector<int>& match) {
    match.clear();
    for (int q = 0; q < p; ++q)
        if (sel[std::size_t(q)] == sel[std::size_t(p)]) return false;
    for (int q = p; q < n_pairs; ++q)
        if (sel[std::size_t(q)] == sel[std::size_t(p)]) match.push_back(q);
    return true;
}

// The gate/up item's shared selector tables as its fill loop writes them (uint4 entry*8 + (k +
// entry) % 8 for k < 8, four copies of the entry's word each), as bytes.
std::vector<std::uint8_t> gate_up_tables() {
    std::vector<std::uint8_t> t((256 + 128) * 32 * 4, 0xa5);
    std::vector<int> writes((256 + 128) * 8, 0);
    for (int entry = 0; entry < 256 + 128; ++entry) {
        const std::uint32_t v = entry < 256 ? iq2_xxs_grid_sel(entry) : iq2_xxs_sign_sel(entry - 256);
        for (int k = 0; k < 8; ++k) {
            const int i = entry * 8 + (k + entry) % 8;
            ++writes[std::size_t(i)];
            for (int c = 0; c < 4; ++c) std::memcpy(t.data() + std::size_t(i) * 16 + c * 4, &v, 4);
        }
    }
    CHECK(std::all_of(writes.begin(), writes.end(), [](int w) { return w == 1; }));
    return t;
}

// gate_up_item for (pair p, tile): per lane (row), warp (matrix, quarter) over its blocks, the
// selectors read from the tables at the kernel's byte offsets (index << 7 | lane * 4).
void gate_up_item(const test::problem& P, scratch& S, const std::vector<int>& match, int p, int tile) {
    static const std::vector<std::uint8_t> tables = gate_up_tables();
    const int nb = P.n_embd / 256, n_ff = P.n_ff;
    const int e = P.sel[std::size_t(p)];
    const int nm = int(match.size());
    for (int c0 = 0; c0 < nm; c0 += moe_pair_chunk) {
        const int nc = std::min(moe_pair_chunk, nm - c0);
        // terms[mat][b][j][lane]
        std::vector<float> terms(std::size_t(2) * nb * moe_pair_chunk * lanes);
        for (int warp = 0; warp < 8; ++warp) {
            const int mat = warp / 4, quarter = warp % 4, bpw = (nb + 3) / 4;
            const int b0 = quarter * bpw, b1 = std::min(b0 + bpw, nb);
            const std::uint8_t* wq = (mat ? P.uq.data() : P.gq.data()) + std::size_t(e) * P.GL.quant_bytes();
            const std::uint16_t* wd = (mat ? P.ud.data() : P.gd.data()) + std::size_t(e) * P.GL.scale_count();
            for (int b = b0; b < b1; ++b)
                for (int lane = 0; lane < lanes; ++lane) {
                    const int row = tile * tile_rows + lane;
                    // The kernel's row pointers: piece k of block b at (b*4 + k)*512 bytes, the
                    // scale at (b/8)*256 + b%8 halves past the row's first.
                    const std::uint8_t* wrow = wq + P.GL.quant_offset(row, 0, 0);
                    CHECK(wrow + (b * 4 + 3) * 512 == wq + P.GL.quant_offset(row, b, 3));
                    const std::uint16_t* drow = wd + P.GL.scale_index(row, 0);
                    const float d = f16_to_f32(drow[(b / 8) * 256 + b % 8]);
                    int bsum[moe_pair_chunk] = {};
                    for (int ib = 0; ib < 8; ++ib) {
                        const std::uint8_t* piece = wrow + (b * 4 + ib / 2) * 512;
                        const std::uint32_t a0 = word_at(piece + (ib % 2 ? 8 : 0)), a1 = word_at(piece + (ib % 2 ? 12 : 4));
                        std::uint32_t w[8];
                        for (int l = 0; l < 4; ++l) {
                            const std::uint32_t go = ((a0 >> (8 * l)) & 255u) << 7 | std::uint32_t(lane) * 4u;
                            const std::uint32_t so = ((a1 >> (7 * l)) & 127u) << 7 | std::uint32_t(lane) * 4u;
                            iq2_xxs_group_decode(word_at(tables.data() + go) | word_at(tables.data() + 256 * 128 + so),
                                                 w[2 * l], w[2 * l + 1]);
                        }
                        const int mul = int(2 * (a1 >> 28) + 1);
                        for (int j = 0; j < nc; ++j) {
                            const int r = match[std::size_t(c0 + j)] / slots;
                            std::uint32_t x[8];
                            std::memcpy(x, S.xq.data() + std::size_t(r) * P.n_embd + b * 256 + ib * 32, 32);
                            bsum[j] += iq2_xxs_sub_dot(w, x) * mul;
                        }
                    }
                    for (int j = 0; j < nc; ++j) {
                        const int r = match[std::size_t(c0 + j)] / slots;
                        const float dd = mul_rn(d, S.xq_d[std::size_t(r) * nb + b]);
                        terms[((std::size_t(mat) * nb + b) * moe_pair_chunk + j) * lanes + lane] = mul_rn(dd, float(bsum[j]));
                    }
                }
        }
        for (int j = 0; j < nc; ++j) {
            const int q = match[std::size_t(c0 + j)];
            for (int lane = 0; lane < lanes; ++lane) {
                float g = 0.0f, u = 0.0f;
                for (int b = 0; b < nb; ++b) {
                    g = add_rn(g, terms[((0 * std::size_t(nb) + b) * moe_pair_chunk + j) * lanes + lane]);
                    u = add_rn(u, terms[((1 * std::size_t(nb) + b) * moe_pair_chunk + j) * lanes + lane]);
                }
                g = std::fmin(mul_rn(0.125f, g), 10.0f);
                u = std::fmax(std::fmin(mul_rn(0.125f, u), 10.0f), -10.0f);
                S.mid[std::size_t(q) * n_ff + tile * tile_rows + lane] = mul_rn(mul_rn(silu(g), u), P.w[std::size_t(q)]);
            }
        }
    }
    // check_in over the 8 tiles of the 256-row block; the last quantizes and counts it ready.
    const int kb = tile / 8, nkb = n_ff / 256;
    unsigned& counter = S.gu_counters[std::size_t(p) * nkb + kb];
    if (++counter != 8u) return;
    counter = 0;
    for (int q : match) {
        q8_k_block blk;
        quantize_q8_k(S.mid.data() + std::size_t(q) * n_ff + kb * 256, &blk, 256);
        std::memcpy(S.midq.data() + std::size_t(q) * n_ff + kb * 256, blk.qs, 256);
        S.midq_d[std::size_t(q) * nkb + kb] = blk.d;
        std::memcpy(S.bsums.data() + std::size_t(q) * (n_ff / 16) + kb * 16, blk.bsums, 32);
    }
    ++S.ready[std::size_t(p)];
}

void down_item(const test::problem& P, scratch& S, const std::vector<int>& match, int p, int item, int per_item) {
    const int nb = P.n_ff / 256, tiles = P.n_embd / tile_rows;
    const int t0 = item * per_item, nt = std::min(per_item, tiles - t0);
    const int e = P.sel[std::size_t(p)];
    // The wait: in ticket order every gate/up item of p has already run.
    REQUIRE(S.ready[std::size_t(p)] == unsigned(nb));
    if (++S.seen[std::size_t(p)] == unsigned(moe_down_items(tiles, per_item))) {
        S.seen[std::size_t(p)] = 0;
        S.ready[std::size_t(p)] = 0;
    }
    const std::uint8_t* wq = P.dq.data() + std::size_t(e) * P.DL.quant_bytes();
    const std::uint32_t* wdd = P.ddd.data() + std::size_t(e) * P.DL.dd_count();
    const int nm = int(match.size());
    for (int c0 = 0; c0 < nm; c0 += moe_pair_chunk) {
        const int nc = std::min(moe_pair_chunk, nm - c0);
        // [nb][chunk][tile][lane], as the kernel's shared memory.
        std::vector<float> terms(std::size_t(nb) * moe_pair_chunk * moe_down_tiles_max * lanes);
        auto term = [&](int b, int j, int t, int lane) -> float& {
            return terms[((std::size_t(b) * moe_pair_chunk + j) * moe_down_tiles_max + t) * lanes + lane];
        };
        for (int b = 0; b < nb; ++b)
            for (int t = 0; t < nt; ++t)
                for (int lane = 0; lane < lanes; ++lane) {
                    const int row = (t0 + t) * tile_rows + lane;
                    std::uint32_t w[20];
                    for (int k = 0; k < 5; ++k) std::memcpy(w + 4 * k, wq + P.DL.quant_offset(row, b, k), 16);
                    const std::uint32_t dd = wdd[P.DL.dd_index(row, b)];
                    const float wd = f16_to_f32(std::uint16_t(dd & 0xffffu)), wm = f16_to_f32(std::uint16_t(dd >> 16));
                    for (int j = 0; j < nc; ++j) {
                        const int q = match[std::size_t(c0 + j)];
                        // The warp's staging buffer: 64 words of midq, then 8 words of bsums.
                        std::uint32_t xs[72];
                        std::memcpy(xs, S.midq.data() + std::size_t(q) * P.n_ff + b * 256, 256);
                        std::memcpy(xs + 64, S.bsums.data() + std::size_t(q) * (P.n_ff / 16) + b * 16, 32);
                        std::int16_t bs[16];
                        std::memcpy(bs, xs + 64, 32);
                        int isum, summs;
                        q2_k_block_isum(w, w + 4, xs, bs, isum, summs);
                        const float xd = S.midq_d[std::size_t(q) * nb + b];
                        const float dall = mul_rn(xd, wd), dmin = mul_rn(xd, wm);
                        term(b, j, t, lane) = sub_rn(mul_rn(dall, float(isum)), mul_rn(dmin, float(summs)));
                    }
                }
        for (int j = 0; j < nc; ++j) {
            const int q = match[std::size_t(c0 + j)];
            for (int t = 0; t < nt; ++t)
                for (int lane = 0; lane < lanes; ++lane) {
                    float y = 0.0f;
                    for (int b = 0; b < nb; ++b) y = add_rn(y, term(b, j, t, lane));
                    S.ys[std::size_t(q) * P.n_embd + (t0 + t) * tile_rows + lane] = y;
                }
        }
    }
}

// One experts launch of capacity `cap` with `live` live rows and `per_item` tiles per down item,
// items in ticket order, then the finish; compared with moe_routed + a shared output through the reference's two additions.
void check_experts(std::mt19937_64& g, int n_embd, int n_ff, int ne, int live, int cap, int per_item) {
    test::problem P = test::make_problem(g, n_embd, n_ff, ne, cap);
    const int pairs = cap * slots, gu_tiles = n_ff / tile_rows, dn_tiles = moe_down_items(n_embd / tile_rows, per_item);
    scratch S;
    const test::q8k_rows xq = test::quantize_rows(P.x, cap, n_embd);
    S.xq = xq.q;
    S.xq_d = xq.d;
    S.mid.assign(std::size_t(pairs) * n_ff, 0.0f);
    S.midq.assign(S.mid.size(), 0);
    S.midq_d.assign(std::size_t(pairs) * (n_ff / 256), 0.0f);
    S.bsums.assign(std::size_t(pairs) * (n_ff / 16), 0);
    S.ys.assign(std::size_t(pairs) * n_embd, std::numeric_limits<float>::quiet_NaN());
    S.gu_counters.assign(std::size_t(pairs) * (n_ff / 256), 0u);
    S.ready.assign(std::size_t(pairs), 0u);
    S.seen.assign(std::size_t(pairs), 0u);
    const unsigned total = unsigned(moe_item_count(pairs, gu_tiles, dn_tiles));
    std::vector<int> match;
    for (unsigned c = 0; c < total; ++c) {
        const unsigned t = S.ticket++;
        if (t == total - 1u) S.ticket = 0;
        const moe_item it = moe_item_at(int(t), pairs, gu_tiles, dn_tiles);
        if (it.pair >= live * slots || !collect_pairs(P.sel, live * slots, it.pair, match)) continue;
        if (it.down)
            down_item(P, S, match, it.pair, it.tile, per_item);
        else
            gate_up_item(P, S, match, it.pair, it.tile);
    }
    // Every counter is back at zero for the next launch (the graph contract).
    CHECK(S.ticket == 0u);
    CHECK(std::all_of(S.gu_counters.begin(), S.gu_counters.end(), [](unsigned v) { return v == 0u; }));
    CHECK(std::all_of(S.ready.begin(), S.ready.end(), [](unsigned v) { return v == 0u; }));
    CHECK(std::all_of(S.seen.begin(), S.seen.end(), [](unsigned v) { return v == 0u; }));

    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> moe(n_embd), shared(n_embd);
    int bad = 0;
    for (int r = 0; r < live; ++r) {
        ref::moe_route route;
        route.n_used = slots;
        for (int s = 0; s < slots; ++s) {
            route.expert[s] = P.sel[std::size_t(r) * slots + s];
            route.weight[s] = P.w[std::size_t(r) * slots + s];
        }
        ref::moe_routed(P.gate.data(), P.upw.data(), P.down.data(), route, P.x.data() + std::size_t(r) * n_embd, n_embd,
                        n_ff, 10.0f, moe.data());
        for (auto& v : shared) v = 0.01f * n01(g);
        for (int o = 0; o < n_embd; ++o) {
            float ys[slots];
            for (int s = 0; s < slots; ++s) ys[s] = S.ys[std::size_t(r * slots + s) * n_embd + o];
            bad += same_bits(moe_slot_sum(ys, shared[o]), moe[o] + shared[o]) ? 0 : 1;
        }
    }
    CHECK(bad == 0);
}

// ---- schedule --------------------------------------------------------------------------------

// `slots_n` CTAs resident at most; free slots start CTAs in ticket order; each step a random
// resident CTA that can move does (a gate/up item finishes; a down item finishes once its pair's
// blocks are ready). Every pair leads its own expert here: the most down items wait.
void check_no_deadlock(std::mt19937_64& g, int pairs, int gu_tiles, int dn_tiles, int slots_n) {
    const int nkb = gu_tiles / 8;
    const int total = moe_item_count(pairs, gu_tiles, dn_tiles);
    std::vector<int> counters(std::size_t(pairs) * nkb, 0), ready(std::size_t(pairs), 0);
    std::vector<int> resident;
    int next = 0, done = 0;
    while (done < total) {
        while (int(resident.size()) < slots_n && next < total) resident.push_back(next++);
        std::vector<int> movable;
        for (std::size_t i = 0; i < resident.size(); ++i) {
            const moe_item it = moe_item_at(resident[i], pairs, gu_tiles, dn_tiles);
            if (!it.down || ready[std::size_t(it.pair)] == nkb) movable.push_back(int(i));
        }
        REQUIRE(!movable.empty());
        const int i = movable[g() % movable.size()];
        const moe_item it = moe_item_at(resident[std::size_t(i)], pairs, gu_tiles, dn_tiles);
        if (!it.down && ++counters[std::size_t(it.pair) * nkb + it.tile / 8] == 8) ++ready[std::size_t(it.pair)];
        resident.erase(resident.begin() + i);
        ++done;
    }
    CHECK(next == total);
}

}  // namespace

TEST_CASE("iq2_xxs group decode: every grid x sign selector has nibble bit 3 clear and yields the signed grid") {
    // The decode is the bare PRMT, which reads bit 3 of a nibble as sign replication; the
    // weights are checked against GGML's grid and sign tables directly.
    int wrong = 0;
    for (int i = 0; i < 256; ++i)
        for (int k = 0; k < 128; ++k) {
            const std::uint32_t sel = ds4::kernels::iq2_xxs_grid_sel(i) | ds4::kernels::iq2_xxs_sign_sel(k);
            REQUIRE((sel & 0x88888888u) == 0u);
            std::uint32_t w[2];
            ds4::kernels::iq2_xxs_group_decode(sel, w[0], w[1]);
            const std::uint64_t grid = ds4::iq2xxs_grid_at(i);
            const std::uint8_t signs = ds4::iq2xxs_ksigns_at(k);
            for (int j = 0; j < 8; ++j) {
                const int mag = int((grid >> (8 * j)) & 255u);
                const int want = (signs >> j) & 1 ? -mag : mag;
                wrong += int(std::int8_t((w[j / 4] >> (8 * (j % 4))) & 255u)) != want;
            }
        }
    CHECK(wrong == 0);
}

TEST_CASE("moe decode router and route, emulated, equal reference/moe bitwise") {
    std::mt19937_64 g(0x726f757465ull ^ std::random_device{}());
    for (const router_case& c : {router_case{256, 16, false, true}, router_case{512, 40, false, false},
                                 router_case{1024, 96, true, true}, router_case{4096, 256, false, true},
                                 router_case{768, 40, true, false}, router_case{4096, 256, true, true}})
        check_router(g, c);
}

TEST_CASE("moe decode experts launch, emulated in ticket order, equals moe_routed bitwise") {
    std::mt19937_64 g(0x6578706572747300ull ^ std::random_device{}());
    for (int per_item = 1; per_item <= moe_down_tiles_max; ++per_item) {
        check_experts(g, 256, 256, 8, 1, 1, per_item);
        check_experts(g, 512, 768, 12, 3, 4, per_item);   // odd FF blocks, idle rows past the live count
        check_experts(g, 768, 512, 7, 16, 16, per_item);  // few experts: many pairs per lead, chunks of 4
        check_experts(g, 4096, 2048, 8, 1, 1, per_item);  // the real shape at one row
    }
}

TEST_CASE("moe decode experts launch: ticket order never deadlocks, whatever the residency") {
    std::mt19937_64 g(0x7469636b6574ull);
    for (int slots_n : {1, 2, 3, 17, 400})
        for (const auto& [pairs, gu, dn] : {std::tuple{6, 64, 128}, std::tuple{12, 24, 16}, std::tuple{96, 8, 8}})
            check_no_deadlock(g, pairs, gu, dn, slots_n);
    // Down items come after every gate/up item, pair-major, tiles in order.
    const moe_item first_down = moe_item_at(6 * 64, 6, 64, 128);
    CHECK(first_down.down);
    CHECK(first_down.pair == 0);
    CHECK(first_down.tile == 0);
    const moe_item last_gu = moe_item_at(6 * 64 - 1, 6, 64, 128);
    CHECK(!last_gu.down);
    CHECK(last_gu.pair == 5);
    CHECK(last_gu.tile == 63);
}

TEST_CASE("iq2_xxs split decode: for every scale, grid and sign, 64 * hi + lo is (2s + 1) * sign * grid") {
    // The grouped MoE's tensor-core gate/up multiplies the two digits and never the scale; the
    // expected products come from GGML's grid and sign tables and the stored scale nibble.
    int wrong = 0, out_of_range = 0;
    for (int s = 0; s < 16; ++s) {
        const ds4::kernels::iq2_xxs_split_words sw = ds4::kernels::iq2_xxs_split_words_of(s);
        for (int i = 0; i < 256; ++i)
            for (int k = 0; k < 128; ++k) {
                const std::uint32_t sel = ds4::kernels::iq2_xxs_grid_sel(i) | ds4::kernels::iq2_xxs_sign_sel(k);
                std::uint32_t hi[2], lo[2];
                ds4::kernels::iq2_xxs_group_decode_split(sw, sel, hi[0], hi[1], lo[0], lo[1]);
                const std::uint64_t grid = ds4::iq2xxs_grid_at(i);
                const std::uint8_t signs = ds4::iq2xxs_ksigns_at(k);
                for (int j = 0; j < 8; ++j) {
                    const int mag = int((grid >> (8 * j)) & 255u);
                    const int want = (2 * s + 1) * ((signs >> j) & 1 ? -mag : mag);
                    const int h = int(std::int8_t((hi[j / 4] >> (8 * (j % 4))) & 255u));
                    const int l = int(std::int8_t((lo[j / 4] >> (8 * (j % 4))) & 255u));
                    wrong += 64 * h + l != want;
                    out_of_range += l < 0 || l > 63 || h < -21 || h > 20;
                }
            }
    }
    CHECK(wrong == 0);
    CHECK(out_of_range == 0);
    // Hand-worked: s = 15 (ls 31), 43 * 31 = 1333 = 64 * 20 + 53; -1333 = 64 * -21 + 11.
    const ds4::kernels::iq2_xxs_split_words top = ds4::kernels::iq2_xxs_split_words_of(15);
    CHECK(((top.pos_hi >> 16) & 255u) == 20u);
    CHECK(((top.pos_lo >> 16) & 255u) == 53u);
    CHECK(int(std::int8_t((top.neg_hi >> 16) & 255u)) == -21);
    CHECK(((top.neg_lo >> 16) & 255u) == 11u);
}
