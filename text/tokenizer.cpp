#include "text/tokenizer.hpp"

#include <algorithm>
#include <queue>

#include "ds4/core/error.hpp"

namespace ds4::ref {
namespace {

struct code_point {
    char32_t cp;
    std::size_t len;
};

// Lenient decode: an invalid or truncated sequence yields one byte as U+FFFD, which the
// pre-tokenizer then treats as a non-ASCII letter. The byte itself is kept by the caller, so
// nothing is lost.
code_point decode_utf8(std::string_view s, std::size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) return {c, 1};
    std::size_t len = c >= 0xF8 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > s.size()) return {0xFFFD, 1};
    char32_t cp = c & (0x7F >> len);
    for (std::size_t k = 1; k < len; ++k) {
        const auto d = static_cast<unsigned char>(s[i + k]);
        if ((d & 0xC0) != 0x80) return {0xFFFD, 1};
        cp = (cp << 6) | (d & 0x3F);
    }
    return {cp, len};
}

// Character classes of the pre-tokenizer. Only ASCII is classified finely; every other code
// point is CJK/kana or a "letter" (§6 rule 4), which is what the upstream approximation does.
bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_ascii_alpha(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_cjk(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF);
}
bool is_punct(char32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}
bool is_letter(char32_t c) { return is_ascii_alpha(c) || (c >= 0x80 && !is_cjk(c)); }
bool is_newline(char32_t c) { return c == '\n' || c == '\r'; }
bool is_space(char32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class scanner {
public:
    explicit scanner(std::string_view s) : s_(s) {}
    bool at_end(std::size_t i) const { return i >= s_.size(); }
    char32_t cp(std::size_t i) const { return at_end(i) ? 0 : decode_utf8(s_, i).cp; }
    std::size_t next(std::size_t i) const { return i + decode_utf8(s_, i).len; }
    template <class Pred>
    std::size_t skip(std::size_t i, Pred pred) const {
        while (!at_end(i) && pred(cp(i))) i = next(i);
        return i;
    }

private:
    std::string_view s_;
};

// Length of the piece starting at i: the first of the 9 rules that matches.
std::size_t piece_end(const scanner& sc, std::size_t i) {
    const char32_t c = sc.cp(i);
    const std::size_t j = sc.next(i);
    const bool has_next = !sc.at_end(j);
    const char32_t n = sc.cp(j);
    if (is_digit(c)) {  // 1: at most three digits, so long numbers split 3+3+...
        std::size_t e = j;
        for (int k = 1; k < 3 && !sc.at_end(e) && is_digit(sc.cp(e)); ++k) e = sc.next(e);
        return e;
    }
    if (is_cjk(c)) return sc.skip(j, is_cjk);                                    // 2
    if (is_punct(c) && has_next && is_ascii_alpha(n)) return sc.skip(j, is_ascii_alpha);  // 3
    if (is_letter(c)) return sc.skip(j, is_letter);                              // 4
    if (!is_newline(c) && !is_punct(c) && has_next && is_letter(n)) return sc.skip(j, is_letter);  // 5
    if (c == ' ' && has_next && is_punct(n)) return sc.skip(sc.skip(j, is_punct), is_newline);     // 6
    if (is_punct(c)) return sc.skip(sc.skip(j, is_punct), is_newline);           // 7
    if (is_space(c)) {                                                           // 8
        const std::size_t run_end = sc.skip(j, is_space);
        std::size_t after_newline = 0;
        for (std::size_t k = i; k < run_end; ++k)
            if (is_newline(sc.cp(k))) after_newline = k + 1;  // whitespace is ASCII: 1 byte each
        if (after_newline != 0) return after_newline;
        const char32_t follow = sc.cp(run_end);
        // The last space joins the next piece (" word", " +="), as in GPT-style \s+(?!\S).
        if (run_end - i > 1 && !sc.at_end(run_end) && (is_letter(follow) || is_punct(follow)))
            return run_end - 1;
        return run_end;
    }
    return j;  // 9
}

struct byte_map {
    std::array<std::string, 256> to_text;
    std::array<std::int16_t, 324> to_byte;  // mapped code points are < 256 + 68
    byte_map() {
        to_byte.fill(-1);
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
            const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
            append_utf8(to_text[b], cp);
            to_byte[cp] = static_cast<std::int16_t>(b);
        }
    }
};

const byte_map& gpt2_map() {
    static const byte_map map;
    return map;
}

