#include "server/openai_server.h"

#include <algorithm>
#include <ctime>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "server/http1_server.h"
#include "server/json_depth.h"
#include "server/openai_protocol.h"
#include "server/openai_responses.h"
#include "server/output_queue.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;
using Reply = std::shared_ptr<Http1Reply>;

// At shutdown the engine has already given every request its last output; this bounds the wait
// for those to be written before the connections are closed.
constexpr std::chrono::seconds kDrainLimit(2);

// Client text quoted in an error (a path, a method) is cut to this many bytes.
constexpr size_t kQuoteBytes = 256;

std::string Quote(std::string_view s) {
  return s.size() <= kQuoteBytes ? std::string(s) : std::string(s.substr(0, kQuoteBytes)) + "...";
}

// A path segment with its %XX escapes decoded (the openai client escapes '/' in model names);
// a malformed escape is kept as sent.
std::string PercentDecode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Messages may quote client bytes that are not UTF-8: those become U+FFFD, never an exception.
std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SendError(const Reply& reply, const OpenAiError& e,
               std::vector<std::pair<std::string, std::string>> headers = {}) {
  reply->Respond(e.http_status, "application/json", Dump(e.ToJson()), std::move(headers));
}

void SendStatus(const Reply& reply, const Status& s, std::string param = "") {
  SendError(reply, OpenAiError::FromStatus(s, std::move(param)));
}

void SendJson(const Reply& reply, const json& j) {
  reply->Respond(200, "application/json", Dump(j));
}

std::string SseEvent(const json& j) {
  return "data: " + Dump(j) + "\n\n";
}

// The state of one response (streamed or whole), rendered from the engine's outputs.
struct Stream {
  OpenAiRequest request;
  std::string request_id;
  std::string id;  // cmpl-... / chatcmpl-...
  std::string model;
  int64_t created = 0;
  const Tokenizer* tokenizer = nullptr;
  bool started = false;
  bool finished = false;
  std::vector<int> text_offset;  // per choice: where its next text starts
  // Chat: how the output splits into reasoning, content and tool calls (openai_tool_calls.h).
  ChatOutputPlan plan;
  // Streams with plan.parse: one parser per choice, and whether it streamed a tool call.
  std::vector<std::unique_ptr<ChatOutputParser>> parsers;
  std::vector<char> streamed_calls;
  // POST /v1/responses: the chat result written as a Responses object or events.
  std::unique_ptr<ResponsesWriter> responses;

  int num_choices() const { return std::max(1, request.params.n); }

  // `chat_delta` (chat with a parser) replaces the content delta made of `text`.
  json Chunk(int index, const std::string& text, const std::vector<SampledToken>& lps,
             const char* finish, const json* chat_delta = nullptr) {
    const bool chat = request.endpoint == OpenAiEndpoint::kChat;
    text_offset.resize(num_choices());
    json choice = {
        {"index", index},
        {"logprobs", request.logprobs >= 0 ? LogprobsJson(request.endpoint, lps, request.logprobs,
                                                          tokenizer, text_offset[index])
                                           : json(nullptr)},
        {"finish_reason", finish ? json(finish) : json(nullptr)}};
    if (chat_delta != nullptr) {
      choice["delta"] = *chat_delta;
    } else if (chat) {
      choice["delta"] = text.empty() ? json::object() : json{{"content", text}};
    } else {
      choice["text"] = text;
    }
    json c = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
    if (request.include_usage) c["usage"] = nullptr;
    return c;
  }

  // The non-streaming response body: one choice per result; `usage` covers them all.
  json Whole(const std::vector<GenerationResult>& results, const Usage& usage) const {
    if (responses) {
      const GenerationResult& r = results.at(0);
      ParsedMessage m;
      if (plan.parse) {
        m = ParseChatOutput(plan.options, r.text);
      } else {
        m.content = r.text;
      }
      return responses->Whole(m, r.finish_reason, usage);
    }
    const bool chat = request.endpoint == OpenAiEndpoint::kChat;
    json choices = json::array();
    for (size_t i = 0; i < results.size(); ++i) {
      choices.push_back(WholeChoice(static_cast<int>(i), results[i]));
    }
    return json{{"id", id},           {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created}, {"model", model},
                {"choices", choices}, {"usage", UsageJson(usage)}};
  }

