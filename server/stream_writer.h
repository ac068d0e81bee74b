// Runs gRPC stream writes off the engine thread. Starting a write serializes the message and may
// enter the transport inline, which, done by the engine thread for every stream every step, grows
// with the number of streams and stalled the next step at a few hundred of them. The engine thread
// now only queues; one writer thread starts the writes.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llm {

class StreamWriter {
 public:
  StreamWriter();
  ~StreamWriter();  // runs what is queued, then stops
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // Queues `task` for the writer thread (any thread; never blocks on gRPC).
  void Schedule(std::function<void()> task);
  // Returns once every task queued before the call has run.
  void Flush();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;       // work queued, or stop
  std::condition_variable idle_cv_;  // a batch finished
  std::vector<std::function<void()>> queue_;
  bool running_batch_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace llm
