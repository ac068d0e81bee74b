// The OpenAI-compatible HTTP front end (cpp-httplib): /v1/models, /v1/completions,
// /v1/chat/completions (SSE streaming or one JSON body), /tokenize, /detokenize, /health.
//
// Threads: httplib accepts on the listener thread (Start) and runs each connection's handlers on
// a pool thread. A handler parses, checks the API key, submits through the RequestGateway and then
// waits on its request's OutputQueue, writing each engine output as it arrives; the engine thread
// only appends to that queue. A client that goes away is noticed at the next output (or within
// kDisconnectPoll while none comes) and its request aborted.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "engine/base/status.h"
#include "server/api_keys.h"
#include "server/chat_renderer.h"
#include "server/request_gateway.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace llm {

struct OpenAiServerConfig {
  std::string address = "127.0.0.1:8000";  // host:port; port 0 picks a free one
  std::string tls_cert_file;               // both set: HTTPS
  std::string tls_key_file;
  size_t max_request_body_bytes = 8 << 20;
  int max_json_depth = 64;  // request bodies nested deeper get 400
  int num_threads = 0;      // handler threads (one per open request); 0: from max_num_seqs + queue
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
  void Routes();
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;
  void Generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void Tokenize(const httplib::Request& req, httplib::Response& res);
  void Detokenize(const httplib::Request& req, httplib::Response& res);
  void Models(httplib::Response& res) const;
  // Parses a JSON object body within max_json_depth; false after sending the error.
  bool ParseBody(const httplib::Request& req, httplib::Response& res,
                 nlohmann::ordered_json* body) const;

  RequestGateway* gateway_;
  const ApiKeys* keys_;
  OpenAiServerConfig config_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> open_responses_{0};  // generation responses whose provider is not released
};

}  // namespace llm
