// An attention backend that only carries a name and a block size, for the registry and selection
// tests (it plans and attends nothing).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "kernels/attention_backend.h"

namespace llm::test {

class StandInBackend : public AttentionBackend {
 public:
  explicit StandInBackend(std::string name, size_t block_bytes = 1)
      : name_(std::move(name)), block_bytes_(block_bytes) {}
  std::string name() const override { return name_; }
  size_t BlockBytes() const override { return block_bytes_; }
  Status Plan(const AttentionBatch&) override { return Status::Ok(); }
  Status Run(const AttentionParams&) override { return Status::Ok(); }

 private:
  std::string name_;
  size_t block_bytes_;
};

}  // namespace llm::test