  json WholeChoice(int index, const GenerationResult& result) const {
    const bool chat = request.endpoint == OpenAiEndpoint::kChat;
    json choice = {
        {"index", index},
        {"logprobs", request.logprobs >= 0 ? LogprobsJson(request.endpoint, result.logprobs,
                                                          request.logprobs, tokenizer, 0)
                                           : json(nullptr)},
        {"finish_reason", OpenAiFinishReason(result.finish_reason)},
        {"stop_reason", result.matched_stop.empty() ? json(nullptr) : json(result.matched_stop)}};
    if (chat && plan.parse) {
      const ParsedMessage m = ParseChatOutput(plan.options, result.text);
      json msg = {{"role", "assistant"}};
      // OpenAI's content is null beside tool calls when the model wrote nothing else.
      const bool blank = m.content.find_first_not_of(" \n") == std::string::npos;
      msg["content"] = blank && !m.tool_calls.empty() ? json(nullptr) : json(m.content);
      if (plan.reasoning_field) {
        msg["reasoning_content"] = m.reasoning.empty() ? json(nullptr) : json(m.reasoning);
      }
      if (!m.tool_calls.empty()) {
        msg["tool_calls"] = ToolCallsJson(m.tool_calls);
        if (result.finish_reason == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
      }
      choice["message"] = std::move(msg);
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
    } else {
      choice["text"] = result.text;
    }
    return choice;
  }

  // The SSE events for one engine output.
  std::string Render(const GenerationOutput& out) {
    if (responses) return RenderResponses(out);
    if (!out.error.ok()) {
      finished = true;
      return SseEvent(OpenAiError::FromStatus(out.error).ToJson()) + "data: [DONE]\n\n";
    }
    std::string events;
    // With n > 1 a choice ends on its own output (finish_reason set) before the request does.
    const char* finish = out.finished || out.finish_reason != FinishReason::kNone
                             ? OpenAiFinishReason(out.finish_reason)
                             : nullptr;
    const int index = std::clamp(out.index, 0, num_choices() - 1);
    if (!parsers.empty()) {
      ChatOutputParser& parser = *parsers[index];
      ParsedDelta d = parser.Push(out.text);
      if (finish != nullptr) d.Append(parser.Finish());
      json delta = json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty()) delta["content"] = d.content;
      if (!d.tool_calls.empty()) {
        delta["tool_calls"] = ToolCallDeltasJson(d.tool_calls);
        streamed_calls[index] = 1;
      }
      if (finish != nullptr && streamed_calls[index] && out.finish_reason == FinishReason::kStop) {
        finish = "tool_calls";
      }
      // Held-back markup sends nothing, unless the client waits for the tokens' logprobs.
      if (!delta.empty() || finish != nullptr ||
          (request.logprobs >= 0 && !out.token_ids.empty())) {
        events += SseEvent(Chunk(index, "", out.logprobs, finish, &delta));
      }
    } else if (!out.text.empty() || !out.token_ids.empty() || finish != nullptr) {
      events += SseEvent(Chunk(index, out.text, out.logprobs, finish));
      text_offset[index] += static_cast<int>(out.text.size());
    }
    if (out.finished) {
      finished = true;
      if (request.include_usage) {
        json u = {{"id", id},
                  {"object", request.endpoint == OpenAiEndpoint::kChat ? "chat.completion.chunk"
                                                                       : "text_completion"},
                  {"created", created},
                  {"model", model},
                  {"choices", json::array()},
                  {"usage", UsageJson(out.usage)}};
        events += SseEvent(u);
      }
      events += "data: [DONE]\n\n";
    }
    return events;
  }

