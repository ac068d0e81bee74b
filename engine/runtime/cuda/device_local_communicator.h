// Communicators for N tensor-parallel ranks whose streams are all on ONE device (one process, one
// thread per rank): what lets the sharded CUDA model be tested on a single GPU, where NCCL refuses
// two ranks of one device. Not a serving path: the ranks share the device's compute, so N ranks
// are slower than one.
//
// A collective copies the rank's buffer into its slot of a staging area shared by the group
// (device memory), records an event, meets the other ranks at a host barrier, makes its stream
// wait for every rank's copy, then reads every slot: the all-reduce sums them in rank order in
// fp32 (kernels/cuda/ops/rank_sum.h: every rank gets the same bits), the all-gather copies them in
// rank order. A second barrier after the reads lets each rank's next copy wait (by event) until
// every rank has read its slot.
//
// Eager steps only (capturable() is false): the ordering rests on host barriers and on events
// recorded by the other ranks' threads, and a CUDA graph capture cannot wait on work another
// thread captures. Tensor parallelism inside captured graphs needs NCCL
// (nccl_communicator.h), whose collectives are kernels on the rank's own stream.
//
// Every rank's calls must come from a thread whose current device is the group's device.
#pragma once

#include <barrier>
#include <memory>
#include <vector>

#include "engine/runtime/communicator.h"

namespace llm {

class DeviceLocalCommunicatorGroup final : public CommunicatorGroup {
 public:
  // `size` ranks (1..8) on `device`; creates the events there (the calling thread's current
  // device is restored).
  static StatusOr<std::unique_ptr<DeviceLocalCommunicatorGroup>> Create(int size, int device);
  ~DeviceLocalCommunicatorGroup() override;
  DeviceLocalCommunicatorGroup(const DeviceLocalCommunicatorGroup&) = delete;
  DeviceLocalCommunicatorGroup& operator=(const DeviceLocalCommunicatorGroup&) = delete;

  int size() const override { return static_cast<int>(ranks_.size()); }
  Communicator* rank(int r) override { return ranks_[r].get(); }
  int device() const { return device_; }

 private:
  friend class DeviceLocalCommunicator;
  explicit DeviceLocalCommunicatorGroup(int size, int device);

  int device_;
  std::barrier<> barrier_;
  // Per rank: its staging slot (device memory, grown by its own rank between collectives), the
  // event after its copy into the slot, and the event after its reads of every slot.
  std::vector<void*> slots_;
  std::vector<size_t> slot_bytes_;
  std::vector<void*> copied_, read_;  // cudaEvent_t
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace llm
