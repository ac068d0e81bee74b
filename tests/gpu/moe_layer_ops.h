// The stream, cuBLAS handle, fp8 GEMM state and unit scale a CudaMoeLayer runs on in the MoE
// layer tests and benchmarks with bf16 and fp8 experts (test_moe_layer.cc,
// test_moe_layer_bench.cc; the MXFP4 benchmarks need less: moe_bench_util.h's BenchOps).
#pragma once

#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/layers/cuda/cuda_fp8_gemm.h"
#include "engine/layers/cuda/cuda_linear.h"
#include "engine/layers/cuda/cuda_weights.h"

namespace llm::gpu_test {

struct MoeLayerOps {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* ws = nullptr;
  CudaFp8Gemm fp8;
  DeviceBuffer unit, amax;
  CudaLinearOps ops;
  MoeLayerOps() {
    REQUIRE(cudaSuccess == cudaStreamCreate(&stream));
    REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    const size_t ws_bytes = 32ull << 20;
    REQUIRE(cudaSuccess == cudaMalloc(&ws, ws_bytes));
    REQUIRE(cublasSetStream(blas, stream) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetWorkspace(blas, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(fp8.Init(stream, ws, ws_bytes).ok());
    REQUIRE(unit.Alloc(16).ok());
    const float one = 1.0f;
    REQUIRE(cudaSuccess == cudaMemcpy(unit.ptr, &one, 4, cudaMemcpyHostToDevice));
    REQUIRE(amax.Alloc(16).ok());
    ops.stream = stream;
    ops.blas = blas;
    ops.fp8 = &fp8;
    ops.unit_scale = unit.as<float>();
    ops.amax = amax.as<float>();
  }
  ~MoeLayerOps() {
    cudaStreamSynchronize(stream);
    cublasDestroy(blas);
    cudaFree(ws);
    cudaStreamDestroy(stream);
  }
};

}  // namespace llm::gpu_test
