// A CPU emulation of kernels/hyper_connection.cuh's one-launch hc pre on its own decomposition
// (kernels/hyper_connection_grid.hpp): every block of every row group as the kernel splits them,
// each computing its group's scales (the thread groups' add_thread_chunk streams and the block
// combine's xor steps) and the dot partials of its segments (lane l's 16 products in order, the
// warp's xor butterfly), the blocks arriving in a shuffled order on the arrival counters at the
// scratch's start, and the group finished by whichever block arrives last (ordered segment sums,
// gates, Sinkhorn, the weighted stream sum, then the folded RMSNorm of x_in: each of the 256
// lanes' chunks in order on the thread that made them, combined on one warp: lane t + 32m on
// thread t, its register butterfly, then the xor shuffles). Bitwise against
// reference/hyper_connection (hc_pre and the output head's mix) and ref::rms_norm of its x_in,
// with every partial written exactly once and the counters back at zero. Shapes: flash (4 x 4096) at 1, 2 of 3, 16 and 37 of 40 rows (one- and four-row groups),
// 97 of 100 rows of a small shape (eight-row groups), a flat length that is not a multiple of 4
// (one partial segment), more than 32 segments, n_hc 3 and 8.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/hyper_connection.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/hyper_connection_grid.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/norm_rope.hpp"

