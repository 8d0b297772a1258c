// Our chat template renderer against Python's Jinja2 in Hugging Face's environment
// (hf_chat_template_oracle.py, which builds what transformers' apply_chat_template builds), byte for
// byte: the real chat templates of Llama 3.1 Instruct, Qwen2.5 Instruct, Qwen3, DeepSeek-V3,
// Mistral Nemo Instruct and Gemma 3 (tests/data/chat_templates, sources in its README) on
// multi-turn conversations with and without system prompts, tools and thinking, with and without
// add_generation_prompt; then every construct of test_chat_template.cpp and more, generation spans
// included. The oracle needs Python 3 with Jinja2 (Debian's python3-jinja2, from
// scripts/setup.sh); without it the tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_template.h"
#include "test_util.h"

namespace primus::data {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const fs::path kRoot = fs::path(PRIMUS_SOURCE_DIR);

struct Case {
  std::string label;
  std::string tmpl;
  ojson vars;
};

// The first Python 3 that imports jinja2, or "" when none does.
std::string oracle_python() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    std::string out;
    if (testing::run(std::string(py) + " -c 'import jinja2' 2>/dev/null", out) == 0) return py;
  }
  return "";
}

// Renders every case with the oracle in one Python process.
ojson oracle_render(const std::string& python, const std::vector<Case>& cases) {
  ojson in = ojson::array();
  for (const Case& c : cases) in.push_back({{"template", c.tmpl}, {"variables", c.vars}});
  const fs::path dir = testing::temp_dir();
  testing::spit(dir / "cases.json", in.dump());
  std::string out;
  const std::string cmd = python + " " + (kRoot / "tests/oracles/hf_chat_template_oracle.py").string() + " " +
                          (dir / "cases.json").string();
  EXPECT_EQ(testing::run(cmd, out), 0) << cmd;
  return ojson::parse(out);
}

// Each case rendered by us must equal the oracle's text and generation spans, or fail where it fails;
// `failing` cases are expected to fail (so that a broken oracle cannot pass by failing everywhere).
void expect_same_as_oracle(const std::vector<Case>& cases, size_t failing) {
  const std::string python = oracle_python();
  if (python.empty()) GTEST_SKIP() << "no Python 3 with jinja2 (install python3-jinja2, as scripts/setup.sh does)";
  const ojson expected = oracle_render(python, cases);
  ASSERT_EQ(expected.size(), cases.size());
  EXPECT_EQ(size_t(std::count_if(expected.begin(), expected.end(), [](const ojson& r) { return r.contains("error"); })),
            failing)
      << expected.dump(1);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    const ojson& want = expected[i];
    try {
      const Rendered got = ChatTemplate(cases[i].tmpl).render(cases[i].vars);
      ASSERT_FALSE(want.contains("error")) << "the oracle failed with " << want["error"] << ", we rendered:\n"
                                           << got.text;
      EXPECT_EQ(got.text, want["text"].get<std::string>());
      std::vector<std::pair<size_t, size_t>> spans;
      for (const auto& s : want["spans"]) spans.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
      EXPECT_EQ(got.generation_spans, spans);
    } catch (const Error& e) {
      EXPECT_TRUE(want.contains("error")) << "we failed with: " << e.what() << "\nthe oracle rendered:\n" << want;
    }
  }
}

std::string fixture(const std::string& name) {
  return testing::slurp(kRoot / "tests/data/chat_templates" / (name + ".jinja"));
}

struct Model {
  std::string fixture, bos, eos;
};

const std::vector<Model>& models() {
  static const std::vector<Model> m = {
      {"llama3_1_instruct", "<|begin_of_text|>", "<|eot_id|>"},
      {"qwen2_5_instruct", "", "<|im_end|>"},
      {"qwen3", "", "<|im_end|>"},
      {"deepseek_v3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
      {"mistral_nemo_instruct_2407", "<s>", "</s>"},
      {"gemma3", "<bos>", "<eos>"},
  };
  return m;
}

// Conversations: with a system prompt and several turns, without one, ending on the user or the
// assistant, with text that trim would change, non-ASCII, quotes and Qwen3-style thinking.
std::vector<std::pair<std::string, ojson>> conversations() {
  return {
      {"system_multi_turn", ojson::parse(R"([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is 6."}])")},
      {"no_system_ends_on_user", ojson::parse(R"([
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi, how can I help?"},
        {"role": "user", "content": "Tell me a joke."}])")},
      {"whitespace_unicode_quotes", ojson::parse(R"([
        {"role": "system", "content": "  Réponds en français.\n"},
        {"role": "user", "content": "\n  Qu'est-ce que \"naïve\" ? 日本語 🎉  \n"},
        {"role": "assistant", "content": "  C'est un mot.\n\n"},
        {"role": "user", "content": "Merci"}])")},
      {"thinking", ojson::parse(R"([
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\nCheck divisors 2, 3.\n</think>\n\nYes, 7 is prime."},
        {"role": "user", "content": "And 9?"},
        {"role": "assistant", "content": "<think>\n9 = 3 * 3.\n</think>\n\nNo."}])")},
      {"single_user", ojson::parse(R"([{"role": "user", "content": "Hi"}])")},
  };
}

