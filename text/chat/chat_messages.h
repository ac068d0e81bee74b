// OpenAI chat `messages` as clients send them -> the shape chat templates read (vLLM's and
// transformers' conventions): every message's `content` a string, tool-call arguments objects.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace llm {

// How a template expects an assistant turn that carries tool calls. Most templates are written for
// transformers' convention (content a string, arguments objects: kTemplateValues, what vLLM
// passes). A few test for a null content to render the calls and write the arguments as the
// OpenAI strings they are (DeepSeek-V3's: `message['content'] is none`); given "" they would drop
// the calls without an error, so they get the message as the API sends it (kOpenAiNative).
enum class ToolCallMessageShape { kTemplateValues, kOpenAiNative };

// kOpenAiNative for a template that tests a message's `content` for none, else kTemplateValues.
ToolCallMessageShape DetectToolCallMessageShape(const std::string& template_text);

// Normalizes `messages` (a list of objects with a string `role`) in place:
//  - `content` null or absent -> "" (an assistant message that carries only `tool_calls`, as the
//    API returns it); templates test and concatenate content as a string;
//  - `content` a list of parts -> the text of its {"type": "text"} (and "refusal") parts joined
//    with "\n", as vLLM does for string-content templates; parts the server cannot take
//    (image_url, input_audio, file, ...) are an InvalidArgument naming the part type;
//  - assistant `tool_calls[].function.arguments` given as JSON text -> the parsed value ("" or
//    null -> {}), as vLLM passes them (templates write `arguments | tojson`);
//  - every other key (name, tool_calls, tool_call_id, reasoning_content, ...) is kept.
// kOpenAiNative keeps an assistant message's null content beside `tool_calls` null and its
// arguments JSON text (checked; "" or null -> "{}").
// Idempotent. On error *bad_path names the element, e.g. "messages[1].content[0]".
Status NormalizeChatMessages(nlohmann::ordered_json* messages, std::string* bad_path,
                             ToolCallMessageShape shape = ToolCallMessageShape::kTemplateValues);

}  // namespace llm
