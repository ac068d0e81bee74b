// Tests for chat message normalization (text/chat/chat_messages.h): the message shapes OpenAI
// clients send reach the template as strings and objects, and non-text parts are refused by name.
#include <catch2/catch.hpp>

#include "text/chat/chat_messages.h"
#include "text/chat/chat_template.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

TEST_CASE("assistant content null beside tool_calls, and a tool result", "[chat_messages]") {
  // The assistant message exactly as the API returns it, then the tool's answer.
  json m = json::parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "assistant", "tool_calls": [{"id": "c2", "type": "function",
      "function": {"name": "noop", "arguments": ""}}]}])");
  std::string bad;
  REQUIRE(NormalizeChatMessages(&m, &bad).ok());
  CHECK(m[1]["content"] == "");
  CHECK(m[1]["tool_calls"][0]["id"] == "call_1");
  CHECK(m[1]["tool_calls"][0]["function"]["arguments"] == json{{"city", "Paris"}});
  CHECK(m[2]["tool_call_id"] == "call_1");
  CHECK(m[2]["content"] == "sunny");
  CHECK(m[3]["content"] == "");
  CHECK(m[3]["tool_calls"][0]["function"]["arguments"] == json::object());
  // Idempotent: a second pass changes nothing.
  json again = m;
  REQUIRE(NormalizeChatMessages(&again, &bad).ok());
  CHECK(again == m);

  // A template in the style of Llama 3.1 / Qwen 2.5 renders the conversation.
  auto t = ChatTemplate::Create(
      "{%- for m in messages %}{{ m.role }}:{{ m.content }}"
      "{%- if m.tool_calls %}{%- for c in m.tool_calls %}[{{ c.function.name }} "
      "{{ c.function.arguments | tojson }}]{%- endfor %}{%- endif %}"
      "{%- if m.tool_call_id %}({{ m.tool_call_id }}){%- endif %}|{%- endfor %}");
  REQUIRE(t.ok());
  ChatRenderRequest r;
  r.messages = m;
  auto out = t->Render(r);
  REQUIRE(out.ok());
  CHECK(*out ==
        "user:weather?|assistant:[get_weather {\"city\": \"Paris\"}]|tool:sunny(call_1)|"
        "assistant:[noop {}]|");
}

TEST_CASE("content parts: text joined with newlines, others refused by type", "[chat_messages]") {
  json m = json::parse(R"([{"role": "system", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]},
                           {"role": "user", "content": []},
                           {"role": "assistant", "content": [{"type": "refusal",
                                                              "refusal": "no"}]}])");
  std::string bad;
  REQUIRE(NormalizeChatMessages(&m, &bad).ok());
  CHECK(m[0]["content"] == "a\nb");
  CHECK(m[1]["content"] == "");
  CHECK(m[2]["content"] == "no");

  struct Case {
    const char* messages;
    const char* path;
    const char* message;
  };
  const Case cases[] = {
      {R"([{"role": "user", "content": [{"type": "text", "text": "x"},
          {"type": "image_url", "image_url": {"url": "http://a/b.png"}}]}])",
       "messages[0].content[1]", "'image_url' are not supported"},
      {R"([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])",
       "messages[0].content[0]", "'input_audio' are not supported"},
      {R"([{"role": "user", "content": "x"}, {"role": "user", "content": [{"type": "file"}]}])",
       "messages[1].content[0]", "'file' are not supported"},
      {R"([{"role": "user", "content": [{"type": "hologram"}]}])", "messages[0].content[0]",
       "unknown content part type 'hologram'"},
      {R"([{"role": "user", "content": [{"type": "text"}]}])", "messages[0].content[0]",
       "needs a string 'text'"},
      {R"([{"role": "user", "content": 5}])", "messages[0].content", "must be a string"},
      {R"([{"content": "x"}])", "messages[0]", "string 'role'"},
      {R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f",
          "arguments": "{oops"}}]}])",
       "messages[0].tool_calls[0].function.arguments", "not valid JSON"},
  };
  for (const Case& c : cases) {
    json msgs = json::parse(c.messages);
    std::string path;
    const Status s = NormalizeChatMessages(&msgs, &path);
    INFO(c.messages);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(path == c.path);
    CHECK(s.message().find(c.message) != std::string::npos);
  }
}

TEST_CASE("Templates that test content for none get tool-call turns as the API sends them",
          "[chat_messages]") {
  CHECK(DetectToolCallMessageShape("{%- if message['content'] is none %}") ==
        ToolCallMessageShape::kOpenAiNative);
  CHECK(DetectToolCallMessageShape("{% if message.content is not none %}") ==
        ToolCallMessageShape::kOpenAiNative);
  // Other fields tested for none, or content tested otherwise, keep the template values.
  CHECK(DetectToolCallMessageShape("{% if message.reasoning_content is not none %}") ==
        ToolCallMessageShape::kTemplateValues);
  CHECK(DetectToolCallMessageShape("{% if message.content is string %}") ==
        ToolCallMessageShape::kTemplateValues);

  json msgs = json::parse(R"([
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
      {"id": "b", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}},
      {"id": "c", "type": "function", "function": {"name": "h", "arguments": ""}}]},
    {"role": "user", "content": null}])");
  json values = msgs;
  std::string path;
  REQUIRE(NormalizeChatMessages(&msgs, &path, ToolCallMessageShape::kOpenAiNative).ok());
  CHECK(msgs[0]["content"].is_null());  // only beside tool calls
  CHECK(msgs[1]["content"] == "");
  CHECK(msgs[0]["tool_calls"][0]["function"]["arguments"] == "{\"x\": 1}");
  CHECK(msgs[0]["tool_calls"][1]["function"]["arguments"] == "{\"y\":2}");
  CHECK(msgs[0]["tool_calls"][2]["function"]["arguments"] == "{}");
  REQUIRE(NormalizeChatMessages(&values, &path).ok());
  CHECK(values[0]["content"] == "");
  CHECK(values[0]["tool_calls"][0]["function"]["arguments"] == json::parse(R"({"x": 1})"));
  CHECK(values[0]["tool_calls"][2]["function"]["arguments"] == json::object());
}

}  // namespace
}  // namespace llm
