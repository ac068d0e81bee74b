// llm-healthcheck: exits 0 when the server's grpc.health.v1 service answers SERVING.
// Used by the Docker HEALTHCHECK (the runtime image carries no grpcurl).
//   llm-healthcheck [host:port] [timeout_ms]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"

int main(int argc, char** argv) {
  const std::string target = argc > 1 ? argv[1] : "127.0.0.1:50051";
  const int timeout_ms = argc > 2 ? std::atoi(argv[2]) : 2000;
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) {
    std::fprintf(stderr, "health check failed: %s\n", st.error_message().c_str());
    return 1;
  }
  const bool serving = resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
  return serving ? 0 : 1;
}
