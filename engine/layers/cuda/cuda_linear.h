// Linear layers of the CUDA decoder definitions (cuda_dense_decoder.cc, cuda_deepseek_decoder.cc):
// a weight in the quantization method the load chose, and the GEMMs that apply it. The runner
// (cuda_model_runner.h) owns the CudaLinearOps every layer shares. Built only with the CUDA
// backend.
//
// Methods: bf16 (cuBLAS); fp8 e4m3 with one scale per tensor, quantized from bf16 at load
// (weight_dtype fp8); and the e4m3 bytes and scales of a pre-quantized checkpoint kept as they are
// (per tensor, per output channel, or per 128x128 block). All fp8 GEMMs are cuBLASLt
// (cuda_fp8_gemm.h); the activations are quantized at run time per row (dynamic), with the
// checkpoint's static input_scale, or per 1x128 block (block-scaled weights).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "engine/layers/cuda/cuda_fp8_gemm.h"
#include "engine/layers/cuda/cuda_weights.h"
#include "kernels/cuda/ops/fp8_quant.h"

namespace llm {

enum class WeightQuant {
  kBf16,
  kFp8PerTensor,   // e4m3, one scale per (stacked) matrix: from bf16 at load, or a checkpoint's
  kFp8PerChannel,  // e4m3 of a checkpoint, one fp32 scale per output row
  kFp8Block,       // e4m3 of a checkpoint, one fp32 scale per 128x128 block (weight_scale_inv)
};
const char* WeightQuantName(WeightQuant q);

// How the input of an fp8 weight is quantized.
enum class Fp8Input {
  kDynamicRows,    // one scale per row from its absmax; the producer kernel may write it
  kStatic,         // the checkpoint's static input_scale (per tensor)
  kDynamicBlocks,  // one scale per 1x128 block from its absmax (kFp8Block weights)
};

// What every linear layer of a model shares: the compute stream, cuBLAS, the fp8 GEMM cache.
struct CudaLinearOps {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  CudaFp8Gemm* fp8 = nullptr;         // null without fp8 weights
  const float* unit_scale = nullptr;  // 1.0f: the activation scale when row scales come after
  float* amax = nullptr;              // one float of scratch for Quantize
  // RunBf16 on at most this many rows takes the small-batch GEMVs (ModelLoadOptions::
  // dense_gemv_max_rows); 0: cuBLAS always.
  int dense_gemv_max_rows = 0;
};

// y[rows, n] = x[rows, k] W^T for one weight W [n, k], or for one of `groups` matrices stacked
// into one buffer [groups * n, k] (MoE experts: each its own fp8 scale).
class CudaLinear {
 public:
  // Each fp8 scale sits in its own 16-byte slot: cuBLASLt rejects (NOT_SUPPORTED) scale pointers
  // that are only 4-byte aligned.
  static constexpr int kScaleSlot = 4;  // floats

