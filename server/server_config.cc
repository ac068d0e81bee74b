#include "server/server_config.h"

#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/models/kv_cache_quant.h"

namespace llm {
namespace {

using json = nlohmann::json;

struct Field {
  const char* key;  // JSON key; the flag is --key with '_' as '-'
  const char* help;
  std::function<Status(ServerConfig&, const std::string&)> set;
};

Status ParseInt(const std::string& name, const std::string& v, int lo, int hi, int* out) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    if (pos != v.size()) throw std::invalid_argument(v);
    if (x < lo || x > hi) {
      return InvalidArgument(name + " must be in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + v);
    }
    *out = static_cast<int>(x);
  } catch (const std::exception&) {
    return InvalidArgument(name + " must be an integer, got '" + v + "'");
  }
  return Status::Ok();
}

Field IntField(const char* key, const char* help, int ServerConfig::*member, int lo, int hi) {
  return {key, help, [=](ServerConfig& c, const std::string& v) {
            return ParseInt(key, v, lo, hi, &(c.*member));
          }};
}

Field BoolField(const char* key, const char* help, bool ServerConfig::*member) {
  return {key, help, [=](ServerConfig& c, const std::string& v) {
            if (v == "true" || v == "1") {
              c.*member = true;
            } else if (v == "false" || v == "0") {
              c.*member = false;
            } else {
              return InvalidArgument(std::string(key) + " must be true or false, got '" + v + "'");
            }
            return Status::Ok();
          }};
}

Field StrField(const char* key, const char* help, std::string ServerConfig::*member) {
  return {key, help, [=](ServerConfig& c, const std::string& v) {
            c.*member = v;
            return Status::Ok();
          }};
}

const std::vector<Field>& Fields() {
  static const std::vector<Field> kFields = {
      StrField("listen_address", "host:port for gRPC (default 127.0.0.1:50051)",
               &ServerConfig::listen_address),
      StrField("metrics_address", "host:port for HTTP /metrics, or off (default 127.0.0.1:9400)",
               &ServerConfig::metrics_address),
      StrField("model_dir", "Hugging Face model directory", &ServerConfig::model_dir),
      IntField("block_size", "tokens per KV block (default 64)", &ServerConfig::block_size, 1,
               1024),
      IntField("num_kv_blocks", "KV blocks; 0 = from kv_cache_memory_mb",
               &ServerConfig::num_kv_blocks, 0, 1 << 24),
      IntField("kv_cache_memory_mb", "KV cache memory in MiB (default 256)",
               &ServerConfig::kv_cache_memory_mb, 1, 1 << 22),
      IntField("max_num_seqs", "running sequences per step (default 64)",
               &ServerConfig::max_num_seqs, 1, 4096),
      IntField("max_batched_tokens", "token budget per step (default 512)",
               &ServerConfig::max_batched_tokens, 1, 1 << 20),
      IntField("max_model_len", "context length; 0 = the model's", &ServerConfig::max_model_len, 0,
               1 << 24),
      IntField("max_tokens_limit", "largest max_tokens a request may ask (default 4096)",
               &ServerConfig::max_tokens_limit, 1, 1 << 24),
      IntField("default_max_tokens", "max_tokens when a request sets none (default 256)",
               &ServerConfig::default_max_tokens, 1, 1 << 24),
      IntField("max_prompt_bytes", "largest text prompt in bytes (default 1 MiB)",
               &ServerConfig::max_prompt_bytes, 1, 1 << 30),
      StrField("attention_backend", "force an attention backend by name",
               &ServerConfig::attention_backend),
      StrField("kv_cache_dtype", "auto (fp32 on CPU) | int8 | fp8_e4m3 | fp8_e4m3_dynamic",
               &ServerConfig::kv_cache_dtype),
      StrField("kv_scale_granularity", "per_head | per_channel scales of a static 8-bit KV cache",
               &ServerConfig::kv_scale_granularity),
      StrField("device", "cpu | cuda | auto (default cpu)", &ServerConfig::device),
      IntField("gpu_memory_percent", "percent of free GPU memory for the KV pool (default 85)",
               &ServerConfig::gpu_memory_percent, 1, 99),
      BoolField("dummy_weights", "random weights on the device instead of the checkpoint (cuda)",
                &ServerConfig::dummy_weights),
      StrField("prefill_attention_backend",
               "attention for steps with a prefill chunk: auto (cuda_fmha on a 16-bit cache) | "
               "none | a backend name (cuda)",
               &ServerConfig::prefill_attention_backend),
      StrField("weight_dtype",
               "projection weights on the GPU: auto (bf16) | bf16 | fp8 (e4m3, per-tensor scales; "
               "activations per token)",
               &ServerConfig::weight_dtype),
      BoolField("fp8_fast_accumulation",
                "fp8 weights: sum the projections' products in the tensor cores' accumulator "
                "(cuBLASLt fast accumulation) instead of promoting to fp32 (default true)",
                &ServerConfig::fp8_fast_accumulation),
      BoolField("fp8_static_attention_output",
                "fp8 weights and a static int8/fp8 KV cache: the attention kernel writes "
                "o_proj's e4m3 input with a static per-layer scale (the cache's V bound) "
                "instead of a per-row quantization pass (default true)",
                &ServerConfig::fp8_static_attention_output),
      BoolField("fused_decode_append",
                "decode steps on cuda_c8: the attention kernel rotates q and appends the new K/V "
                "itself, one launch per layer instead of two (default false)",
                &ServerConfig::fused_decode_append),
      StrField("mla_kernel",
               "DeepSeek MLA decode kernel on the GPU: auto (the sm_90a wgmma kernels on "
               "H100/H200) | wgmma (the same, or fail the load; builds with sm_90a) | portable",
               &ServerConfig::mla_kernel),
      StrField("c8_prefill",
               "cuda_c8 prefill over an 8-bit KV cache: auto (fmha where it runs, else tiles) | "
               "tiles (the C8 prefill tiles) | fmha (the sm_90a wgmma FMHA kernel over a "
               "per-step bf16 copy of the cache, or fail the load)",
               &ServerConfig::c8_prefill),
      IntField("cuda_graph_max_batch",
               "decode steps of up to this many sequences replay CUDA graphs; 0: off (default 256)",
               &ServerConfig::cuda_graph_max_batch, 0, 4096),
      BoolField("cuda_graph_warmup",
                "capture every decode graph at start-up instead of on first use (default true)",
                &ServerConfig::cuda_graph_warmup),
      StrField("kv_scales_file", "KV scales JSON from llm-calibrate-kv (default: checkpoint's)",
               &ServerConfig::kv_scales_file),
      IntField("shutdown_grace_s", "seconds in-flight requests get after SIGTERM (default 10)",
               &ServerConfig::shutdown_grace_s, 0, 3600),
      BoolField("enable_prefix_caching", "share full KV blocks across requests (default true)",
                &ServerConfig::enable_prefix_caching),
      BoolField("overlap_steps",
                "queue step k + 1 on the GPU before reading step k's tokens (default true)",
                &ServerConfig::overlap_steps),
      IntField("max_queued_requests", "waiting requests before RESOURCE_EXHAUSTED (default 1024)",
               &ServerConfig::max_queued_requests, 1, 1 << 20),
      StrField("log_level", "trace|debug|info|warn|error (default info)", &ServerConfig::log_level),
  };
  return kFields;
}

const Field* FindField(const std::string& key) {
  for (const Field& f : Fields()) {
    if (key == f.key) return &f;
  }
  return nullptr;
}

Status ApplyJson(const std::string& path, ServerConfig* c) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open config file " + path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + " is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Field* f = FindField(it.key());
    if (f == nullptr) return InvalidArgument(path + ": unknown key '" + it.key() + "'");
    std::string v;
    if (it->is_string())
      v = it->get<std::string>();
    else if (it->is_number_integer())
      v = std::to_string(it->get<int64_t>());
    else if (it->is_boolean())
      v = it->get<bool>() ? "true" : "false";
    else
      return InvalidArgument(path + ": '" + it.key() + "' must be a string or an integer");
    Status st = f->set(*c, v);
    if (!st.ok()) return InvalidArgument(path + ": " + st.message());
  }
  return Status::Ok();
}

