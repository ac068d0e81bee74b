// Speculative decoding settings (issue 52): which method drafts tokens, how many a step verifies,
// and the n-gram proposer's suffix lengths. Declared once here; the server's option table binds
// these fields and EngineCore::Create checks them again (tools and tests build configs directly).
#pragma once

#include <string>

#include "base/status.h"

namespace llm {

// The methods a user of vLLM or SGLang would name. "mtp": the checkpoint's own multi-token-
// prediction layer (DeepSeek-V3, num_nextn_predict_layers >= 1), refused by name at
// load where there is none (LoadMtpModel).
inline constexpr const char* kSpeculativeMethodChoices[] = {"none", "ngram", "draft", "mtp"};
// K's range, the multi-token decode kernels' documented range (issue 52).
inline constexpr int kMaxSpeculativeTokens = 4;

struct SpeculativeConfig {
  std::string method = "none";     // one of kSpeculativeMethodChoices
  int num_speculative_tokens = 3;  // K: drafts verified per sequence and step, 1..4
  // n-gram (prompt lookup): the suffix of the context that must recur, in tokens (vLLM's
  // prompt_lookup_min / prompt_lookup_max).
  int ngram_prompt_lookup_min = 1;
  int ngram_prompt_lookup_max = 4;
  // draft: the draft model's Hugging Face directory (vLLM's --speculative-model): a smaller
  // checkpoint with the target's vocabulary and tokenizer, of any architecture the loader runs.
  std::string draft_model_dir;
  // Speculation pauses while more requests than this are running or waiting (vLLM's
  // disable_by_batch_size): a large batch already reads the weights for many tokens per step,
  // so verifying drafts costs more than it saves, and paused requests overlap steps again.
  // 0: never paused.
  int disable_by_batch_size = 32;
  // Each request drafts as many tokens as its own acceptance makes worth verifying, 1..K
  // (engine/speculative/adaptive_draft_length.h); false: always K.
  bool adaptive_draft_length = false;

  bool enabled() const { return method != "none"; }
};

// Query rows per sequence of a verify step: 1 + K with speculation, else 1 (a one-token decode
// step); the target model's ModelLoadOptions::cuda_graph_max_query_rows.
inline int SpeculativeQueryRows(const SpeculativeConfig& config) {
  return config.enabled() ? 1 + config.num_speculative_tokens : 1;
}

// InvalidArgument naming the option: an unknown method, K outside 1..4, n-gram
// lengths outside 1 <= min <= max, a draft method without a draft model directory or a draft
// model directory without the draft method.
Status CheckSpeculativeConfig(const SpeculativeConfig& config);

}  // namespace llm