std::uint64_t pair_key(std::uint32_t left, std::uint32_t right) {
    return (static_cast<std::uint64_t>(left) << 32) | right;
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view utf8) {
    std::vector<std::string_view> pieces;
    const scanner sc(utf8);
    for (std::size_t i = 0; i < utf8.size();) {
        const std::size_t e = piece_end(sc, i);
        pieces.push_back(utf8.substr(i, e - i));
        i = e;
    }
    return pieces;
}

std::string_view byte_to_unicode(std::uint8_t byte) { return gpt2_map().to_text[byte]; }

int unicode_to_byte(char32_t cp) { return cp < 324 ? gpt2_map().to_byte[cp] : -1; }

std::string bytes_to_mapped(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (const char b : bytes) out += byte_to_unicode(static_cast<std::uint8_t>(b));
    return out;
}

void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

tokenizer::tokenizer(std::vector<std::string> tokens, std::vector<std::string> merges)
    : tokens_(std::move(tokens)) {
    require(!tokens_.empty(), "tokenizer: empty vocabulary");
    require(tokens_.size() <= 0x7FFFFFFF, "tokenizer: vocabulary larger than int32 ids");
    ids_.reserve(tokens_.size());
    pieces_.reserve(tokens_.size());
    for (std::size_t id = 0; id < tokens_.size(); ++id) {
        const std::string& t = tokens_[id];
        ids_.emplace(t, static_cast<std::int32_t>(id));  // first occurrence wins on duplicates
        std::string piece;
        if (t.find("\uFF5C") != std::string::npos) {
            piece = t;  // special/control tokens are stored and emitted literally (§6)
        } else {
            for (std::size_t i = 0; i < t.size();) {
                const code_point c = decode_utf8(t, i);
                const int b = unicode_to_byte(c.cp);
                // A code point outside the byte map cannot come from the byte-level encoder;
                // emitting its UTF-8 keeps such a token visible instead of losing it.
                if (b >= 0) piece += static_cast<char>(b);
                else piece.append(t, i, c.len);
                i += c.len;
            }
        }
        pieces_.push_back(std::move(piece));
    }

    std::unordered_map<std::string, std::uint32_t> symbols;
    symbols.reserve(merges.size() * 2 + 256);
    auto intern = [&](std::string text) {
        const auto [it, inserted] = symbols.emplace(std::move(text), static_cast<std::uint32_t>(symbols.size()));
        if (inserted) symbol_token_.push_back(find_token(it->first));
        return it->second;
    };
    for (int b = 0; b < 256; ++b) {
        byte_token_[b] = find_token(byte_to_unicode(static_cast<std::uint8_t>(b)));
        intern(std::string(byte_to_unicode(static_cast<std::uint8_t>(b))));
    }
    pair_ranks_.reserve(merges.size());
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
        const std::string& m = merges[rank];
        const std::size_t sp = m.find(' ');
        // Mapped tokens never contain U+0020, so exactly one space separates the operands.
        require(sp != std::string::npos && sp != 0 && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos,
                "tokenizer: malformed merge #" + std::to_string(rank) + " \"" + m + "\" (expected \"left right\")");
        std::string left = m.substr(0, sp), right = m.substr(sp + 1);
        const std::uint32_t l = intern(left);
        const std::uint32_t r = intern(right);
        const std::uint32_t result = intern(left + right);
        // A repeated pair keeps its first (lowest) rank.
        pair_ranks_.emplace(pair_key(l, r), merge_result{static_cast<std::int32_t>(rank), result});
    }

    bos_ = require_special(bos_text);
    eos_ = require_special(eos_text);
    user_ = require_special(user_text);
    assistant_ = require_special(assistant_text);
    think_ = require_special(think_text);
    think_end_ = require_special(think_end_text);
    dsml_ = require_special(dsml_text);
}

std::int32_t tokenizer::find_token(std::string_view text) const {
    const auto it = ids_.find(std::string(text));
    return it == ids_.end() ? -1 : it->second;
}

std::int32_t tokenizer::require_special(std::string_view text) const {
    const std::int32_t id = find_token(text);
    require(id >= 0, "tokenizer: special token " + std::string(text) + " is missing from the vocabulary");
    return id;
}

void tokenizer::check_id(std::int32_t id) const {
    require(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(),
            "tokenizer: token id " + std::to_string(id) + " out of range [0, " + std::to_string(tokens_.size()) + ")");
}

const std::string& tokenizer::token_to_piece(std::int32_t id) const {
    check_id(id);
    return pieces_[static_cast<std::size_t>(id)];
}

const std::string& tokenizer::token_text(std::int32_t id) const {
    check_id(id);
    return tokens_[static_cast<std::size_t>(id)];
}

