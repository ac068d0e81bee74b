// The OpenAI parser's structured-output fields: response_format, vLLM's structured_outputs and
// guided_* map onto one Constraint; a second constraint, an unknown option or a bad value is
// refused naming it.
#include <catch2/catch.hpp>

#include "server/openai_protocol.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

Status Parse(const std::string& body, OpenAiRequest* out, std::string* param,
             OpenAiEndpoint ep = OpenAiEndpoint::kCompletions) {
  return ParseOpenAiRequest(json::parse(body), ep, out, param);
}

TEST_CASE("structured-output fields map onto one constraint", "[openai][structured]") {
  struct Case {
    const char* body;
    Constraint::Kind kind;
    const char* text;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "response_format": {"type": "text"}})", Constraint::Kind::kNone, ""},
      {R"({"prompt": "x", "response_format": {"type": "json_object"}})",
       Constraint::Kind::kJsonObject, ""},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
           {"name": "n", "strict": true, "schema": {"type": "integer"}}}})",
       Constraint::Kind::kJsonSchema, R"({"type":"integer"})"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
           {"name": "n", "strict": false, "schema": {"type": "integer"}}}})",
       Constraint::Kind::kJsonSchema, R"({"type":"integer"})"},
      {R"({"prompt": "x", "structured_outputs": {"json": {"type": "string"}}})",
       Constraint::Kind::kJsonSchema, R"({"type":"string"})"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "a+", "grammar": null}})",
       Constraint::Kind::kRegex, "a+"},
      {R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= \"a\""}})",
       Constraint::Kind::kGrammar, "root ::= \"a\""},
      {R"({"prompt": "x", "guided_json": "{\"type\": \"null\"}"})", Constraint::Kind::kJsonSchema,
       R"({"type": "null"})"},
      {R"({"prompt": "x", "guided_regex": "[0-9]+"})", Constraint::Kind::kRegex, "[0-9]+"},
      {R"({"prompt": "x", "guided_grammar": "root ::= [a-z]"})", Constraint::Kind::kGrammar,
       "root ::= [a-z]"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    OpenAiRequest r;
    std::string param;
    const Status s = Parse(c.body, &r, &param);
    REQUIRE(s.ok());
    CHECK(r.params.constraint.kind == c.kind);
    CHECK(r.params.constraint.text == c.text);
  }
  OpenAiRequest r;
  std::string param;
  REQUIRE(Parse(R"({"messages": [{"role": "user", "content": "hi"}],
                    "guided_choice": ["yes", "no"]})",
                &r, &param, OpenAiEndpoint::kChat)
              .ok());
  CHECK(r.params.constraint.kind == Constraint::Kind::kChoice);
  CHECK(r.params.constraint.choices == std::vector<std::string>{"yes", "no"});
}

TEST_CASE("structured-output refusals name the field", "[openai][structured]") {
  struct Case {
    const char* body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})", "guided_choice",
       "'guided_regex' and 'guided_choice' both set one"},
      {R"({"prompt": "x", "response_format": {"type": "json_object"},
           "structured_outputs": {"regex": "a"}})",
       "structured_outputs", "'response_format' and 'structured_outputs'"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}})",
       "structured_outputs", "'structured_outputs.regex' and 'structured_outputs.choice'"},
      {R"({"prompt": "x", "structured_outputs": {"whitespace_pattern": " "}})",
       "structured_outputs", "unsupported option 'whitespace_pattern'"},
      {R"({"prompt": "x", "structured_outputs": {}})", "structured_outputs", "sets no constraint"},
      {R"({"prompt": "x", "response_format": {"type": "structural_tag"}})", "response_format",
       "'structural_tag' is not supported"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format",
       "needs a 'json_schema' object"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
           {"name": "n"}}})",
       "response_format", "needs a 'schema'"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
           {"schema": {}, "bogus": 1}}})",
       "response_format", "unsupported option 'bogus'"},
      {R"({"prompt": "x", "response_format": {"type": "text", "json_schema": {}}})",
       "response_format", "unsupported option 'json_schema'"},
      {R"({"prompt": "x", "guided_choice": []})", "guided_choice", "non-empty list"},
      {R"({"prompt": "x", "guided_regex": 5})", "guided_regex", "'guided_regex' must be a string"},
      {R"({"prompt": "x", "guided_decoding_backend": "xgrammar"})", "guided_decoding_backend",
       "unsupported field"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    OpenAiRequest r;
    std::string param;
    const Status s = Parse(c.body, &r, &param);
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(param == c.param);
    CHECK(s.message().find(c.message) != std::string::npos);
  }
}

}  // namespace
}  // namespace llm
