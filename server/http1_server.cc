#include "server/http1_server.h"

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/http.hpp>

namespace llm {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

// A stalled client write (a reader that stopped reading) ends its connection after this.
constexpr std::chrono::seconds kWriteTimeout(30);
// After the last response, what the client still sends is read and dropped for at most this
// long before the socket closes (nginx's lingering close): closing with unread input resets the
// connection, and the client could lose the response (a 413 or 415 sent before its body).
constexpr std::chrono::seconds kLingerTime(2);
constexpr size_t kLingerBytes = 1 << 20;
// Bytes read ahead of the request being served (pipelined requests) before reading pauses.
constexpr size_t kReadAhead = 64 << 10;

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

std::string_view SV(boost::beast::string_view s) {
  return {s.data(), s.size()};
}

bool AllDigits(std::string_view s) {
  if (s.empty() || s.size() > 18) return false;  // 18 digits cannot overflow uint64
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool MayHaveBody(std::string_view method) {
  return method == "POST" || method == "PUT" || method == "PATCH";
}

std::string Reason(int status) {
  return std::string(SV(http::obsolete_reason(static_cast<http::status>(status))));
}

}  // namespace

std::string_view Http1Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return v;
  }
  return {};
}

bool Http1Request::HasHeader(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return true;
  }
  return false;
}

// State one connection shares between its reader, its serving coroutine, its watchdog and the
// replies it hands out (which the engine thread may hold after the connection is gone). All of
// it but `mu`'s fields is touched on the connection's strand only.
struct Conn : std::enable_shared_from_this<Conn> {
  explicit Conn(asio::strand<asio::io_context::executor_type> s)
      : strand(s), wake(s), reader_wake(s), deadline(s) {
    wake.expires_at(Clock::time_point::max());
    reader_wake.expires_at(Clock::time_point::max());
    deadline.expires_at(Clock::time_point::max());
  }
  asio::strand<asio::io_context::executor_type> strand;
  asio::steady_timer wake;         // cancelled when there is something to serve
  asio::steady_timer reader_wake;  // cancelled when the reader may read ahead again
  asio::steady_timer deadline;     // the watchdog closes the connection when it passes
  std::string in;                  // bytes read, not yet parsed
  bool eof = false;                // the client closed or reset its side
  bool draining = false;           // lingering close: input is dropped
  size_t drained = 0;
  bool busy = false;      // writing a response
  bool stopping = false;  // the server stops: end after the response being written
  bool closed = false;
  std::function<void()> close_socket;

  std::mutex mu;  // the reply's output, written by any thread
  std::deque<std::string> out;
  bool finished = false;

  void Notify() {
    asio::post(strand, [self = shared_from_this()] { self->wake.cancel(); });
  }
  void SetDeadline(Clock::duration d) { deadline.expires_after(d); }
  void NoDeadline() { deadline.expires_at(Clock::time_point::max()); }
};

class ReplyImpl final : public Http1Reply {
 public:
  explicit ReplyImpl(std::shared_ptr<Conn> c) : conn_(std::move(c)) {}

  void Respond(int status, std::string content_type, std::string body, Headers headers) override {
    std::string head = Head(status, content_type, headers);
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    Push(head + body, true);
  }
  void Begin(int status, std::string content_type, Headers headers) override {
    Push(Head(status, content_type, headers) + "Transfer-Encoding: chunked\r\n\r\n", false);
  }
  void Stream(std::string data) override {
    if (data.empty()) return;
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    Push(size + data + "\r\n", false);
  }
  void Finish() override { Push("0\r\n\r\n", true); }
  void OnGone(std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(gone_mu_);
    gone_ = std::move(fn);
  }
  void Gone() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> l(gone_mu_);
      fn = std::move(gone_);
    }
    if (fn) fn();
  }
  bool close_after = false;  // set by the server for its own error replies

 private:
  std::string Head(int status, const std::string& content_type, const Headers& headers) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
    if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
    for (const auto& [k, v] : headers) h += k + ": " + v + "\r\n";
    if (close_after) h += "Connection: close\r\n";
    return h;
  }
  void Push(std::string s, bool last) {
    {
      std::lock_guard<std::mutex> l(conn_->mu);
      if (conn_->finished) return;
      conn_->out.push_back(std::move(s));
      conn_->finished = last;
    }
    conn_->Notify();
  }
  std::shared_ptr<Conn> conn_;
  std::mutex gone_mu_;
  std::function<void()> gone_;
};

