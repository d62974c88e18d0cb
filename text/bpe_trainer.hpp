#pragma once
// Byte-level BPE training over the §6 pre-tokenizer, for synthetic models and tokenizer tests:
// a tiny, deterministic stand-in for the real DeepSeek vocabulary with the same token format.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ds4::ref {

struct bpe_vocab {
    std::vector<std::string> tokens;  // 256 byte tokens (by byte value), then merged tokens in merge order
    std::vector<std::string> merges;  // "left right", rank = index
};

// Learns up to n_merges merges (fewer if the corpus runs out of pairs). Each step merges the most
// frequent adjacent pair over the pre-tokenized corpus; ties go to the lexicographically smallest
// (left, right) in mapped form, so the result depends on the corpus alone. A merge whose result
// already exists as a token (same string reached by another split) adds no second token.
bpe_vocab train_bpe(std::string_view corpus, std::size_t n_merges);

// The seven special strings of docs/model.md §6, in the order BOS, EOS, User, Assistant, <think>,
// </think>, ｜DSML｜. Tool-result tags and DSML tag names are plain text and are not included.
std::vector<std::string> ds4_special_tokens();

}  // namespace ds4::ref
