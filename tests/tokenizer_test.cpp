// Tokenizer (docs/model.md §6): pre-tokenizer rules, BPE merge order on a hand-worked toy vocabulary,
// special tokens, byte-exact round trips with a vocabulary trained by train_bpe, and speed on
// long inputs.
#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"

using namespace ds4::ref;

namespace {

std::vector<std::string> split(std::string_view s) {
    std::vector<std::string> out;
    for (const auto p : pretokenize(s)) out.emplace_back(p);
    return out;
}

using pieces = std::vector<std::string>;

// The vocabulary strings in GPT-2 mapped form: space is U+0120 "Ġ".
const std::string G = "\u0120";

}  // namespace

TEST_CASE("gpt2 byte map") {
    CHECK(byte_to_unicode('a') == "a");
    CHECK(byte_to_unicode(' ') == "\u0120");   // 32 is the 33rd unmapped byte: 256 + 32
    CHECK(byte_to_unicode('\n') == "\u010A");  // 256 + 10
    CHECK(byte_to_unicode(0) == "\u0100");
    CHECK(byte_to_unicode(173) == "\u0143");   // soft hyphen: 256 + 67, the last unmapped byte
    CHECK(byte_to_unicode(0xFF) == "\u00FF");
    for (int b = 0; b < 256; ++b) {
        const std::string_view t = byte_to_unicode(static_cast<std::uint8_t>(b));
        char32_t cp = 0;
        if (t.size() == 1) cp = static_cast<unsigned char>(t[0]);
        else cp = ((static_cast<unsigned char>(t[0]) & 0x1F) << 6) | (static_cast<unsigned char>(t[1]) & 0x3F);
        CHECK(unicode_to_byte(cp) == b);
    }
    CHECK(unicode_to_byte(0x4E00) == -1);
}

TEST_CASE("pretokenize: rule 1, digits in groups of at most three") {
    CHECK(split("12345") == pieces{"123", "45"});
    CHECK(split("7") == pieces{"7"});
    CHECK(split("abc 2024") == pieces{"abc", " ", "202", "4"});
}

TEST_CASE("pretokenize: rule 2, CJK and kana runs") {
    CHECK(split("你好世界abc") == pieces{"你好世界", "abc"});
    CHECK(split("日本語のテキスト") == pieces{"日本語のテキスト"});
    CHECK(split("中文，好") == pieces{"中文", "，", "好"});  // U+FF0C is a rule-4 "letter"; CJK ends its run
}

TEST_CASE("pretokenize: rule 3, one ASCII punctuation plus ASCII letters") {
    CHECK(split("(foo") == pieces{"(foo"});
    CHECK(split("it's") == pieces{"it", "'s"});
    CHECK(split("x.y") == pieces{"x", ".y"});
    CHECK(split("(café") == pieces{"(caf", "é"});  // only ASCII letters follow the punctuation
}

TEST_CASE("pretokenize: rule 4, letters include every non-ASCII non-CJK code point") {
    CHECK(split("héllo") == pieces{"héllo"});
    CHECK(split("Привет мир") == pieces{"Привет", " мир"});
    CHECK(split("a\U0001F44Db") == pieces{"a\U0001F44Db"});
}

TEST_CASE("pretokenize: rule 5, one non-newline non-punctuation char before letters") {
    CHECK(split(" word") == pieces{" word"});
    CHECK(split("\tx") == pieces{"\tx"});
    CHECK(split("naïve café") == pieces{"naïve", " café"});
    CHECK(split("\nword") == pieces{"\n", "word"});  // a newline never leads a word
}

TEST_CASE("pretokenize: rule 6, space + punctuation run + trailing CR/LF") {
    CHECK(split("a += b") == pieces{"a", " +=", " b"});
    CHECK(split(" +=\r\n") == pieces{" +=\r\n"});
    CHECK(split("x ;\n\ny") == pieces{"x", " ;\n\n", "y"});
}

TEST_CASE("pretokenize: rule 7, punctuation keeps trailing newlines") {
    CHECK(split(">;\n") == pieces{">;\n"});
    CHECK(split("});\n\n") == pieces{"});\n\n"});
    CHECK(split("a>;\nb") == pieces{"a", ">;\n", "b"});
}

TEST_CASE("pretokenize: rule 8, whitespace runs") {
    CHECK(split("a   b") == pieces{"a", "  ", " b"});       // last space joins the word
    CHECK(split("a   +") == pieces{"a", "  ", " +"});       // ... or the punctuation
    CHECK(split("a  1") == pieces{"a", "  ", "1"});         // not a digit: the whole run
    CHECK(split("a  ") == pieces{"a", "  "});               // end of text: the whole run
    CHECK(split("a \n  b") == pieces{"a", " \n", " ", " b"});  // ends after the last newline
    CHECK(split("a\n\n\nb") == pieces{"a", "\n\n\n", "b"});
    CHECK(split("  \t b") == pieces{"  \t", " b"});
    CHECK(split(" ") == pieces{" "});
}

