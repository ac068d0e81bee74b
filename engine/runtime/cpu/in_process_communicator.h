// Communicators for N ranks that run in N threads of one process (the CPU tensor-parallel
// decoders and their tests). Each collective publishes the rank's buffer, waits for every rank
// (std::barrier), reads all of them, and waits again before any buffer is reused. The sum is
// taken in rank order, in fp32 (bf16 values widened, the sum rounded once), so every rank gets
// the same bits whatever the threads' timing.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "engine/runtime/communicator.h"

namespace llm {

class InProcessCommunicatorGroup final : public CommunicatorGroup {
 public:
  explicit InProcessCommunicatorGroup(int size);  // size >= 1
  ~InProcessCommunicatorGroup() override;
  int size() const override { return static_cast<int>(ranks_.size()); }
  Communicator* rank(int r) override { return ranks_[r].get(); }

 private:
  friend class InProcessCommunicator;
  std::barrier<> barrier_;
  std::vector<const void*> slots_;  // [size]: each rank's buffer of the collective in progress
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace llm
