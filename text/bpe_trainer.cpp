#include "text/bpe_trainer.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <queue>
#include <unordered_map>

#include "text/tokenizer.hpp"

namespace ds4::ref {
namespace {

std::uint64_t pair_key(std::uint32_t left, std::uint32_t right) {
    return (static_cast<std::uint64_t>(left) << 32) | right;
}

// Pair statistics are updated incrementally (only words containing the merged pair are
// rewritten) and the best pair is found with a lazy max-heap: entries carry the count they were
// pushed with and are discarded when it no longer matches. Full recounting would be
// O(merges x corpus), too slow for the vocabularies the synthetic models want.
class trainer {
public:
    explicit trainer(std::string_view corpus) {
        for (int b = 0; b < 256; ++b) intern(std::string(byte_to_unicode(static_cast<std::uint8_t>(b))));
        std::map<std::string_view, std::int64_t> counts;  // ordered: word order must not depend on hashing
        for (const std::string_view w : pretokenize(corpus)) ++counts[w];
        for (const auto& [word, count] : counts) {
            std::vector<std::uint32_t> symbols;
            for (const char c : word) symbols.push_back(static_cast<unsigned char>(c));
            words_.push_back(std::move(symbols));
            word_counts_.push_back(count);
        }
        seen_.assign(words_.size(), 0);
        std::vector<std::uint64_t> touched;
        for (std::uint32_t w = 0; w < words_.size(); ++w) add_word(w, +1, touched);
        push_all(touched);
    }

    bpe_vocab run(std::size_t n_merges) {
        bpe_vocab v;
        for (std::size_t i = 0; i < 256; ++i) v.tokens.push_back(text_[i]);
        while (v.merges.size() < n_merges) {
            const auto best = pop_best();
            if (!best) break;
            const auto [left, right] = *best;
            const std::size_t before = text_.size();
            const std::uint32_t merged = intern(text_[left] + text_[right]);
            if (text_.size() != before) v.tokens.push_back(text_[merged]);
            v.merges.push_back(text_[left] + " " + text_[right]);
            apply(left, right, merged);
        }
        return v;
    }

private:
    struct entry {
        std::int64_t count;
        std::uint32_t left, right;
    };

    std::uint32_t intern(std::string text) {
        const auto [it, inserted] = index_.emplace(text, static_cast<std::uint32_t>(text_.size()));
        if (inserted) text_.push_back(std::move(text));
        return it->second;
    }

    // Heap order: higher count first, then lexicographically smaller (left, right).
    bool worse(const entry& a, const entry& b) const {
        if (a.count != b.count) return a.count < b.count;
        if (text_[a.left] != text_[b.left]) return text_[a.left] > text_[b.left];
        return text_[a.right] > text_[b.right];
    }

    void add_word(std::uint32_t w, int sign, std::vector<std::uint64_t>& touched) {
        const auto& s = words_[w];
        for (std::size_t i = 0; i + 1 < s.size(); ++i) {
            const std::uint64_t key = pair_key(s[i], s[i + 1]);
            pair_counts_[key] += sign * word_counts_[w];
            if (sign > 0) pair_words_[key].push_back(w);
            touched.push_back(key);
        }
    }

    // Pushes the current count of every touched pair (deduplicated) and restores the heap.
    void push_all(std::vector<std::uint64_t>& touched) {
        std::sort(touched.begin(), touched.end());
        touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
        const auto cmp = [this](const entry& a, const entry& b) { return worse(a, b); };
        for (const std::uint64_t key : touched) {
            const std::int64_t count = pair_counts_[key];
            if (count <= 0) continue;
            heap_.push_back(entry{count, static_cast<std::uint32_t>(key >> 32), static_cast<std::uint32_t>(key)});
            std::push_heap(heap_.begin(), heap_.end(), cmp);
        }
    }

    std::optional<std::pair<std::uint32_t, std::uint32_t>> pop_best() {
        const auto cmp = [this](const entry& a, const entry& b) { return worse(a, b); };
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), cmp);
            const entry e = heap_.back();
            heap_.pop_back();
            const auto it = pair_counts_.find(pair_key(e.left, e.right));
            if (it != pair_counts_.end() && it->second == e.count && e.count > 0) return std::pair{e.left, e.right};
        }
        return std::nullopt;
    }

    void apply(std::uint32_t left, std::uint32_t right, std::uint32_t merged) {
        const std::uint64_t key = pair_key(left, right);
        const std::vector<std::uint32_t> candidates = std::move(pair_words_[key]);
        pair_words_.erase(key);
        ++stamp_;
        std::vector<std::uint64_t> touched;
        for (const std::uint32_t w : candidates) {
            if (seen_[w] == stamp_) continue;  // a word is listed once per occurrence
            seen_[w] = stamp_;
            add_word(w, -1, touched);
            auto& s = words_[w];
            std::vector<std::uint32_t> rewritten;
            rewritten.reserve(s.size());
            for (std::size_t i = 0; i < s.size(); ++i) {
                if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
                    rewritten.push_back(merged);
                    ++i;
                } else {
                    rewritten.push_back(s[i]);
                }
            }
            s = std::move(rewritten);
            add_word(w, +1, touched);
        }
        push_all(touched);
    }

    std::vector<std::string> text_;
    std::unordered_map<std::string, std::uint32_t> index_;
    std::vector<std::vector<std::uint32_t>> words_;
    std::vector<std::int64_t> word_counts_;
    std::unordered_map<std::uint64_t, std::int64_t> pair_counts_;
    std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> pair_words_;
    std::vector<entry> heap_;
    std::vector<std::uint32_t> seen_;
    std::uint32_t stamp_ = 0;
};

}  // namespace

bpe_vocab train_bpe(std::string_view corpus, std::size_t n_merges) { return trainer(corpus).run(n_merges); }

std::vector<std::string> ds4_special_tokens() {
    return {std::string(bos_text),       std::string(eos_text),  std::string(user_text),
            std::string(assistant_text), std::string(think_text), std::string(think_end_text),
            std::string(dsml_text)};
}

}  // namespace ds4::ref
