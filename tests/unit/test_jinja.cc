// Tests for the Jinja engine's contract beyond output bytes (those are checked against Python
// jinja2 by tests/python/test_chat_templates.py): unsupported constructs fail at parse naming
// the construct, render errors are Status values, hostile input is bounded, and the loader finds
// templates where transformers does.
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "text/chat/chat_template.h"
#include "text/jinja/template.h"

namespace llm {
namespace {

using jinja::Template;
using json = nlohmann::ordered_json;

std::string RenderOk(const std::string& src, const json& vars = json::object()) {
  auto t = Template::Parse(src);
  REQUIRE(t.ok());
  auto out = t->Render(vars);
  INFO(out.status().ToString());
  REQUIRE(out.ok());
  return out.value();
}

Status RenderStatus(const std::string& src, const json& vars = json::object(),
                    const jinja::RenderOptions& options = {}) {
  auto t = Template::Parse(src);
  REQUIRE(t.ok());
  auto out = t->Render(vars, options);
  return out.ok() ? Status::Ok() : out.status();
}

TEST_CASE("Jinja: unsupported constructs fail at parse and name the construct", "[jinja]") {
  struct Case {
    const char* src;
    const char* names;
  };
  for (const Case& c :
       {Case{"{% include 'x.jinja' %}", "{% include %}"},
        Case{"{% extends 'base' %}", "{% extends %}"},
        Case{"{% import 'm' as m %}", "{% import %}"},
        Case{"{% block body %}{% endblock %}", "{% block %}"},
        Case{"{% for x in y recursive %}{% endfor %}", "recursive for loop"},
        Case{"{{ x | nosuchfilter }}", "filter 'nosuchfilter'"},
        Case{"{{ x is nosuchtest }}", "test 'nosuchtest'"},
        Case{"{{ 1 < x < 3 }}", "chained comparison"}, Case{"{{ f(*args) }}", "*args"}}) {
    auto t = Template::Parse(c.src);
    INFO(c.src);
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == StatusCode::kUnimplemented);
    CHECK_THAT(t.status().message(), Catch::Contains(c.names));
  }
}

TEST_CASE("Jinja: syntax errors are InvalidArgument with the line", "[jinja]") {
  for (const char* src :
       {"{% if x %}never closed", "line1\n{{ x ", "{{ 'unterminated }}", "{% endfor %}",
        "{# open comment", "{{ (1, }}", "{% for in x %}{% endfor %}", "{% raw %}no end",
        "{% do x.append(1) %}"}) {
    auto t = Template::Parse(src);
    INFO(src);
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == StatusCode::kInvalidArgument);
  }
  auto t = Template::Parse("a\nb\n{{ x ) }}");
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(t.status().message(), Catch::Contains("line 3"));
}

