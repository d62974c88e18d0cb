// The KV compressor (docs/model.md §2.5). The expected state is rebuilt in the test from the token
// history (which token's which half pools into row c), independently of the rolling state.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ds4/core/half.hpp"
#include "ds4/core/rope.hpp"
#include "reference/compressor.hpp"
#include "reference/indexer.hpp"
#include "reference/kv_store.hpp"
#include "reference/norm_rope.hpp"

using ds4::ref::compressed_row_kind;
using ds4::ref::compressor_state;

namespace {

struct token_proj {
    std::vector<float> kv, sc;
};

std::vector<token_proj> random_history(int n_tok, int width, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<token_proj> h(n_tok);
    for (auto& t : h) {
        t.kv.resize(width);
        t.sc.resize(width);
        for (auto& v : t.kv) v = g(rng);
        for (auto& v : t.sc) v = 2.0f * g(rng);
    }
    return h;
}

// The state that should be pooled for compressed row c, from the spec's reading: ratio 4 pools
// tokens 4c-4..4c-1 (first halves) and 4c..4c+3 (second halves); ratio r pools rc..rc+r-1.
compressor_state expected_state(const std::vector<token_proj>& h, int c, int ratio, int hd) {
    compressor_state st = ds4::ref::make_compressor_state(ratio, hd);
    const int w = st.width();
    auto put = [&](int row, int tok) {
        std::copy(h[tok].kv.begin(), h[tok].kv.end(), st.kv.begin() + row * w);
        std::copy(h[tok].sc.begin(), h[tok].sc.end(), st.score.begin() + row * w);
    };
    if (ratio == 4) {
        for (int i = 0; i < 4; ++i) {
            if (c > 0) put(i, 4 * c - 4 + i);
            put(4 + i, 4 * c + i);
        }
    } else {
        for (int i = 0; i < ratio; ++i) put(i, ratio * c + i);
    }
    return st;
}

// Naive per-channel softmax pooling over explicit candidate lists, in double.
std::vector<double> naive_pool(const std::vector<token_proj>& h, int c, int ratio, int hd) {
    std::vector<double> out(hd);
    for (int j = 0; j < hd; ++j) {
        std::vector<std::pair<double, double>> cand;  // (score, value)
        if (ratio == 4) {
            for (int i = 0; i < 4; ++i) {
                if (c > 0) cand.push_back({h[4 * c - 4 + i].sc[j], h[4 * c - 4 + i].kv[j]});
                cand.push_back({h[4 * c + i].sc[hd + j], h[4 * c + i].kv[hd + j]});
            }
        } else {
            for (int i = 0; i < ratio; ++i) cand.push_back({h[ratio * c + i].sc[j], h[ratio * c + i].kv[j]});
        }
        double mx = -1e300, num = 0, den = 0;
        for (auto& [s, v] : cand) mx = std::max(mx, s);
        for (auto& [s, v] : cand) {
            num += std::exp(s - mx) * v;
            den += std::exp(s - mx);
        }
        out[j] = num / den;
    }
    return out;
}

void run_emission_test(int ratio, int hd, compressed_row_kind kind, int n_tok) {
    const ds4::rope_params rp = ds4::ds4_rope_params(true);
    const int coff = ratio == 4 ? 2 : 1, w = coff * hd;
    const auto hist = random_history(n_tok, w, unsigned(ratio * 1000 + hd));
    std::vector<float> norm(hd);
    for (int i = 0; i < hd; ++i) norm[i] = 0.5f + 0.01f * i;
    compressor_state st = ds4::ref::make_compressor_state(ratio, hd);
    int emitted = 0;
    for (int pos = 0; pos < n_tok; ++pos) {
        std::vector<float> row(hd);
        const bool e = ds4::ref::compressor_update(st, hist[pos].kv.data(), hist[pos].sc.data(), norm.data(),
                                                   std::uint32_t(pos), rp, 64, kind, 1e-6f, row.data());
        CHECK(e == ((pos + 1) % ratio == 0));
        if (!e) continue;
        const int c = emitted++;
        // The same pipeline applied to the state rebuilt from the history, at position r*c.
        const compressor_state want_st = expected_state(hist, c, ratio, hd);
        std::vector<float> pooled(hd), want(hd);
        ds4::ref::compressor_pool(want_st, pooled.data());
        ds4::ref::rms_norm(pooled.data(), norm.data(), hd, 1e-6f, want.data());
        std::vector<float> tail_only(want);  // kept for the position check below
        ds4::ref::rope_tail(want.data(), 1, hd, 64, rp, std::uint32_t(ratio * c), false);
        if (kind == compressed_row_kind::attention) {
            ds4::ref::kv_row_as_stored(want.data(), hd, 64);
        } else {
            ds4::ref::indexer_qat(want.data());
            for (auto& v : want) v = ds4::f16_round(v);
        }
        CHECK(row == want);
        // Pooling against the naive double softmax.
        const auto naive = naive_pool(hist, c, ratio, hd);
        for (int j = 0; j < hd; ++j) CHECK(std::fabs(pooled[j] - naive[j]) <= 2e-6 * (1.0 + std::fabs(naive[j])));
        // The RoPE position is the window's first token: the emitting token's position gives
        // a different tail (attention rows keep their RoPE tail up to F16 rounding).
        if (kind == compressed_row_kind::attention && c > 0) {
            ds4::ref::rope_tail(tail_only.data(), 1, hd, 64, rp, std::uint32_t(pos), false);
            bool differs = false;
            for (int j = hd - 64; j < hd; ++j) differs |= ds4::f16_round(tail_only[j]) != row[j];
            CHECK(differs);
        }
    }
    CHECK(emitted == n_tok / ratio);
}

}  // namespace

