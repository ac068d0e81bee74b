// The Responses API (server/openai_responses.h): a Responses body translated into the chat body
// it means (and accepted by the chat parser), refusals by name, and the chat result written as a
// `response` object and as stream events.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"
#include "server/openai_responses.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

json Translate(const json& body, std::string* bad = nullptr) {
  json chat, echo;
  std::string param;
  const Status s = ResponsesToChatBody(body, &chat, &echo, &param);
  if (bad != nullptr) *bad = s.ok() ? "" : param;
  return s.ok() ? chat : json();
}

// The events of an SSE text: each "event: T\ndata: J" checked to name its own type.
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    const std::string frame = sse.substr(pos, end - pos);
    const size_t nl = frame.find('\n');
    REQUIRE(frame.rfind("event: ", 0) == 0);
    REQUIRE(frame.substr(nl + 1, 6) == "data: ");
    json e = json::parse(frame.substr(nl + 7));
    CHECK(e["type"] == frame.substr(7, nl - 7));
    out.push_back(std::move(e));
    pos = end + 2;
  }
  return out;
}

TEST_CASE("a string input with instructions becomes system and user messages", "[responses]") {
  const json chat = Translate({{"model", "m"},
                               {"input", "Hi"},
                               {"instructions", "Be brief"},
                               {"max_output_tokens", 7},
                               {"temperature", 0.5},
                               {"store", false},
                               {"user", "u"}});
  REQUIRE(chat.is_object());
  CHECK(chat["messages"] == json::parse(R"([{"role": "system", "content": "Be brief"},
                                            {"role": "user", "content": "Hi"}])"));
  CHECK(chat["max_tokens"] == 7);
  CHECK(chat["temperature"] == 0.5);
  CHECK(chat["model"] == "m");
  CHECK_FALSE(chat.contains("store"));
  CHECK_FALSE(chat.contains("user"));
  OpenAiRequest r;
  std::string bad;
  REQUIRE(ParseOpenAiRequest(chat, OpenAiEndpoint::kChat, &r, &bad).ok());
  CHECK(*r.params.max_tokens == 7);
}

TEST_CASE("input items become chat messages with tool calls and tool results", "[responses]") {
  const json input = json::parse(R"([
    {"role": "developer", "content": "Use tools"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                    {"type": "input_text", "text": "in Oslo?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "Call it."}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
    {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "rain"},
    {"type": "function_call_output", "call_id": "c2", "output": "noon"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]}
  ])");
  const json chat = Translate({{"input", input}});
  REQUIRE(chat.is_object());
  const json& m = chat["messages"];
  REQUIRE(m.size() == 6);
  CHECK(m[0] == json{{"role", "system"}, {"content", "Use tools"}});
  CHECK(m[1] == json{{"role", "user"}, {"content", "Weather in Oslo?"}});
  // Calls in a row are one assistant turn, carrying the reasoning that came before them.
  CHECK(m[2]["role"] == "assistant");
  CHECK(m[2]["content"].is_null());
  CHECK(m[2]["reasoning_content"] == "Call it.");
  REQUIRE(m[2]["tool_calls"].size() == 2);
  CHECK(m[2]["tool_calls"][0] == json::parse(R"({"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}})"));
  CHECK(m[2]["tool_calls"][1]["function"]["name"] == "get_time");
  CHECK(m[3] == json{{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "rain"}});
  CHECK(m[4]["tool_call_id"] == "c2");
  CHECK(m[5] == json{{"role", "assistant"}, {"content", "Rain."}});
  OpenAiRequest r;
  std::string bad;
  CHECK(ParseOpenAiRequest(chat, OpenAiEndpoint::kChat, &r, &bad).ok());
}

TEST_CASE("tools, tool_choice and text.format map to their chat forms", "[responses]") {
  const json body = json::parse(R"({
    "input": "x",
    "tools": [{"type": "function", "name": "f", "description": "d", "strict": true,
               "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}],
    "tool_choice": {"type": "function", "name": "f"},
    "parallel_tool_calls": false,
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "json_schema", "name": "out", "strict": true,
                        "schema": {"type": "object"}}}
  })");
  json chat, echo;
  std::string bad;
  REQUIRE(ResponsesToChatBody(body, &chat, &echo, &bad).ok());
  CHECK(chat["tools"] == json::parse(R"([{"type": "function", "function": {"name": "f",
      "description": "d", "strict": true,
      "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}])"));
  CHECK(chat["tool_choice"] == json::parse(R"({"type": "function", "function": {"name": "f"}})"));
  CHECK(chat["parallel_tool_calls"] == false);
  CHECK(chat["reasoning_effort"] == "low");
  CHECK(chat["response_format"] == json::parse(R"({"type": "json_schema", "json_schema":
      {"name": "out", "strict": true, "schema": {"type": "object"}}})"));
  // The response repeats the request's fields in their Responses shapes.
  CHECK(echo["tools"] == body["tools"]);
  CHECK(echo["tool_choice"] == body["tool_choice"]);
  CHECK(echo["text"] == body["text"]);
  CHECK(echo["parallel_tool_calls"] == false);
  CHECK(echo["reasoning"] == json{{"effort", "low"}, {"summary", nullptr}});
  CHECK(echo["truncation"] == "disabled");
  OpenAiRequest r;
  REQUIRE(ParseOpenAiRequest(chat, OpenAiEndpoint::kChat, &r, &bad).ok());
  CHECK(r.params.constraint.kind == Constraint::Kind::kJsonSchema);
  CHECK(json::parse(r.params.constraint.text) == json{{"type", "object"}});
  CHECK(r.tool_choice.mode == ToolChoice::Mode::kFunction);
  CHECK(r.tool_choice.function == "f");
}

