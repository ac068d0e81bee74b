// One server-streaming Generate call. The engine thread pushes outputs and, when no write is in
// flight, hands the first write to the StreamWriter thread; gRPC threads drive the rest
// (OnWriteDone -> next write). The reactor lives until gRPC is done with it (OnDone), the engine
// has dropped its sink, and no scheduled write is pending, so no side can touch freed memory.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "engine/engine.h"
#include "llm/v1/generation.grpc.pb.h"
#include "server/openai_tool_calls.h"
#include "server/request_gateway.h"
#include "server/stream_writer.h"

namespace llm {

class GenerateReactor final : public grpc::ServerWriteReactor<::llm::v1::GenerateResponse> {
 public:
  GenerateReactor(RequestGateway* gateway, StreamWriter* writer);

  // Submits through the gateway; on error finishes the call with that status. With
  // `chat_plan.parse` the complete message carries the output parsed (ChatOutput).
  void Start(const GenerateParams& params,
             std::optional<std::chrono::steady_clock::time_point> deadline,
             const ChatOutputPlan& chat_plan = {});
  // Ends the call with `error` without involving the engine.
  void Fail(const Status& error);
  void Fail(const grpc::Status& error);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Sink;
  friend class Sink;

  void Push(GenerationOutput out);  // engine thread
  // Choice out.index's whole text parsed into `co` (a chat prompt with a parse plan); under mu_.
  void SetChatOutput(const GenerationOutput& out, v1::ChatOutput* co);
  // Starts the next write or the Finish if one is due. Called without mu_ held.
  void Pump();
  void Unref();

  RequestGateway* gateway_;
  StreamWriter* writer_;
  std::string request_id_;
  std::mutex mu_;
  std::deque<::llm::v1::GenerateResponse> queue_;
  ::llm::v1::GenerateResponse current_;
  bool writing_ = false;
  bool pump_scheduled_ = false;        // a Pump is queued on the writer thread
  std::optional<grpc::Status> final_;  // Finish with this once the queue drains
  bool finish_called_ = false;
  // Chat prompts with a parse plan: each choice's text so far, parsed whole when it ends.
  std::optional<ChatOutputOptions> parse_;
  std::map<int, std::string> texts_;  // by choice index
  // gRPC (until OnDone) + engine sink (until destroyed) + one per Pump queued on the writer.
  std::atomic<int> refs_{2};
};

}  // namespace llm
