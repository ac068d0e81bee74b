// Linear layers of the CUDA decoder definitions (cuda_llama_decoder.cc, cuda_deepseek_decoder.cc):
// a weight in the quantization method the load chose, and the GEMMs that apply it. The runner
// (cuda_model_runner.h) owns the CudaLinearOps every layer shares. Built only with the CUDA
// backend.
//
// Methods: bf16 (cuBLAS), and fp8 e4m3 with one scale per tensor, quantized from bf16 at load
// (cuBLASLt, activations quantized per row at run time). Per-channel and block-scaled fp8 are
// further WeightQuant values: Quantize, RunFp8 and Apply are where they plug in.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/models/cuda_fp8_gemm.h"
#include "engine/models/cuda_weights.h"
#include "kernels/cuda/fp8_quant.h"

namespace llm {

enum class WeightQuant {
  kBf16,
  kFp8PerTensor,  // e4m3, one scale per (stacked) matrix, from bf16 at load
};
const char* WeightQuantName(WeightQuant q);

// What every linear layer of a model shares: the compute stream, cuBLAS, the fp8 GEMM cache.
struct CudaLinearOps {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  CudaFp8Gemm* fp8 = nullptr;         // null without fp8 weights
  const float* unit_scale = nullptr;  // 1.0f: the activation scale when row scales come after
  float* amax = nullptr;              // one float of scratch for Quantize
};

// y[rows, n] = x[rows, k] W^T for one weight W [n, k], or for one of `groups` matrices stacked
// into one buffer [groups * n, k] (MoE experts: each its own fp8 scale).
class CudaLinear {
 public:
  // Each fp8 scale sits in its own 16-byte slot: cuBLASLt rejects (NOT_SUPPORTED) scale pointers
  // that are only 4-byte aligned.
  static constexpr int kScaleSlot = 4;  // floats

  // Where the loader writes the bf16 weight, before Quantize.
  DeviceBuffer* bf16_target() { return &w_; }
  // Converts the loaded bf16 weight to `quant` (frees the bf16 copy). fp8 needs n and k to be
  // multiples of 16 (cuBLASLt); InvalidArgument naming `name` otherwise.
  Status Quantize(const CudaLinearOps& ops, WeightQuant quant, int n, int k, int groups,
                  const std::string& name);
  bool fp8() const { return quant_ != WeightQuant::kBf16; }
  // bf16 weights only: the matrix (for batched GEMMs that index it themselves).
  const void* bf16() const { return w_.ptr; }
  // The matrix in its stored form (bf16, or e4m3 bytes) and the fp8 scales ([groups][kScaleSlot],
  // null for bf16): for kernels that index the groups themselves (the MoE grouped GEMMs).
  const void* data() const { return w_.ptr; }
  const float* scales() const { return fp8() ? scales_.as<float>() : nullptr; }

  // bf16 in and out (fp8: quantizes x per row into `scratch`, the raw product, then the row
  // scales): the plain form. scratch: e4m3 [rows16, k] + [rows16] scales, unused for bf16; y
  // must hold whole 16-row groups with fp8 weights (rows past `rows` are scratch).
  Status Apply(const CudaLinearOps& ops, const void* x, int rows, void* y,
               const cuda::Fp8Rows& scratch, int group = 0) const;
  // bf16 weights: cuBLAS with out_type y (fp32 for logits and routers).
  Status RunBf16(const CudaLinearOps& ops, const void* x, int rows, void* y,
                 cudaDataType out_type = CUDA_R_16BF, int group = 0) const;
  // fp8 weights, input already e4m3 (its producer wrote it): the raw product y (bf16), without
  // the input's row scales; x_scale is a device scalar (null: 1).
  Status RunFp8(const CudaLinearOps& ops, const void* xq, const float* x_scale, int rows, void* y,
                int group = 0) const;

 private:
  DeviceBuffer w_;       // bf16 [groups * n, k] or e4m3 bytes
  DeviceBuffer scales_;  // fp8: [groups][kScaleSlot]
  WeightQuant quant_ = WeightQuant::kBf16;
  int n_ = 0, k_ = 0, groups_ = 1;
};

// Whole 16-row groups: the fp8 GEMMs run on them (scratch and outputs are sized for them).
inline int Fp8Rows16(int rows) {
  return (rows + 15) / 16 * 16;
}

}  // namespace llm
