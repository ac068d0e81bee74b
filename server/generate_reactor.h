// One server-streaming Generate call. The engine thread pushes outputs; gRPC threads drive
// writes (OnWriteDone -> next write). The reactor lives until both gRPC is done with it (OnDone)
// and the engine has dropped its sink, so neither side can touch freed memory.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "llm/v1/generation.grpc.pb.h"

namespace llm {

class GenerateReactor final : public grpc::ServerWriteReactor<::llm::v1::GenerateResponse> {
 public:
  explicit GenerateReactor(Engine* engine);

  // Submits to the engine; on error finishes the call with that status.
  void Start(GenerationRequest request);
  // Ends the call with `error` without involving the engine.
  void Fail(const Status& error);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Sink;
  friend class Sink;

  void Push(GenerationOutput out);  // engine thread
  // Starts the next write or the Finish if one is due. Called without mu_ held.
  void Pump();
  void Unref();

  Engine* engine_;
  std::string request_id_;
  std::mutex mu_;
  std::deque<::llm::v1::GenerateResponse> queue_;
  ::llm::v1::GenerateResponse current_;
  bool writing_ = false;
  std::optional<grpc::Status> final_;  // Finish with this once the queue drains
  bool finish_called_ = false;
  std::atomic<int> refs_{2};  // gRPC (until OnDone) + engine sink (until destroyed)
};

}  // namespace llm