TEST_CASE("fields needing stored state or unsupported features are refused by name",
          "[responses]") {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"input", "x"}, {"previous_response_id", "resp_1"}}, "previous_response_id"},
      {{{"input", "x"}, {"store", true}}, "store"},
      {{{"input", "x"}, {"background", true}}, "background"},
      {{{"input", "x"}, {"conversation", "conv_1"}}, "conversation"},
      {{{"input", "x"}, {"include", {"reasoning.encrypted_content"}}}, "include"},
      {{{"input", "x"}, {"truncation", "auto"}}, "truncation"},
      {{{"input", "x"}, {"top_logprobs", 2}}, "top_logprobs"},
      {{{"input", "x"}, {"prompt", {{"id", "p"}}}}, "prompt"},
      {{{"input", "x"}, {"tools", json::parse(R"([{"type": "web_search"}])")}}, "tools"},
      {{{"input", "x"}, {"tool_choice", {{"type", "file_search"}}}}, "tool_choice"},
      {{{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}}}, {"verbosity", "low"}}}},
       "text"},
      {{{"input", "x"}, {"reasoning", {{"summary", "auto"}}}}, "reasoning"},
      {{{"input", json::parse(R"([{"role": "user", "content": [{"type": "input_image",
                                   "image_url": "http://x"}]}])")}},
       "input"},
      {{{"input", json::parse(R"([{"type": "item_reference", "id": "msg_1"}])")}}, "input"},
      {{{"input", json::array()}}, "input"},
      {{{"model", "m"}}, "input"},
      {{{"input", "x"}, {"messages", json::array()}}, "messages"},
  };
  for (const auto& [body, param] : cases) {
    INFO(body.dump());
    std::string bad;
    CHECK(Translate(body, &bad).is_null());
    CHECK(bad == param);
  }
  // Not storing, not in the background, no truncation: what this server does anyway.
  std::string bad;
  CHECK(Translate({{"input", "x"},
                   {"store", false},
                   {"background", false},
                   {"truncation", "disabled"},
                   {"include", json::array()}},
                  &bad)
            .is_object());
  CHECK(ResponsesParamFor("max_tokens") == "max_output_tokens");
  CHECK(ResponsesParamFor("response_format") == "text");
}

TEST_CASE("a whole response: reasoning, calls, no message of whitespace, usage", "[responses]") {
  ResponsesWriter w("resp_1", 100, "m", {{"instructions", "i"}});
  ParsedMessage m;
  m.reasoning = "think";
  m.content = "\n\n";
  m.tool_calls.push_back({"call_1", "f", "{\"a\": 1}"});
  Usage u;
  u.prompt_tokens = 10;
  u.completion_tokens = 4;
  u.cached_tokens = 3;
  const json r = w.Whole(m, FinishReason::kStop, u);
  CHECK(r["id"] == "resp_1");
  CHECK(r["object"] == "response");
  CHECK(r["created_at"] == 100);
  CHECK(r["status"] == "completed");
  CHECK(r["instructions"] == "i");
  CHECK(r["store"] == false);
  CHECK(r["usage"] == json::parse(R"({"input_tokens": 10, "input_tokens_details":
      {"cached_tokens": 3}, "output_tokens": 4, "total_tokens": 14})"));
  const json& out = r["output"];
  REQUIRE(out.size() == 2);
  CHECK(out[0]["type"] == "reasoning");
  CHECK(out[0]["content"][0] == json{{"type", "reasoning_text"}, {"text", "think"}});
  CHECK(out[1]["type"] == "function_call");
  CHECK(out[1]["call_id"] == "call_1");
  CHECK(out[1]["name"] == "f");
  CHECK(out[1]["arguments"] == "{\"a\": 1}");
  CHECK(out[1]["id"].get<std::string>().rfind("fc_", 0) == 0);

  ParsedMessage thought;  // cut off while thinking: no message of nothing beside it
  thought.reasoning = "hm";
  const json only = w.Whole(thought, FinishReason::kLength, u);
  REQUIRE(only["output"].size() == 1);
  CHECK(only["output"][0]["type"] == "reasoning");
  CHECK(only["output"][0]["status"] == "incomplete");

  ParsedMessage text;
  text.content = "Hello";
  const json cut = w.Whole(text, FinishReason::kLength, u);
  CHECK(cut["status"] == "incomplete");
  CHECK(cut["incomplete_details"] == json{{"reason", "max_output_tokens"}});
  REQUIRE(cut["output"].size() == 1);
  CHECK(cut["output"][0]["type"] == "message");
  CHECK(cut["output"][0]["role"] == "assistant");
  CHECK(cut["output"][0]["status"] == "incomplete");
  CHECK(cut["output"][0]["content"][0]["type"] == "output_text");
  CHECK(cut["output"][0]["content"][0]["text"] == "Hello");
}