TEST_CASE("pretokenize: rule 9, single characters") {
    CHECK(split("\x01" "1") == pieces{"\x01", "1"});
    CHECK(split("\x7F") == pieces{"\x7F"});
}

TEST_CASE("pretokenize: pieces always concatenate to the input") {
    std::mt19937 rng(12345);
    for (int t = 0; t < 200; ++t) {
        std::string s;
        const int n = static_cast<int>(rng() % 64);
        for (int i = 0; i < n; ++i) s += static_cast<char>(rng() & 0xFF);  // arbitrary bytes
        std::string joined;
        for (const auto p : pretokenize(s)) {
            CHECK(!p.empty());
            joined += p;
        }
        CHECK(joined == s);
    }
}

namespace {

// Toy vocabulary for hand-worked merges. Ids: a=0 b=1 c=2 ab=3 bc=4 abc=5 aa=6 Ġ=7, specials 8..14.
tokenizer toy() {
    std::vector<std::string> tokens{"a", "b", "c", "ab", "bc", "abc", "aa", G};
    for (const auto& s : ds4_special_tokens()) tokens.push_back(s);
    // "c c" produces "cc", which is not in the vocabulary: exercises the byte fallback.
    return tokenizer(tokens, {"b c", "a b", "a bc", "a a", "c c"});
}

using ids = std::vector<std::int32_t>;

}  // namespace

TEST_CASE("bpe: lowest rank first, leftmost on ties, byte fallback") {
    const tokenizer tok = toy();
    CHECK(tok.encode("abc", false) == ids{5});     // (b,c) rank 0 before (a,b) rank 1, then (a,bc)
    CHECK(tok.encode("abab", false) == ids{3, 3});  // both (a,b): leftmost, then the other
    CHECK(tok.encode("aaa", false) == ids{6, 0});   // leftmost (a,a) wins, the last a stays
    CHECK(tok.encode("cc", false) == ids{2, 2});    // "cc" has no id: each byte's token
    CHECK(tok.encode("adb", false) == ids{0, 1});   // 'd' has no 1-byte token: dropped
    CHECK(tok.encode("ab abc", false) == ids{3, 7, 5});
    CHECK(tok.decode(ids{3, 7, 5}) == "ab abc");
    CHECK(tok.vocab_size() == 15);
}

TEST_CASE("special tokens: ids by string, cut out of text, never split") {
    const tokenizer tok = toy();
    CHECK(tok.bos_id() == 8);
    CHECK(tok.eos_id() == 9);
    CHECK(tok.user_id() == 10);
    CHECK(tok.assistant_id() == 11);
    CHECK(tok.think_id() == 12);
    CHECK(tok.think_end_id() == 13);
    CHECK(tok.dsml_id() == 14);
    CHECK(tok.encode("<\uFF5CUser\uFF5C>abc<think>", true) == ids{10, 5, 12});
    CHECK(tok.encode("<\uFF5CDSML\uFF5Cabc", true) == ids{14, 5});  // '<' has no token in the toy vocab
    CHECK(tok.decode(ids{8, 0, 13, 9}) == "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>a</think><\uFF5Cend\u2581of\u2581sentence\uFF5C>");
    CHECK(tok.token_to_piece(7) == " ");
    CHECK(tok.token_text(7) == G);
}

TEST_CASE("errors name what is wrong") {
    std::vector<std::string> tokens{"a", "b"};
    for (const auto& s : ds4_special_tokens()) tokens.push_back(s);
    CHECK_THROWS_WITH_AS(tokenizer(tokens, {"a b", "ab"}), doctest::Contains("merge #1"), ds4::error);
    CHECK_THROWS_WITH_AS(tokenizer(tokens, {" a"}), doctest::Contains("merge #0"), ds4::error);
    CHECK_THROWS_WITH_AS(tokenizer(tokens, {"a b c"}), doctest::Contains("merge #0"), ds4::error);
    std::vector<std::string> no_eos{"a", std::string(bos_text)};
    CHECK_THROWS_WITH_AS(tokenizer(no_eos, {}), doctest::Contains("end\u2581of\u2581sentence"), ds4::error);
    const tokenizer tok = toy();
    CHECK_THROWS_WITH_AS(tok.decode(ids{0, 15}), doctest::Contains("15"), ds4::error);
    CHECK_THROWS_AS(tok.token_to_piece(-1), ds4::error);
}

TEST_CASE("train_bpe: counts, lexicographic ties, stops when no pair is left") {
    // Pieces "ab", " ab", " ab", " cd": (a,b)=3 first, then (Ġ,ab)=2, then the tie
    // (Ġ,c)=(c,d)=1 goes to "c" < "Ġ", then (Ġ,cd); nothing is left after four merges.
    const bpe_vocab v = train_bpe("ab ab ab cd", 10);
    REQUIRE(v.tokens.size() == 260);
    CHECK(v.tokens[97] == "a");
    CHECK(v.tokens[32] == G);
    CHECK(v.merges == std::vector<std::string>{"a b", G + " ab", "c d", G + " cd"});
    CHECK(std::vector<std::string>(v.tokens.begin() + 256, v.tokens.end()) ==
          std::vector<std::string>{"ab", G + "ab", "cd", G + "cd"});
    CHECK(train_bpe("ab ab ab cd", 2).merges.size() == 2);
}

