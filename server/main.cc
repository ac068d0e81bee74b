// llm-server: loads a Hugging Face model directory and serves it over gRPC and the OpenAI HTTP
// API.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "engine/engine.h"
#include "server/api_keys.h"
#include "server/generation_service.h"
#include "server/metrics_server.h"
#include "server/openai_server.h"
#include "server/request_gateway.h"
#include "server/server_config.h"
#include "server/template_chat_renderer.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string StartupTable(const llm::ServerConfig& sc, const llm::EngineCore& core) {
  const llm::ModelConfig& mc = core.model_config();
  const llm::Model& m = core.model();
  const llm::ModelLoadOptions& mo = sc.engine.model;
  const std::string kv = m.kv_cache_dtype_name() != "float32" ? m.kv_cache_dtype_name()
                         : mo.kv_cache_dtype == "auto"        ? std::string("float32")
                         : mo.kv_cache_dtype == "fp8_e4m3_dynamic"
                             ? mo.kv_cache_dtype
                             : mo.kv_cache_dtype + " " + mo.kv_scale_granularity;
  // What the weights are: the checkpoint's dtype (or random ones of it) and what the device holds
  // when --weight-dtype asks for something else.
  std::string weights = std::string(llm::DTypeName(mc.dtype)) +
                        (mo.dummy_weights ? " (dummy: random)" : " on disk") + ", device " +
                        mo.device;
  if (mo.weight_dtype != "auto") weights += ", --weight-dtype " + mo.weight_dtype;
  if (mo.moe_weight_dtype != "auto") weights += ", --moe-weight-dtype " + mo.moe_weight_dtype;
  if (mo.moe_activation_dtype != "bf16") {
    weights += ", --moe-activation-dtype " + mo.moe_activation_dtype;
  }
  const llm::SpeculativeConfig& spec = sc.engine.speculative;
  // The draft model's K/V shares the target's blocks: its own bytes beside the target's.
  std::string draft;
  if (const llm::Model* d = core.draft_model()) {
    char b[256];
    std::snprintf(b, sizeof(b), ", %d layers, its KV %.1f MiB (%s, %s) in the same blocks",
                  d->config().num_layers,
                  static_cast<double>(d->kv_bytes_per_block()) * core.num_blocks() / (1 << 20),
                  d->kv_cache_dtype_name().c_str(), d->attention_backend_name().c_str());
    draft = b;
  }
  const std::string speculative =
      spec.method == "ngram"
          ? "ngram, " + std::to_string(spec.num_speculative_tokens) + " tokens, suffix " +
                std::to_string(spec.ngram_prompt_lookup_min) + ".." +
                std::to_string(spec.ngram_prompt_lookup_max)
      : spec.method == "draft" ? "draft model " + spec.draft_model_dir + ", " +
                                     std::to_string(spec.num_speculative_tokens) + " tokens" + draft
                               : spec.method;
  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "\n  | model              | %s (%s)\n"
                "  | layers/hidden      | %d / %d, heads %d q / %d kv, head_dim %d, vocab %d\n"
                "  | weights dtype      | %s\n"
                "  | attention backend  | %s\n"
                "  | KV cache           | %s, %d blocks x %d tokens = %d tokens, %.1f MiB\n"
                "  | context / max_tokens | %d / %d\n"
                "  | scheduler          | max_num_seqs %d, max_batched_tokens %d\n"
                "  | speculative        | %s\n"
                "  | sampling defaults  | %s\n"
                "  | listen             | %s",
                mc.name.c_str(), mc.architecture_name.c_str(), mc.num_layers, mc.hidden_size,
                mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.vocab_size, weights.c_str(),
                m.attention_backend_name().c_str(), kv.c_str(), core.num_blocks(), mo.block_size,
                core.num_blocks() * mo.block_size,
                static_cast<double>(m.kv_bytes_per_block()) * core.num_blocks() / (1 << 20),
                core.max_model_len(), sc.engine.max_tokens_limit, sc.engine.scheduler.max_num_seqs,
                sc.engine.scheduler.max_batched_tokens, speculative.c_str(),
                mc.generation.Describe().c_str(), sc.listen_address.c_str());
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
  const llm::FrontEndOptions& fe = sc.front_end;
  std::vector<std::string> key_list;
  if (!fe.api_key.empty()) key_list.push_back(fe.api_key);
  auto keys_or = llm::ApiKeys::Load(key_list, fe.api_key_file);
  if (!keys_or.ok()) {
    std::fprintf(stderr, "llm-server: %s\n", keys_or.status().message().c_str());
    return 2;
  }
  const llm::ApiKeys& keys = keys_or.value();
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

  // The chat template: a model without one serves text and token prompts, and chat requests get
  // an error saying so; a template that is there but does not parse stops the start.
  std::unique_ptr<llm::TemplateChatRenderer> chat;
  auto chat_or = llm::TemplateChatRenderer::Load(engine.core(), sc.engine.model.model_dir,
                                                 fe.chat_template_file, fe.tool_call_parser,
                                                 fe.reasoning_parser);
  if (chat_or.ok()) {
    chat = std::move(chat_or).value();
    spdlog::info("chat template from {} (tool calls: {}, reasoning: {})", chat->origin(),
                 llm::ToolCallFamilyName(chat->tool_call_family()),
                 llm::ReasoningFamilyName(chat->reasoning_family()));
  } else if (chat_or.status().code() == llm::StatusCode::kNotFound &&
             fe.chat_template_file.empty()) {
    spdlog::warn("no chat template in {}: chat requests will fail", sc.engine.model.model_dir);
  } else {
    spdlog::critical("chat template: {}", chat_or.status().ToString());
    return 1;
  }
  llm::RequestGateway gateway(&engine, sc, chat.get());
  llm::GenerationService service(&gateway, &keys);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (fe.tls()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({ReadFile(fe.tls_key_file), ReadFile(fe.tls_cert_file)});
    creds = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(sc.listen_address, creds, &port);
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
  llm::OpenAiServerConfig hc;
  hc.address = fe.http_address;
  hc.tls_cert_file = fe.tls_cert_file;
  hc.tls_key_file = fe.tls_key_file;
  hc.max_request_body_bytes = static_cast<size_t>(fe.max_request_body_bytes);
  hc.max_json_depth = fe.max_json_depth;
  hc.max_connections = fe.http_max_connections;
  hc.max_connections_per_address = fe.http_max_connections_per_address;
  hc.model_name = engine.core().model_config().name;
  llm::OpenAiServer http(&gateway, &keys, hc);
  if (fe.http_address != "off") {
    auto hport = http.Start();
    if (!hport.ok()) {
      spdlog::critical("{}", hport.status().ToString());
      return 1;
    }
    spdlog::info("OpenAI HTTP API on {}://{} (port {})", fe.tls() ? "https" : "http",
                 fe.http_address, hport.value());
    std::printf("HTTP_LISTENING %d\n", hport.value());
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("serving gRPC{} on {} (port {})", fe.tls() ? " (TLS)" : "", sc.listen_address, port);
  std::printf("LISTENING %d\n", port);  // machine-readable, for tests and scripts
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  server->GetHealthCheckService()->SetServingStatus(false);
  gateway.StopAccepting();
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
  http.Stop();
  metrics.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  spdlog::info("bye");
  return 0;
}
