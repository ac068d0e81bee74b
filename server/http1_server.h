// An event-driven HTTP/1.1 server on Boost.Beast (asio): the connection layer chosen for the
// OpenAI front end in docs/design/HTTP_FRONT_END.md. A few io threads serve every
// connection; no thread waits on a client. Each connection reads one request at a time, so
// pipelined requests are answered in order, and holds these limits while reading:
//   - a deadline for the whole request head and one for the body, an idle timeout between
//     requests;
//   - the head's size (Beast's header_limit, counted as bytes arrive) and the body's size
//     (body_limit: Content-Length and decoded chunked bytes alike);
//   - ambiguous framing (Transfer-Encoding with Content-Length, several Content-Lengths) and
//     Content-Encoding are refused, and the connection closed;
//   - a cap on open connections, in total and per client address.
// Header values reach the handler as sent (no decoding).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace llm {

struct Http1Limits {
  std::chrono::milliseconds head_deadline{10000};  // the whole request head
  std::chrono::milliseconds body_deadline{60000};  // the whole body, after the head
  std::chrono::milliseconds idle_timeout{60000};   // between requests on a connection
  size_t max_head_bytes = 16 << 10;
  size_t max_body_bytes = 8 << 20;
  int max_connections = 16384;
  int max_connections_per_address = 4096;
  int io_threads = 2;
};

struct Http1Request {
  std::string method;
  std::string target;  // as sent: not percent-decoded
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string peer;  // client address

  // The first value of `name` (case-insensitive), or "".
  std::string_view Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
};

// How a handler answers. Thread-safe: the engine thread may call Stream/Finish. Exactly one of
// Respond or Begin (then Stream..., Finish) per request.
class Http1Reply {
 public:
  virtual ~Http1Reply() = default;
  virtual void Respond(int status, std::string content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void Begin(int status, std::string content_type,
                     std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void Stream(std::string data) = 0;  // one chunk of a chunked body
  virtual void Finish() = 0;
  // Runs once, on an io thread, if the client goes away before Finish/Respond is written.
  virtual void OnGone(std::function<void()> fn) = 0;
};

// Errors the server itself answers (limits, framing) carry a body made by this function.
using Http1ErrorBody = std::function<std::string(int status, const std::string& message)>;
using Http1Handler = std::function<void(Http1Request, std::shared_ptr<Http1Reply>)>;

class Http1Server {
 public:
  Http1Server(Http1Limits limits, Http1Handler handler, Http1ErrorBody error_body);
  ~Http1Server();

  // "host:port" (port 0: any); with cert and key files, TLS. Returns the bound port.
  StatusOr<int> Start(const std::string& address, const std::string& tls_cert_file,
                      const std::string& tls_key_file);
  // Closes the listener and every connection, then joins the io threads.
  void Stop();

  int open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm
