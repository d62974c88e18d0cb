// Block formats, integer dots, quantisers and FP8/FP4 rounding (include/ds4/format/).
// Expected values come from the layouts written out by hand (docs/model.md §5.4), published format
// constants, brute-force searches over the code tables, or double-precision sums; never from
// the function under test.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ds4/format/formats.hpp"
#include "tests/support/kquant_quantize.hpp"

namespace {

using namespace ds4;

constexpr double eps32 = 1.0 / 16777216.0;  // 2^-24, unit roundoff of float

// Fresh inputs per run; DS4_TEST_SEED replays a failure.
std::uint64_t test_seed() {
    static const std::uint64_t seed = []() -> std::uint64_t {
        if (const char* s = std::getenv("DS4_TEST_SEED")) return std::strtoull(s, nullptr, 0);
        return (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    }();
    return seed;
}

std::mt19937_64& rng() {
    static std::mt19937_64 g(test_seed());
    return g;
}

float gaussian(float sigma = 1.0f) { return std::normal_distribution<float>(0.0f, sigma)(rng()); }
int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng()); }

std::vector<float> gaussian_vector(std::size_t n, float sigma = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = gaussian(sigma);
    return v;
}

template <class T>
void random_bytes(T& obj) {
    auto* p = reinterpret_cast<unsigned char*>(&obj);
    for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(rng()());
}

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

float pow2(int e) { return std::ldexp(1.0f, e); }

// F16 constants written as bits (independent of f32_to_f16).
constexpr std::uint16_t h_one = 0x3c00, h_half = 0x3800, h_quarter = 0x3400, h_neg_half = 0xb800,
                        h_neg_one = 0xbc00, h_max = 0x7bff, h_min_sub = 0x0001;

// Random Q8_K activations with one fixed |x| scale; the quantiser is tested on its own below.
std::vector<q8_k_block> random_q8_k(int nblocks) {
    std::vector<float> x = gaussian_vector(256 * std::size_t(nblocks), 0.7f);
    std::vector<q8_k_block> q(nblocks);
    quantize_q8_k(x.data(), q.data(), 256 * nblocks);
    return q;
}

}  // namespace

TEST_CASE("rounding: round_half_even, ceil_log2, floor_log2, exp2i") {
    MESSAGE("seed " << test_seed());
    CHECK(round_half_even(0.5f) == 0);
    CHECK(round_half_even(1.5f) == 2);
    CHECK(round_half_even(2.5f) == 2);
    CHECK(round_half_even(-0.5f) == 0);
    CHECK(round_half_even(-1.5f) == -2);
    CHECK(round_half_even(-2.5f) == -2);
    CHECK(round_half_even(std::nextafter(0.5f, 1.0f)) == 1);
    CHECK(round_half_even(126.5f) == 126);
    CHECK(round_half_even(127.5f) == 128);
    // Saturation and NaN as the PTX conversion defines them.
    CHECK(round_half_even(std::numeric_limits<float>::quiet_NaN()) == 0);
    CHECK(round_half_even(3e9f) == std::numeric_limits<int>::max());
    CHECK(round_half_even(-std::numeric_limits<float>::infinity()) == std::numeric_limits<int>::min());

    for (int k = -149; k <= 127; ++k) {
        const float p = pow2(k);
        CAPTURE(k);
        CHECK(ceil_log2(p) == k);
        CHECK(floor_log2(p) == k);
        // One ulp away is not a power of two again, except among the two smallest subnormals.
        if (k > -149) {
            CHECK(ceil_log2(std::nextafter(p, INFINITY)) == k + 1);
            CHECK(floor_log2(std::nextafter(p, INFINITY)) == k);
        }
        if (k > -148) {
            CHECK(ceil_log2(std::nextafter(p, 0.0f)) == k);
            CHECK(floor_log2(std::nextafter(p, 0.0f)) == k - 1);
        }
    }
    // Subnormals by hand: 3*2^-149 lies in (2^-148, 2^-147].
    CHECK(ceil_log2(3 * pow2(-149)) == -147);
    CHECK(floor_log2(3 * pow2(-149)) == -148);
    CHECK(ceil_log2(std::bit_cast<float>(0x007fffffu)) == -126);
    CHECK(floor_log2(std::bit_cast<float>(0x007fffffu)) == -127);
    CHECK(ceil_log2(INFINITY) == 128);
    // The case log2f gets wrong: one ulp above 2^-10 has log2 = -10 + 1.7e-7, which rounds to
    // -10.0f; the exact answer is -9.
    CHECK(ceil_log2(std::nextafter(pow2(-10), 1.0f)) == -9);

    for (int e = -160; e <= 140; ++e) {
        CAPTURE(e);
        CHECK(same_bits(exp2i(e), std::ldexp(1.0f, e)));
    }
}

TEST_CASE("q8_0: hand-worked decode") {
    q8_0_block b{};
    // d = -0.5: every product is an exact dyadic value.
    b.d = h_neg_half;
    const std::array<int, 32> qs = {-128, 127, 0, 1, -1, 2, -2, 64, -64, 100, -100, 3, 5, 7, 9, 11,
                                    13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43};
    for (int i = 0; i < 32; ++i) b.qs[i] = static_cast<std::int8_t>(qs[i]);
    float out[32];
    dequantize(b, out);
    for (int i = 0; i < 32; ++i) CHECK(out[i] == -0.5f * float(qs[i]));

    // Largest F16 scale times the extreme codes (65504*127 < 2^24, exact).
    b.d = h_max;
    b.qs[0] = 127;
    b.qs[1] = -128;
    dequantize(b, out);
    CHECK(out[0] == 8319008.0f);
    CHECK(out[1] == -8384512.0f);
    // Smallest subnormal F16 scale, 2^-24.
    b.d = h_min_sub;
    dequantize(b, out);
    CHECK(out[0] == 127.0f * pow2(-24));
    CHECK(out[1] == -pow2(-17));

    q8_0_block z{};
    dequantize(z, out);
    for (float v : out) CHECK(v == 0.0f);
}

