#include "text/tool_calls/chat_output_parser.h"

#include <random>

#include "text/tool_calls/family_parsers.h"

namespace llm {
namespace {

struct FamilyName {
  ToolCallFamily family;
  const char* name;
};
constexpr FamilyName kToolFamilies[] = {
    {ToolCallFamily::kNone, "none"},
    {ToolCallFamily::kHermes, "hermes"},
    {ToolCallFamily::kLlama3Json, "llama3_json"},
    {ToolCallFamily::kMistral, "mistral"},
    {ToolCallFamily::kDeepSeekV3, "deepseek_v3"},
    {ToolCallFamily::kHarmony, "harmony"},
};

bool Contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Drops the deltas of calls past the limit (parallel_tool_calls false keeps the first).
class CallLimit final : public ChatOutputParser {
 public:
  CallLimit(std::unique_ptr<ChatOutputParser> inner, int max_calls)
      : inner_(std::move(inner)), max_(max_calls) {}
  ParsedDelta Push(std::string_view text) override { return Cut(inner_->Push(text)); }
  ParsedDelta Finish() override { return Cut(inner_->Finish()); }

 private:
  ParsedDelta Cut(ParsedDelta d) {
    std::erase_if(d.tool_calls, [this](const ToolCallDelta& c) { return c.index >= max_; });
    return d;
  }
  std::unique_ptr<ChatOutputParser> inner_;
  int max_;
};

// No family: everything is content.
class PlainParser final : public ChatOutputParser {
 public:
  ParsedDelta Push(std::string_view text) override {
    ParsedDelta d;
    d.content = std::string(text);
    return d;
  }
  ParsedDelta Finish() override { return {}; }
};

}  // namespace

void ParsedDelta::Append(ParsedDelta d) {
  reasoning += d.reasoning;
  content += d.content;
  for (ToolCallDelta& c : d.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == c.index && c.id.empty()) {
      tool_calls.back().arguments += c.arguments;
    } else {
      tool_calls.push_back(std::move(c));
    }
  }
}

void ParsedMessage::Append(const ParsedDelta& d) {
  reasoning += d.reasoning;
  content += d.content;
  for (const ToolCallDelta& c : d.tool_calls) {
    if (c.index >= static_cast<int>(tool_calls.size())) tool_calls.resize(c.index + 1);
    ParsedToolCall& t = tool_calls[c.index];
    if (!c.id.empty()) t.id = c.id;
    if (!c.name.empty()) t.name = c.name;
    t.arguments += c.arguments;
  }
}

const char* ToolCallFamilyName(ToolCallFamily f) {
  for (const FamilyName& n : kToolFamilies) {
    if (n.family == f) return n.name;
  }
  return "none";
}

const char* ReasoningFamilyName(ReasoningFamily f) {
  switch (f) {
    case ReasoningFamily::kThink:
      return "think";
    case ReasoningFamily::kHarmony:
      return "harmony";
    case ReasoningFamily::kNone:
      break;
  }
  return "none";
}

bool ToolCallFamilyFromName(std::string_view name, ToolCallFamily* out) {
  for (const FamilyName& n : kToolFamilies) {
    if (name == n.name) {
      *out = n.family;
      return true;
    }
  }
  return false;
}

bool ReasoningFamilyFromName(std::string_view name, ReasoningFamily* out) {
  for (ReasoningFamily f :
       {ReasoningFamily::kNone, ReasoningFamily::kThink, ReasoningFamily::kHarmony}) {
    if (name == ReasoningFamilyName(f)) {
      *out = f;
      return true;
    }
  }
  return false;
}

ToolCallFamily DetectToolCallFamily(std::string_view t) {
  // Harmony first: its templates mention other families' words in tool descriptions.
  if (Contains(t, "<|channel|>") && Contains(t, "<|call|>")) return ToolCallFamily::kHarmony;
  if (Contains(t, "<tool_call>")) return ToolCallFamily::kHermes;
  if (Contains(t, "[TOOL_CALLS]")) return ToolCallFamily::kMistral;
  if (Contains(t, "<｜tool▁calls▁begin｜>")) return ToolCallFamily::kDeepSeekV3;
  if (Contains(t, "<|start_header_id|>") && Contains(t, "tool_calls")) {
    return ToolCallFamily::kLlama3Json;
  }
  return ToolCallFamily::kNone;
}

ReasoningFamily DetectReasoningFamily(std::string_view t) {
  if (Contains(t, "<|channel|>") && Contains(t, "analysis")) return ReasoningFamily::kHarmony;
  if (Contains(t, "</think>")) return ReasoningFamily::kThink;
  return ReasoningFamily::kNone;
}

std::string NewToolCallId(ToolCallFamily family) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, sizeof(kAlnum) - 2);
  const int n = family == ToolCallFamily::kMistral ? 9 : 24;
  std::string id = family == ToolCallFamily::kMistral ? "" : "call_";
  for (int i = 0; i < n; ++i) id += kAlnum[pick(rng)];
  return id;
}

std::unique_ptr<ChatOutputParser> CreateChatOutputParser(const ChatOutputOptions& o) {
  using namespace tool_parsers;
  std::function<std::string()> new_id = o.new_id;
  if (!new_id) new_id = [f = o.tools] { return NewToolCallId(f); };
  std::unique_ptr<ChatOutputParser> p;
  if (o.tools == ToolCallFamily::kHarmony || o.reasoning == ReasoningFamily::kHarmony) {
    p = CreateHarmonyParser(o.tools == ToolCallFamily::kHarmony, new_id);
  } else {
    switch (o.tools) {
      case ToolCallFamily::kHermes:
        p = CreateHermesParser(new_id);
        break;
      case ToolCallFamily::kLlama3Json:
        p = CreateLlama3JsonParser(new_id);
        break;
      case ToolCallFamily::kMistral:
        p = CreateMistralParser(new_id);
        break;
      case ToolCallFamily::kDeepSeekV3:
        p = CreateDeepSeekV3Parser(new_id);
        break;
      case ToolCallFamily::kHarmony:
      case ToolCallFamily::kNone:
        break;
    }
    if (o.reasoning == ReasoningFamily::kThink) {
      p = CreateThinkParser(o.starts_in_reasoning, std::move(p));
    }
  }
  if (!p) p = std::make_unique<PlainParser>();
  if (o.max_tool_calls >= 0) p = std::make_unique<CallLimit>(std::move(p), o.max_tool_calls);
  return p;
}

ParsedMessage ParseChatOutput(const ChatOutputOptions& options, std::string_view text) {
  auto p = CreateChatOutputParser(options);
  ParsedMessage m;
  m.Append(p->Push(text));
  m.Append(p->Finish());
  return m;
}

}  // namespace llm
