#include "server/output_queue.h"

namespace llm {

void GenerationResult::Add(GenerationOutput out) {
  token_ids.insert(token_ids.end(), out.token_ids.begin(), out.token_ids.end());
  text += out.text;
  logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  if (!out.error.ok()) {
    error = out.error;
    finished = true;
  } else {
    // A choice of an n > 1 request ends with its finish_reason before the request finishes.
    if (out.finish_reason != FinishReason::kNone) {
      finish_reason = out.finish_reason;
      matched_stop = out.matched_stop;
    }
    if (out.finished) {
      usage = out.usage;
      finished = true;
    }
  }
}

}  // namespace llm
