// The chat template interpreter, one construct at a time: whitespace control, statements,
// expressions with Python's semantics, filters, tests, methods, the generation tag, the loader of
// tokenizer_config.json, and the refusals (bad syntax with line and column, hostile templates
// bounded). Expected strings were checked against Python's Jinja2 in Hugging Face's environment;
// test_chat_template_oracle.cpp compares whole real templates against it.
#include <gtest/gtest.h>

#include <ctime>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_template.h"
#include "test_util.h"

namespace primus::data {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& tmpl, const ojson& vars = ojson::object()) {
  return ChatTemplate(tmpl).render(vars).text;
}

// The error text of rendering (or parsing) `tmpl`; empty when it succeeds.
std::string error_of(const std::string& tmpl, const ojson& vars = ojson::object(), ChatTemplateLimits limits = {}) {
  try {
    ChatTemplate(tmpl, limits).render(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, TextAndOutput) {
  EXPECT_EQ(render("Hello {{ name }}!", {{"name", "world"}}), "Hello world!");
  EXPECT_EQ(render("{{ 'a' 'b' }}{# gone #}c"), "abc");
  EXPECT_EQ(render("a\n"), "a");  // keep_trailing_newline=False
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("a\r\nb{{ 'c\r\nd' }}"), "a\nbc\nd");
}

TEST(ChatTemplate, WhitespaceControlMatchesHuggingFacesSettings) {
  EXPECT_EQ(render("  {% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");  // trim_blocks + lstrip_blocks
  EXPECT_EQ(render("  {# c #}\nb"), "b");
  EXPECT_EQ(render("a {# c #}\nb"), "a b");
  EXPECT_EQ(render("x  {% if true %}y{% endif %}"), "x  y");  // not at a line's start
  EXPECT_EQ(render("a\n  {%+ if true %}x{% endif %}"), "a\n  x");
  EXPECT_EQ(render("a\n  {%- if true %}x{% endif %}"), "ax");
  EXPECT_EQ(render("a\n  {{- 1 -}}\n b"), "a1b");
  EXPECT_EQ(render("{% if true -%}\n\n  x{%- endif %}"), "x");
  EXPECT_EQ(render("a\n{{ 1 }}\nb"), "a\n1\nb");  // no trimming after }}
}

TEST(ChatTemplate, IfElifElse) {
  const std::string t = "{% if x > 2 %}big{% elif x > 0 %}small{% else %}none{% endif %}";
  EXPECT_EQ(render(t, {{"x", 3}}), "big");
  EXPECT_EQ(render(t, {{"x", 1}}), "small");
  EXPECT_EQ(render(t, {{"x", 0}}), "none");
}

TEST(ChatTemplate, ForLoopVariablesElseAndControls) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ x }}{% if loop.first %}F{% endif %}"
                   "{% if loop.last %}L{% endif %}{{ loop.index0 }}{{ loop.revindex }} {% endfor %}",
                   {{"xs", {"a", "b"}}}),
            "1/2aF02 2/2bL11 ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() if k != 'b' %}{{k}}={{v}} {{ loop.index }}/{{ loop.length }} {% endfor %}",
                   {{"d", {{"a", 1}, {"b", 2}, {"c", 3}}}}),
            "a=1 1/2 c=3 2/2 ");
  EXPECT_EQ(render(
                "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
                "{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for c in 'héllo' %}[{{ c }}]{% endfor %}"), "[h][é][l][l][o]");
  EXPECT_EQ(render("{% for x in undefined_thing %}x{% endfor %}."), ".");
}

TEST(ChatTemplate, ScopingFollowsJinja) {
  // A loop body is a fresh scope each iteration; `set` inside `if` stays in the enclosing scope.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}{{ x }}"), "01020");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}"),
            "4");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.x = 'v' %}{{ ns.x }}"), "v");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% set x %}hi {{ 1 }}{% endset %}[{{ x }}]"), "[hi 1]");
}

