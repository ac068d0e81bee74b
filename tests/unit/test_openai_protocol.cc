// Tests for the OpenAI request parser (fields, null handling, errors naming the field), the
// status mapping, API keys and the front-end flags.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "server/api_keys.h"
#include "server/openai_protocol.h"
#include "server/server_config.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

Status Parse(const std::string& body, OpenAiEndpoint ep, OpenAiRequest* out, std::string* param) {
  return ParseOpenAiRequest(json::parse(body), ep, out, param);
}

TEST_CASE("completions fields map onto GenerateParams", "[openai]") {
  OpenAiRequest r;
  std::string param;
  REQUIRE(Parse(R"({"model": "m", "prompt": [[1, 2, 3]], "max_tokens": 7, "temperature": 0.5,
                    "top_p": 0.9, "top_k": -1, "min_p": 0.1, "seed": -3, "stop": "x",
                    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
                    "logprobs": 2, "ignore_eos": true, "min_tokens": 2, "stop_token_ids": [5],
                    "user": "u", "n": 1, "echo": false, "stream": true,
                    "stream_options": {"include_usage": true}, "suffix": null})",
                OpenAiEndpoint::kCompletions, &r, &param)
              .ok());
  const GenerateParams& p = r.params;
  CHECK(std::get<std::vector<int32_t>>(p.prompt) == std::vector<int32_t>{1, 2, 3});
  CHECK(*p.max_tokens == 7);
  CHECK(*p.temperature == 0.5f);
  CHECK(*p.top_p == 0.9f);
  CHECK(*p.top_k == 0);  // -1 is vLLM's "off"
  CHECK(*p.min_p == 0.1f);
  CHECK(*p.seed == static_cast<uint64_t>(-3));
  CHECK(p.stop == std::vector<std::string>{"x"});
  CHECK(*p.repetition_penalty == 1.1f);
  CHECK(r.logprobs == 2);
  CHECK(p.logprobs == 2);
  CHECK(*p.ignore_eos);
  CHECK(*p.min_tokens == 2);
  CHECK(p.stop_token_ids == std::vector<int32_t>{5});
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(p.add_special_tokens);
}

TEST_CASE("chat logprobs, max_completion_tokens and special tokens", "[openai]") {
  OpenAiRequest r;
  std::string param;
  REQUIRE(Parse(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                    "top_logprobs": 0, "max_completion_tokens": 9})",
                OpenAiEndpoint::kChat, &r, &param)
              .ok());
  CHECK(r.logprobs == 0);
  CHECK(r.params.logprobs == 1);  // the engine reports the sampled token's logprob with top-1
  CHECK(*r.params.max_tokens == 9);
  CHECK_FALSE(r.params.add_special_tokens);  // the template writes BOS

  OpenAiRequest bad;
  Status s = Parse(R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})",
                   OpenAiEndpoint::kChat, &bad, &param);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(param == "top_logprobs");
}

TEST_CASE("n, best_of equal to n, and logit_bias map onto GenerateParams", "[openai]") {
  OpenAiRequest r;
  std::string param;
  REQUIRE(Parse(R"({"prompt": "x", "best_of": 3, "n": 3, "logit_bias": {"9": -100, "2": 5.5}})",
                OpenAiEndpoint::kCompletions, &r, &param)
              .ok());
  CHECK(r.params.n == 3);
  CHECK(r.params.logit_bias == std::vector<std::pair<int32_t, float>>{{2, 5.5f}, {9, -100.0f}});
  OpenAiRequest chat;
  REQUIRE(Parse(R"({"messages": [{"role": "assistant", "content": null}], "n": 2})",
                OpenAiEndpoint::kChat, &chat, &param)
              .ok());
  CHECK(chat.params.n == 2);
  // Checked, and kept as sent: the renderer shapes them for its template (chat_messages.h).
  CHECK(chat.messages[0]["content"].is_null());
}