Status Validate(const ServerConfig& c) {
  if (c.model_dir.empty()) return InvalidArgument("model_dir is required (--model-dir DIR)");
  if (c.listen_address.find(':') == std::string::npos) {
    return InvalidArgument("listen_address must be host:port, got '" + c.listen_address + "'");
  }
  if (c.default_max_tokens > c.max_tokens_limit) {
    return InvalidArgument("default_max_tokens exceeds max_tokens_limit");
  }
  LLM_RETURN_IF_ERROR(ParseKvCacheType(c.kv_cache_dtype, c.kv_scale_granularity).status());
  LLM_RETURN_IF_ERROR(CheckMlaKernelOption(c.mla_kernel));
  LLM_RETURN_IF_ERROR(CheckC8PrefillOption(c.c8_prefill));
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  bool ok = false;
  for (const char* l : kLevels) ok |= c.log_level == l;
  if (!ok) return InvalidArgument("log_level '" + c.log_level + "' is not a spdlog level");
  return Status::Ok();
}

}  // namespace

EngineConfig ServerConfig::ToEngineConfig() const {
  EngineConfig e;
  e.model.model_dir = model_dir;
  e.model.block_size = block_size;
  e.model.num_kv_blocks = num_kv_blocks;
  e.model.kv_cache_bytes = static_cast<size_t>(kv_cache_memory_mb) << 20;
  e.model.attention_backend = attention_backend;
  e.model.device = device;
  e.model.gpu_memory_fraction = gpu_memory_percent / 100.0;
  e.model.dummy_weights = dummy_weights;
  e.model.cuda_graph_max_batch = cuda_graph_max_batch;
  e.model.cuda_graph_warmup = cuda_graph_warmup;
  e.model.prefill_attention_backend = prefill_attention_backend;
  e.model.weight_dtype = weight_dtype;
  e.model.fp8_fast_accumulation = fp8_fast_accumulation;
  e.model.fp8_static_attention_output = fp8_static_attention_output;
  e.model.fused_decode_append = fused_decode_append;
  e.model.mla_kernel = mla_kernel;
  e.model.c8_prefill = c8_prefill;
  e.model.kv_cache_dtype = kv_cache_dtype;
  e.model.kv_scale_granularity = kv_scale_granularity;
  e.model.kv_scales_file = kv_scales_file;
  e.scheduler.block_size = block_size;
  e.scheduler.max_num_seqs = max_num_seqs;
  e.scheduler.max_batched_tokens = max_batched_tokens;
  e.scheduler.enable_prefix_caching = enable_prefix_caching;
  e.max_queued_requests = max_queued_requests;
  e.overlap_steps = overlap_steps;
  e.max_model_len = max_model_len;
  e.max_tokens_limit = max_tokens_limit;
  e.default_max_tokens = default_max_tokens;
  return e;
}

