#include "kernels/cuda/common/pinned_staging.h"

#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {

PinnedStaging::~PinnedStaging() {
  for (int i = 0; i < 2; ++i) {
    if (event_[i]) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(event_[i]));
      cudaEventDestroy(static_cast<cudaEvent_t>(event_[i]));
    }
    if (buf_[i]) cudaFreeHost(buf_[i]);
  }
}

StatusOr<void*> PinnedStaging::Acquire(size_t bytes) {
  cur_ ^= 1;
  const int i = cur_;
  if (event_[i] == nullptr) {
    cudaEvent_t e = nullptr;
    GPU_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_[i] = e;
  } else {
    // Normally long done: the copy belongs to the step before the previous one.
    GPU_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event_[i])));
  }
  LLM_RETURN_IF_ERROR(GrowPinnedBuffer(&buf_[i], &cap_[i], std::max<size_t>(bytes, 64)));
  return buf_[i];
}

Status PinnedStaging::Queued(void* stream) {
  GPU_RETURN_IF_ERROR(
      cudaEventRecord(static_cast<cudaEvent_t>(event_[cur_]), static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

}  // namespace llm::cuda
