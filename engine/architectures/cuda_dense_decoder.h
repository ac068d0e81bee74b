// The dense decoder (Llama, Mistral, Qwen2, Qwen3) as a definition on the CUDA model runner
// (cuda_model_runner.h). Its layers are the CPU decoder's DecoderSpec (decoder_spec.h): the same
// data says per layer which norms, biases, rotary frequencies, window and softmax scale apply;
// what of a spec it does not compute fails at load by name. Fused kernels
// (kernels/cuda/ops/elementwise_ops.h) for RMSNorm + residual, bias + (q/k norm) + rotary and
// SiLU-and-multiply, CudaLinear projections (bf16, or fp8 e4m3 whose activations the
// kernel before each projection writes as e4m3 rows), and the attention backend the registry
// selects for the device (cuda_c8), with an optional second family for prefill chunks
// (cuda_fmha). The residual stream stays fp32. Built only with the CUDA backend.
#pragma once

#include <memory>

#include "engine/runtime/cuda/cuda_model_runner.h"

namespace llm {

std::unique_ptr<CudaDecoder> NewCudaDenseDecoder(const ModelConfig& config);

}  // namespace llm
