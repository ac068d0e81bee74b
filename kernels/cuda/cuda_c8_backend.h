// CUDA attention backends run on a stream the model owns.
#pragma once

#include "kernels/attention_backend.h"

namespace llm::cuda {

class CudaAttentionBackend : public AttentionBackend {
 public:
  // The cudaStream_t every Plan upload and Run launch goes to.
  virtual void set_stream(void* stream) = 0;
};

}  // namespace llm::cuda
