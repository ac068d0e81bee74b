// ChatTemplate: a model's chat template, parsed once at load and rendered per request with the
// variables transformers' apply_chat_template passes (messages, tools, documents,
// add_generation_prompt, the special tokens, and extra keyword arguments such as
// enable_thinking).
#pragma once

#include <ctime>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "text/jinja/template.h"

namespace llm {

struct ChatRenderRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // null renders as tools=None, as transformers does when no tools are given.
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json documents = nullptr;
  bool add_generation_prompt = false;
  // Special tokens (bos_token, eos_token, ...) and template kwargs (enable_thinking, ...).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // strftime_now's clock; unset means now.
  std::optional<std::time_t> now;
};

class ChatTemplate {
 public:
  // Fails (InvalidArgument / Unimplemented) naming the construct and line.
  static StatusOr<ChatTemplate> Create(const std::string& source);
  StatusOr<std::string> Render(const ChatRenderRequest& request) const;
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(jinja::Template t, std::string source)
      : template_(std::move(t)), source_(std::move(source)) {}
  jinja::Template template_;
  std::string source_;
};

struct ChatTemplateSource {
  std::string text;
  std::string origin;  // the file it came from, for logs and errors
};

// Finds the template as transformers does: `override_path` when non-empty (--chat-template),
// else <model_dir>/chat_template.jinja, else "chat_template" in tokenizer_config.json (a string,
// or a list of {name, template} whose "default" entry is used). NotFound when none exists.
StatusOr<ChatTemplateSource> LoadChatTemplateSource(const std::string& model_dir,
                                                    const std::string& override_path = "");

}  // namespace llm
