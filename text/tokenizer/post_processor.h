// tokenizer.json "post_processor": TemplateProcessing, ByteLevel (offsets only, so no effect on
// ids) and Sequence, reduced to the ids added before and after a single sequence. Pair templates
// are validated but never used: the server encodes single sequences. RobertaProcessing and
// BertProcessing are refused by name.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace llm::tokenizer_internal {

class PostProcessor {
 public:
  // `j` may be null.
  static StatusOr<PostProcessor> FromJson(const nlohmann::json& j);

  const std::vector<int32_t>& prefix() const { return prefix_; }
  const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  Status Parse(const nlohmann::json& j);
  Status ParseTemplate(const nlohmann::json& j);

  std::vector<int32_t> prefix_;
  std::vector<int32_t> suffix_;
};

}  // namespace llm::tokenizer_internal
