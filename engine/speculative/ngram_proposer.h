// Prompt-lookup drafting for speculative decoding (vLLM's "ngram" method): the draft for a
// sequence is what followed the longest earlier occurrence of its last n tokens in its own
// context (prompt and output), n in [min_n, max_n]. No model runs; it pays off where outputs
// copy their inputs (code edits, extraction, templated text).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace llm {

struct NgramProposerConfig {
  int min_n = 1;  // shortest suffix that may match
  int max_n = 4;  // longest suffix tried
  int k = 4;      // draft tokens proposed at most
};

class NgramProposer {
 public:
  // InvalidArgument unless 1 <= min_n <= max_n and k >= 1.
  static StatusOr<NgramProposer> Create(const NgramProposerConfig& config);

  // The draft after `context`: the up to k tokens that followed the earlier occurrence of the
  // longest matching suffix (the earliest occurrence among equally long ones, as vLLM picks);
  // fewer where the context ends first; empty when no suffix of min_n tokens or more recurs.
  // One scan of the context: O(len) comparisons where most positions differ from the last token.
  std::vector<int32_t> Propose(std::span<const int32_t> context) const {
    return Propose(context, config_.k);
  }
  // The same with up to max_tokens tokens instead of k (a late proposal asks for one more: its
  // first token stands for the token still on the device).
  std::vector<int32_t> Propose(std::span<const int32_t> context, int max_tokens) const;

  const NgramProposerConfig& config() const { return config_; }

 private:
  explicit NgramProposer(const NgramProposerConfig& config) : config_(config) {}
  NgramProposerConfig config_;
};

}  // namespace llm