TEST_CASE("q8_0 act: F32 scale and round-half-even ties") {
    // amax = 127 gives d = 1, id = 1: x*id is x itself, so .5 ties are exact.
    std::array<float, 32> x{};
    const std::array<float, 8> head = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 3.5f, -126.5f};
    const std::array<int, 8> want = {127, 0, 2, 2, 0, -2, 4, -126};
    for (int i = 0; i < 8; ++i) x[i] = head[i];
    q8_0_act_block q{};
    quantize_q8_0_act(x.data(), &q, 32);
    CHECK(q.d == 1.0f);
    for (int i = 0; i < 8; ++i) CHECK(int(q.qs[i]) == want[i]);
    for (int i = 8; i < 32; ++i) CHECK(q.qs[i] == 0);

    // amax = 63.5: d = 0.5, id = 2, ties at x = k/2 + 1/4.
    x.fill(0.0f);
    x[0] = -63.5f;
    x[1] = 0.25f;
    x[2] = 0.75f;
    x[3] = -1.25f;
    quantize_q8_0_act(x.data(), &q, 32);
    CHECK(q.d == 0.5f);
    CHECK(int(q.qs[0]) == -127);
    CHECK(int(q.qs[1]) == 0);
    CHECK(int(q.qs[2]) == 2);
    CHECK(int(q.qs[3]) == -2);

    // The scale stays F32: 1/127 is not an F16 value.
    x.fill(0.0f);
    x[5] = 1.0f;
    quantize_q8_0_act(x.data(), &q, 32);
    CHECK(same_bits(q.d, 1.0f / 127.0f));
    CHECK(int(q.qs[5]) == 127);

    // All-zero block: d = 0, id = 0, every q = 0.
    x.fill(0.0f);
    quantize_q8_0_act(x.data(), &q, 32);
    CHECK(q.d == 0.0f);
    for (auto v : q.qs) CHECK(v == 0);

    // Error bound on random data: |x - d*q| <= d/2 plus the roundings of x*id and d*q.
    const int nb = 37;
    const std::vector<float> xs = gaussian_vector(32 * nb, 3.0f);
    std::vector<q8_0_act_block> qa(nb);
    quantize_q8_0_act(xs.data(), qa.data(), 32 * nb);
    for (int b = 0; b < nb; ++b)
        for (int i = 0; i < 32; ++i) {
            const double x0 = xs[32 * b + i], d = qa[b].d;
            CHECK(std::fabs(x0 - d * qa[b].qs[i]) <= d * (0.5 + 256 * eps32));
        }
}

TEST_CASE("q8_0 weights: quantize error bound") {
    const int nb = 41;
    std::vector<float> x = gaussian_vector(32 * nb, 0.02f);
    x[7] = 0.0f;
    for (int i = 32; i < 64; ++i) x[i] = 0.0f;  // an all-zero block
    std::vector<q8_0_block> q(nb);
    quantize_q8_0(x.data(), q.data(), x.size());
    for (int b = 0; b < nb; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
        const double d = amax / 127.0f, dh = f16_to_f32(q[b].d);
        for (int i = 0; i < 32; ++i) {
            // |x - d q| <= d/2 (+ x/d rounding), |d q - dh q| <= 127 |d - dh|, plus dh*q rounding.
            const double bound = d * (0.5 + 128 * eps32) + 127 * std::fabs(d - dh) + 128 * dh * eps32;
            CHECK(std::fabs(double(x[32 * b + i]) - dh * q[b].qs[i]) <= bound);
        }
    }
    CHECK(q[1].d == 0);
    CHECK_THROWS_AS(quantize_q8_0(x.data(), q.data(), 33), ds4::error);
}

TEST_CASE("q8_k: signed max, ties, zero block, bsums") {
    std::array<float, 256> x{};
    // max = -127 gives iscale = 1: q = x exactly rounded half to even.
    x[3] = -127.0f;
    x[4] = 0.5f;
    x[5] = 1.5f;
    x[6] = 2.5f;
    x[7] = -3.5f;
    x[8] = 127.0f;  // same |x| later: the first occurrence (negative) wins
    q8_k_block q{};
    quantize_q8_k(x.data(), &q, 256);
    CHECK(q.d == 1.0f);  // 1/iscale, positive because max < 0
    CHECK(int(q.qs[3]) == -127);
    CHECK(int(q.qs[4]) == 0);
    CHECK(int(q.qs[5]) == 2);
    CHECK(int(q.qs[6]) == 2);
    CHECK(int(q.qs[7]) == -4);
    CHECK(int(q.qs[8]) == 127);
    CHECK(q.bsums[0] == -127 + 0 + 2 + 2 - 4 + 127);
    for (int g = 1; g < 16; ++g) CHECK(q.bsums[g] == 0);

    // Positive max: the scale is negative and the max maps to -127.
    x.fill(0.0f);
    x[100] = 4.0f;
    x[101] = 1.0f;
    x[102] = -2.0f;
    x[103] = -4.0f;  // later, same |x|: does not change the max
    quantize_q8_k(x.data(), &q, 256);
    const float iscale = -127.0f / 4.0f;  // -31.75, exact
    CHECK(same_bits(q.d, 1.0f / iscale));
    CHECK(int(q.qs[100]) == -127);
    CHECK(int(q.qs[101]) == -32);  // -31.75
    CHECK(int(q.qs[102]) == 64);   // 63.5, tie to even
    CHECK(int(q.qs[103]) == 127);
    CHECK(q.bsums[6] == -127 - 32 + 64 + 127);

    x.fill(0.0f);
    quantize_q8_k(x.data(), &q, 256);
    CHECK(q.d == 0.0f);
    for (auto v : q.qs) CHECK(v == 0);
    for (auto v : q.bsums) CHECK(v == 0);

    // Random blocks: decode error and bsums.
    const int nb = 9;
    const std::vector<float> xs = gaussian_vector(256 * nb, 5.0f);
    std::vector<q8_k_block> qb(nb);
    quantize_q8_k(xs.data(), qb.data(), 256 * nb);
    for (int b = 0; b < nb; ++b) {
        float deq[256];
        dequantize(qb[b], deq);
        for (int i = 0; i < 256; ++i) {
            const double xi = xs[256 * b + i], d = std::fabs(double(qb[b].d));
            CHECK(deq[i] == qb[b].d * float(qb[b].qs[i]));
            CHECK(std::fabs(xi - double(qb[b].d) * qb[b].qs[i]) <= d * (0.5 + 512 * eps32));
        }
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += qb[b].qs[16 * g + i];
            CHECK(qb[b].bsums[g] == s);
        }
    }
}