TEST_CASE("Jinja: render errors are Status values, never crashes", "[jinja]") {
  CHECK(RenderStatus("{{ x.y.z }}", {{"x", json::object()}}).code() ==
        StatusCode::kInvalidArgument);
  CHECK_THAT(RenderStatus("{{ x.y.z }}", {{"x", json::object()}}).message(),
             Catch::Contains("'dict object' has no attribute 'y'"));
  CHECK(RenderStatus("{{ 'a' + 1 }}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{{ 1 // 0 }}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{{ [1].append(2) }}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{{ nope() }}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{% set x = 1 %}{% set x.a = 2 %}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{% for a, b in [1] %}{% endfor %}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{% break %}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{{ 9223372036854775807 + 1 }}").code() == StatusCode::kInvalidArgument);
  CHECK(RenderStatus("{{ 2 ** 64 }}").code() == StatusCode::kInvalidArgument);
  Status raised = RenderStatus("{{ raise_exception('bad role: ' ~ r) }}", {{"r", "robot"}});
  CHECK(raised.code() == StatusCode::kFailedPrecondition);
  CHECK(raised.message() == "bad role: robot");
  CHECK(Template::Parse("x").value().Render(json::array()).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("Jinja: deep nesting and huge loops are bounded", "[jinja]") {
  // Deeply nested template source: the parser refuses instead of overflowing the stack.
  std::string deep_src = std::string(5000, '(') + "1" + std::string(5000, ')');
  auto t = Template::Parse("{{ " + deep_src + " }}");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == StatusCode::kInvalidArgument);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  CHECK_FALSE(Template::Parse(ifs).ok());

  // Deeply nested input data.
  json deep = json::array();
  for (int i = 0; i < 2000; ++i) deep = json::array({deep});
  CHECK(RenderStatus("{{ x }}", {{"x", deep}}).code() == StatusCode::kResourceExhausted);

  // Structures built by the template itself.
  CHECK(RenderStatus("{% set ns = namespace(v=[]) %}{% for i in range(2000) %}"
                     "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}")
            .code() == StatusCode::kResourceExhausted);

  // Loops: jinja2's sandbox range limit, then the engine's total iteration budget.
  CHECK_THAT(RenderStatus("{% for i in range(200000) %}{% endfor %}").message(),
             Catch::Contains("MAX_RANGE"));
  CHECK(RenderStatus("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}")
            .code() == StatusCode::kResourceExhausted);

  // Output size and recursion.
  jinja::RenderOptions small;
  small.limits.max_output_bytes = 1000;
  CHECK(RenderStatus("{% for i in range(100) %}0123456789ABCDEF{% endfor %}", json::object(), small)
            .code() == StatusCode::kResourceExhausted);
  CHECK(RenderStatus("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").code() ==
        StatusCode::kResourceExhausted);
}

TEST_CASE("Jinja: Python value formatting and semantics", "[jinja]") {
  CHECK(RenderOk("{{ 1/3 }} {{ 2.0 }} {{ 1e16 }} {{ 1e-5 }} {{ -0.0 }} {{ 10**3 }}") ==
        "0.3333333333333333 2.0 1e+16 1e-05 -0.0 1000");
  CHECK(RenderOk("{{ [1, 'a', none, true] }} {{ {'k': \"it's\"} }}") ==
        "[1, 'a', None, True] {'k': \"it's\"}");
  CHECK(RenderOk("{{ x|tojson }}", {{"x", {{"b", 1}, {"a", "é\n"}}}}) ==
        "{\"b\": 1, \"a\": \"é\\n\"}");
  CHECK(RenderOk("{{ '日本🚀'|length }} {{ '日本🚀'[::-1] }}") == "3 🚀本日");
  CHECK(RenderOk("{{ 'ÉCOLE straße'|lower }} {{ 'straße'|upper }}") == "école straße STRASSE");
  CHECK(RenderOk("  {% if true %}\n  x\n  {% endif %}\n") == "  x\n");
  CHECK(RenderOk("{{ undefined_thing }}|{{ undefined_thing is defined }}") == "|False");
}

TEST_CASE("Jinja: one parsed template renders on many threads", "[jinja]") {
  auto t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m|length %}"
      "{% endfor %}{{ ns.n }}:{{ messages|join(',') }}");
  REQUIRE(t.ok());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      json vars = {{"messages", json::array({std::string(i, 'x'), "ab"})}};
      std::string want = std::to_string(i + 2) + ":" + std::string(i, 'x') + ",ab";
      for (int k = 0; k < 200; ++k) {
        auto out = t->Render(vars);
        if (!out.ok() || out.value() != want) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}

TEST_CASE("Jinja: strftime_now reads the pinned clock", "[jinja]") {
  jinja::RenderOptions o;
  o.now = 0;
  auto t = Template::Parse("{{ strftime_now('%Y') }}");
  REQUIRE(t.ok());
  auto out = t->Render(json::object(), o);
  REQUIRE(out.ok());
  CHECK((out.value() == "1970" || out.value() == "1969"));  // local time zone
}

TEST_CASE("ChatTemplate renders with transformers' variables", "[jinja]") {
  auto t = ChatTemplate::Create(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if tools is none %}[no tools]{% endif %}{% if add_generation_prompt %}<assistant>"
      "{% endif %}{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}");
  REQUIRE(t.ok());
  ChatRenderRequest r;
  r.messages = json::parse(R"([{"role":"user","content":"hi"}])");
  r.add_generation_prompt = true;
  r.extra = {{"bos_token", "<s>"}, {"enable_thinking", false}};
  auto out = t->Render(r);
  REQUIRE(out.ok());
  CHECK(out.value() == "<s><user>hi[no tools]<assistant>/no_think");
  r.extra = {{"messages", "clash"}};
  CHECK(t->Render(r).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("ChatTemplate loader finds templates where transformers does", "[jinja]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "llm_chat_template_loader_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  CHECK(LoadChatTemplateSource(dir.string()).status().code() == StatusCode::kNotFound);

  write("tokenizer_config.json", R"({"chat_template": "from config"})");
  CHECK(LoadChatTemplateSource(dir.string())->text == "from config");

  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D"}]})");
  CHECK(LoadChatTemplateSource(dir.string())->text == "D");

  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  auto no_default = LoadChatTemplateSource(dir.string());
  CHECK(no_default.status().code() == StatusCode::kNotFound);
  CHECK_THAT(no_default.status().message(), Catch::Contains("tool_use"));

  write("tokenizer_config.json", R"({"chat_template": 7})");
  CHECK(LoadChatTemplateSource(dir.string()).status().code() == StatusCode::kInvalidArgument);

  write("chat_template.jinja", "from jinja file");
  CHECK(LoadChatTemplateSource(dir.string())->text == "from jinja file");

  write("override.jinja", "override");
  CHECK(LoadChatTemplateSource(dir.string(), (dir / "override.jinja").string())->text ==
        "override");
  CHECK(LoadChatTemplateSource(dir.string(), (dir / "missing.jinja").string()).status().code() ==
        StatusCode::kNotFound);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llm
