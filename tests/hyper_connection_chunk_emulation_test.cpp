// A CPU emulation of kernels/hyper_connection_chunk.cuh's mix dots on its own layout
// (kernels/hyper_connection_chunk_layout.hpp): each segment's stage filled through the copy map
// (copy c of x -> hc_chunk_x_index, of w -> hc_chunk_w_index), the rows' values scaled in place,
// every warp's lanes reading their 16-byte words as the kernel indexes them, the 32 butterflies
// of a warp by recursive halving (warp_halving.cuh's keep/send rule, lane by lane), the pair each
// lane then holds (hc_chunk_pair_of) stored at its partial index exactly once, and the segment
// sums added in order. Bitwise against the reference's mix: reference rms_norm_noweight of the
// flat state, then format/row_dot.hpp's F16 row dot per output. The scales, gates, Sinkhorn, x_in
// and the norm are hc_pre_kernel's own code (tests/hyper_connection_emulation_test.cpp and
// ds4-validate's hc rows); ds4-validate's hc_pre_chunk rows check the whole launch on a GPU.
// Shapes: flash (4 x 4096: 32 segments) with a full and a partial row group, a flat length
// that ends inside a segment (empty slots), n_hc 1..4 (warps with fewer outputs than 3 or none).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/reduce.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/row_dot.hpp"
#include "ds4/kernels/hyper_connection_chunk_layout.hpp"
#include "ds4/kernels/hyper_connection_grid.hpp"
#include "reference/norm_rope.hpp"

namespace {

using namespace ds4;
using namespace ds4::kernels;

constexpr float eps = 1e-6f;

struct chunk_problem {
    int n_embd, n_hc, rows;
    std::vector<float> X;
    std::vector<std::uint16_t> fn;
    int n_mix() const { return 2 * n_hc + n_hc * n_hc; }
    int n_flat() const { return n_hc * n_embd; }
    int segments() const { return (n_flat() + f16_segment - 1) / f16_segment; }
};

chunk_problem make_problem(int n_embd, int n_hc, int rows, std::uint64_t seed) {
    chunk_problem p{n_embd, n_hc, rows, {}, {}};
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    p.X.resize(std::size_t(rows) * p.n_flat());
    for (float& v : p.X) v = nd(g) * 2.0f;
    p.fn.resize(std::size_t(p.n_mix()) * p.n_flat());
    for (auto& h : p.fn) h = f32_to_f16(nd(g) * 0.03f);
    return p;
}

// One block's group (rows r0 .. r0 + rows - 1): the mix of every row, as the kernel forms it.
std::vector<float> emulate_group(const chunk_problem& p, int r0, int rows, std::vector<float>& partials,
                                 std::vector<int>& writes) {
    const int nf = p.n_flat(), n_mix = p.n_mix(), n_seg = p.segments();
    const int P = hc_chunk_outputs_per_warp(n_mix);
    std::vector<float> scale(hc_chunk_rows, std::nanf(""));
    for (int r = 0; r < rows; ++r) scale[r] = rms_scale(p.X.data() + std::size_t(r0 + r) * nf, nf, eps);
    for (int s = 0; s < n_seg; ++s) {
        const int e_seg = s * f16_segment;
        // The stage, poisoned, then every copy once (zero-filled past the rows or the state).
        std::vector<float> xs(hc_chunk_x_bytes() / 4, std::nanf(""));
        std::vector<std::uint16_t> ws(hc_chunk_w_bytes(n_mix) / 2, 0x7e00);  // F16 NaN
        for (int c = 0; c < hc_chunk_x_copies(); ++c) {
            const int r = c / (f16_segment / 4), i = 4 * (c % (f16_segment / 4));
            const bool ok = r < rows && e_seg + i < nf;
            for (int e = 0; e < 4; ++e)
                xs[hc_chunk_x_index(r, i) + e] = ok ? p.X[std::size_t(r0 + r) * nf + e_seg + i + e] : 0.0f;
        }
        for (int c = 0; c < hc_chunk_w_copies(n_mix); ++c) {
            const int o = c / (f16_segment / 8), i = 8 * (c % (f16_segment / 8));
            const bool ok = e_seg + i < nf;
            for (int e = 0; e < 8; ++e) ws[hc_chunk_w_index(o, i) + e] = ok ? p.fn[std::size_t(o) * nf + e_seg + i + e] : 0;
        }
        // flat = x*scale in place, words of live rows only.
        for (int wd = 0; wd < hc_chunk_x_copies(); ++wd) {
            const int r = wd / (f16_segment / 4);
            if (r >= rows) continue;
            for (int e = 0; e < 4; ++e) xs[wd * 4 + e] = mul_rn(xs[wd * 4 + e], scale[r]);
        }
        for (int warp = 0; warp < hc_chunk_warps; ++warp) {
            // v[lane][j]: lane's chain of pair j (output warp*P + j / 8, row j % 8).
            std::vector<std::vector<float>> v(32, std::vector<float>(hc_chunk_pairs, 0.0f));
            for (int lane = 0; lane < 32; ++lane)
                for (int k = 0; k < P; ++k) {
                    const int o = warp * P + k;
                    float wf[16] = {};
                    if (o < n_mix)
                        for (int q2 = 0; q2 < 2; ++q2)
                            for (int e = 0; e < 8; ++e) wf[8 * q2 + e] = f16_to_f32(ws[((o * 2 + q2) * 32 + lane) * 8 + e]);
                    for (int r = 0; r < hc_chunk_rows; ++r) {
                        float c = 0.0f;
                        for (int q = 0; q < 4; ++q)
                            for (int e = 0; e < 4; ++e)
                                c = add_rn(c, mul_rn(wf[4 * q + e], xs[((r * 4 + q) * 32 + lane) * 4 + e]));
                        v[lane][k * hc_chunk_rows + r] = c;
                    }
                }
            // Recursive halving: at offset off a lane keeps the half its bit selects and adds the
            // partner's value of the same pair.
            for (int half = 16; half >= 1; half /= 2) {
                const int off = half;
                std::vector<std::vector<float>> next = v;
                for (int lane = 0; lane < 32; ++lane) {
                    const bool upper = (lane & off) != 0;
                    const int partner = lane ^ off;
                    const bool p_upper = !upper;
                    for (int j = 0; j < half; ++j) {
                        const float keep = upper ? v[lane][half + j] : v[lane][j];
                        const float got = p_upper ? v[partner][j] : v[partner][half + j];  // what the partner sends
                        next[lane][j] = add_rn(keep, got);
                    }
                }
                v = next;
            }
            for (int lane = 0; lane < 32; ++lane) {
                const hc_chunk_pair pr = hc_chunk_pair_of(warp, lane, n_mix);
                if (lane < P * hc_chunk_rows && pr.output < n_mix && pr.row < rows) {
                    const auto at = hc_partial_index(r0 + pr.row, pr.output, s, n_mix, n_seg);
                    partials[std::size_t(at)] = v[lane][0];
                    ++writes[std::size_t(at)];
                }
            }
        }
    }
    std::vector<float> mix(std::size_t(rows) * n_mix);
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < n_mix; ++o) {
            float acc = 0.0f;
            for (int s = 0; s < n_seg; ++s) acc = add_rn(acc, partials[std::size_t(hc_partial_index(r0 + r, o, s, n_mix, n_seg))]);
            mix[std::size_t(r) * n_mix + o] = acc;
        }
    return mix;
}