std::string ServerUsage() {
  std::string s =
      "usage: llm-server [--config FILE.json] [--FLAG VALUE ...]\n"
      "Every config key is also a flag (--max-num-seqs 32 or --max_num_seqs 32);\n"
      "flags override the file. --model is short for --model-dir.\nKeys:\n";
  for (const Field& f : Fields()) s += "  " + std::string(f.key) + ": " + f.help + "\n";
  return s;
}

StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args) {
  ServerConfig c;
  std::vector<std::pair<std::string, std::string>> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--help" || a == "-h") return FailedPrecondition(ServerUsage());
    if (a.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) return InvalidArgument("flag " + a + " needs a value");
      value = args[++i];
    }
    for (char& ch : key) ch = ch == '-' ? '_' : ch;
    if (key == "model") key = "model_dir";
    flags.emplace_back(key, value);
  }
  for (const auto& [k, v] : flags) {
    if (k == "config") LLM_RETURN_IF_ERROR(ApplyJson(v, &c));
  }
  for (const auto& [k, v] : flags) {
    if (k == "config") continue;
    const Field* f = FindField(k);
    if (f == nullptr) return InvalidArgument("unknown flag --" + k);
    LLM_RETURN_IF_ERROR(f->set(c, v));
  }
  LLM_RETURN_IF_ERROR(Validate(c));
  return c;
}

}  // namespace llm
