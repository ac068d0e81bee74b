#include "engine/speculative/speculative_config.h"

namespace llm {

Status CheckSpeculativeConfig(const SpeculativeConfig& c) {
  if (c.method != "none" && c.method != "ngram" && c.method != "draft" && c.method != "mtp") {
    return InvalidArgument("--speculative-method must be one of none, ngram, draft, mtp, got '" +
                           c.method + "'");
  }
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > kMaxSpeculativeTokens) {
    return InvalidArgument("--num-speculative-tokens is " +
                           std::to_string(c.num_speculative_tokens) + "; must be in [1, " +
                           std::to_string(kMaxSpeculativeTokens) + "]");
  }
  if (c.ngram_prompt_lookup_min < 1 || c.ngram_prompt_lookup_max < c.ngram_prompt_lookup_min) {
    return InvalidArgument(
        "--ngram-prompt-lookup-min (" + std::to_string(c.ngram_prompt_lookup_min) +
        ") and --ngram-prompt-lookup-max (" + std::to_string(c.ngram_prompt_lookup_max) +
        ") must satisfy 1 <= min <= max");
  }
  if (c.method == "draft" && c.draft_model_dir.empty()) {
    return InvalidArgument(
        "--speculative-method draft needs the draft model's directory (--speculative-model DIR)");
  }
  if (c.method != "draft" && !c.draft_model_dir.empty()) {
    return InvalidArgument(
        "--speculative-model is read only by --speculative-method draft (the "
        "method is " +
        c.method + ")");
  }
  if (c.disable_by_batch_size < 0) {
    return InvalidArgument("--speculative-disable-by-batch-size must be >= 0 (0: never paused)");
  }
  return Status::Ok();
}

}  // namespace llm
