#pragma once
// DeepSeek-V4-Flash tokenizer (docs/model.md §6): GPT-2 byte-level BPE over the hand-written
// "joyai-llm" pre-tokenizer, with the seven special tokens cut out of the text by their exact
// strings. Vocabulary and merges come from the GGUF (tokenizer.ggml.tokens / .merges); nothing
// here hard-codes an id.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ds4::ref {

// The special strings of §6. Bars are U+FF5C, the word separator is U+2581.
inline constexpr std::string_view bos_text = "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>";
inline constexpr std::string_view eos_text = "<\uFF5Cend\u2581of\u2581sentence\uFF5C>";
inline constexpr std::string_view user_text = "<\uFF5CUser\uFF5C>";
inline constexpr std::string_view assistant_text = "<\uFF5CAssistant\uFF5C>";
inline constexpr std::string_view think_text = "<think>";
inline constexpr std::string_view think_end_text = "</think>";
inline constexpr std::string_view dsml_text = "\uFF5CDSML\uFF5C";

// The 9 pre-tokenizer rules of §6, first match wins at each position. The pieces are views into
// `utf8` and concatenate back to it exactly. Invalid UTF-8 bytes are taken one at a time and
// classified as non-ASCII "letters" (rule 4), so any byte string round-trips.
std::vector<std::string_view> pretokenize(std::string_view utf8);

// The GPT-2 byte<->code point map: bytes 33-126, 161-172, 174-255 map to themselves, the other
// 68 bytes to 256+n in byte order. byte_to_unicode returns the code point's UTF-8 text.
std::string_view byte_to_unicode(std::uint8_t byte);
// The byte a mapped code point stands for, or -1 if the code point is not in the map.
int unicode_to_byte(char32_t cp);
// Maps every byte of `bytes` (the vocab form used by tokens and merges).
std::string bytes_to_mapped(std::string_view bytes);
// Appends the UTF-8 encoding of a code point (no validation: callers pass real code points).
void append_utf8(std::string& out, char32_t cp);

class tokenizer {
public:
    // tokens[id] in GPT-2 byte-mapped form; merges[rank] = "left right". Throws ds4::error naming
    // a malformed merge by index, or a special token missing from the vocabulary.
    tokenizer(std::vector<std::string> tokens, std::vector<std::string> merges);

    // parse_special: cut the seven special strings out of the text and emit their ids; otherwise
    // they are ordinary text and go through BPE like anything else.
    std::vector<std::int32_t> encode(std::string_view text, bool parse_special) const;
    std::string decode(std::span<const std::int32_t> ids) const;
    // The bytes of one token (possibly an incomplete UTF-8 sequence), for streaming.
    const std::string& token_to_piece(std::int32_t id) const;
    // The vocabulary string (byte-mapped form), e.g. for logprob display.
    const std::string& token_text(std::int32_t id) const;
    // Id of a vocabulary string, or -1.
    std::int32_t find_token(std::string_view text) const;

    std::int32_t bos_id() const { return bos_; }
    std::int32_t eos_id() const { return eos_; }
    std::int32_t user_id() const { return user_; }
    std::int32_t assistant_id() const { return assistant_; }
    std::int32_t think_id() const { return think_; }
    std::int32_t think_end_id() const { return think_end_; }
    std::int32_t dsml_id() const { return dsml_; }
    std::size_t vocab_size() const { return tokens_.size(); }

private:
    struct merge_result {
        std::int32_t rank;
        std::uint32_t symbol;
    };

    void check_id(std::int32_t id) const;
    std::int32_t require_special(std::string_view text) const;
    void encode_text(std::string_view text, std::vector<std::int32_t>& out) const;
    void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;

    std::vector<std::string> tokens_;
    std::vector<std::string> pieces_;  // decoded bytes per id, built once so decode is a concat
    std::unordered_map<std::string, std::int32_t> ids_;
    std::array<std::int32_t, 256> byte_token_{};  // vocab id of each 1-byte token, -1 if absent
    // BPE runs on interned symbol ids so merging never builds strings: symbols 0..255 are the
    // bytes, the rest are every merge operand and result. Pair key = left << 32 | right.
    std::vector<std::int32_t> symbol_token_;  // vocab id of each symbol, -1 if absent
    std::unordered_map<std::uint64_t, merge_result> pair_ranks_;
    std::int32_t bos_ = -1, eos_ = -1, user_ = -1, assistant_ = -1;
    std::int32_t think_ = -1, think_end_ = -1, dsml_ = -1;
};

}  // namespace ds4::ref
