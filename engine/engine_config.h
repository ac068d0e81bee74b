// Engine configuration: model loading, scheduling and request limits.
#pragma once

#include <string>

#include "engine/runtime/model.h"
#include "engine/speculative/speculative_config.h"
#include "scheduler/scheduler.h"

namespace llm {

struct EngineConfig {
  ModelLoadOptions model;
  SchedulerConfig scheduler;    // block_size is taken from model.block_size
  int max_model_len = 0;        // 0: the model's max_position_embeddings (capped by KV capacity)
  int max_tokens_limit = 4096;  // cap on a request's max_tokens
  int default_max_tokens = 256;
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int max_logprobs = 20;
  int max_n = 16;  // most choices (n) per request; each is a sequence of its own
  // Structured outputs: the largest constraint text (schema, regex, grammar, choices together)
  // and how many compiled grammars the engine keeps.
  int max_constraint_bytes = 64 * 1024;
  int grammar_cache_size = 64;
  // Threads (the engine thread included) that fill a step's token masks; 0: half the hardware
  // threads, at most 8.
  int structured_output_threads = 0;
  int max_queued_requests = 1024;  // accepted but not yet running; past it RESOURCE_EXHAUSTED
  bool require_tokenizer = true;   // false: token-id-only use (tests, llm-dump)
  // Overlapped steps (models that support them): step k + 1 is scheduled and queued on the
  // device before step k's tokens are read back, so host work hides behind the GPU. A request
  // that stops on a token the host has not seen yet costs one discarded extra step.
  bool overlap_steps = true;
  // Speculative decoding (engine/speculative/): off unless a method is named.
  SpeculativeConfig speculative;
};

}  // namespace llm
