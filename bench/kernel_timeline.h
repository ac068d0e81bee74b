// Where a step's GPU time goes, kernel by kernel, inside CUDA graph replays (model_step_bench
// --kernel-timeline B): CUPTI's activity records (the source nsys reads) of every kernel, graph
// nodes included, grouped into the repeated steps of a window.
//
// With programmatic dependent launch a kernel's CTAs start while the kernel before it runs, so
// a kernel's own start-to-end time overlaps its neighbours' and sums to more than the step.
// What the step waits for is each kernel's "end increment": its end minus the previous kernel's
// end in the step (kernels of one stream finish in order). The increments add up to the step's
// span, so they say which kernels a faster step must shorten.
//
// CUPTI traces from Start(), called before the model loads (so its graphs are captured and
// replayed under tracing, and every run of the process pays the same tracing cost); only
// kernels that start inside [BeginWindow(), EndWindow()] are reported. Built where CMake finds
// CUDA::cupti (LLM_HAVE_CUPTI).
#pragma once

#include <string>

namespace bench {

class KernelTimeline {
 public:
  // Starts tracing kernels; false (with a message in *error) if CUPTI refuses.
  static bool Start(std::string* error);
  // The window: the steps whose kernels Report groups.
  static void BeginWindow();
  static void EndWindow();
  // Flushes CUPTI's buffers and tabulates the window's kernels as `steps` equal steps: per
  // kernel name its launches per step, mean duration and mean end increment (microseconds),
  // largest increments first, then the first `positions` kernels of a step in order. An error
  // line if the window's kernels do not split into `steps` steps of the same kernel sequence.
  static std::string Report(int steps, int positions);
};

}  // namespace bench