ojson variables(const Model& m, const ojson& messages, bool generation_prompt, const ojson& tools = nullptr) {
  ojson v = {
      {"messages", messages}, {"tools", tools}, {"documents", nullptr}, {"add_generation_prompt", generation_prompt}};
  if (!m.bos.empty()) v["bos_token"] = m.bos;
  if (!m.eos.empty()) v["eos_token"] = m.eos;
  return v;
}

TEST(ChatTemplateOracle, RealTemplatesOnConversations) {
  std::vector<Case> cases;
  for (const Model& m : models()) {
    const std::string t = fixture(m.fixture);
    for (const auto& [name, messages] : conversations())
      for (bool gp : {false, true})
        cases.push_back({m.fixture + "/" + name + (gp ? "/generation_prompt" : ""), t, variables(m, messages, gp)});
  }
  // Qwen3 with thinking switched off, Llama 3.1 with its date variable, Gemma 3 refusing roles that
  // do not alternate (both must fail).
  ojson q3 = variables(models()[2], conversations()[1].second, true);
  q3["enable_thinking"] = false;
  cases.push_back({"qwen3/enable_thinking=false", fixture("qwen3"), q3});
  ojson l31 = variables(models()[0], conversations()[0].second, true);
  l31["date_string"] = "01 Jan 2025";
  cases.push_back({"llama3_1/date_string", fixture("llama3_1_instruct"), l31});
  cases.push_back({"gemma3/roles_must_alternate", fixture("gemma3"),
                   variables(models()[5], ojson::parse(R"([{"role": "user", "content": "a"},
                                                            {"role": "user", "content": "b"}])"),
                             false)});
  expect_same_as_oracle(cases, 1);
}

TEST(ChatTemplateOracle, RealTemplatesWithTools) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Get the weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}])");
  const ojson messages = ojson::parse(R"([
      {"role": "system", "content": "Use tools when useful."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21.5}"},
      {"role": "assistant", "content": "It is 21.5 °C in Paris."}])");
  std::vector<Case> cases;
  for (size_t i : {0, 1, 2, 4})  // the templates that take tools: Llama 3.1, Qwen2.5, Qwen3, Mistral Nemo
    for (bool gp : {false, true})
      cases.push_back({models()[i].fixture + "/tools" + (gp ? "/generation_prompt" : ""), fixture(models()[i].fixture),
                       variables(models()[i], messages, gp, tools)});
  // DeepSeek-V3's tool calls carry their arguments as a JSON string and no content.
  const ojson ds = ojson::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "content": "21.5"},
      {"role": "assistant", "content": "21.5 °C."}])");
  cases.push_back({"deepseek_v3/tools", fixture("deepseek_v3"), variables(models()[3], ds, true)});
  expect_same_as_oracle(cases, 0);
}

