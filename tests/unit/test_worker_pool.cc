// base/worker_pool: every index of a loop runs exactly once, on several threads, loop after loop.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "base/worker_pool.h"

namespace llm {
namespace {

TEST_CASE("WorkerPool runs each index of every loop exactly once", "[worker_pool]") {
  for (int threads : {0, 1, 2, 4}) {
    INFO(threads << " threads");
    WorkerPool pool(threads);
    CHECK(pool.threads() == std::max(1, threads));
    for (size_t n : {0, 1, 2, 7, 1000}) {
      for (int loop = 0; loop < 20; ++loop) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
        for (size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
      }
    }
  }
}

TEST_CASE("WorkerPool loops use the workers and the caller", "[worker_pool]") {
  WorkerPool pool(3);
  std::mutex mu;
  std::condition_variable all_in;
  std::set<std::thread::id> seen;
  int inside = 0;
  // Each call waits until three calls are inside at once, so three threads must take part (the
  // minute's bound only keeps a broken pool from hanging the suite).
  pool.ParallelFor(3, [&](size_t) {
    std::unique_lock<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
    if (++inside == 3) all_in.notify_all();
    all_in.wait_for(lock, std::chrono::seconds(60), [&] { return inside == 3; });
  });
  CHECK(inside == 3);
  CHECK(seen.size() == 3);
  CHECK(seen.count(std::this_thread::get_id()) == 1);
}

}  // namespace
}  // namespace llm
