// The kernel benchmarks' checks: a failed CUDA call (CK) or status (OK) prints where and what,
// then ends the benchmark.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "base/status.h"

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#define OK(x)                                                                               \
  do {                                                                                      \
    const llm::Status s = (x);                                                              \
    if (!s.ok()) {                                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s.ToString().c_str()); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
