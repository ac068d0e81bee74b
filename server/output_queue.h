// The whole result of a request, assembled from its outputs (non-streaming HTTP responses).
// (This file held OutputQueue, the blocking sink of the thread-per-connection HTTP front end;
// the event-driven one renders in its ReplySink, server/openai_server.cc.)
#pragma once

#include <string>
#include <vector>

#include "engine/request.h"

namespace llm {

struct GenerationResult {
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<SampledToken> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;
  Usage usage;
  Status error;
  bool finished = false;

  // Appends one output; sets `finished` on the last one (completion or error).
  void Add(GenerationOutput out);
};

}  // namespace llm