void check_shape(int n_embd, int n_hc, int rows, std::uint64_t seed) {
    CAPTURE(n_embd);
    CAPTURE(n_hc);
    CAPTURE(rows);
    REQUIRE(hc_chunk_fits(n_embd, n_hc));
    const chunk_problem p = make_problem(n_embd, n_hc, rows, seed);
    const int nf = p.n_flat(), n_mix = p.n_mix(), n_seg = p.segments();
    std::vector<float> partials(hc_scratch_floats(rows, n_mix, n_seg), std::nanf(""));
    std::vector<int> writes(partials.size(), 0);
    std::vector<float> flat(nf);
    int mismatches = 0;
    for (int r0 = 0; r0 < rows; r0 += hc_chunk_rows) {
        const int group = std::min(hc_chunk_rows, rows - r0);
        const std::vector<float> mix = emulate_group(p, r0, group, partials, writes);
        for (int r = 0; r < group; ++r) {
            ref::rms_norm_noweight(p.X.data() + std::size_t(r0 + r) * nf, nf, eps, flat.data());
            for (int o = 0; o < n_mix; ++o) {
                const float want = f16_row_dot(p.fn.data() + std::size_t(o) * nf, flat.data(), nf);
                const float got = mix[std::size_t(r) * n_mix + o];
                if (std::memcmp(&want, &got, sizeof want) != 0) ++mismatches;
            }
        }
    }
    CHECK(mismatches == 0);
    // Every partial of every live row written exactly once, nothing else.
    int bad = 0;
    for (std::size_t i = 0; i < writes.size(); ++i) {
        const bool live = i >= std::size_t(hc_max_groups) && i - hc_max_groups < std::size_t(rows) * n_mix * n_seg;
        if (writes[i] != (live ? 1 : 0)) ++bad;
    }
    CHECK(bad == 0);
}

}  // namespace

TEST_CASE("hc pre chunk: the mix on the kernel's layout equals the reference's, bitwise") {
    check_shape(4096, 4, 8, 1);     // flash, one full group
    check_shape(4096, 4, 13, 2);    // flash, a full and a partial group
    check_shape(72, 4, 11, 3);      // 288-long state: slots 18..31 of the one segment empty
    check_shape(200, 4, 9, 4);      // 800: a second, partial segment
    check_shape(96, 3, 10, 5);      // n_mix 15: two outputs a warp, warp 7's second none
    check_shape(64, 2, 8, 6);       // n_mix 8: one output a warp
    check_shape(48, 1, 5, 7);       // n_mix 3: warps 3..7 idle
}

TEST_CASE("hc pre chunk: layout maps are one-to-one") {
    for (int n_mix : {3, 8, 15, 24}) {
        std::vector<int> seen_x(hc_chunk_x_bytes() / 4, 0), seen_w(hc_chunk_w_bytes(n_mix) / 2, 0);
        for (int r = 0; r < hc_chunk_rows; ++r)
            for (int i = 0; i < f16_segment; ++i) ++seen_x[std::size_t(hc_chunk_x_index(r, i))];
        for (int o = 0; o < n_mix; ++o)
            for (int i = 0; i < f16_segment; ++i) ++seen_w[std::size_t(hc_chunk_w_index(o, i))];
        CHECK(std::count(seen_x.begin(), seen_x.end(), 1) == std::ptrdiff_t(seen_x.size()));
        CHECK(std::count(seen_w.begin(), seen_w.end(), 1) == std::ptrdiff_t(seen_w.size()));
    }
    CHECK_FALSE(hc_chunk_fits(4096, 5));  // n_mix 35: more than a warp's 32 butterflies
    CHECK_FALSE(hc_chunk_fits(4095, 4));  // slots not whole
}
