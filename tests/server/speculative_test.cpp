// The scheduler's speculative decoding (examples/server/scheduler.hpp) in-process on the tiny
// synthetic model and the CPU backend. The answers are compared with the same jobs decoded
// without drafts: token ids, log-probabilities (bitwise) and finish reasons must be equal, greedy
// and sampled. The random MTP head almost never re-predicts the sampled token, so most cases
// draft through a stand-in backend that forwards everything to the CPU backend and answers
// draft() from the plain run's answers (right, or wrong at chosen positions): that is what makes
// verify rows, partial acceptance and rollback happen. Prompt-lookup drafts (ngram_drafter.hpp)
// are checked on hand-worked token strings, then through the scheduler like the others.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "examples/server/ngram_drafter.hpp"
#include "tests/server/in_process.hpp"

namespace ds4::server {
namespace {

using namespace test;

// A backend that is the CPU backend except for its drafter: draft() returns the continuation of
// the plain run's answer whose tokens the sequence holds, with the drafts that `wrong` names
// (position of the draft, its index) replaced by another token.
class oracle_backend final : public engine::backend {
public:
    oracle_backend(engine::backend& inner, std::vector<std::vector<std::int32_t>> streams,
                   std::function<bool(std::int32_t, int)> wrong)
        : inner_(inner), streams_(std::move(streams)), wrong_(std::move(wrong)) {}

    const model::model_dims& dims() const override { return inner_.dims(); }
    engine::capabilities caps() const override {
        engine::capabilities c = inner_.caps();
        c.max_draft = 8;
        return c;
    }
    engine::memory_ledger memory() const override { return inner_.memory(); }
    std::uint64_t sequence_bytes(std::int32_t length) const override { return inner_.sequence_bytes(length); }
    engine::sequence_id create() override {
        const engine::sequence_id s = inner_.create();
        held_[s].clear();
        seed_[s] = -1;
        return s;
    }
    engine::sequence_id fork(engine::sequence_id source) override {
        const engine::sequence_id s = inner_.fork(source);
        held_[s] = held_.at(source);
        seed_[s] = seed_.at(source);
        return s;
    }
    void free(engine::sequence_id seq) override {
        inner_.free(seq);
        held_.erase(seq);
        seed_.erase(seq);
    }
    std::int32_t length(engine::sequence_id seq) const override { return inner_.length(seq); }
    void truncate(engine::sequence_id seq, std::int32_t length) override {
        inner_.truncate(seq, length);
        held_.at(seq).resize(std::size_t(length));
        if (seed_.at(seq) >= length) seed_[seq] = -1;
        ++truncations;
    }
    std::vector<std::byte> snapshot(engine::sequence_id seq) const override { return inner_.snapshot(seq); }
    void restore(engine::sequence_id, std::span<const std::byte>) override { FAIL("restore is not expected here"); }
    engine::step_ticket submit(const engine::step_request& step) override {
        const engine::step_ticket t = inner_.submit(step);
        for (const engine::row& r : step.rows) {
            std::vector<std::int32_t>& h = held_.at(r.seq);
            REQUIRE(std::size_t(r.pos) == h.size());
            h.push_back(r.token);
            // As the CPU backend: the drafter's state is that of the sequence's last row.
            seed_[r.seq] = step.keep_hc_state ? r.pos : -1;
        }
        return t;
    }
    engine::step_result wait(engine::step_ticket ticket) override { return inner_.wait(ticket); }
    std::vector<std::int32_t> draft(engine::sequence_id seq, std::int32_t n) override {
        REQUIRE(n >= 2);
        const std::vector<std::int32_t>& h = held_.at(seq);
        // The contract: drafts only from a kept state of the sequence's last position.
        REQUIRE(seed_.at(seq) == std::int32_t(h.size()) - 1);
        std::vector<std::int32_t> d;
        for (const auto& s : streams_) {
            if (s.size() < h.size() || !std::equal(h.begin(), h.end(), s.begin())) continue;
            for (std::int32_t k = 0; k < n; ++k) {
                const std::size_t at = h.size() + std::size_t(k);
                std::int32_t t = at < s.size() ? s[at] : 0;
                if (wrong_(std::int32_t(at), k)) t = (t + 1) % dims().n_vocab;
                d.push_back(t);
            }
            ++drafts;
            return d;
        }
        FAIL("draft for a sequence that follows no known answer");
        return d;
    }

