// Catch2 main for GPU tests: exits with 77 (ctest SKIP_RETURN_CODE) and says so when no CUDA
// device is present, so CI without a GPU skips cleanly.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "kernels/cuda/c8_attention.h"

int main(int argc, char** argv) {
  if (llm::cuda::CudaDeviceCount() == 0) {
    std::printf(
        "SKIPPED: no CUDA device present; GPU tests run on the GPU machine "
        "(see README, 'GPU tests').\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
