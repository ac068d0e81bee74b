// A ResultSink for front ends whose handler thread waits for outputs (the HTTP server runs one
// thread per connection): the engine thread only appends and signals; the handler thread takes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "engine/request.h"

namespace llm {

class OutputQueue final : public ResultSink {
 public:
  void OnOutput(GenerationOutput output) override;  // engine thread; never blocks

  // Waits up to `timeout` for the next output; false when none came in time.
  bool Next(std::chrono::milliseconds timeout, GenerationOutput* out);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationOutput> queue_;
};

// The whole result of a request, built from its stream of outputs (non-streaming responses).
struct GenerationResult {
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<SampledToken> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;
  Usage usage;
  Status error;
  bool finished = false;

  // Appends one output; sets `finished` on the last one (completion or error).
  void Add(GenerationOutput out);
};

}  // namespace llm