    int drafts = 0, truncations = 0;

private:
    engine::backend& inner_;
    std::vector<std::vector<std::int32_t>> streams_;
    std::function<bool(std::int32_t, int)> wrong_;
    std::map<engine::sequence_id, std::vector<std::int32_t>> held_;
    std::map<engine::sequence_id, std::int32_t> seed_;  // position of the kept drafter state, -1 none
};

std::vector<std::vector<std::int32_t>> streams_of(const std::vector<answer>& as) {
    std::vector<std::vector<std::int32_t>> s;
    for (const answer& a : as) {
        s.push_back(a.prompt);
        s.back().insert(s.back().end(), a.tokens.begin(), a.tokens.end());
    }
    return s;
}

scheduler_options speculative(int n) {
    scheduler_options so = plain();
    so.spec_tokens = n;
    return so;
}

// A prefix cache that keeps short turns.
scheduler_options caching(scheduler_options so) {
    so.prefix_cache = 4;
    so.prefix_cache_min = 4;
    return so;
}

TEST_CASE("speculative decoding: drafts that are always right give the plain answers in fewer steps") {
    auto b = cpu_backend(false);
    scheduler_stats plain_stats, spec_stats;
    const std::vector<answer> want = serve(*b, plain(), mixed_requests(), &plain_stats);
    oracle_backend o(*b, streams_of(want), [](std::int32_t, int) { return false; });
    const std::vector<answer> got = serve(o, speculative(3), mixed_requests(), &spec_stats);
    require_same(got, want);
    CHECK(o.drafts > 0);
    CHECK(spec_stats.spec_tokens == 3);
    CHECK(spec_stats.spec_drafted > 0);
    CHECK(spec_stats.spec_accepted == spec_stats.spec_drafted);
    CHECK(o.truncations == 0);  // every verify row kept
    // Up to 4 tokens a step: the longest answer (31 tokens) takes about a quarter of its steps.
    CHECK(spec_stats.steps < plain_stats.steps / 2);
    CHECK(spec_stats.decode_tokens == plain_stats.decode_tokens);
}

TEST_CASE("speculative decoding with penalties: each verify row counts the drafts before it") {
    // Right drafts are all kept, so every verify row's sampled token is in the answer: a row
    // whose penalties missed the drafts fed before it would sample another token.
    auto b = cpu_backend(false);
    std::vector<controlled> reqs = uncontrolled(mixed_requests());
    reqs[0].c.frequency_penalty = 1.5f;
    reqs[1].c.presence_penalty = 2.0f;
    reqs[2].c.frequency_penalty = 0.7f;
    reqs[2].c.presence_penalty = 0.7f;
    const std::vector<answer> want = serve_controlled(*b, plain(), reqs);
    oracle_backend o(*b, streams_of(want), [](std::int32_t, int) { return false; });
    scheduler_stats st;
    const std::vector<answer> got = serve_controlled(o, speculative(3), reqs, &st);
    require_same(got, want);
    CHECK(st.spec_accepted == st.spec_drafted);
    CHECK(st.spec_accepted > 10);
}

TEST_CASE("speculative decoding: wrong drafts are rolled back and the answers stay the plain ones") {
    auto b = cpu_backend(false);
    const std::vector<answer> want = serve(*b, plain(), mixed_requests());
    // The first draft wrong (no verify rows that step) at every 5th position; a later draft wrong
    // (a partial accept, then a rollback) at others.
    oracle_backend o(*b, streams_of(want), [](std::int32_t at, int k) {
        return (k == 0 && at % 5 == 0) || (k == 2 && at % 3 == 0) || (k == 1 && at % 7 == 0);
    });
    scheduler_stats st;
    const std::vector<answer> got = serve(o, speculative(4), mixed_requests(), &st);
    require_same(got, want);
    CHECK(o.truncations > 0);
    CHECK(st.spec_accepted > 0);
    CHECK(st.spec_accepted < st.spec_drafted);
    // Each answer's timings report its own drafts; together they are the server's.
    int drafted = 0, accepted = 0;
    for (const answer& a : got) {
        CHECK(a.drafted > 0);
        CHECK(a.accepted <= a.drafted);
        drafted += a.drafted, accepted += a.accepted;
    }
    CHECK(std::uint64_t(drafted) == st.spec_drafted);
    CHECK(std::uint64_t(accepted) == st.spec_accepted);
}

TEST_CASE("speculative decoding: a turn that ends inside accepted drafts keeps exactly its tokens") {
    auto b = cpu_backend(false);
    // A budget that ends inside a verify run (7 = 1 + 3 + 3: the last step's drafts cut to fit).
    const request first{"Tell me about the weather in spring.", {}, {}, 7};
    const std::vector<answer> want = serve(*b, plain(), {first});
    REQUIRE(want[0].tokens.size() == 7);
    // The next turn starts with the whole first turn.
    request second;
    second.tokens = want[0].prompt;
    second.tokens.insert(second.tokens.end(), want[0].tokens.begin(), want[0].tokens.end());
    const std::vector<std::int32_t> more = tok().encode(" And in autumn?", false);
    second.tokens.insert(second.tokens.end(), more.begin(), more.end());
    second.max_tokens = 9;
    auto fresh = cpu_backend(false);
    const std::vector<answer> want2 = serve(*fresh, plain(), {second});

    std::vector<std::vector<std::int32_t>> streams = streams_of(want);
    streams.push_back(streams_of(want2)[0]);
    oracle_backend o(*b, streams, [](std::int32_t, int) { return false; });
    scheduler sched(o, tok(), caching(speculative(3)));
    const answer a = collect({submit(sched, first)})[0];
    CHECK(a.tokens == want[0].tokens);
    CHECK(a.reason == finish_reason::length);
    // The kept turn (prompt and answer but its last token) must be forked, so the rollback left it
    // at exactly that length; the second turn, drafted too, must equal a fresh prefill's answer.
    const answer cont = collect({submit(sched, second)})[0];
    CHECK(cont.cached == int(want[0].prompt.size() + want[0].tokens.size()) - 1);
    CHECK(cont.tokens == want2[0].tokens);
    CHECK(cont.logprobs == want2[0].logprobs);
    CHECK(sched.stats().spec_accepted > 0);
}

TEST_CASE("speculative decoding: a turn that stops inside accepted drafts keeps exactly its tokens") {
    // The forced answer (4 tokens of text, then EOS) ends at the 5th token of a step that verifies
    // 7 drafts, so the rows after the EOS must be rolled back before the turn is kept.
    scheduler_options forced = plain();
    forced.debug_forced_output = "Hi there.";
    REQUIRE(tok().encode(forced.debug_forced_output, true).size() == 4);
    auto b = cpu_backend(false);
    const request first{"What do you say?", {}, {}, 20};
    const std::vector<answer> want = serve(*b, forced, {first});
    REQUIRE(want[0].reason == finish_reason::stop);
    REQUIRE(want[0].tokens.size() == 4);
    request second;
    second.tokens = want[0].prompt;
    second.tokens.insert(second.tokens.end(), want[0].tokens.begin(), want[0].tokens.end());
    second.tokens.push_back(tok().eos_id());
    const std::vector<std::int32_t> more = tok().encode(" Again?", false);
    second.tokens.insert(second.tokens.end(), more.begin(), more.end());

    std::vector<std::vector<std::int32_t>> streams = streams_of(want);
    streams[0].push_back(tok().eos_id());
    streams.push_back(second.tokens);  // every forced answer is the same tokens
    streams.back().insert(streams.back().end(), want[0].tokens.begin(), want[0].tokens.end());
    streams.back().push_back(tok().eos_id());
    oracle_backend o(*b, streams, [](std::int32_t, int) { return false; });
    scheduler_options so = forced;
    so.spec_tokens = 7;
    scheduler sched(o, tok(), caching(so));
    const answer a = collect({submit(sched, first)})[0];
    CHECK(a.tokens == want[0].tokens);
    CHECK(a.reason == finish_reason::stop);
    CHECK(o.truncations > 0);
    // The kept turn is the prompt and the answer (EOS fed last is not in it).
    const answer cont = collect({submit(sched, second)})[0];
    CHECK(cont.cached == int(want[0].prompt.size() + want[0].tokens.size()));
}

TEST_CASE("speculative decoding: the MTP head drafts on the CPU backend and the answers stay the plain ones") {
    auto with = cpu_backend(true);
    auto without = cpu_backend(false);
    scheduler_stats st;
    const std::vector<answer> want = serve(*without, plain(), mixed_requests());
    const std::vector<answer> got = serve(*with, speculative(3), mixed_requests(), &st);
    require_same(got, want);
    CHECK(st.spec_tokens == 3);
    CHECK(st.spec_accepted <= st.spec_drafted);
}

TEST_CASE("speculative decoding: --spec-tokens against the backend's drafter") {
    auto with = cpu_backend(true);
    auto without = cpu_backend(false);
    const auto resolved = [](engine::backend& b, int n) {
        scheduler_options so = plain();
        so.spec_tokens = n;
        scheduler s(b, tok(), so);
        return s.stats().spec_tokens;
    };
    CHECK(resolved(*without, -1) == 0);
    CHECK(resolved(*with, -1) == 2);
    CHECK(resolved(*with, 0) == 0);
    CHECK(resolved(*with, 5) == 5);
    const auto message = [](engine::backend& b, int n) {
        scheduler_options so = plain();
        so.spec_tokens = n;
        return start_error(b, so);
    };
    CHECK(message(*without, 2).find("needs an MTP drafter (--mtp FILE)") != std::string::npos);
    CHECK(message(*with, 40).find("over the cpu backend's reach") != std::string::npos);
    CHECK(message(*with, -2).find("--spec-tokens must be >= 0") != std::string::npos);
}

TEST_CASE("prompt lookup: the continuation of the latest earlier occurrence of the longest match") {
    using v = std::vector<std::int32_t>;
    const auto draft = [](const v& prompt, const v& answer, int n_min, int n_max, int max) {
        ngram_drafter d(n_min, n_max);
        return d.draft(prompt, answer, max);
    };
    // [1 2 3] occurs at 0..2: what followed it, up to 3 tokens.
    CHECK(draft({1, 2, 3, 4, 5, 1, 2}, {3}, 2, 4, 3) == v{4, 5, 1});
    // The longest match wins: [5 1 2] (at 0..2, then 7) before [1 2] (latest at 4..5, then 8).
    CHECK(draft({5, 1, 2, 7, 1, 2, 8, 5, 1}, {2}, 2, 4, 3) == v{7, 1, 2});
    // With n_max 2 both match 2 tokens: the latest occurrence.
    CHECK(draft({5, 1, 2, 7, 1, 2, 8, 5, 1}, {2}, 2, 2, 3) == v{8, 5, 1});
    // No earlier occurrence of [9 9] or [3 9]... : nothing.
    CHECK(draft({1, 2, 3}, {9}, 2, 4, 3).empty());
    // n_min 1 takes a single repeated token.
    CHECK(draft({1, 2, 3}, {2}, 1, 4, 2) == v{3, 2});
    // The draft stops at the end of the text.
    CHECK(draft({1, 2, 3, 1}, {2}, 2, 4, 5) == v{3, 1, 2});
    // Overlapping occurrences: [4 4 4] ends earlier at 3.
    CHECK(draft({4, 4, 4}, {4}, 3, 3, 3) == v{4});
    // The walk is bounded (max_chain): [1 2] matches 2 tokens at 1..2, behind blocks [3 2 8] whose
    // 2 matches 1; within 256 links it is found, behind 300 blocks the latest 1-token match wins.
    const auto blocks = [](int k) {
        v p{5, 1, 2, 9};
        for (int i = 0; i < k; ++i) p.insert(p.end(), {3, 2, 8});
        return p;
    };
    static_assert(ngram_drafter::max_chain == 256);
    CHECK(draft(blocks(200), {1, 2}, 1, 4, 3) == v{9, 3, 2});
    CHECK(draft(blocks(300), {1, 2}, 1, 4, 3) == v{8, 1, 2});
    CHECK(draft({}, {}, 1, 4, 3).empty());
    CHECK(draft({7}, {}, 1, 4, 3).empty());
    // Incremental: the index grows with the answer and equals a fresh one's lookups.
    const v prompt{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3};
    const v answer{8, 3, 2, 7, 9, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6};
    ngram_drafter grown(1, 4);
    for (std::size_t k = 0; k <= answer.size(); ++k) {
        const v part(answer.begin(), answer.begin() + std::ptrdiff_t(k));
        CAPTURE(k);
        CHECK(grown.draft(prompt, part, 4) == draft(prompt, part, 1, 4, 4));
    }
    // Hand-checked: the text ends with [4 6 2 6], which occurs earlier only at 19..22 of the
    // prompt; after it come the prompt's 4 3 3, then the answer's first token 8.
    CHECK(draft(prompt, answer, 1, 4, 4) == v{4, 3, 3, 8});
    CHECK_THROWS_AS(ngram_drafter(0, 4), ds4::error);
    CHECK_THROWS_AS(ngram_drafter(3, 2), ds4::error);
}

scheduler_options lookup(int n, int n_min = 2) {
    scheduler_options so = plain();
    so.draft = draft_source::ngram;
    so.spec_tokens = n;
    so.ngram_min = n_min;
    return so;
}

TEST_CASE("speculative decoding: prompt-lookup drafts give the plain answers, greedy and sampled") {
    auto b = cpu_backend(false);
    const std::vector<answer> want = serve(*b, plain(), mixed_requests());
    scheduler_stats st;
    // n-grams of one token: some draft nearly every step, right or wrong.
    const std::vector<answer> got = serve(*b, lookup(3, 1), mixed_requests(), &st);
    require_same(got, want);
    CHECK(st.draft == draft_source::ngram);
    CHECK(st.spec_tokens == 3);
    CHECK(st.spec_drafted > 0);
    CHECK(st.spec_accepted <= st.spec_drafted);
}

TEST_CASE("speculative decoding: an answer that quotes its prompt is accepted from prompt-lookup drafts") {
    // The forced answer is a sentence the prompt holds: once two of its tokens are out, each step
    // drafts the next three from the prompt and all of them are kept.
    const std::string quote = "The quick brown fox jumps over the lazy dog, then it runs far away into the forest.";
    scheduler_options forced = plain();
    forced.debug_forced_output = quote;
    const request r{"Repeat this sentence exactly: " + quote + "\nNow repeat it:", {}, {}, 400};
    auto b = cpu_backend(false);
    scheduler_stats plain_st, st;
    const std::vector<answer> want = serve(*b, forced, {r}, &plain_st);
    scheduler_options so = lookup(3);
    so.debug_forced_output = quote;
    const std::vector<answer> got = serve(*b, so, {r}, &st);
    require_same(got, want);
    REQUIRE(want[0].reason == finish_reason::stop);
    CHECK(got[0].drafted > 0);
    CHECK(got[0].accepted >= got[0].drafted / 2);
    // Most of the answer came 4 tokens a step.
    CHECK(st.steps * 2 < plain_st.steps + 2);
}

TEST_CASE("speculative decoding: --draft against the backend") {
    auto with = cpu_backend(true);
    auto without = cpu_backend(false);
    const auto stats = [](engine::backend& b, draft_source d, int n) {
        scheduler_options so = plain();
        so.draft = d;
        so.spec_tokens = n;
        scheduler s(b, tok(), so);
        return s.stats();
    };
    CHECK(stats(*without, draft_source::ngram, -1).spec_tokens == 3);
    CHECK(stats(*without, draft_source::ngram, -1).draft == draft_source::ngram);
    CHECK(stats(*with, draft_source::ngram, 5).spec_tokens == 5);
    CHECK(stats(*with, draft_source::automatic, -1).draft == draft_source::mtp);
    CHECK(stats(*with, draft_source::off, -1).spec_tokens == 0);
    CHECK(stats(*with, draft_source::off, -1).draft == draft_source::off);
    const auto message = [](engine::backend& b, draft_source d, int n, int n_min = 2, int n_max = 4) {
        scheduler_options so = plain();
        so.draft = d;
        so.spec_tokens = n;
        so.ngram_min = n_min;
        so.ngram_max = n_max;
        return start_error(b, so);
    };
    CHECK(message(*without, draft_source::mtp, -1).find("--draft mtp needs an MTP drafter") != std::string::npos);
    CHECK(message(*without, draft_source::ngram, 40).find("over the cpu backend's rollback of 16") != std::string::npos);
    CHECK(message(*without, draft_source::ngram, 3, 3, 2).find("need 1 <= min <= max") != std::string::npos);
    CHECK(message(*without, draft_source::off, 2).find("with --draft off") != std::string::npos);
    CHECK(parse_draft_source("ngram") == draft_source::ngram);
    CHECK(parse_draft_source("auto") == draft_source::automatic);
    CHECK_THROWS_WITH_AS(parse_draft_source("medusa"), "--draft medusa: expected auto, mtp, ngram or off", ds4::error);
}

}  // namespace
}  // namespace ds4::server