// Each construct, and the ways whitespace control, scoping and Python's values can differ.
TEST(ChatTemplateOracle, Constructs) {
  const ojson vars = ojson::parse(R"({"xs": [3, 1, 2], "d": {"b": 1, "a": [1.5, null, true]}, "s": "  Hé llo\n",
      "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " a "}], "n": 7, "f": 0.1})");
  const std::vector<std::string> templates = {
      "  {% if true %}\n  a\n  {% endif %}\nb",
      "  {# c #}\nb\n",
      "{% for x in xs %}\n  {{ x }}\n{% endfor %}\n",
      "{%- for x in xs -%}\n  {{ x }}  \n{%- endfor %}",
      "{% for x in xs %}{{ loop.index0 }}{{ loop.revindex0 }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}",
      "{% for k in d %}{{ k }}{% endfor %}{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}",
      "{{ d|tojson }}{{ d|tojson(indent=4) }}{{ xs|tojson(indent=0) }}{{ s|tojson }}",
      "{{ s|trim }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.split() }}|{{ s|upper }}|{{ s.title() }}",
      "{{ s|title }}|{{ s|capitalize }}|{{ s|length }}|{{ s[::-1] }}|{{ s[2:5] }}|{{ s|replace('l', 'L') }}",
      "{{ xs|sort if false else xs|reverse|list }} {{ xs|first }} {{ xs|last }} {{ xs|join('-') }} {{ xs|sum }}",
      "{{ n / 2 }} {{ n // 2 }} {{ n % 3 }} {{ -n // 2 }} {{ n ** 2 }} {{ f * 3 }} {{ 1e100 }} {{ 2.0 ** 0.5 }}",
      "{{ n > 5 and n < 10 }} {{ n is odd }} {{ n is divisibleby 7 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}",
      "{{ messages|selectattr('role', 'equalto', 'user')|list }}{{ messages|map(attribute='content')|join('/') }}",
      "{{ messages[-1].content|trim }}{{ messages[0]['role'] }}{{ messages|length }}{{ messages[5] is defined }}",
      "{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'assistant' %}"
      "{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.found }}{{ ns.n }}",
      "{% macro turn(role, text='x') -%}\n<{{ role }}>{{ text }}\n{%- endmacro %}{{ turn('u') }}{{ turn('a', text='y') "
      "}}",
      "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
      "{% else %}[{{ m.content }}]{% endif %}{% endfor %}",
      "{%- for m in messages %}\n  {%- if m.role == 'assistant' %}\n    {%- generation %}\n      {{- m.content | trim "
      "}}"
      "\n    {%- endgeneration %}\n  {%- endif %}\n{%- endfor %}\n{% generation %}{% endgeneration %}",
      "{{ none }}{{ true }}{{ xs }}{{ d }}{{ (1, 'a') }}{{ {'k': \"it's\"} }}{{ ['a\\nb', '\\t', 'é', '\\x01'] }}",
      "{{ 'a' ~ 1 ~ 2.50 ~ none ~ true }}{{ '%s|%d|%r' % ('x', 3.9, 'y') }}{{ '{}'|format() if false else 'ok' }}",
      "{{ undefined_var }}|{{ undefined_var|default('dflt') }}|{{ undefined_var is defined }}|{{ (undefined_var or "
      "'o') }}",
      "{% set x = 1 %}{% for i in xs %}{% set x = x + i %}{% endfor %}{{ x }}",
      "{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}{% for i in range(3)|reverse %}{{ i }}{% endfor %}",
      "{{ 'ß'.upper() }}{{ 'İ'.lower()|length }}{{ 'ǅ'.upper() }}{{ 'hello wORLD'.capitalize() }}{{ 'a1b'.title() }}",
      "{{ s.startswith('  H') }}{{ s.endswith(('x', '\\n')) }}{{ s.replace(' ', '_', 1) }}{{ s.split('l') }}",
      "{{ 'a,b,c'.split(',', 1) }}{{ ' a  b '.split(' ') }}{{ ''.split() }}{{ 'x'.split('x') }}",
      "{{ d.get('b') }}{{ d.get('zz') }}{{ d.get('zz', 0) }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list "
      "}}",
      "{{ 'é' in s }}{{ 'b' in d }}{{ 3 in xs }}{{ 4 not in xs }}{{ xs|min if false else 0 }}",
      "{{ raise_exception('Bad input: ' ~ n) }}",
      "{% if true %}{% for x in [] %}{% else %}empty{% endfor %}{% endif %}{% for x in xs if x > 1 %}{{ loop.length "
      "}}{% endfor %}",
      "{{ xs[1:] }}{{ xs[:-1] }}{{ xs[-2:] }}{{ xs[::-2] }}{{ xs[5:] }}{{ xs[-10:1] }}{{ 'abc'[-1] }}{{ 'abc'[1::] }}",
      "{{ 1 if n is number else 0 }}{{ s is string }}{{ d is mapping }}{{ xs is iterable }}{{ n is iterable }}"
      "{{ none is none }}{{ f is float }}{{ n is integer }}{{ true is boolean }}{{ d.a is sequence }}",
  };
  std::vector<Case> cases;
  for (size_t i = 0; i < templates.size(); ++i) cases.push_back({"construct " + std::to_string(i), templates[i], vars});
  expect_same_as_oracle(cases, 1);  // raise_exception
}

}  // namespace
}  // namespace primus::data