TEST(ChatTemplate, Macros) {
  EXPECT_EQ(render("{% macro f(a, b=2) %}{{a}}-{{b}}{% endmacro %}{{ f(1) }} {{ f(1, b=3) }} {{ f(b=4, a=0) }}"),
            "1-2 1-3 0-4");
  EXPECT_NE(error_of("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}").find("takes not more than 1"), std::string::npos);
}

TEST(ChatTemplate, PythonValuesPrintAsPython) {
  EXPECT_EQ(render("{{ 'x' ~ none }}{{ none }}{{ true }}{{ [1,'a',none, 1.0] }}{{ {'a': 1} }}{{ (1,2) }}{{ ('a',) }}"),
            "xNoneNoneTrue[1, 'a', None, 1.0]{'a': 1}(1, 2)('a',)");
  EXPECT_EQ(render("{{ [\"it's\", 'a\"b', 'a\\nb', 'é'] }}"), "[\"it's\", 'a\"b', 'a\\nb', 'é']");
  EXPECT_EQ(render("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 10/2 }}"),
            "1e+16 1000000000000000.0 0.0001 1e-05 0.3333333333333333 5.0");
  EXPECT_EQ(render("{{ x }}|{{ x | length }}|{{ x is none }}"), "|0|False");
}

TEST(ChatTemplate, Arithmetic) {
  EXPECT_EQ(render("{{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1 + 1.5 }} {{ 3 == 3.0 }} {{ true + 1 }}"),
            "3 -4 2 1024 2.5 True 2");
  EXPECT_EQ(render("{{ [1,2] + [3] }} {{ 'ab' * 3 }} {{ 'a' ~ 1 ~ none }} {{ '%s-%d' % ('a', 3) }}"),
            "[1, 2, 3] ababab a1None a-3");
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand types for +: 'str' and 'int'"), std::string::npos);
  EXPECT_NE(error_of("{{ 5 % 0 }}").find("modulo by zero"), std::string::npos);
}

TEST(ChatTemplate, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 'a' in 'abc' }} {{ 1 not in [1] }} {{ not 1 in [1] }} {{ 'k' in {'k': 1} }}"),
            "True True False False True");
  EXPECT_EQ(render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ none or [] }} {{ 'a' if false else 'b' }}|{{ 'a' if false }}|"),
            "x y [] b||");
  EXPECT_EQ(render("{{ [1, 2] == [1, 2] }}{{ none == none }}{{ x == none }}{{ 1 == true }}"), "TrueTrueFalseTrue");
}

TEST(ChatTemplate, AttributesItemsAndSlices) {
  const ojson vars = {{"m", {{"role", "user"}, {"content", "hi"}}}, {"xs", {1, 2, 3, 4}}};
  EXPECT_EQ(render("{{ m.role }} {{ m['content'] }} {{ m.missing is defined }} {{ xs[-1] }} {{ xs[9] is defined }}",
                   vars),
            "user hi False 4 False");
  EXPECT_EQ(render("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ 'abc'[::-1] }} {{ 'héllo'[1:3] }}",
                   vars),
            "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] cba él");
  EXPECT_EQ(render("{{ none.x }}|{{ m.content.upper() }}", vars), "|HI");
  EXPECT_NE(error_of("{{ x.y }}").find("'x' is undefined"), std::string::npos);
}

