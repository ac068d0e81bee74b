// The step of the CPU MHA backends (cpu_reference, cpu_c8): Plan keeps the batch, since there is
// nothing to precompute on the CPU and the batch outlives the step; Run reads it back.
#pragma once

#include "base/check.h"
#include "base/status.h"
#include "kernels/attention_backend.h"

namespace llm {

class CpuAttentionBackend : public AttentionBackend {
 public:
  Status Plan(const AttentionBatch& batch) override {
    batch_ = &batch;
    return Status::Ok();
  }

 protected:
  // The planned batch; Run before Plan is a caller's bug.
  const AttentionBatch& batch() const {
    LLM_CHECK(batch_ != nullptr) << name() << ": Run before Plan";
    return *batch_;
  }

 private:
  const AttentionBatch* batch_ = nullptr;
};

}  // namespace llm
