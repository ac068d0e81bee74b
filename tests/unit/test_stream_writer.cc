// StreamWriter: tasks from any thread run on the writer thread, in order per producer, and
// Flush / destruction leave nothing queued.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "server/stream_writer.h"

namespace llm {
namespace {

TEST_CASE("StreamWriter runs every task on its own thread, in order per producer", "[server]") {
  StreamWriter writer;
  constexpr int kProducers = 4, kTasks = 2000;
  std::vector<std::vector<int>> seen(kProducers);  // touched only by the writer thread
  std::atomic<int> ran{0};
  std::atomic<bool> on_caller{false};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      const auto self = std::this_thread::get_id();
      for (int i = 0; i < kTasks; ++i) {
        writer.Schedule([&, p, i, self] {
          if (std::this_thread::get_id() == self) on_caller = true;
          seen[p].push_back(i);
          ++ran;
        });
      }
    });
  }
  for (auto& t : producers) t.join();
  writer.Flush();
  CHECK(ran == kProducers * kTasks);
  CHECK_FALSE(on_caller);
  for (const auto& v : seen) {
    REQUIRE(v.size() == static_cast<size_t>(kTasks));
    for (int i = 0; i < kTasks; ++i) REQUIRE(v[i] == i);
  }
}

TEST_CASE("StreamWriter destruction runs what is still queued", "[server]") {
  std::atomic<int> ran{0};
  {
    StreamWriter writer;
    for (int i = 0; i < 100; ++i) writer.Schedule([&] { ++ran; });
  }
  CHECK(ran == 100);
}

}  // namespace
}  // namespace llm
