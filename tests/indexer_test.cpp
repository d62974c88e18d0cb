// The indexer (docs/model.md §2.6): activation threshold, tie rule, Hadamard against the explicit
// Sylvester matrix, and the score formula against double; the int8 tensor-core path's arithmetic
// (kernels/indexer_int8.hpp) against the reference bitwise, wherever its preconditions hold.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/kernels/indexer_int8.hpp"
#include "ds4/model/kv_layout.hpp"
#include "reference/indexer.hpp"

TEST_CASE("hadamard128 equals the 128x128 Sylvester matrix times 1/sqrt(128)") {
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(128);
    for (auto& v : x) v = g(rng);
    std::vector<float> y = x;
    ds4::ref::hadamard128(y.data());
    for (int i = 0; i < 128; ++i) {
        double want = 0, mag = 0;
        for (int j = 0; j < 128; ++j) {
            const double h = (std::popcount(unsigned(i & j)) & 1) ? -1.0 : 1.0;
            want += h * x[j];
            mag += std::fabs(x[j]);
        }
        want /= std::sqrt(128.0);
        CHECK(std::fabs(y[i] - want) <= 1e-6 * mag);
    }
}

TEST_CASE("top-k: equal scores go to the lower index") {
    const float s[6] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, 0.5f};
    CHECK(ds4::ref::indexer_top_k(s, 6, 2) == std::vector<int>{1, 2});
    CHECK(ds4::ref::indexer_top_k(s, 6, 4) == std::vector<int>{1, 2, 4, 3});
    // Against the spec's repeated strict-> selection on many ties.
    std::mt19937 rng(2);
    std::uniform_int_distribution<int> u(0, 9);
    std::vector<float> sc(300);
    for (auto& v : sc) v = float(u(rng));
    std::vector<int> naive;
    std::vector<bool> taken(sc.size());
    for (int t = 0; t < 37; ++t) {
        int best = -1;
        for (int c = 0; c < int(sc.size()); ++c)
            if (!taken[c] && (best < 0 || sc[c] > sc[best])) best = c;
        taken[best] = true;
        naive.push_back(best);
    }
    CHECK(ds4::ref::indexer_top_k(sc.data(), int(sc.size()), 37) == naive);
}

TEST_CASE("the indexer switches on at top_k + 1 compressed rows") {
    const int n_lora_q = 32, n_embd = 64, n_head = 2, top_k = 5;
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<std::uint16_t> q_b(n_lora_q * n_head * 128), proj(n_embd * n_head);
    for (auto& v : q_b) v = ds4::f32_to_f16(0.2f * g(rng));
    for (auto& v : proj) v = ds4::f32_to_f16(0.2f * g(rng));
    std::vector<float> qn(n_lora_q), xn(n_embd), keys(7 * 128);
    for (auto& v : qn) v = g(rng);
    for (auto& v : xn) v = g(rng);
    for (auto& v : keys) v = g(rng);
    const auto rp = ds4::ds4_rope_params(true);
    CHECK(ds4::ref::indexer_mask(q_b.data(), proj.data(), qn.data(), xn.data(), keys.data(), top_k, n_lora_q,
                                 n_embd, n_head, top_k, 100, rp)
              .empty());
    const auto m = ds4::ref::indexer_mask(q_b.data(), proj.data(), qn.data(), xn.data(), keys.data(), top_k + 1,
                                          n_lora_q, n_embd, n_head, top_k, 100, rp);
    REQUIRE(m.size() == std::size_t(top_k + 1));
    int on = 0;
    for (auto b : m) on += b;
    CHECK(on == top_k);
}

TEST_CASE("scores: sum over heads of w_h * relu(k . q_h)") {
    const int n_head = 5, n_comp = 9;
    std::mt19937 rng(4);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> q(n_head * 128), w(n_head), keys(n_comp * 128), s(n_comp);
    for (auto& v : q) v = g(rng);
    for (auto& v : w) v = g(rng);
    for (auto& v : keys) v = g(rng);
    ds4::ref::indexer_scores(q.data(), w.data(), n_head, keys.data(), n_comp, s.data());
    for (int c = 0; c < n_comp; ++c) {
        double want = 0, mag = 0;
        for (int h = 0; h < n_head; ++h) {
            double d = 0, dm = 0;
            for (int i = 0; i < 128; ++i) {
                d += double(keys[c * 128 + i]) * q[h * 128 + i];
                dm += std::fabs(double(keys[c * 128 + i]) * q[h * 128 + i]);
            }
            want += std::max(0.0, d) * w[h];
            mag += dm * std::fabs(w[h]);
        }
        CHECK(std::fabs(s[c] - want) <= 1e-5 * mag);
    }
}

