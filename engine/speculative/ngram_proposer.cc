#include "engine/speculative/ngram_proposer.h"

#include <algorithm>
#include <string>

namespace llm {

StatusOr<NgramProposer> NgramProposer::Create(const NgramProposerConfig& config) {
  if (config.min_n < 1 || config.max_n < config.min_n) {
    return InvalidArgument("n-gram lengths must satisfy 1 <= min_n <= max_n, got min_n " +
                           std::to_string(config.min_n) + ", max_n " +
                           std::to_string(config.max_n));
  }
  if (config.k < 1) {
    return InvalidArgument("the number of draft tokens must be at least 1, got " +
                           std::to_string(config.k));
  }
  return NgramProposer(config);
}

std::vector<int32_t> NgramProposer::Propose(std::span<const int32_t> context) const {
  const int len = static_cast<int>(context.size());
  // Longest first: the first length with a match wins; within it, the earliest start.
  for (int n = std::min(config_.max_n, len - 1); n >= config_.min_n; --n) {
    const std::span<const int32_t> suffix = context.subspan(len - n);
    // Occurrences start at s with s + n <= len - 1, so at least one token follows them and the
    // suffix does not match itself.
    for (int s = 0; s + n < len; ++s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      const int from = s + n;
      const int count = std::min(config_.k, len - from);
      return std::vector<int32_t>(context.begin() + from, context.begin() + from + count);
    }
  }
  return {};
}

}  // namespace llm
