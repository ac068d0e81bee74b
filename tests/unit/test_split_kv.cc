// The split-KV rule the MLA and FMHA planners share (kernels/split_kv.h).
#include <catch2/catch.hpp>

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

}  // namespace
}  // namespace llm
