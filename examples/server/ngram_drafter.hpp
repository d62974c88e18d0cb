#pragma once
// Prompt-lookup drafts (n-gram speculation: vLLM's "ngram" method, llama.cpp's prompt lookup):
// the tokens that followed an earlier occurrence of the text's last tokens. No model: an answer
// that quotes its prompt (code edits, extraction, summaries with citations) or repeats itself
// gets drafts for free, and any backend that takes verify rows can check them.
// The occurrence: among the latest max_chain earlier occurrences of the text's last n_min
// tokens, the one whose match with the text's end runs furthest back (up to n_max tokens), the
// latest of those. The text is the prompt followed by the answer's tokens and only grows (a
// rejected draft never enters it), so the index is extended, never rebuilt: hash chains as in
// zlib's match finder (the latest end of each n_min-gram, and per position the previous end of
// the same one), 4 bytes a token plus one entry per distinct n_min-gram, and a draft walks at
// most max_chain links instead of scanning the context.
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
    static constexpr int max_n = 16;
    static constexpr int max_chain = 256;

    ngram_drafter(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {
        require(n_min >= 1 && n_min <= n_max && n_max <= max_n, "n-gram drafts: need 1 <= min <= max <= 16");
    }

    // Up to max_drafts tokens to follow the text prompt ++ answer (its last token included);
    // empty where its last n_min tokens do not occur earlier. Each call's text must extend the
    // previous call's (same prompt, answer only appended).
    std::vector<std::int32_t> draft(std::span<const std::int32_t> prompt, std::span<const std::int32_t> answer,
                                    int max_drafts) {
        const text t{prompt, answer};
        const std::size_t len = t.size();
        require(len >= prev_.size(), "n-gram drafts: the text shrank");
        // Every n_min-gram ending before the last token: the text's own end is never its match.
        for (std::size_t end = prev_.size(); end < len; ++end) {
            std::int32_t before = -1;
            if (end >= std::size_t(n_min_)) {
                std::int32_t& h = latest_[hash(t, end)];
                before = h > 0 ? h : -1;
                h = std::int32_t(end);
            }
            prev_.push_back(before);
        }
        std::vector<std::int32_t> out;
        if (max_drafts <= 0 || len <= std::size_t(n_min_)) return out;
        const auto it = latest_.find(hash(t, len));
        if (it == latest_.end()) return out;
        std::size_t best = 0;
        int best_n = 0;
        std::int32_t e = it->second;
        for (int walked = 0; e > 0 && walked < max_chain && best_n < n_max_; ++walked, e = prev_[std::size_t(e)]) {
            // How far the text before end e equals the text's end (e < len: they never overlap
            // at the same position).
            int n = 0;
            while (n < n_max_ && std::size_t(n) < std::size_t(e) && t[std::size_t(e) - 1 - std::size_t(n)] == t[len - 1 - std::size_t(n)])
                ++n;
            if (n >= n_min_ && n > best_n) best = std::size_t(e), best_n = n;  // a hash collision has n < n_min
        }
        if (best_n == 0) return out;
        for (std::size_t i = best; i < len && out.size() < std::size_t(max_drafts); ++i) out.push_back(t[i]);
        return out;
    }

private:
    struct text {
        std::span<const std::int32_t> a, b;
        std::size_t size() const { return a.size() + b.size(); }
        std::int32_t operator[](std::size_t i) const { return i < a.size() ? a[i] : b[i - a.size()]; }
    };
    // The n_min tokens ending before `end` (splitmix64 over each).
    std::uint64_t hash(const text& t, std::size_t end) const {
        std::uint64_t h = 0;
        for (std::size_t i = end - std::size_t(n_min_); i < end; ++i) {
            h ^= std::uint64_t(std::uint32_t(t[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
            h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
            h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
            h ^= h >> 31;
        }
        return h;
    }

    int n_min_, n_max_;
    std::unordered_map<std::uint64_t, std::int32_t> latest_;  // n_min-gram hash -> its latest end
    std::vector<std::int32_t> prev_;  // [end]: the previous end in the same hash's chain, -1 none
};

}  // namespace ds4::server
