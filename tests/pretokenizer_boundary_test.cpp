// The pre-tokenizer's rule ORDER (docs/model.md §6: first match wins). Each case below is a text
// where two rules both match at the same position and the spec's order decides the piece, so
// moving any rule before another that it overlaps changes one of these splits. Expected pieces
// are worked by hand from the nine rules:
//   1 digits (1-3)  2 CJK/kana run  3 punct + ASCII letters  4 letter run  5 one non-newline
//   non-punct char + letters  6 space + punct run + CR/LF  7 punct run + CR/LF  8 whitespace
//   9 one char.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace {

using pieces = std::vector<std::string>;

pieces split(std::string_view s) {
    pieces out;
    for (const auto p : ds4::ref::pretokenize(s)) out.emplace_back(p);
    return out;
}

}  // namespace

TEST_CASE("pretokenizer order: rule 1 (digits) before rule 5 (char + letters)") {
    CHECK(split("3D") == pieces{"3", "D"});
    CHECK(split("2x") == pieces{"2", "x"});
    CHECK(split("1234abc") == pieces{"123", "4", "abc"});
    CHECK(split("9é") == pieces{"9", "é"});  // a non-ASCII letter follows: still rule 1
}

TEST_CASE("pretokenizer order: rule 2 (CJK) before rule 5 and after nothing that takes CJK") {
    CHECK(split("日a") == pieces{"日", "a"});
    CHECK(split("日本abc") == pieces{"日本", "abc"});
    CHECK(split("カナé") == pieces{"カナ", "é"});
    CHECK(split("a日") == pieces{"a", "日"});   // rule 4 stops at CJK
    CHECK(split("日3") == pieces{"日", "3"});
}

TEST_CASE("pretokenizer order: rule 3 (punct + ASCII letters) before rule 7 (punct run)") {
    CHECK(split("+x") == pieces{"+x"});
    CHECK(split(".Net\n") == pieces{".Net", "\n"});
    CHECK(split("+=x") == pieces{"+=", "x"});     // two punctuation chars: rule 7, then rule 4
    CHECK(split("#é") == pieces{"#", "é"});       // a non-ASCII letter does not make rule 3
}

TEST_CASE("pretokenizer order: rule 5 (char + letters) before rule 8 (whitespace) and rule 9") {
    CHECK(split(" word") == pieces{" word"});
    CHECK(split("\tword") == pieces{"\tword"});
    CHECK(split("  word") == pieces{" ", " word"});
    CHECK(split("\x01" "ab") == pieces{"\x01" "ab"});  // a control char leads a word (rule 5, not 9)
    CHECK(split("\nword") == pieces{"\n", "word"});    // but a newline never does
    CHECK(split("\rword") == pieces{"\r", "word"});
}

TEST_CASE("pretokenizer order: rule 6 (space + punct) before rule 8 (whitespace)") {
    CHECK(split(" !") == pieces{" !"});
    CHECK(split(" ;\n") == pieces{" ;\n"});
    CHECK(split("  ;") == pieces{" ", " ;"});
    CHECK(split(" +x") == pieces{" +", "x"});     // rule 6 takes the whole punct run only
}

TEST_CASE("pretokenizer order: rule 4 (letters) and rule 5 agree, rule 4 before 9") {
    CHECK(split("ab1") == pieces{"ab", "1"});
    CHECK(split("é!") == pieces{"é", "!"});
    CHECK(split("x\x01") == pieces{"x", "\x01"});
}

TEST_CASE("pretokenizer order: mixed text crossing every boundary") {
    CHECK(split("3D 日a +x  ;\nGo2x") ==
          pieces{"3", "D", " ", "日", "a", " +", "x", " ", " ;\n", "Go", "2", "x"});
}