namespace {

const char* const corpus_text =
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!\n"
    "int main(int argc, char** argv) {\n    return argc > 1 ? 0 : 1;\n}\n"
    "for (auto& x : xs) { total += x * 2; }\n\n"
    "人工智能正在改变世界。我们的模型可以理解中文和日本語のテキスト。\n"
    "Привет, как дела? Всё хорошо.  Ça va très bien, merci.\n"
    "Emoji: \U0001F600 \U0001F680 \U0001F44D and numbers 12345 67890 3.14159\n"
    "<div class=\"note\">Hello &amp; welcome</div>\r\n"
    "    indented line\n\t\ttabbed line\n";

// Random valid UTF-8 drawn from the scripts and whitespace shapes the model sees.
std::string random_text(std::mt19937& rng) {
    static const std::vector<std::string> atoms{
        "a", "e", "Z", "the", " ", "  ", "   ", "\n", "\r\n", "\t", "0", "42", "12345", ".", ";", ">", "{", "}",
        "(", "\"", "'", "->", "==", "人", "工", "智", "能", "の", "テ", "é", "ß", "Ж", "д", "\U0001F600",
        "\U0001F680", "\u2581", "\uFF5C", "<", "/", "think", "\u00A0", "\u200B", "x", "_", "\\"};
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    return s;
}

tokenizer trained() {
    bpe_vocab v = train_bpe(corpus_text, 300);
    for (const auto& s : ds4_special_tokens()) v.tokens.push_back(s);
    return tokenizer(v.tokens, v.merges);
}

}  // namespace

TEST_CASE("round trip with a trained vocabulary") {
    const tokenizer tok = trained();
    const auto seed = std::random_device{}();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    for (int t = 0; t < 2000; ++t) {
        const std::string s = random_text(rng);
        const auto plain = tok.encode(s, false);
        CHECK(tok.decode(plain) == s);
        const auto special = tok.encode(s, true);
        CHECK(tok.decode(special) == s);
    }
    // Merges did their job: the corpus compresses well below one token per byte.
    const auto corpus_ids = tok.encode(corpus_text, false);
    CHECK(corpus_ids.size() * 2 < std::string_view(corpus_text).size());
    CHECK(tok.decode(corpus_ids) == corpus_text);
    // Arbitrary bytes (invalid UTF-8 included) still round-trip: every byte has a token.
    for (int t = 0; t < 200; ++t) {
        std::string s;
        for (int i = static_cast<int>(rng() % 32); i > 0; --i) s += static_cast<char>(rng() & 0xFF);
        CHECK(tok.decode(tok.encode(s, false)) == s);
    }
}

TEST_CASE("special tokens inside trained-vocabulary text appear as single ids") {
    const tokenizer tok = trained();
    const std::string text = std::string(bos_text) + "hi" + std::string(user_text) + "the fox" +
                             std::string(assistant_text) + std::string(think_text) + "x" +
                             std::string(think_end_text) + "<" + std::string(dsml_text) + "invoke>" +
                             std::string(eos_text);
    const auto out = tok.encode(text, true);
    const ids specials{tok.bos_id(), tok.user_id(), tok.assistant_id(), tok.think_id(), tok.think_end_id(),
                       tok.dsml_id(), tok.eos_id()};
    ids seen;
    for (const auto id : out)
        if (id >= static_cast<std::int32_t>(tok.vocab_size()) - 7) seen.push_back(id);
    CHECK(seen == specials);
    CHECK(out.front() == tok.bos_id());
    CHECK(out.back() == tok.eos_id());
    CHECK(tok.decode(out) == text);
    // Without parse_special the same strings are ordinary text: no special id appears.
    for (const auto id : tok.encode(text, false)) CHECK(id < static_cast<std::int32_t>(tok.vocab_size()) - 7);
}

TEST_CASE("long inputs encode in near-linear time") {
    const tokenizer tok = trained();
    // One 200K-byte "word" (no pre-token boundary) and ~100K tokens of ordinary text.
    const std::string word(200000, 'e');
    std::string text;
    while (text.size() < 400000) text += corpus_text;
    const auto t0 = std::chrono::steady_clock::now();
    const auto a = tok.encode(word, false);
    const auto b = tok.encode(text, true);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(tok.decode(a) == word);
    CHECK(tok.decode(b) == text);
    MESSAGE("encoded " << word.size() + text.size() << " bytes into " << a.size() + b.size() << " tokens in "
                       << seconds << " s");
    CHECK(seconds < 10.0);  // an O(n^2) merge loop takes minutes here
}