  // A projection of a pre-quantized checkpoint: the parts `names` (X.weight, stacked in order
  // into one [sum rows, k] matrix) as the checkpoint stores them. All parts e4m3: their bytes and
  // scales go to the device unchanged (no bf16 copy exists at any time). Stacked per-tensor scales
  // that differ become per-channel scales (each part's scale on its rows): exact, where rescaling
  // the bytes to one scale would round them again. Static input scales of stacked parts: their
  // maximum (exact when equal, as quantizers write them; else no part saturates earlier than with
  // its own). All parts 16-bit (a layer the checkpoint left unquantized): loaded as bf16, then
  // Quantize(fallback, groups: the stacked matrices that get one scale each).
  // Errors name the projection: mixed dtypes, non-128x128 blocks, stacked block matrices whose
  // rows are not whole blocks, n or k not multiples of 16.
  Status LoadCheckpoint(const CudaLinearOps& ops, const WeightStore& store,
                        Bf16WeightLoader& loader, const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& shapes, const std::string& name,
                        WeightQuant fallback = WeightQuant::kBf16, int groups = 1);
  // Where the loader writes the bf16 weight, before Quantize.
  DeviceBuffer* bf16_target() { return &w_; }
  // Converts the loaded bf16 weight to `quant` (frees the bf16 copy). fp8 needs n and k to be
  // multiples of 16 (cuBLASLt); InvalidArgument naming `name` otherwise.
  Status Quantize(const CudaLinearOps& ops, WeightQuant quant, int n, int k, int groups,
                  const std::string& name);
  bool fp8() const { return quant_ != WeightQuant::kBf16; }
  WeightQuant quant() const { return quant_; }
  // Matrices with a per-tensor scale each (Quantize's groups; 1 for a checkpoint's weights).
  int groups() const { return groups_; }
  Fp8Input input() const { return input_; }
  // Fp8Input::kStatic: the checkpoint's input_scale (device, one float); else null.
  const float* static_input_scale() const {
    return input_ == Fp8Input::kStatic ? in_scale_.as<float>() : nullptr;
  }
  // The input may be e4m3 rows with dynamic row scales written by its producer (RunFp8).
  bool takes_fp8_rows() const { return fp8() && input_ == Fp8Input::kDynamicRows; }
  // RunFp8's output still lacks the input's row scales (per-tensor weights: the consumer applies
  // them); false where the GEMM applies them itself (per-channel: outer-vector scaling).
  bool raw_output() const { return quant_ == WeightQuant::kFp8PerTensor; }
  // Device bytes of the weight matrix itself (e4m3: 1 per element; bf16: 2).
  size_t weight_bytes() const { return w_.bytes; }
  // bf16 weights only: the matrix (for batched GEMMs that index it themselves).
  const void* bf16() const { return w_.ptr; }
  // The matrix in its stored form (bf16, or e4m3 bytes) and the fp8 scales ([groups][kScaleSlot],
  // null for bf16): for kernels that index the groups themselves (the MoE grouped GEMMs).
  const void* data() const { return w_.ptr; }
  const float* scales() const { return fp8() ? scales_.as<float>() : nullptr; }

  // bf16 in and out (fp8: quantizes x as input() says into `scratch`, then the scaled product):
  // the plain form. scratch: e4m3 [rows16, k] + scales ([rows16], or [ceil(k / 128)][rows16] for
  // kFp8Block: Fp8ScaleFloats), unused for bf16; y must hold whole 16-row groups with fp8 weights
  // (rows past `rows` are scratch).
  Status Apply(const CudaLinearOps& ops, const void* x, int rows, void* y,
               const cuda::Fp8Rows& scratch, int group = 0) const;
  // Floats of scratch.scale that Apply needs for `rows` rows.
  size_t Fp8ScaleFloats(int rows) const;
  // bf16 weights: cuBLAS with out_type y (fp32 for logits and routers), or the small-batch
  // GEMVs (kernels/cuda/ops/dense_gemv.h) for rows <= ops.dense_gemv_max_rows where they are
  // faster (cuda::DenseGemvPreferred) and x and the weight are 16-byte aligned.
  Status RunBf16(const CudaLinearOps& ops, const void* x, int rows, void* y,
                 cudaDataType out_type = CUDA_R_16BF, int group = 0) const;
  // fp8 weights, input already e4m3 (its producer wrote it). Per-tensor weights: the raw product
  // y (bf16) without the input's row scales; x_scale is a device scalar (null: 1). Per-channel:
  // the scaled product, x_scales [rows16] the input's row scales. Block: the scaled product,
  // x_scales the input's 1x128 block scales [ceil(k / 128)][rows16].
  Status RunFp8(const CudaLinearOps& ops, const void* xq, const float* x_scale, int rows, void* y,
                int group = 0, const float* x_scales = nullptr) const;

 private:
  DeviceBuffer w_;  // bf16 [groups * n, k] or e4m3 bytes
  // fp8 per tensor: [groups][kScaleSlot]; per channel: [n]; block: [ceil(n / 128)][Fp8BlockLd(k)]
  DeviceBuffer scales_;
  DeviceBuffer in_scale_;  // Fp8Input::kStatic: [kScaleSlot], the input_scale
  WeightQuant quant_ = WeightQuant::kBf16;
  Fp8Input input_ = Fp8Input::kDynamicRows;
  int n_ = 0, k_ = 0, groups_ = 1;
};

// Whole 16-row groups: the fp8 GEMMs run on them (scratch and outputs are sized for them).
inline int Fp8Rows16(int rows) {
  return (rows + 15) / 16 * 16;
}

}  // namespace llm
