// Tiled weight layouts (format/tiled.hpp): repack then decode equals the GGUF block decode for
// Q8_0, IQ2_XXS and Q2_K, at odd row counts (partial last tile); and the lane block dots
// of kernels/moe_block_dot.hpp, fed from the tiled pieces, equal dot_iq2_xxs_q8_k and
// dot_q2_k_q8_k (the CPU emulation of what one lane of kernels/moe.cuh computes); the IQ2_XXS
// selector decode is checked exhaustively against the grid and sign tables.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rounding.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe_block_dot.hpp"

namespace {

using namespace ds4;

template <class Block>
bool same_decode(const Block& a, const Block& b, int n) {
    std::vector<float> x(n), y(n);
    dequantize(a, x.data());
    dequantize(b, y.data());
    return std::memcmp(x.data(), y.data(), sizeof(float) * n) == 0;
}

std::vector<q2_k_block> random_q2_k(std::mt19937_64& g, std::size_t n) {
    std::vector<q2_k_block> v(n);
    std::uniform_real_distribution<float> d(5e-4f, 3e-3f);
    for (auto& b : v) {
        for (auto& s : b.scales) s = std::uint8_t(g());
        for (auto& q : b.qs) q = std::uint8_t(g());
        b.d = f32_to_f16(d(g));
        b.dmin = f32_to_f16(d(g));
    }
    return v;
}

std::vector<q8_k_block> random_q8_k(std::mt19937_64& g, int n) {
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = n01(g);
    std::vector<q8_k_block> q(n / 256);
    quantize_q8_k(x.data(), q.data(), n);
    return q;
}

std::vector<std::uint32_t> words(const void* p, int n_words) {
    std::vector<std::uint32_t> w(n_words);
    std::memcpy(w.data(), p, 4 * n_words);
    return w;
}

}  // namespace

TEST_CASE("q8_0 tiled layout decodes as the GGUF rows") {
    std::mt19937_64 g(11);
    const int rows = 45, in = 320;
    const auto L = q8_0_tiled_layout::make(rows, in);
    std::vector<q8_0_block> src(std::size_t(rows) * L.nb);
    for (auto& b : src) {
        b.d = f32_to_f16(float(g() % 1000) * 1e-6f);
        for (auto& q : b.qs) q = std::int8_t(g());
    }
    std::vector<std::uint8_t> q(L.quant_bytes());
    std::vector<std::uint16_t> s(L.scale_count());
    repack_q8_0(L, src.data(), q.data(), s.data());
    for (int r = 0; r < rows; ++r)
        for (int b = 0; b < L.nb; ++b)
            CHECK(same_decode(tiled_block(L, q.data(), s.data(), r, b), src[std::size_t(r) * L.nb + b], 32));
}

TEST_CASE("iq2_xxs tiled layout: decode and lane dot equal the GGUF block") {
    std::mt19937_64 g(12);
    std::uint64_t state = g();
    for (int in : {256, 2304, 4096}) {
        const int rows = 37;
        const auto L = iq2_xxs_tiled_layout::make(rows, in);
        std::vector<iq2_xxs_block> src(std::size_t(rows) * L.nb);
        fill_random_iq2_xxs(state, src.data(), src.size(), 3e-3f);
        for (auto& b : src) b.d = f32_to_f16(float(int(g() % 2001) - 1000) * 3e-6f);
        std::vector<std::uint8_t> q(L.quant_bytes());
        std::vector<std::uint16_t> s(L.scale_count());
        repack_iq2_xxs(L, src.data(), q.data(), s.data());
        const auto x = random_q8_k(g, in);
        std::uint32_t gsel[256], ssel[128];
        for (int i = 0; i < 256; ++i) gsel[i] = kernels::iq2_xxs_grid_sel(i);
        for (int i = 0; i < 128; ++i) ssel[i] = kernels::iq2_xxs_sign_sel(i);
        for (int r = 0; r < rows; ++r) {
            float sumf = 0.0f;
            for (int b = 0; b < L.nb; ++b) {
                CHECK(same_decode(tiled_block(L, q.data(), s.data(), r, b), src[std::size_t(r) * L.nb + b], 256));
                // The kernel's lane: four 16-byte pieces, sub-block ib in piece ib/2.
                int bsum = 0;
                for (int ib = 0; ib < 8; ++ib) {
                    const auto piece = words(q.data() + L.quant_offset(r, b, ib / 2), 4);
                    const std::uint32_t a0 = piece[(ib % 2) * 2], a1 = piece[(ib % 2) * 2 + 1];
                    std::uint32_t w[8];
                    for (int l = 0; l < 4; ++l)
                        kernels::iq2_xxs_group_decode(gsel[(a0 >> (8 * l)) & 255u] | ssel[(a1 >> (7 * l)) & 127u],
                                                      w[2 * l], w[2 * l + 1]);
                    const auto xw = words(x[b].qs + 32 * ib, 8);
                    bsum += kernels::iq2_xxs_sub_dot(w, xw.data()) * int(2 * (a1 >> 28) + 1);
                }
                const float d = mul_rn(f16_to_f32(s[L.scale_index(r, b)]), x[b].d);
                sumf = add_rn(sumf, mul_rn(d, float(bsum)));
            }
            const float got = mul_rn(0.125f, sumf);
            const float want = dot_iq2_xxs_q8_k(src.data() + std::size_t(r) * L.nb, x.data(), L.nb);
            CHECK(float_bits(got) == float_bits(want));
        }
    }
}

