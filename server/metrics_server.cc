#include "server/metrics_server.h"

#include <httplib.h>

namespace llm {

MetricsServer::MetricsServer(std::shared_ptr<EngineMetrics> metrics)
    : metrics_(std::move(metrics)), http_(std::make_unique<httplib::Server>()) {
  // httplib's default sets SO_REUSEPORT, which lets a second server silently share the port.
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(), "text/plain; version=0.0.4");
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
}

MetricsServer::~MetricsServer() {
  Stop();
}

StatusOr<int> MetricsServer::Start(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("metrics_address must be host:port");
  const std::string host = address.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    return InvalidArgument("metrics_address has a bad port: " + address);
  }
  if (port == 0) {
    port = http_->bind_to_any_port(host);
  } else if (!http_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) return Unavailable("cannot bind metrics endpoint to " + address);
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return port;
}

void MetricsServer::Stop() {
  if (thread_.joinable()) {
    http_->stop();
    thread_.join();
  }
}

}  // namespace llm