TEST_CASE("QAT output lies on the E2M1 grid of each 32-block") {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> x(128);
    for (auto& v : x) v = g(rng);
    ds4::ref::indexer_qat(x.data());
    for (int b = 0; b < 128; b += 32) {
        float amax = 0;
        for (int i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        // Values are k/2 * 2^e on the grid {0,.5,1,1.5,2,3,4,6}: at most 8 distinct magnitudes.
        std::vector<float> mags;
        for (int i = b; i < b + 32; ++i)
            if (std::find(mags.begin(), mags.end(), std::fabs(x[i])) == mags.end()) mags.push_back(std::fabs(x[i]));
        CHECK(mags.size() <= 8);
        CHECK(amax > 0.0f);
    }
}

// ---- The int8 tensor-core path's arithmetic (kernels/indexer_int8.hpp), on the CPU ----

namespace {

using ds4::kernels::indexer_int8_bias;
using ds4::kernels::indexer_int8_bias_value;

const ds4::model::indexer_row_layout key_layout{128};

std::uint32_t word_at(const std::uint8_t* p) {
    return std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) | (std::uint32_t(p[3]) << 24);
}

// K8 of a stored row through the byte-permute tables (the kernel's conversion), natural order.
void key_operands(const std::uint8_t* row, const ds4::kernels::indexer_key_int8& km, int* k8) {
    for (int b = 0; b < 4; ++b) {
        const auto tb = ds4::kernels::indexer_int8_table_for((km.shifts >> (2 * b)) & 3u);
        for (int s = 0; s < 4; ++s) {
            std::uint32_t lo, hi;
            ds4::kernels::indexer_codes_to_int8(word_at(row + 16 * b + 4 * s), tb, lo, hi);
            for (int i = 0; i < 4; ++i) {
                k8[32 * b + 8 * s + i] = std::int8_t(std::uint8_t(lo >> (8 * i)));
                k8[32 * b + 8 * s + 4 + i] = std::int8_t(std::uint8_t(hi >> (8 * i)));
            }
        }
    }
}

// One prepared query head as the prepare kernel builds it: E2M1 codes and block exponents of the
// (already Hadamard-rotated) vector y, the float values the reference sees, and the int8 form.
struct query_head {
    std::vector<float> q = std::vector<float>(128);
    std::vector<int> q8 = std::vector<int>(128);
    ds4::kernels::indexer_query_int8 m;
};

query_head make_head(const float* y, float w) {
    query_head h;
    int e[4];
    unsigned nz = 0;
    std::uint8_t code[128];
    for (int b = 0; b < 4; ++b) {
        e[b] = ds4::e2m1_block_scale_exp(y + 32 * b, 32);
        for (int i = 32 * b; i < 32 * b + 32; ++i) {
            code[i] = ds4::e2m1_encode_scaled(y[i], ds4::exp2i(-e[b]));
            h.q[i] = ds4::mul_rn(ds4::e2m1_decode(code[i]), ds4::exp2i(e[b]));
            if (code[i] & 7u) nz |= 1u << b;
        }
    }
    h.m = ds4::kernels::indexer_query_int8_of(e, nz, w);
    for (int i = 0; i < 128; ++i) h.q8[i] = ds4::kernels::indexer_int8_value(code[i], e[i / 32] - h.m.eqmin);
    return h;
}

// The kernel's float operations on the int8 path: false when the key's precondition fails.
bool int8_score(const std::uint8_t* row, const std::vector<query_head>& heads, float& out) {
    const auto km = ds4::kernels::indexer_key_int8_of(ds4::kernels::indexer_row_exponents(row),
                                                      ds4::kernels::indexer_row_nonzero_blocks(row));
    if (!km.exact) return false;
    int k8[128];
    key_operands(row, km, k8);
    float s = 0.0f;
    for (const auto& h : heads) {
        std::int32_t acc = indexer_int8_bias;
        for (int i = 0; i < 128; ++i) acc += k8[i] * h.q8[i];
        s = ds4::add_rn(s, ds4::kernels::indexer_int8_product(acc, h.m.w8, ds4::mul_rn(h.m.w8, -indexer_int8_bias_value)));
    }
    out = ds4::mul_rn(s, ds4::exp2i(km.ekmin));
    return true;
}

// Key rows of several kinds: compressor-like (Hadamard + F16 + E2M1 of a Gaussian at some scale),
// raw codes under chosen block exponents, zero blocks, all-zero rows.
void make_key(std::mt19937& rng, int kind, std::uint8_t* row) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_int_distribution<int> u(0, 1 << 30);
    if (kind == 0) {
        std::vector<float> x(128);
        const float scale = ds4::exp2i(u(rng) % 24 - 14);
        for (auto& v : x) v = g(rng) * scale;
        ds4::ref::hadamard128(x.data());
        for (auto& v : x) v = ds4::f16_round(v);
        ds4::model::encode_indexer_row(key_layout, x.data(), row);
        return;
    }
    for (int i = 0; i < 64; ++i) row[i] = std::uint8_t(byte(rng));
    for (int i = 64; i < 80; ++i) row[i] = 0;
    const int base = kind == 1 ? -8 + u(rng) % 6 : -26 + u(rng) % 42;  // 2: around the F16 edges
    const int spread = kind == 3 ? 6 : 4;                             // 3: shifts past 3 too
    for (int b = 0; b < 4; ++b) row[64 + b] = std::uint8_t(std::int8_t(base + u(rng) % spread));
    if (kind == 4) {  // zero blocks (+0 and -0 codes) with arbitrary exponents
        for (int b = 0; b < 4; ++b)
            if (u(rng) % 2) {
                for (int i = 16 * b; i < 16 * b + 16; ++i) row[i] &= 0x88u;
                row[64 + b] = std::uint8_t(std::int8_t(u(rng) % 256 - 128));
            }
    }
    if (kind == 5) {  // all zero
        for (int i = 0; i < 64; ++i) row[i] &= 0x88u;
        row[64] = std::uint8_t(std::int8_t(-126));
    }
}

}  // namespace