TEST_CASE("iq2_xxs selector decode: every (grid, sign) pair gives sign * grid as int8") {
    // Expected values from the published tables directly, not from the selector tables.
    for (int gi = 0; gi < 256; ++gi) {
        const std::uint32_t g = kernels::iq2_xxs_grid_sel(gi);
        CHECK((g & 0xccccccccu) == 0u);
        for (int si = 0; si < 128; ++si) {
            const std::uint32_t sg = kernels::iq2_xxs_sign_sel(si);
            CHECK((sg & 0xbbbbbbbbu) == 0u);
            std::uint32_t w[2];
            kernels::iq2_xxs_group_decode(g | sg, w[0], w[1]);
            for (int j = 0; j < 8; ++j) {
                const int mag = int((iq2xxs_grid[gi] >> (8 * j)) & 255u);
                const int want = (ksigns_iq2xs[si] >> j) & 1u ? -mag : mag;
                CHECK(int(std::int8_t(std::uint8_t(w[j / 4] >> (8 * (j % 4))))) == want);
            }
        }
    }
}

TEST_CASE("q2_k tiled layout: decode and lane dot equal the GGUF block") {
    std::mt19937_64 g(13);
    for (int in : {256, 1280, 2048}) {
        const int rows = 41;
        const auto L = q2_k_tiled_layout::make(rows, in);
        auto src = random_q2_k(g, std::size_t(rows) * L.nb);
        std::vector<std::uint8_t> q(L.quant_bytes());
        std::vector<std::uint32_t> dd(L.dd_count());
        repack_q2_k(L, src.data(), q.data(), dd.data());
        const auto x = random_q8_k(g, in);
        for (int r = 0; r < rows; ++r) {
            float sumf = 0.0f;
            for (int b = 0; b < L.nb; ++b) {
                CHECK(same_decode(tiled_block(L, q.data(), dd.data(), r, b), src[std::size_t(r) * L.nb + b], 256));
                std::uint32_t w[20];
                for (int k = 0; k < 5; ++k) std::memcpy(w + 4 * k, q.data() + L.quant_offset(r, b, k), 16);
                const auto xw = words(x[b].qs, 64);
                int isum = 0, summs = 0;
                kernels::q2_k_block_isum(w, w + 4, xw.data(), x[b].bsums, isum, summs);
                const std::uint32_t v = dd[L.dd_index(r, b)];
                const float dall = mul_rn(x[b].d, f16_to_f32(std::uint16_t(v & 0xffffu)));
                const float dmin = mul_rn(x[b].d, f16_to_f32(std::uint16_t(v >> 16)));
                sumf = add_rn(sumf, sub_rn(mul_rn(dall, float(isum)), mul_rn(dmin, float(summs))));
            }
            const float want = dot_q2_k_q8_k(src.data() + std::size_t(r) * L.nb, x.data(), L.nb);
            CHECK(float_bits(sumf) == float_bits(want));
        }
    }
}

TEST_CASE("q2_k tiled layout: a row's scale words of every block sit at the same offsets from its block-0 word") {
    // moe_gemm's down kernels address block b's word as dd_index(row, 0) + dd_index(0, b).
    for (int rows : {32, 96, 4096})
        for (int n : {256, 2048}) {
            const auto L = ds4::q2_k_tiled_layout::make(rows, n);
            for (int r = 0; r < rows; r += 7)
                for (int b = 0; b < n / 256; ++b) CHECK(L.dd_index(r, b) == L.dd_index(r, 0) + L.dd_index(0, b));
        }
}
