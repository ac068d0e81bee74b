// KV cache element type from the configuration, and the scales of static 8-bit caches: read from
// the checkpoint or from a calibration file written by `llm-calibrate-kv`.
//
// Config strings:
//   kv_cache_dtype:       "auto" (the device's default: fp32 on CPU), "int8", "fp8_e4m3",
//                         "fp8_e4m3_dynamic" (per-token per-head fp8 scales computed at append)
//   kv_scale_granularity: "per_head" | "per_channel" (static caches only)
//
// Calibration file (JSON), absmax values, not scales:
//   {"format": "llm-kv-scales-v1", "granularity": "per_head" | "per_channel",
//    "num_kv_heads": H, "head_dim": D,               (optional; checked when present)
//    "layers": [{"k_absmax": [...], "v_absmax": [...]}, ...]}   one entry per layer,
//   each list [H] (per_head) or [H * D] (per_channel, head-major). The loader turns absmax into
//   dequant scales absmax / 127 (int8) or absmax / 448 (fp8); a zero absmax gives scale 1.
//
// Checkpoint tensors (per layer N, first name found wins), fp8 dequant scales as written by
// vLLM / ModelOpt style exporters (x = q * scale with 448 the fp8 maximum):
//   model.layers.N.self_attn.{k_scale, attn.k_scale, cache_k_scale, attn.cache_k_scale,
//                             k_proj.output_scale}  (and the same with v)
//   shapes [num_kv_heads] (per head), [num_kv_heads * head_dim] or [num_kv_heads, head_dim]
//   (per channel). Scalar (per-tensor) scales are rejected. For an int8 cache a checkpoint scale
//   s is converted to s * 448 / 127 (same absmax).
// A per-channel source feeds a per-head cache by taking each head's maximum; a per-head source
// feeds a per-channel cache by repeating the head's scale over its channels.
#pragma once

#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/loader/model_config.h"
#include "engine/loader/safetensors.h"
#include "kernels/attention_backend.h"

namespace llm {

struct KvCacheType {
  DType dtype = DType::kF32;
  KvQuant quant = KvQuant::kNone;
  bool is_static() const {
    return quant == KvQuant::kStaticPerHead || quant == KvQuant::kStaticPerChannel;
  }
};

// The accepted config strings (the server's option table offers these; ParseKvCacheType maps them).
inline constexpr const char* kKvCacheDtypeChoices[] = {"auto", "int8", "fp8_e4m3",
                                                       "fp8_e4m3_dynamic"};
inline constexpr const char* kKvScaleGranularityChoices[] = {"per_head", "per_channel"};

// InvalidArgument naming the key and the accepted values on a bad string.
StatusOr<KvCacheType> ParseKvCacheType(const std::string& kv_cache_dtype,
                                       const std::string& kv_scale_granularity);

// Per-layer dequant scales of a static cache: k[layer], v[layer] hold [num_kv_heads] (per head)
// or [num_kv_heads * head_dim] (per channel) positive finite floats.
struct KvCacheScales {
  std::vector<std::vector<float>> k, v;
  std::string source;  // where they came from, for the log
};

// Scales for a static cache: from `scales_file` when given, else from the checkpoint. A missing
// scale is FailedPrecondition naming the layer, the tensor names tried and how to produce them.
StatusOr<KvCacheScales> LoadKvCacheScales(const ModelConfig& config, const WeightStore& weights,
                                          const KvCacheType& type, const std::string& scales_file);

// A tensor-parallel rank's part of the whole model's scales: the KV heads [first_kv_head,
// first_kv_head + num_kv_heads) of every layer, `per_head` floats each (1 per head, head_dim per
// channel). InvalidArgument when a layer's list does not hold those heads.
StatusOr<KvCacheScales> KvCacheScalesOfHeads(const KvCacheScales& whole, int first_kv_head,
                                             int num_kv_heads, int per_head);

// The calibration file contents (absmax, not scales).
struct KvAbsmax {
  bool per_channel = false;
  int num_kv_heads = 0;
  int head_dim = 0;
  std::vector<std::vector<float>> k, v;  // [layers][H] or [layers][H * D]
};

Status WriteKvAbsmaxFile(const std::string& path, const KvAbsmax& absmax);
// Checks the format tag, the granularity and every list's length against the model.
StatusOr<KvAbsmax> ReadKvAbsmaxFile(const std::string& path, const ModelConfig& config);

}  // namespace llm
