// Llama-family decoder on CUDA: bf16 weights in device memory, cuBLAS for the projections, fused
// kernels (kernels/cuda/llama_ops.h) for embedding, RMSNorm + residual, bias + rotary and
// SiLU-and-multiply, and the attention backend the registry selects for the device (cuda_c8).
// The residual stream stays fp32. Built only with the CUDA backend.
#pragma once

#include <memory>

#include "engine/models/model.h"
#include "engine/safetensors.h"

namespace llm {

// weights may be null when options.dummy_weights is set: tensors are then filled on the device
// with deterministic random values (benchmarking models too large to ship).
StatusOr<std::unique_ptr<Model>> CreateCudaLlamaModel(const ModelConfig& config,
                                                      const WeightStore* weights,
                                                      const ModelLoadOptions& options);

// True when this build has the CUDA backend and a device is present.
bool CudaAvailable();

}  // namespace llm
