#include "server/output_queue.h"

namespace llm {

void OutputQueue::OnOutput(GenerationOutput output) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(output));
  }
  cv_.notify_one();
}

bool OutputQueue::Next(std::chrono::milliseconds timeout, GenerationOutput* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !queue_.empty(); })) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void GenerationResult::Add(GenerationOutput out) {
  token_ids.insert(token_ids.end(), out.token_ids.begin(), out.token_ids.end());
  text += out.text;
  logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  if (!out.error.ok()) {
    error = out.error;
    finished = true;
  } else if (out.finished) {
    finish_reason = out.finish_reason;
    matched_stop = out.matched_stop;
    usage = out.usage;
    finished = true;
  }
}

}  // namespace llm
