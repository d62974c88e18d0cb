#pragma once
// The synthetic tokenizer (docs/model.md §6 format): 256 byte tokens in GPT-2 mapped form, the
// merges train_bpe learns from the embedded corpus, the seven DS4 special tokens as single
// tokens, then unique filler tokens up to the preset's vocabulary size. Deterministic: it
// depends on the corpus and the vocabulary size only, never on the seed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "ds4/core/error.hpp"
#include "harness/synth/corpus.hpp"
#include "text/bpe_trainer.hpp"

namespace ds4::synth {

// llama.cpp's token types: what a GGUF viewer shows; ds4 itself only looks tokens up by string.
enum token_type : std::int32_t { token_normal = 1, token_control = 3, token_unused = 5 };

struct synth_vocab {
    std::vector<std::string> tokens;
    std::vector<std::string> merges;
    std::vector<std::int32_t> types;
    std::int32_t bos = -1, eos = -1;
};

// Merges beyond what a few KB of text supports would be all-filler pairs; this cap keeps the
// training a fraction of a second at every preset.
inline constexpr std::size_t max_merges = 3000;

inline synth_vocab build_vocab(int n_vocab) {
    const std::vector<std::string> specials = ref::ds4_special_tokens();
    const auto n = static_cast<std::size_t>(n_vocab);
    require(n >= 256 + specials.size(), "ds4-synth: vocabulary of " + std::to_string(n_vocab) + " is too small");
    const std::size_t budget = std::min(max_merges, n - 256 - specials.size());
    ref::bpe_vocab bpe = ref::train_bpe(training_corpus, budget);
    require(bpe.tokens.size() + specials.size() <= n, "ds4-synth: trained vocabulary exceeds the preset's size");

    synth_vocab v;
    v.merges = std::move(bpe.merges);
    v.tokens = std::move(bpe.tokens);
    v.types.assign(v.tokens.size(), token_normal);
    std::unordered_set<std::string> seen(v.tokens.begin(), v.tokens.end());
    for (const std::string& s : specials) {
        require(seen.insert(s).second, "ds4-synth: special token " + s + " is also a BPE token");
        if (s == specials[0]) v.bos = static_cast<std::int32_t>(v.tokens.size());
        if (s == specials[1]) v.eos = static_cast<std::int32_t>(v.tokens.size());
        v.tokens.push_back(s);
        v.types.push_back(token_control);
    }
    // Fillers are never produced by the BPE (no merge builds them) and never cut out as
    // specials; the set guards against a corpus that happens to contain one.
    for (std::size_t k = 0; v.tokens.size() < n; ++k) {
        std::string f = "<filler_" + std::to_string(k) + ">";
        if (!seen.insert(f).second) continue;
        v.tokens.push_back(std::move(f));
        v.types.push_back(token_unused);
    }
    return v;
}

}  // namespace ds4::synth
