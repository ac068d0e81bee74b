// CUDA attention backends run on a stream the model owns, set through
// AttentionBackend::set_stream (kernels/attention_backend.h).
#pragma once

#include "kernels/attention_backend.h"

namespace llm::cuda {

// Kept for the CUDA backends' declarations: set_stream now lives on AttentionBackend itself, so
// a model can hold any GPU family (cuda_c8, cuda_fmha, cuda_mla) through the base pointer.
using CudaAttentionBackend = AttentionBackend;

// The cuda_c8 backend's prefill kernel choice (ModelLoadOptions::c8_prefill). The registry builds
// a backend from an AttentionSpec, which carries no per-family choices, so the model asks for
// this interface (dynamic_cast) after creating the backend, as for MlaKernelSwitch.
class C8PrefillSwitch {
 public:
  virtual ~C8PrefillSwitch() = default;
  // Prefill sequences through the sm_90a wgmma FMHA kernel over a bf16 copy of their 8-bit cache
  // (C8Attention::SetPrefillFmha); InvalidArgument where it cannot run.
  virtual Status SetPrefillFmha(bool on) = 0;
  virtual bool prefill_fmha() const = 0;
};

}  // namespace llm::cuda
