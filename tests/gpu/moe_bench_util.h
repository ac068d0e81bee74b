// What the MoE layer benchmarks share (test_moe_mxfp4_layer.cc, test_moe_small_bench.cc): a
// stream with a cuBLAS handle, gpt-oss's tensor names, the copy rate measured in the same run
// (their floor), and the median time of a captured graph.
#pragma once

#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "engine/layers/cpu/cpu_moe.h"
#include "engine/layers/cuda/cuda_linear.h"
#include "engine/layers/cuda/cuda_weights.h"
#include "tests/gpu/copy_rate.h"

namespace llm::gpu_test {

// A stream and a cuBLAS handle (the router's GEMM), bf16 and MXFP4 weights only.
struct BenchOps {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* ws = nullptr;
  CudaLinearOps ops;
  BenchOps() {
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    const size_t ws_bytes = 32ull << 20;
    REQUIRE(cudaMalloc(&ws, ws_bytes) == cudaSuccess);
    REQUIRE(cublasSetStream(blas, stream) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetWorkspace(blas, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS);
    ops.stream = stream;
    ops.blas = blas;
  }
  ~BenchOps() {
    cublasDestroy(blas);
    cudaFree(ws);
    cudaStreamDestroy(stream);
  }
};

// gpt-oss's layer options (router bias, stacked experts with biases, clamped SwiGLU).
inline MoeTensorNames GptOssNames() {
  MoeTensorNames names;
  names.router = "router";
  names.router_bias = true;
  names.stacked_experts = true;
  names.expert = {"gate_up_proj", "", "down_proj"};
  names.expert_bias = true;
  return names;
}

// The median over 7 timings of `replays` back-to-back launches of `exec` (after 10 warm-up
// launches), in microseconds per launch.
inline double MedianGraphUs(cudaGraphExec_t exec, cudaStream_t stream, int replays = 20) {
  for (int i = 0; i < 10; ++i) REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  cudaEvent_t e0, e1;
  REQUIRE(cudaEventCreate(&e0) == cudaSuccess);
  REQUIRE(cudaEventCreate(&e1) == cudaSuccess);
  std::vector<float> us;
  for (int rep = 0; rep < 7; ++rep) {
    REQUIRE(cudaEventRecord(e0, stream) == cudaSuccess);
    for (int i = 0; i < replays; ++i) REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaEventRecord(e1, stream) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(e1) == cudaSuccess);
    float ms = 0;
    REQUIRE(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
    us.push_back(ms * 1000.f / replays);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// `run` (stream work that can be captured) once eagerly, then captured in a graph and timed by
// MedianGraphUs: the median microseconds per replay.
inline double MedianCapturedUs(cudaStream_t stream, const std::function<void()>& run) {
  run();
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  run();
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  const double us = MedianGraphUs(exec, stream);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

}  // namespace llm::gpu_test
