// Turns OpenAI chat `messages` (and `tools`) into a prompt. Both front ends render through this
// interface; the model's Jinja chat template implements it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace llm {

class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  // `tools` is null when the request has none. Errors are the client's (INVALID_ARGUMENT) or the
  // template's (FAILED_PRECONDITION).
  virtual StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                       const nlohmann::ordered_json& tools,
                                       bool add_generation_prompt) const = 0;
};

}  // namespace llm
