// The CPU engine on the tiny synthetic model (window 16, ratio-4 and ratio-16 compressors,
// indexer top_k 8): batch invariance (prefill chunking, other sequences in the call, thread
// count), snapshot/restore, position checks. 48 tokens cross the window, three ratio-16 and
// twelve ratio-4 emissions, and the indexer threshold (more than 8 ratio-4 rows from pos 35 on).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/model/shape.hpp"
#include "harness/synth/generator.hpp"
#include "reference/attention_decode.hpp"
#include "reference/compressor.hpp"
#include "reference/engine.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/indexer.hpp"
#include "reference/kv_store.hpp"
#include "reference/matvec.hpp"
#include "reference/moe.hpp"
#include "reference/norm_rope.hpp"
#include "reference/parallel.hpp"

using namespace ds4;
using namespace ds4::ref;

namespace {

constexpr int n_tokens = 48;

// One tiny model per test binary, generated in-process into a temp file.
cpu_engine& engine() {
    static const std::filesystem::path path = [] {
        const auto p = std::filesystem::temp_directory_path() /
                       ("ds4_engine_test_" + std::to_string(::getpid()) + ".gguf");
        synth::write_options opt;
        opt.seed = 1;
        synth::write_model(p, model::dims_of<model::tiny_shape>(), opt);
        return p;
    }();
    static std::unique_ptr<cpu_engine> e = [] {
        auto eng = cpu_engine::load(path);
        std::filesystem::remove(path);  // the mapping stays valid after unlink
        return eng;
    }();
    return *e;
}

std::vector<std::int32_t> random_tokens(unsigned seed, int n) {
    std::mt19937 g(seed);
    std::uniform_int_distribution<std::int32_t> pick(0, engine().dims().n_vocab - 1);
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    for (auto& v : t) v = pick(g);
    return t;
}

using logit_rows = std::vector<std::vector<float>>;

// Runs tokens[from, to) of `seq` in one call, logits for every row.
logit_rows run(sequence_id seq, const std::vector<std::int32_t>& tokens, int from, int to) {
    std::vector<forward_row> rows;
    for (int p = from; p < to; ++p) rows.push_back({seq, p, tokens[std::size_t(p)], true});
    const forward_result r = engine().forward(rows);
    logit_rows out;
    for (std::size_t i = 0; i < r.rows.size(); ++i)
        out.emplace_back(r.logits_of(i), r.logits_of(i) + r.n_vocab);
    return out;
}

logit_rows run_one_by_one(sequence_id seq, const std::vector<std::int32_t>& tokens, int from, int to) {
    logit_rows out;
    for (int p = from; p < to; ++p) out.push_back(run(seq, tokens, p, p + 1)[0]);
    return out;
}

bool bitwise_equal(const logit_rows& a, const logit_rows& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
            return false;
    return true;
}

// A reference run: a fresh sequence, all tokens one by one.
logit_rows solo(const std::vector<std::int32_t>& tokens) {
    const sequence_id s = engine().create_sequence();
    logit_rows out = run_one_by_one(s, tokens, 0, int(tokens.size()));
    engine().free_sequence(s);
    return out;
}

const unsigned base_seed = std::random_device{}();

}  // namespace

TEST_CASE("engine: logits are finite and informative") {
    INFO("seed " << base_seed);
    const auto tokens = random_tokens(base_seed, n_tokens);
    const logit_rows l = solo(tokens);
    for (const auto& row : l) {
        for (float v : row) REQUIRE(std::isfinite(v));
        bool differ = false;
        for (float v : row) differ = differ || v != row[0];
        CHECK(differ);
    }
    // Different histories give different logits at the last position.
    auto other = tokens;
    other[3] = (other[3] + 1) % engine().dims().n_vocab;
    CHECK(solo(other).back() != l.back());
}

TEST_CASE("engine: prefill in one call == one token per call, bitwise") {
    INFO("seed " << base_seed);
    const auto tokens = random_tokens(base_seed + 1, n_tokens);
    const logit_rows ref = solo(tokens);
    const sequence_id s = engine().create_sequence();
    CHECK(bitwise_equal(run(s, tokens, 0, n_tokens), ref));
    CHECK(engine().sequence_length(s) == n_tokens);
    engine().free_sequence(s);
    // Uneven chunks: 7, 13, 1, 27.
    const sequence_id c = engine().create_sequence();
    logit_rows chunked;
    for (auto [a, b] : {std::pair{0, 7}, {7, 20}, {20, 21}, {21, n_tokens}})
        for (auto& row : run(c, tokens, a, b)) chunked.push_back(row);
    CHECK(bitwise_equal(chunked, ref));
    engine().free_sequence(c);
}

