#include "text/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace llm {

namespace {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return DataLoss("error reading " + path);
  return ss.str();
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Create(const std::string& source) {
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return Status(t.status().code(), "chat template: " + t.status().message());
  }
  return ChatTemplate(std::move(t).value(), source);
}

StatusOr<std::string> ChatTemplate::Render(const ChatRenderRequest& r) const {
  if (!r.messages.is_array()) return InvalidArgument("chat template: messages must be an array");
  if (!r.extra.is_object()) return InvalidArgument("chat template: extra must be an object");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = r.messages;
  vars["tools"] = r.tools;
  vars["documents"] = r.documents;
  vars["add_generation_prompt"] = r.add_generation_prompt;
  for (auto it = r.extra.begin(); it != r.extra.end(); ++it) {
    if (vars.contains(it.key())) {
      return InvalidArgument("chat template: extra variable '" + it.key() +
                             "' collides with a reserved one");
    }
    vars[it.key()] = it.value();
  }
  jinja::RenderOptions options;
  options.now = r.now;
  return template_.Render(vars, options);
}

StatusOr<ChatTemplateSource> LoadChatTemplateSource(const std::string& model_dir,
                                                    const std::string& override_path) {
  namespace fs = std::filesystem;
  if (!override_path.empty()) {
    LLM_ASSIGN_OR_RETURN(std::string text, ReadFile(override_path));
    return ChatTemplateSource{std::move(text), override_path};
  }
  std::error_code ec;
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path, ec)) {
    LLM_ASSIGN_OR_RETURN(std::string text, ReadFile(jinja_path));
    return ChatTemplateSource{std::move(text), jinja_path};
  }
  const std::string config_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  if (!fs::exists(config_path, ec)) {
    return NotFound("no chat template: neither " + jinja_path + " nor " + config_path + " exists");
  }
  LLM_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  nlohmann::json cfg = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return InvalidArgument(config_path + " is not a JSON object");
  }
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) {
    return NotFound("no chat template: " + config_path + " has no chat_template");
  }
  if (it->is_string()) return ChatTemplateSource{it->get<std::string>(), config_path};
  if (it->is_array()) {
    std::string names;
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        return InvalidArgument(config_path + ": chat_template list entries need name and template");
      }
      if (entry["name"] == "default") {
        return ChatTemplateSource{entry["template"].get<std::string>(),
                                  config_path + " (chat_template 'default')"};
      }
      names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    return NotFound(config_path + ": chat_template list has no 'default' entry (has: " + names +
                    ")");
  }
  return InvalidArgument(config_path + ": chat_template must be a string or a list");
}

}  // namespace llm
