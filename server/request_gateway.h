// The one request path shared by the gRPC and HTTP front ends: shutdown check, conversion from
// GenerateParams, submission to the engine and abort. Front ends only parse their wire format
// into GenerateParams and render the engine's outputs back.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "server/chat_renderer.h"
#include "server/generate_params.h"
#include "server/server_config.h"

namespace llm {

class RequestGateway {
 public:
  // `chat` (may be null: chat prompts then fail with a message saying so) renders chat prompts
  // for both front ends.
  RequestGateway(Engine* engine, const ServerConfig& config, const ChatRenderer* chat = nullptr)
      : engine_(engine), config_(config), chat_(chat) {}

  // On error nothing was submitted and `sink` is never called. UNAVAILABLE while shutting down,
  // RESOURCE_EXHAUSTED when the engine's queue is full, INVALID_ARGUMENT for a bad request.
  Status Submit(const GenerateParams& params,
                std::optional<std::chrono::steady_clock::time_point> deadline,
                std::shared_ptr<ResultSink> sink, std::string* request_id,
                std::string* rendered_chat = nullptr);
  // Client went away (or asked): the engine frees the request's KV blocks at its next step.
  bool Abort(const std::string& request_id, const Status& why = Status::Ok()) {
    return engine_->Abort(request_id, why);
  }

  void StopAccepting() { accepting_ = false; }
  bool accepting() const { return accepting_; }
  const EngineCore& core() const { return engine_->core(); }
  const ServerConfig& config() const { return config_; }
  const ChatRenderer* chat() const { return chat_; }

 private:
  Engine* engine_;
  ServerConfig config_;
  const ChatRenderer* chat_;
  std::atomic<bool> accepting_{true};
};

}  // namespace llm
