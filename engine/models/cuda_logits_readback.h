// The end of a CUDA model's forward, after the LM head: rows that want a token are sampled on the
// device (their 4 x vocab bytes of logits never cross PCIe), the other rows' logits come back
// through pinned memory (pageable copies run at a fraction of PCIe speed), then one stream sync.
// Shared by the Llama-family and DeepSeek CUDA models. Built only with the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "engine/models/cuda_weights.h"
#include "engine/models/model.h"

namespace llm {

class CudaLogitsReadback {
 public:
  CudaLogitsReadback() = default;
  CudaLogitsReadback(const CudaLogitsReadback&) = delete;
  CudaLogitsReadback& operator=(const CudaLogitsReadback&) = delete;
  ~CudaLogitsReadback();

  // d_logits: fp32 [R, vocab] on the device (penalties apply in place), R = logit_rows.size().
  // Sets tokens[r] >= 0
  // for the batch's device_sampled rows and copies the other rows into logits ([R, vocab]).
  // Waits for `stream` before returning.
  Status Run(const ForwardBatch& batch, float* d_logits, int vocab, cudaStream_t stream,
             std::vector<float>* logits, std::vector<int32_t>* tokens);

 private:
  DeviceBuffer sampled_dev_, sampling_args_;  // device-sampled tokens; their jobs
  std::vector<char> host_sampling_;           // jobs staging
  void* pinned_ = nullptr;                    // logits + tokens staging
  size_t pinned_bytes_ = 0;
};

}  // namespace llm
