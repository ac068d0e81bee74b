#include "server/metrics_server.h"

#include <httplib.h>

#include "server/http_listen.h"

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
  return ListenHttp(http_.get(), address, "metrics_address", &thread_);
}

void MetricsServer::Stop() {
  if (thread_.joinable()) {
    http_->stop();
    thread_.join();
  }
}

}  // namespace llm
