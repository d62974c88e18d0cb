// The prefix cache's radix index against a brute-force scan of the same entries: for random
// token sets with shared stems (splits at every depth), inserts and erases in random order, the
// match length found equals the best one the scan finds, and the entry it names is usable
// (shares that many tokens and ends within the rollback reach).
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "examples/server/prefix_index.hpp"

namespace ds4::server {
namespace {

struct cached {
    int id;
    std::vector<std::int32_t> tokens;
};

int shared(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& p, int limit) {
    int m = 0;
    while (m < int(a.size()) && m < limit && a[std::size_t(m)] == p[std::size_t(m)]) ++m;
    return m;
}

// The best usable match of a linear scan: the longest shared length among entries that end
// within max_rollback of it.
int brute(const std::vector<cached>& entries, const std::vector<std::int32_t>& p, int limit, int rollback) {
    int best = -1;
    for (const cached& c : entries) {
        const int m = shared(c.tokens, p, limit);
        if (int(c.tokens.size()) - m <= rollback) best = std::max(best, m);
    }
    return best;
}

TEST_CASE("prefix_index: hand-worked splits") {
    prefix_index<int> ix;
    const std::vector<std::int32_t> a{1, 2, 3, 4}, b{1, 2, 5}, c{1, 2};
    ix.insert(a, 10);
    ix.insert(b, 11);
    const std::vector<std::int32_t> p{1, 2, 3, 4, 9};
    auto m = ix.find(p, 4, 0);
    REQUIRE(m);
    CHECK(m->id == 10);
    CHECK(m->length == 4);
    const std::vector<std::int32_t> q{1, 2, 7};
    CHECK_FALSE(ix.find(q, 2, 0));  // both entries go past the divergence at 2
    m = ix.find(q, 2, 1);           // b rolls back one token
    REQUIRE(m);
    CHECK(m->id == 11);
    CHECK(m->length == 2);
    ix.insert(c, 12);
    m = ix.find(q, 2, 0);
    REQUIRE(m);
    CHECK(m->id == 12);
    CHECK(ix.erase(b, 11));
    CHECK_FALSE(ix.erase(b, 11));
    CHECK(ix.erase(c, 12));
    CHECK_FALSE(ix.find(q, 2, 1));
    CHECK(ix.erase(a, 10));
    CHECK(ix.empty());
}

TEST_CASE("prefix_index: equals a linear scan on random sets") {
    std::mt19937 rng(7);
    for (int round = 0; round < 200; ++round) {
        prefix_index<int> ix;
        std::vector<cached> entries;
        const auto random_tokens = [&](const std::vector<std::int32_t>* stem) {
            std::vector<std::int32_t> t;
            if (stem && !stem->empty()) t.assign(stem->begin(), stem->begin() + std::ptrdiff_t(rng() % (stem->size() + 1)));
            const int extra = int(rng() % 6);
            for (int i = 0; i < extra; ++i) t.push_back(std::int32_t(rng() % 3));
            return t;
        };
        for (int op = 0; op < 40; ++op) {
            if (entries.empty() || rng() % 3 != 0) {
                const std::vector<std::int32_t>* stem = entries.empty() ? nullptr : &entries[rng() % entries.size()].tokens;
                entries.push_back({op, random_tokens(stem)});
                ix.insert(entries.back().tokens, op);
            } else {
                const std::size_t k = rng() % entries.size();
                REQUIRE(ix.erase(entries[k].tokens, entries[k].id));
                entries.erase(entries.begin() + std::ptrdiff_t(k));
            }
            const std::vector<std::int32_t>* stem = entries.empty() ? nullptr : &entries[rng() % entries.size()].tokens;
            std::vector<std::int32_t> p = random_tokens(stem);
            p.push_back(0);
            const int limit = int(p.size()) - 1, rollback = int(rng() % 3);
            const int want = brute(entries, p, limit, rollback);
            const auto got = ix.find(p, limit, rollback);
            REQUIRE(got.has_value() == (want >= 0));
            if (!got) continue;
            CHECK(got->length == want);
            const auto it = std::find_if(entries.begin(), entries.end(), [&](const cached& c) { return c.id == got->id; });
            REQUIRE(it != entries.end());
            CHECK(shared(it->tokens, p, limit) >= got->length);
            CHECK(int(it->tokens.size()) - got->length <= rollback);
        }
    }
}

}  // namespace
}  // namespace ds4::server
