// A fixed set of worker threads that help the calling thread through data-parallel loops (the
// engine's per-row token masks). The caller always takes part, so a pool of one thread is a
// plain loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llm {

class WorkerPool {
 public:
  // `threads` counts the caller: threads - 1 workers are started (none for 0 or 1).
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls f(i) once for every i in [0, n), on the caller and the workers, and returns when every
  // call has returned. f must be safe to run concurrently for distinct i. Not reentrant: one
  // loop at a time, from one thread.
  void ParallelFor(size_t n, const std::function<void(size_t)>& f);

 private:
  void WorkerLoop();
  // Takes indices of the loop until none is left.
  void Drain(const std::function<void(size_t)>& f, size_t n);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;  // one per loop; workers wake when it moves
  bool stop_ = false;
  int pending_ = 0;  // workers not done with the current loop (each wakes for every loop)
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
};

}  // namespace llm
