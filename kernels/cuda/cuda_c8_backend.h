// CUDA attention backends run on a stream the model owns, set through
// AttentionBackend::set_stream (kernels/attention_backend.h).
#pragma once

#include "kernels/attention_backend.h"

namespace llm::cuda {

// Kept for the CUDA backends' declarations: set_stream now lives on AttentionBackend itself, so
// a model can hold any GPU family (cuda_c8, cuda_fmha, cuda_mla) through the base pointer.
using CudaAttentionBackend = AttentionBackend;

}  // namespace llm::cuda