TEST_CASE("engine: a sequence's logits do not depend on the other rows of the call") {
    INFO("seed " << base_seed);
    const auto ta = random_tokens(base_seed + 2, n_tokens);
    const auto tb = random_tokens(base_seed + 3, 40);
    const logit_rows ref_a = solo(ta), ref_b = solo(tb);

    cpu_engine& e = engine();
    const sequence_id a = e.create_sequence(), b = e.create_sequence();
    run(a, ta, 0, 20);  // a is decoding, b prefills, in one call, rows interleaved and shuffled
    std::vector<forward_row> rows;
    for (int p = 0; p < 40; ++p) rows.push_back({b, p, tb[std::size_t(p)], p % 3 == 0 || p == 39});
    for (int p = 20; p < 24; ++p) rows.push_back({a, p, ta[std::size_t(p)], true});
    std::shuffle(rows.begin(), rows.end(), std::mt19937(base_seed));
    const forward_result r = e.forward(rows);
    for (std::size_t i = 0; i < r.rows.size(); ++i) {
        const forward_row& row = rows[r.rows[i]];
        const auto& want = (row.seq == a ? ref_a : ref_b)[std::size_t(row.pos)];
        REQUIRE(std::memcmp(r.logits_of(i), want.data(), want.size() * sizeof(float)) == 0);
    }
    CHECK(r.rows.size() == 4 + 14);  // a: 20..23; b: 0, 3, ..., 39
    CHECK(bitwise_equal(run(a, ta, 24, n_tokens), logit_rows(ref_a.begin() + 24, ref_a.end())));
    e.free_sequence(a);
    e.free_sequence(b);
}

TEST_CASE("engine: 1 thread == 2 threads") {
    INFO("seed " << base_seed);
    const auto tokens = random_tokens(base_seed + 4, n_tokens);
    set_thread_count(1);
    const logit_rows one = solo(tokens);
    set_thread_count(2);
    const logit_rows two = solo(tokens);
    set_thread_count(0);
    CHECK(bitwise_equal(one, two));
}

TEST_CASE("engine: snapshot, restore and continue == an uninterrupted run") {
    INFO("seed " << base_seed);
    const auto tokens = random_tokens(base_seed + 5, n_tokens);
    const logit_rows ref = solo(tokens);
    cpu_engine& e = engine();
    const sequence_id s = e.create_sequence();
    run(s, tokens, 0, 37);  // past the indexer threshold, mid ratio-4 and ratio-16 windows
    const std::vector<std::byte> blob = e.snapshot(s);

    // Speculative rollback: continue with wrong tokens, restore, continue with the right ones.
    auto wrong = tokens;
    for (int p = 37; p < 42; ++p) wrong[std::size_t(p)] = (wrong[std::size_t(p)] + 7) % e.dims().n_vocab;
    run(s, wrong, 37, 42);
    e.restore(s, blob);
    CHECK(e.sequence_length(s) == 37);
    CHECK(bitwise_equal(run(s, tokens, 37, n_tokens), logit_rows(ref.begin() + 37, ref.end())));

    // Persistence: a fresh sequence from the blob.
    const sequence_id t = e.create_sequence();
    e.restore(t, blob);
    CHECK(bitwise_equal(run_one_by_one(t, tokens, 37, n_tokens), logit_rows(ref.begin() + 37, ref.end())));
    e.free_sequence(s);
    e.free_sequence(t);
}