struct Http1Server::Impl {
  Http1Limits limits;
  Http1Handler handler;
  Http1ErrorBody error_body;
  std::unique_ptr<asio::io_context> ioc;
  std::optional<asio::ssl::context> ssl;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::map<std::string, int> per_address;
  std::atomic<int> total{0};
  std::mutex conns_mu;
  std::vector<std::weak_ptr<Conn>> conns;

  asio::awaitable<void> Accept();
  template <typename Stream>
  asio::awaitable<void> Serve(std::shared_ptr<Stream> stream, std::shared_ptr<Conn> c,
                              std::string peer);
  template <typename Stream>
  asio::awaitable<void> Read(std::shared_ptr<Stream> stream, std::shared_ptr<Conn> c);
  asio::awaitable<void> Watch(std::shared_ptr<Conn> c);
  // Drops input until the client closes, or kLingerTime passes (the watchdog then closes).
  asio::awaitable<void> Linger(Conn& c);
  // Waits until `t` is cancelled (never expires: its expiry is the end of time).
  asio::awaitable<void> Wait(asio::steady_timer& t);
};

asio::awaitable<void> Http1Server::Impl::Wait(asio::steady_timer& t) {
  boost::system::error_code ec;
  co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

asio::awaitable<void> Http1Server::Impl::Linger(Conn& c) {
  if (c.stopping) co_return;
  c.draining = true;
  c.in.clear();
  c.reader_wake.cancel();
  c.SetDeadline(kLingerTime);
  while (!c.eof && !c.closed) co_await Wait(c.wake);
}

asio::awaitable<void> Http1Server::Impl::Watch(std::shared_ptr<Conn> c) {
  while (!c->closed) {
    boost::system::error_code ec;
    co_await c->deadline.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (c->closed) break;
    if (c->deadline.expiry() <= Clock::now()) {
      c->close_socket();
      c->closed = true;
      c->wake.cancel();
      c->reader_wake.cancel();
    }
  }
}

template <typename Stream>
asio::awaitable<void> Http1Server::Impl::Read(std::shared_ptr<Stream> stream,
                                              std::shared_ptr<Conn> c) {
  char buf[4096];  // in the coroutine frame: per connection, so kept small
  while (!c->closed) {
    if (c->in.size() >= kReadAhead + limits.max_head_bytes) {
      co_await Wait(c->reader_wake);  // the server catches up first
      continue;
    }
    boost::system::error_code ec;
    const size_t n = co_await stream->async_read_some(
        asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
    if (!c->draining) {
      c->in.append(buf, n);
    } else if ((c->drained += n) > kLingerBytes) {
      break;
    }
    c->wake.cancel();
  }
  c->eof = true;
  c->wake.cancel();
}

template <typename Stream>
asio::awaitable<void> Http1Server::Impl::Serve(std::shared_ptr<Stream> stream,
                                               std::shared_ptr<Conn> c, std::string peer) {
  auto write = [&](const std::string& s) -> asio::awaitable<bool> {
    c->SetDeadline(kWriteTimeout);
    boost::system::error_code ec;
    co_await asio::async_write(*stream, asio::buffer(s),
                               asio::redirect_error(asio::use_awaitable, ec));
    c->NoDeadline();
    co_return !ec && !c->closed;
  };
  auto refuse = [&](int status, const std::string& message) -> asio::awaitable<void> {
    const std::string body = error_body(status, message);
    std::string r =
        "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    co_await write(r);
  };
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(limits.max_head_bytes));
    parser.body_limit(limits.max_body_bytes);
    c->SetDeadline(limits.idle_timeout);
    bool head_started = false;
    bool checked = false;
    boost::system::error_code ec;
    while (!parser.is_done()) {
      if (!c->in.empty()) {
        if (!head_started) {
          head_started = true;
          c->SetDeadline(limits.head_deadline);
        }
        const size_t n = parser.put(asio::buffer(c->in), ec);
        c->in.erase(0, n);
        if (n > 0) c->reader_wake.cancel();
        if (ec == http::error::need_more) {
          ec = {};
        } else if (ec) {
          break;
        }
        if (parser.is_header_done() && !checked) {
          checked = true;
          const auto& h = parser.get();
          const size_t lengths = h.count(http::field::content_length);
          if (h.count(http::field::transfer_encoding) > 0 && lengths > 0) {
            co_await refuse(400,
                            "a request must not carry both Transfer-Encoding and "
                            "Content-Length");
            co_return;
          }
          if (lengths > 1 || (lengths == 1 && !AllDigits(SV(h[http::field::content_length])))) {
            co_await refuse(400, "a request must carry one Content-Length, a decimal number");
            co_return;
          }
          const bool chunked = h.count(http::field::transfer_encoding) > 0;
          if (chunked && !IEquals(SV(h[http::field::transfer_encoding]), "chunked")) {
            co_await refuse(501, "the only Transfer-Encoding supported on requests is 'chunked'");
            co_return;
          }
          // Without either, RFC 9112 reads no body; a client that sends one anyway is told.
          if (!chunked && lengths == 0 && MayHaveBody(SV(h.method_string()))) {
            co_await refuse(411, "a " + std::string(SV(h.method_string())) +
                                     " request must carry Content-Length or be chunked");
            co_return;
          }
          if (h.count(http::field::content_encoding) > 0 &&
              !IEquals(SV(h[http::field::content_encoding]), "identity")) {
            co_await refuse(415,
                            "Content-Encoding is not supported on requests; send the body "
                            "as is");
            co_return;
          }
          if (parser.content_length() && *parser.content_length() > limits.max_body_bytes) {
            co_await refuse(413, "request body exceeds max_request_body_bytes (" +
                                     std::to_string(limits.max_body_bytes) + ")");
            co_return;
          }
          c->SetDeadline(limits.body_deadline);
          if (IEquals(SV(h[http::field::expect]), "100-continue") && !parser.is_done()) {
            if (!co_await write("HTTP/1.1 100 Continue\r\n\r\n")) co_return;
            c->SetDeadline(limits.body_deadline);
          }
        }
        if (parser.is_done()) break;
        if (!c->in.empty() && n > 0) continue;
      }
      if (c->eof || c->closed) co_return;
      co_await Wait(c->wake);
    }
    if (ec) {
      if (ec == http::error::header_limit) {
        co_await refuse(
            431, "the request head exceeds " + std::to_string(limits.max_head_bytes) + " bytes");
      } else if (ec == http::error::body_limit) {
        co_await refuse(413, "request body exceeds max_request_body_bytes (" +
                                 std::to_string(limits.max_body_bytes) + ")");
      } else {
        co_await refuse(400, "malformed HTTP/1.1 request");
      }
      co_return;
    }
    c->NoDeadline();
    auto& msg = parser.get();
    Http1Request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    for (const auto& f : msg) req.headers.emplace_back(f.name_string(), f.value());
    req.body = std::move(msg.body());
    req.peer = peer;
    const bool keep_alive = msg.keep_alive();
    {
      std::lock_guard<std::mutex> l(c->mu);
      c->out.clear();
      c->finished = false;
    }
    auto reply = std::make_shared<ReplyImpl>(c);
    try {
      handler(std::move(req), reply);
    } catch (const std::exception& e) {
      spdlog::error("HTTP handler: {}", e.what());
      reply->Respond(500, "application/json", error_body(500, "internal error"), {});
    }
    c->busy = true;
    // Write what the reply produces until it finishes; a client that leaves ends it. The state
    // is looked at again after every write (a suspension: output and its wake-up may come
    // meanwhile), and the wait follows a look with no suspension between, so no wake-up is lost.
    for (;;) {
      std::deque<std::string> out;
      bool finished = false;
      {
        std::lock_guard<std::mutex> l(c->mu);
        out.swap(c->out);
        finished = c->finished;
      }
      if (!out.empty()) {
        for (const std::string& s : out) {
          if (!co_await write(s)) {
            reply->Gone();
            co_return;
          }
        }
        continue;
      }
      if (finished) break;
      if (c->closed || (c->eof && c->in.empty())) {
        reply->Gone();
        co_return;
      }
      co_await Wait(c->wake);
    }
    c->busy = false;
    if (!keep_alive || c->stopping) co_return;
  }
}