TEST_CASE("a streamed response: events in OpenAI's order with sequence numbers", "[responses]") {
  ResponsesWriter w("resp_2", 1, "m", json::object());
  std::string sse = w.Begin();
  ParsedDelta d1;
  d1.reasoning = "hm";
  sse += w.Delta(d1);
  ParsedDelta d2;
  d2.content = "Hel";
  sse += w.Delta(d2);
  ParsedDelta d3;
  d3.content = "lo";
  d3.tool_calls.push_back({0, "call_a", "f", "{\"a\""});
  sse += w.Delta(d3);
  ParsedDelta d4;
  d4.content = "\n";  // between two calls: no message of its own
  d4.tool_calls.push_back({0, "", "", ": 1}"});
  d4.tool_calls.push_back({1, "call_b", "g", "{}"});
  sse += w.Delta(d4);
  Usage u;
  u.prompt_tokens = 5;
  u.completion_tokens = 9;
  sse += w.Finish(FinishReason::kStop, u);

  const std::vector<json> ev = Events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < ev.size(); ++i) {
    CHECK(ev[i]["sequence_number"] == i);
    types.push_back(ev[i]["type"]);
  }
  const std::vector<std::string> want = {"response.created",
                                         "response.in_progress",
                                         "response.output_item.added",  // reasoning
                                         "response.content_part.added",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",  // message
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",  // call a
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.output_item.added",  // call b
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.completed"};
  CHECK(types == want);
  REQUIRE(types.size() == want.size());
  CHECK(ev[0]["response"]["status"] == "in_progress");
  CHECK(ev[0]["response"]["output"] == json::array());
  CHECK(ev[12]["text"] == "Hello");
  CHECK(ev[15]["item"]["call_id"] == "call_a");
  CHECK(ev[15]["item"]["arguments"] == "");
  CHECK(ev[18]["arguments"] == "{\"a\": 1}");
  CHECK(ev[18]["item_id"] == ev[15]["item"]["id"]);
  CHECK(ev[20]["output_index"] == 3);
  const json& done = ev.back()["response"];
  CHECK(done["status"] == "completed");
  CHECK(done["usage"]["total_tokens"] == 14);
  REQUIRE(done["output"].size() == 4);
  CHECK(done["output"][0]["content"][0]["text"] == "hm");
  CHECK(done["output"][1]["content"][0]["text"] == "Hello");
  CHECK(done["output"][1]["status"] == "completed");
  CHECK(done["output"][2]["arguments"] == "{\"a\": 1}");
  CHECK(done["output"][3]["name"] == "g");
  // Every item as output_item.done gave it is the item in the final response.
  CHECK(ev[14]["item"] == done["output"][1]);
  CHECK(ev[23]["item"] == done["output"][3]);
}

TEST_CASE("a streamed reply of nothing is one empty message, an error fails the response",
          "[responses]") {
  ResponsesWriter w("resp_3", 1, "m", json::object());
  std::string sse = w.Begin();  // apart: the operands of + run in no set order
  sse += w.Finish(FinishReason::kLength, Usage{});
  const std::vector<json> ev = Events(sse);
  REQUIRE(ev.size() == 8);
  CHECK(ev[2]["item"]["type"] == "message");
  CHECK(ev.back()["type"] == "response.incomplete");
  CHECK(ev.back()["response"]["output"][0]["content"][0]["text"] == "");
  CHECK(ev.back()["response"]["output"][0]["status"] == "incomplete");

  ResponsesWriter f("resp_4", 1, "m", json::object());
  std::string failed = f.Begin();
  failed += f.Failed(Internal("engine died"));
  const std::vector<json> fe = Events(failed);
  CHECK(fe.back()["type"] == "response.failed");
  CHECK(fe.back()["response"]["status"] == "failed");
  CHECK(fe.back()["response"]["error"]["message"] == "engine died");
}

}  // namespace
}  // namespace llm