TEST_CASE("int8 operands: the byte-permute tables give sign * doubled magnitude << shift") {
    std::mt19937 rng(6);
    for (unsigned shift = 0; shift < 4; ++shift) {
        const auto tb = ds4::kernels::indexer_int8_table_for(shift);
        for (int trial = 0; trial < 20000; ++trial) {
            std::uint32_t w = rng();
            if (trial < 16) w = 0x11111111u * unsigned(trial);  // every code in every nibble
            std::uint32_t lo, hi;
            ds4::kernels::indexer_codes_to_int8(w, tb, lo, hi);
            for (int i = 0; i < 8; ++i) {
                const unsigned code = (w >> (4 * i)) & 15u;
                const int got = std::int8_t(std::uint8_t((i < 4 ? lo : hi) >> (8 * (i % 4))));
                REQUIRE(got == ds4::kernels::indexer_int8_value(code, int(shift)));
                // Against the format: doubled E2M1 value, times 2^shift.
                CHECK(float(got) == 2.0f * ds4::e2m1_decode(std::uint8_t(code)) * float(1 << shift));
            }
        }
    }
}

TEST_CASE("int8 key precondition: F16 leaves code * 2^e unchanged exactly for e in [-23, 13]") {
    for (int e = -30; e <= 20; ++e) {
        bool all_exact = true;
        for (unsigned c = 1; c < 16; ++c) {
            if ((c & 7u) == 0) continue;
            const float v = ds4::mul_rn(ds4::e2m1_decode(std::uint8_t(c)), ds4::exp2i(e));
            all_exact = all_exact && ds4::f16_round(v) == v;
        }
        CHECK(all_exact == (e >= ds4::kernels::indexer_int8_key_exp_lo && e <= ds4::kernels::indexer_int8_key_exp_hi));
    }
}

