#include "server/generation_service.h"

#include <spdlog/spdlog.h>

#include "server/generate_reactor.h"

namespace llm {
namespace pb = ::llm::v1;

grpc::Status ToGrpcStatus(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), s.message());
}

Status ConvertRequest(const pb::GenerateRequest& in, const EngineCore& core,
                      const ServerConfig& config, GenerationRequest* out) {
  out->request_id = in.request_id();
  switch (in.prompt_case()) {
    case pb::GenerateRequest::kText: {
      if (in.text().empty()) return InvalidArgument("prompt is empty");
      if (static_cast<int>(in.text().size()) > config.max_prompt_bytes) {
        return InvalidArgument("text prompt is " + std::to_string(in.text().size()) +
                               " bytes; the limit is " + std::to_string(config.max_prompt_bytes));
      }
      if (core.tokenizer() == nullptr) return FailedPrecondition("the model has no tokenizer");
      const bool add_special = in.has_add_special_tokens() ? in.add_special_tokens() : true;
      out->prompt_ids = core.tokenizer()->Encode(in.text(), add_special);
      break;
    }
    case pb::GenerateRequest::kTokenIds:
      out->prompt_ids.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      break;
    case pb::GenerateRequest::PROMPT_NOT_SET:
      return InvalidArgument("prompt is empty: set text or token_ids");
  }
  const pb::SamplingParams& s = in.sampling();
  SamplingParams& sp = out->sampling;
  // generation_config.json fills what the request leaves unset (vLLM's default behaviour).
  const GenerationDefaults& defaults = core.model_config().generation;
  defaults.ApplyTo(&sp);
  if (s.has_temperature()) sp.temperature = s.temperature();
  if (s.has_top_p()) sp.top_p = s.top_p();
  if (s.has_top_k()) sp.top_k = s.top_k();
  if (s.has_min_p()) sp.min_p = s.min_p();
  sp.seed = s.has_seed() ? s.seed() : std::random_device{}();
  if (s.has_repetition_penalty()) sp.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) sp.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) sp.frequency_penalty = s.frequency_penalty();
  if (in.has_logprobs()) sp.logprobs = in.logprobs();
  const pb::StoppingParams& t = in.stopping();
  StoppingParams& st = out->stopping;
  st.max_tokens = t.has_max_tokens()
                      ? t.max_tokens()
                      : std::min(defaults.max_new_tokens.value_or(config.engine.default_max_tokens),
                                 config.engine.max_tokens_limit);
  if (t.has_min_tokens()) st.min_tokens = t.min_tokens();
  st.stop.assign(t.stop().begin(), t.stop().end());
  st.stop_token_ids.assign(t.stop_token_ids().begin(), t.stop_token_ids().end());
  if (t.has_ignore_eos()) st.ignore_eos = t.ignore_eos();
  if (in.has_skip_special_tokens()) out->skip_special_tokens = in.skip_special_tokens();
  if (in.has_priority()) out->priority = in.priority();
  return Status::Ok();
}

GenerationService::GenerationService(Engine* engine, const ServerConfig& config)
    : engine_(engine), config_(config) {}

grpc::ServerWriteReactor<pb::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* ctx, const pb::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(engine_, &writer_);
  GenerationRequest req;
  Status st = accepting_ ? ConvertRequest(*request, engine_->core(), config_, &req)
                         : Unavailable("server is shutting down");
  if (st.ok() && ctx->deadline() != std::chrono::system_clock::time_point::max()) {
    const auto left = ctx->deadline() - std::chrono::system_clock::now();
    req.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
  }
  if (st.ok()) {
    reactor->Start(std::move(req));
  } else {
    reactor->Fail(st);
  }
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* ctx,
                                                   const pb::AbortRequest* request,
                                                   pb::AbortResponse* response) {
  response->set_found(engine_->Abort(request->request_id()));
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const pb::TokenizeRequest* request,
                                                      pb::TokenizeResponse* response) {
  auto* r = ctx->DefaultReactor();
  const Tokenizer* tok = engine_->core().tokenizer();
  if (tok == nullptr) {
    r->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the model has no tokenizer"));
  } else if (static_cast<int>(request->text().size()) > config_.max_prompt_bytes) {
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
  const Tokenizer* tok = engine_->core().tokenizer();
  const int vocab = engine_->core().model_config().vocab_size;
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
  const EngineCore& core = engine_->core();
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
