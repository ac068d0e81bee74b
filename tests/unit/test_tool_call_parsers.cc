// The chat output parsers (text/tool_calls) against the real chat templates: every case of
// tests/fixtures/tool_calls/rendered_calls.json (written by tests/python/tool_call_oracle.py with
// Python jinja2) parses back to the calls the template rendered, whole and streamed in pieces;
// plus the edge cases a template cannot render (cut-off output, reasoning, parallel limit).
#include <fstream>
#include <random>
#include <sstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "text/tool_calls/chat_output_parser.h"
#include "text/tool_calls/text_scan.h"

namespace llm {
namespace {

using json = nlohmann::json;

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \n") - b + 1);
}

json LoadCases() {
  std::ifstream f(std::string(LLM_SOURCE_DIR) + "/tests/fixtures/tool_calls/rendered_calls.json");
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

ChatOutputOptions OptionsFor(const std::string& family, const std::string& tmpl) {
  ChatOutputOptions o;
  REQUIRE(ToolCallFamilyFromName(family, &o.tools));
  if (family == "harmony") o.reasoning = ReasoningFamily::kHarmony;
  if (tmpl == "qwen3") o.reasoning = ReasoningFamily::kThink;
  int n = 0;
  o.new_id = [n]() mutable { return "id" + std::to_string(n++); };
  return o;
}

// Feeds `text` in pieces of `step` bytes (cutting UTF-8 characters and markers anywhere).
ParsedMessage Streamed(const ChatOutputOptions& o, const std::string& text, size_t step) {
  auto p = CreateChatOutputParser(o);
  ParsedMessage m;
  for (size_t i = 0; i < text.size(); i += step) m.Append(p->Push(text.substr(i, step)));
  m.Append(p->Finish());
  return m;
}

void CheckMatches(const ParsedMessage& m, const json& expect) {
  CHECK(Trim(m.content) == expect["content"].get<std::string>());
  CHECK(Trim(m.reasoning) == expect["reasoning"].get<std::string>());
  REQUIRE(m.tool_calls.size() == expect["tool_calls"].size());
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    CHECK(m.tool_calls[i].name == expect["tool_calls"][i]["name"]);
    CHECK(m.tool_calls[i].id == "id" + std::to_string(i));
    const json args = json::parse(m.tool_calls[i].arguments, nullptr, false);
    INFO("arguments: " << m.tool_calls[i].arguments);
    CHECK(args == expect["tool_calls"][i]["arguments"]);
  }
}

TEST_CASE("every template's rendered tool calls parse back", "[tool_calls]") {
  const json cases = LoadCases();
  REQUIRE(cases.size() >= 30);
  for (const json& c : cases) {
    const std::string family = c["family"], tmpl = c["template"], output = c["output"];
    INFO(family << " / " << tmpl << " / " << c["case"].get<std::string>() << "\n" << output);
    const ChatOutputOptions o = OptionsFor(family, tmpl);
    CheckMatches(ParseChatOutput(o, output), c["expect"]);
    for (size_t step : {1, 2, 3, 7}) {
      INFO("streamed in pieces of " << step);
      CheckMatches(Streamed(o, output, step), c["expect"]);
    }
  }
}

TEST_CASE("an output cut off inside the arguments keeps the call and what it had", "[tool_calls]") {
  const json cases = LoadCases();
  for (const json& c : cases) {
    if (c["case"] != "one_call") continue;
    const std::string family = c["family"], tmpl = c["template"], output = c["output"];
    const size_t cut = output.find("Par") + 2;  // inside "Paris"
    INFO(family << " / " << tmpl);
    const ParsedMessage m = ParseChatOutput(OptionsFor(family, tmpl), output.substr(0, cut));
    REQUIRE(m.tool_calls.size() == 1);
    CHECK(m.tool_calls[0].name == "get_weather");
    CHECK(m.tool_calls[0].arguments.find("{\"city\": \"Pa") == 0);
    CHECK(m.content.find('{') == std::string::npos);
  }
}

TEST_CASE("streamed deltas send the id and name first, then argument fragments", "[tool_calls]") {
  ChatOutputOptions o;
  o.tools = ToolCallFamily::kHermes;
  o.new_id = [] { return std::string("call_x"); };
  auto p = CreateChatOutputParser(o);
  ParsedDelta a = p->Push("Sure.<tool");
  CHECK(a.content == "Sure.");  // "<tool" may open a call: held back
  CHECK(a.tool_calls.empty());
  ParsedDelta b = p->Push("_call>\n{\"name\": \"f\", \"arguments\": {\"x\": ");
  REQUIRE(b.tool_calls.size() == 1);
  CHECK(b.tool_calls[0].id == "call_x");
  CHECK(b.tool_calls[0].name == "f");
  CHECK(b.tool_calls[0].arguments == "{\"x\": ");
  CHECK(b.content.empty());
  ParsedDelta c = p->Push("1}}\n</tool_call>");
  REQUIRE(c.tool_calls.size() == 1);
  CHECK(c.tool_calls[0].id.empty());
  CHECK(c.tool_calls[0].arguments == "1}");
  CHECK(p->Finish().empty());
}

TEST_CASE("text that only looks like markup is content", "[tool_calls]") {
  ChatOutputOptions o;
  o.tools = ToolCallFamily::kHermes;
  ParsedMessage m = ParseChatOutput(o, "a <tool_call> not json");
  CHECK(m.tool_calls.empty());
  CHECK(m.content == "a <tool_call> not json");
  o.tools = ToolCallFamily::kLlama3Json;
  m = ParseChatOutput(o, "{this is prose}");
  CHECK(m.tool_calls.empty());
  CHECK(m.content == "{this is prose}");
  m = ParseChatOutput(o,
                      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; "
                      "{\"name\": \"b\", \"arguments\": {\"k\": 2}}");
  REQUIRE(m.tool_calls.size() == 2);
  CHECK(m.tool_calls[1].name == "b");
  CHECK(m.tool_calls[1].arguments == "{\"k\": 2}");
}

TEST_CASE("newer syntaxes: Mistral [ARGS], DeepSeek-V3.1, harmony recipient after channel",
          "[tool_calls]") {
  ChatOutputOptions o;
  o.tools = ToolCallFamily::kMistral;
  ParsedMessage m = ParseChatOutput(o,
                                    "hi[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}"
                                    "[TOOL_CALLS]f[ARGS]{}");
  CHECK(m.content == "hi");
  REQUIRE(m.tool_calls.size() == 2);
  CHECK(m.tool_calls[0].name == "get_time");
  CHECK(m.tool_calls[0].id.size() == 9);
  CHECK(m.tool_calls[1].arguments == "{}");
  o.tools = ToolCallFamily::kDeepSeekV3;
  m = ParseChatOutput(o,
                      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
                      "{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  REQUIRE(m.tool_calls.size() == 1);
  CHECK(m.tool_calls[0].name == "get_time");
  CHECK(m.tool_calls[0].arguments == "{\"tz\": \"UTC\"}");
  o.tools = ToolCallFamily::kHarmony;
  m = ParseChatOutput(o,
                      "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
                      "<|channel|>commentary to=functions.get_time <|constrain|>json"
                      "<|message|>{}<|call|>");
  CHECK(m.reasoning == "think");
  REQUIRE(m.tool_calls.size() == 1);
  CHECK(m.tool_calls[0].name == "get_time");
  CHECK(m.tool_calls[0].arguments == "{}");
}

TEST_CASE("parallel_tool_calls false keeps the first call", "[tool_calls]") {
  ChatOutputOptions o;
  o.tools = ToolCallFamily::kHermes;
  o.max_tool_calls = 1;
  const ParsedMessage m =
      ParseChatOutput(o,
                      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"
                      "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>");
  REQUIRE(m.tool_calls.size() == 1);
  CHECK(m.tool_calls[0].name == "a");
}

TEST_CASE("<think> reasoning: opened by the output or by the prompt, cut off", "[tool_calls]") {
  ChatOutputOptions o;
  o.reasoning = ReasoningFamily::kThink;
  ParsedMessage m = ParseChatOutput(o, "<think>\nstep 1\n</think>\n\nAnswer.");
  CHECK(m.reasoning == "\nstep 1\n");
  CHECK(m.content == "\n\nAnswer.");
  m = ParseChatOutput(o, "No thinking <think> here");
  CHECK(m.reasoning.empty());
  CHECK(m.content == "No thinking <think> here");
  o.starts_in_reasoning = true;
  m = ParseChatOutput(o, "step</think>done");
  CHECK(m.reasoning == "step");
  CHECK(m.content == "done");
  m = ParseChatOutput(o, "cut off mid-thought </thi");
  CHECK(m.reasoning == "cut off mid-thought </thi");
  CHECK(m.content.empty());
}

TEST_CASE("the family is chosen from the template text", "[tool_calls]") {
  auto read = [](const std::string& name) {
    std::ifstream f(std::string(LLM_SOURCE_DIR) + "/tests/fixtures/chat_templates/" + name +
                    ".jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  CHECK(DetectToolCallFamily(read("qwen3")) == ToolCallFamily::kHermes);
  CHECK(DetectToolCallFamily(read("qwen2_5")) == ToolCallFamily::kHermes);
  CHECK(DetectToolCallFamily(read("llama3_2")) == ToolCallFamily::kLlama3Json);
  CHECK(DetectToolCallFamily(read("llama3")) == ToolCallFamily::kNone);
  CHECK(DetectToolCallFamily(read("mistral_nemo")) == ToolCallFamily::kMistral);
  CHECK(DetectToolCallFamily(read("deepseek_v3")) == ToolCallFamily::kDeepSeekV3);
  CHECK(DetectToolCallFamily(read("gptoss")) == ToolCallFamily::kHarmony);
  CHECK(DetectToolCallFamily(read("gemma3")) == ToolCallFamily::kNone);
  CHECK(DetectReasoningFamily(read("qwen3")) == ReasoningFamily::kThink);
  CHECK(DetectReasoningFamily(read("qwen2_5")) == ReasoningFamily::kNone);
  CHECK(DetectReasoningFamily(read("gptoss")) == ReasoningFamily::kHarmony);
  CHECK(DetectReasoningFamily(read("deepseek_v3")) == ReasoningFamily::kNone);
}

}  // namespace
}  // namespace llm

namespace llm::tool_scan {
namespace {

TEST_CASE("JSON value extents, resumed across pieces", "[tool_calls]") {
  size_t end = 0;
  CHECK(ScanJsonValue(R"({"a": "}\"{"} tail)", 0, &end) == ScanResult::kComplete);
  CHECK(end == 13);
  CHECK(ScanJsonValue("12, ", 0, &end) == ScanResult::kComplete);
  CHECK(end == 2);
  CHECK(ScanJsonValue("12", 0, &end) == ScanResult::kIncomplete);  // more digits may come
  CHECK(ScanJsonValue("]", 0, &end) == ScanResult::kInvalid);
  // An escape split from the quote it escapes.
  std::string text = R"(["x\)";
  JsonValueScanner s(0);
  CHECK(s.Scan(text, &end) == ScanResult::kIncomplete);
  text += R"("", 1] after)";
  CHECK(s.Scan(text, &end) == ScanResult::kComplete);
  CHECK(text.substr(0, end) == R"(["x\"", 1])");
  CHECK(s.Scan(text + "more", &end) == ScanResult::kComplete);  // stays complete
  CHECK(PartialMarkerLength("text <tool", {"<tool_call>"}) == 5);
  CHECK(PartialMarkerLength("text <tool_call", {"<tool_call>", "</tool_call>"}) == 10);
  CHECK(PartialMarkerLength("text", {"<tool_call>"}) == 0);
}

}  // namespace
}  // namespace llm::tool_scan

