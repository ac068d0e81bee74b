#include "server/server_config.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "build_info.h"  // generated: LLM_VERSION, LLM_GIT_COMMIT
#include "engine/loader/kv_cache_quant.h"
#include "engine/loader/tensor_parallel_plan.h"

namespace llm {
namespace {

using json = nlohmann::json;
using G = OptionGroup;
using O = ServerOption;

// The storage of an option inside ServerConfig.
#define LLM_BIND(path)            \
  [](ServerConfig & c) -> auto& { \
    return c.path;                \
  }

constexpr const char* kToolCallParsers[] = {"auto",    "none",        "hermes", "llama3_json",
                                            "mistral", "deepseek_v3", "harmony"};
constexpr const char* kReasoningParsers[] = {"auto", "none", "think", "harmony"};
constexpr const char* kLogLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

bool StaticKvCache(const ServerConfig& c) {
  const std::string& d = c.engine.model.kv_cache_dtype;
  return d == "int8" || d == "fp8_e4m3";
}

bool Speculating(const ServerConfig& c) {
  return c.engine.speculative.enabled();
}

bool NgramSpeculation(const ServerConfig& c) {
  return c.engine.speculative.method == "ngram";
}

bool DraftModelSpeculation(const ServerConfig& c) {
  return c.engine.speculative.method == "draft";
}

bool Fp8Weights(const ServerConfig& c) {
  return c.engine.model.weight_dtype == "fp8";
}

Status HostPort(const std::string& v) {
  if (v.find(':') == std::string::npos)
    return InvalidArgument("must be host:port, got '" + v + "'");
  return Status::Ok();
}

Status TensorParallelSize(const std::string& v) {
  for (int n : kTensorParallelSizes) {
    if (v == std::to_string(n)) return Status::Ok();
  }
  return InvalidArgument("must be 1, 2, 4 or 8, got '" + v + "'");
}

Status HostPortOrOff(const std::string& v) {
  return v == "off" ? Status::Ok() : HostPort(v);
}

Status ReadableFileOrEmpty(const std::string& v) {
  if (!v.empty() && !std::ifstream(v)) return NotFound("cannot open '" + v + "'");
  return Status::Ok();
}

std::vector<ServerOption> Declarations() {
  const char* kCudaPool = "the CUDA KV pool is sized by --gpu-memory-percent or --num-kv-blocks";
  const char* kGpu = "it sets up the GPU";
  return {
      // Server.
      O::String("listen_address", LLM_BIND(listen_address), G::kServer,
                "host:port of the gRPC server")
          .Check(HostPort),
      O::String("metrics_address", LLM_BIND(metrics_address), G::kServer,
                "host:port of the Prometheus /metrics endpoint, or off")
          .Check(HostPortOrOff),
      O::String("http_address", LLM_BIND(front_end.http_address), G::kServer,
                "host:port of the OpenAI-compatible HTTP API, or off")
          .Check(HostPortOrOff),
      O::String("api_key", LLM_BIND(front_end.api_key), G::kServer,
                "comma-separated API keys; clients send 'Authorization: Bearer KEY' (HTTP header "
                "or gRPC metadata); health checks stay open; empty: no key needed"),
      O::String("api_key_file", LLM_BIND(front_end.api_key_file), G::kServer,
                "file of API keys, one per line")
          .Check(ReadableFileOrEmpty),
      O::String("tls_cert_file", LLM_BIND(front_end.tls_cert_file), G::kServer,
                "PEM certificate chain: TLS on gRPC and HTTP (with --tls-key-file)")
          .Check(ReadableFileOrEmpty),
      O::String("tls_key_file", LLM_BIND(front_end.tls_key_file), G::kServer,
                "PEM private key of --tls-cert-file")
          .Check(ReadableFileOrEmpty),
      O::Int("max_request_body_bytes", LLM_BIND(front_end.max_request_body_bytes), 1024, 1 << 30,
             G::kServer, "HTTP request bodies larger than this get 413"),
      O::Int("max_json_depth", LLM_BIND(front_end.max_json_depth), 2, 1024, G::kServer,
             "HTTP request bodies whose JSON nests deeper than this get 400"),
      O::Int("http_max_connections", LLM_BIND(front_end.http_max_connections), 1, 1 << 20,
             G::kServer, "open HTTP connections; one past it is closed at accept"),
      O::Int("http_max_connections_per_address",
             LLM_BIND(front_end.http_max_connections_per_address), 1, 1 << 20, G::kServer,
             "open HTTP connections from one client address; one past it is closed at accept"),
      O::String("chat_template", LLM_BIND(front_end.chat_template_file), G::kModel,
                "Jinja chat template file used instead of the model's own")
          .Check(ReadableFileOrEmpty),
      O::Choice("tool_call_parser", LLM_BIND(front_end.tool_call_parser), kToolCallParsers,
                G::kModel,
                "tool-call syntax parsed out of chat output into tool_calls; auto: the one the "
                "chat template writes"),
      O::Choice("reasoning_parser", LLM_BIND(front_end.reasoning_parser), kReasoningParsers,
                G::kModel,
                "reasoning markup parsed out of chat output into reasoning_content; auto: the one "
                "the chat template writes"),
      O::Choice("log_level", LLM_BIND(log_level), kLogLevels, G::kServer, "log level"),
      O::Int("shutdown_grace_s", LLM_BIND(shutdown_grace_s), 0, 3600, G::kServer,
             "seconds in-flight requests get to finish after SIGTERM"),
      // Model.
      O::String("model_dir", LLM_BIND(engine.model.model_dir), G::kModel,
                "Hugging Face model directory (config.json, *.safetensors, tokenizer); required")
          .Alias("model"),
      O::Choice("device", LLM_BIND(engine.model.device), kDeviceChoices, G::kModel,
                "where the model runs; auto: cuda when this build has it and a GPU is present"),
      O::Int("tensor_parallel_size", LLM_BIND(engine.model.tensor_parallel_size), 1, 8, G::kModel,
             "ranks the model is split across (1, 2, 4 or 8), a thread each, each with its own "
             "KV cache budget; on cuda rank r on GPU r through NCCL (bf16 or weight_dtype fp8 "
             "weights, 8-bit KV caches; pre-quantized checkpoints and MXFP4 are refused at load)")
          .Check(TensorParallelSize),
      O::Int("max_model_len", LLM_BIND(engine.max_model_len), 0, 1 << 24, G::kModel,
             "context length; 0: the model's, capped by the KV cache"),
      // KV cache.
      O::Choice("kv_cache_dtype", LLM_BIND(engine.model.kv_cache_dtype), kKvCacheDtypeChoices,
                G::kKvCache,
                "KV cache element type; auto: fp32 on cpu, bf16 on cuda (DeepSeek: its config's); "
                "int8 and fp8_e4m3 take static scales, fp8_e4m3_dynamic computes them per token"),
      O::Choice("kv_scale_granularity", LLM_BIND(engine.model.kv_scale_granularity),
                kKvScaleGranularityChoices, G::kKvCache, "scales of a static 8-bit KV cache")
          .Requires(StaticKvCache, "--kv-cache-dtype int8 or fp8_e4m3"),
      O::String("kv_scales_file", LLM_BIND(engine.model.kv_scales_file), G::kKvCache,
                "KV scales JSON from llm-calibrate-kv; unset: the checkpoint's scales")
          .Requires(StaticKvCache, "--kv-cache-dtype int8 or fp8_e4m3"),
      O::Int("block_size", LLM_BIND(engine.model.block_size), 1, 1024, G::kKvCache,
             "tokens per KV block"),
      O::Int("num_kv_blocks", LLM_BIND(engine.model.num_kv_blocks), 0, 1 << 24, G::kKvCache,
             "KV blocks; 0: from --kv-cache-memory-mb (cpu) or --gpu-memory-percent (cuda)"),
      O::MiB("kv_cache_memory_mb", LLM_BIND(engine.model.kv_cache_bytes), 1, 1 << 22, G::kKvCache,
             "KV cache memory on the cpu, in MiB")
          .OnlyOn("cpu", kCudaPool),
      O::Bool("enable_prefix_caching", LLM_BIND(engine.scheduler.enable_prefix_caching),
              G::kKvCache, "share full KV blocks between requests with the same prefix"),
      // Scheduler.
      O::Int("max_num_seqs", LLM_BIND(engine.scheduler.max_num_seqs), 1, 4096, G::kScheduler,
             "running sequences per step"),
      O::Int("max_batched_tokens", LLM_BIND(engine.scheduler.max_batched_tokens), 1, 1 << 20,
             G::kScheduler, "token budget per step (prompt chunks and decode tokens)"),
      O::Int("max_queued_requests", LLM_BIND(engine.max_queued_requests), 1, 1 << 20, G::kScheduler,
             "waiting requests; past it, RESOURCE_EXHAUSTED at once"),
      O::Bool("overlap_steps", LLM_BIND(engine.overlap_steps), G::kScheduler,
              "queue step k + 1 on the device before reading step k's tokens (models that "
              "sample on the device)"),
      O::Choice("speculative_method", LLM_BIND(engine.speculative.method),
                kSpeculativeMethodChoices, G::kScheduler,
                "speculative decoding: ngram drafts tokens from the request's own prompt and "
                "output (prompt lookup), draft from a smaller model (--speculative-model), mtp "
                "from the checkpoint's multi-token-prediction layer (DeepSeek-V3 with "
                "num_nextn_predict_layers >= 1 and its model.layers.N weights); "
                "the target verifies them in one step"),
      O::String("speculative_model", LLM_BIND(engine.speculative.draft_model_dir), G::kScheduler,
                "draft model directory for --speculative-method draft: a smaller checkpoint "
                "with the target's vocabulary and tokenizer, on the same device, its KV cache in "
                "the target's blocks")
          .Requires(DraftModelSpeculation, "--speculative-method draft"),
      O::Int("num_speculative_tokens", LLM_BIND(engine.speculative.num_speculative_tokens), 1,
             kMaxSpeculativeTokens, G::kScheduler,
             "draft tokens verified per sequence and step (on CUDA the verify steps of 1 + K rows "
             "replay graphs)")
          .Requires(Speculating, "--speculative-method ngram, draft or mtp"),
      O::Int("ngram_prompt_lookup_min", LLM_BIND(engine.speculative.ngram_prompt_lookup_min), 1,
             1024, G::kScheduler, "n-gram drafting: the shortest context suffix that must recur")
          .Requires(NgramSpeculation, "--speculative-method ngram"),
      O::Int("ngram_prompt_lookup_max", LLM_BIND(engine.speculative.ngram_prompt_lookup_max), 1,
             1024, G::kScheduler, "n-gram drafting: the longest context suffix tried")
          .Requires(NgramSpeculation, "--speculative-method ngram"),
      O::Bool("speculative_adaptive_k", LLM_BIND(engine.speculative.adaptive_draft_length),
              G::kScheduler,
              "each request drafts as many tokens as its own acceptance makes worth verifying "
              "(1 to --num-speculative-tokens: a draft position is proposed while its estimated "
              "acceptance probability is at least 0.3); off: always --num-speculative-tokens")
          .Requires(Speculating, "--speculative-method ngram, draft or mtp"),
      O::Int("speculative_disable_by_batch_size",
             LLM_BIND(engine.speculative.disable_by_batch_size), 0, 1 << 20, G::kScheduler,
             "speculation pauses while more requests than this are running or waiting (their "
             "steps overlap again); 0: never")
          .Requires(Speculating, "--speculative-method ngram, draft or mtp"),
      O::Int("structured_output_threads", LLM_BIND(engine.structured_output_threads), 0, 256,
             G::kScheduler,
             "threads (the engine's included) filling a step's structured-output token masks; "
             "0: half the hardware threads, at most 8"),
      // Request limits.
      O::Int("max_tokens_limit", LLM_BIND(engine.max_tokens_limit), 1, 1 << 24, G::kLimits,
             "largest max_tokens a request may ask for"),
      O::Int("default_max_tokens", LLM_BIND(engine.default_max_tokens), 1, 1 << 24, G::kLimits,
             "max_tokens of a request that sets none"),
      O::Int("max_prompt_bytes", LLM_BIND(max_prompt_bytes), 1, 1 << 30, G::kLimits,
             "largest text prompt, in bytes"),
      O::Int("max_n", LLM_BIND(engine.max_n), 1, 1024, G::kLimits,
             "most choices (OpenAI's n) one request may ask for; they share the prompt's KV "
             "blocks"),
      // CUDA.
      O::Percent("gpu_memory_percent", LLM_BIND(engine.model.gpu_memory_fraction), 1, 99, G::kCuda,
                 "percent of the GPU memory left after the weights for the KV pool")
          .OnlyOn("cuda", "the cpu KV cache is sized by --kv-cache-memory-mb or --num-kv-blocks"),
      O::Choice("weight_dtype", LLM_BIND(engine.model.weight_dtype), kWeightDtypeChoices, G::kCuda,
                "projection weights on the GPU; auto: bf16, or a pre-quantized fp8 checkpoint's "
                "e4m3 as stored; fp8: e4m3 with per-tensor scales (a bf16 checkpoint's quantized "
                "at load), activations quantized per token; bf16: also dequantizes fp8 checkpoints")
          .OnlyOn("cuda", "the cpu models compute in fp32"),
      O::Choice("moe_weight_dtype", LLM_BIND(engine.model.moe_weight_dtype), kMoeWeightDtypeChoices,
                G::kCuda,
                "routed experts stored as MXFP4 (gpt-oss); mxfp4: kept as stored for the MXFP4 "
                "kernels (with weight_dtype fp8 too, which then quantizes the other projections) "
                "or the load fails; auto: kept where those kernels serve them, else dequantized "
                "(logged); bf16: dequantized")
          .OnlyOn("cuda", "the cpu models compute in fp32"),
      O::Choice("moe_activation_dtype", LLM_BIND(engine.model.moe_activation_dtype),
                kMoeActivationDtypeChoices, G::kCuda,
                "activations of fp8 routed experts; fp8: e4m3 per token (per 128-wide group "
                "beside 128x128 block-scaled weights) through the W8A8 expert GEMMs on the e4m3 "
                "tensor cores (sm_89+), or the load fails; auto: fp8 for prompt-sized batches "
                "(512 tokens and more) where those serve a layer, else bf16 (logged); bf16: the "
                "W8A16 expert GEMMs")
          .OnlyOn("cuda", "the cpu models compute in fp32"),
      O::Bool("dummy_weights", LLM_BIND(engine.model.dummy_weights), G::kCuda,
              "random weights on the GPU instead of the checkpoint (benchmarks)")
          .OnlyOn("cuda", kGpu),
      O::Int("cuda_graph_max_batch", LLM_BIND(engine.model.cuda_graph_max_batch), 0, 4096, G::kCuda,
             "decode and speculative verify steps of up to this many sequences replay CUDA "
             "graphs; 0: off")
          .OnlyOn("cuda", kGpu),
      O::Bool("cuda_graph_warmup", LLM_BIND(engine.model.cuda_graph_warmup), G::kCuda,
              "capture every decode graph (and the verify graphs of 1 + K rows) at start-up "
              "instead of on first use")
          .OnlyOn("cuda", kGpu),
      // Kernel experiments: docs/KERNEL_SELECTION.md says what each one chooses.
      O::String("attention_backend", LLM_BIND(engine.model.attention_backend), G::kKernel,
                "force an attention backend by name; unset: the selection at load"),
      O::String("prefill_attention_backend", LLM_BIND(engine.model.prefill_attention_backend),
                G::kKernel,
                "attention of steps with a prefill chunk: auto (cuda_fmha on a 16-bit cache) | "
                "none (the decode backend) | a backend name")
          .OnlyOn("cuda", kGpu),
      O::Bool("fp8_fast_accumulation", LLM_BIND(engine.model.fp8_fast_accumulation), G::kKernel,
              "fp8 projections sum in the tensor cores' accumulator (cuBLASLt fast accumulation)")
          .OnlyOn("cuda", kGpu)
          .Requires(Fp8Weights, "--weight-dtype fp8"),
      O::Bool("fp8_static_attention_output", LLM_BIND(engine.model.fp8_static_attention_output),
              G::kKernel,
              "the attention kernel writes o_proj's fp8 input with the cache's static V bound "
              "as its scale, instead of a per-row quantization pass")
          .OnlyOn("cuda", kGpu)
          .Requires([](const ServerConfig& c) { return Fp8Weights(c) && StaticKvCache(c); },
                    "--weight-dtype fp8 and --kv-cache-dtype int8 or fp8_e4m3"),
      O::Choice("mla_kernel", LLM_BIND(engine.model.mla_kernel), kMlaKernelChoices, G::kKernel,
                "DeepSeek MLA decode kernel; auto: the sm_90a wgmma kernels where they run")
          .OnlyOn("cuda", kGpu),
      O::Choice("c8_prefill", LLM_BIND(engine.model.c8_prefill), kC8PrefillChoices, G::kKernel,
                "cuda_c8 prefill over an 8-bit cache; auto: fmha where it runs, else the tiles")
          .OnlyOn("cuda", kGpu),
  };
}

#undef LLM_BIND

// Flag spelling to key: --max-num-seqs and --max_num_seqs are max_num_seqs.
std::string KeyOf(const std::string& flag) {
  std::string key = flag.substr(2);
  for (char& ch : key) ch = ch == '-' ? '_' : ch;
  return key;
}

const ServerOption* FindOption(const std::string& key) {
  for (const ServerOption& o : ServerOptions()) {
    if (key == o.key() || (!o.alias().empty() && key == o.alias())) return &o;
  }
  return nullptr;
}

Status SetOption(const ServerOption& o, const std::string& value, const std::string& name,
                 ServerConfig* c) {
  Status st = o.Set(*c, value);
  if (!st.ok()) return InvalidArgument(name + " " + st.message());
  c->explicit_keys.insert(o.key());
  return Status::Ok();
}

Status ApplyJson(const std::string& path, ServerConfig* c) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open config file " + path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + " is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string name = path + ": " + it.key();
    const ServerOption* o = FindOption(it.key());
    if (o == nullptr || it.key() != o->key()) {
      return InvalidArgument(path + ": unknown key '" + it.key() + "'");
    }
    std::string v;
    switch (o->kind()) {
      case ServerOption::Kind::kInt:
        if (!it->is_number_integer()) return InvalidArgument(name + " must be an integer");
        v = std::to_string(it->get<int64_t>());
        break;
      case ServerOption::Kind::kBool:
        if (!it->is_boolean()) return InvalidArgument(name + " must be true or false");
        v = it->get<bool>() ? "true" : "false";
        break;
      case ServerOption::Kind::kString:
        if (!it->is_string()) return InvalidArgument(name + " must be a string");
        v = it->get<std::string>();
        break;
    }
    LLM_RETURN_IF_ERROR(SetOption(*o, v, name, c));
  }
  return Status::Ok();
}

