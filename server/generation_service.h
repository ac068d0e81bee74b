// gRPC front end. Handlers only parse, validate and enqueue into the Engine; results come back
// through one GenerateReactor per stream, which never blocks.
#pragma once

#include <atomic>
#include <string>

#include "engine/engine.h"
#include "llm/v1/generation.grpc.pb.h"
#include "server/api_keys.h"
#include "server/generate_params.h"
#include "server/request_gateway.h"
#include "server/server_config.h"
#include "server/stream_writer.h"

namespace llm {

class GenerationService final : public ::llm::v1::Generation::CallbackService {
 public:
  // `keys` must outlive the service; every RPC checks the call's `authorization` metadata first.
  GenerationService(RequestGateway* gateway, const ApiKeys* keys);

  grpc::ServerWriteReactor<::llm::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const ::llm::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx,
                                  const ::llm::v1::AbortRequest* request,
                                  ::llm::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const ::llm::v1::TokenizeRequest* request,
                                     ::llm::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                       const ::llm::v1::DetokenizeRequest* request,
                                       ::llm::v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const ::llm::v1::GetModelInfoRequest* request,
                                         ::llm::v1::GetModelInfoResponse* response) override;

  // Starts every write the engine has queued (call after the engine stopped, before the gRPC
  // server shuts down, so each stream's final message or status is on its way).
  void FlushWrites() { writer_.Flush(); }

 private:
  // UNAUTHENTICATED unless the call carries `authorization: Bearer KEY` for a configured key.
  grpc::Status Authorize(const grpc::CallbackServerContext* ctx) const;

  RequestGateway* gateway_;
  const ApiKeys* keys_;
  StreamWriter writer_;
};

// Copies the proto request into the front-end-neutral form (no defaults applied here).
Status FromProto(const ::llm::v1::GenerateRequest& in, GenerateParams* out);
// FromProto then ConvertRequest(GenerateParams) without a chat renderer (tests and fuzzing).
Status ConvertRequest(const ::llm::v1::GenerateRequest& in, const EngineCore& core,
                      const ServerConfig& config, GenerationRequest* out);

grpc::Status ToGrpcStatus(const Status& s);

}  // namespace llm