TEST_CASE("unsupported and bad fields are refused naming the field", "[openai]") {
  struct Case {
    const char* body;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": "x", "n": 0})", "n", "'n' must be in [1, "},
      {R"({"prompt": "x", "n": 2, "best_of": 3})", "best_of", "best_of (3) must equal n"},
      {R"({"prompt": "x", "best_of": 2})", "best_of", "best_of (2) must equal n"},
      {R"({"prompt": "x", "frobnicate": 1})", "frobnicate", "unsupported field 'frobnicate'"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature", "'temperature' must be a number"},
      {R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens", "'max_tokens' must be an integer"},
      {R"({"prompt": "x", "logit_bias": {"5": 101}})", "logit_bias",
       "logit_bias['5'] must be in [-100, 100]"},
      {R"({"prompt": "x", "logit_bias": {"x5": 1}})", "logit_bias", "key 'x5' is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"-5": 1}})", "logit_bias", "key '-5' is not a token id"},
      {R"({"prompt": "x", "logit_bias": {"5": "1"}})", "logit_bias", "must be a number"},
      {R"({"prompt": "x", "logit_bias": {"7": 1, "07": 2}})", "logit_bias", "token 7 twice"},
      {R"({"prompt": "x", "logit_bias": [1]})", "logit_bias", "must be an object"},
      {R"({"prompt": ["a", "b"]})", "prompt", "more than one prompt"},
      {R"({"prompt": [1, -2]})", "prompt", "non-negative"},
      {R"({"max_tokens": 3})", "prompt", "'prompt' is required"},
      {R"({"prompt": "x", "max_completion_tokens": 3})", "max_completion_tokens", "unsupported"},
      {R"({"prompt": "x", "stream_options": {"bogus": 1}})", "stream_options", "bogus"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
       "needs 'stream': true"},
  };
  for (const Case& c : cases) {
    OpenAiRequest r;
    std::string param;
    Status s = Parse(c.body, OpenAiEndpoint::kCompletions, &r, &param);
    INFO(c.body);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(param == c.param);
    CHECK(s.message().find(c.message) != std::string::npos);
  }
}

TEST_CASE("statuses map to OpenAI's HTTP codes and error shape", "[openai]") {
  CHECK(HttpStatusFor(StatusCode::kInvalidArgument) == 400);
  CHECK(HttpStatusFor(StatusCode::kNotFound) == 404);
  CHECK(HttpStatusFor(StatusCode::kResourceExhausted) == 429);
  CHECK(HttpStatusFor(StatusCode::kUnavailable) == 503);
  const json e = OpenAiError::FromStatus(ResourceExhausted("queue full"), "").ToJson();
  CHECK(e["error"]["message"] == "queue full");
  CHECK(e["error"]["type"] == "rate_limit_error");
  CHECK(e["error"]["param"].is_null());
  CHECK(e["error"]["code"].is_null());
  CHECK(std::string(OpenAiFinishReason(FinishReason::kStop)) == "stop");
  CHECK(std::string(OpenAiFinishReason(FinishReason::kLength)) == "length");
  const json u = UsageJson(Usage{3, 4, 2});
  CHECK(u["total_tokens"] == 7);
  CHECK(u["prompt_tokens_details"]["cached_tokens"] == 2);
}

TEST_CASE("API keys: bearer tokens, comma lists, files", "[openai]") {
  CHECK(ApiKeys().Allows(""));  // none configured: open
  const std::string path = "/tmp/llm_api_keys_test_" + std::to_string(getpid());
  {
    std::ofstream f(path);
    f << "# comment\n\n  k3  \n";
  }
  auto keys = ApiKeys::Load({"k1,k2"}, path);
  REQUIRE(keys.ok());
  CHECK(keys->enabled());
  CHECK(keys->Allows("Bearer k1"));
  CHECK(keys->Allows("Bearer k2"));
  CHECK(keys->Allows("Bearer k3"));
  CHECK_FALSE(keys->Allows("Bearer k4"));
  CHECK_FALSE(keys->Allows("k1"));
  CHECK_FALSE(keys->Allows("Bearer k1 "));
  CHECK_FALSE(keys->Allows(""));
  CHECK(ApiKeys::Load({"a,,b"}, "").status().code() == StatusCode::kInvalidArgument);
  CHECK(ApiKeys::Load({}, path + ".missing").status().code() == StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST_CASE("front-end options come from the one option table", "[openai]") {
  auto c = ParseServerConfig({"--model", "m", "--api-key", "a,b", "--http-address", "off",
                              "--max-request-body-bytes", "4096", "--block-size", "16"});
  REQUIRE(c.ok());
  CHECK(c->front_end.api_key == "a,b");
  CHECK(c->front_end.http_address == "off");
  CHECK(c->front_end.max_request_body_bytes == 4096);
  CHECK(c->engine.model.block_size == 16);
  // A certificate without its key, an unreadable file, a bad number: refused naming the flag.
  auto bad = ParseServerConfig({"--model", "m", "--tls-cert-file", "/etc/hostname"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("tls") != std::string::npos);
  bad = ParseServerConfig({"--model", "m", "--chat-template", "/nonexistent/t.jinja"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("chat-template") != std::string::npos);
  bad = ParseServerConfig({"--model", "m", "--max-request-body-bytes", "12x"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("max-request-body-bytes") != std::string::npos);
  CHECK(FrontEndOptions().http_address == "127.0.0.1:8000");
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TEST_CASE("speculative_decoding opts a request out, and must be a boolean",
          "[openai][speculative]") {
  OpenAiRequest r;
  std::string param;
  REQUIRE(Parse(R"({"model": "m", "prompt": "x", "speculative_decoding": false})",
                OpenAiEndpoint::kCompletions, &r, &param)
              .ok());
  REQUIRE(r.params.speculative_decoding.has_value());
  CHECK_FALSE(*r.params.speculative_decoding);
  OpenAiRequest unset;
  REQUIRE(
      Parse(R"({"model": "m", "prompt": "x"})", OpenAiEndpoint::kCompletions, &unset, &param).ok());
  CHECK_FALSE(unset.params.speculative_decoding.has_value());
  OpenAiRequest bad;
  const Status st = Parse(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "speculative_decoding": "no"})",
      OpenAiEndpoint::kChat, &bad, &param);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(param == "speculative_decoding");
  CHECK(st.message().find("speculative_decoding") != std::string::npos);
}

}  // namespace
}  // namespace llm