Status Validate(const ServerConfig& c) {
  if (c.engine.model.model_dir.empty()) {
    return InvalidArgument("model_dir is required (--model-dir DIR)");
  }
  if (c.engine.default_max_tokens > c.engine.max_tokens_limit) {
    return InvalidArgument("--default-max-tokens " + std::to_string(c.engine.default_max_tokens) +
                           " exceeds --max-tokens-limit " +
                           std::to_string(c.engine.max_tokens_limit));
  }
  if (c.front_end.tls_cert_file.empty() != c.front_end.tls_key_file.empty()) {
    return InvalidArgument("--tls-cert-file and --tls-key-file go together");
  }
  LLM_RETURN_IF_ERROR(CheckSpeculativeConfig(c.engine.speculative));
  const std::string& device = c.engine.model.device;
  return device == "auto" ? Status::Ok() : CheckOptionsApply(c, device);
}

// Appends `text` to `out`, wrapped at 100 columns with continuation lines indented by `indent`.
void AppendWrapped(const std::string& text, size_t indent, size_t column, std::string* out) {
  constexpr size_t kWidth = 100;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(pos, end - pos);
    if (column > indent && column + 1 + word.size() > kWidth) {
      *out += '\n';
      out->append(indent, ' ');
      column = indent;
    } else if (column > indent) {
      *out += ' ';
      ++column;
    }
    *out += word;
    column += word.size();
    pos = end + 1;
  }
  *out += '\n';
}

