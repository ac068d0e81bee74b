// model_step_bench --kernel-timeline's table (bench/kernel_timeline_table.h) on made-up kernels:
// end increments under overlapping (PDL) kernels, grouping by name, and the refusals.
#include "bench/kernel_timeline_table.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace {

using bench::TabulateKernelTimeline;
using bench::TimedKernel;

// Two steps of norm -> gemv -> norm; each kernel starts before the previous one ends (PDL), the
// second norm of a step ends 2 us after the gemv. Times in ns.
std::vector<TimedKernel> TwoSteps() {
  std::vector<TimedKernel> k;
  for (uint64_t t0 : {1'000'000ull, 2'000'000ull}) {
    k.push_back({t0, t0 + 4'000, "Norm"});
    k.push_back({t0 + 1'000, t0 + 14'000, "Gemv<1>"});
    k.push_back({t0 + 12'000, t0 + 16'000, "Norm"});
  }
  return k;
}

}  // namespace

TEST_CASE("Kernel timeline: end increments add up to the step's span", "[bench]") {
  std::vector<TimedKernel> k = TwoSteps();
  std::swap(k[0], k[5]);  // any order in
  const std::string t = TabulateKernelTimeline(k, 2, 3);
  // Span 16 us: Gemv<1> waits 10 (14 - 4), the norms 4 + 2.
  CHECK(t.find("3 kernels a step, first start to last end 16.0 us") != std::string::npos);
  CHECK(t.find("| Gemv<1> | 1 | 13.00 | 10.0 | 62.5% |") != std::string::npos);
  CHECK(t.find("| Norm | 2 | 4.00 | 6.0 | 37.5% |") != std::string::npos);
  // Largest increments first; positions in step order with their offsets.
  CHECK(t.find("| Gemv<1> |") < t.find("| Norm |"));
  CHECK(t.find("| 1 | Gemv<1> | 1.0 | 13.00 | 10.00 |") != std::string::npos);
  CHECK(t.find("| 2 | Norm | 12.0 | 4.00 | 2.00 |") != std::string::npos);
}

TEST_CASE("Kernel timeline: a kernel inside the previous one's span adds nothing", "[bench]") {
  std::vector<TimedKernel> k = {{0, 10'000, "Long"}, {1'000, 5'000, "Inside"}};
  const std::string t = TabulateKernelTimeline(k, 1, 2);
  CHECK(t.find("| Inside | 1 | 4.00 | 0.0 | 0.0% |") != std::string::npos);
  CHECK(t.find("first start to last end 10.0 us") != std::string::npos);
}

TEST_CASE("Kernel timeline: refuses windows that are not whole steps of one sequence", "[bench]") {
  std::vector<TimedKernel> k = TwoSteps();
  CHECK(TabulateKernelTimeline(k, 4, 3).find("do not split into 4 steps") != std::string::npos);
  k[4].name = "Other";
  CHECK(TabulateKernelTimeline(k, 2, 3).find("step 1's kernel 1 is Other") != std::string::npos);
  CHECK(TabulateKernelTimeline({}, 1, 3).find("do not split") != std::string::npos);
}