  // Responses events for one engine output (one choice: the API has no n).
  std::string RenderResponses(const GenerationOutput& out) {
    if (!out.error.ok()) {
      finished = true;
      return responses->Failed(out.error);
    }
    const bool last = out.finished || out.finish_reason != FinishReason::kNone;
    ParsedDelta d;
    if (!parsers.empty()) {
      d = parsers[0]->Push(out.text);
      if (last) d.Append(parsers[0]->Finish());
    } else {
      d.content = out.text;
    }
    std::string events = responses->Delta(d);
    if (out.finished) {
      finished = true;
      events += responses->Finish(out.finish_reason, out.usage);
    }
    return events;
  }
};

std::string RandomHex() {
  static std::atomic<uint64_t> counter{0};
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%llx%06llx", static_cast<unsigned long long>(std::time(nullptr)),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffff));
  return buf;
}

// Receives a request's outputs on the engine thread and writes them to its reply: SSE events as
// they come, or one JSON body at the end. Outputs that arrive before the handler has sent the
// response head wait in `pending`.
class ReplySink final : public ResultSink {
 public:
  ReplySink(Reply reply, std::atomic<int>* open) : reply_(std::move(reply)), open_(open) {
    open_->fetch_add(1);
  }
  ~ReplySink() override {
    if (!done_) open_->fetch_sub(1);
  }

  Stream st;

  void OnOutput(GenerationOutput out) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!started_) {
      pending_.push_back(std::move(out));
      return;
    }
    Handle(std::move(out));
  }
  // The handler's part: the response head (streams), then what came before it.
  void Start() {
    std::lock_guard<std::mutex> l(mu_);
    started_ = true;
    if (st.request.stream) {
      reply_->Begin(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      if (st.responses) {
        reply_->Stream(st.responses->Begin());
      } else if (st.request.endpoint ==
                 OpenAiEndpoint::kChat) {             // OpenAI's first chat chunk: the role
        for (int i = 0; i < st.num_choices(); ++i) {  // one per choice, as vLLM sends
          json first = st.Chunk(i, "", {}, nullptr);
          first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
          reply_->Stream(SseEvent(first));
        }
      }
    }
    for (GenerationOutput& o : pending_) Handle(std::move(o));
    pending_.clear();
  }
  bool finished() {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }

 private:
  void Handle(GenerationOutput out) {
    if (done_) return;
    if (st.request.stream) {
      reply_->Stream(st.Render(out));
      if (st.finished) Done();
      return;
    }
    results_.resize(st.num_choices());
    const bool last = out.finished || !out.error.ok();
    const Usage usage = out.usage;
    GenerationResult& result = results_[std::clamp(out.index, 0, st.num_choices() - 1)];
    result.Add(std::move(out));
    if (!last) return;
    st.finished = true;
    const json body = result.error.ok() ? st.Whole(results_, usage)
                                        : OpenAiError::FromStatus(result.error).ToJson();
    reply_->Respond(200, "application/json", Dump(body));
    Done();
  }
  void Done() {
    if (st.request.stream) reply_->Finish();
    done_ = true;
    open_->fetch_sub(1);
  }

  Reply reply_;
  std::atomic<int>* open_;
  std::mutex mu_;
  bool started_ = false;
  bool done_ = false;
  std::vector<GenerationOutput> pending_;
  std::vector<GenerationResult> results_;  // per choice
};

}  // namespace

OpenAiServer::OpenAiServer(RequestGateway* gateway, const ApiKeys* keys, OpenAiServerConfig config)
    : gateway_(gateway), keys_(keys), config_(std::move(config)) {}

OpenAiServer::~OpenAiServer() {
  Stop();
}

bool OpenAiServer::Authorized(const Http1Request& req, const Reply& reply) const {
  if (keys_->Allows(req.Header("Authorization"))) return true;
  OpenAiError e;
  e.http_status = 401;
  e.message = req.HasHeader("Authorization") ? "invalid API key"
                                             : "missing API key: send 'Authorization: Bearer KEY'";
  e.code = "invalid_api_key";
  SendError(reply, e, {{"WWW-Authenticate", "Bearer"}});
  return false;
}

