// The table of model_step_bench --kernel-timeline (bench/kernel_timeline.h), apart from CUPTI so
// that a unit test can feed it kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

struct TimedKernel {
  uint64_t start = 0, end = 0;  // ns
  std::string name;
};

// `kernels` (any order) as `steps` steps of one kernel sequence: per kernel name its launches
// per step, mean start-to-end time and mean end increments (its end minus the previous kernel's
// end in the step, or its own time for a step's first; never negative), largest increments
// first; then the first `positions` kernels of a step in order. One error line where the kernels
// do not split into `steps` steps of the same sequence.
std::string TabulateKernelTimeline(std::vector<TimedKernel> kernels, int steps, int positions);

}  // namespace bench
