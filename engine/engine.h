// The engine thread. gRPC threads call Submit/Abort, which only validate and enqueue; one engine
// thread owns the EngineCore (scheduler, KV cache, model) and runs steps while there is work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <variant>

#include "engine/engine_core.h"

namespace llm {

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_blocks = 0;
  int num_free_blocks = 0;
  int64_t steps = 0;
};

class Engine {
 public:
  explicit Engine(std::unique_ptr<EngineCore> core);
  ~Engine();  // stops the thread; pending requests end with UNAVAILABLE

  void Start();
  void Stop();

  // Validates (filling defaults), assigns an id when empty, and enqueues. On error nothing was
  // enqueued and the sink is never called.
  Status Submit(GenerationRequest request, std::shared_ptr<ResultSink> sink,
                std::string* assigned_id);
  // Returns false when no active request has this id. `error` OK means a normal abort
  // (finish reason ABORTED); otherwise the request ends with that status.
  bool Abort(const std::string& request_id, const Status& error = Status::Ok());

  // Immutable after construction; safe from any thread.
  const EngineCore& core() const { return *core_; }
  EngineStats stats() const;
  // Requests submitted and not yet ended.
  int num_active() const;

 private:
  struct AddCmd {
    GenerationRequest request;
    std::shared_ptr<ResultSink> sink;
  };
  struct AbortCmd {
    std::string request_id;
    Status error;
  };
  using Command = std::variant<AddCmd, AbortCmd>;

  void Loop();
  void Release(const std::string& request_id);

  std::unique_ptr<EngineCore> core_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> inbox_;
  std::set<std::string> active_ids_;  // ids submitted and not yet finished
  int queued_ = 0;  // submitted and never scheduled yet (admission control); guarded by mu_
  bool stop_ = false;
  uint64_t next_auto_id_ = 0;
  EngineStats stats_;
};

}  // namespace llm