asio::awaitable<void> Http1Server::Impl::Accept() {
  for (;;) {
    boost::system::error_code ec;
    auto strand = asio::make_strand(*ioc);
    tcp::socket sock =
        co_await acceptor->async_accept(strand, asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;
    if (ec) {  // out of descriptors, say: pause rather than spin on the ready listener
      asio::steady_timer pause(*ioc, std::chrono::milliseconds(10));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    std::string peer = sock.remote_endpoint(ec).address().to_string();
    if (ec) continue;
    {
      std::lock_guard<std::mutex> l(mu);
      int& mine = per_address[peer];
      if (total.load() >= limits.max_connections || mine >= limits.max_connections_per_address) {
        sock.close(ec);  // over the cap: closed before a byte is read
        if (mine == 0) per_address.erase(peer);
        continue;
      }
      ++mine;
      ++total;
    }
    auto c = std::make_shared<Conn>(strand);
    {
      std::lock_guard<std::mutex> l(conns_mu);
      std::erase_if(conns, [](const std::weak_ptr<Conn>& w) { return w.expired(); });
      conns.push_back(c);
    }
    auto release = [this, peer](std::exception_ptr) {
      std::lock_guard<std::mutex> l(mu);
      if (--per_address[peer] == 0) per_address.erase(peer);
      --total;
    };
    if (ssl) {
      auto s = std::make_shared<asio::ssl::stream<tcp::socket>>(std::move(sock), *ssl);
      c->close_socket = [s] {
        boost::system::error_code e;
        s->lowest_layer().close(e);
      };
      asio::co_spawn(
          c->strand,
          [this, s, c, peer]() -> asio::awaitable<void> {
            asio::co_spawn(c->strand, Watch(c), asio::detached);
            c->SetDeadline(limits.head_deadline);
            boost::system::error_code e;
            co_await s->async_handshake(asio::ssl::stream_base::server,
                                        asio::redirect_error(asio::use_awaitable, e));
            if (!e) {
              asio::co_spawn(c->strand, Read(s, c), asio::detached);
              co_await Serve(s, c, peer);
              co_await Linger(*c);
            }
            c->closed = true;
            c->close_socket();
            c->deadline.cancel();
          },
          release);
    } else {
      auto s = std::make_shared<tcp::socket>(std::move(sock));
      c->close_socket = [s] {
        boost::system::error_code e;
        s->close(e);
      };
      asio::co_spawn(
          c->strand,
          [this, s, c, peer]() -> asio::awaitable<void> {
            asio::co_spawn(c->strand, Watch(c), asio::detached);
            asio::co_spawn(c->strand, Read(s, c), asio::detached);
            co_await Serve(s, c, peer);
            // Lingering close: stop sending, let the client read the response, then close.
            boost::system::error_code e;
            s->shutdown(tcp::socket::shutdown_send, e);
            co_await Linger(*c);
            c->closed = true;
            c->close_socket();
            c->deadline.cancel();
          },
          release);
    }
  }
}

Http1Server::Http1Server(Http1Limits limits, Http1Handler handler, Http1ErrorBody error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
}

Http1Server::~Http1Server() {
  Stop();
}

int Http1Server::open_connections() const {
  return impl_->total.load();
}

StatusOr<int> Http1Server::Start(const std::string& address, const std::string& tls_cert_file,
                                 const std::string& tls_key_file) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("http_address must be host:port");
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || port < 0 || port > 65535) throw std::out_of_range("");
  } catch (const std::exception&) {
    return InvalidArgument("http_address has a bad port: " + address);
  }
  Impl& m = *impl_;
  m.ioc = std::make_unique<asio::io_context>(m.limits.io_threads);
  if (!tls_cert_file.empty()) {
    m.ssl.emplace(asio::ssl::context::tls_server);
    boost::system::error_code ec;
    m.ssl->use_certificate_chain_file(tls_cert_file, ec);
    if (!ec) m.ssl->use_private_key_file(tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return InvalidArgument("cannot load TLS certificate " + tls_cert_file + " / key " +
                             tls_key_file);
    }
  }
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(address.substr(0, colon), ec);
  if (ec) return InvalidArgument("http_address has a bad host: " + address);
  m.acceptor = std::make_unique<tcp::acceptor>(*m.ioc);
  const tcp::endpoint ep(addr, static_cast<uint16_t>(port));
  m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  if (!ec) m.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot bind http_address " + address + ": " + ec.message());
  const int bound = m.acceptor->local_endpoint().port();
  asio::co_spawn(*m.ioc, m.Accept(), asio::detached);
  for (int i = 0; i < m.limits.io_threads; ++i) {
    m.threads.emplace_back([&m] { m.ioc->run(); });
  }
  return bound;
}

void Http1Server::Stop() {
  Impl& m = *impl_;
  if (m.threads.empty()) return;
  asio::post(*m.ioc, [&m] {
    boost::system::error_code ec;
    m.acceptor->close(ec);
    std::lock_guard<std::mutex> l(m.conns_mu);
    for (auto& w : m.conns) {
      if (auto c = w.lock()) {
        asio::post(c->strand, [c] {
          c->stopping = true;
          if (c->busy) {  // its response (a stream's last events) goes out first
            c->wake.cancel();
            return;
          }
          c->closed = true;
          c->close_socket();
          c->wake.cancel();
          c->reader_wake.cancel();
          c->deadline.cancel();
        });
      }
    }
  });
  // The connections' coroutines end on their own once their sockets are closed.
  const auto end = Clock::now() + std::chrono::seconds(2);
  while (m.total.load() > 0 && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  m.ioc->stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  m.acceptor.reset();
  m.ioc.reset();
}

}  // namespace llm
