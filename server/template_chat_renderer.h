// The ChatRenderer of a model's Jinja chat template (text/chat/chat_template.h), with the
// special tokens transformers passes (bos_token, eos_token) taken from the model's tokenizer.
#pragma once

#include <memory>
#include <string>

#include "engine/engine_core.h"
#include "server/chat_renderer.h"
#include "text/chat/chat_messages.h"
#include "text/chat/chat_template.h"

namespace llm {

class TemplateChatRenderer final : public ChatRenderer {
 public:
  // The template from `override_path` (--chat-template), else the model directory's
  // chat_template.jinja, else tokenizer_config.json's chat_template. NotFound when there is none;
  // a template the engine cannot parse fails naming the construct.
  // `tool_call_parser` / `reasoning_parser`: a family name (chat_output_parser.h), "none", or
  // "auto" for the one the template's text writes.
  static StatusOr<std::unique_ptr<TemplateChatRenderer>> Load(
      const EngineCore& core, const std::string& model_dir, const std::string& override_path,
      const std::string& tool_call_parser = "auto", const std::string& reasoning_parser = "auto");

  StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                               const nlohmann::ordered_json& tools, bool add_generation_prompt,
                               const nlohmann::ordered_json& template_kwargs) const override;
  ToolCallFamily tool_call_family() const override { return tool_family_; }
  ReasoningFamily reasoning_family() const override { return reasoning_family_; }
  const std::string& origin() const { return origin_; }

 private:
  TemplateChatRenderer(ChatTemplate t, std::string origin, nlohmann::ordered_json extra)
      : template_(std::move(t)), origin_(std::move(origin)), extra_(std::move(extra)) {}
  ChatTemplate template_;
  std::string origin_;
  nlohmann::ordered_json extra_;  // bos_token, eos_token
  ToolCallFamily tool_family_ = ToolCallFamily::kNone;
  ReasoningFamily reasoning_family_ = ReasoningFamily::kNone;
  // How the template takes an assistant turn with tool calls (chat_messages.h).
  ToolCallMessageShape message_shape_ = ToolCallMessageShape::kTemplateValues;
};

}  // namespace llm
