// The device area a CUDA attention backend uploads its per-step plan to (int32 arrays: block
// table, slot mapping, work and merge items), with the pinned staging the uploads go through,
// and the graph form's reservation: captured graphs hold the area's pointer, so a graph area is
// reserved once for its largest step and never moved. C8Attention and MlaDecode each keep one
// area for eager steps and one for graph steps. Plain C++ header: `stream` is a cudaStream_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/common/pinned_staging.h"

namespace llm::cuda {

// Offsets, in int32 elements, of an upload's parts; every part starts 16-byte aligned.
class IntLayout {
 public:
  // Room for n values; returns where they start.
  size_t Take(size_t n) {
    const size_t o = ints_;
    ints_ += (n + 3) / 4 * 4;
    return o;
  }
  size_t bytes() const { return ints_ * 4; }

 private:
  size_t ints_ = 0;
};

class PlanArea {
 public:
  PlanArea() = default;
  PlanArea(const PlanArea&) = delete;
  PlanArea& operator=(const PlanArea&) = delete;
  ~PlanArea();

  // The device ints the kernels read; null until the first Grow.
  const int32_t* device() const { return static_cast<const int32_t*>(d_ints_); }
  // Grows the device ints to at least `bytes`, contents not kept. An eager area grows as steps
  // need; a graph area grows once, in its reservation (GraphCapacity::CheckReserve).
  Status Grow(size_t bytes);
  // A pinned host buffer of at least `bytes` that no queued copy still reads: fill it, then Send.
  StatusOr<int32_t*> Stage(size_t bytes);
  // Queues the copy of the staged buffer's first `bytes` to the device ints.
  Status Send(size_t bytes, void* stream);

 private:
  void* d_ints_ = nullptr;
  size_t cap_ = 0;
  PinnedStaging staging_;
  void* staged_ = nullptr;  // the buffer the last Stage returned
};

// A graph area's capacity: sequences per step, query rows per sequence and block-table entries,
// fixed by its one reservation. `name` ("C8", "MLA") starts the error messages.
struct GraphCapacity {
  int max_seqs = 0, max_pages = 0, max_q = 0;

  // Before reserving `area` for (seqs, pages, q): *covered when the present reservation already
  // holds them; FailedPrecondition when a smaller one was made (captured graphs point into it).
  Status CheckReserve(int seqs, int pages, int q, const PlanArea& area, std::string_view name,
                      bool* covered) const;
  // A graph step of batch.num_seqs sequences of shape.q query rows each, padded to shape.seqs:
  // refused before the reservation, or when it is not of that shape or exceeds the reservation
  // or its block table.
  Status CheckStep(const AttentionBatch& batch, GraphShape shape, std::string_view name) const;
};

}  // namespace llm::cuda
