#include "server/generate_params.h"

#include <algorithm>
#include <random>

#include "server/chat_renderer.h"

namespace llm {

namespace pb = ::llm::v1;

Status ConstraintFromProto(const pb::GenerateRequest& in, Constraint* out) {
  switch (in.constraint_case()) {
    case pb::GenerateRequest::kJsonSchema:
      *out = {Constraint::Kind::kJsonSchema, in.json_schema(), {}};
      break;
    case pb::GenerateRequest::kRegex:
      *out = {Constraint::Kind::kRegex, in.regex(), {}};
      break;
    case pb::GenerateRequest::kGrammar:
      *out = {Constraint::Kind::kGrammar, in.grammar(), {}};
      break;
    case pb::GenerateRequest::kChoice:
      if (in.choice().choices().empty()) return InvalidArgument("choice.choices is empty");
      *out = {Constraint::Kind::kChoice,
              "",
              {in.choice().choices().begin(), in.choice().choices().end()}};
      break;
    case pb::GenerateRequest::kJsonObject:
      if (!in.json_object()) return InvalidArgument("json_object must be true when set");
      *out = {Constraint::Kind::kJsonObject, "", {}};
      break;
    case pb::GenerateRequest::CONSTRAINT_NOT_SET:
      *out = {};
      break;
  }
  return Status::Ok();
}

Status ConvertRequest(const GenerateParams& in, const EngineCore& core, const ServerConfig& config,
                      const ChatRenderer* chat, GenerationRequest* out,
                      std::string* rendered_chat) {
  out->request_id = in.request_id;
  if (const auto* c = std::get_if<ChatPromptParams>(&in.prompt)) {
    if (chat == nullptr) {
      return FailedPrecondition(
          "chat prompts need a chat template and this server has no chat template engine yet; "
          "send text or token ids");
    }
    auto text = chat->Render(c->messages, c->tools, c->add_generation_prompt, c->template_kwargs);
    if (!text.ok()) return text.status();
    if (rendered_chat != nullptr) *rendered_chat = *text;
    GenerateParams rendered = in;
    rendered.prompt = std::move(text).value();
    return ConvertRequest(rendered, core, config, chat, out);
  }
  if (const auto* text = std::get_if<std::string>(&in.prompt)) {
    if (text->empty()) return InvalidArgument("prompt is empty");
    if (static_cast<int64_t>(text->size()) > config.max_prompt_bytes) {
      return InvalidArgument("text prompt is " + std::to_string(text->size()) +
                             " bytes; the limit is " + std::to_string(config.max_prompt_bytes));
    }
    if (core.tokenizer() == nullptr) return FailedPrecondition("the model has no tokenizer");
    out->prompt_ids = core.tokenizer()->Encode(*text, in.add_special_tokens);
  } else if (const auto* ids = std::get_if<std::vector<int32_t>>(&in.prompt)) {
    out->prompt_ids = *ids;
  } else {
    return InvalidArgument("prompt is empty: set text or token ids");
  }
  SamplingParams& sp = out->sampling;
  // generation_config.json fills what the request leaves unset (vLLM's default behaviour).
  const GenerationDefaults& defaults = core.model_config().generation;
  defaults.ApplyTo(&sp);
  if (in.temperature) sp.temperature = *in.temperature;
  if (in.top_p) sp.top_p = *in.top_p;
  if (in.top_k) sp.top_k = *in.top_k;
  if (in.min_p) sp.min_p = *in.min_p;
  sp.seed = in.seed ? *in.seed : std::random_device{}();
  if (in.repetition_penalty) sp.repetition_penalty = *in.repetition_penalty;
  if (in.presence_penalty) sp.presence_penalty = *in.presence_penalty;
  if (in.frequency_penalty) sp.frequency_penalty = *in.frequency_penalty;
  sp.logprobs = in.logprobs;
  sp.logit_bias = in.logit_bias;
  StoppingParams& st = out->stopping;
  st.max_tokens = in.max_tokens
                      ? *in.max_tokens
                      : std::min(defaults.max_new_tokens.value_or(config.engine.default_max_tokens),
                                 config.engine.max_tokens_limit);
  if (in.min_tokens) st.min_tokens = *in.min_tokens;
  st.stop = in.stop;
  st.stop_token_ids = in.stop_token_ids;
  if (in.ignore_eos) st.ignore_eos = *in.ignore_eos;
  if (in.skip_special_tokens) out->skip_special_tokens = *in.skip_special_tokens;
  if (in.priority) out->priority = *in.priority;
  if (in.speculative_decoding) out->speculative_decoding = *in.speculative_decoding;
  out->constraint = in.constraint;
  out->n = in.n;
  return Status::Ok();
}

}  // namespace llm
