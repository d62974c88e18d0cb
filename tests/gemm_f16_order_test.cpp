// The reduction order of kernels/gemm_f16.cuh, emulated on the host: a warp's 32 lane slots each
// run 64 chains of 16 products (an 8 x 8 tile of weight rows x activation rows), then the
// butterfly by recursive halving (at offset o a lane keeps the half of its outputs its bit o
// selects and adds its partner's value of the same output), after which lane l holds outputs
// 2l and 2l + 1. Every output must equal format/row_dot.hpp's f16_row_dot bit for bit: the halving
// computes the full butterfly's sums (a + b == b + a) and the mapping of outputs to lanes is the
// one the kernel's store uses. It mirrors the kernel rather than running it; ds4-validate's
// gemm_f16 rows run the kernel.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/row_dot.hpp"

namespace {

using lane_values = std::array<std::array<float, 64>, 32>;

// One level of the halving over every lane of the warp (the kernel's halve<HALF>).
void halve(lane_values& v, int half, int off) {
    lane_values next = v;
    for (int l = 0; l < 32; ++l) {
        const int p = l ^ off;
        const bool upper = (l & off) != 0, p_upper = (p & off) != 0;
        for (int j = 0; j < half; ++j) {
            const float keep = upper ? v[std::size_t(l)][std::size_t(half + j)] : v[std::size_t(l)][std::size_t(j)];
            const float recv = p_upper ? v[std::size_t(p)][std::size_t(j)] : v[std::size_t(p)][std::size_t(half + j)];
            next[std::size_t(l)][std::size_t(j)] = keep + recv;
        }
    }
    v = next;
}

}  // namespace

TEST_CASE("gemm_f16's slot chains and recursive halving equal the f16 row dot bitwise") {
    std::mt19937_64 g(20261202);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (const int in : {48, 512, 1040, 4096}) {
        CAPTURE(in);
        std::vector<std::uint16_t> w(std::size_t(8) * in);
        std::vector<float> x(std::size_t(8) * in);
        for (auto& v : w) v = ds4::f32_to_f16(0.02f * n01(g));
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(n01(g), int(i / 64 % 7) - 3);
        float acc[32][2] = {};
        for (int s = 0; s * ds4::f16_segment < in; ++s) {
            lane_values v{};
            for (int l = 0; l < 32; ++l)
                for (int j = 0; j < 64; ++j) {
                    const int wr = j / 8, xr = j % 8;
                    float c = 0.0f;
                    for (int i = 0; i < ds4::f16_lane_elems; ++i) {
                        const int e = s * ds4::f16_segment + l * ds4::f16_lane_elems + i;
                        // Past the input the kernel's tiles hold zeros: 0 * 0 added, as an idle lane adds 0.
                        const float wv = e < in ? ds4::f16_to_f32(w[std::size_t(wr) * in + e]) : 0.0f;
                        const float xv = e < in ? x[std::size_t(xr) * in + e] : 0.0f;
                        c = c + wv * xv;
                    }
                    v[std::size_t(l)][std::size_t(j)] = c;
                }
            for (int level = 0; level < 5; ++level) halve(v, 32 >> level, 16 >> level);
            for (int l = 0; l < 32; ++l)
                for (int e = 0; e < 2; ++e) acc[l][e] = acc[l][e] + v[std::size_t(l)][std::size_t(e)];
        }
        int mismatches = 0;
        for (int l = 0; l < 32; ++l)
            for (int e = 0; e < 2; ++e) {
                const int j = 2 * l + e, wr = j / 8, xr = j % 8;
                const float want = ds4::f16_row_dot(w.data() + std::size_t(wr) * in, x.data() + std::size_t(xr) * in, in);
                mismatches += std::bit_cast<std::uint32_t>(acc[l][e]) != std::bit_cast<std::uint32_t>(want);
            }
        CHECK(mismatches == 0);
    }
}
