#include "server/openai_tool_calls.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

// Most calls one forced turn may hold (parallel_tool_calls true).
constexpr int kMaxForcedCalls = 8;

// A JSON text of `s` as a JSON string (the name inside call markup).
std::string Quoted(const std::string& s) {
  return json(s).dump();
}

// The family's syntax for one call of `name` around its arguments, as the templates write it
// (tests/fixtures/tool_calls/rendered_calls.json), and between / around calls.
struct CallSyntax {
  std::string prefix, begin, end, separator, suffix;
};

bool SyntaxFor(ToolCallFamily family, const std::string& name, CallSyntax* s) {
  switch (family) {
    case ToolCallFamily::kHermes:
      *s = {"", "<tool_call>\n{\"name\": " + Quoted(name) + ", \"arguments\": ", "}\n</tool_call>",
            "\n", ""};
      return true;
    case ToolCallFamily::kLlama3Json:
      *s = {"", "{\"name\": " + Quoted(name) + ", \"parameters\": ", "}", "; ", ""};
      return true;
    case ToolCallFamily::kMistral:
      *s = {"[TOOL_CALLS][", "{\"name\": " + Quoted(name) + ", \"arguments\": ", "}", ", ", "]"};
      return true;
    case ToolCallFamily::kDeepSeekV3:
      *s = {"<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n",
            "\n```<｜tool▁call▁end｜>", "\n", "<｜tool▁calls▁end｜>"};
      return true;
    case ToolCallFamily::kHarmony:
      // The prompt ends with `<|start|>assistant`; <|call|> (an end-of-turn token) follows.
      *s = {"", " to=functions." + name + "<|channel|>commentary json<|message|>", "", "", ""};
      return true;
    case ToolCallFamily::kNone:
      break;
  }
  return false;
}

// The families whose turn holds one call.
bool OneCallPerTurn(ToolCallFamily family) {
  return family == ToolCallFamily::kHarmony;
}

}  // namespace

std::string ParseToolChoice(const json& v, ToolChoice* out) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "auto") {
      out->mode = ToolChoice::Mode::kAuto;
    } else if (s == "none") {
      out->mode = ToolChoice::Mode::kNone;
    } else if (s == "required") {
      out->mode = ToolChoice::Mode::kRequired;
    } else {
      return "'tool_choice' must be \"none\", \"auto\", \"required\" or a function, not \"" + s +
             "\"";
    }
    return "";
  }
  if (!v.is_object() || v.value("type", json()) != "function" || !v.contains("function") ||
      !v["function"].is_object() || !v["function"].contains("name") ||
      !v["function"]["name"].is_string()) {
    return "'tool_choice' must be \"none\", \"auto\", \"required\" or "
           "{\"type\": \"function\", \"function\": {\"name\": ...}}";
  }
  out->mode = ToolChoice::Mode::kFunction;
  out->function = v["function"]["name"].get<std::string>();
  return "";
}

std::string CheckTools(const json& tools) {
  if (!tools.is_array()) return "'tools' must be a list";
  for (const json& t : tools) {
    if (!t.is_object() || t.value("type", json()) != "function") {
      return "every tool must be {\"type\": \"function\", \"function\": {...}}";
    }
    if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string() || t["function"]["name"].get<std::string>().empty()) {
      return "every tool needs a 'function' with a non-empty string 'name'";
    }
    const json& f = t["function"];
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null()) {
      return "tool '" + f["name"].get<std::string>() +
             "': 'parameters' must be a JSON Schema object";
    }
  }
  return "";
}

bool PromptOpensThinking(const std::string& prompt) {
  size_t end = prompt.size();
  while (end > 0 && (prompt[end - 1] == '\n' || prompt[end - 1] == ' ')) --end;
  constexpr std::string_view kOpen = "<think>";
  return end >= kOpen.size() && prompt.compare(end - kOpen.size(), kOpen.size(), kOpen) == 0;
}

