#pragma once
// The conformance suite of the engine contract (ds4/engine/backend.hpp), one set of test cases
// for every backend. A backend's test file defines a fixture type and instantiates the suite:
//
//   struct my_fixture {
//       static engine::backend& backend();          // one backend on the tiny model, shared
//       static void set_parallelism(int workers);   // threads, streams, ...: must not change a bit
//   };
//   TEST_CASE_TEMPLATE_INVOKE(backend_conformance, my_fixture);
//
// Every comparison is bitwise: logits as bytes, sampled tokens and log-probabilities exactly.
// The tiny model's 48 tokens cross the window (16), three ratio-16 and twelve ratio-4
// compressor emissions and the indexer threshold (more than 8 ratio-4 rows from position 35).
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/engine/backend.hpp"

namespace ds4::conformance {

using engine::output;
using engine::sequence_id;

inline constexpr int n_tokens = 48;

inline std::vector<std::int32_t> random_tokens(const engine::backend& b, unsigned seed, int n) {
    std::mt19937 g(seed);
    std::uniform_int_distribution<std::int32_t> pick(0, b.dims().n_vocab - 1);
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    for (auto& v : t) v = pick(g);
    return t;
}

using logit_rows = std::vector<std::vector<float>>;

// tokens[from, to) of `seq` in one step, full logits for every row.
inline logit_rows run(engine::backend& b, sequence_id seq, const std::vector<std::int32_t>& tokens, int from, int to) {
    std::vector<engine::row> rows;
    for (int p = from; p < to; ++p) rows.push_back({seq, p, tokens[std::size_t(p)], output::logits});
    const std::vector<engine::sampler> samplers(rows.size());
    const engine::step_result r = b.run({rows, samplers, false});
    REQUIRE(r.logits_rows.size() == rows.size());
    logit_rows out;
    for (std::size_t i = 0; i < r.logits_rows.size(); ++i) {
        const auto l = r.logits_of(i);
        out.emplace_back(l.begin(), l.end());
    }
    return out;
}

inline logit_rows run_one_by_one(engine::backend& b, sequence_id seq, const std::vector<std::int32_t>& tokens, int from,
                                 int to) {
    logit_rows out;
    for (int p = from; p < to; ++p) out.push_back(run(b, seq, tokens, p, p + 1)[0]);
    return out;
}

inline bool bitwise_equal(const logit_rows& a, const logit_rows& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
            return false;
    return true;
}

// The oracle of every case: a fresh sequence, all tokens one step each.
inline logit_rows solo(engine::backend& b, const std::vector<std::int32_t>& tokens) {
    const sequence_id s = b.create();
    logit_rows out = run_one_by_one(b, s, tokens, 0, int(tokens.size()));
    b.free(s);
    return out;
}

// Fresh per run; DS4_TEST_SEED (the "seed" a failure prints) replays a failing run's inputs.
inline unsigned suite_seed() {
    static const unsigned s = [] {
        const char* e = std::getenv("DS4_TEST_SEED");
        if (e == nullptr) return unsigned(std::random_device{}());
        char* end = nullptr;
        errno = 0;
        const unsigned long v = std::strtoul(e, &end, 0);
        require(end != e && *end == '\0' && errno == 0 && v <= 0xffffffffUL,
                std::string("DS4_TEST_SEED '") + e + "' is not an unsigned 32-bit number");
        return unsigned(v);
    }();
    return s;
}

// log-softmax in double from the returned logits: an independent statement of the logprobs.
inline double log_softmax(const std::vector<float>& l, std::int32_t token) {
    double m = l[0];
    for (float v : l) m = std::max(m, double(v));
    double s = 0.0;
    for (float v : l) s += std::exp(double(v) - m);
    return double(l[std::size_t(token)]) - m - std::log(s);
}

TEST_CASE_TEMPLATE_DEFINE("conformance", F, backend_conformance) {
    engine::backend& b = F::backend();
    const unsigned seed = suite_seed();
    INFO("seed " << seed);
    const engine::memory_ledger at_start = b.memory();

    SUBCASE("prefill of N rows in one step == N single-row steps, bitwise") {
        const auto tokens = random_tokens(b, seed + 1, n_tokens);
        const logit_rows want = solo(b, tokens);
        for (int chunk : {n_tokens, 7, 16}) {
            CAPTURE(chunk);
            const sequence_id s = b.create();
            logit_rows got;
            for (int p = 0; p < n_tokens; p += chunk) {
                const logit_rows part = run(b, s, tokens, p, std::min(p + chunk, n_tokens));
                got.insert(got.end(), part.begin(), part.end());
            }
            CHECK(bitwise_equal(got, want));
            b.free(s);
        }
    }

    SUBCASE("a prompt prefilled without outputs == single-row steps, bitwise (logits and KV snapshot)") {
        // Rows that want no output are what a backend may batch most aggressively (the CUDA
        // backend's prefill chunks; its conformance fixture makes them 256 rows, so 300 rows
        // cross a chunk and 40 fit in one).
        const int ctx = b.dims().context_length, max_rows = b.caps().max_rows_per_step;
        for (const int n : {40, 300}) {
            if ((ctx != 0 && n > ctx) || n > max_rows) continue;
            CAPTURE(n);
            const auto tokens = random_tokens(b, seed + 11 + unsigned(n), n);
            // The oracle: every row its own step, the last one's logits.
            const sequence_id s1 = b.create();
            std::vector<float> want_last;
            for (int p = 0; p < n; ++p) {
                const engine::row row{s1, p, tokens[std::size_t(p)], p == n - 1 ? output::logits : output::none};
                const engine::step_result r =
                    b.run({std::vector<engine::row>{row}, std::vector<engine::sampler>(p == n - 1 ? 1 : 0), false});
                if (p == n - 1) {
                    REQUIRE(r.logits_rows.size() == 1);
                    want_last.assign(r.logits_of(0).begin(), r.logits_of(0).end());
                }
            }
            // One step: n - 1 rows without output, then the last with logits.
            const sequence_id s2 = b.create();
            std::vector<engine::row> rows;
            for (int p = 0; p < n; ++p)
                rows.push_back({s2, p, tokens[std::size_t(p)], p == n - 1 ? output::logits : output::none});
            const engine::step_result r = b.run({rows, std::vector<engine::sampler>(1), false});
            REQUIRE(r.logits_rows.size() == 1);
            const auto got = r.logits_of(0);
            REQUIRE(got.size() == want_last.size());
            CHECK(std::memcmp(got.data(), want_last.data(), want_last.size() * sizeof(float)) == 0);
            CHECK(b.snapshot(s1) == b.snapshot(s2));
            b.free(s1);
            b.free(s2);
        }
    }

    SUBCASE("truncate into a prompt prefilled without outputs == its rows computed with outputs") {
        // Rows within max_rollback of the end of a step's rows save the frontier each starts from
        // as they run (the CUDA backend: inside the compressor launches of its prefill chunks);
        // truncating into them must leave the state their own steps would have. Sequence u's
        // five rows ride in the same step, every one of them saving (its first row's save made
        // before the step).
        const int ctx = b.dims().context_length, max_rows = b.caps().max_rows_per_step;
        const int max_back = std::min(b.caps().max_rollback, 16);
        REQUIRE(max_back > 0);
        const int m = 12;
        const auto tokens_u = random_tokens(b, seed + 20, m);
        const sequence_id ou = b.create();
        const logit_rows want_u = run(b, ou, tokens_u, 0, m);
        b.free(ou);
        for (const int n : {40, 300}) {
            if ((ctx != 0 && n > ctx) || n + 5 > max_rows) continue;
            CAPTURE(n);
            const auto tokens = random_tokens(b, seed + 21 + unsigned(n), n);
            const sequence_id o = b.create();
            const logit_rows want = run(b, o, tokens, 0, n);
            b.free(o);
            for (const int cut : {n - max_back, n - (max_back + 1) / 2, n - 1}) {
                CAPTURE(cut);
                const sequence_id s = b.create(), u = b.create();
                std::vector<engine::row> rows;
                for (int p = 0; p < n; ++p) rows.push_back({s, p, tokens[std::size_t(p)], output::none});
                for (int p = 0; p < 5; ++p) rows.push_back({u, p, tokens_u[std::size_t(p)], output::none});
                b.run({rows, {}, false});
                b.truncate(s, cut);
                b.truncate(u, 2);
                REQUIRE(b.length(s) == cut);
                CHECK(bitwise_equal(run(b, s, tokens, cut, n), logit_rows(want.begin() + cut, want.end())));
                CHECK(bitwise_equal(run(b, u, tokens_u, 2, m), logit_rows(want_u.begin() + 2, want_u.end())));
                b.free(s);
                b.free(u);
            }
        }
    }

    SUBCASE("a sequence's outputs do not depend on the other rows of the step") {
        const auto ta = random_tokens(b, seed + 2, n_tokens), tb = random_tokens(b, seed + 3, n_tokens);
        const logit_rows want_a = solo(b, ta), want_b = solo(b, tb);
        const sequence_id a = b.create(), c = b.create();
        // b's rows interleaved with a's, in reversed order within the step, a 5-row chunk at a time.
        logit_rows got_a(static_cast<std::size_t>(n_tokens)), got_b(static_cast<std::size_t>(n_tokens));
        for (int p = 0; p < n_tokens; p += 5) {
            std::vector<engine::row> rows;
            for (int q = std::min(p + 5, n_tokens) - 1; q >= p; --q) {
                rows.push_back({c, q, tb[std::size_t(q)], output::logits});
                rows.push_back({a, q, ta[std::size_t(q)], output::logits});
            }
            const std::vector<engine::sampler> samplers(rows.size());
            const engine::step_result r = b.run({rows, samplers, false});
            REQUIRE(r.logits_rows.size() == rows.size());
            for (std::size_t i = 0; i < r.logits_rows.size(); ++i) {
                const engine::row& row = rows[r.logits_rows[i]];
                const auto l = r.logits_of(i);
                (row.seq == a ? got_a : got_b)[std::size_t(row.pos)].assign(l.begin(), l.end());
            }
        }
        CHECK(bitwise_equal(got_a, want_a));
        CHECK(bitwise_equal(got_b, want_b));
        b.free(a);
        b.free(c);
    }

    SUBCASE("parallelism does not change a bit") {
        const auto tokens = random_tokens(b, seed + 4, n_tokens);
        F::set_parallelism(1);
        const logit_rows one = solo(b, tokens);
        F::set_parallelism(2);
        const logit_rows two = solo(b, tokens);
        F::set_parallelism(0);
        CHECK(bitwise_equal(one, two));
    }

    SUBCASE("fork shares the prefix and copies on write") {
        const auto tokens = random_tokens(b, seed + 5, n_tokens);
        auto other = tokens;
        for (int p = 30; p < n_tokens; ++p) other[std::size_t(p)] = (other[std::size_t(p)] + 7) % b.dims().n_vocab;
        const logit_rows want = solo(b, tokens), want_other = solo(b, other);
        const sequence_id s = b.create();
        run(b, s, tokens, 0, 30);
        const std::uint64_t before_fork = b.memory().kv_used;
        const sequence_id f = b.fork(s);
        CHECK(b.length(f) == 30);
        CHECK(b.memory().kv_used == before_fork);  // shared pages count once
        const logit_rows got_other = run(b, f, other, 30, n_tokens);
        const logit_rows got = run(b, s, tokens, 30, n_tokens);
        CHECK(bitwise_equal(got, logit_rows(want.begin() + 30, want.end())));
        CHECK(bitwise_equal(got_other, logit_rows(want_other.begin() + 30, want_other.end())));
        b.free(s);
        b.free(f);
    }

    SUBCASE("truncate == restoring a snapshot taken at that length") {
        const int max_back = std::min(b.caps().max_rollback, 9);
        REQUIRE(max_back > 0);
        const auto tokens = random_tokens(b, seed + 6, n_tokens);
        auto spec = tokens;
        for (auto& t : spec) t = (t + 3) % b.dims().n_vocab;
        const logit_rows full = solo(b, tokens);
        // cut + max_back <= n_tokens: the speculative rows read spec[cut .. cut + max_back).
        for (int cut : {20, 35, n_tokens - max_back}) {
            CAPTURE(cut);
            const sequence_id s = b.create();
            run(b, s, tokens, 0, cut);
            const std::vector<std::byte> blob = b.snapshot(s);
            // Speculative rows, rolled back.
            run(b, s, spec, cut, cut + max_back);
            b.truncate(s, cut);
            CHECK(b.length(s) == cut);
            CHECK(b.snapshot(s) == blob);
            const logit_rows after_truncate = run(b, s, tokens, cut, n_tokens);
            const sequence_id r = b.create();
            b.restore(r, blob);
            CHECK(b.length(r) == cut);
            const logit_rows after_restore = run(b, r, tokens, cut, n_tokens);
            CHECK(bitwise_equal(after_truncate, after_restore));
            CHECK(bitwise_equal(after_truncate, logit_rows(full.begin() + cut, full.end())));
            b.free(s);
            b.free(r);
        }
    }

    SUBCASE("errors change nothing") {
        const auto tokens = random_tokens(b, seed + 7, n_tokens);
        const logit_rows want = solo(b, tokens);
        const sequence_id s = b.create(), t = b.create();
        run(b, s, tokens, 0, 20);
        run(b, t, tokens, 0, 3);
        const std::vector<std::byte> blob = b.snapshot(s);
        const engine::sampler greedy{};
        auto bad_step = [&](std::vector<engine::row> rows, std::vector<engine::sampler> samplers, const char* what) {
            CAPTURE(what);
            CHECK_THROWS_AS(b.submit({rows, samplers, false}), ds4::error);
        };
        // A valid row of s before each bad one: the whole step must be refused.
        bad_step({{s, 20, tokens[20], output::logits}, {t, 4, 1, output::logits}}, {greedy, greedy}, "gap");
        bad_step({{s, 20, tokens[20], output::none}, {t, 3, -4, output::none}}, {}, "token");
        bad_step({{s, 20, tokens[20], output::none}, {t, 3, b.dims().n_vocab, output::none}}, {}, "token past vocab");
        bad_step({{s, 20, tokens[20], output::none}, {s, 20, tokens[20], output::none}}, {}, "repeat");
        bad_step({{s, 20, tokens[20], output::none}, {t + s + 1000, 0, 1, output::none}}, {}, "unknown sequence");
        bad_step({{s, 20, tokens[20], output::sample}}, {}, "missing sampler");
        bad_step({{s, 20, tokens[20], output::sample}}, {{-1.0f, 1.0f, 0.0f, 0, 0, 0}}, "negative temperature");
        bad_step({{s, 20, tokens[20], output::sample}}, {{1.0f, 1.5f, 0.0f, 0, 0, 0}}, "top_p");
        bad_step({{s, 20, tokens[20], output::sample}}, {{1.0f, 1.0f, 0.0f, 0, 0, engine::max_logprobs + 1}}, "n_logprobs");
        CHECK_THROWS_AS(b.truncate(s, 21), ds4::error);
        CHECK_THROWS_AS(b.truncate(s, -1), ds4::error);
        CHECK_THROWS_AS(b.truncate(s, 20 - b.caps().max_rollback - 1), ds4::error);
        auto flipped = blob;
        flipped[blob.size() / 2] ^= std::byte{0x10};
        CHECK_THROWS_WITH_AS(b.restore(t, flipped), doctest::Contains("checksum"), ds4::error);
        CHECK_THROWS_WITH_AS(b.restore(t, std::span(blob).first(blob.size() - 5)), doctest::Contains("payload"), ds4::error);
        CHECK_THROWS_WITH_AS(b.restore(t, std::span(blob).first(10)), doctest::Contains("header"), ds4::error);
        auto magic = blob;
        magic[0] = std::byte{'X'};
        CHECK_THROWS_WITH_AS(b.restore(t, magic), doctest::Contains("magic"), ds4::error);
        auto version = blob;
        version[8] = std::byte{99};
        CHECK_THROWS_WITH_AS(b.restore(t, version), doctest::Contains("version"), ds4::error);
        CHECK_THROWS_AS(b.restore(t + s + 1000, blob), ds4::error);
        CHECK_THROWS_AS(b.wait({987654321}), ds4::error);
        CHECK(b.length(s) == 20);
        CHECK(b.length(t) == 3);
        const logit_rows got = run(b, s, tokens, 20, n_tokens);
        CHECK(bitwise_equal(got, logit_rows(want.begin() + 20, want.end())));
        b.free(s);
        b.free(t);
        CHECK_THROWS_AS(b.free(s), ds4::error);
    }

    SUBCASE("sampling: greedy is the argmax, a seed gives the same tokens in any batch, logprobs are the model's") {
        const auto tokens = random_tokens(b, seed + 8, 24);
        const engine::sampler hot{0.9f, 0.95f, 0.02f, 40, 1234, 5};
        auto sample_all = [&](int companions) {
            const sequence_id s = b.create();
            std::vector<sequence_id> others;
            for (int c = 0; c < companions; ++c) others.push_back(b.create());
            std::vector<engine::sampled> got;
            logit_rows logits;
            for (int p = 0; p < 24; ++p) {
                std::vector<engine::row> rows;
                std::vector<engine::sampler> samplers;
                for (sequence_id o : others) {
                    rows.push_back({o, p, tokens[std::size_t(23 - p)], output::sample});
                    samplers.push_back({0.7f, 1.0f, 0.0f, 0, 99, 0});
                }
                rows.push_back({s, p, tokens[std::size_t(p)], output::logits});
                samplers.push_back(hot);
                const engine::step_result r = b.run({rows, samplers, false});
                REQUIRE(r.outputs.size() == rows.size());
                REQUIRE(r.logits_rows.size() == 1);
                got.push_back(r.outputs.back());
                const auto l = r.logits_of(0);
                logits.emplace_back(l.begin(), l.end());
            }
            b.free(s);
            for (sequence_id o : others) b.free(o);
            return std::make_pair(got, logits);
        };
        const auto [alone, logits] = sample_all(0);
        const auto [crowd, logits_crowd] = sample_all(3);
        CHECK(bitwise_equal(logits, logits_crowd));
        REQUIRE(alone.size() == crowd.size());
        for (std::size_t i = 0; i < alone.size(); ++i) {
            CAPTURE(i);
            CHECK(alone[i].token == crowd[i].token);
            CHECK(std::memcmp(&alone[i].logprob, &crowd[i].logprob, sizeof(float)) == 0);
            REQUIRE(alone[i].top.size() == 5);
            CHECK(std::abs(double(alone[i].logprob) - log_softmax(logits[i], alone[i].token)) < 1e-4);
            for (std::size_t k = 0; k < alone[i].top.size(); ++k) {
                const auto& tk = alone[i].top[k];
                CHECK(std::abs(double(tk.logprob) - log_softmax(logits[i], tk.token)) < 1e-4);
                if (k > 0) CHECK(logits[i][std::size_t(alone[i].top[k - 1].token)] >= logits[i][std::size_t(tk.token)]);
            }
            // The sampled token is within the top-k filter of 40.
            int above = 0;
            for (float v : logits[i]) above += v > logits[i][std::size_t(alone[i].token)];
            CHECK(above < 40);
        }
        // Greedy: the first maximum of the logits.
        const sequence_id g = b.create();
        for (int p = 0; p < 24; ++p) {
            const engine::row row{g, p, tokens[std::size_t(p)], output::logits};
            const engine::sampler greedy{};
            const engine::step_result r = b.run({std::span(&row, 1), std::span(&greedy, 1), false});
            const auto l = r.logits_of(0);
            const auto first_max = std::max_element(l.begin(), l.end()) - l.begin();
            CHECK(r.outputs[0].token == first_max);
        }
        b.free(g);
    }

    SUBCASE("sampler adjustments: logit + delta, and the draw and log-probabilities from the adjusted logits") {
        const auto tokens = random_tokens(b, seed + 10, 6);
        const std::vector<float> l = solo(b, tokens).back();
        const auto first_max = [](const std::vector<float>& v) { return std::int32_t(std::max_element(v.begin(), v.end()) - v.begin()); };
        const std::int32_t top = first_max(l), lift = top == 7 ? 8 : 7;
        // The maximum down by 50, another token lifted 1 past it, a third moved by an odd amount.
        const std::vector<engine::logit_adjust> adjust{{top, -50.0f}, {lift, (l[std::size_t(top)] - l[std::size_t(lift)]) + 1.0f},
                                                       {3, 0.3125f}};
        std::vector<float> want = l;
        for (const engine::logit_adjust& a : adjust) want[std::size_t(a.token)] = want[std::size_t(a.token)] + a.delta;
        auto adjusted_step = [&](std::span<const engine::logit_adjust> adj) {
            const sequence_id s = b.create();
            run(b, s, tokens, 0, int(tokens.size()) - 1);
            const engine::row row{s, std::int32_t(tokens.size()) - 1, tokens.back(), output::logits};
            engine::sampler greedy{};
            greedy.n_logprobs = 3;
            greedy.adjust = adj;
            std::optional<engine::step_result> r;
            std::string error;
            try {
                r = b.run({std::span(&row, 1), std::span(&greedy, 1), false});
            } catch (const ds4::error& e) {
                error = e.what();
            }
            const std::int32_t length = b.length(s);
            b.free(s);
            return std::make_tuple(r, error, length);
        };
        if (!b.caps().logit_adjust) {
            const auto [r, error, length] = adjusted_step(adjust);
            CHECK(error.find("does not apply logit adjustments") != std::string::npos);
            CHECK(length == std::int32_t(tokens.size()) - 1);
            return;
        }
        const auto [r, error, length] = adjusted_step(adjust);
        REQUIRE(r.has_value());
        const auto got = r->logits_of(0);
        CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
        CHECK(r->outputs[0].token == lift);
        CHECK(r->outputs[0].token == first_max(want));
        CHECK(std::abs(double(r->outputs[0].logprob) - log_softmax(want, lift)) < 1e-4);
        REQUIRE(r->outputs[0].top.size() == 3);
        CHECK(r->outputs[0].top[0].token == lift);
        for (const engine::token_logprob& t : r->outputs[0].top) CHECK(t.token != top);
        // Refused, naming why, and nothing changes: a token outside the vocabulary, one adjusted
        // twice, a delta that is not finite.
        const std::int32_t n_vocab = b.dims().n_vocab;
        for (const auto& [bad, why] : std::vector<std::pair<std::vector<engine::logit_adjust>, std::string>>{
                 {{{n_vocab, 1.0f}}, "outside the vocabulary"},
                 {{{5, 1.0f}, {9, 2.0f}, {5, -1.0f}}, "adjusted more than once"},
                 {{{5, std::nanf("")}}, "not finite"}}) {
            CAPTURE(why);
            const auto [rb, eb, lb] = adjusted_step(bad);
            CHECK(!rb.has_value());
            CHECK(eb.find(why) != std::string::npos);
            CHECK(lb == std::int32_t(tokens.size()) - 1);
        }
    }

    SUBCASE("submit, then wait: tickets are independent and waited once") {
        const auto tokens = random_tokens(b, seed + 9, 8);
        const logit_rows want = solo(b, tokens);
        const sequence_id s = b.create();
        const engine::sampler greedy{};
        std::vector<engine::step_ticket> tickets;
        std::vector<engine::row> rows(8);
        for (int p = 0; p < 8; ++p) {
            rows[std::size_t(p)] = {s, p, tokens[std::size_t(p)], output::logits};
            if (int(tickets.size()) >= b.caps().max_in_flight) {
                const engine::step_result r = b.wait(tickets.front());
                tickets.erase(tickets.begin());
                (void)r;
            }
            tickets.push_back(b.submit({std::span(&rows[std::size_t(p)], 1), std::span(&greedy, 1), false}));
        }
        for (auto t : tickets) b.wait(t);
        CHECK_THROWS_AS(b.wait(tickets.back()), ds4::error);
        CHECK(b.length(s) == 8);
        b.free(s);
    }

    // Every case frees what it made: the pools are back where they started.
    const engine::memory_ledger at_end = b.memory();
    CHECK(at_end.kv_pages_used == at_start.kv_pages_used);
    CHECK(at_end.sequences == at_start.sequences);
}

}  // namespace ds4::conformance
