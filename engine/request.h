// A generation request as the engine sees it, and the outputs it streams back.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/sampling_params.h"

namespace llm::grammar {
class CompiledGrammar;
}

namespace llm {

// A structured-output constraint (issue 49): the generated text must match it.
struct Constraint {
  // kTaggedJson: JSON Schema values between fixed texts, the forced tool calls of the OpenAI
  // API (grammar::CompileTaggedJsonSchemas).
  enum class Kind { kNone, kJsonSchema, kJsonObject, kRegex, kGrammar, kChoice, kTaggedJson };
  Kind kind = Kind::kNone;
  std::string text;                  // the schema (JSON), the regex, the GBNF grammar or the spec
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
};

// "json_schema", "json_object", "regex", "grammar", "choice", "tagged_json" ("none" for kNone).
const char* ConstraintKindName(Constraint::Kind kind);

struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  StoppingParams stopping;
  bool skip_special_tokens = true;
  int priority = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  std::chrono::steady_clock::time_point arrival_time = std::chrono::steady_clock::now();
  Constraint constraint;
  // Choices: n > 1 runs n child requests ("<id>#<i>"), choice i seeded with sampling.seed + i
  // (vLLM's rule); with prefix caching on, choices 1..n-1 are admitted once choice 0's prefill is
  // in the prefix cache, so they share its full prompt blocks. Their outputs meet in the request's
  // one sink (engine/choice_fan_in.h).
  int n = 1;
  // false: never drafted for, whatever EngineConfig::speculative says (the request opted out).
  bool speculative_decoding = true;
  // Set by EngineCore::Validate from `constraint` (through the engine's grammar cache).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

enum class FinishReason { kNone, kLength, kStop, kAborted };

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

// One streamed update. Exactly one update per request has `finished` set (or a non-OK `error`),
// and it is the last. With n > 1 choices, a choice's last update has its finish_reason set (and
// `finished` only if it is the request's last; its usage then covers every choice).
struct GenerationOutput {
  int index = 0;                   // the choice this update belongs to (n > 1)
  std::vector<int32_t> token_ids;  // tokens generated since the previous update
  std::string text;                // text delta; whole UTF-8 characters only
  std::vector<SampledToken> logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;
  Usage usage;
  Status error;  // non-OK ends the request with this status instead of a completion
};

// Receives a request's outputs. Called on the engine thread; must not block.
class ResultSink {
 public:
  virtual ~ResultSink() = default;
  virtual void OnOutput(GenerationOutput output) = 0;
};

}  // namespace llm
