// GPU_CHECK for CUDA runtime calls, and the one place CUDA-vs-HIP naming differences live.
#pragma once

#include <cuda_runtime.h>

#include "engine/base/status.h"

#define GPU_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                            \
    cudaError_t _e = (expr);                                                      \
    if (_e != cudaSuccess) {                                                      \
      return ::llm::Internal(std::string(#expr) + ": " + cudaGetErrorString(_e)); \
    }                                                                             \
  } while (0)

#define GPU_CHECK(expr)                                                      \
  do {                                                                       \
    cudaError_t _e = (expr);                                                 \
    LLM_CHECK(_e == cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)
