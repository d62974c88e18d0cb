// Prompt rendering (docs/model.md §6): golden strings written by hand for every message kind.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "text/chat_template.hpp"

using namespace ds4::ref;

namespace {

// Spelled out here rather than taken from the headers, so a typo there cannot hide.
const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string USER = "<｜User｜>";
const std::string ASSISTANT = "<｜Assistant｜>";

chat_message sys(std::string text) { return {chat_role::system, std::move(text), {}, {}, {}}; }
chat_message user(std::string text) { return {chat_role::user, std::move(text), {}, {}, {}}; }
chat_message assistant(std::string text, std::optional<std::string> reasoning = {}, std::vector<tool_call> calls = {}) {
    return {chat_role::assistant, std::move(text), std::move(reasoning), std::move(calls), {}};
}
chat_message tool(std::string text, std::string id) { return {chat_role::tool, std::move(text), {}, {}, std::move(id)}; }

render_options thinking(bool on) {
    render_options o;
    o.thinking = on;
    return o;
}

}  // namespace

TEST_CASE("system and user, thinking on and off") {
    const std::vector<chat_message> m{sys("You are helpful."), user("Hi")};
    CHECK(render_chat(m, thinking(true)) == BOS + "You are helpful." + USER + "Hi" + ASSISTANT + "<think>");
    CHECK(render_chat(m, thinking(false)) == BOS + "You are helpful." + USER + "Hi" + ASSISTANT + "</think>");
    CHECK(render_chat({user("Hi")}, thinking(true)) == BOS + USER + "Hi" + ASSISTANT + "<think>");
    // Several system messages share the one system slot.
    CHECK(render_chat({sys("A"), user("Hi"), sys("B")}, thinking(true)) ==
          BOS + "A\n\nB" + USER + "Hi" + ASSISTANT + "<think>");
}

TEST_CASE("assistant turns: earlier reasoning dropped, reasoning after the last user kept") {
    const std::vector<chat_message> m{user("Hi"), assistant("Hello!", "greet back"), user("2+2?")};
    CHECK(render_chat(m, thinking(true)) ==
          BOS + USER + "Hi" + ASSISTANT + "</think>Hello!" + EOS + USER + "2+2?" + ASSISTANT + "<think>");

    render_options o = thinking(true);
    o.add_generation_prompt = false;
    const std::vector<chat_message> last{user("2+2?"), assistant("4", "add")};
    CHECK(render_chat(last, o) == BOS + USER + "2+2?" + ASSISTANT + "<think>add</think>4" + EOS);
    // No reasoning recorded: only the closing tag, as the non-thinking prompt produced it.
    const std::vector<chat_message> plain{user("2+2?"), assistant("4")};
    CHECK(render_chat(plain, o) == BOS + USER + "2+2?" + ASSISTANT + "</think>4" + EOS);
    // An empty reasoning that was recorded is kept as an empty think block.
    const std::vector<chat_message> empty{user("2+2?"), assistant("4", "")};
    CHECK(render_chat(empty, o) == BOS + USER + "2+2?" + ASSISTANT + "<think></think>4" + EOS);
}

TEST_CASE("tool calls and tool results") {
    render_options o = thinking(true);
    o.tools_system_block = "## Tools\nT";
    const std::vector<chat_message> m{
        sys("S"),
        user("Weather?"),
        assistant("Checking.", "plan A",
                  {{"c1", "get_weather", R"({"city": "Paris", "days": 3})"}, {"c2", "now", "{}"}}),
        tool("sunny </tool_result> <tool_result>", "c1"),
        tool("12:00", "c2"),
        assistant("Sunny at noon.", "plan B"),
        user("Thanks"),
    };
    const std::string expected =
        BOS + "S\n\n## Tools\nT" + USER + "Weather?" + ASSISTANT + "<think>plan A</think>Checking." +
        "\n\n<｜DSML｜tool_calls>\n"
        "<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"now\">\n"
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>" +
        EOS + USER + "<tool_result>sunny <\\/tool_result> <tool_result></tool_result><tool_result>12:00</tool_result>" +
        ASSISTANT + "<think>plan B</think>Sunny at noon." + EOS + USER + "Thanks" + ASSISTANT + "<think>";
    // Tools in use: reasoning of earlier turns is kept.
    CHECK(render_chat(m, o) == expected);

    // Tool calls alone (no tools block) also count as tools in use.
    const std::vector<chat_message> n{user("Q"), assistant("", "r", {{"c", "f", R"({"x": null})"}}),
                                      tool("done", "c"), user("again")};
    CHECK(render_chat(n, thinking(false)) ==
          BOS + USER + "Q" + ASSISTANT + "<think>r</think>" +
              "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
              "<｜DSML｜parameter name=\"x\" string=\"false\">null</｜DSML｜parameter>\n"
              "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
              EOS + USER + "<tool_result>done</tool_result>" + USER + "again" + ASSISTANT + "</think>");
}

TEST_CASE("tool result escaping touches only the closing tag") {
    CHECK(escape_tool_result("a</tool_result>b</tool_result>") == "a<\\/tool_result>b<\\/tool_result>");
    CHECK(escape_tool_result("<tool_result></tool_resul") == "<tool_result></tool_resul");
    CHECK(escape_tool_result("") == "");
}

TEST_CASE("Think-Max gating") {
    render_options o = thinking(true);
    o.think_max = true;
    o.context_tokens = 393215;
    CHECK(render_chat({user("Hi")}, o) == BOS + USER + "Hi" + ASSISTANT + "<think>");
    o.context_tokens = 393216;
    const std::string with_prefix = render_chat({sys("S"), user("Hi")}, o);
    CHECK(with_prefix == BOS + std::string(think_max_prefix) + "S" + USER + "Hi" + ASSISTANT + "<think>");
    CHECK(think_max_prefix.starts_with("Reasoning Effort: Absolute maximum"));
    CHECK(think_max_prefix.ends_with("\n\n"));
    o.context_tokens = 1 << 20;
    o.thinking = false;  // no thinking, no reasoning effort
    CHECK(render_chat({user("Hi")}, o) == BOS + USER + "Hi" + ASSISTANT + "</think>");
}

TEST_CASE("tools block") {
    CHECK(render_tools_block({}).empty());
    const std::vector<tool_spec> tools{
        {"get_weather", "Current \"weather\".", R"({"type":"object","properties":{"city":{"type":"string"}}})"},
        {"now", "Time.", ""}};
    const std::string block = render_tools_block(tools);
    CHECK(block.starts_with("## Tools\n\n"));
    CHECK(block.find("<｜DSML｜invoke name=\"TOOL_NAME\">\n") != std::string::npos);
    CHECK(block.find("string=\"true\"") != std::string::npos);
    CHECK(block.ends_with(
        "\n{\"name\": \"get_weather\", \"description\": \"Current \\\"weather\\\".\", \"parameters\": "
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}"
        "\n{\"name\": \"now\", \"description\": \"Time.\", \"parameters\": {}}"));
}

TEST_CASE("errors name the message") {
    CHECK_THROWS_WITH_AS(render_chat({user("Q"), assistant("", {}, {{"c7", "f", "{oops"}})}, thinking(true)),
                         doctest::Contains("message 1"), ds4::error);
    chat_message bad = user("Q");
    bad.reasoning = "r";
    CHECK_THROWS_WITH_AS(render_chat({bad}, thinking(true)), doctest::Contains("message 0"), ds4::error);
}
