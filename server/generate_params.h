// A generation request in the form both front ends (gRPC and the OpenAI HTTP API) parse into.
// Unset optionals take the engine's documented defaults; ConvertRequest is the one place that
// turns this into an engine request, so both front ends tokenize and default identically.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/base/status.h"
#include "engine/engine_core.h"
#include "engine/request.h"
#include "server/server_config.h"

namespace llm {

struct GenerateParams {
  std::string request_id;  // empty: the engine assigns one
  // Text (tokenized here) or token ids; monostate means the client sent neither.
  std::variant<std::monostate, std::string, std::vector<int32_t>> prompt;
  bool add_special_tokens = true;  // text prompts: BOS etc.; rendered chat prompts carry their own

  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<uint64_t> seed;  // unset: random per request
  std::optional<float> repetition_penalty;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  int logprobs = 0;  // top-N per generated token

  std::optional<int> max_tokens;  // unset: the server's default_max_tokens
  std::optional<int> min_tokens;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::optional<bool> ignore_eos;
  std::optional<bool> skip_special_tokens;
  std::optional<int> priority;
};

// Tokenizes and applies defaults. Range checks happen in EngineCore::Validate (Engine::Submit).
Status ConvertRequest(const GenerateParams& in, const EngineCore& core, const ServerConfig& config,
                      GenerationRequest* out);

}  // namespace llm