bool OpenAiServer::ParseBody(const Http1Request& req, const Reply& reply,
                             nlohmann::ordered_json* body) const {
  // Bounded before parsing: parsing, copying and rendering a JSON value recurse per level.
  if (!JsonDepthWithin(req.body, config_.max_json_depth)) {
    SendStatus(reply, InvalidArgument("the request body nests JSON deeper than max_json_depth (" +
                                      std::to_string(config_.max_json_depth) + ")"));
    return false;
  }
  *body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body->is_discarded()) {
    SendStatus(reply, InvalidArgument("the request body is not valid JSON"));
    return false;
  }
  if (!body->is_object()) {
    SendStatus(reply, InvalidArgument("the request body must be a JSON object"));
    return false;
  }
  return true;
}

void OpenAiServer::Handle(const Http1Request& req, const Reply& reply) {
  const std::string_view target = req.target;
  const std::string_view path = target.substr(0, target.find('?'));
  // /health stays open for load balancers and probes.
  if (req.method == "GET" && path == "/health") {
    if (!gateway_->accepting()) {
      SendStatus(reply, Unavailable("server is shutting down"));
    } else {
      reply->Respond(200, "", "");
    }
    return;
  }
  if (!Authorized(req, reply)) return;
  if (req.method == "GET" && path == "/v1/models") return Models(reply);
  if (req.method == "GET" && path.rfind("/v1/models/", 0) == 0) {
    return Model(path.substr(std::string_view("/v1/models/").size()), reply);
  }
  if (req.method == "POST" && path == "/v1/completions") return Generate(req, reply, false);
  if (req.method == "POST" && path == "/v1/chat/completions") return Generate(req, reply, true);
  if (req.method == "POST" && path == "/v1/responses") return Generate(req, reply, true, true);
  if (req.method == "POST" && path == "/tokenize") return Tokenize(req, reply);
  if (req.method == "POST" && path == "/detokenize") return Detokenize(req, reply);
  OpenAiError e;
  e.http_status = 404;
  e.message = "no route " + Quote(req.method) + " " + Quote(path);
  SendError(reply, e);
}

json OpenAiServer::ModelObject() const {
  const EngineCore& core = gateway_->core();
  return json{{"id", config_.model_name},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "llm-server"},
              {"root", core.config().model.model_dir},
              {"max_model_len", core.max_model_len()}};
}

void OpenAiServer::Models(const Reply& reply) const {
  SendJson(reply, json{{"object", "list"}, {"data", json::array({ModelObject()})}});
}

void OpenAiServer::Model(std::string_view id, const Reply& reply) const {
  // The openai client escapes the id ('/' in org/model becomes %2F); an unescaped '/' matches too.
  const std::string name = PercentDecode(id);
  if (name == config_.model_name) return SendJson(reply, ModelObject());
  OpenAiError e;
  e.http_status = 404;
  e.message = "The model '" + Quote(name) + "' does not exist";
  e.param = "model";
  e.code = "model_not_found";
  SendError(reply, e);
}

