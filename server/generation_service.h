// gRPC front end. Handlers only parse, validate and enqueue into the Engine; results come back
// through one GenerateReactor per stream, which never blocks.
#pragma once

#include <atomic>
#include <string>

#include "engine/engine.h"
#include "llm/v1/generation.grpc.pb.h"
#include "server/server_config.h"
#include "server/stream_writer.h"

namespace llm {

class GenerationService final : public ::llm::v1::Generation::CallbackService {
 public:
  GenerationService(Engine* engine, const ServerConfig& config);

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

  // Rejects new Generate calls with UNAVAILABLE (graceful shutdown).
  void StopAccepting() { accepting_ = false; }
  // Starts every write the engine has queued (call after the engine stopped, before the gRPC
  // server shuts down, so each stream's final message or status is on its way).
  void FlushWrites() { writer_.Flush(); }

 private:
  Engine* engine_;
  ServerConfig config_;
  std::atomic<bool> accepting_{true};
  StreamWriter writer_;
};

// Converts the proto request into an engine request, applying documented defaults. Tokenizes
// text prompts. Range checks happen in EngineCore::Validate.
Status ConvertRequest(const ::llm::v1::GenerateRequest& in, const EngineCore& core,
                      const ServerConfig& config, GenerationRequest* out);

grpc::Status ToGrpcStatus(const Status& s);

}  // namespace llm
