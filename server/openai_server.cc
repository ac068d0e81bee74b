#include "server/openai_server.h"

#include <sys/socket.h>

#include <ctime>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/http_listen.h"
#include "server/http_request_checks.h"
#include "server/http_socket_close.h"
#include "server/json_depth.h"
#include "server/openai_protocol.h"
#include "server/output_queue.h"

namespace llm {
namespace {

using json = nlohmann::ordered_json;

// While no output arrives (a long prefill, a queued request), the handler still looks at its
// socket this often, so a client that left stops holding KV blocks.
constexpr std::chrono::milliseconds kDisconnectPoll(50);

// At shutdown the engine has already given every stream its last output; this bounds the wait
// for the handlers to write it before the remaining connections are shut down.
constexpr std::chrono::seconds kDrainLimit(2);

// Bounds on discarding the unread body of a refused request before its connection closes.
constexpr int kLingerMs = 2000;
constexpr size_t kLingerBytes = size_t{64} << 20;

// Client text quoted in an error (a path, a method) is cut to this many bytes.
constexpr size_t kQuoteBytes = 256;

void SendError(httplib::Response& res, const OpenAiError& e) {
  res.status = e.http_status;
  // Messages may quote client bytes that are not UTF-8: those become U+FFFD, never an exception.
  res.set_content(e.ToJson().dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

// For a request answered without reading its body: the body is discarded (bounded), and once
// the response is written (the releaser runs when httplib destroys the Response) the socket is
// shut for reading, so httplib closes it instead of parsing leftover bytes as a request.
void CloseAfterResponse(const httplib::Request& req, httplib::Response& res) {
  res.set_header("Connection", "close");
  const int fd = ConnectionSocket(req.local_port, req.remote_addr, req.remote_port);
  if (fd < 0) return;
  DiscardPending(fd, kLingerMs, kLingerBytes);
  res.content_provider_resource_releaser_ = [fd](bool) { shutdown(fd, SHUT_RD); };
}

std::string Quote(const std::string& s) {
  return s.size() <= kQuoteBytes ? s : s.substr(0, kQuoteBytes) + "...";
}

void SendStatus(httplib::Response& res, const Status& s, std::string param = "") {
  SendError(res, OpenAiError::FromStatus(s, std::move(param)));
}

std::string SseEvent(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// The state of one streamed response, shared by httplib's content provider and its releaser.
struct Stream {
  std::shared_ptr<OutputQueue> queue;
  OpenAiRequest request;
  std::string request_id;
  std::string id;  // cmpl-... / chatcmpl-...
  std::string model;
  int64_t created = 0;
  const Tokenizer* tokenizer = nullptr;
  bool started = false;
  bool finished = false;
  int text_offset = 0;

  json Chunk(const std::string& text, const std::vector<SampledToken>& lps,
             const char* finish) const {
    const bool chat = request.endpoint == OpenAiEndpoint::kChat;
    json choice = {
        {"index", 0},
        {"logprobs", request.logprobs >= 0 ? LogprobsJson(request.endpoint, lps, request.logprobs,
                                                          tokenizer, text_offset)
                                           : json(nullptr)},
        {"finish_reason", finish ? json(finish) : json(nullptr)}};
    if (chat) {
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

  // The non-streaming response body.
  json Whole(const GenerationResult& result) const {
    const bool chat = request.endpoint == OpenAiEndpoint::kChat;
    json choice = {
        {"index", 0},
        {"logprobs", request.logprobs >= 0 ? LogprobsJson(request.endpoint, result.logprobs,
                                                          request.logprobs, tokenizer, 0)
                                           : json(nullptr)},
        {"finish_reason", OpenAiFinishReason(result.finish_reason)},
        {"stop_reason", result.matched_stop.empty() ? json(nullptr) : json(result.matched_stop)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
    } else {
      choice["text"] = result.text;
    }
    return json{{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array({choice})},
                {"usage", UsageJson(result.usage)}};
  }

  // The SSE events for one engine output.
  std::string Render(const GenerationOutput& out) {
    if (!out.error.ok()) {
      finished = true;
      return SseEvent(OpenAiError::FromStatus(out.error).ToJson()) + "data: [DONE]\n\n";
    }
    std::string events;
    const char* finish = out.finished ? OpenAiFinishReason(out.finish_reason) : nullptr;
    if (!out.text.empty() || !out.token_ids.empty() || finish != nullptr) {
      events += SseEvent(Chunk(out.text, out.logprobs, finish));
      text_offset += static_cast<int>(out.text.size());
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
};

std::string RandomHex() {
  static std::atomic<uint64_t> counter{0};
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%llx%06llx", static_cast<unsigned long long>(std::time(nullptr)),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffff));
  return buf;
}

}  // namespace

OpenAiServer::OpenAiServer(RequestGateway* gateway, const ApiKeys* keys, OpenAiServerConfig config)
    : gateway_(gateway), keys_(keys), config_(std::move(config)) {}

OpenAiServer::~OpenAiServer() {
  Stop();
}

bool OpenAiServer::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (keys_->Allows(req.get_header_value("Authorization"))) return true;
  OpenAiError e;
  e.http_status = 401;
  e.message = req.has_header("Authorization") ? "invalid API key"
                                              : "missing API key: send 'Authorization: Bearer KEY'";
  e.code = "invalid_api_key";
  SendError(res, e);
  res.set_header("WWW-Authenticate", "Bearer");
  return false;
}

bool OpenAiServer::ParseBody(const httplib::Request& req, httplib::Response& res,
                             nlohmann::ordered_json* body) const {
  // Bounded before parsing: parsing, copying and rendering a JSON value recurse per level.
  if (!JsonDepthWithin(req.body, config_.max_json_depth)) {
    SendStatus(res, InvalidArgument("the request body nests JSON deeper than max_json_depth (" +
                                    std::to_string(config_.max_json_depth) + ")"));
    return false;
  }
  *body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body->is_discarded() || !body->is_object()) {
    SendStatus(res, InvalidArgument("the request body must be a JSON object"));
    return false;
  }
  return true;
}

void OpenAiServer::Routes() {
  // httplib's default sets SO_REUSEPORT, which lets a second server silently share the port.
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  int threads = config_.num_threads;
  if (threads <= 0)
    threads = std::max(64, 2 * gateway_->config().engine.scheduler.max_num_seqs + 16);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(config_.max_request_body_bytes);
  // Runs before the body is read: the framing checks, then the key (/health stays open for
  // load balancers and probes). A request answered here leaves its body unread on the socket,
  // so its connection is closed after the response.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::optional<OpenAiError> refused =
        CheckRequestHead(req, config_.max_request_body_bytes);
    if (!refused && (req.path == "/health" || Authorized(req, res)))
      return httplib::Server::HandlerResponse::Unhandled;
    if (refused) SendError(res, *refused);
    const std::string length = req.get_header_value("Content-Length");
    if (!refused && (length.empty() || length == "0"))
      return httplib::Server::HandlerResponse::Handled;
    CloseAfterResponse(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Anything a handler throws becomes a 500 with a fixed message: exception texts name internals.
  http_->set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("HTTP {} {}: {}", req.method, Quote(req.path), what);
        OpenAiError e;
        e.http_status = 500;
        e.message = "internal error";
        SendError(res, e);
      });
  http_->set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Handled;
        OpenAiError e;
        e.http_status = res.status;
        if (res.status == 404) {
          e.message = "no route " + Quote(req.method) + " " + Quote(req.path);
        } else if (res.status == 413) {
          e.message = "request body exceeds max_request_body_bytes (" +
                      std::to_string(config_.max_request_body_bytes) + ")";
        } else {
          e.message = "HTTP error " + std::to_string(res.status);
        }
        SendError(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!gateway_->accepting()) {
      SendStatus(res, Unavailable("server is shutting down"));
      return;
    }
    res.status = 200;
  });
  http_->Get("/v1/models",
             [this](const httplib::Request&, httplib::Response& res) { Models(res); });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(req, res, /*chat=*/false);
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(req, res, /*chat=*/true);
  });
  http_->Post("/tokenize",
              [this](const httplib::Request& req, httplib::Response& res) { Tokenize(req, res); });
  http_->Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Detokenize(req, res);
  });
}

