#include "base/worker_pool.h"

namespace llm {

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::Drain(const std::function<void(size_t)>& f, size_t n) {
  for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) f(i);
}

void WorkerPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* f = nullptr;
    size_t n = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      f = fn_;
      n = n_;
    }
    Drain(*f, n);
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --pending_ == 0;
    }
    if (last) done_.notify_one();
  }
}

void WorkerPool::ParallelFor(size_t n, const std::function<void(size_t)>& f) {
  if (workers_.empty() || n < 2) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &f;
    n_ = n;
    next_.store(0);
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  Drain(f, n);
  // Every worker takes part in every loop (perhaps finding nothing left), so none can still be
  // inside this one when the next begins.
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

}  // namespace llm
