#include "kernels/cuda/common/plan_area.h"

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {

PlanArea::~PlanArea() {
  if (d_ints_) cudaFree(d_ints_);
}

Status PlanArea::Grow(size_t bytes) {
  return GrowDeviceBuffer(&d_ints_, &cap_, bytes);
}

StatusOr<int32_t*> PlanArea::Stage(size_t bytes) {
  LLM_ASSIGN_OR_RETURN(staged_, staging_.Acquire(bytes));
  return static_cast<int32_t*>(staged_);
}

Status PlanArea::Send(size_t bytes, void* stream) {
  if (bytes == 0) return Status::Ok();
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(d_ints_, staged_, bytes, cudaMemcpyHostToDevice,
                                      static_cast<cudaStream_t>(stream)));
  return staging_.Queued(stream);
}

Status GraphCapacity::CheckReserve(int seqs, int pages, int q, const PlanArea& area,
                                   std::string_view name, bool* covered) const {
  *covered = seqs <= max_seqs && pages <= max_pages && q <= max_q;
  if (*covered || area.device() == nullptr) return Status::Ok();
  return FailedPrecondition("the " + std::string(name) +
                            " graph area is reserved once: captured graphs point into it");
}

Status GraphCapacity::CheckStep(const AttentionBatch& batch, GraphShape shape,
                                std::string_view name) const {
  const std::string who(name);
  if (max_seqs == 0) return FailedPrecondition(who + " UploadGraph before ReserveGraph");
  const int n = batch.num_seqs;
  if (n > shape.seqs || shape.seqs > max_seqs || shape.q < 1 || shape.q > max_q ||
      !UniformQueryRows(batch, shape.q)) {
    return InvalidArgument(who + " graph upload: " + std::to_string(n) + " sequences, " +
                           std::to_string(batch.num_tokens) + " tokens, shape " +
                           std::to_string(shape.seqs) + " x " + std::to_string(shape.q) +
                           " rows, capacity " + std::to_string(max_seqs) + " x " +
                           std::to_string(max_q));
  }
  if (static_cast<int>(batch.page_indices.size()) > max_pages) {
    return InvalidArgument(who + " graph upload: " + std::to_string(batch.page_indices.size()) +
                           " block-table entries, capacity " + std::to_string(max_pages));
  }
  return Status::Ok();
}

}  // namespace llm::cuda
