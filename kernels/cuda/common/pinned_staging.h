// Host staging for the per-step plan uploads of the CUDA attention backends: two pinned buffers
// used in turn, each reused only once the copy that last read it has finished (one event per
// buffer). Waiting for the whole stream instead, as a single buffer needs, would make planning
// step k + 1 wait for step k's kernels, and the engine overlaps the two. Plain C++ header:
// `stream` is a cudaStream_t.
#pragma once

#include <cstddef>

#include "base/status.h"

namespace llm::cuda {

class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging();

  // The next buffer, at least `bytes` long, once no queued copy reads it any more.
  StatusOr<void*> Acquire(size_t bytes);
  // Marks the buffer Acquire returned as read by the copy just queued on `stream`.
  Status Queued(void* stream);

 private:
  void* buf_[2] = {nullptr, nullptr};
  size_t cap_[2] = {0, 0};
  void* event_[2] = {nullptr, nullptr};  // cudaEvent_t, recorded after the buffer's last copy
  int cur_ = 1;
};

}  // namespace llm::cuda