TEST_CASE("engine: forked sequences share prefix pages and diverge independently") {
    INFO("seed " << base_seed);
    const auto tokens = random_tokens(base_seed + 6, n_tokens);
    auto other = tokens;
    for (int p = 30; p < n_tokens; ++p) other[std::size_t(p)] = (other[std::size_t(p)] + 3) % engine().dims().n_vocab;
    const logit_rows ref = solo(tokens), ref_other = solo(other);
    cpu_engine& e = engine();
    const sequence_id s = e.create_sequence();
    run(s, tokens, 0, 30);
    const std::size_t pages = e.attention_pages_in_use();
    const sequence_id f = e.fork_sequence(s);
    CHECK(e.attention_pages_in_use() == pages);
    CHECK(bitwise_equal(run(f, other, 30, n_tokens), logit_rows(ref_other.begin() + 30, ref_other.end())));
    CHECK(bitwise_equal(run(s, tokens, 30, n_tokens), logit_rows(ref.begin() + 30, ref.end())));
    e.free_sequence(s);
    e.free_sequence(f);
    CHECK(e.attention_pages_in_use() == 0);
    CHECK(e.indexer_pages_in_use() == 0);
}

TEST_CASE("engine: corrupted, truncated or foreign snapshots fail cleanly") {
    cpu_engine& e = engine();
    const auto tokens = random_tokens(base_seed + 7, 21);
    const sequence_id s = e.create_sequence();
    run(s, tokens, 0, 21);
    const std::vector<std::byte> blob = e.snapshot(s);
    const sequence_id t = e.create_sequence();
    run(t, tokens, 0, 3);

    auto flipped = blob;
    flipped[blob.size() / 2] ^= std::byte{0x10};
    CHECK_THROWS_WITH_AS(e.restore(t, flipped), doctest::Contains("checksum"), ds4::error);
    CHECK_THROWS_WITH_AS(e.restore(t, std::span(blob).first(blob.size() - 5)), doctest::Contains("payload"), ds4::error);
    CHECK_THROWS_WITH_AS(e.restore(t, std::span(blob).first(10)), doctest::Contains("header"), ds4::error);
    auto magic = blob;
    magic[0] = std::byte{'X'};
    CHECK_THROWS_WITH_AS(e.restore(t, magic), doctest::Contains("magic"), ds4::error);
    auto version = blob;
    version[8] = std::byte{99};
    CHECK_THROWS_WITH_AS(e.restore(t, version), doctest::Contains("version"), ds4::error);
    CHECK(e.sequence_length(t) == 3);  // untouched by the failed restores
    CHECK_THROWS_AS(e.restore(12345, blob), ds4::error);
    e.free_sequence(s);
    e.free_sequence(t);
}

TEST_CASE("engine: rows must continue each sequence contiguously") {
    cpu_engine& e = engine();
    const sequence_id s = e.create_sequence();
    const forward_row first{s, 0, 1, false};
    e.forward(std::span(&first, 1));
    const std::vector<forward_row> gap{{s, 2, 1, true}};
    CHECK_THROWS_WITH_AS(e.forward(gap), doctest::Contains(("sequence " + std::to_string(s) + " has length 1").c_str()), ds4::error);
    const std::vector<forward_row> repeat{{s, 1, 1, true}, {s, 1, 2, true}};
    CHECK_THROWS_WITH_AS(e.forward(repeat), doctest::Contains("positions 1, 1"), ds4::error);
    const std::vector<forward_row> bad_token{{s, 1, -4, true}};
    CHECK_THROWS_WITH_AS(e.forward(bad_token), doctest::Contains("token -4"), ds4::error);
    const std::vector<forward_row> unknown{{s + 100, 0, 1, true}};
    CHECK_THROWS_WITH_AS(e.forward(unknown), doctest::Contains("no sequence"), ds4::error);
    CHECK(e.sequence_length(s) == 1);
    // Out of order within the call is fine: rows are applied in position order.
    const std::vector<forward_row> swapped{{s, 2, 5, true}, {s, 1, 4, true}};
    const forward_result r = e.forward(swapped);
    CHECK(e.sequence_length(s) == 3);
    CHECK(r.rows.size() == 2);
    e.free_sequence(s);
}

namespace {

// The spec's own statement of a decode step (model.md §9) with ds4's F32 KV storage: stored rows
// are ref::kv_row_as_stored / the compressors' rows as floats, the indexer masks the full F32
// key cache, attention takes the mask. Written independently of the engine's paging and binding,
// so the engine's native-KV paged cache is checked against the simulated F32 cache it replaces.
class f32_simulation {
public:
    explicit f32_simulation(const cpu_engine& e) : f_(e.file()), d_(e.dims()) {
        for (int il = 0; il < d_.n_layer; ++il) {
            const int r = d_.ratio_of(il);
            layers_.push_back({{}, {}, {}, r ? make_compressor_state(r, d_.head_dim) : compressor_state{},
                               r == 4 ? make_compressor_state(4, 128) : compressor_state{}});
        }
    }

