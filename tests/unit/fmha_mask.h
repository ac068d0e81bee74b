// The FMHA mask of a test case in one call (the CPU reference's tests and the GPU kernel's).
#pragma once

#include "kernels/fmha/fmha_params.h"

namespace llm::test {

inline FmhaMask Mask(FmhaMaskType t, int left = -1, int right = 0, int sinks = 0) {
  FmhaMask m;
  m.type = t;
  m.window_left = left;
  m.window_right = right;
  m.sink_tokens = sinks;
  return m;
}

}  // namespace llm::test