TEST_CASE("int8 key operands: K8 * 2^(ekmin - 1) equals decode_indexer_row wherever the precondition holds") {
    std::mt19937 rng(7);
    std::uint8_t row[80];
    int exact = 0, total = 0;
    std::vector<float> v(128);
    for (int trial = 0; trial < 6000; ++trial) {
        make_key(rng, trial % 6, row);
        const auto km = ds4::kernels::indexer_key_int8_of(ds4::kernels::indexer_row_exponents(row),
                                                          ds4::kernels::indexer_row_nonzero_blocks(row));
        ++total;
        if (!km.exact) continue;
        ++exact;
        int k8[128];
        key_operands(row, km, k8);
        ds4::model::decode_indexer_row(key_layout, row, v.data());
        for (int i = 0; i < 128; ++i) {
            REQUIRE(std::abs(k8[i]) <= 96);
            REQUIRE(std::bit_cast<std::uint32_t>(float(k8[i]) * ds4::exp2i(km.ekmin - 1)) ==
                    std::bit_cast<std::uint32_t>(v[i] == 0.0f ? 0.0f : v[i]));  // -0 codes decode to -0
        }
    }
    CHECK(exact > total / 3);
    CHECK(exact < total);
}

TEST_CASE("int8 scores equal ref::indexer_scores bitwise wherever the preconditions hold") {
    std::mt19937 rng(8);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int n_head = 64, n_comp = 600;
    std::vector<std::uint8_t> rows(std::size_t(n_comp) * 80);
    std::vector<float> keys(std::size_t(n_comp) * 128), scores(n_comp);
    for (int c = 0; c < n_comp; ++c) {
        make_key(rng, c % 6, rows.data() + std::size_t(c) * 80);
        ds4::model::decode_indexer_row(key_layout, rows.data() + std::size_t(c) * 80, keys.data() + std::size_t(c) * 128);
    }
    // Query sets: 0 normal; 1-5 edge heads that keep the int8 path (zero blocks, zero head,
    // zero weights, scales 2^80 and 2^-80); 6-11 one head that fails it (block spread, weight
    // below 2^-103 or above 2^86 in integer units, exponent below -124 or above 95).
    int fast_sets = 0, fast_keys = 0, slow_keys = 0;
    for (int set = 0; set < 12; ++set) {
        std::vector<query_head> heads;
        std::vector<float> q(std::size_t(n_head) * 128), w(n_head), y(128);
        for (int h = 0; h < n_head; ++h) {
            for (auto& v : y) v = 0.5f * g(rng);
            ds4::ref::hadamard128(y.data());
            float wh = g(rng) / std::sqrt(float(128 * n_head));
            const bool edge = h % 9 == set % 9;
            if (edge && set == 1) for (int i = 32; i < 96; ++i) y[i] = (i % 3) ? 0.0f : -0.0f;
            if (edge && set == 2) for (auto& v : y) v = 0.0f;
            if (edge && set == 3) wh = h % 2 ? 0.0f : -0.0f;
            if (edge && set == 4) for (auto& v : y) v *= ds4::exp2i(80);
            if (edge && set == 5) for (auto& v : y) v *= ds4::exp2i(-80);
            if (h == 17 && set == 6) for (int i = 0; i < 32; ++i) y[i] *= 64.0f;
            if (h == 17 && set == 7) wh = 1e-36f;
            if (h == 17 && set == 8) wh = 3e30f;
            if (h == 17 && set == 9) for (auto& v : y) v *= ds4::exp2i(-126);
            if (h == 17 && set == 10) for (auto& v : y) v *= ds4::exp2i(100);
            if (h == 17 && set == 11) wh = ds4::exp2i(-60);  // with 2^-40 scale: below 2^-103
            if (h == 17 && set == 11) for (auto& v : y) v *= ds4::exp2i(-40);
            if (h == 18 && set == 11) wh = ds4::exp2i(-149);  // w8 rounds to 0: not a zero weight
            heads.push_back(make_head(y.data(), wh));
            std::copy(heads.back().q.begin(), heads.back().q.end(), q.begin() + h * 128);
            w[h] = wh;
            // The prepare kernel's q is the reference's QAT round trip.
            std::vector<float> r(y);
            for (int b = 0; b < 128; b += 32) ds4::e2m1_block_roundtrip(r.data() + b, 32);
            for (int i = 0; i < 128; ++i)
                REQUIRE(std::bit_cast<std::uint32_t>(r[i]) == std::bit_cast<std::uint32_t>(heads.back().q[i]));
        }
        bool seq_exact = true;
        for (const auto& h : heads) seq_exact = seq_exact && h.m.exact;
        if (set == 11) CHECK(!heads[18].m.exact);
        INFO("set " << set);
        CHECK(seq_exact == (set < 6));
        if (!seq_exact) continue;
        ++fast_sets;
        ds4::ref::indexer_scores(q.data(), w.data(), n_head, keys.data(), n_comp, scores.data());
        for (int c = 0; c < n_comp; ++c) {
            float s;
            if (!int8_score(rows.data() + std::size_t(c) * 80, heads, s)) {
                ++slow_keys;
                continue;
            }
            ++fast_keys;
            INFO("set " << set << " key " << c << " kind " << c % 6);
            REQUIRE(std::bit_cast<std::uint32_t>(s) == std::bit_cast<std::uint32_t>(scores[c]));
        }
    }
    CHECK(fast_sets == 6);
    CHECK(fast_keys > slow_keys);
    CHECK(slow_keys > 0);
}

