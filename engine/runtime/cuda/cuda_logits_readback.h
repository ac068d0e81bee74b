// The end of a CUDA model's forward, after the LM head: rows that want a token are sampled on the
// device (their 4 x vocab bytes of logits never cross PCIe), the other rows' logits come back
// through pinned memory (pageable copies run at a fraction of PCIe speed). Shared by the
// Llama-family and DeepSeek CUDA models. Built only with the CUDA backend.
//
// Issue queues a step's sampling and copies and returns; Finish waits for that step alone (an
// event, not the stream), so the engine can queue step k + 1 before it reads step k's tokens.
// Two steps may be outstanding; each owns one of two pinned slots.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "engine/layers/cuda/cuda_weights.h"
#include "engine/runtime/model.h"
#include "kernels/cuda/common/pinned_staging.h"

namespace llm {

class CudaLogitsReadback {
 public:
  // Sampled tokens stay on the device at a fixed address (device_tokens()), by logit row when
  // every row of the step was device-sampled: the next step's embedding reads its fed-back
  // token ids there. A step may sample at most this many rows.
  static constexpr int kMaxRows = 1 << 16;

  CudaLogitsReadback() = default;
  CudaLogitsReadback(const CudaLogitsReadback&) = delete;
  CudaLogitsReadback& operator=(const CudaLogitsReadback&) = delete;
  ~CudaLogitsReadback();

  // d_logits: fp32 [R, vocab] on the device (penalties apply in place), R = logit_rows.size().
  // Queues the device_sampled rows' sampling and every copy back. Returns the step's slot.
  StatusOr<int> Issue(const ForwardBatch& batch, float* d_logits, int vocab, cudaStream_t stream);
  // Waits for the slot's step; tokens[r] >= 0 for its device-sampled rows, logits ([R, vocab])
  // for the others (not touched when there are none).
  Status Finish(int slot, std::vector<float>* logits, std::vector<int32_t>* tokens);
  // Allocates device_tokens() (before any graph captures its address).
  Status Reserve() {
    return sampled_dev_.ptr ? Status::Ok() : sampled_dev_.Alloc(kMaxRows * sizeof(int32_t));
  }
  // Issue + Finish.
  Status Run(const ForwardBatch& batch, float* d_logits, int vocab, cudaStream_t stream,
             std::vector<float>* logits, std::vector<int32_t>* tokens);
  // int32 [kMaxRows]: the last issued step's sampled tokens (by device-sampled row).
  const int32_t* device_tokens() const { return sampled_dev_.as<int32_t>(); }

 private:
  struct Slot {
    // [full rows of logits, in row order][tokens]: only the rows sampled on the host come back.
    void* pinned = nullptr;
    size_t bytes = 0;
    int full_rows = 0;
    cudaEvent_t done = nullptr;
    bool busy = false;
    int rows = 0, vocab = 0;
    std::vector<int32_t> dev_rows;  // logit row of each device-sampled token
    std::vector<uint8_t> on_device;
  };
  DeviceBuffer sampled_dev_, sampling_args_;  // device-sampled tokens; their jobs
  cuda::PinnedStaging args_staging_;          // jobs, assembled for the upload
  Slot slots_[2];
  int next_ = 0;
};

}  // namespace llm
