#include "server/generation_service.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "server/generate_reactor.h"

namespace llm {
namespace pb = ::llm::v1;

grpc::Status ToGrpcStatus(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), s.message());
}

namespace {

// The OpenAI JSON message /v1/chat/completions would receive for `m`, so that both front ends
// hand the chat template the same variables.
nlohmann::ordered_json ChatMessageJson(const pb::ChatMessage& m) {
  nlohmann::ordered_json j = {{"role", m.role()}};
  if (m.has_content()) j["content"] = m.content();
  if (m.has_name()) j["name"] = m.name();
  if (!m.tool_calls().empty()) {
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (const pb::ToolCall& c : m.tool_calls()) {
      calls.push_back({{"id", c.id()},
                       {"type", "function"},
                       {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
    }
    j["tool_calls"] = std::move(calls);
  }
  if (m.has_tool_call_id()) j["tool_call_id"] = m.tool_call_id();
  return j;
}

}  // namespace

Status FromProto(const pb::GenerateRequest& in, GenerateParams* out) {
  out->request_id = in.request_id();
  switch (in.prompt_case()) {
    case pb::GenerateRequest::kText:
      out->prompt = in.text();
      if (in.has_add_special_tokens()) out->add_special_tokens = in.add_special_tokens();
      break;
    case pb::GenerateRequest::kTokenIds:
      out->prompt = std::vector<int32_t>(in.token_ids().ids().begin(), in.token_ids().ids().end());
      break;
    case pb::GenerateRequest::kChat: {
      ChatPromptParams chat;
      chat.messages = nlohmann::ordered_json::array();
      for (const pb::ChatMessage& m : in.chat().messages()) {
        chat.messages.push_back(ChatMessageJson(m));
      }
      if (chat.messages.empty()) return InvalidArgument("chat prompt has no messages");
      if (in.chat().has_add_generation_prompt()) {
        chat.add_generation_prompt = in.chat().add_generation_prompt();
      }
      if (!in.chat().tools_json().empty()) {
        chat.tools = nlohmann::ordered_json::parse(in.chat().tools_json(), nullptr, false);
        if (chat.tools.is_discarded() || !chat.tools.is_array()) {
          return InvalidArgument("chat.tools_json is not a JSON array");
        }
        const std::string e = CheckTools(chat.tools);
        if (!e.empty()) return InvalidArgument("chat.tools_json: " + e);
      }
      const std::string& tc = in.chat().tool_choice();
      if (tc == "function") {
        chat.tool_choice = {ToolChoice::Mode::kFunction, in.chat().tool_choice_function()};
      } else if (!tc.empty() && !ParseToolChoice(tc, &chat.tool_choice).empty()) {
        return InvalidArgument(
            "chat.tool_choice must be \"auto\", \"none\", \"required\" or "
            "\"function\", not \"" +
            tc + "\"");
      }
      if (tc != "function" && !in.chat().tool_choice_function().empty()) {
        return InvalidArgument("chat.tool_choice_function needs chat.tool_choice \"function\"");
      }
      if (in.chat().has_parallel_tool_calls()) {
        chat.parallel_tool_calls = in.chat().parallel_tool_calls();
      }
      if (!in.chat().template_kwargs_json().empty()) {
        chat.template_kwargs =
            nlohmann::ordered_json::parse(in.chat().template_kwargs_json(), nullptr, false);
        if (!chat.template_kwargs.is_object()) {
          return InvalidArgument("chat.template_kwargs_json is not a JSON object");
        }
      }
      out->prompt = std::move(chat);
      out->add_special_tokens = false;  // the template writes BOS and the like itself
      break;
    }
    case pb::GenerateRequest::PROMPT_NOT_SET:
      return InvalidArgument("prompt is empty: set text or token_ids");
  }
  const pb::SamplingParams& s = in.sampling();
  if (s.has_temperature()) out->temperature = s.temperature();
  if (s.has_top_p()) out->top_p = s.top_p();
  if (s.has_top_k()) out->top_k = s.top_k();
  if (s.has_min_p()) out->min_p = s.min_p();
  if (s.has_seed()) out->seed = s.seed();
  if (s.has_repetition_penalty()) out->repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) out->presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) out->frequency_penalty = s.frequency_penalty();
  for (const auto& [token, bias] : s.logit_bias()) out->logit_bias.emplace_back(token, bias);
  std::sort(out->logit_bias.begin(), out->logit_bias.end());  // a proto map has no order
  if (in.has_logprobs()) out->logprobs = in.logprobs();
  const pb::StoppingParams& t = in.stopping();
  if (t.has_max_tokens()) out->max_tokens = t.max_tokens();
  if (t.has_min_tokens()) out->min_tokens = t.min_tokens();
  out->stop.assign(t.stop().begin(), t.stop().end());
  out->stop_token_ids.assign(t.stop_token_ids().begin(), t.stop_token_ids().end());
  if (t.has_ignore_eos()) out->ignore_eos = t.ignore_eos();
  if (in.has_skip_special_tokens()) out->skip_special_tokens = in.skip_special_tokens();
  if (in.has_priority()) out->priority = in.priority();
  if (in.has_n()) out->n = in.n();  // range: EngineCore::Validate (--max-n)
  if (in.has_speculative_decoding()) out->speculative_decoding = in.speculative_decoding();
  return ConstraintFromProto(in, &out->constraint);
}

Status ConvertRequest(const pb::GenerateRequest& in, const EngineCore& core,
                      const ServerConfig& config, GenerationRequest* out) {
  GenerateParams params;
  LLM_RETURN_IF_ERROR(FromProto(in, &params));
  return ConvertRequest(params, core, config, /*chat=*/nullptr, out);
}

GenerationService::GenerationService(RequestGateway* gateway, const ApiKeys* keys)
    : gateway_(gateway), keys_(keys) {}

grpc::Status GenerationService::Authorize(const grpc::CallbackServerContext* ctx) const {
  if (!keys_->enabled()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  const auto it = md.find("authorization");
  const std::string_view value =
      it == md.end() ? std::string_view() : std::string_view(it->second.data(), it->second.size());
  if (keys_->Allows(value)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      it == md.end() ? "missing API key: send 'authorization: Bearer KEY' metadata"
                                     : "invalid API key");
}

grpc::ServerWriteReactor<pb::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* ctx, const pb::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(gateway_, &writer_);
  const grpc::Status auth = Authorize(ctx);
  if (!auth.ok()) {
    reactor->Fail(auth);
    return reactor;
  }
  GenerateParams params;
  Status st = FromProto(*request, &params);
  ChatOutputPlan plan;
  if (auto* chat = std::get_if<ChatPromptParams>(&params.prompt); st.ok() && chat != nullptr) {
    const ChatRenderer* renderer = gateway_->chat();
    std::string bad;
    st = PlanChatOutput(chat->tools, chat->tool_choice, chat->parallel_tool_calls,
                        renderer ? renderer->tool_call_family() : ToolCallFamily::kNone,
                        renderer ? renderer->reasoning_family() : ReasoningFamily::kNone,
                        params.constraint.kind != Constraint::Kind::kNone, &plan,
                        &params.constraint, &bad);
    if (plan.needs_special_tokens && !params.skip_special_tokens) {
      params.skip_special_tokens = false;
    }
  }
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    const auto left = ctx->deadline() - std::chrono::system_clock::now();
    deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
  }
  if (st.ok()) {
    reactor->Start(params, deadline, plan);
  } else {
    reactor->Fail(st);
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* ctx,
                                                   const pb::AbortRequest* request,
                                                   pb::AbortResponse* response) {
  auto* r = ctx->DefaultReactor();
  const grpc::Status auth = Authorize(ctx);
  if (auth.ok()) response->set_found(gateway_->Abort(request->request_id()));
  r->Finish(auth);
  return r;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const pb::TokenizeRequest* request,
                                                      pb::TokenizeResponse* response) {
  auto* r = ctx->DefaultReactor();
  const Tokenizer* tok = gateway_->core().tokenizer();
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) {
    r->Finish(auth);
  } else if (tok == nullptr) {
    r->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the model has no tokenizer"));
  } else if (static_cast<int>(request->text().size()) > gateway_->config().max_prompt_bytes) {
    r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text exceeds max_prompt_bytes"));
  } else {
    const bool add = request->has_add_special_tokens() ? request->add_special_tokens() : true;
    for (int32_t id : tok->Encode(request->text(), add)) response->add_token_ids(id);
    r->Finish(grpc::Status::OK);
  }
  return r;
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* ctx,
                                                        const pb::DetokenizeRequest* request,
                                                        pb::DetokenizeResponse* response) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) {
    r->Finish(auth);
    return r;
  }
  const Tokenizer* tok = gateway_->core().tokenizer();
  const int vocab = gateway_->core().model_config().vocab_size;
  for (int32_t id : request->token_ids()) {
    if (id < 0 || id >= vocab) {
      r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                 std::to_string(vocab) + ")"));
      return r;
    }
  }
  if (tok == nullptr) {
    r->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the model has no tokenizer"));
    return r;
  }
  const bool skip = request->has_skip_special_tokens() ? request->skip_special_tokens() : true;
  std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  response->set_text(tok->Decode(ids, skip));
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                          const pb::GetModelInfoRequest*,
                                                          pb::GetModelInfoResponse* response) {
  if (grpc::Status auth = Authorize(ctx); !auth.ok()) {
    auto* r = ctx->DefaultReactor();
    r->Finish(auth);
    return r;
  }
  const EngineCore& core = gateway_->core();
  const ModelConfig& mc = core.model_config();
  response->set_model_name(mc.name);
  response->set_architecture(mc.architecture_name);
  response->set_vocab_size(mc.vocab_size);
  response->set_max_context_length(core.max_model_len());
  response->set_max_tokens_limit(core.config().max_tokens_limit);
  for (int32_t id : mc.eos_token_ids) response->add_eos_token_ids(id);
  std::optional<int32_t> bos = core.tokenizer() ? core.tokenizer()->bos_token_id() : std::nullopt;
  response->set_bos_token_id(bos ? *bos : -1);
  response->set_dtype(DTypeName(mc.dtype));
  response->set_kv_cache_dtype(core.model().kv_cache_dtype_name());
  response->set_attention_backend(core.model().attention_backend_name());
  response->set_kv_block_size(core.config().model.block_size);
  response->set_kv_num_blocks(core.num_blocks());
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

}  // namespace llm
