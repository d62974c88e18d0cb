// The native KV formats against the reference's simulated rows (ref::kv_row_as_stored and the
// E2M1 round trip + F16 round of indexer keys), bit for bit, and the paged storage.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/model/kv_layout.hpp"
#include "ds4/model/shape.hpp"
#include "reference/kv_store.hpp"

using namespace ds4;
using namespace ds4::model;

namespace {

std::uint32_t bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Equal bits, or NaN on both sides (the payload of a NaN is not part of the contract).
bool same(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }

// Blocks at very different magnitudes, so the rows cross F16's subnormal range (where the F16
// round in decode matters), the 1e-4 amax floor and F16 overflow.
std::vector<float> random_row(std::mt19937& g, int n, bool finite_f16_range) {
    std::vector<float> x(static_cast<std::size_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exp_pick(finite_f16_range ? -40 : -60, finite_f16_range ? 12 : 20);
    std::uniform_int_distribution<int> kind(0, 9);
    for (int b = 0; b < n; b += 32) {
        const float scale = std::ldexp(1.0f, exp_pick(g));
        const int k = kind(g);
        for (int i = b; i < b + 32 && i < n; ++i) {
            float v = normal(g) * scale;
            if (k == 0) v = 0.0f;                                      // all-zero block
            if (k == 1 && i % 7 == 0) v = -0.0f;                       // signed zeros
            if (k == 2) v = std::ldexp(float(int(normal(g) * 8)), exp_pick(g) / 4);  // grid points, ties
            x[std::size_t(i)] = v;
        }
    }
    return x;
}

void check_attention(const attention_row_layout& l, const std::vector<float>& x) {
    std::vector<float> want = x;
    ref::kv_row_as_stored(want.data(), l.head_dim, l.n_rot);
    std::vector<std::uint8_t> row(std::size_t(l.bytes()));
    std::vector<float> got(std::size_t(l.head_dim));
    encode_attention_row(l, x.data(), row.data());
    decode_attention_row(l, row.data(), got.data());
    for (int i = 0; i < l.head_dim; ++i) {
        INFO("dim " << i << " x " << x[std::size_t(i)]);
        REQUIRE(same(got[std::size_t(i)], want[std::size_t(i)]));
    }
}

std::vector<float> indexer_stored(const std::vector<float>& x) {
    std::vector<float> s = x;
    for (std::size_t b = 0; b < s.size(); b += e2m1_block_size) e2m1_block_roundtrip(s.data() + b, e2m1_block_size);
    for (float& v : s) v = f16_round(v);
    return s;
}

void check_indexer(const indexer_row_layout& l, const std::vector<float>& x) {
    const std::vector<float> want = indexer_stored(x);
    std::vector<std::uint8_t> row(std::size_t(l.bytes()));
    std::vector<float> got(std::size_t(l.dim));
    encode_indexer_row(l, x.data(), row.data());
    decode_indexer_row(l, row.data(), got.data());
    for (int i = 0; i < l.dim; ++i) {
        INFO("dim " << i << " x " << x[std::size_t(i)]);
        REQUIRE(same(got[std::size_t(i)], want[std::size_t(i)]));
    }
}

}  // namespace

TEST_CASE("kv_layout: row sizes and bytes per context token at flash shape") {
    const model_dims flash = dims_of<flash_shape>();
    CHECK(attention_row_layout{512, 64}.bytes() == 592);  // 448 + 128 + 7 = 583 -> 592
    CHECK(indexer_row_layout{128}.bytes() == 80);         // 64 + 4 = 68 -> 80
    CHECK(attention_row_layout{128, 64}.bytes() == 208);  // tiny: 64 + 128 + 1 = 193 -> 208
    // 21 x (592 + 80) / 4 + 20 x 592 / 128 = 3528 + 92.5
    CHECK(kv_bytes_per_token(flash) == doctest::Approx(3620.5).epsilon(1e-12));
    CHECK(kv_bytes_per_token(flash) <= 4.5 * 1024);
}

TEST_CASE("kv_layout: attention rows decode to the reference's stored row, bitwise") {
    std::random_device rd;
    const unsigned seed = rd();
    INFO("seed " << seed);
    std::mt19937 g(seed);
    for (const attention_row_layout l : {attention_row_layout{512, 64}, attention_row_layout{128, 64}}) {
        for (int t = 0; t < 3000; ++t) check_attention(l, random_row(g, l.head_dim, t % 2 == 0));
        // Edges: all zero, the amax floor, max E4M3 grid values, F16 max/overflow, subnormals.
        const float edges[] = {0.0f, 1e-4f, 9.9e-5f, 448.0f, 65504.0f, 65520.0f, 1e30f, -1e-30f,
                               std::numeric_limits<float>::denorm_min(), std::ldexp(1.0f, -24),
                               std::ldexp(1.0f, -25), std::ldexp(3.0f, -26), 224.0f, 232.0f};
        for (float e : edges) {
            check_attention(l, std::vector<float>(std::size_t(l.head_dim), e));
            std::vector<float> x(std::size_t(l.head_dim), 0.0f);
            x[0] = e;
            x[1] = -e * 0.3f;
            x[std::size_t(l.head_dim) - 1] = e;
            check_attention(l, x);
        }
        // Why decode applies the F16 round: block max 0.005 gives scale 2^-16, and the E4M3 value
        // 3*2^-9 times 2^-16 = 1.5*2^-24 is below F16's subnormal step; stored, it reads 2^-23.
        {
            std::vector<float> x(std::size_t(l.head_dim), 0.0f);
            x[0] = 0.005f;
            x[1] = std::ldexp(3.0f, -25);
            std::vector<std::uint8_t> row(std::size_t(l.bytes()));
            encode_attention_row(l, x.data(), row.data());
            float raw_decode[64];
            e4m3_block_decode(row.data(), std::int8_t(row[std::size_t(l.exponent_offset())]), 64, raw_decode);
            CHECK(raw_decode[1] == std::ldexp(3.0f, -25));
            check_attention(l, x);
            std::vector<float> got(std::size_t(l.head_dim));
            decode_attention_row(l, row.data(), got.data());
            CHECK(got[1] == std::ldexp(1.0f, -23));
        }
        std::vector<float> nan_row = random_row(g, l.head_dim, true);
        nan_row[5] = std::numeric_limits<float>::quiet_NaN();
        nan_row[std::size_t(l.head_dim) - 2] = std::numeric_limits<float>::quiet_NaN();
        check_attention(l, nan_row);
    }
}

TEST_CASE("kv_layout: indexer keys decode to f16_round(E2M1 round trip), bitwise") {
    std::random_device rd;
    const unsigned seed = rd();
    INFO("seed " << seed);
    std::mt19937 g(seed);
    const indexer_row_layout l{128};
    for (int t = 0; t < 5000; ++t) check_indexer(l, random_row(g, l.dim, t % 2 == 0));
    const float edges[] = {0.0f, 6.0f, 3.0f, 1e-38f, 7.052966104933725e-38f, 65504.0f, 1e20f,
                           std::ldexp(1.0f, -24), std::ldexp(1.5f, -25)};
    for (float e : edges) check_indexer(l, std::vector<float>(std::size_t(l.dim), e));
}

TEST_CASE("kv_layout: re-encoding a stored row gives it back (compressor rows arrive stored)") {
    std::random_device rd;
    const unsigned seed = rd();
    INFO("seed " << seed);
    std::mt19937 g(seed);
    const attention_row_layout a{512, 64};
    const indexer_row_layout ix{128};
    std::vector<std::uint8_t> row(std::size_t(a.bytes()));
    std::vector<float> got(512);
    for (int t = 0; t < 3000; ++t) {
        std::vector<float> s = random_row(g, a.head_dim, true);
        ref::kv_row_as_stored(s.data(), a.head_dim, a.n_rot);
        encode_attention_row(a, s.data(), row.data());
        decode_attention_row(a, row.data(), got.data());
        for (int i = 0; i < a.head_dim; ++i) REQUIRE(same(got[std::size_t(i)], s[std::size_t(i)]));

        const std::vector<float> k = indexer_stored(random_row(g, ix.dim, true));
        encode_indexer_row(ix, k.data(), row.data());
        decode_indexer_row(ix, row.data(), got.data());
        for (int i = 0; i < ix.dim; ++i) REQUIRE(same(got[std::size_t(i)], k[std::size_t(i)]));
    }
    // The block max rounding down to 224 (half the grid max) lowers the exponent by one.
    std::vector<float> s(512, 1.0f);
    s[3] = 224.001f;
    ref::kv_row_as_stored(s.data(), 512, 64);
    CHECK(s[3] == 224.0f);
    encode_attention_row(a, s.data(), row.data());
    decode_attention_row(a, row.data(), got.data());
    for (int i = 0; i < 512; ++i) REQUIRE(same(got[std::size_t(i)], s[std::size_t(i)]));
}

TEST_CASE("kv_layout: page tables share pages and copy on write") {
    kv_page_pool pool(16, 4);
    kv_page_table a(pool);
    for (int i = 0; i < 10; ++i) a.row_for_write(i)[0] = std::uint8_t(i + 1);
    CHECK(pool.pages_in_use() == 3);
    {
        kv_page_table b = a.share();
        CHECK(pool.pages_in_use() == 3);
        CHECK(b.row(9)[0] == 10);
        b.row_for_write(9)[0] = 99;  // copies page 2 for b only
        CHECK(pool.pages_in_use() == 4);
        CHECK(a.row(9)[0] == 10);
        CHECK(b.row(9)[0] == 99);
        CHECK(b.row(8)[0] == 9);
        a.drop_before(8);  // pages 0 and 1 stay alive through b
        CHECK(pool.pages_in_use() == 4);
        CHECK_THROWS_AS(a.row(3), ds4::error);
        CHECK(b.row(3)[0] == 4);
    }
    CHECK(pool.pages_in_use() == 1);
    a.clear();
    CHECK(pool.pages_in_use() == 0);
}