namespace {

using namespace ds4;
using kernels::hc_pre_geometry;

constexpr int threads = 256;  // kernels::hc_threads
constexpr float eps = 1e-6f;
constexpr int iters = 20;

struct hc_problem {
    int n_embd, n_hc, capacity, n_live;
    bool output;
    std::vector<float> X, scale, base, norm_w;
    std::vector<std::uint16_t> fn;
    int n_mix() const { return output ? n_hc : 2 * n_hc + n_hc * n_hc; }
    int n_flat() const { return n_hc * n_embd; }
    int segments() const { return (n_flat() + f16_segment - 1) / f16_segment; }
};

hc_problem make_problem(int n_embd, int n_hc, int capacity, int n_live, bool output, std::uint64_t seed) {
    hc_problem p{n_embd, n_hc, capacity, n_live, output, {}, {}, {}, {}, {}};
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    p.X.resize(std::size_t(capacity) * p.n_flat());
    for (float& v : p.X) v = nd(g) * 2.0f;
    p.fn.resize(std::size_t(p.n_mix()) * p.n_flat());
    for (auto& h : p.fn) h = f32_to_f16(nd(g) * 0.03f);
    p.scale = {0.6f + 0.1f * nd(g), 0.8f + 0.1f * nd(g), 1.2f + 0.1f * nd(g)};
    p.base.resize(p.n_mix());
    for (float& v : p.base) v = 0.5f * nd(g);
    p.norm_w.resize(n_embd);
    for (float& v : p.norm_w) v = 1.0f + 0.2f * nd(g);
    return p;
}

// The sum of squares as G threads stream it: thread t's chunks t + G*m in batches through
// add_thread_chunk, its own lanes by lane_butterfly, then group_lane_combine's xor steps G/2 .. 1
// across threads. hc_row_scales<RB> runs it with G = 256/RB (batches of 16 for one row, 8 for
// more); the folded norm's combine is G = 32 (its lane sums do not depend on the batching).
double emulate_sum_squares(const float* x, int n, int G, int batch) {
    const int lpt = reduce_lanes / G;
    std::vector<double> acc(G);
    for (int t = 0; t < G; ++t) {
        double v[reduce_lanes] = {};
        for (int m0 = 0; (t + G * m0) * reduce_chunk < n; m0 += batch)
            for (int i = 0; i < batch; ++i) {
                const int m = m0 + i, c = t + G * m;
                if (c * reduce_chunk >= n) continue;
                v[m % lpt] = chunk_partial(v[m % lpt], n - c * reduce_chunk,
                                           [&](int e) { return square_f64(x[c * reduce_chunk + e]); });
            }
        acc[t] = lane_butterfly(v, lpt);
    }
    for (int off = G / 2; off > 0; off /= 2) {
        std::vector<double> next(G);
        for (int t = 0; t < G; ++t) next[t] = add_f64(acc[t], acc[t ^ off]);
        acc = next;
    }
    return acc[0];
}

float emulate_scale(const float* x, int nf, int rb) {
    return rms_scale_from_sum(emulate_sum_squares(x, nf, threads / rb, rb == 1 ? 16 : 8), nf, eps);
}

// One warp's item (segment s, output o) for one row: lane l's 16 products in order, then the
// shuffle butterfly 16 .. 1.
float emulate_item(const hc_problem& p, const float* x, float sc, int s, int o) {
    const int nf = p.n_flat();
    float q[f16_lanes];
    for (int l = 0; l < f16_lanes; ++l) {
        const int e0 = s * f16_segment + l * f16_lane_elems, cnt = std::clamp(nf - e0, 0, f16_lane_elems);
        q[l] = 0.0f;
        for (int e = 0; e < cnt; ++e)
            q[l] = add_rn(q[l], mul_rn(f16_to_f32(p.fn[std::size_t(o) * nf + e0 + e]), mul_rn(x[e0 + e], sc)));
    }
    for (int off = f16_lanes / 2; off > 0; off /= 2) {
        float next[f16_lanes];
        for (int l = 0; l < f16_lanes; ++l) next[l] = add_rn(q[l], q[l ^ off]);
        std::memcpy(q, next, sizeof q);
    }
    return q[0];
}

// The folded norm: the lane sums combined on one warp, then (x*scale)*w.
void emulate_norm(const float* x, const float* w, int n, float* out) {
    const float scale = rms_scale_from_sum(emulate_sum_squares(x, n, 32, 16), n, eps);
    for (int i = 0; i < n; ++i) out[i] = mul_rn(mul_rn(x[i], scale), w[i]);
}

struct emulation_result {
    std::vector<float> x_in, split, xn;
    std::vector<int> writes;  // per partial slot
    std::vector<unsigned> counters;
};

// The launch: blocks of live groups in a shuffled order; the last of a group finishes it.
emulation_result emulate_hc_pre(const hc_problem& p, std::mt19937_64& g) {
    const int nf = p.n_flat(), n_mix = p.n_mix(), n_seg = p.segments();
    const auto grid = hc_pre_geometry(p.capacity, n_seg);
    std::vector<float> scratch(kernels::hc_scratch_floats(p.capacity, n_mix, n_seg), std::nanf(""));
    std::fill(scratch.begin(), scratch.begin() + kernels::hc_max_groups, 0.0f);  // the caller zeroes it
    emulation_result res;
    res.x_in.assign(std::size_t(p.capacity) * p.n_embd, std::nanf(""));
    res.xn.assign(std::size_t(p.capacity) * p.n_embd, std::nanf(""));
    res.split.assign(std::size_t(p.capacity) * n_mix, std::nanf(""));
    res.writes.assign(scratch.size(), 0);
    std::vector<std::pair<int, int>> blocks;
    for (int gr = 0; gr < grid.groups; ++gr)
        for (int b = 0; b < grid.blocks_per_group; ++b) blocks.emplace_back(b, gr);
    std::shuffle(blocks.begin(), blocks.end(), g);
    auto counter = [&](int gr) -> unsigned {
        unsigned u;
        std::memcpy(&u, &scratch[gr], sizeof u);
        return u;
    };
    auto set_counter = [&](int gr, unsigned u) { std::memcpy(&scratch[gr], &u, sizeof u); };
    for (const auto& [b, gr] : blocks) {
        const int r0 = gr * grid.rows_per_block;
        if (r0 >= p.n_live) continue;  // the whole group returns, no count
        const int rows = std::min(grid.rows_per_block, p.n_live - r0);
        std::vector<float> sc(rows);
        for (int rr = 0; rr < rows; ++rr) sc[rr] = emulate_scale(p.X.data() + std::size_t(r0 + rr) * nf, nf, grid.rows_per_block);
        const auto run = kernels::hc_block_segments(b, grid.blocks_per_group, n_seg);
        for (int s = run.begin; s < run.end; ++s)
            for (int o = 0; o < n_mix; ++o)
                for (int rr = 0; rr < rows; ++rr) {
                    const std::int64_t i = kernels::hc_partial_index(r0 + rr, o, s, n_mix, n_seg);
                    scratch[i] = emulate_item(p, p.X.data() + std::size_t(r0 + rr) * nf, sc[rr], s, o);
                    ++res.writes[i];
                }
        const unsigned before = counter(gr);
        set_counter(gr, before + 1);
        if (before != unsigned(grid.blocks_per_group) - 1u) continue;
        set_counter(gr, 0);
        // The finish: ordered segment sums per (row, output), the gates, the Sinkhorn, x_in.
        for (int rr = 0; rr < rows; ++rr) {
            float mix[2 * hc_split::max_hc + hc_split::max_hc * hc_split::max_hc] = {};
            float w[hc_split::max_hc];
            for (int o = 0; o < n_mix; ++o) {
                float acc = 0.0f;
                for (int s = 0; s < n_seg; ++s) acc = add_rn(acc, scratch[kernels::hc_partial_index(r0 + rr, o, s, n_mix, n_seg)]);
                mix[o] = acc;
                if (o < p.n_hc)
                    w[o] = p.output ? hc_output_weight(acc, p.scale[0], p.base[o], eps) : hc_pre_gate(acc, p.scale[0], p.base[o], eps);
            }
            if (!p.output) {
                const hc_split sp = hc_split_sinkhorn(mix, p.scale.data(), p.base.data(), p.n_hc, iters, eps);
                float* out = res.split.data() + std::size_t(r0 + rr) * n_mix;
                for (int h = 0; h < p.n_hc; ++h) out[h] = sp.pre[h], out[p.n_hc + h] = sp.post[h];
                for (int k = 0; k < p.n_hc * p.n_hc; ++k) out[2 * p.n_hc + k] = sp.comb[k];
            }
            const float* x = p.X.data() + std::size_t(r0 + rr) * nf;
            for (int d = 0; d < p.n_embd; ++d) {
                float xv[hc_split::max_hc];
                for (int h = 0; h < p.n_hc; ++h) xv[h] = x[std::size_t(h) * p.n_embd + d];
                res.x_in[std::size_t(r0 + rr) * p.n_embd + d] = hc_weighted_sum(xv, 1, w, p.n_hc);
            }
            emulate_norm(res.x_in.data() + std::size_t(r0 + rr) * p.n_embd, p.norm_w.data(), p.n_embd,
                         res.xn.data() + std::size_t(r0 + rr) * p.n_embd);
        }
    }
    for (int gr = 0; gr < kernels::hc_max_groups; ++gr) res.counters.push_back(counter(gr));
    return res;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void check_problem(const hc_problem& p, std::uint64_t seed) {
    CAPTURE(p.n_embd);
    CAPTURE(p.n_hc);
    CAPTURE(p.capacity);
    CAPTURE(p.n_live);
    CAPTURE(p.output);
    std::mt19937_64 g(seed);
    const emulation_result e = emulate_hc_pre(p, g);
    const int nf = p.n_flat(), n_mix = p.n_mix(), n_seg = p.segments();
    int x_bad = 0, s_bad = 0, w_bad = 0, n_bad = 0;
    for (int r = 0; r < p.capacity; ++r) {
        const bool live = r < p.n_live;
        std::vector<float> want(p.n_embd);
        float want_split[2 * hc_split::max_hc + hc_split::max_hc * hc_split::max_hc] = {};
        if (live && p.output) {
            ref::output_hc_mix(p.X.data() + std::size_t(r) * nf, p.fn.data(), p.scale.data(), p.base.data(), p.n_embd, p.n_hc,
                               eps, eps, want.data());
        } else if (live) {
            const ref::hc_split s = ref::hc_pre(p.X.data() + std::size_t(r) * nf, p.fn.data(), p.scale.data(), p.base.data(),
                                                p.n_embd, p.n_hc, iters, eps, eps, want.data());
            for (int h = 0; h < p.n_hc; ++h) want_split[h] = s.pre[h], want_split[p.n_hc + h] = s.post[h];
            for (int k = 0; k < p.n_hc * p.n_hc; ++k) want_split[2 * p.n_hc + k] = s.comb[k];
        }
        std::vector<float> want_n(p.n_embd);
        if (live) ref::rms_norm(want.data(), p.norm_w.data(), p.n_embd, eps, want_n.data());
        for (int d = 0; d < p.n_embd; ++d) {
            const float got = e.x_in[std::size_t(r) * p.n_embd + d], got_n = e.xn[std::size_t(r) * p.n_embd + d];
            x_bad += live ? !same_bits(got, want[d]) : !std::isnan(got);
            n_bad += live ? !same_bits(got_n, want_n[d]) : !std::isnan(got_n);
        }
        for (int o = 0; o < n_mix; ++o) {
            const float got = e.split[std::size_t(r) * n_mix + o];
            s_bad += live && !p.output ? !same_bits(got, want_split[o]) : !std::isnan(got);
            for (int s = 0; s < n_seg; ++s) w_bad += e.writes[kernels::hc_partial_index(r, o, s, n_mix, n_seg)] != (live ? 1 : 0);
        }
    }
    CHECK(x_bad == 0);
    CHECK(n_bad == 0);
    CHECK(s_bad == 0);
    CHECK(w_bad == 0);
    CHECK(std::all_of(e.counters.begin(), e.counters.end(), [](unsigned u) { return u == 0; }));
}

}  // namespace

TEST_CASE("hc pre geometry: every segment in one non-empty block, groups cover the rows") {
    for (int cap : {1, 2, 3, 7, 16, 17, 40, 64, 65, 100, 256, 1024, 4097, 65535})
        for (int seg : {1, 2, 5, 31, 32, 33, 40, 64, 1000}) {
            CAPTURE(cap);
            CAPTURE(seg);
            const auto g = hc_pre_geometry(cap, seg);
            CHECK(threads % g.rows_per_block == 0);
            CHECK(g.rows_per_block <= kernels::hc_max_group_rows);
            CHECK(g.groups * g.rows_per_block >= cap);
            CHECK((g.groups - 1) * g.rows_per_block < cap);
            CHECK(g.groups <= kernels::hc_max_groups);
            REQUIRE(g.blocks_per_group >= 1);
            CHECK(g.blocks_per_group <= seg);
            int next = 0;
            for (int b = 0; b < g.blocks_per_group; ++b) {
                const auto r = kernels::hc_block_segments(b, g.blocks_per_group, seg);
                CHECK(r.begin == next);
                CHECK(r.end > r.begin);
                next = r.end;
            }
            CHECK(next == seg);
        }
}

TEST_CASE("hc pre: the kernel's decomposition equals the reference bitwise") {
    const std::uint64_t seed = std::random_device{}();
    CAPTURE(seed);
    struct shape {
        int n_embd, n_hc, capacity, n_live;
    };
    const shape shapes[] = {
        {4096, 4, 1, 1}, {4096, 4, 3, 2}, {4096, 4, 16, 16}, {4096, 4, 40, 37},  // flash: decode and four-row groups
        {128, 4, 100, 97},                                                         // eight-row groups
        {97, 3, 5, 5},                                                             // flat 291: one partial segment
        {5000, 4, 2, 2},                                                           // 40 segments
        {1000, 8, 4, 3},                                                           // n_hc 8, flat 8000
    };
    std::uint64_t k = 0;
    for (const shape& s : shapes)
        for (bool output : {false, true}) {
            const hc_problem p = make_problem(s.n_embd, s.n_hc, s.capacity, s.n_live, output, seed + k);
            check_problem(p, seed + 1000 + k++);
        }
}
