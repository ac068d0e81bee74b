// The OpenAI wire format: request JSON -> GenerateParams, engine outputs -> response JSON, and
// OpenAI's error shape. No I/O here; OpenAiServer does the HTTP.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/request.h"
#include "server/generate_params.h"
#include "server/openai_tool_calls.h"
#include "text/tokenizer/tokenizer.h"

namespace llm {

enum class OpenAiEndpoint { kCompletions, kChat };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  GenerateParams params;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Chat: messages and tools go to the ChatRenderer; logprobs is a bool with top_logprobs.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  nlohmann::ordered_json chat_template_kwargs;  // null or an object
  std::string reasoning_effort;  // "low" | "medium" | "high"; reaches the template as a kwarg
  bool add_generation_prompt = true;
  // Logprobs the response reports: -1 none, else the number of alternatives per token.
  int logprobs = -1;
  bool chat_logprobs = false;  // as sent, before `logprobs` is resolved
  int top_logprobs = -1;
  // The field that set params.constraint (response_format, structured_outputs, guided_*): a
  // second one is refused naming both.
  std::string constraint_field;
  std::optional<int> best_of;  // completions: accepted only equal to n
};

// An error as OpenAI sends it: {"error": {"message", "type", "param", "code"}}.
struct OpenAiError {
  int http_status = 400;
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null

  static OpenAiError FromStatus(const Status& s, std::string param = "");
  std::string type() const;
  nlohmann::ordered_json ToJson() const;
};

int HttpStatusFor(StatusCode code);

// Fields the server accepts and ignores because they cannot change the output.
const std::vector<std::string>& IgnoredOpenAiFields();

// Parses a /v1/completions or /v1/chat/completions body. Unknown fields, fields that would change
// the output in a way the server does not implement, and bad values are errors naming the field.
// Messages are not rendered here (out->messages).
Status ParseOpenAiRequest(const nlohmann::ordered_json& body, OpenAiEndpoint endpoint,
                          OpenAiRequest* out, std::string* bad_param);

// "stop" | "length" | "abort" (vLLM's spelling for requests aborted by the server).
const char* OpenAiFinishReason(FinishReason r);

nlohmann::ordered_json UsageJson(const Usage& u);

// Logprobs in the endpoint's shape: chat {"content": [...]}; completions {"tokens",
// "token_logprobs", "top_logprobs", "text_offset"}. `text_offset` is where the first token starts
// in the completion text.
nlohmann::ordered_json LogprobsJson(OpenAiEndpoint endpoint,
                                    const std::vector<SampledToken>& tokens, int top_n,
                                    const Tokenizer* tokenizer, int text_offset);

}  // namespace llm