TEST_CASE("int8 scores at the precondition's edges: products at 2^-149, scores near 2^126") {
    std::mt19937 rng(9);
    std::uniform_int_distribution<int> byte(0, 255), pick(0, 15);
    const int n_head = 64, n_comp = 200;
    for (const int low : {1, 0}) {
        // Query blocks at eqmin..eqmin+3 with eqmin at its bound, keys at the key bounds, weights at
        // the edge of the integer-unit range.
        const int eqmin = low ? ds4::kernels::indexer_int8_query_exp_lo : ds4::kernels::indexer_int8_query_exp_hi;
        const int ek0 = low ? ds4::kernels::indexer_int8_key_exp_lo : ds4::kernels::indexer_int8_key_exp_hi - 3;
        const float wmag = low ? 1.5f * ds4::exp2i(23) : ds4::exp2i(-8);
        std::vector<query_head> heads;
        std::vector<float> q(std::size_t(n_head) * 128), w(n_head), y(128);
        for (int h = 0; h < n_head; ++h) {
            for (int i = 0; i < 128; ++i) {
                const int b = i / 32;
                y[i] = ds4::mul_rn(ds4::e2m1_decode(std::uint8_t(i % 32 == 0 ? 7 : pick(rng))), ds4::exp2i(eqmin + (b + h) % 4));
            }
            w[h] = (h % 3 == 0 ? -wmag : wmag) * (1.0f + float(h) / 128.0f);
            heads.push_back(make_head(y.data(), w[h]));
            REQUIRE(heads.back().m.exact);
            REQUIRE(heads.back().m.eqmin == eqmin);
            std::copy(heads.back().q.begin(), heads.back().q.end(), q.begin() + h * 128);
        }
        std::vector<std::uint8_t> rows(std::size_t(n_comp) * 80, 0);
        std::vector<float> keys(std::size_t(n_comp) * 128), scores(n_comp);
        for (int c = 0; c < n_comp; ++c) {
            std::uint8_t* row = rows.data() + std::size_t(c) * 80;
            for (int i = 0; i < 64; ++i) row[i] = std::uint8_t(byte(rng));
            for (int b = 0; b < 4; ++b) row[64 + b] = std::uint8_t(std::int8_t(ek0 + (b + c) % 4));
            ds4::model::decode_indexer_row(key_layout, row, keys.data() + std::size_t(c) * 128);
        }
        ds4::ref::indexer_scores(q.data(), w.data(), n_head, keys.data(), n_comp, scores.data());
        int nonzero = 0;
        for (int c = 0; c < n_comp; ++c) {
            float s;
            REQUIRE(int8_score(rows.data() + std::size_t(c) * 80, heads, s));
            INFO("low " << low << " key " << c);
            REQUIRE(std::isfinite(scores[c]));
            REQUIRE(std::bit_cast<std::uint32_t>(s) == std::bit_cast<std::uint32_t>(scores[c]));
            nonzero += scores[c] != 0.0f;
        }
        CHECK(nonzero > n_comp / 2);
    }
}

