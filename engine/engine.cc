#include "engine/engine.h"

#include <spdlog/spdlog.h>

namespace llm {
namespace {

// Wraps the caller's sink so the engine learns when a request has ended (to free its id).
class ReleasingSink final : public ResultSink {
 public:
  ReleasingSink(std::shared_ptr<ResultSink> inner, std::function<void()> on_end)
      : inner_(std::move(inner)), on_end_(std::move(on_end)) {}
  void OnOutput(GenerationOutput out) override {
    const bool last = out.finished || !out.error.ok();
    inner_->OnOutput(std::move(out));
    if (last) on_end_();
  }

 private:
  std::shared_ptr<ResultSink> inner_;
  std::function<void()> on_end_;
};

}  // namespace

Engine::Engine(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {
  core_->set_dequeue_observer([this] {
    std::lock_guard<std::mutex> lock(mu_);
    --queued_;
  });
}

Engine::~Engine() {
  Stop();
}

void Engine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Engine::Submit(GenerationRequest request, std::shared_ptr<ResultSink> sink,
                      std::string* assigned_id) {
  LLM_RETURN_IF_ERROR(core_->Validate(&request));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Unavailable("server is shutting down");
    // Admission control: requests accepted but never scheduled yet form the queue.
    if (queued_ >= core_->config().max_queued_requests) {
      return ResourceExhausted("server queue is full (" + std::to_string(queued_) +
                               " waiting requests); retry later");
    }
    if (request.request_id.empty()) {
      request.request_id = "req-" + std::to_string(++next_auto_id_);
    }
    if (!active_ids_.insert(request.request_id).second) {
      return Status(StatusCode::kInvalidArgument,
                    "request_id '" + request.request_id + "' is already in use");
    }
    if (assigned_id) *assigned_id = request.request_id;
    const std::string id = request.request_id;
    auto wrapped = std::make_shared<ReleasingSink>(std::move(sink), [this, id] { Release(id); });
    inbox_.push_back(AddCmd{std::move(request), std::move(wrapped)});
    ++queued_;
  }
  cv_.notify_one();
  return Status::Ok();
}

bool Engine::Abort(const std::string& request_id, const Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!active_ids_.count(request_id)) return false;
    inbox_.push_back(AbortCmd{request_id, error});
  }
  cv_.notify_one();
  return true;
}

void Engine::Release(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  active_ids_.erase(request_id);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int Engine::num_active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(active_ids_.size());
}

void Engine::Loop() {
  std::deque<Command> cmds;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100),
                   [&] { return stop_ || !inbox_.empty() || core_->HasWork(); });
      if (stop_) break;
      cmds.swap(inbox_);
    }
    for (Command& cmd : cmds) {
      if (auto* add = std::get_if<AddCmd>(&cmd)) {
        core_->Add(std::move(add->request), std::move(add->sink));
      } else {
        auto& abort = std::get<AbortCmd>(cmd);
        core_->Abort(abort.request_id, abort.error);
      }
    }
    cmds.clear();
    core_->ExpireDeadlines(std::chrono::steady_clock::now());
    if (core_->HasWork()) {
      core_->Step();
    } else {
      core_->UpdateGauges();
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.num_running = core_->num_running();
    stats_.num_waiting = core_->num_waiting();
    stats_.num_blocks = core_->num_blocks();
    stats_.num_free_blocks = core_->num_free_blocks();
    stats_.steps++;
  }
  // Shutdown: everything accepted still gets exactly one final status.
  {
    std::lock_guard<std::mutex> lock(mu_);
    cmds.swap(inbox_);
  }
  for (Command& cmd : cmds) {
    if (auto* add = std::get_if<AddCmd>(&cmd)) {
      GenerationOutput out;
      out.error = Unavailable("server is shutting down");
      add->sink->OnOutput(std::move(out));
    }
  }
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids.assign(active_ids_.begin(), active_ids_.end());
  }
  for (const auto& id : ids) core_->Abort(id, Unavailable("server is shutting down"));
}

}  // namespace llm
