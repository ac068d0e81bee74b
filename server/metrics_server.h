// Serves Prometheus text at GET /metrics (and GET /health) over HTTP on its own thread.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "base/status.h"
#include "engine/metrics.h"

namespace httplib {
class Server;
}

namespace llm {

class MetricsServer {
 public:
  explicit MetricsServer(std::shared_ptr<EngineMetrics> metrics);
  ~MetricsServer();

  // address is host:port; port 0 picks a free one. Returns the bound port.
  StatusOr<int> Start(const std::string& address);
  void Stop();

 private:
  std::shared_ptr<EngineMetrics> metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
};

}  // namespace llm
