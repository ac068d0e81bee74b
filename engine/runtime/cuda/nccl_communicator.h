// The Communicator of GPU tensor-parallel ranks: NCCL's all-reduce and all-gather enqueued on the
// caller's stream, so that a rank's CUDA graph captures them with its kernels. One process drives
// every GPU, one thread per GPU (docs/ARCHITECTURE.md, "Tensor parallelism"), so the group is
// created with ncclCommInitAll and no id is exchanged. NCCL sums in its own order (ring or tree,
// chosen per size), not in rank order: every rank gets the same bits, but not those of the CPU
// communicator.
//
// A rank's calls must come from a thread whose current device is the rank's (cudaSetDevice), with
// device buffers and a stream of that device; nullptr is the legacy default stream.
#pragma once

#include <memory>
#include <vector>

#include "engine/runtime/communicator.h"

namespace llm {

class NcclCommunicatorGroup final : public CommunicatorGroup {
 public:
  // Rank r on device devices[r]; Unavailable naming NCCL's error when it cannot initialize
  // (one device listed twice, a device that does not exist, no peer access it can use).
  static StatusOr<std::unique_ptr<NcclCommunicatorGroup>> Create(const std::vector<int>& devices);
  ~NcclCommunicatorGroup() override;
  NcclCommunicatorGroup(const NcclCommunicatorGroup&) = delete;
  NcclCommunicatorGroup& operator=(const NcclCommunicatorGroup&) = delete;

  int size() const override { return static_cast<int>(ranks_.size()); }
  // Rank r's communicator, for the thread that drives devices[r].
  Communicator* rank(int r) override { return ranks_[r].get(); }

 private:
  NcclCommunicatorGroup() = default;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace llm