std::string tokenizer::decode(std::span<const std::int32_t> ids) const {
    std::string out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::int32_t id = ids[i];
        require(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(),
                "tokenizer: decode: token id " + std::to_string(id) + " at position " + std::to_string(i) +
                    " out of range [0, " + std::to_string(tokens_.size()) + ")");
        out += pieces_[static_cast<std::size_t>(id)];
    }
    return out;
}

std::vector<std::int32_t> tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 8);
    if (!parse_special) {
        encode_text(text, out);
        return out;
    }
    const std::array<std::string_view, 7> specials{bos_text, eos_text, user_text, assistant_text,
                                                   think_text, think_end_text, dsml_text};
    const std::array<std::int32_t, 7> special_ids{bos_, eos_, user_, assistant_, think_, think_end_, dsml_};
    // Next occurrence of each special string; refreshed only when passed, so the scan is linear
    // in the text times the (fixed) number of specials.
    std::array<std::size_t, 7> next{};
    for (std::size_t k = 0; k < specials.size(); ++k) next[k] = text.find(specials[k]);
    std::size_t pos = 0;
    while (pos < text.size()) {
        std::size_t best = specials.size();
        for (std::size_t k = 0; k < specials.size(); ++k) {
            if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(specials[k], pos);
            if (next[k] == std::string_view::npos) continue;
            if (best == specials.size() || next[k] < next[best] ||
                (next[k] == next[best] && specials[k].size() > specials[best].size()))
                best = k;
        }
        if (best == specials.size()) {
            encode_text(text.substr(pos), out);
            break;
        }
        encode_text(text.substr(pos, next[best] - pos), out);
        out.push_back(special_ids[best]);
        pos = next[best] + specials[best].size();
    }
    return out;
}

void tokenizer::encode_text(std::string_view text, std::vector<std::int32_t>& out) const {
    for (const std::string_view piece : pretokenize(text)) encode_piece(piece, out);
}

// BPE on one pre-token: symbols in a linked list, candidate pairs in a min-heap ordered by
// (rank, position). Popping the minimum valid entry is exactly "lowest rank, leftmost on ties",
// in O(n log n) instead of the O(n^2) rescan, which matters for long runs (base64, minified code).
void tokenizer::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
    struct node {
        std::uint32_t symbol;
        std::int32_t prev, next;
        std::uint32_t begin, end;  // byte range of the piece this symbol covers
    };
    struct candidate {
        std::int32_t rank;
        std::int32_t left;
        std::uint32_t left_symbol, right_symbol;
        bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    constexpr std::uint32_t dead = 0xFFFFFFFFu;

    const auto n = static_cast<std::int32_t>(piece.size());
    std::vector<node> nodes(piece.size());
    for (std::int32_t i = 0; i < n; ++i)
        nodes[i] = node{static_cast<unsigned char>(piece[i]), i - 1, i + 1 < n ? i + 1 : -1,
                        static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i + 1)};

    std::priority_queue<candidate, std::vector<candidate>, std::greater<candidate>> heap;
    auto consider = [&](std::int32_t left) {
        if (left < 0 || nodes[left].next < 0) return;
        const node& a = nodes[left];
        const node& b = nodes[a.next];
        const auto it = pair_ranks_.find(pair_key(a.symbol, b.symbol));
        if (it != pair_ranks_.end()) heap.push(candidate{it->second.rank, left, a.symbol, b.symbol});
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);

    while (!heap.empty()) {
        const candidate c = heap.top();
        heap.pop();
        node& a = nodes[c.left];
        // Stale entries are recognised by content: if the two symbols are still adjacent the pair
        // still exists with this rank, so the entry is valid whenever it was pushed.
        if (a.symbol != c.left_symbol || a.next < 0 || nodes[a.next].symbol != c.right_symbol) continue;
        node& b = nodes[a.next];
        a.symbol = pair_ranks_.at(pair_key(c.left_symbol, c.right_symbol)).symbol;
        a.end = b.end;
        a.next = b.next;
        if (b.next >= 0) nodes[b.next].prev = c.left;
        b.symbol = dead;
        consider(a.prev);
        consider(c.left);
    }

    for (std::int32_t i = n > 0 ? 0 : -1; i >= 0; i = nodes[i].next) {
        const std::int32_t id = symbol_token_[nodes[i].symbol];
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        // §6 fallback: a symbol without a vocab entry becomes its bytes' 1-byte tokens; bytes
        // without one are dropped silently, as upstream does.
        for (std::uint32_t k = nodes[i].begin; k < nodes[i].end; ++k) {
            const std::int32_t b = byte_token_[static_cast<unsigned char>(piece[k])];
            if (b >= 0) out.push_back(b);
        }
    }
}

}  // namespace ds4::ref
