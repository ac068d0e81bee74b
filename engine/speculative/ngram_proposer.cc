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

std::vector<int32_t> NgramProposer::Propose(std::span<const int32_t> context,
                                            int max_tokens) const {
  const int len = static_cast<int>(context.size());
  if (max_tokens < 1) return {};
  const int max_n = std::min(config_.max_n, len - 1);
  if (max_n < config_.min_n) return {};
  // One pass over the ends e of earlier occurrences (the token after one is context[e], so
  // e <= len - 1): how many of the tokens before e equal the context's last ones, up to max_n.
  // The earliest end that reaches a length gives that length's earliest start (e - n), and the
  // longest length reached wins, as in the rule above. Most ends differ at their first token, so
  // a step costs about one comparison per context token rather than one per token and length.
  const int32_t* c = context.data();
  const int32_t last = c[len - 1];
  int best_n = 0, from = 0;
  for (int e = config_.min_n; e < len; ++e) {
    if (c[e - 1] != last) continue;
    const int most = std::min(max_n, e);
    int n = 1;
    while (n < most && c[e - 1 - n] == c[len - 1 - n]) ++n;
    if (n > best_n) {
      best_n = n;
      from = e;
      if (n == max_n) break;  // no later end can do better or start earlier
    }
  }
  if (best_n < config_.min_n) return {};
  const int count = std::min(max_tokens, len - from);
  return std::vector<int32_t>(context.begin() + from, context.begin() + from + count);
}

}  // namespace llm