void OpenAiServer::Models(httplib::Response& res) const {
  const EngineCore& core = gateway_->core();
  json m = {{"id", config_.model_name},
            {"object", "model"},
            {"created", 0},
            {"owned_by", "llm-server"},
            {"root", core.config().model.model_dir},
            {"max_model_len", core.max_model_len()}};
  res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
}

void OpenAiServer::Generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  json body;
  if (!ParseBody(req, res, &body)) return;
  auto st = std::make_shared<Stream>();
  OpenAiRequest& r = st->request;
  std::string param;
  Status s;
  try {
    s = ParseOpenAiRequest(body, chat ? OpenAiEndpoint::kChat : OpenAiEndpoint::kCompletions, &r,
                           &param);
  } catch (const std::exception&) {  // nlohmann type errors on odd values; their text is internal
    s = InvalidArgument("a field of the request has a value of the wrong type");
  }
  if (!s.ok()) {
    SendStatus(res, s, param);
    return;
  }
  if (!r.model.empty() && r.model != config_.model_name) {
    OpenAiError e;
    e.http_status = 404;
    e.message = "the model '" + r.model + "' does not exist; this server serves '" +
                config_.model_name + "'";
    e.param = "model";
    e.code = "model_not_found";
    SendError(res, e);
    return;
  }
  if (chat) r.params.prompt = ChatPromptParams{r.messages, r.tools, r.add_generation_prompt};
  st->queue = std::make_shared<OutputQueue>();
  s = gateway_->Submit(r.params, std::nullopt, st->queue, &st->request_id);
  if (!s.ok()) {
    SendStatus(res, s, chat && s.code() == StatusCode::kFailedPrecondition ? "messages" : "");
    return;
  }
  st->id = (chat ? "chatcmpl-" : "cmpl-") + RandomHex();
  st->model = config_.model_name;
  st->created = std::time(nullptr);
  st->tokenizer = gateway_->core().tokenizer();

  auto gone = [this, st] {
    gateway_->Abort(st->request_id, Status(StatusCode::kCancelled, "client disconnected"));
    return false;
  };
  open_responses_.fetch_add(1);
  auto release = [this, st](bool success) {
    open_responses_.fetch_sub(1);
    if (!success && !st->finished) {
      gateway_->Abort(st->request_id, Status(StatusCode::kCancelled, "client disconnected"));
    }
  };
  if (!r.stream) {
    // Also a content provider (one chunk, at the end): only its sink can tell that the client
    // went away, and a request nobody waits for must not keep its KV blocks.
    res.set_chunked_content_provider(
        "application/json",
        [st, gone](size_t, httplib::DataSink& sink) {
          GenerationResult result;
          GenerationOutput out;
          while (!result.finished) {
            // Checked after every output too: outputs come every step, so a check only when
            // none came would never run.
            if (st->queue->Next(kDisconnectPoll, &out)) result.Add(std::move(out));
            if (!result.finished && !sink.is_writable()) return gone();
          }
          st->finished = true;
          const json body = result.error.ok() ? st->Whole(result)
                                              : OpenAiError::FromStatus(result.error).ToJson();
          const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
          if (!sink.write(text.data(), text.size())) return gone();
          sink.done();
          return true;
        },
        release);
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, gone](size_t, httplib::DataSink& sink) {
        if (!st->started && st->request.endpoint == OpenAiEndpoint::kChat) {
          st->started = true;  // OpenAI's first chat chunk names the role
          json first = st->Chunk("", {}, nullptr);
          first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
          const std::string ev = SseEvent(first);
          return sink.write(ev.data(), ev.size()) ? true : gone();
        }
        GenerationOutput out;
        while (!st->queue->Next(kDisconnectPoll, &out)) {
          if (!sink.is_writable()) return gone();
        }
        const std::string ev = st->Render(out);
        if (!sink.is_writable() || !sink.write(ev.data(), ev.size())) return gone();
        if (st->finished) sink.done();
        return true;
      },
      release);
}

