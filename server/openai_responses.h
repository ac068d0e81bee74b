// OpenAI's Responses API (POST /v1/responses), stateless: a request is translated into the
// chat-completions body it means (served by the chat path), and the chat result (content,
// reasoning, tool calls) is written back as a `response` object or as Responses stream events.
// Fields that need stored state (previous_response_id, store: true, background, conversation)
// are refused by name.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/request.h"
#include "text/tool_calls/chat_output_parser.h"

namespace llm {

// A Responses body -> the /v1/chat/completions body it means (`chat`), and the request fields
// the response object repeats (`echo`: instructions, max_output_tokens, tools, ...). Errors name
// the field in *bad_param.
Status ResponsesToChatBody(const nlohmann::ordered_json& body, nlohmann::ordered_json* chat,
                           nlohmann::ordered_json* echo, std::string* bad_param);

// The Responses field a chat field's error is about (max_tokens -> max_output_tokens, ...).
std::string ResponsesParamFor(const std::string& chat_param);

// Writes one response: whole, or as a stream of SSE events with sequence numbers.
class ResponsesWriter {
 public:
  ResponsesWriter(std::string id, int64_t created_at, std::string model,
                  nlohmann::ordered_json echo);

  // The whole `response` object.
  nlohmann::ordered_json Whole(const ParsedMessage& m, FinishReason finish,
                               const Usage& usage) const;

  // Streams: response.created and response.in_progress.
  std::string Begin();
  // The events for one parsed piece of output.
  std::string Delta(const ParsedDelta& d);
  // Closes the open item, then response.completed (or .incomplete).
  std::string Finish(FinishReason finish, const Usage& usage);
  // response.failed.
  std::string Failed(const Status& error);

 private:
  enum class Item { kNone, kReasoning, kMessage, kFunctionCall };
  nlohmann::ordered_json Response(const char* status, nlohmann::ordered_json output,
                                  FinishReason finish, const Usage* usage) const;
  std::string Event(const char* type, nlohmann::ordered_json fields);
  std::string Open(Item kind, const ToolCallDelta* call);
  std::string Close(const char* status = "completed");
  std::string Text(Item kind, const std::string& text);

  std::string id_;
  int64_t created_at_;
  std::string model_;
  nlohmann::ordered_json echo_;
  int sequence_ = 0;
  // The stream's items so far, and the open one (the last of `output_`).
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Item open_ = Item::kNone;
  int open_call_ = -1;     // the open function call's index in the parser's numbering
  std::string open_text_;  // the open item's text or arguments so far
  std::string blank_;      // whitespace content held back: it may only separate tool calls
};

}  // namespace llm
