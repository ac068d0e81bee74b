#include "engine/models/cuda_linear.h"

#include <string>

namespace llm {

const char* WeightQuantName(WeightQuant q) {
  switch (q) {
    case WeightQuant::kBf16:
      return "bf16";
    case WeightQuant::kFp8PerTensor:
      return "fp8-e4m3 (per-tensor scales)";
  }
  return "?";
}

Status CudaLinear::Quantize(const CudaLinearOps& ops, WeightQuant quant, int n, int k, int groups,
                            const std::string& name) {
  n_ = n;
  k_ = k;
  groups_ = groups;
  quant_ = quant;
  if (quant == WeightQuant::kBf16) return Status::Ok();
  if (n % 16 != 0 || k % 16 != 0) {
    return InvalidArgument("weight_dtype fp8: " + name + " is [" + std::to_string(n) + ", " +
                           std::to_string(k) + "], the fp8 GEMMs need multiples of 16");
  }
  if (ops.fp8 == nullptr) return Internal("fp8 weights without the fp8 GEMM");
  const int64_t per = static_cast<int64_t>(n) * k;
  DeviceBuffer q;
  LLM_RETURN_IF_ERROR(q.Alloc(per * groups));
  LLM_RETURN_IF_ERROR(scales_.Alloc(static_cast<size_t>(groups) * kScaleSlot * sizeof(float)));
  for (int g = 0; g < groups; ++g) {
    const auto* src = w_.as<uint16_t>() + g * per;
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(ops.amax, 0, sizeof(float), ops.stream));
    cuda::LaunchAbsMaxBf16(src, per, ops.amax, ops.stream);
    cuda::LaunchQuantizeFp8(src, per, ops.amax, scales_.as<float>() + g * kScaleSlot,
                            q.as<uint8_t>() + g * per, ops.stream);
  }
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(ops.stream));  // before the bf16 copy goes
  std::swap(w_.ptr, q.ptr);
  std::swap(w_.bytes, q.bytes);
  return Status::Ok();
}

Status CudaLinear::RunBf16(const CudaLinearOps& ops, const void* x, int rows, void* y,
                           cudaDataType out_type, int group) const {
  if (fp8()) return Internal("RunBf16 on an fp8 weight");
  const auto* w = w_.as<uint16_t>() + static_cast<size_t>(group) * n_ * k_;
  return GemmBf16(ops.blas, x, w, rows, n_, k_, y, out_type);
}

Status CudaLinear::RunFp8(const CudaLinearOps& ops, const void* xq, const float* x_scale, int rows,
                          void* y, int group) const {
  const auto* w = w_.as<uint8_t>() + static_cast<size_t>(group) * n_ * k_;
  return ops.fp8->Run(xq, x_scale != nullptr ? x_scale : ops.unit_scale, w,
                      scales_.as<float>() + group * kScaleSlot, Fp8Rows16(rows), n_, k_, y);
}

Status CudaLinear::Apply(const CudaLinearOps& ops, const void* x, int rows, void* y,
                         const cuda::Fp8Rows& scratch, int group) const {
  if (rows == 0) return Status::Ok();
  if (!fp8()) return RunBf16(ops, x, rows, y, CUDA_R_16BF, group);
  cuda::LaunchQuantizeRowsFp8(x, rows, k_, scratch, ops.stream);
  LLM_RETURN_IF_ERROR(RunFp8(ops, scratch.q, nullptr, rows, y, group));
  cuda::LaunchScaleRowsBf16(y, scratch.scale, rows, n_, ops.stream);
  return Status::Ok();
}

}  // namespace llm