void OpenAiServer::Tokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!ParseBody(req, res, &body)) return;
  const Tokenizer* tok = gateway_->core().tokenizer();
  if (body.contains("add_generation_prompt") && !body["add_generation_prompt"].is_boolean()) {
    SendStatus(res, InvalidArgument("'add_generation_prompt' must be a boolean"),
               "add_generation_prompt");
    return;
  }
  if (body.contains("tools") && !body["tools"].is_array() && !body["tools"].is_null()) {
    SendStatus(res, InvalidArgument("'tools' must be a list"), "tools");
    return;
  }
  if (tok == nullptr) {
    SendStatus(res, FailedPrecondition("the model has no tokenizer"));
    return;
  }
  std::string text;
  bool add_special = true;
  if (body.contains("messages")) {
    if (gateway_->chat() == nullptr) {
      SendStatus(res, FailedPrecondition("this server has no chat template engine yet"),
                 "messages");
      return;
    }
    auto rendered = gateway_->chat()->Render(body["messages"], body.value("tools", json()),
                                             body.value("add_generation_prompt", true));
    if (!rendered.ok()) {
      SendStatus(res, rendered.status(), "messages");
      return;
    }
    text = std::move(rendered).value();
    add_special = false;
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    text = body["prompt"].get<std::string>();
  } else {
    SendStatus(res, InvalidArgument("'prompt' (a string) or 'messages' is required"), "prompt");
    return;
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (k == "add_special_tokens") {
      if (!it->is_boolean()) {
        SendStatus(res, InvalidArgument("'add_special_tokens' must be a boolean"), k);
        return;
      }
      add_special = it->get<bool>();
    } else if (k != "prompt" && k != "messages" && k != "model" && k != "tools" &&
               k != "add_generation_prompt") {
      SendStatus(res, InvalidArgument("unsupported field '" + k + "'"), k);
      return;
    }
  }
  if (static_cast<int64_t>(text.size()) > gateway_->config().max_prompt_bytes) {
    SendStatus(res, InvalidArgument("text exceeds max_prompt_bytes"), "prompt");
    return;
  }
  const std::vector<int32_t> ids = tok->Encode(text, add_special);
  res.set_content(json{{"count", ids.size()},
                       {"max_model_len", gateway_->core().max_model_len()},
                       {"tokens", ids}}
                      .dump(),
                  "application/json");
}

