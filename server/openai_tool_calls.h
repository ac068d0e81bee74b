// Tool calls and reasoning on the OpenAI chat API: `tools` / `tool_choice` /
// `parallel_tool_calls` checked, the output parser chosen for the model's family
// (text/tool_calls), forced calls (tool_choice "required" or a named function) turned into a
// constraint in the family's call syntax, and the parsed output written as OpenAI's message and
// stream deltas.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/request.h"
#include "text/tool_calls/chat_output_parser.h"

namespace llm {

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: its name
};

// `tool_choice`: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
// Returns an error message, empty on success.
std::string ParseToolChoice(const nlohmann::ordered_json& v, ToolChoice* out);
// `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}. Returns an error message, empty on success.
std::string CheckTools(const nlohmann::ordered_json& tools);

// What a chat request's output goes through.
struct ChatOutputPlan {
  bool parse = false;  // false: the text is content as generated
  ChatOutputOptions options;
  bool reasoning_field = false;  // the family has reasoning: the message carries the field
  // The markers are special tokens, so they must be decoded into the text.
  bool needs_special_tokens = false;
};

// Decides the plan from the request and the model's families; for "required" or a named
// function also the constraint that forces the call (a request carrying a constraint of its own
// is refused). Errors name the field in *bad_param.
Status PlanChatOutput(const nlohmann::ordered_json& tools, const ToolChoice& choice,
                      bool parallel_tool_calls, ToolCallFamily tool_family,
                      ReasoningFamily reasoning_family, bool has_constraint, ChatOutputPlan* plan,
                      Constraint* constraint, std::string* bad_param);

// The prompt ends inside an open <think> (DeepSeek-R1's and the Qwen3 thinking models'
// templates write it): the output starts as reasoning.
bool PromptOpensThinking(const std::string& rendered_prompt);

// The forced call's constraint: the family's call syntax around each allowed function's
// parameter schema; `max_calls` calls at most (the families that write one per turn, one).
StatusOr<Constraint> ForcedToolCallConstraint(ToolCallFamily family,
                                              const nlohmann::ordered_json& functions,
                                              int max_calls);

// message.tool_calls of a whole response.
nlohmann::ordered_json ToolCallsJson(const std::vector<ParsedToolCall>& calls);
// delta.tool_calls of a stream chunk: id, type and name on a call's first delta.
nlohmann::ordered_json ToolCallDeltasJson(const std::vector<ToolCallDelta>& calls);

}  // namespace llm