void AppendEntry(const std::string& flag, const std::string& help, std::string* out) {
  constexpr size_t kHelpColumn = 34;
  std::string line = "  " + flag;
  if (line.size() + 1 > kHelpColumn) {
    *out += line + "\n";
    line.clear();
  }
  line.resize(kHelpColumn, ' ');
  *out += line;
  AppendWrapped(help, kHelpColumn, kHelpColumn, out);
}

}  // namespace

const std::vector<ServerOption>& ServerOptions() {
  static const std::vector<ServerOption> kOptions = Declarations();
  return kOptions;
}

Status CheckOptionsApply(const ServerConfig& config, const std::string& device) {
  for (const ServerOption& o : ServerOptions()) {
    if (!config.IsExplicit(o.key())) continue;
    const std::string why = o.Inapplicable(config, device);
    if (!why.empty()) return InvalidArgument(why);
  }
  return Status::Ok();
}

StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args) {
  ServerConfig c;
  std::vector<std::pair<std::string, std::string>> flags;  // (as written, value)
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      return InvalidArgument("unexpected argument '" + a + "'");
    }
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    if (KeyOf(flag) != "config" && FindOption(KeyOf(flag)) == nullptr) {
      return InvalidArgument("unknown flag " + flag);
    }
    if (eq != std::string::npos) {
      flags.emplace_back(a.substr(0, eq), a.substr(eq + 1));
    } else {
      if (i + 1 >= args.size()) return InvalidArgument("flag " + a + " needs a value");
      flags.emplace_back(a, args[++i]);
    }
  }
  for (const auto& [flag, v] : flags) {
    if (KeyOf(flag) == "config") LLM_RETURN_IF_ERROR(ApplyJson(v, &c));
  }
  for (const auto& [flag, v] : flags) {
    const std::string key = KeyOf(flag);
    if (key == "config") continue;
    LLM_RETURN_IF_ERROR(SetOption(*FindOption(key), v, flag, &c));
  }
  LLM_RETURN_IF_ERROR(Validate(c));
  return c;
}