void OpenAiServer::Generate(const Http1Request& req, const Reply& reply, bool chat,
                            bool responses) {
  json body;
  if (!ParseBody(req, reply, &body)) return;
  auto sink = std::make_shared<ReplySink>(reply, &open_responses_);
  OpenAiRequest& r = sink->st.request;
  std::string param;
  Status s;
  try {
    if (responses) {  // served as the chat request it means
      json chat_body, echo;
      s = ResponsesToChatBody(body, &chat_body, &echo, &param);
      if (!s.ok()) {
        SendStatus(reply, s, param);
        return;
      }
      body = std::move(chat_body);
      sink->st.responses = std::make_unique<ResponsesWriter>(
          "resp_" + RandomHex(), std::time(nullptr), config_.model_name, std::move(echo));
    }
    s = ParseOpenAiRequest(body, chat ? OpenAiEndpoint::kChat : OpenAiEndpoint::kCompletions, &r,
                           &param);
  } catch (const std::exception&) {  // nlohmann type errors on odd values; their text is internal
    s = InvalidArgument("a field of the request has a value of the wrong type");
  }
  if (!s.ok()) {
    SendStatus(reply, s, responses ? ResponsesParamFor(param) : param);
    return;
  }
  if (!r.model.empty() && r.model != config_.model_name) {
    OpenAiError e;
    e.http_status = 404;
    e.message = "the model '" + r.model + "' does not exist; this server serves '" +
                config_.model_name + "'";
    e.param = "model";
    e.code = "model_not_found";
    SendError(reply, e);
    return;
  }
  if (chat) {
    r.params.prompt =
        ChatPromptParams{r.messages, r.tools, r.add_generation_prompt, r.chat_template_kwargs};
    const ChatRenderer* renderer = gateway_->chat();
    s = PlanChatOutput(r.tools, r.tool_choice, r.parallel_tool_calls,
                       renderer ? renderer->tool_call_family() : ToolCallFamily::kNone,
                       renderer ? renderer->reasoning_family() : ReasoningFamily::kNone,
                       r.params.constraint.kind != Constraint::Kind::kNone, &sink->st.plan,
                       &r.params.constraint, &param);
    if (!s.ok()) {
      SendStatus(reply, s, param);
      return;
    }
    // Markers that are special tokens must reach the parser (vLLM does the same for Mistral).
    if (sink->st.plan.needs_special_tokens && !r.params.skip_special_tokens) {
      r.params.skip_special_tokens = false;
    }
  }
  sink->st.id = (chat ? "chatcmpl-" : "cmpl-") + RandomHex();
  sink->st.model = config_.model_name;
  sink->st.created = std::time(nullptr);
  sink->st.tokenizer = gateway_->core().tokenizer();
  std::string prompt;
  s = gateway_->Submit(r.params, std::nullopt, sink, &sink->st.request_id,
                       chat ? &prompt : nullptr);
  if (!s.ok()) {
    // A forced call's constraint is built from the tools' parameter schemas.
    const bool tools_schema = s.message().rfind("tagged_json", 0) == 0;
    const std::string bad = tools_schema                                          ? "tools"
                            : chat && s.code() == StatusCode::kFailedPrecondition ? "messages"
                                                                                  : "";
    SendStatus(reply, s, responses ? ResponsesParamFor(bad) : bad);
    return;
  }
  // Outputs wait in the sink until Start(), so the parser is in place before the first.
  if (chat && sink->st.plan.parse) {
    sink->st.plan.options.starts_in_reasoning = PromptOpensThinking(prompt);
    if (r.stream) {
      for (int i = 0; i < sink->st.num_choices(); ++i) {
        sink->st.parsers.push_back(CreateChatOutputParser(sink->st.plan.options));
      }
      sink->st.streamed_calls.assign(sink->st.parsers.size(), 0);
    }
  }
  // A client that leaves frees its request's KV blocks at the engine's next step.
  reply->OnGone([gateway = gateway_, id = sink->st.request_id, weak = std::weak_ptr(sink)] {
    auto sk = weak.lock();
    if (sk && sk->finished()) return;
    gateway->Abort(id, Status(StatusCode::kCancelled, "client disconnected"));
  });
  sink->Start();
}