TEST(ChatTemplate, Filters) {
  EXPECT_EQ(
      render("{{ '  x  '|trim }}|{{ 'xx-a-xx'|trim('x') }}|{{ 'Hi'|upper }}{{ 'Hi'|lower }}|{{ 'hello world'|title }}"),
      "x|-a-|HIhi|Hello World");
  EXPECT_EQ(render("{{ [1,2,3]|join(', ') }} {{ 'x'|default('y') }} {{ z|default('y') }} {{ ''|default('y', true) }}"),
            "1, 2, 3 x y y");
  EXPECT_EQ(
      render("{{ [3,1]|first }}{{ 'abc'|last }}{{ {'a':1}|list }}{{ 'ab'|list }}{{ [1,2]|string }}{{ [1,2]|length }}"),
      "3c['a']['a', 'b'][1, 2]2");
  EXPECT_EQ(render("{{ 'aaa'|replace('a','x', 2) }} {{ {'a': 1}|items|list }} {{ [1,2,3]|reverse|list }}"),
            "xxa [('a', 1)] [3, 2, 1]");
  EXPECT_EQ(
      render("{{ [{'a':1},{'a':2}]|selectattr('a','equalto',2)|list }}{{ [{'a':1},{'a':2}]|map(attribute='a')|list }}"
             "{{ ['A','b']|map('lower')|join }}{{ [1,2,3,4]|select('odd')|list }}{{ "
             "['x','code']|reject('equalto','code')|list }}"),
      "[{'a': 2}][1, 2]ab[1, 3]['x']");
  EXPECT_EQ(render("{{ 1.0|int }} {{ '3'|int }} {{ 3|float }} {{ 2.5|round }} {{ -3|abs }} {{ 'aBc'|capitalize }}"),
            "1 3 3.0 3.0 3 Abc");
}

TEST(ChatTemplate, ToJsonIsPythonsJsonDumps) {
  const ojson vars = {
      {"t", {{"name", "f"}, {"z", 1.5}, {"a", {1, nullptr, true}}, {"s", "é\n\"\u2028"}, {"e", ojson::object()}}}};
  EXPECT_EQ(render("{{ t|tojson }}", vars),
            "{\"name\": \"f\", \"z\": 1.5, \"a\": [1, null, true], \"s\": \"é\\n\\\"\u2028\", \"e\": {}}");
  EXPECT_EQ(render("{{ {'a':{'b':[]}, 'c': [1, 2]}|tojson(indent=2) }}"),
            "{\n  \"a\": {\n    \"b\": []\n  },\n  \"c\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ 1.0|tojson }} {{ 'x'|tojson }} {{ none|tojson }}"), "1.0 \"x\" null");
}

TEST(ChatTemplate, TestsAndStringMethods) {
  EXPECT_EQ(render("{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}{{ x is defined }}"
                   "{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ none is none }}{{ 1 is not string }}"),
            "TrueTrueTrueTrueFalseTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ '  a b  '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a b c'.split(' ', 1) }}"),
            "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b c']");
  EXPECT_EQ(
      render("{{ 'hello world'.title() }} {{ 'ß'.upper() }} {{ 'xxaxx'.strip('x') }} {{ '\\n\\na\\n'.lstrip('\\n') }}"
             "{{ 'abc'.startswith(('x','a')) }}{{ 'abc'.endswith('bc') }} {{ 'a-b'.replace('-', '+') }}"),
      "Hello World SS a a\nTrueTrue a+b");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys()|list }}{{ d.values()|list }}",
                   {{"d", {{"a", 1}}}}),
            "1None5['a'][1]");
}

TEST(ChatTemplate, RaiseExceptionNamesTheTemplatesMessage) {
  const std::string e = error_of("line one\n{{ raise_exception('Conversation roles must alternate') }}");
  EXPECT_NE(e.find("the template raised an error: Conversation roles must alternate"), std::string::npos) << e;
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
}

TEST(ChatTemplate, StrftimeNow) {
  char year[8];
  const std::time_t now = std::time(nullptr);
  std::strftime(year, sizeof year, "%Y", std::localtime(&now));
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), year);
}

TEST(ChatTemplate, GenerationSpans) {
  ChatTemplate t(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}");
  EXPECT_TRUE(t.has_generation_blocks());
  ChatRenderInput in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "hé"}, {"role": "assistant", "content": "yö"},
                                 {"role": "user", "content": "x"}, {"role": "assistant", "content": "z"}])");
  const Rendered r = t.render(in);
  EXPECT_EQ(r.text, "<user>hé<assistant>yö</s><user>x<assistant>z</s>");
  ASSERT_EQ(r.generation_spans.size(), 2u);
  EXPECT_EQ(r.text.substr(r.generation_spans[0].first, r.generation_spans[0].second - r.generation_spans[0].first),
            "yö</s>");
  EXPECT_EQ(r.text.substr(r.generation_spans[1].first), "z</s>");
  EXPECT_FALSE(ChatTemplate("{{ 1 }}").has_generation_blocks());
}

