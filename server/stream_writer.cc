#include "server/stream_writer.h"

namespace llm {

StreamWriter::StreamWriter() : thread_([this] { Loop(); }) {}

StreamWriter::~StreamWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void StreamWriter::Schedule(std::function<void()> task) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = queue_.empty();
    queue_.push_back(std::move(task));
  }
  // Only the first task of a burst wakes the writer: it takes the whole queue when it runs, and
  // re-checks the queue before it waits again, so a step's hundreds of tasks need not each pay
  // for a wake-up.
  if (was_empty) cv_.notify_one();
}

void StreamWriter::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !running_batch_; });
}

void StreamWriter::Loop() {
  std::vector<std::function<void()>> batch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stop_ with nothing left to run
    batch.swap(queue_);
    running_batch_ = true;
    lock.unlock();
    for (auto& task : batch) task();
    batch.clear();
    lock.lock();
    running_batch_ = false;
    idle_cv_.notify_all();
  }
}

}  // namespace llm