void OpenAiServer::Tokenize(const Http1Request& req, const Reply& reply) {
  json body;
  if (!ParseBody(req, reply, &body)) return;
  const Tokenizer* tok = gateway_->core().tokenizer();
  if (body.contains("add_generation_prompt") && !body["add_generation_prompt"].is_boolean()) {
    SendStatus(reply, InvalidArgument("'add_generation_prompt' must be a boolean"),
               "add_generation_prompt");
    return;
  }
  if (body.contains("tools") && !body["tools"].is_array() && !body["tools"].is_null()) {
    SendStatus(reply, InvalidArgument("'tools' must be a list"), "tools");
    return;
  }
  if (tok == nullptr) {
    SendStatus(reply, FailedPrecondition("the model has no tokenizer"));
    return;
  }
  std::string text;
  bool add_special = true;
  if (body.contains("messages")) {
    if (gateway_->chat() == nullptr) {
      SendStatus(reply, FailedPrecondition("this server has no chat template engine yet"),
                 "messages");
      return;
    }
    auto rendered = gateway_->chat()->Render(body["messages"], body.value("tools", json()),
                                             body.value("add_generation_prompt", true), json());
    if (!rendered.ok()) {
      SendStatus(reply, rendered.status(), "messages");
      return;
    }
    text = std::move(rendered).value();
    add_special = false;
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    text = body["prompt"].get<std::string>();
  } else {
    SendStatus(reply, InvalidArgument("'prompt' (a string) or 'messages' is required"), "prompt");
    return;
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (k == "add_special_tokens") {
      if (!it->is_boolean()) {
        SendStatus(reply, InvalidArgument("'add_special_tokens' must be a boolean"), k);
        return;
      }
      add_special = it->get<bool>();
    } else if (k != "prompt" && k != "messages" && k != "model" && k != "tools" &&
               k != "add_generation_prompt") {
      SendStatus(reply, InvalidArgument("unsupported field '" + k + "'"), k);
      return;
    }
  }
  if (static_cast<int64_t>(text.size()) > gateway_->config().max_prompt_bytes) {
    SendStatus(reply, InvalidArgument("text exceeds max_prompt_bytes"), "prompt");
    return;
  }
  const std::vector<int32_t> ids = tok->Encode(text, add_special);
  SendJson(reply, json{{"count", ids.size()},
                       {"max_model_len", gateway_->core().max_model_len()},
                       {"tokens", ids}});
}

void OpenAiServer::Detokenize(const Http1Request& req, const Reply& reply) {
  json body;
  if (!ParseBody(req, reply, &body)) return;
  const Tokenizer* tok = gateway_->core().tokenizer();
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    SendStatus(reply, InvalidArgument("'tokens' (a list of token ids) is required"), "tokens");
    return;
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "tokens" && it.key() != "model") {
      SendStatus(reply, InvalidArgument("unsupported field '" + it.key() + "'"), it.key());
      return;
    }
  }
  const int vocab = gateway_->core().model_config().vocab_size;
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      SendStatus(
          reply,
          InvalidArgument("token ids must be integers in [0, " + std::to_string(vocab) + ")"),
          "tokens");
      return;
    }
    ids.push_back(t.get<int32_t>());
  }
  if (tok == nullptr) {
    SendStatus(reply, FailedPrecondition("the model has no tokenizer"));
    return;
  }
  SendJson(reply, json{{"prompt", tok->Decode(ids, /*skip_special_tokens=*/false)}});
}

StatusOr<int> OpenAiServer::Start() {
  Http1Limits limits;
  limits.max_body_bytes = config_.max_request_body_bytes;
  limits.max_connections = config_.max_connections;
  limits.max_connections_per_address = config_.max_connections_per_address;
  if (config_.num_threads > 0) limits.io_threads = config_.num_threads;
  http_ = std::make_unique<Http1Server>(
      limits,
      [this](Http1Request req, std::shared_ptr<Http1Reply> reply) {
        try {
          Handle(req, reply);
        } catch (const std::exception& e) {
          // The text names internals: logged, not sent.
          spdlog::error("HTTP {} {}: {}", Quote(req.method), Quote(req.target), e.what());
          OpenAiError err;
          err.http_status = 500;
          err.message = "internal error";
          SendError(reply, err);
        }
      },
      [](int status, const std::string& message) {
        OpenAiError e;
        e.http_status = status;
        e.message = message;
        return Dump(e.ToJson());
      });
  return http_->Start(config_.address, config_.tls_cert_file, config_.tls_key_file);
}

void OpenAiServer::Stop() {
  if (!http_) return;
  const auto drain_end = std::chrono::steady_clock::now() + kDrainLimit;
  while (open_responses_.load() > 0 && std::chrono::steady_clock::now() < drain_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http_->Stop();
  http_.reset();
}

}  // namespace llm
