// DSML (docs/model.md §6): the flat JSON reader, rendering, complete parsing, and the streaming parser
// fed at every split point, which must produce the same events as one feed.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "text/dsml.hpp"

using namespace ds4::ref;
using kind = dsml_event::kind;

namespace {

// Hand-written DSML, spelled out instead of built from the parser's constants.
const std::string well_formed =
    "Let me check.\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris \"Île\"\n東京</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"units\": [\"C\", \"F\"]}</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"noop\">\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>";

const std::vector<dsml_event> well_formed_events{
    {kind::text, "Let me check."},
    {kind::tool_call_begin, "get_weather"},
    {kind::arguments, "{\"city\":\"Paris \\\"Île\\\"\\n東京\",\"days\":3,\"opts\":{\"units\": [\"C\", \"F\"]}}"},
    {kind::tool_call_end, ""},
    {kind::tool_call_begin, "noop"},
    {kind::arguments, "{}"},
    {kind::tool_call_end, ""},
};

// Merges adjacent text/arguments deltas, so differently chunked streams compare equal.
std::vector<dsml_event> coalesce(const std::vector<dsml_event>& in) {
    std::vector<dsml_event> out;
    for (const auto& e : in) {
        const bool mergeable = e.type == kind::text || e.type == kind::arguments;
        if (mergeable && !out.empty() && out.back().type == e.type) out.back().data += e.data;
        else out.push_back(e);
    }
    return out;
}

void append(std::vector<dsml_event>& all, std::vector<dsml_event> more) {
    for (auto& e : more) all.push_back(std::move(e));
}

std::vector<dsml_event> stream(std::string_view s, std::vector<std::size_t> cuts) {
    dsml_stream_parser p;
    std::vector<dsml_event> all;
    std::size_t at = 0;
    cuts.push_back(s.size());
    for (const std::size_t c : cuts) {
        append(all, p.feed(s.substr(at, c - at)));
        at = c;
    }
    append(all, p.finish());
    return all;
}

bool valid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        const std::size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (std::size_t k = 1; k < n; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

// Every single split point and every pair of split points give the events of one feed.
void check_all_splits(const std::string& s, const std::vector<dsml_event>& expected) {
    REQUIRE(coalesce(stream(s, {})) == expected);
    for (std::size_t i = 0; i <= s.size(); ++i) {
        CHECK(coalesce(stream(s, {i})) == expected);
        for (std::size_t j = i; j <= s.size(); j += 7) CHECK(coalesce(stream(s, {i, j})) == expected);
    }
    std::vector<std::size_t> bytes;
    for (std::size_t i = 1; i < s.size(); ++i) bytes.push_back(i);
    const auto one_by_one = stream(s, bytes);
    CHECK(coalesce(one_by_one) == expected);
    for (const auto& e : one_by_one) CHECK(valid_utf8(e.data));  // deltas never cut a character
}

}  // namespace

TEST_CASE("json object reader") {
    const auto m = parse_json_object(R"( {"s": "a\u00e9\ud83d\ude00\n\"", "n": -1.5e3, "b": true, "z": null,
                                         "o": {"x": [1, 2, {"y": "}"}]}, "e": ""} )");
    REQUIRE(m.size() == 6);
    CHECK(m[0].key == "s");
    CHECK(m[0].is_string);
    CHECK(m[0].value == "aé\U0001F600\n\"");
    CHECK((m[1].value == "-1.5e3" && !m[1].is_string));
    CHECK(m[2].value == "true");
    CHECK(m[3].value == "null");
    CHECK(m[4].value == R"({"x": [1, 2, {"y": "}"}]})");  // nested values are kept as written
    CHECK((m[5].value.empty() && m[5].is_string));
    CHECK(parse_json_object("").empty());
    CHECK(parse_json_object("{}").empty());
    for (const char* bad : {"{\"a\":}", "{\"a\":1,}", "[1]", "{\"a\":\"\\ud800\"}", "{\"a\":01}", "{\"a\":tru}",
                            "{\"a\":1} x", "{a:1}", "{\"a\":\"x\ny\"}", "{\"a\":[1,]}"}) {
        INFO(bad);
        CHECK_THROWS_AS(parse_json_object(bad), ds4::error);
    }
    CHECK(json_quote("a\"b\\c\n\x01é") == "\"a\\\"b\\\\c\\n\\u0001é\"");
}

TEST_CASE("render DSML tool calls") {
    const std::vector<tool_call> calls{
        {"call_1", "get_weather", R"({"city": "Paris \"Île\"\n東京", "days": 3, "opts": {"units": ["C", "F"]}})"},
        {"call_2", "noop", "{}"}};
    CHECK("Let me check." + render_dsml_tool_calls(calls) == well_formed);
    CHECK(render_dsml_tool_calls({}).empty());
    const std::vector<tool_call> bad{{"call_9", "f", "{\"a\":"}};
    CHECK_THROWS_WITH_AS(render_dsml_tool_calls(bad), doctest::Contains("call_9"), ds4::error);
}

TEST_CASE("parse well-formed DSML") {
    const dsml_result r = parse_dsml(well_formed);
    CHECK(r.status == dsml_status::ok);
    CHECK(r.content == "Let me check.");
    REQUIRE(r.calls.size() == 2);
    CHECK(r.calls[0].name == "get_weather");
    CHECK(r.calls[0].arguments == well_formed_events[2].data);
    CHECK(r.calls[1].name == "noop");
    CHECK(r.calls[1].arguments == "{}");
    // The arguments are JSON that means what was written.
    const auto args = parse_json_object(r.calls[0].arguments);
    REQUIRE(args.size() == 3);
    CHECK(args[0].value == "Paris \"Île\"\n東京");
    // Plain text passes through untouched.
    const dsml_result plain = parse_dsml("Just text, <b>no</b> tools \xEF\xBD\x9C.");
    CHECK(plain.content == "Just text, <b>no</b> tools \xEF\xBD\x9C.");
    CHECK(plain.calls.empty());
}

