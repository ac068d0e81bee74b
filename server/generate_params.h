// A generation request in the form both front ends (gRPC and the OpenAI HTTP API) parse into.
// Unset optionals take the engine's documented defaults; ConvertRequest is the one place that
// turns this into an engine request, so both front ends tokenize and default identically.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/engine_core.h"
#include "engine/request.h"
#include "llm/v1/generation.pb.h"
#include "server/openai_tool_calls.h"
#include "server/server_config.h"

namespace llm {

// OpenAI-shaped `messages` (and `tools`), rendered by the ChatRenderer.
struct ChatPromptParams {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null: none
  bool add_generation_prompt = true;
  nlohmann::ordered_json template_kwargs;  // null or an object: extra template variables
  ToolChoice tool_choice;                  // gRPC: how tool calls are parsed or forced
  bool parallel_tool_calls = true;
};

struct GenerateParams {
  std::string request_id;  // empty: the engine assigns one
  // Text (tokenized here), token ids, or a chat rendered into text first; monostate means the
  // client sent none.
  std::variant<std::monostate, std::string, std::vector<int32_t>, ChatPromptParams> prompt;
  // BOS etc. when tokenizing text; chat front ends pass false (the template writes its own).
  bool add_special_tokens = true;

  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<uint64_t> seed;  // unset: random per request
  std::optional<float> repetition_penalty;
  std::optional<float> presence_penalty;
  std::optional<float> frequency_penalty;
  int logprobs = 0;                                   // top-N per generated token
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias), ascending ids
  int n = 1;                                          // choices

  std::optional<int> max_tokens;  // unset: the server's default_max_tokens
  std::optional<int> min_tokens;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::optional<bool> ignore_eos;
  std::optional<bool> skip_special_tokens;
  std::optional<int> priority;
  // false: this request does not speculate even when the server's --speculative-method is on.
  std::optional<bool> speculative_decoding;
  // Structured outputs: none, or the one constraint the request carries (compiled and checked by
  // EngineCore::Validate).
  Constraint constraint;
};

class ChatRenderer;

// GenerateRequest's `constraint` oneof -> out (unset: none).
Status ConstraintFromProto(const v1::GenerateRequest& in, Constraint* out);

// Renders a chat prompt (with `chat`; null: FAILED_PRECONDITION), tokenizes and applies defaults.
// Range checks happen in EngineCore::Validate (Engine::Submit). `rendered_chat` (optional)
// receives a chat prompt's rendered text.
Status ConvertRequest(const GenerateParams& in, const EngineCore& core, const ServerConfig& config,
                      const ChatRenderer* chat, GenerationRequest* out,
                      std::string* rendered_chat = nullptr);

}  // namespace llm