TEST_CASE("q2_k: hand-worked decode") {
    // Negative d, positive dmin, every scale and min nibble used, random 2-bit quants. The
    // expected value walks the qs bytes (the opposite direction of the decoder's element walk).
    q2_k_block b{};
    b.d = h_neg_half;
    b.dmin = h_quarter;
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<std::uint8_t>(g | ((15 - g) << 4));
    for (auto& v : b.qs) v = static_cast<std::uint8_t>(rng()());
    std::array<float, 256> want{};
    for (int p = 0; p < 64; ++p) {
        const int k = p / 32, h = (p % 32) / 16, i = p % 16;
        for (int j = 0; j < 4; ++j) {
            const int q = (b.qs[p] >> (2 * j)) & 3;
            const int g = 8 * k + 2 * j + h;
            want[128 * k + 32 * j + 16 * h + i] = float(-0.5 * (g & 15) * q - 0.25 * (15 - g));
        }
    }
    float out[256];
    dequantize(b, out);
    for (int e = 0; e < 256; ++e) {
        CAPTURE(e);
        CHECK(out[e] == want[e]);
    }

    // Extreme codes: q = 3, scale 15, min 15 everywhere.
    std::memset(b.qs, 0xff, sizeof b.qs);
    std::memset(b.scales, 0xff, sizeof b.scales);
    b.d = h_one;
    b.dmin = h_one;
    dequantize(b, out);
    for (float v : out) CHECK(v == 15.0f * 3 - 15.0f);

    q2_k_block z{};
    dequantize(z, out);
    for (float v : out) CHECK(v == 0.0f);
}