TEST(ChatTemplate, RenderInputPassesWhatHuggingFacePasses) {
  ChatTemplate t(
      "{{ bos_token }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}{{ messages|length }}"
      "{{ enable_thinking }}{{ eos_token }}");
  ChatRenderInput in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "q"}])");
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.add_generation_prompt = true;
  in.extra["enable_thinking"] = false;
  EXPECT_EQ(t.render(in).text, "<s>TrueTrueTrue1False</s>");
}

TEST(ChatTemplate, ParseErrorsNameLineAndColumn) {
  const std::string e1 = error_of("ok\n{% if x %}\nno end");
  EXPECT_NE(e1.find("line 2, column 1"), std::string::npos) << e1;
  EXPECT_NE(e1.find("never closed with {% endif %}"), std::string::npos) << e1;
  const std::string e2 = error_of("{{ a + }}");
  EXPECT_NE(e2.find("line 1, column 8: expected an expression"), std::string::npos) << e2;
  EXPECT_NE(error_of("{% include 'x' %}").find("'{% include %}' tag is not supported"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc }}").find("the string is never closed"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("no filter named 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{{ x.y.z }}").find("'y' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{% set l = [] %}{{ l.append(1) }}").find("immutable sandbox"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.a = 2 %}").find("not a namespace()"), std::string::npos);
}

TEST(ChatTemplate, HostileTemplatesFailCleanly) {
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nests more than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}").find("nests more than"),
            std::string::npos);
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  EXPECT_NE(error_of(blocks).find("nests more than"), std::string::npos);
  ChatTemplateLimits small;
  small.max_output_bytes = 1000;
  small.max_steps = 10000;
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     ojson::object(), small)
                .find("more than 10000 steps"),
            std::string::npos);
  EXPECT_NE(
      error_of("{% for i in range(2000) %}xx{% endfor %}", ojson::object(), small).find("would exceed 1000 bytes"),
      std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000 }}", ojson::object(), small).find("larger than"), std::string::npos);
  EXPECT_NE(error_of("{{ range(1000000) }}").find("at most 100000"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("more than 64 deep"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("nest more than 128 levels"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("bad \xff byte").find("not valid UTF-8"), std::string::npos);
}

TEST(ChatTemplate, LoadsTheTemplateOfATokenizerConfig) {
  const nlohmann::json plain = {{"chat_template", "{{ 1 }}"}};
  EXPECT_EQ(chat_template_from_config(plain, "cfg"), "{{ 1 }}");
  const nlohmann::json listed = {
      {"chat_template", {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}};
  EXPECT_EQ(chat_template_from_config(listed, "cfg"), "D");
  EXPECT_EQ(chat_template_from_config(listed, "cfg", "tool_use"), "T");
  try {
    chat_template_from_config(listed, "cfg 'x'", "rag");
    FAIL() << "a missing name must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template named 'rag' (it has: tool_use, default)"),
              std::string::npos);
  }
  EXPECT_THROW(chat_template_from_config(nlohmann::json::object(), "cfg"), Error);

  const auto dir = testing::temp_dir();
  testing::spit(dir / "tokenizer_config.json", R"({"chat_template": "{{ messages[0].content }}"})");
  EXPECT_EQ(read_chat_template(dir), "{{ messages[0].content }}");
  EXPECT_EQ(read_chat_template(dir / "tokenizer_config.json"), "{{ messages[0].content }}");
  testing::spit(dir / "chat_template.jinja", "from the file");
  EXPECT_EQ(read_chat_template(dir), "from the file");
}

}  // namespace
}  // namespace primus::data