void OpenAiServer::Detokenize(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!ParseBody(req, res, &body)) return;
  const Tokenizer* tok = gateway_->core().tokenizer();
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    SendStatus(res, InvalidArgument("'tokens' (a list of token ids) is required"), "tokens");
    return;
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "tokens" && it.key() != "model") {
      SendStatus(res, InvalidArgument("unsupported field '" + it.key() + "'"), it.key());
      return;
    }
  }
  const int vocab = gateway_->core().model_config().vocab_size;
  std::vector<int32_t> ids;
  for (const json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      SendStatus(
          res, InvalidArgument("token ids must be integers in [0, " + std::to_string(vocab) + ")"),
          "tokens");
      return;
    }
    ids.push_back(t.get<int32_t>());
  }
  if (tok == nullptr) {
    SendStatus(res, FailedPrecondition("the model has no tokenizer"));
    return;
  }
  res.set_content(json{{"prompt", tok->Decode(ids, /*skip_special_tokens=*/false)}}.dump(
                      -1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

StatusOr<int> OpenAiServer::Start() {
  if (!config_.tls_cert_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(config_.tls_cert_file.c_str(),
                                                    config_.tls_key_file.c_str());
    if (!ssl->is_valid()) {
      return InvalidArgument("cannot load TLS certificate " + config_.tls_cert_file + " / key " +
                             config_.tls_key_file);
    }
    http_ = std::move(ssl);
  } else {
    http_ = std::make_unique<httplib::Server>();
  }
  Routes();
  StatusOr<int> port = ListenHttp(http_.get(), config_.address, "http_address", &thread_);
  if (port.ok()) port_ = port.value();
  return port;
}

void OpenAiServer::Stop() {
  if (!thread_.joinable()) return;
  const auto drain_end = std::chrono::steady_clock::now() + kDrainLimit;
  while (open_responses_.load() > 0 && std::chrono::steady_clock::now() < drain_end) {
    std::this_thread::sleep_for(kDisconnectPoll);
  }
  // Idle keep-alive and slow clients would otherwise hold their pool threads, and stop() joins
  // them.
  const int closed = ShutdownConnections(port_);
  if (closed > 0) spdlog::info("HTTP: closed {} open connections", closed);
  http_->stop();
  thread_.join();
}

}  // namespace llm
