#include "engine/runtime/cuda/device_local_communicator.h"

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/rank_sum.h"

namespace llm {

class DeviceLocalCommunicator final : public Communicator {
 public:
  DeviceLocalCommunicator(DeviceLocalCommunicatorGroup* group, int rank)
      : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  // Host barriers and other threads' events order the streams: no capture (file comment).
  bool capturable() const override { return false; }

  Status AllReduceSum(void* buf, size_t count, DType dtype, void* stream) override {
    LLM_ASSIGN_OR_RETURN(const size_t bytes, Bytes(count, dtype));
    auto s = static_cast<cudaStream_t>(stream);
    LLM_RETURN_IF_ERROR(Publish(buf, bytes, s));
    std::vector<const void*> slots(group_->slots_.begin(), group_->slots_.end());
    cuda::LaunchSumRankSlots(slots.data(), size(), buf, count, dtype == DType::kBF16, s);
    GPU_RETURN_IF_ERROR(cudaGetLastError());
    return Finish(s);
  }

  Status AllGather(const void* in, void* out, size_t count, DType dtype, void* stream) override {
    LLM_ASSIGN_OR_RETURN(const size_t bytes, Bytes(count, dtype));
    auto s = static_cast<cudaStream_t>(stream);
    LLM_RETURN_IF_ERROR(Publish(in, bytes, s));
    for (int r = 0; r < size(); ++r) {
      GPU_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(out) + r * bytes, group_->slots_[r],
                                          bytes, cudaMemcpyDeviceToDevice, s));
    }
    return Finish(s);
  }

 private:
  static StatusOr<size_t> Bytes(size_t count, DType dtype) {
    if (dtype != DType::kF32 && dtype != DType::kBF16) {
      return InvalidArgument(std::string("collectives take float32 or bfloat16 buffers, not ") +
                             DTypeName(dtype));
    }
    return count * (dtype == DType::kF32 ? 4 : 2);
  }
  static cudaEvent_t Event(void* e) { return static_cast<cudaEvent_t>(e); }

  // Copies buf into this rank's slot once every rank has read it (the previous collective), and
  // returns when every rank has done the same; the stream then waits for every rank's copy.
  Status Publish(const void* buf, size_t bytes, cudaStream_t s) {
    auto& g = *group_;
    const int n = size();
    for (int r = 0; r < n; ++r) GPU_RETURN_IF_ERROR(cudaStreamWaitEvent(s, Event(g.read_[r]), 0));
    if (g.slot_bytes_[rank_] < bytes) {
      // Every rank's reads of the old slot are done once this stream, which waits for them, is.
      GPU_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      if (g.slots_[rank_] != nullptr) GPU_RETURN_IF_ERROR(cudaFree(g.slots_[rank_]));
      g.slots_[rank_] = nullptr;
      g.slot_bytes_[rank_] = 0;
      LLM_RETURN_IF_ERROR(cuda::DeviceMalloc(&g.slots_[rank_], bytes));
      g.slot_bytes_[rank_] = bytes;
    }
    GPU_RETURN_IF_ERROR(cudaMemcpyAsync(g.slots_[rank_], buf, bytes, cudaMemcpyDeviceToDevice, s));
    GPU_RETURN_IF_ERROR(cudaEventRecord(Event(g.copied_[rank_]), s));
    g.barrier_.arrive_and_wait();  // every copy recorded, every slot pointer set
    for (int r = 0; r < n; ++r) {
      GPU_RETURN_IF_ERROR(cudaStreamWaitEvent(s, Event(g.copied_[r]), 0));
    }
    return Status::Ok();
  }

  // After this rank's reads of every slot: records them and waits until every rank has, so that
  // no rank records its next copy before another has waited for this one.
  Status Finish(cudaStream_t s) {
    GPU_RETURN_IF_ERROR(cudaEventRecord(Event(group_->read_[rank_]), s));
    group_->barrier_.arrive_and_wait();
    return Status::Ok();
  }

  DeviceLocalCommunicatorGroup* group_;
  int rank_;
};

DeviceLocalCommunicatorGroup::DeviceLocalCommunicatorGroup(int size, int device)
    : device_(device),
      barrier_(size),
      slots_(size, nullptr),
      slot_bytes_(size, 0),
      copied_(size, nullptr),
      read_(size, nullptr) {}

StatusOr<std::unique_ptr<DeviceLocalCommunicatorGroup>> DeviceLocalCommunicatorGroup::Create(
    int size, int device) {
  if (size < 1 || size > cuda::kMaxRankSlots) {
    return InvalidArgument("a device-local group has 1 to " + std::to_string(cuda::kMaxRankSlots) +
                           " ranks, not " + std::to_string(size));
  }
  int previous = 0;
  GPU_RETURN_IF_ERROR(cudaGetDevice(&previous));
  GPU_RETURN_IF_ERROR(cudaSetDevice(device));
  std::unique_ptr<DeviceLocalCommunicatorGroup> g(new DeviceLocalCommunicatorGroup(size, device));
  for (int r = 0; r < size; ++r) {
    for (void** e : {&g->copied_[r], &g->read_[r]}) {
      cudaEvent_t ev = nullptr;
      GPU_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      *e = ev;
    }
    g->ranks_.push_back(std::make_unique<DeviceLocalCommunicator>(g.get(), r));
  }
  GPU_RETURN_IF_ERROR(cudaSetDevice(previous));
  return g;
}

DeviceLocalCommunicatorGroup::~DeviceLocalCommunicatorGroup() {
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device_);
  for (void* e : copied_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  for (void* e : read_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  for (void* p : slots_) {
    if (p != nullptr) cudaFree(p);
  }
  (void)cudaSetDevice(previous);
}

}  // namespace llm