StatusOr<Constraint> ForcedToolCallConstraint(ToolCallFamily family, const json& functions,
                                              int max_calls) {
  json items = json::array();
  CallSyntax s;
  for (const json& f : functions) {
    const std::string name = f["name"].get<std::string>();
    if (!SyntaxFor(family, name, &s)) {
      return InvalidArgument("this model's chat template has no tool-call syntax");
    }
    json schema = f.contains("parameters") && f["parameters"].is_object()
                      ? json(f["parameters"])
                      : json{{"type", "object"}};
    items.push_back({{"begin", s.begin}, {"schema", schema}, {"end", s.end}});
  }
  if (OneCallPerTurn(family)) max_calls = 1;
  Constraint c;
  c.kind = Constraint::Kind::kTaggedJson;
  c.text = json{{"prefix", s.prefix},
                {"items", items},
                {"separator", s.separator},
                {"max_items", max_calls},
                {"suffix", s.suffix}}
               .dump();
  return c;
}

Status PlanChatOutput(const json& tools, const ToolChoice& choice, bool parallel_tool_calls,
                      ToolCallFamily tool_family, ReasoningFamily reasoning_family,
                      bool has_constraint, ChatOutputPlan* plan, Constraint* constraint,
                      std::string* bad_param) {
  const bool has_tools = tools.is_array() && !tools.empty();
  if (!has_tools && choice.mode != ToolChoice::Mode::kAuto &&
      choice.mode != ToolChoice::Mode::kNone) {
    *bad_param = "tool_choice";
    return InvalidArgument("'tool_choice' needs 'tools'");
  }
  json allowed = json::array();
  if (has_tools) {
    for (const json& t : tools) {
      if (choice.mode != ToolChoice::Mode::kFunction || t["function"]["name"] == choice.function) {
        allowed.push_back(t["function"]);
      }
    }
  }
  if (choice.mode == ToolChoice::Mode::kFunction && allowed.empty()) {
    *bad_param = "tool_choice";
    return InvalidArgument("'tool_choice' names the function '" + choice.function +
                           "', which is not among 'tools'");
  }
  const bool forced =
      choice.mode == ToolChoice::Mode::kRequired || choice.mode == ToolChoice::Mode::kFunction;
  if (forced && tool_family == ToolCallFamily::kNone) {
    *bad_param = "tool_choice";
    return InvalidArgument(
        std::string("tool_choice \"") +
        (choice.mode == ToolChoice::Mode::kRequired ? "required" : "function") +
        "\" needs a tool-call syntax, and this model's chat template writes none (the server's "
        "--tool-call-parser is \"none\")");
  }
  ChatOutputOptions& o = plan->options;
  o.reasoning = reasoning_family;
  o.tools =
      has_tools && choice.mode != ToolChoice::Mode::kNone ? tool_family : ToolCallFamily::kNone;
  o.max_tool_calls = parallel_tool_calls ? -1 : 1;
  plan->reasoning_field = reasoning_family != ReasoningFamily::kNone;
  plan->parse = o.tools != ToolCallFamily::kNone || plan->reasoning_field;
  plan->needs_special_tokens = o.tools == ToolCallFamily::kMistral ||
                               o.tools == ToolCallFamily::kHarmony ||
                               reasoning_family == ReasoningFamily::kHarmony;
  if (forced) {
    if (has_constraint) {
      *bad_param = "tool_choice";
      return InvalidArgument(
          "tool_choice \"required\" or a named function forces the output "
          "into a call: it cannot be combined with another constraint");
    }
    auto c =
        ForcedToolCallConstraint(tool_family, allowed, parallel_tool_calls ? kMaxForcedCalls : 1);
    if (!c.ok()) {
      *bad_param = "tool_choice";
      return c.status();
    }
    *constraint = std::move(c).value();
  }
  return Status::Ok();
}

json ToolCallsJson(const std::vector<ParsedToolCall>& calls) {
  json out = json::array();
  for (const ParsedToolCall& c : calls) {
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

json ToolCallDeltasJson(const std::vector<ToolCallDelta>& calls) {
  json out = json::array();
  for (const ToolCallDelta& c : calls) {
    json d = {{"index", c.index}};
    if (!c.id.empty()) {
      d["id"] = c.id;
      d["type"] = "function";
      d["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
      d["function"] = {{"arguments", c.arguments}};
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace llm
