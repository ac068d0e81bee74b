// The cuda_mla backend's kernel choice, for the model that owns the backend: the registry builds a
// backend from an AttentionSpec, which carries no per-family kernel choices, so the model asks for
// this interface (dynamic_cast) after creating it. Plain C++ header.
#pragma once

#include "base/status.h"
#include "kernels/cuda/mla/mla_decode.h"

namespace llm::cuda {

class MlaKernelSwitch {
 public:
  virtual ~MlaKernelSwitch() = default;
  // Which kernel runs the decode work items (MlaKernel, mla_decode.h); call before the first Plan.
  // kWgmma where it cannot run (a device other than compute capability 9.0, a build without
  // sm_90a) is InvalidArgument and keeps the previous choice.
  virtual Status SetMlaKernel(MlaKernel kernel) = 0;
  // Whether work items of row variant v (kMlaVariantRows) run on the sm_90a kernel.
  virtual bool uses_wgmma(int variant) const = 0;
  // Whether bf16 items of row variant v take the wgmma kernel's seesaw schedule (MlaBf16Schedule).
  virtual bool uses_seesaw(int variant) const = 0;
};

}  // namespace llm::cuda