TEST_CASE("streaming: every split point gives the same events") {
    check_all_splits(well_formed, well_formed_events);
    check_all_splits("no block here\n\n<not dsml> 東京\n", {{kind::text, "no block here\n\n<not dsml> 東京\n"}});
    // Text after a block and a second block.
    const std::string two = "a<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"></｜DSML｜invoke></｜DSML｜tool_calls>b\n\n"
                            "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"k\" "
                            "string=\"true\"></｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n";
    check_all_splits(two, {{kind::text, "a"},
                           {kind::tool_call_begin, "f"},
                           {kind::arguments, "{}"},
                           {kind::tool_call_end, ""},
                           {kind::text, "b"},
                           {kind::tool_call_begin, "g"},
                           {kind::arguments, "{\"k\":\"\"}"},
                           {kind::tool_call_end, ""},
                           {kind::text, "\n"}});
}

TEST_CASE("streaming holds back only what could start a tag") {
    dsml_stream_parser p;
    CHECK(p.feed("Hello <｜DS") == std::vector<dsml_event>{{kind::text, "Hello "}});
    CHECK(p.feed("ML｜x") == std::vector<dsml_event>{{kind::text, "<｜DSML｜x"}});
    CHECK(p.feed("a\n") == std::vector<dsml_event>{{kind::text, "a"}});  // may be the "\n\n" before a block
    CHECK(p.feed("b") == std::vector<dsml_event>{{kind::text, "\nb"}});
    CHECK(p.feed("\xE6\x9D") == std::vector<dsml_event>{});  // incomplete UTF-8
    CHECK(p.feed("\xB1") == std::vector<dsml_event>{{kind::text, "東"}});
    CHECK(p.feed("<").empty());
    CHECK(p.finish() == std::vector<dsml_event>{{kind::text, "<"}});
    CHECK(p.status() == dsml_status::ok);

    // Argument values stream as they arrive, held back only before a possible closing tag.
    dsml_stream_parser q;
    auto e = q.feed("<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"s\" string=\"true\">ab");
    CHECK(coalesce(e) == std::vector<dsml_event>{{kind::tool_call_begin, "f"}, {kind::arguments, "{\"s\":\"ab"}});
    CHECK(q.feed("c</｜DSML") == std::vector<dsml_event>{{kind::arguments, "c"}});
    CHECK(q.feed("｜parameter>").front() == dsml_event{kind::arguments, "\""});
}

TEST_CASE("malformed DSML") {
    // The opener without the grammar after it, before any call: plain text, parsing goes on.
    const std::string mention = "Write <｜DSML｜tool_calls> then invoke.\n\n<｜DSML｜tool_calls>oops";
    const dsml_result r = parse_dsml(mention);
    CHECK(r.status == dsml_status::ok);
    CHECK(r.content == mention);
    CHECK(r.calls.empty());
    check_all_splits(mention, {{kind::text, mention}});

    // Broken after a call began: the complete parser returns the text as plain text, the stream
    // (which already announced the call) reports an error.
    const std::string broken =
        "ok<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\ngarbage</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const dsml_result b = parse_dsml(broken);
    CHECK(b.status == dsml_status::malformed);
    CHECK(b.content == broken);
    CHECK(b.calls.empty());
    CHECK(!b.error.empty());
    for (std::size_t i = 0; i <= broken.size(); ++i) {
        const auto events = coalesce(stream(broken, {i}));
        REQUIRE(events.size() == 4);
        CHECK(events[0] == dsml_event{kind::text, "ok"});
        CHECK(events[1] == dsml_event{kind::tool_call_begin, "f"});
        CHECK(events[2] == dsml_event{kind::arguments, "{"});
        CHECK(events[3].type == kind::error);
    }
    for (const char* bad_param : {"<｜DSML｜parameter name=\"k\" string=\"maybe\">1</｜DSML｜parameter>",
                                  "<｜DSML｜parameter name=\"\" string=\"true\">1</｜DSML｜parameter>",
                                  "<｜DSML｜parameter name=\"k\">1</｜DSML｜parameter>"}) {
        INFO(bad_param);
        const auto x = parse_dsml(std::string("<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">") + bad_param +
                                  "</｜DSML｜invoke></｜DSML｜tool_calls>");
        CHECK(x.status == dsml_status::malformed);
        CHECK(x.calls.empty());
    }
}

TEST_CASE("unterminated DSML is an error state") {
    const std::string cut =
        "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n"
        "<｜DSML｜parameter name=\"a\" string=\"true\">abc";
    const dsml_result r = parse_dsml(cut);
    CHECK(r.status == dsml_status::unterminated);
    CHECK(r.content == "x");
    REQUIRE(r.calls.size() == 1);  // only the completed call
    CHECK(r.calls[0].name == "f");
    CHECK(!r.error.empty());
    dsml_stream_parser p;
    const auto events = coalesce(p.feed(cut));
    CHECK(events.back() == dsml_event{kind::arguments, "{\"a\":\"abc"});
    const auto end = p.finish();
    REQUIRE(end.size() == 1);
    CHECK(end[0].type == kind::error);
    CHECK(p.status() == dsml_status::unterminated);
    CHECK(parse_dsml("y<｜DSML｜tool_calls>").status == dsml_status::unterminated);
}
