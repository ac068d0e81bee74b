// The split-KV search and rules the C8, MLA and FMHA planners share (kernels/split_kv.h).
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/split_kv.h"

namespace llm {
namespace {

TEST_CASE("split-KV wave efficiency counts the idle tail", "[split_kv]") {
  CHECK(WaveEfficiency(0.25) == Approx(0.25));  // a quarter of the slots busy
  CHECK(WaveEfficiency(1.0) == Approx(1.0));
  CHECK(WaveEfficiency(1.3) == Approx(0.65));  // two waves, the second mostly idle
  CHECK(WaveEfficiency(2.0) == Approx(1.0));
  // A sum of per-CTA fractions a hair above a whole number is still that many waves.
  CHECK(WaveEfficiency(2.0 + 1e-12) == Approx(1.0));
}

TEST_CASE("split-KV: under one wave more CTAs win, past it a split must gain", "[split_kv]") {
  CHECK(SplitImproves(0.5, 0.5, 0.25));
  CHECK_FALSE(SplitImproves(0.5, 0.25, 0.5));
  CHECK_FALSE(SplitImproves(2.0, 0.52, 0.5));  // a 2% gain past one wave is not worth a split
  CHECK(SplitImproves(2.0, 0.6, 0.5));
}

TEST_CASE("split-KV: WaveTime is the full waves at the average CTA plus the longest",
          "[split_kv]") {
  CHECK(WaveTime(100, 132, 3.0, 5.0) == Approx(5.0));        // one wave: the longest CTA
  CHECK(WaveTime(264, 132, 3.0, 5.0) == Approx(3.0 + 5.0));  // two waves
  CHECK(WaveTime(265, 132, 3.0, 5.0) == Approx(6.0 + 5.0));  // a third, mostly idle
}

TEST_CASE("split-KV: candidate chunks are 64-token multiples, coarsest first", "[split_kv]") {
  CHECK(KvChunkFor(4096, 16) == 256);
  CHECK(KvChunkFor(1500, 2) == 768);  // 750 rounded up
  CHECK(KvChunkFor(100, 3) == 64);
  CHECK(NumKvChunks(4096, 256) == 16);
  CHECK(NumKvChunks(4097, 256) == 17);

  std::vector<int64_t> seen;
  auto record = [&seen](int64_t c) {
    seen.push_back(c);
    return 0.0;
  };
  auto never = [](double, double) { return false; };
  auto all = [](int64_t) { return true; };
  // Nothing better than the whole KV: the first candidate stays; the search stops below
  // min_chunk.
  CHECK(ChooseKvChunk(1024, 64, 200, record, never, all) == 1024);
  // n = 2..5 (1024 / 5 rounds up to 256 again); n = 6 gives 192 < 200.
  CHECK(seen == std::vector<int64_t>{1024, 512, 384, 256, 256});
  // The cheapest candidate wins.
  auto cost = [](int64_t c) { return c == 384 ? 1.0 : 2.0; };
  auto less = [](double a, double b) { return a < b; };
  CHECK(ChooseKvChunk(1024, 64, 128, cost, less, all) == 384);
  // A capacity bound stops the search before finer chunks are rated, as does max_splits.
  seen.clear();
  CHECK(ChooseKvChunk(1024, 64, 64, record, never, [](int64_t c) { return c >= 384; }) == 1024);
  CHECK(seen == std::vector<int64_t>{1024, 512, 384});
  seen.clear();
  ChooseKvChunk(1024, 2, 64, record, never, all);
  CHECK(seen == std::vector<int64_t>{1024, 512});
}

}  // namespace
}  // namespace llm
