// Splits a chat model's generated text into what the OpenAI API returns separately: reasoning
// (message.reasoning_content), the answer (message.content) and tool calls (message.tool_calls),
// for each model family's own markup. Parsers are incremental: fed the text deltas the engine
// produces, they return what is now certain and hold back what could still be markup, so a
// streamed response never shows a partial marker; Finish() flushes at the end of the output.
// ParseChatOutput (one shot, non-streaming) is the same parser fed once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llm {

// One step of one tool call: the first delta of call `index` carries its id and name, the later
// ones fragments of its arguments (a JSON text once concatenated), as OpenAI streams them.
struct ToolCallDelta {
  int index = 0;
  std::string id;    // set on the call's first delta only
  std::string name;  // likewise
  std::string arguments;
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  // Appends `d` after this one (fragments of the same call merge).
  void Append(ParsedDelta d);
};

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as the model wrote it
};

struct ParsedMessage {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  void Append(const ParsedDelta& d);
};

class ChatOutputParser {
 public:
  virtual ~ChatOutputParser() = default;
  virtual ParsedDelta Push(std::string_view text) = 0;
  // The output ended (stop, length or abort): what was held back, as text of its state. A call
  // cut off keeps the arguments written so far.
  virtual ParsedDelta Finish() = 0;
};

// Tool-call syntaxes: Qwen2.5 / Qwen3 / Hermes `<tool_call>{json}</tool_call>`; Llama 3.1-3.3
// `{"name", "parameters"}` (after an optional <|python_tag|>, `;`-separated); Mistral
// `[TOOL_CALLS][{...}, ...]` and `[TOOL_CALLS]name[ARGS]{...}`; DeepSeek-V3 / V3.1
// `<｜tool▁calls▁begin｜>...`; gpt-oss harmony `to=functions.NAME` commentary messages.
enum class ToolCallFamily { kNone, kHermes, kLlama3Json, kMistral, kDeepSeekV3, kHarmony };
// `<think>...</think>` (Qwen3, DeepSeek-R1, ...) or harmony's analysis channel (gpt-oss).
enum class ReasoningFamily { kNone, kThink, kHarmony };

const char* ToolCallFamilyName(ToolCallFamily f);    // "hermes", "llama3_json", ...
const char* ReasoningFamilyName(ReasoningFamily f);  // "think", "harmony", "none"
// By name (as ToolCallFamilyName writes it); false for an unknown name.
bool ToolCallFamilyFromName(std::string_view name, ToolCallFamily* out);
bool ReasoningFamilyFromName(std::string_view name, ReasoningFamily* out);

// The families a chat template writes, from the markup its text renders tool calls and reasoning
// with (kNone when it renders none).
ToolCallFamily DetectToolCallFamily(std::string_view chat_template);
ReasoningFamily DetectReasoningFamily(std::string_view chat_template);

// A fresh tool call id: Mistral's templates require 9 alphanumerics, others take OpenAI's
// "call_" + 24 alphanumerics.
std::string NewToolCallId(ToolCallFamily family);

struct ChatOutputOptions {
  ToolCallFamily tools = ToolCallFamily::kNone;  // kNone: tool calls stay in content
  ReasoningFamily reasoning = ReasoningFamily::kNone;
  // The prompt ended inside an open <think> (DeepSeek-R1's template writes it): the output starts
  // as reasoning.
  bool starts_in_reasoning = false;
  int max_tool_calls = -1;              // 1: parallel_tool_calls false; calls beyond are dropped
  std::function<std::string()> new_id;  // unset: NewToolCallId(tools)
};

std::unique_ptr<ChatOutputParser> CreateChatOutputParser(const ChatOutputOptions& options);

// Non-streaming: the whole output at once.
ParsedMessage ParseChatOutput(const ChatOutputOptions& options, std::string_view text);

}  // namespace llm
