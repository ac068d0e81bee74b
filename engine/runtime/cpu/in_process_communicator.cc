#include "engine/runtime/cpu/in_process_communicator.h"

#include <cstdint>
#include <cstring>

namespace llm {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessCommunicatorGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  bool capturable() const override { return false; }  // host buffers, host barriers

  Status AllReduceSum(void* buf, size_t count, DType dtype, void* stream) override {
    LLM_RETURN_IF_ERROR(Check(dtype, stream));
    Publish(buf);
    sum_.assign(count, 0.0f);
    for (const void* slot : group_->slots_) {  // rank order
      if (dtype == DType::kF32) {
        const float* x = static_cast<const float*>(slot);
        for (size_t i = 0; i < count; ++i) sum_[i] += x[i];
      } else {
        const uint16_t* x = static_cast<const uint16_t*>(slot);
        for (size_t i = 0; i < count; ++i) sum_[i] += Bf16ToF32(x[i]);
      }
    }
    group_->barrier_.arrive_and_wait();  // every rank has read every buffer
    if (dtype == DType::kF32) {
      if (count > 0) std::memcpy(buf, sum_.data(), count * sizeof(float));  // buf may be null
    } else {
      uint16_t* out = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < count; ++i) out[i] = F32ToBf16(sum_[i]);
    }
    return Status::Ok();
  }

  Status AllGather(const void* in, void* out, size_t count, DType dtype, void* stream) override {
    LLM_RETURN_IF_ERROR(Check(dtype, stream));
    Publish(in);
    const size_t bytes = count * DTypeSize(dtype);
    for (int r = 0; r < size() && bytes > 0; ++r) {  // an empty buffer may be null
      std::memcpy(static_cast<std::byte*>(out) + r * bytes, group_->slots_[r], bytes);
    }
    group_->barrier_.arrive_and_wait();
    return Status::Ok();
  }

 private:
  Status Check(DType dtype, void* stream) const {
    if (dtype != DType::kF32 && dtype != DType::kBF16) {
      return InvalidArgument(std::string("collectives take float32 or bfloat16 buffers, not ") +
                             DTypeName(dtype));
    }
    if (stream != nullptr) return InvalidArgument("the in-process communicator takes no stream");
    return Status::Ok();
  }
  // Publishes this rank's buffer and waits until every rank has published its own. A rank
  // publishes only after the previous collective's last barrier, when nobody reads the slots.
  void Publish(const void* buf) {
    group_->slots_[rank_] = buf;
    group_->barrier_.arrive_and_wait();
  }

  InProcessCommunicatorGroup* group_;
  int rank_;
  std::vector<float> sum_;
};

InProcessCommunicatorGroup::InProcessCommunicatorGroup(int size)
    : barrier_(size), slots_(size, nullptr) {
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<InProcessCommunicator>(this, r));
}

InProcessCommunicatorGroup::~InProcessCommunicatorGroup() = default;

}  // namespace llm
