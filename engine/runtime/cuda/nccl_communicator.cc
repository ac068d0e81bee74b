#include "engine/runtime/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace llm {
namespace {

Status NcclStatus(const char* call, ncclResult_t r) {
  if (r == ncclSuccess) return Status::Ok();
  return Internal(std::string(call) + ": " + ncclGetErrorString(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool capturable() const override { return true; }

  Status AllReduceSum(void* buf, size_t count, DType dtype, void* stream) override {
    LLM_ASSIGN_OR_RETURN(const ncclDataType_t t, NcclType(dtype));
    return NcclStatus("ncclAllReduce", ncclAllReduce(buf, buf, count, t, ncclSum, comm_,
                                                     static_cast<cudaStream_t>(stream)));
  }
  Status AllGather(const void* in, void* out, size_t count, DType dtype, void* stream) override {
    LLM_ASSIGN_OR_RETURN(const ncclDataType_t t, NcclType(dtype));
    return NcclStatus("ncclAllGather",
                      ncclAllGather(in, out, count, t, comm_, static_cast<cudaStream_t>(stream)));
  }

 private:
  static StatusOr<ncclDataType_t> NcclType(DType dtype) {
    switch (dtype) {
      case DType::kF32:
        return ncclFloat32;
      case DType::kBF16:
        return ncclBfloat16;
      default:
        return InvalidArgument(std::string("collectives take float32 or bfloat16 buffers, not ") +
                               DTypeName(dtype));
    }
  }

  ncclComm_t comm_;
  int rank_, size_;
};

}  // namespace

StatusOr<std::unique_ptr<NcclCommunicatorGroup>> NcclCommunicatorGroup::Create(
    const std::vector<int>& devices) {
  if (devices.empty()) return InvalidArgument("an NCCL group needs at least one device");
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(n);
  if (const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data()); r != ncclSuccess) {
    return Unavailable(std::string("ncclCommInitAll over ") + std::to_string(n) +
                       " devices: " + ncclGetErrorString(r));
  }
  std::unique_ptr<NcclCommunicatorGroup> group(new NcclCommunicatorGroup());
  for (int r = 0; r < n; ++r) {
    group->ranks_.push_back(std::make_unique<NcclCommunicator>(comms[r], r, n));
  }
  return group;
}

NcclCommunicatorGroup::~NcclCommunicatorGroup() = default;

}  // namespace llm