TEST_CASE("int8 key meta word: the kernel's precondition equals indexer_key_int8_of") {
    std::mt19937 rng(10);
    std::uniform_int_distribution<int> u(0, 1 << 30);
    int exact = 0;
    for (int trial = 0; trial < 200000; ++trial) {
        // Exponents near the bounds and spreads around 3, every nonzero mask, random bytes too.
        std::uint32_t ex = 0;
        const int base = trial % 4 == 0 ? u(rng) % 256 - 128 : -30 + u(rng) % 50;
        for (int b = 0; b < 4; ++b) {
            const int e = trial % 4 == 0 ? u(rng) % 256 - 128 : base + u(rng) % 6;
            ex |= std::uint32_t(std::uint8_t(std::int8_t(std::clamp(e, -128, 127)))) << (8 * b);
        }
        const unsigned nz = unsigned(trial % 16);
        const auto k = ds4::kernels::indexer_key_int8_of(ex, nz);
        const unsigned m = ds4::kernels::indexer_key_meta_of(ex, nz);
        INFO("exponents " << ex << " mask " << nz);
        REQUIRE(ds4::kernels::indexer_meta_exact(m) == k.exact);
        if (!k.exact) continue;
        ++exact;
        REQUIRE(ds4::kernels::indexer_meta_ekmin(m) == k.ekmin);
        for (int b = 0; b < 4; ++b)
            if ((nz >> b) & 1u) REQUIRE(ds4::kernels::indexer_meta_shift(m, b) == ((k.shifts >> (2 * b)) & 3u));
    }
    CHECK(exact > 10000);
}

TEST_CASE("int8 product rows: the chunk permutation is a bijection and both access patterns are conflict-free") {
    using ds4::kernels::indexer_prod_chunk_pos;
    constexpr int stride = 68;  // indexer_int8_prod_stride (kernels/indexer.cuh)
    std::vector<int> seen(16, 0);
    for (int c = 0; c < 16; ++c) ++seen[indexer_prod_chunk_pos(c)];
    for (int c = 0; c < 16; ++c) CHECK(seen[c] == 1);
    std::vector<int> heads(64, 0);
    for (int h = 0; h < 64; ++h) ++heads[ds4::kernels::indexer_prod_offset(h)];
    for (int h = 0; h < 64; ++h) CHECK(heads[h] == 1);
    // A 16-byte access of a quarter-warp (8 lanes) is one wavefront when the 8 lanes' 16-byte
    // bank groups ((float offset / 4) mod 8) differ.
    auto groups_distinct = [](const int* off) {
        unsigned m = 0;
        for (int l = 0; l < 8; ++l) m |= 1u << ((off[l] / 4) % 8);
        return m == 0xffu;
    };
    // Stores: lane (g, t) writes key 8j + 2t + kk, chunk 2g + q.
    for (int j = 0; j < 4; ++j)
        for (int kk = 0; kk < 2; ++kk)
            for (int q = 0; q < 2; ++q)
                for (int quarter = 0; quarter < 4; ++quarter) {
                    int off[8];
                    for (int l = 0; l < 8; ++l) {
                        const int lane = 8 * quarter + l, g = lane >> 2, t = lane & 3;
                        off[l] = (8 * j + 2 * t + kk) * stride + 4 * indexer_prod_chunk_pos(2 * g + q);
                        REQUIRE(off[l] % 4 == 0);
                    }
                    CHECK(groups_distinct(off));
                }
    // Loads: lane k reads chunk c of key k.
    for (int c = 0; c < 16; ++c)
        for (int quarter = 0; quarter < 4; ++quarter) {
            int off[8];
            for (int l = 0; l < 8; ++l) off[l] = (8 * quarter + l) * stride + 4 * indexer_prod_chunk_pos(c);
            CHECK(groups_distinct(off));
        }
    // The mma lanes cover each key's 64 heads exactly once: lane (g, t) holds heads 8g + 2i + hr
    // (m-tile i, row g + 8hr) of keys 2t + kk, stored as chunk 2g + q, element 2(i - 2q) + hr.
    for (int key = 0; key < 8; ++key) {
        std::vector<int> got(64, -1);
        for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            for (int kk = 0; kk < 2; ++kk) {
                if (2 * t + kk != key) continue;
                for (int q = 0; q < 2; ++q)
                    for (int e = 0; e < 4; ++e) {
                        const int i = 2 * q + e / 2, hr = e % 2, head = 8 * g + 2 * i + hr;
                        const int pos = 4 * indexer_prod_chunk_pos(2 * g + q) + e;
                        REQUIRE(got[pos] == -1);
                        got[pos] = head;
                    }
            }
        }
        for (int h = 0; h < 64; ++h) CHECK(got[ds4::kernels::indexer_prod_offset(h)] == h);
    }
}
