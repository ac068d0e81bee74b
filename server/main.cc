// llm-server: loads a Hugging Face model directory and serves it over gRPC.
#include <csignal>
#include <cstdio>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "engine/engine.h"
#include "server/generation_service.h"
#include "server/metrics_server.h"
#include "server/server_config.h"

namespace {

std::string StartupTable(const llm::ServerConfig& sc, const llm::EngineCore& core) {
  const llm::ModelConfig& mc = core.model_config();
  const llm::Model& m = core.model();
  const llm::ModelLoadOptions& mo = sc.engine.model;
  const std::string kv = m.kv_cache_dtype_name() != "float32" ? m.kv_cache_dtype_name()
                         : mo.kv_cache_dtype == "auto"        ? std::string("float32")
                         : mo.kv_cache_dtype == "fp8_e4m3_dynamic"
                             ? mo.kv_cache_dtype
                             : mo.kv_cache_dtype + " " + mo.kv_scale_granularity;
  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "\n  | model              | %s (%s)\n"
                "  | layers/hidden      | %d / %d, heads %d q / %d kv, head_dim %d, vocab %d\n"
                "  | weights dtype      | %s on disk, device %s\n"
                "  | attention backend  | %s\n"
                "  | KV cache           | %s, %d blocks x %d tokens = %d tokens, %.1f MiB\n"
                "  | context / max_tokens | %d / %d\n"
                "  | scheduler          | max_num_seqs %d, max_batched_tokens %d\n"
                "  | sampling defaults  | %s\n"
                "  | listen             | %s",
                mc.name.c_str(), mc.architecture_name.c_str(), mc.num_layers, mc.hidden_size,
                mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size,
                llm::DTypeName(mc.dtype), mo.device.c_str(), m.attention_backend_name().c_str(),
                kv.c_str(), core.num_blocks(), mo.block_size, core.num_blocks() * mo.block_size,
                static_cast<double>(m.kv_bytes_per_block()) * core.num_blocks() / (1 << 20),
                core.max_model_len(), sc.engine.max_tokens_limit, sc.engine.scheduler.max_num_seqs,
                sc.engine.scheduler.max_batched_tokens, mc.generation.Describe().c_str(),
                sc.listen_address.c_str());
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  // Block the shutdown signals in every thread; one thread waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  llm::CommandLine cl = llm::ParseCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  std::fputs(cl.out.c_str(), stdout);
  std::fputs(cl.err.c_str(), stderr);
  if (!cl.config) return cl.exit_code;
  llm::ServerConfig& sc = *cl.config;
  spdlog::set_level(spdlog::level::from_str(sc.log_level));
  // "auto" picks the device here; options that cannot apply to it are refused before loading.
  sc.engine.model.device = llm::ResolveDevice(sc.engine.model.device);
  if (llm::Status st = llm::CheckOptionsApply(sc, sc.engine.model.device); !st.ok()) {
    std::fprintf(stderr, "llm-server: %s\n", st.message().c_str());
    return 2;
  }

  auto core_or = llm::EngineCore::Create(sc.engine);
  if (!core_or.ok()) {
    spdlog::critical("cannot load model from {}: {}", sc.engine.model.model_dir,
                     core_or.status().ToString());
    return 1;
  }
  llm::Engine engine(std::move(core_or).value());
  spdlog::info("startup:{}", StartupTable(sc, engine.core()));
  engine.Start();

  llm::GenerationService service(&engine, sc);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(sc.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(sc.max_prompt_bytes + (1 << 20));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::critical("cannot listen on {}", sc.listen_address);
    return 1;
  }
  llm::MetricsServer metrics(engine.core().metrics());
  if (sc.metrics_address != "off") {
    auto mport = metrics.Start(sc.metrics_address);
    if (!mport.ok()) {
      spdlog::critical("{}", mport.status().ToString());
      return 1;
    }
    spdlog::info("metrics on http://{}/metrics (port {})", sc.metrics_address, mport.value());
    std::printf("METRICS_LISTENING %d\n", mport.value());
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("serving on {} (port {})", sc.listen_address, port);
  std::printf("LISTENING %d\n", port);  // machine-readable, for tests and scripts
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  server->GetHealthCheckService()->SetServingStatus(false);
  service.StopAccepting();
  spdlog::info("stopped accepting requests");  // tests wait for this line, not for a time
  // In-flight requests get a grace period to finish; then the engine aborts what remains, which
  // gives every accepted request exactly one final status before the server closes.
  const auto grace_end =
      std::chrono::steady_clock::now() + std::chrono::seconds(sc.shutdown_grace_s);
  while (engine.num_active() > 0 && std::chrono::steady_clock::now() < grace_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  engine.Stop();
  service.FlushWrites();
  metrics.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  spdlog::info("bye");
  return 0;
}