std::string ServerUsage(bool all) {
  std::string s = "usage: llm-server --model-dir DIR [--config FILE.json] [--FLAG VALUE ...]\n\n";
  AppendWrapped(
      "Serves a Hugging Face model over gRPC. Every option is also a key of the --config JSON "
      "file (--max-num-seqs 32 is \"max_num_seqs\": 32); flags override the file.",
      0, 0, &s);
  const ServerConfig defaults;
  for (int g = 0; g <= static_cast<int>(OptionGroup::kKernel); ++g) {
    const auto group = static_cast<OptionGroup>(g);
    if (group == OptionGroup::kKernel && !all) continue;
    s += std::string("\n") + OptionGroupTitle(group) + ":\n";
    for (const ServerOption& o : ServerOptions()) {
      if (o.group() != group) continue;
      std::string help = o.help();
      const std::string def = o.Get(defaults);
      if (!def.empty()) help += " (default " + def + ")";
      std::string flag = o.flag() + " " + o.value_name();
      if (!o.alias().empty()) flag = "--" + o.alias() + ", " + flag;
      AppendEntry(flag, help, &s);
    }
  }
  s += "\nOther:\n";
  AppendEntry("--config FILE.json", "options as a JSON object, applied before the flags", &s);
  AppendEntry("-h, --help", "this text", &s);
  AppendEntry("--help-all", "also the kernel experiment switches", &s);
  AppendEntry("--version", "the version and the commit it was built from", &s);
  if (!all) s += "\nKernel experiment switches: --help-all and docs/KERNEL_SELECTION.md.\n";
  return s;
}

std::string ServerVersion() {
  const std::string commit = LLM_GIT_COMMIT;
  return "llm-server " LLM_VERSION + (commit.empty() ? "" : " (commit " + commit + ")") + "\n";
}

CommandLine ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine cl;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h" || a == "--help-all") {
      cl.out = ServerUsage(a == "--help-all");
      return cl;
    }
    if (a == "--version") {
      cl.out = ServerVersion();
      return cl;
    }
  }
  auto config = ParseServerConfig(args);
  if (!config.ok()) {
    cl.exit_code = 2;
    cl.err = "llm-server: " + config.status().message() + "\nrun llm-server --help for usage\n";
    return cl;
  }
  cl.config = std::move(config).value();
  return cl;
}

}  // namespace llm