TEST_CASE("ratio 4: a row every 4th token from 8 overlapping candidates, RoPE at 4c") {
    run_emission_test(4, 128, compressed_row_kind::attention, 21);
    run_emission_test(4, 512, compressed_row_kind::attention, 13);
    run_emission_test(4, 128, compressed_row_kind::indexer, 17);
}

TEST_CASE("generic ratios 8 and 128") {
    run_emission_test(8, 128, compressed_row_kind::attention, 35);
    run_emission_test(128, 128, compressed_row_kind::attention, 260);
}

TEST_CASE("first ratio-4 row: the -1e30 previous candidates get zero weight") {
    const int hd = 64;
    compressor_state st = ds4::ref::make_compressor_state(4, hd);
    const auto hist = random_history(4, 2 * hd, 99);
    for (int pos = 0; pos < 4; ++pos) {
        std::copy(hist[pos].kv.begin(), hist[pos].kv.end(), st.kv.begin() + (4 + pos) * 2 * hd);
        std::copy(hist[pos].sc.begin(), hist[pos].sc.end(), st.score.begin() + (4 + pos) * 2 * hd);
    }
    std::vector<float> pooled(hd);
    ds4::ref::compressor_pool(st, pooled.data());
    for (int j = 0; j < hd; ++j) {
        double mx = -1e300, num = 0, den = 0;
        for (int i = 0; i < 4; ++i) mx = std::max(mx, double(hist[i].sc[hd + j]));
        for (int i = 0; i < 4; ++i) {
            num += std::exp(hist[i].sc[hd + j] - mx) * hist[i].kv[hd + j];
            den += std::exp(hist[i].sc[hd + j] - mx);
        }
        CHECK(pooled[j] == doctest::Approx(num / den).epsilon(2e-6));
    }
    // An all-initial state pools to exactly 0 (max score <= -0.5e30).
    const compressor_state fresh = ds4::ref::make_compressor_state(4, hd);
    ds4::ref::compressor_pool(fresh, pooled.data());
    for (float v : pooled) CHECK(v == 0.0f);
}

TEST_CASE("projection adds the APE row of pos % ratio") {
    const int n_embd = 40, hd = 16, ratio = 4, w = 2 * hd;
    std::mt19937 rng(4);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<std::uint16_t> wkv(n_embd * w), wg(n_embd * w), ape(w * ratio);
    for (auto& v : wkv) v = ds4::f32_to_f16(0.1f * g(rng));
    for (auto& v : wg) v = ds4::f32_to_f16(0.1f * g(rng));
    for (auto& v : ape) v = ds4::f32_to_f16(g(rng));
    std::vector<float> xn(n_embd), kvp(w), sc(w);
    for (auto& v : xn) v = g(rng);
    const ds4::ref::compressor_weights cw{wkv.data(), wg.data(), ape.data(), nullptr};
    ds4::ref::compressor_project(cw, xn.data(), n_embd, w, ratio, 6, kvp.data(), sc.data());
    for (int j = 0; j < w; ++j) {
        double k = 0, s = 0;
        for (int i = 0; i < n_embd; ++i) {
            k += double(ds4::f16_to_f32(wkv[j * n_embd + i])) * xn[i];
            s += double(ds4::f16_to_f32(wg[j * n_embd + i])) * xn[i];
        }
        s += ds4::f16_to_f32(ape[(6 % ratio) * w + j]);
        CHECK(kvp[j] == doctest::Approx(k).epsilon(1e-5));
        CHECK(sc[j] == doctest::Approx(s).epsilon(1e-5));
    }
}