    std::vector<float> step(std::int32_t pos, std::int32_t token) {
        const int E = d_.n_embd, hd = d_.head_dim, H = d_.n_head;
        const auto up = std::uint32_t(pos);
        std::vector<float> X(sz(d_.hc_dim())), Y(X.size()), x(sz(E)), xn(x.size()), a(x.size());
        for (int h = 0; h < d_.n_hc; ++h)
            for (int i = 0; i < E; ++i) X[std::size_t(h * E + i)] = f16_to_f32(u16("token_embd.weight")[std::size_t(token) * std::size_t(E) + std::size_t(i)]);
        for (int il = 0; il < d_.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            const int r = d_.ratio_of(il);
            const rope_params rp = ds4_rope_params(r != 0);
            layer& L = layers_[std::size_t(il)];
            hc_split sp = hc_pre(X.data(), u16(p + "hc_attn_fn.weight"), f32(p + "hc_attn_scale.weight"),
                                 f32(p + "hc_attn_base.weight"), E, 4, 20, 1e-6f, 1e-6f, x.data());
            rms_norm(x.data(), f32(p + "attn_norm.weight"), E, 1e-6f, xn.data());
            std::vector<float> qr(sz(d_.n_lora_q)), qn(qr.size()), q(sz(H * hd)), kv(sz(hd));
            matvec_q8_0(q8(p + "attn_q_a.weight"), xn.data(), E, d_.n_lora_q, qr.data());
            rms_norm(qr.data(), f32(p + "attn_q_a_norm.weight"), d_.n_lora_q, 1e-6f, qn.data());
            matvec_q8_0(q8(p + "attn_q_b.weight"), qn.data(), d_.n_lora_q, H * hd, q.data());
            head_rms_norm(q.data(), H, hd, 1e-6f);
            matvec_q8_0(q8(p + "attn_kv.weight"), xn.data(), E, hd, kv.data());
            rms_norm(kv.data(), f32(p + "attn_kv_a_norm.weight"), hd, 1e-6f, kv.data());
            rope_tail(q.data(), H, hd, 64, rp, up, false);
            rope_tail(kv.data(), 1, hd, 64, rp, up, false);
            kv_row_as_stored(kv.data(), hd, 64);
            L.raw.insert(L.raw.end(), kv.begin(), kv.end());
            std::vector<float> row(sz(hd)), irow(128);
            if (r && compressor_step(L.cs, weights(p + "attn_compressor_"), xn.data(), E, up, rp, 64,
                                     compressed_row_kind::attention, 1e-6f, row.data()))
                L.comp.insert(L.comp.end(), row.begin(), row.end());
            if (r == 4 && compressor_step(L.is, weights(p + "indexer_compressor_"), xn.data(), E, up, rp, 64,
                                          compressed_row_kind::indexer, 1e-6f, irow.data()))
                L.keys.insert(L.keys.end(), irow.begin(), irow.end());
            const int n_comp = int(L.comp.size()) / hd;
            std::vector<std::uint8_t> mask;
            if (r == 4)
                mask = indexer_mask(u16(p + "indexer.attn_q_b.weight"), u16(p + "indexer.proj.weight"), qn.data(), xn.data(),
                                    L.keys.data(), n_comp, d_.n_lora_q, E, d_.n_indexer_head, d_.indexer_top_k, up, rp);
            const int n_raw = std::min(pos + 1, d_.n_swa);
            std::vector<float> o(q.size()), low(sz(d_.lora_o_total()));
            attention_decode(q.data(), L.raw.data() + (L.raw.size() - std::size_t(n_raw * hd)), n_raw, L.comp.data(), n_comp,
                             mask.empty() ? nullptr : mask.data(), f32(p + "attn_sinks.weight"), H, hd, 64, rp, up, o.data());
            const int gin = d_.group_in();
            for (int g = 0; g < d_.n_out_group; ++g)
                matvec_q8_0(q8(p + "attn_output_a.weight") + std::size_t(g * d_.n_lora_o * gin / 32),
                            o.data() + std::size_t(g * gin), gin, d_.n_lora_o, low.data() + std::size_t(g * d_.n_lora_o));
            matvec_q8_0(q8(p + "attn_output_b.weight"), low.data(), d_.lora_o_total(), E, a.data());
            hc_post(a.data(), X.data(), sp, E, 4, Y.data());
            X.swap(Y);

            sp = hc_pre(X.data(), u16(p + "hc_ffn_fn.weight"), f32(p + "hc_ffn_scale.weight"), f32(p + "hc_ffn_base.weight"),
                        E, 4, 20, 1e-6f, 1e-6f, x.data());
            rms_norm(x.data(), f32(p + "ffn_norm.weight"), E, 1e-6f, xn.data());
            std::vector<float> pr(sz(d_.n_expert)), sh(sz(E));
            router_probs(u16(p + "ffn_gate_inp.weight"), xn.data(), E, d_.n_expert, pr.data());
            const moe_route route =
                il < 3 ? route_hash(pr.data(), static_cast<const std::int32_t*>(data(p + "ffn_gate_tid2eid.weight")) + token * 6, 6, 1.5f)
                       : route_top_k(pr.data(), f_.find_tensor(p + "exp_probs_b.bias") ? f32(p + "exp_probs_b.bias") : nullptr,
                                     d_.n_expert, 6, 1.5f);
            moe_routed(static_cast<const iq2_xxs_block*>(data(p + "ffn_gate_exps.weight")),
                       static_cast<const iq2_xxs_block*>(data(p + "ffn_up_exps.weight")),
                       static_cast<const q2_k_block*>(data(p + "ffn_down_exps.weight")), route, xn.data(), E, d_.n_ff_exp,
                       10.0f, a.data());
            shared_expert(q8(p + "ffn_gate_shexp.weight"), q8(p + "ffn_up_shexp.weight"), q8(p + "ffn_down_shexp.weight"),
                          xn.data(), E, d_.n_ff_exp, 10.0f, sh.data());
            for (int i = 0; i < E; ++i) a[std::size_t(i)] += sh[std::size_t(i)];
            hc_post(a.data(), X.data(), sp, E, 4, Y.data());
            X.swap(Y);
        }
        std::vector<float> logits(sz(d_.n_vocab));
        output_hc_mix(X.data(), u16("output_hc_fn.weight"), f32("output_hc_scale.weight"), f32("output_hc_base.weight"), E, 4,
                      1e-6f, 1e-6f, x.data());
        rms_norm(x.data(), f32("output_norm.weight"), E, 1e-6f, x.data());
        matvec_q8_0(q8("output.weight"), x.data(), E, d_.n_vocab, logits.data());
        return logits;
    }

private:
    static std::size_t sz(int v) { return static_cast<std::size_t>(v); }
    struct layer {
        std::vector<float> raw, comp, keys;
        compressor_state cs, is;
    };
    const void* data(const std::string& n) const { return f_.tensor(n).data; }
    const float* f32(const std::string& n) const { return static_cast<const float*>(data(n)); }
    const std::uint16_t* u16(const std::string& n) const { return static_cast<const std::uint16_t*>(data(n)); }
    const q8_0_block* q8(const std::string& n) const { return static_cast<const q8_0_block*>(data(n)); }
    compressor_weights weights(const std::string& p) const {
        return {u16(p + "kv.weight"), u16(p + "gate.weight"), u16(p + "ape.weight"), f32(p + "norm.weight")};
    }

    const gguf::file& f_;
    const model::model_dims& d_;
    std::vector<layer> layers_;
};

}  // namespace

TEST_CASE("engine: native paged KV == the spec's F32-simulated cache, bitwise") {
    INFO("seed " << base_seed);
    const auto tokens = random_tokens(base_seed + 8, n_tokens);
    const logit_rows got = solo(tokens);
    f32_simulation sim(engine());
    for (int p = 0; p < n_tokens; ++p) {
        INFO("position " << p);
        const std::vector<float> want = sim.step(p, tokens[std::size_t(p)]);
        REQUIRE(std::memcmp(want.data(), got[std::size_t(p)].data(), want.size() * sizeof(float)) == 0);
    }
}