TEST_CASE("q4_k: hand-worked decode") {
    // 6-bit scales and mins that use the high bits, packed by hand from the GGML layout.
    const std::array<int, 8> sc = {1, 63, 17, 32, 48, 5, 63, 33};
    const std::array<int, 8> mn = {0, 62, 16, 63, 1, 47, 31, 60};
    q4_k_block b{};
    b.d = h_neg_one;
    b.dmin = h_half;
    for (int j = 0; j < 4; ++j) {
        b.scales[j] = static_cast<std::uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        b.scales[j + 4] = static_cast<std::uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
        b.scales[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (auto& v : b.qs) v = static_cast<std::uint8_t>(rng()());
    std::array<float, 256> want{};
    for (int p = 0; p < 128; ++p) {
        const int pair = p / 32, l = p % 32;
        const int jl = 2 * pair, jh = 2 * pair + 1;
        want[32 * jl + l] = float(-1.0 * sc[jl] * (b.qs[p] & 15) - 0.5 * mn[jl]);
        want[32 * jh + l] = float(-1.0 * sc[jh] * (b.qs[p] >> 4) - 0.5 * mn[jh]);
    }
    float out[256];
    dequantize(b, out);
    for (int e = 0; e < 256; ++e) {
        CAPTURE(e);
        CHECK(out[e] == want[e]);
    }
    for (int j = 0; j < 8; ++j) {
        int s, m;
        q4_k_scale_min(b, j, s, m);
        CHECK(s == sc[j]);
        CHECK(m == mn[j]);
    }

    q4_k_block z{};
    dequantize(z, out);
    for (float v : out) CHECK(v == 0.0f);
}

TEST_CASE("iq2_xxs: table checksums and spec file") {
    int ksum = 0;
    for (auto v : ksigns_iq2xs) ksum += v;
    CHECK(ksum == 16320);
    std::uint64_t x = 0;
    for (auto v : iq2xxs_grid) x ^= v;
    CHECK(x == 0x0000003232003211ull);
    // Every sign mask has even parity and its low seven bits are its index.
    for (int i = 0; i < 128; ++i) {
        CHECK(std::popcount(unsigned(ksigns_iq2xs[i])) % 2 == 0);
        CHECK((ksigns_iq2xs[i] & 127) == i);
    }
    for (auto g : iq2xxs_grid)
        for (int j = 0; j < 8; ++j) {
            const auto m = (g >> (8 * j)) & 255;
            CHECK((m == 8 || m == 25 || m == 43));
        }

    // Equal to the repository's data file, from which scripts/gen_iq2xxs_tables.py generated the
    // header; a checkout without it is broken, so its absence fails.
    const std::filesystem::path file = DS4_SOURCE_DIR "/docs/data/iq2xxs-tables.txt";
    REQUIRE_MESSAGE(std::filesystem::exists(file), "missing IQ2_XXS table data: " << file.string());
    std::ifstream in(file);
    REQUIRE_MESSAGE(in.good(), "cannot read " << file.string());
    std::string line, section;
    std::vector<std::uint64_t> ks, grid;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        if (line[0] == '[') {
            section = line;
            continue;
        }
        const std::uint64_t v = std::stoull(line, nullptr, 0);
        (section == "[ksigns]" ? ks : grid).push_back(v);
    }
    REQUIRE(ks.size() == 128);
    REQUIRE(grid.size() == 256);
    for (int i = 0; i < 128; ++i) CHECK(ks[i] == ksigns_iq2xs[i]);
    for (int i = 0; i < 256; ++i) CHECK(grid[i] == iq2xxs_grid[i]);
}

TEST_CASE("iq2_xxs: hand-worked decode") {
    // Published grid words for the indices used (GGML constants), written out here.
    const std::uint64_t g0 = 0x0808080808080808ull, g1 = 0x080808080808082bull, g2 = 0x0808080808081919ull,
                        g255 = 0x2b2b2b1908081908ull;
    // Sign masks from the 7-bit fields by the parity rule: bit 7 = parity of the field.
    auto sign_mask = [](unsigned f) { return f | ((std::popcount(f) & 1u) << 7); };
    for (std::uint16_t dh : {h_one, h_neg_one}) {
        iq2_xxs_block b{};
        b.d = dh;
        const double d = dh == h_one ? 1.0 : -1.0;
        // Sub-block 0: indices {0,1,2,255}, sign fields {0,1,127,64}, s = 15.
        const std::uint32_t a0 = 0u | (1u << 8) | (2u << 16) | (255u << 24);
        const std::uint32_t a1 = 0u | (1u << 7) | (127u << 14) | (64u << 21) | (15u << 28);
        // Sub-block 5: index 2 everywhere, sign field 3 on l = 1, s = 0.
        const std::uint32_t b0 = 0x02020202u, b1 = 3u << 7;
        b.qs[0] = std::uint16_t(a0 & 0xffff);
        b.qs[1] = std::uint16_t(a0 >> 16);
        b.qs[2] = std::uint16_t(a1 & 0xffff);
        b.qs[3] = std::uint16_t(a1 >> 16);
        b.qs[20] = std::uint16_t(b0 & 0xffff);
        b.qs[21] = std::uint16_t(b0 >> 16);
        b.qs[22] = std::uint16_t(b1 & 0xffff);
        b.qs[23] = std::uint16_t(b1 >> 16);
        std::array<double, 256> want{};
        auto fill = [&](int ib, const std::array<std::uint64_t, 4>& grids, const std::array<unsigned, 4>& fields,
                        int s) {
            for (int l = 0; l < 4; ++l)
                for (int j = 0; j < 8; ++j) {
                    const double mag = double((grids[l] >> (8 * j)) & 255);
                    const double sgn = (sign_mask(fields[l]) >> j) & 1 ? -1.0 : 1.0;
                    want[32 * ib + 8 * l + j] = d * (2 * s + 1) / 8.0 * mag * sgn;
                }
        };
        // Untouched sub-blocks: index 0 (all 8), no signs, s = 0 -> d/8*8 = d.
        for (int ib = 0; ib < 8; ++ib) fill(ib, {g0, g0, g0, g0}, {0, 0, 0, 0}, 0);
        fill(0, {g0, g1, g2, g255}, {0, 1, 127, 64}, 15);
        fill(5, {g2, g2, g2, g2}, {0, 3, 0, 0}, 0);
        float out[256];
        dequantize(b, out);
        for (int e = 0; e < 256; ++e) {
            CAPTURE(e);
            CHECK(double(out[e]) == want[e]);
        }
    }
    // Spot values: sub-block 0 of the d = 1 block, element 8 is grid1 byte 0 = 43, sign bit 0
    // of field 1 set: -43 * 31/8.
    iq2_xxs_block b{};
    b.d = h_one;
    b.qs[0] = 1u << 8;
    b.qs[2] = std::uint16_t(1u << 7);
    b.qs[3] = std::uint16_t(15u << 12);
    float out[256];
    dequantize(b, out);
    CHECK(out[8] == -43.0f * 31.0f / 8.0f);
    CHECK(out[15] == -8.0f * 31.0f / 8.0f);  // field 1 has odd parity: bit 7 set too
    CHECK(out[9] == 8.0f * 31.0f / 8.0f);
}

namespace {

// Exact-value reference for the dots: double sums of dequantised values, and the sum of
// absolute contributions that bounds the float rounding.
struct dot_ref {
    double value = 0, abs_sum = 0;
};

template <class Block>
dot_ref reference_dot_k(const Block* w, const q8_k_block* x, int nb) {
    dot_ref r;
    for (int b = 0; b < nb; ++b) {
        float wd[256], xd[256];
        dequantize(w[b], wd);
        for (int i = 0; i < 256; ++i) xd[i] = x[b].d * float(x[b].qs[i]);
        for (int i = 0; i < 256; ++i) r.value += double(wd[i]) * xd[i];
    }
    return r;
}

// Bound: each block term has a handful of roundings relative to its absolute parts, and the
// running sum adds one rounding per block; the dequantised reference adds a few more per
// element. (nblocks + 8) * 2^-24 * sum of absolute parts covers all of them.
void check_dot(float got, const dot_ref& r, int nb) {
    const double bound = (nb + 8) * eps32 * r.abs_sum;
    CAPTURE(got);
    CAPTURE(r.value);
    CAPTURE(bound);
    CHECK(std::fabs(double(got) - r.value) <= bound);
}

}  // namespace

TEST_CASE("dots: q8_0 equals the dot of the decoded blocks, and the scalar order") {
    for (int nb : {1, 3, 7, 13, 128}) {
        CAPTURE(nb);
        const std::vector<float> wf = gaussian_vector(32 * nb, 0.05f), xf = gaussian_vector(32 * nb, 2.0f);
        std::vector<q8_0_block> w(nb);
        std::vector<q8_0_act_block> x(nb);
        quantize_q8_0(wf.data(), w.data(), wf.size());
        quantize_q8_0_act(xf.data(), x.data(), 32 * nb);
        dot_ref r;
        float replay = 0.0f;
        for (int b = 0; b < nb; ++b) {
            float wd[32];
            dequantize(w[b], wd);
            int isum = 0;
            for (int i = 0; i < 32; ++i) {
                const double xv = double(x[b].d) * x[b].qs[i];
                r.value += double(wd[i]) * xv;
                r.abs_sum += std::fabs(double(wd[i]) * xv);
                isum += w[b].qs[i] * x[b].qs[i];
            }
            CHECK(q8_0_block_isum(w[b], x[b]) == isum);
            const float scale = f16_to_f32(w[b].d) * x[b].d;
            const float term = scale * float(isum);
            replay = replay + term;
        }
        const float got = dot_q8_0(w.data(), x.data(), nb);
        check_dot(got, r, nb);
        CHECK(same_bits(got, replay));
    }
}

TEST_CASE("dots: q2_k equals the dot of the decoded blocks, and the scalar order") {
    for (int nb : {1, 3, 7, 13, 64}) {
        CAPTURE(nb);
        std::vector<q2_k_block> w(nb);
        for (auto& b : w) {
            random_bytes(b);
            b.d = f32_to_f16(std::ldexp(float(uniform_int(1, 1000)), -14) * (uniform_int(0, 1) ? 1 : -1));
            b.dmin = f32_to_f16(std::ldexp(float(uniform_int(0, 1000)), -15));
        }
        const std::vector<q8_k_block> x = random_q8_k(nb);
        dot_ref r = reference_dot_k(w.data(), x.data(), nb);
        float replay = 0.0f;
        for (int b = 0; b < nb; ++b) {
            const double dw = f16_to_f32(w[b].d), dm = f16_to_f32(w[b].dmin);
            int isum = 0, summs = 0;
            for (int p = 0; p < 64; ++p)
                for (int j = 0; j < 4; ++j) {
                    const int k = p / 32, h = (p % 32) / 16, i = p % 16;
                    const int e = 128 * k + 32 * j + 16 * h + i, g = 8 * k + 2 * j + h;
                    const int q = (w[b].qs[p] >> (2 * j)) & 3;
                    const int sc = w[b].scales[g] & 15, m = w[b].scales[g] >> 4;
                    isum += sc * q * x[b].qs[e];
                    summs += m * x[b].qs[e];
                    r.abs_sum += (std::fabs(dw * sc * q) + std::fabs(dm * m)) * std::fabs(double(x[b].d) * x[b].qs[e]);
                }
            const float dall = x[b].d * f16_to_f32(w[b].d), dmin = x[b].d * f16_to_f32(w[b].dmin);
            const float a = dall * float(isum), c = dmin * float(summs);
            replay = replay + (a - c);
        }
        const float got = dot_q2_k_q8_k(w.data(), x.data(), nb);
        check_dot(got, r, nb);
        CHECK(same_bits(got, replay));
    }
}

TEST_CASE("dots: q4_k equals the dot of the decoded blocks, and the GGML lane order") {
    for (int nb : {1, 3, 7, 13, 64}) {
        CAPTURE(nb);
        std::vector<q4_k_block> w(nb);
        for (auto& b : w) {
            random_bytes(b);
            b.d = f32_to_f16(std::ldexp(float(uniform_int(1, 1000)), -16) * (uniform_int(0, 1) ? 1 : -1));
            b.dmin = f32_to_f16(std::ldexp(float(uniform_int(0, 1000)), -17));
        }
        const std::vector<q8_k_block> x = random_q8_k(nb);
        dot_ref r = reference_dot_k(w.data(), x.data(), nb);
        float lanes[8] = {};
        float replay = 0.0f;
        for (int b = 0; b < nb; ++b) {
            const double dw = f16_to_f32(w[b].d), dm = f16_to_f32(w[b].dmin);
            long long lane_int[8] = {};
            long long mins = 0;
            for (int e = 0; e < 256; ++e) {
                const int j = e / 32;
                int sc, m;
                q4_k_scale_min(w[b], j, sc, m);  // checked against hand packing above
                const int q = j % 2 ? w[b].qs[(j / 2) * 32 + e % 32] >> 4 : w[b].qs[(j / 2) * 32 + e % 32] & 15;
                lane_int[e % 8] += sc * q * x[b].qs[e];
                mins += m * x[b].qs[e];
                r.abs_sum += (std::fabs(dw * sc * q) + std::fabs(dm * m)) * std::fabs(double(x[b].d) * x[b].qs[e]);
            }
            const float d = f16_to_f32(w[b].d) * x[b].d, dmin = f16_to_f32(w[b].dmin) * x[b].d;
            for (int l = 0; l < 8; ++l) lanes[l] = lanes[l] + d * float(lane_int[l]);
            replay = replay - dmin * float(mins);
        }
        for (int l = 0; l < 8; ++l) replay = replay + lanes[l];
        const float got = dot_q4_k_q8_k(w.data(), x.data(), nb);
        check_dot(got, r, nb);
        CHECK(same_bits(got, replay));
    }
}

TEST_CASE("dots: iq2_xxs equals the dot of the decoded blocks, and the scalar order") {
    std::uint64_t state = test_seed();
    for (int nb : {1, 3, 7, 13, 64}) {
        CAPTURE(nb);
        std::vector<iq2_xxs_block> w(nb);
        fill_random_iq2_xxs(state, w.data(), w.size(), 0.0f);
        for (auto& b : w) b.d = f32_to_f16(std::ldexp(float(uniform_int(-1000, 1000)), -18));
        const std::vector<q8_k_block> x = random_q8_k(nb);
        dot_ref r = reference_dot_k(w.data(), x.data(), nb);
        float replay = 0.0f;
        for (int b = 0; b < nb; ++b) {
            float wd[256];
            dequantize(w[b], wd);
            long long bsum = 0;
            for (int ib = 0; ib < 8; ++ib) {
                const std::uint32_t a1 = w[b].qs[4 * ib + 2] | (std::uint32_t(w[b].qs[4 * ib + 3]) << 16);
                const int ls = 2 * int(a1 >> 28) + 1;
                long long sumi = 0;
                for (int i = 0; i < 32; ++i) {
                    // wd = d*ls/8*signed grid exactly (d has few bits), so the integer is recoverable.
                    const double gs = double(wd[32 * ib + i]) * 8.0 / (double(f16_to_f32(w[b].d)) * ls);
                    sumi += std::llround(gs) * x[b].qs[32 * ib + i];
                }
                bsum += sumi * ls;
            }
            for (int i = 0; i < 256; ++i) r.abs_sum += std::fabs(double(wd[i]) * x[b].d * x[b].qs[i]);
            const float d = f16_to_f32(w[b].d) * x[b].d;
            replay = replay + d * float(bsum);
        }
        replay = 0.125f * replay;
        const float got = dot_iq2_xxs_q8_k(w.data(), x.data(), nb);
        check_dot(got, r, nb);
        CHECK(same_bits(got, replay));
    }
}

// The single-block statement of a random block that fill_random_iq2_xxs must reproduce: d, then
// the 64 qs bytes from eight successive 64-bit draws.
template <class Rng>
iq2_xxs_block random_iq2_xxs_block(Rng& next_u64, float d) {
    iq2_xxs_block b;
    b.d = f32_to_f16(d);
    for (int k = 0; k < 8; ++k) {
        const std::uint64_t r = next_u64();
        std::memcpy(&b.qs[4 * k], &r, 8);
    }
    return b;
}

TEST_CASE("iq2_xxs: random block generators") {
    std::uint64_t s1 = 12345, s2 = 12345;
    std::vector<iq2_xxs_block> bulk(50);
    fill_random_iq2_xxs(s1, bulk.data(), bulk.size(), 0.01f);
    // The bulk form is the single-block form driven by the same splitmix64 stream.
    auto next = [&s2] {
        std::uint64_t z = (s2 += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    };
    for (const auto& b : bulk) {
        const iq2_xxs_block one = random_iq2_xxs_block(next, 0.01f);
        CHECK(std::memcmp(&one, &b, sizeof b) == 0);
    }
    CHECK(s1 == s2);
    // O(1) skip: state after k outputs.
    CHECK(s1 == 12345 + 400 * 0x9e3779b97f4a7c15ull);

    // Decoded blocks are finite, within d*31/8*43, and their RMS matches the prediction.
    std::vector<iq2_xxs_block> many(4000);
    std::uint64_t s3 = test_seed();
    fill_random_iq2_xxs(s3, many.data(), many.size(), 0.01f);
    double ss = 0;
    const double dh = f16_to_f32(many[0].d);
    for (const auto& b : many) {
        float out[256];
        dequantize(b, out);
        for (float v : out) {
            CHECK(std::isfinite(v));
            ss += double(v) * v;
            CHECK(std::fabs(v) <= dh * 31 / 8 * 43 * (1 + 4 * eps32));
        }
    }
    const double rms = std::sqrt(ss / (256.0 * many.size()));
    CHECK(rms == doctest::Approx(iq2_xxs_random_rms(0.01f)).epsilon(0.02));
}

TEST_CASE("q2_k and q4_k: quantiser error bounds") {
    // Gaussian weights: relative RMS decode error below what 2- and 4-bit uniform grids over
    // a group's range give with optimal per-group scales (measured about 0.27 and 0.07 of the
    // data RMS; bounds leave a margin), and every element within a few steps of its value.
    const int nb = 64;
    const std::vector<float> x = gaussian_vector(256 * nb, 0.02f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double rms = std::sqrt(ss / x.size());

    std::vector<q2_k_block> q2(nb);
    quantize_q2_k(x.data(), q2.data(), x.size());
    double e2 = 0;
    for (int b = 0; b < nb; ++b) {
        float out[256];
        dequantize(q2[b], out);
        for (int i = 0; i < 256; ++i) {
            const double e = out[i] - double(x[256 * b + i]);
            e2 += e * e;
            CHECK(std::fabs(e) <= 5 * rms);
        }
    }
    const double rel2 = std::sqrt(e2 / x.size()) / rms;
    MESSAGE("q2_k relative RMS error " << rel2);
    CHECK(rel2 < 0.32);

    std::vector<q4_k_block> q4(nb);
    quantize_q4_k(x.data(), q4.data(), x.size());
    double e4 = 0;
    for (int b = 0; b < nb; ++b) {
        float out[256];
        dequantize(q4[b], out);
        for (int i = 0; i < 256; ++i) {
            const double e = out[i] - double(x[256 * b + i]);
            e4 += e * e;
            CHECK(std::fabs(e) <= 1.5 * rms);
        }
    }
    const double rel4 = std::sqrt(e4 / x.size()) / rms;
    MESSAGE("q4_k relative RMS error " << rel4);
    CHECK(rel4 < 0.09);

    // Constant and all-zero blocks decode exactly-ish: zeros stay zeros.
    std::vector<float> z(256, 0.0f);
    quantize_q2_k(z.data(), q2.data(), 256);
    quantize_q4_k(z.data(), q4.data(), 256);
    float out[256];
    dequantize(q2[0], out);
    for (float v : out) CHECK(v == 0.0f);
    dequantize(q4[0], out);
    for (float v : out) CHECK(v == 0.0f);
    CHECK_THROWS_AS(quantize_q2_k(z.data(), q2.data(), 100), ds4::error);
    CHECK_THROWS_AS(quantize_q4_k(z.data(), q4.data(), 100), ds4::error);
}

namespace {

// The spec's E4M3FN values by formula, and the nearest code by brute force (ties to even).
double e4m3_spec_value(int code) {
    const int e = code >> 3, m = code & 7;
    return e == 0 ? m * std::ldexp(1.0, -9) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
}

int brute_nearest(double a, int max_code, double (*value)(int)) {
    int best = 0;
    double best_d = INFINITY;
    for (int c = 0; c <= max_code; ++c) {
        const double d = std::fabs(value(c) - a);
        if (d < best_d || (d == best_d && c % 2 == 0)) {
            best = c;
            best_d = d;
        }
    }
    return best;
}

double e2m1_spec_value(int idx) {
    static constexpr double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return grid[idx];
}

}  // namespace

TEST_CASE("e4m3: codes, ties, edges") {
    for (int c = 0; c < 127; ++c) {
        CAPTURE(c);
        CHECK(double(e4m3_decode(std::uint8_t(c))) == e4m3_spec_value(c));
        CHECK(double(e4m3_decode(std::uint8_t(c | 0x80))) == -e4m3_spec_value(c));
        CHECK(e4m3_encode(float(e4m3_spec_value(c))) == c);
    }
    CHECK(std::isnan(e4m3_decode(0x7f)));
    CHECK(std::isnan(e4m3_decode(0xff)));
    CHECK(e4m3_encode(NAN) == 0x7f);

    CHECK(e4m3_round(0.5f * (1.0f + 1.125f)) == 1.0f);      // codes 56|57 -> 56
    CHECK(e4m3_round(0.5f * (1.125f + 1.25f)) == 1.25f);    // codes 57|58 -> 58
    CHECK(e4m3_round(-0.5f * (1.0f + 1.125f)) == -1.0f);
    CHECK(e4m3_round(std::nextafter(1.0625f, 2.0f)) == 1.125f);
    CHECK(e4m3_round(448.0f) == 448.0f);
    CHECK(e4m3_encode(448.0f) == 0x7e);
    CHECK(e4m3_encode(-448.0f) == 0xfe);
    CHECK(e4m3_round(432.0f) == 448.0f);  // 416|448 tie -> code 126
    CHECK(e4m3_round(std::nextafter(432.0f, 0.0f)) == 416.0f);
    CHECK(e4m3_round(1e6f) == 448.0f);
    CHECK(e4m3_round(-INFINITY) == -448.0f);
    CHECK(e4m3_round(248.0f) == 256.0f);  // 240|256 tie across an exponent -> code 120
    CHECK(e4m3_round(pow2(-6)) == pow2(-6));  // smallest normal, code 8
    CHECK(e4m3_encode(pow2(-6)) == 0x08);
    CHECK(e4m3_round(pow2(-9)) == pow2(-9));  // smallest subnormal, code 1
    CHECK(e4m3_encode(pow2(-9)) == 0x01);
    CHECK(e4m3_round(7.5f * pow2(-9)) == pow2(-6));     // 7|8 tie at the normal boundary -> 8
    CHECK(e4m3_round(pow2(-10)) == 0.0f);               // 0|1 tie -> 0
    CHECK(e4m3_round(std::nextafter(pow2(-10), 1.0f)) == pow2(-9));
    CHECK(e4m3_round(1.5f * pow2(-9)) == pow2(-8));     // 1|2 tie -> 2
    CHECK(e4m3_round(2.5f * pow2(-9)) == pow2(-8));     // 2|3 tie -> 2
    CHECK(e4m3_encode(0.0f) == 0x00);
    CHECK(e4m3_encode(-0.0f) == 0x80);
    CHECK(same_bits(e4m3_round(-0.0f), -0.0f));
    CHECK(same_bits(e4m3_round(-pow2(-12)), -0.0f));  // rounds to zero, keeps the sign

    // Brute force over random magnitudes across the whole range, and over every midpoint.
    for (int t = 0; t < 20000; ++t) {
        const float a = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng()), uniform_int(-12, 8));
        CAPTURE(a);
        CHECK(int(e4m3_encode(a)) == brute_nearest(std::min(double(a), 448.0), 126, e4m3_spec_value));
    }
    for (int c = 0; c < 126; ++c) {
        const float mid = float(0.5 * (e4m3_spec_value(c) + e4m3_spec_value(c + 1)));
        CAPTURE(c);
        CHECK(int(e4m3_encode(mid)) == (c % 2 == 0 ? c : c + 1));
        CHECK(int(e4m3_encode(std::nextafter(mid, 0.0f))) == c);
        CHECK(int(e4m3_encode(std::nextafter(mid, 1e9f))) == c + 1);
    }
}

TEST_CASE("e2m1: codes, ties, edges, nibble order") {
    for (int c = 0; c < 8; ++c) {
        CHECK(double(e2m1_decode(std::uint8_t(c))) == e2m1_spec_value(c));
        CHECK(double(e2m1_decode(std::uint8_t(c | 8))) == -e2m1_spec_value(c));
        CHECK(e2m1_encode(float(e2m1_spec_value(c))) == c);
    }
    CHECK(e2m1_round(0.25f) == 0.0f);   // 0|1 -> 0
    CHECK(e2m1_round(0.75f) == 1.0f);   // 1|2 -> 2
    CHECK(e2m1_round(1.25f) == 1.0f);   // 2|3 -> 2
    CHECK(e2m1_round(1.75f) == 2.0f);   // 3|4 -> 4
    CHECK(e2m1_round(2.5f) == 2.0f);    // 4|5 -> 4
    CHECK(e2m1_round(3.5f) == 4.0f);    // 5|6 -> 6
    CHECK(e2m1_round(5.0f) == 4.0f);    // 6|7 -> 6
    CHECK(e2m1_round(5.5f) == 6.0f);
    CHECK(e2m1_round(6.0f) == 6.0f);
    CHECK(e2m1_round(100.0f) == 6.0f);
    CHECK(e2m1_round(-5.0f) == -4.0f);
    CHECK(e2m1_encode(-0.0f) == 0x8);
    CHECK(same_bits(e2m1_round(-0.1f), -0.0f));
    for (int t = 0; t < 5000; ++t) {
        const float a = std::uniform_real_distribution<float>(0.0f, 7.0f)(rng());
        CAPTURE(a);
        CHECK(int(e2m1_encode(a)) == brute_nearest(std::min(double(a), 6.0), 7, e2m1_spec_value));
    }

    // Nibble order: element 2k in the low nibble. Block amax 6 -> exponent 0, scale 1.
    const float x[5] = {6.0f, -0.5f, 1.0f, 3.0f, -6.0f};
    std::uint8_t packed[3] = {0xaa, 0xaa, 0xaa};
    CHECK(e2m1_block_encode(x, 5, packed) == 0);
    CHECK(packed[0] == (0x7 | (0x9 << 4)));
    CHECK(packed[1] == (0x2 | (0x5 << 4)));
    CHECK(packed[2] == 0xf);
}

TEST_CASE("e4m3/e2m1 blocks: scales, encode/decode equals round trip bitwise") {
    // Block exponents by hand.
    std::array<float, 64> x{};
    CHECK(e4m3_block_scale_exp(x.data(), 64) == -22);  // 1e-4/448 = 2^-22.09
    x[10] = -448.0f;
    CHECK(e4m3_block_scale_exp(x.data(), 64) == 0);
    x[10] = std::nextafter(448.0f, 1e9f);  // amax/448 rounds to 1 + 2^-23
    CHECK(e4m3_block_scale_exp(x.data(), 64) == 1);
    x[10] = 448.0f * 1024;
    CHECK(e4m3_block_scale_exp(x.data(), 64) == 10);
    std::array<float, 32> y{};
    CHECK(e2m1_block_scale_exp(y.data(), 32) == -126);
    y[0] = 6.0f;
    CHECK(e2m1_block_scale_exp(y.data(), 32) == 0);
    y[0] = 6.5f;
    CHECK(e2m1_block_scale_exp(y.data(), 32) == 1);

    // Zero blocks round-trip to zeros of the same sign.
    std::array<float, 64> zero{};
    zero[3] = -0.0f;
    e4m3_block_roundtrip(zero.data(), 64);
    CHECK(same_bits(zero[3], -0.0f));
    CHECK(same_bits(zero[4], 0.0f));

    for (int t = 0; t < 400; ++t) {
        // Magnitudes from 1e-30 to 1e30, some blocks with a lone outlier.
        const float sigma = std::ldexp(1.0f, uniform_int(-100, 100));
        std::array<float, 64> a{};
        for (auto& v : a) v = gaussian(sigma);
        if (t % 3 == 0) a[uniform_int(0, 63)] *= 1000.0f;
        const int n4 = t % 5 == 0 ? 37 : 64;  // odd sizes too

        std::array<float, 64> rt = a;
        e4m3_block_roundtrip(rt.data(), n4);
        std::uint8_t codes[64];
        const int e = e4m3_block_encode(a.data(), n4, codes);
        float dec[64];
        e4m3_block_decode(codes, e, n4, dec);
        float amax = 0;
        for (int i = 0; i < n4; ++i) amax = std::max(amax, std::fabs(a[i]));
        for (int i = 0; i < n4; ++i) {
            CAPTURE(i);
            CHECK(same_bits(dec[i], rt[i]));
            // Normal-range values keep 4 significant bits: relative error <= 2^-4.
            const double ad = std::fabs(double(a[i]));
            if (ad >= std::ldexp(1.0, e - 6)) CHECK(std::fabs(double(rt[i]) - a[i]) <= ad / 16);
            CHECK(std::fabs(rt[i]) <= 448.0f * std::ldexp(1.0f, e));
        }
        // The exponent is the exact ceil(log2) of the float amax/448: 2^(e-1) < q <= 2^e.
        const double q = std::max(amax, 1e-4f) / 448.0f;
        CHECK(std::ldexp(1.0, e - 1) < q);
        CHECK(q <= std::ldexp(1.0, e));

        const int n2 = t % 5 == 0 ? 17 : 32;
        std::array<float, 32> r2{};
        std::copy(a.begin(), a.begin() + 32, r2.begin());
        std::array<float, 32> b2 = r2;
        e2m1_block_roundtrip(r2.data(), n2);
        std::uint8_t packed[16];
        const int e2 = e2m1_block_encode(b2.data(), n2, packed);
        float dec2[32];
        e2m1_block_decode(packed, e2, n2, dec2);
        for (int i = 0; i < n2; ++i) {
            CAPTURE(i);
            CHECK(same_bits(dec2[i], r2[i]));
            CHECK(std::fabs(r2[i]) <= 6.0f * std::ldexp(1.0f, e2));
        }
    }
}
