#include "server/template_chat_renderer.h"

#include "text/chat/chat_messages.h"

namespace llm {

StatusOr<std::unique_ptr<TemplateChatRenderer>> TemplateChatRenderer::Load(
    const EngineCore& core, const std::string& model_dir, const std::string& override_path,
    const std::string& tool_call_parser, const std::string& reasoning_parser) {
  auto src = LoadChatTemplateSource(model_dir, override_path);
  if (!src.ok()) return src.status();
  auto t = ChatTemplate::Create(src->text);
  if (!t.ok()) return Status(t.status().code(), src->origin + ": " + t.status().message());
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (const Tokenizer* tok = core.tokenizer()) {
    auto piece = [tok](int32_t id) {
      const int32_t one[1] = {id};
      return tok->Decode(one, /*skip_special_tokens=*/false);
    };
    if (auto bos = tok->bos_token_id()) extra["bos_token"] = piece(*bos);
    const auto& eos = core.model_config().eos_token_ids;
    if (!eos.empty()) extra["eos_token"] = piece(eos.front());
  }
  std::unique_ptr<TemplateChatRenderer> r(
      new TemplateChatRenderer(std::move(t).value(), src->origin, std::move(extra)));
  r->message_shape_ = DetectToolCallMessageShape(src->text);
  if (tool_call_parser == "auto") {
    r->tool_family_ = DetectToolCallFamily(src->text);
  } else if (!ToolCallFamilyFromName(tool_call_parser, &r->tool_family_)) {
    return InvalidArgument("unknown tool call parser '" + tool_call_parser + "'");
  }
  if (reasoning_parser == "auto") {
    r->reasoning_family_ = DetectReasoningFamily(src->text);
  } else if (!ReasoningFamilyFromName(reasoning_parser, &r->reasoning_family_)) {
    return InvalidArgument("unknown reasoning parser '" + reasoning_parser + "'");
  }
  return r;
}

StatusOr<std::string> TemplateChatRenderer::Render(const nlohmann::ordered_json& messages,
                                                   const nlohmann::ordered_json& tools,
                                                   bool add_generation_prompt,
                                                   const nlohmann::ordered_json& kwargs) const {
  ChatRenderRequest r;
  r.messages = messages;
  // Every path (both front ends' chat, /tokenize) hands the template the same message shapes.
  std::string bad_path;
  LLM_RETURN_IF_ERROR(NormalizeChatMessages(&r.messages, &bad_path, message_shape_));
  // An empty list renders as no tools (tools=None; a template's `tools is not none` would
  // otherwise write an empty tool section), on every path: both front ends' chat and /tokenize.
  if (!(tools.is_array() && tools.empty())) r.tools = tools;
  r.add_generation_prompt = add_generation_prompt;
  r.extra = extra_;
  if (kwargs.is_object()) {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) r.extra[it.key()] = *it;
  }
  auto out = template_.Render(r);
  if (!out.ok()) return InvalidArgument("chat template: " + out.status().message());
  return out;
}

}  // namespace llm
