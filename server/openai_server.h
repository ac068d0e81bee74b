// The OpenAI-compatible HTTP front end: /v1/models, /v1/completions, /v1/chat/completions (SSE
// streaming or one JSON body), /tokenize, /detokenize, /health, on Http1Server (Boost.Beast,
// server/http1_server.h), which holds the connection-level limits.
//
// Threads: the io threads parse, check the API key and submit through the RequestGateway; no
// thread waits for a request's outputs. The engine thread hands each output to the request's
// ReplySink, which renders it and queues it on the connection; a client that goes away aborts its
// request (Http1Reply::OnGone).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "base/status.h"
#include "server/api_keys.h"
#include "server/chat_renderer.h"
#include "server/http1_server.h"
#include "server/request_gateway.h"

namespace llm {

struct OpenAiServerConfig {
  std::string address = "127.0.0.1:8000";  // host:port; port 0 picks a free one
  std::string tls_cert_file;               // both set: HTTPS
  std::string tls_key_file;
  size_t max_request_body_bytes = 8 << 20;
  int max_json_depth = 64;  // request bodies nested deeper get 400
  int max_connections = 16384;
  int max_connections_per_address = 4096;
  int num_threads = 0;  // io threads; 0: Http1Limits::io_threads
  std::string model_name;
};

class OpenAiServer {
 public:
  // Chat prompts render through the gateway's ChatRenderer, as on gRPC.
  OpenAiServer(RequestGateway* gateway, const ApiKeys* keys, OpenAiServerConfig config);
  ~OpenAiServer();

  StatusOr<int> Start();  // returns the bound port
  void Stop();

 private:
  using Reply = std::shared_ptr<Http1Reply>;
  void Handle(const Http1Request& req, const Reply& reply);
  bool Authorized(const Http1Request& req, const Reply& reply) const;
  // `responses`: a /v1/responses body, served as the chat request it means.
  void Generate(const Http1Request& req, const Reply& reply, bool chat, bool responses = false);
  void Tokenize(const Http1Request& req, const Reply& reply);
  void Detokenize(const Http1Request& req, const Reply& reply);
  void Models(const Reply& reply) const;
  // GET /v1/models/{id}: the served model's object, or OpenAI's 404 for any other id.
  void Model(std::string_view id, const Reply& reply) const;
  nlohmann::ordered_json ModelObject() const;
  // Parses a JSON object body within max_json_depth; false after sending the error.
  bool ParseBody(const Http1Request& req, const Reply& reply, nlohmann::ordered_json* body) const;

  RequestGateway* gateway_;
  const ApiKeys* keys_;
  OpenAiServerConfig config_;
  std::unique_ptr<Http1Server> http_;
  std::atomic<int> open_responses_{0};  // generation responses not yet finished
};

}  // namespace llm
