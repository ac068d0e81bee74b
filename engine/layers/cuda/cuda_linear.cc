#include "engine/layers/cuda/cuda_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/ops/dense_gemv.h"

namespace llm {

const char* WeightQuantName(WeightQuant q) {
  switch (q) {
    case WeightQuant::kBf16:
      return "bf16";
    case WeightQuant::kFp8PerTensor:
      return "fp8-e4m3 (per-tensor scales)";
    case WeightQuant::kFp8PerChannel:
      return "fp8-e4m3 (per-channel scales)";
    case WeightQuant::kFp8Block:
      return "fp8-e4m3 (128x128 block scales)";
  }
  return "?";
}

Status CudaLinear::Quantize(const CudaLinearOps& ops, WeightQuant quant, int n, int k, int groups,
                            const std::string& name) {
  n_ = n;
  k_ = k;
  groups_ = groups;
  quant_ = quant;
  input_ = Fp8Input::kDynamicRows;
  if (quant == WeightQuant::kBf16) return Status::Ok();
  if (quant != WeightQuant::kFp8PerTensor) {
    return Internal(std::string(WeightQuantName(quant)) + " comes only from a checkpoint");
  }
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

Status CudaLinear::LoadCheckpoint(const CudaLinearOps& ops, const WeightStore& store,
                                  Bf16WeightLoader& loader, const std::vector<std::string>& names,
                                  const std::vector<std::vector<int64_t>>& shapes,
                                  const std::string& name, WeightQuant fallback, int groups) {
  int n_fp8 = 0;
  for (const std::string& part : names) {
    LLM_ASSIGN_OR_RETURN(const DType t, store.StoredDType(part));
    n_fp8 += t == DType::kFp8E4M3;
  }
  int64_t n = 0;
  for (const auto& sh : shapes) n += sh[0];
  const int64_t k = shapes[0][1];
  if (n_fp8 == 0) {  // a layer the checkpoint left unquantized
    LLM_RETURN_IF_ERROR(loader.Load(names, shapes, 0.f, 0.02f, &w_));
    return Quantize(ops, fallback, static_cast<int>(n / groups), static_cast<int>(k), groups, name);
  }
  auto refuse = [&](const std::string& why) {
    return InvalidArgument("fp8 checkpoint, " + name + ": " + why);
  };
  if (n_fp8 != static_cast<int>(names.size())) {
    return refuse("some of " + names[0] + " ... are float8_e4m3 and some are not");
  }
  if (n % 16 != 0 || k % 16 != 0) {
    return refuse("[" + std::to_string(n) + ", " + std::to_string(k) +
                  "]: the fp8 GEMMs need multiples of 16");
  }
  if (ops.fp8 == nullptr) return Internal("fp8 checkpoint weights without the fp8 GEMM");
  std::vector<Fp8Weight> parts;
  for (size_t i = 0; i < names.size(); ++i) {
    LLM_ASSIGN_OR_RETURN(Fp8Weight w, store.ReadFp8(names[i], shapes[i]));
    if (w.kind == Fp8Weight::Scale::kBlock && (w.block_rows != 128 || w.block_cols != 128)) {
      return Unimplemented("fp8 checkpoint, " + name + ": weight_block_size [" +
                           std::to_string(w.block_rows) + ", " + std::to_string(w.block_cols) +
                           "] on cuda (cuBLASLt block scaling is 128x128)");
    }
    if (w.kind == Fp8Weight::Scale::kBlock && i + 1 < names.size() && w.rows % 128 != 0) {
      return refuse(names[i] + " has " + std::to_string(w.rows) +
                    " rows, not whole 128-row blocks, and more parts are stacked below it");
    }
    if (i > 0 &&
        (w.kind == Fp8Weight::Scale::kBlock) != (parts[0].kind == Fp8Weight::Scale::kBlock)) {
      return refuse("block and non-block scales stacked together");
    }
    if (i > 0 && w.has_input_scale != parts[0].has_input_scale) {
      return refuse("some parts have an input_scale and some do not");
    }
    parts.push_back(std::move(w));
  }
  if (store.quantization().static_input_scales && !parts[0].has_input_scale) {
    return refuse("the checkpoint's activation scheme is static, but " + names[0] +
                  " has no input_scale tensor");
  }
  n_ = static_cast<int>(n);
  k_ = static_cast<int>(k);
  groups_ = 1;
  // The bytes, stacked as they are.
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(n * k));
  for (const Fp8Weight& w : parts) bytes.insert(bytes.end(), w.data, w.data + w.rows * w.cols);
  LLM_RETURN_IF_ERROR(w_.Alloc(bytes.size()));
  GPU_RETURN_IF_ERROR(cudaMemcpy(w_.ptr, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  std::vector<float> scales;
  if (parts[0].kind == Fp8Weight::Scale::kBlock) {
    quant_ = WeightQuant::kFp8Block;
    const int kb = (k_ + 127) / 128, ld = Fp8BlockLd(k_);
    scales.assign(static_cast<size_t>((n_ + 127) / 128) * ld, 0.f);
    int64_t row_block = 0;
    for (const Fp8Weight& w : parts) {
      const int64_t nb = (w.rows + 127) / 128;
      for (int64_t r = 0; r < nb; ++r) {
        std::copy(w.scale.begin() + r * kb, w.scale.begin() + (r + 1) * kb,
                  scales.begin() + (row_block + r) * ld);
      }
      row_block += nb;
    }
  } else {
    bool one_scale = true;
    for (const Fp8Weight& w : parts) {
      one_scale &= w.kind == Fp8Weight::Scale::kTensor && w.scale[0] == parts[0].scale[0];
    }
    if (one_scale) {
      quant_ = WeightQuant::kFp8PerTensor;
      scales.assign(kScaleSlot, 0.f);
      scales[0] = parts[0].scale[0];
    } else {
      quant_ = WeightQuant::kFp8PerChannel;
      for (const Fp8Weight& w : parts) {
        for (int64_t r = 0; r < w.rows; ++r) {
          scales.push_back(w.kind == Fp8Weight::Scale::kTensor ? w.scale[0] : w.scale[r]);
        }
      }
    }
  }
  LLM_RETURN_IF_ERROR(scales_.Alloc(scales.size() * sizeof(float)));
  GPU_RETURN_IF_ERROR(cudaMemcpy(scales_.ptr, scales.data(), scales.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
  input_ = quant_ == WeightQuant::kFp8Block ? Fp8Input::kDynamicBlocks : Fp8Input::kDynamicRows;
  if (parts[0].has_input_scale) {
    if (quant_ == WeightQuant::kFp8Block) {
      return Unimplemented("fp8 checkpoint, " + name +
                           ": static input scales with block-scaled weights");
    }
    float in = 0.f;
    for (const Fp8Weight& w : parts) in = std::max(in, w.input_scale);
    if (!(in > 0.f) || !std::isfinite(in)) {
      return refuse("input_scale " + std::to_string(in) + " is not a positive number");
    }
    input_ = Fp8Input::kStatic;
    const float slot[kScaleSlot] = {in, 0.f, 0.f, 0.f};
    LLM_RETURN_IF_ERROR(in_scale_.Alloc(sizeof(slot)));
    GPU_RETURN_IF_ERROR(cudaMemcpy(in_scale_.ptr, slot, sizeof(slot), cudaMemcpyHostToDevice));
  }
  return Status::Ok();
}

size_t CudaLinear::Fp8ScaleFloats(int rows) const {
  const size_t m = static_cast<size_t>(Fp8Rows16(rows));
  return quant_ == WeightQuant::kFp8Block ? m * ((k_ + 127) / 128) : m;
}

Status CudaLinear::RunBf16(const CudaLinearOps& ops, const void* x, int rows, void* y,
                           cudaDataType out_type, int group) const {
  if (fp8()) return Internal("RunBf16 on an fp8 weight");
  const auto* w = w_.as<uint16_t>() + static_cast<size_t>(group) * n_ * k_;
  const bool aligned =
      reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (rows <= ops.dense_gemv_max_rows && cuda::DenseGemvPreferred(rows, n_, k_) && aligned &&
      (out_type == CUDA_R_16BF || out_type == CUDA_R_32F) &&
      cuda::LaunchDenseGemvBf16(x, w, rows, n_, k_, y, out_type == CUDA_R_32F, ops.stream)) {
    return Status::Ok();
  }
  return GemmBf16(ops.blas, x, w, rows, n_, k_, y, out_type);
}

Status CudaLinear::RunFp8(const CudaLinearOps& ops, const void* xq, const float* x_scale, int rows,
                          void* y, int group, const float* x_scales) const {
  const int m = Fp8Rows16(rows);
  switch (quant_) {
    case WeightQuant::kFp8PerTensor: {
      const auto* w = w_.as<uint8_t>() + static_cast<size_t>(group) * n_ * k_;
      return ops.fp8->Run(xq, x_scale != nullptr ? x_scale : ops.unit_scale, w,
                          scales_.as<float>() + group * kScaleSlot, m, n_, k_, y);
    }
    case WeightQuant::kFp8PerChannel:
    case WeightQuant::kFp8Block:
      if (group != 0) return Internal("grouped checkpoint fp8 weights are not implemented");
      if (x_scales == nullptr) return Internal("RunFp8 without the input's scales");
      return ops.fp8->Run(
          xq, x_scales, w_.ptr, scales_.as<float>(), m, n_, k_, y,
          quant_ == WeightQuant::kFp8Block ? Fp8Scaling::kBlock : Fp8Scaling::kOuter);
    case WeightQuant::kBf16:
      break;
  }
  return Internal("RunFp8 on a bf16 weight");
}

Status CudaLinear::Apply(const CudaLinearOps& ops, const void* x, int rows, void* y,
                         const cuda::Fp8Rows& scratch, int group) const {
  if (rows == 0) return Status::Ok();
  if (!fp8()) return RunBf16(ops, x, rows, y, CUDA_R_16BF, group);
  switch (input_) {
    case Fp8Input::kDynamicBlocks:
      cuda::LaunchQuantizeBlocks128Fp8(x, rows, k_, scratch.q, scratch.scale, Fp8Rows16(rows),
                                       ops.stream);
      return RunFp8(ops, scratch.q, nullptr, rows, y, group, scratch.scale);
    case Fp8Input::kStatic:
      cuda::LaunchQuantizeRowsStaticFp8(x, rows, k_, in_scale_.as<float>(), scratch, ops.stream);
      if (raw_output()) return RunFp8(ops, scratch.q, in_scale_.as<float>(), rows, y, group);
      return RunFp8(ops, scratch.q, nullptr, rows, y, group, scratch.scale);
    case Fp8Input::kDynamicRows:
      cuda::LaunchQuantizeRowsFp8(x, rows, k_, scratch, ops.stream);
      if (!raw_output()) return RunFp8(ops, scratch.q, nullptr, rows, y, group, scratch.scale);
      LLM_RETURN_IF_ERROR(RunFp8(ops, scratch.q, nullptr, rows, y, group));
      cuda::LaunchScaleRowsBf16(y, scratch.scale, rows, n_, ops.stream);
      return Status::Ok();
  }
  return Internal("unknown fp8 input quantization");
}

}  // namespace llm
