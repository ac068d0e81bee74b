// Server configuration: one JSON file, overridden by command-line flags, validated at start.
#pragma once

#include <string>
#include <vector>

#include "engine/base/status.h"
#include "engine/engine_config.h"

namespace llm {

struct ServerConfig {
  std::string listen_address = "127.0.0.1:50051";  // loopback unless configured otherwise
  std::string model_dir;
  int block_size = 64;
  int num_kv_blocks = 0;  // 0: from kv_cache_memory_mb
  int kv_cache_memory_mb = 256;
  int max_num_seqs = 64;
  int max_batched_tokens = 512;  // small chunks keep decode latency low while prompts prefill
  int max_model_len = 0;         // 0: the model's
  int max_tokens_limit = 4096;
  int default_max_tokens = 256;
  int max_prompt_bytes = 1 << 20;
  std::string attention_backend;  // empty: automatic
  // KV cache: auto (fp32 on CPU) | int8 | fp8_e4m3 | fp8_e4m3_dynamic; static 8-bit caches take
  // per_head or per_channel scales from kv_scales_file (llm-calibrate-kv) or the checkpoint.
  std::string kv_cache_dtype = "auto";
  std::string kv_scale_granularity = "per_head";
  std::string kv_scales_file;
  std::string device = "cpu";      // cpu | cuda | auto (cuda when built with it and present)
  int gpu_memory_percent = 85;     // of the GPU memory left after weights, for the KV pool
  bool dummy_weights = false;      // random weights on the device (benchmarks; cuda only)
  int cuda_graph_max_batch = 256;  // decode steps of up to this many sequences use CUDA graphs
  bool cuda_graph_warmup = true;   // capture all of those graphs at start-up (else on first use)
  std::string prefill_attention_backend = "auto";  // steps with a prefill chunk (cuda)
  std::string weight_dtype = "auto";               // auto (bf16) | bf16 | fp8 (cuda)
  bool fp8_fast_accumulation = true;               // fp8 weights: cuBLASLt fast accumulation
  bool fp8_static_attention_output = true;         // fp8 weights, static 8-bit KV: see model.h
  bool fused_decode_append = false;                // decode: rotary + append inside attention
  std::string mla_kernel = "auto";                 // auto | wgmma | portable (cuda DeepSeek)
  std::string c8_prefill = "auto";                 // auto | tiles | fmha (cuda_c8, 8-bit KV)
  std::string log_level = "info";
  int shutdown_grace_s = 10;
  bool enable_prefix_caching = true;
  bool overlap_steps = true;
  int max_queued_requests = 1024;
  std::string metrics_address =
      "127.0.0.1:9400";  // Prometheus /metrics; "off" disables  // waiting requests; past it,
                         // RESOURCE_EXHAUSTED at once  // SIGTERM: time in-flight requests get to
                         // finish

  EngineConfig ToEngineConfig() const;
};

// Applies `--config FILE` first, then every other flag. Unknown flags and bad values are errors
// that name them. `--help` yields a FailedPrecondition carrying the usage text.
StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args);
std::string ServerUsage();

}  // namespace llm
