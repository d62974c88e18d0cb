#pragma once
// Prompt-lookup drafts (n-gram speculation: vLLM's "ngram" method, llama.cpp's prompt lookup):
// the tokens that followed the latest earlier occurrence of the text's last n tokens, for the
// largest n in [n_min, n_max] that occurs earlier. No model: an answer that quotes its prompt
// (code edits, extraction, summaries with citations) or repeats itself gets drafts for free, and
// any backend that takes verify rows can check them. The text is the prompt followed by the
// answer's tokens and only grows (a rejected draft never enters it), so the index of n-grams
// is extended, never rebuilt: a draft costs O(n_max) hash lookups, not a scan of the context.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "ds4/core/error.hpp"

namespace ds4::server {

class ngram_drafter {
public:
    ngram_drafter(int n_min, int n_max) : n_min_(n_min), n_max_(n_max), last_end_(std::size_t(n_max + 1)) {
        require(n_min >= 1 && n_min <= n_max && n_max <= max_n, "n-gram drafts: need 1 <= min <= max <= 16");
    }

    // Up to max_drafts tokens to follow the text prompt ++ answer (its last token included);
    // empty where no n-gram of its end occurs earlier. Each call's text must extend the previous
    // call's (same prompt, answer only appended).
    std::vector<std::int32_t> draft(std::span<const std::int32_t> prompt, std::span<const std::int32_t> answer,
                                    int max_drafts) {
        const text t{prompt, answer};
        const std::size_t len = t.size();
        require(len >= indexed_, "n-gram drafts: the text shrank");
        // Every n-gram ending before the last token: an occurrence of the text's own end is
        // never its own match.
        for (; indexed_ + 1 < len; ++indexed_) {
            const std::size_t end = indexed_ + 1;
            for (int n = n_min_; n <= n_max_ && std::size_t(n) <= end; ++n)
                last_end_[std::size_t(n)][hash(t, end, n)] = std::int32_t(end);
        }
        std::vector<std::int32_t> out;
        if (max_drafts <= 0) return out;
        for (int n = std::min<std::size_t>(std::size_t(n_max_), len - (len > 0)); n >= n_min_; --n) {
            const auto& index = last_end_[std::size_t(n)];
            const auto it = index.find(hash(t, len, n));
            if (it == index.end()) continue;
            const std::size_t e = std::size_t(it->second);
            bool same = true;  // a hash collision is no match
            for (int k = 1; k <= n && same; ++k) same = t[e - std::size_t(k)] == t[len - std::size_t(k)];
            if (!same) continue;
            for (std::size_t i = e; i < len && out.size() < std::size_t(max_drafts); ++i) out.push_back(t[i]);
            return out;
        }
        return out;
    }

    static constexpr int max_n = 16;

private:
    struct text {
        std::span<const std::int32_t> a, b;
        std::size_t size() const { return a.size() + b.size(); }
        std::int32_t operator[](std::size_t i) const { return i < a.size() ? a[i] : b[i - a.size()]; }
    };
    // The n tokens ending before `end` (splitmix64 over each).
    static std::uint64_t hash(const text& t, std::size_t end, int n) {
        std::uint64_t h = 0x9e3779b97f4a7c15ull * std::uint64_t(n);
        for (std::size_t i = end - std::size_t(n); i < end; ++i) {
            h ^= std::uint64_t(std::uint32_t(t[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
            h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
            h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
            h ^= h >> 31;
        }
        return h;
    }

    int n_min_, n_max_;
    std::size_t indexed_ = 0;  // n-grams ending at positions 1..indexed_ are in last_end_
    std::vector<std::unordered_map<std::uint64_t, std::int32_t>> last_end_;  // [n]: hash -> latest end
};

}  // namespace ds4::server
