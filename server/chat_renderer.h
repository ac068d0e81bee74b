// Turns OpenAI chat `messages` (and `tools`) into a prompt. Both front ends render through this
// interface; the model's Jinja chat template implements it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "text/tool_calls/chat_output_parser.h"

namespace llm {

class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  // `tools` is null when the request has none. Errors are the client's (INVALID_ARGUMENT) or the
  // template's (FAILED_PRECONDITION).
  // `template_kwargs` (an object, or null) are extra template variables (enable_thinking, ...).
  virtual StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                       const nlohmann::ordered_json& tools,
                                       bool add_generation_prompt,
                                       const nlohmann::ordered_json& template_kwargs) const = 0;
  // The markup this model's chat output is parsed with (kNone: left as content).
  virtual ToolCallFamily tool_call_family() const { return ToolCallFamily::kNone; }
  virtual ReasoningFamily reasoning_family() const { return ReasoningFamily::kNone; }
};

}  // namespace llm