namespace llm {
namespace {

// Text built from the families' markers, JSON punctuation and plain characters.
std::string RandomMarkup(std::mt19937& rng) {
  static const char* kPieces[] = {"<tool_call>",
                                  "</tool_call>",
                                  "<think>",
                                  "</think>",
                                  "<|python_tag|>",
                                  "[TOOL_CALLS]",
                                  "[ARGS]",
                                  "<｜tool▁calls▁begin｜>",
                                  "<｜tool▁call▁begin｜>",
                                  "<｜tool▁sep｜>",
                                  "<｜tool▁call▁end｜>",
                                  "<｜tool▁calls▁end｜>",
                                  "<|channel|>",
                                  "<|message|>",
                                  "<|end|>",
                                  "<|start|>",
                                  "<|call|>",
                                  " to=functions.f",
                                  "analysis",
                                  "final",
                                  "{\"name\": \"f\"",
                                  ", \"arguments\": ",
                                  "{\"a\": 1}",
                                  "\"",
                                  "\\",
                                  "{",
                                  "}",
                                  "[",
                                  "]",
                                  ",",
                                  ":",
                                  ";",
                                  " ",
                                  "\n",
                                  "```json\n",
                                  "\n```",
                                  "x",
                                  "é",
                                  "1"};
  std::uniform_int_distribution<int> pick(0, std::size(kPieces) - 1), len(0, 40);
  std::string s;
  for (int i = len(rng); i > 0; --i) s += kPieces[pick(rng)];
  return s;
}

TEST_CASE("any text parses the same streamed in any pieces as whole", "[tool_calls]") {
  std::mt19937 rng(1234);
  const ToolCallFamily families[] = {ToolCallFamily::kHermes, ToolCallFamily::kLlama3Json,
                                     ToolCallFamily::kMistral, ToolCallFamily::kDeepSeekV3,
                                     ToolCallFamily::kHarmony};
  for (int iter = 0; iter < 20000; ++iter) {
    const std::string text = RandomMarkup(rng);
    for (ToolCallFamily f : families) {
      for (bool think : {false, true}) {
        ChatOutputOptions o;
        o.tools = f;
        o.reasoning = f == ToolCallFamily::kHarmony ? ReasoningFamily::kHarmony
                      : think                       ? ReasoningFamily::kThink
                                                    : ReasoningFamily::kNone;
        o.max_tool_calls = iter % 3 == 0 ? 1 : -1;
        int n = 0;
        o.new_id = [&n] { return "id" + std::to_string(n++); };
        const ParsedMessage whole = ParseChatOutput(o, text);
        n = 0;
        auto p = CreateChatOutputParser(o);
        ParsedMessage streamed;
        std::uniform_int_distribution<size_t> step(1, 9);
        for (size_t i = 0; i < text.size();) {
          const size_t k = std::min(step(rng), text.size() - i);
          streamed.Append(p->Push(std::string_view(text).substr(i, k)));
          i += k;
        }
        streamed.Append(p->Finish());
        INFO(ToolCallFamilyName(f) << " think=" << think << " text: " << text);
        REQUIRE(streamed.content == whole.content);
        REQUIRE(streamed.reasoning == whole.reasoning);
        REQUIRE(streamed.tool_calls.size() == whole.tool_calls.size());
        for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
          REQUIRE(streamed.tool_calls[i].name == whole.tool_calls[i].name);
          REQUIRE(streamed.tool_calls[i].arguments == whole.tool_calls[i].arguments);
        }
      }
    }
  }
}

}  // namespace
}  // namespace llm
