// BLAS_RETURN_IF_ERROR: a cuBLAS call's failure as an Internal status naming the call.
#pragma once

#include <cublas_v2.h>

#include <string>

#include "base/status.h"

#define BLAS_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                      \
    cublasStatus_t _s = (expr);                                                             \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                      \
      return ::llm::Internal(std::string(#expr) + " failed: " + cublasGetStatusString(_s)); \
    }                                                                                       \
  } while (0)
