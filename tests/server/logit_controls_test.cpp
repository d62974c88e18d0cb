// OpenAI's logit_bias, frequency_penalty and presence_penalty through the scheduler
// (examples/server/scheduler.cpp turns them into each output row's sampler::adjust), in-process on
// the tiny synthetic model and the CPU backend. The greedy answers are checked against an
// independent decode loop that applies the penalties to the returned logits itself; speculative
// verify rows (prompt lookup) must count the drafts before them, so the answers with drafts equal
// the answers without.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "tests/server/in_process.hpp"

namespace ds4::server {
namespace {

using namespace test;

// Greedy decoding by hand: each step returns the logits, the penalties over the tokens generated
// so far are subtracted here (logit - (frequency x count + presence)), the first maximum is fed.
std::vector<std::int32_t> penalised_greedy(engine::backend& b, const std::vector<std::int32_t>& prompt, float frequency,
                                           float presence, int max_tokens) {
    const engine::sequence_id s = b.create();
    std::vector<engine::row> rows;
    for (std::size_t p = 0; p < prompt.size(); ++p)
        rows.push_back({s, std::int32_t(p), prompt[p], p + 1 == prompt.size() ? engine::output::logits : engine::output::none});
    std::vector<std::int32_t> out;
    std::map<std::int32_t, int> count;
    for (int k = 0; k < max_tokens; ++k) {
        const engine::sampler greedy{};
        const engine::step_result r = b.run({rows, std::span(&greedy, 1), false});
        const auto l = r.logits_of(0);
        std::vector<float> e(l.begin(), l.end());
        for (const auto& [t, c] : count) e[std::size_t(t)] = e[std::size_t(t)] - (frequency * float(c) + presence);
        const std::int32_t t = std::int32_t(std::max_element(e.begin(), e.end()) - e.begin());
        if (t == tok().eos_id()) break;
        out.push_back(t);
        ++count[t];
        rows = {{s, std::int32_t(prompt.size() + out.size()) - 1, t, engine::output::logits}};
    }
    b.free(s);
    return out;
}

TEST_CASE("logit_bias: a token biased by +100 is every greedy token") {
    auto b = cpu_backend(false);
    const std::int32_t x = 1234;
    REQUIRE(x != tok().eos_id());
    controlled q{{"Say something.", {}, {}, 12}, {}};
    q.c.bias = {{x, 100.0f}};
    const std::vector<answer> got = serve_controlled(*b, plain(), {q});
    CHECK(got[0].tokens == std::vector<std::int32_t>(12, x));
    CHECK(got[0].reason == finish_reason::length);
}

TEST_CASE("frequency and presence penalties: the answer of a hand-penalised greedy loop") {
    auto b = cpu_backend(false);
    for (const auto& [f, p] : std::vector<std::pair<float, float>>{{1.5f, 0.0f}, {0.0f, 2.0f}, {0.75f, 0.5f}, {-1.0f, 0.0f}}) {
        CAPTURE(f);
        CAPTURE(p);
        controlled q{{"Tell me a story about a lighthouse.", {}, {}, 24}, {}};
        q.c.frequency_penalty = f;
        q.c.presence_penalty = p;
        const std::vector<answer> got = serve_controlled(*b, plain(), {q});
        const std::vector<std::int32_t> want = penalised_greedy(*b, got[0].prompt, f, p, 24);
        CHECK(got[0].tokens == want);
    }
    // The penalties change this answer (the check above is not vacuous).
    controlled none{{"Tell me a story about a lighthouse.", {}, {}, 24}, {}};
    controlled strong = none;
    strong.c.presence_penalty = 2.0f;
    CHECK(serve_controlled(*b, plain(), {none})[0].tokens != serve_controlled(*b, plain(), {strong})[0].tokens);
}

TEST_CASE("penalties with prompt-lookup drafts: verify rows count the drafts before them") {
    auto b = cpu_backend(false);
    std::vector<controlled> reqs = uncontrolled(mixed_requests());
    reqs[0].c.frequency_penalty = 0.8f;
    reqs[1].c.presence_penalty = 1.2f;
    reqs[1].c.bias = {{tok().eos_id(), -100.0f}};
    reqs[2].c.frequency_penalty = -0.5f;
    reqs[2].c.bias = {{17, 3.0f}, {290, -2.5f}};
    const std::vector<answer> want = serve_controlled(*b, plain(), reqs);
    scheduler_options so = plain();
    so.draft = draft_source::ngram;
    so.spec_tokens = 3;
    so.ngram_min = 1;
    scheduler_stats st;
    const std::vector<answer> got = serve_controlled(*b, so, reqs, &st);
    require_same(got, want);
    CHECK(st.spec_drafted > 0);
}

}  // namespace
}  // namespace ds4::server
