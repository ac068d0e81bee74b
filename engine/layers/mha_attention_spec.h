// The AttentionSpec of a per-head K/V (MHA / GQA / MQA) decoder, shared by the CPU decoder and the
// CUDA Llama-family definition so that both ask the registry for the same thing.
#pragma once

#include "engine/loader/kv_cache_quant.h"
#include "engine/loader/model_config.h"
#include "kernels/attention_backend.h"

namespace llm {

inline AttentionSpec MhaAttentionSpec(const ModelConfig& config, const KvCacheType& kv,
                                      int block_size, DeviceKind device, int device_arch,
                                      bool any_layer_windowed) {
  AttentionSpec spec;
  spec.device = device;
  spec.device_arch = device_arch;
  spec.kind = AttentionKind::kMha;
  spec.kv_dtype = kv.dtype;
  spec.kv_quant = kv.quant;
  spec.num_q_heads = config.num_q_heads;
  spec.num_kv_heads = config.num_kv_heads;
  spec.head_dim = config.head_dim;
  spec.block_size = block_size;
  spec.features = kFeatureCausal;
  if (any_layer_windowed) spec.features |= kFeatureSlidingWindow;
  if (config.attn_logit_softcap > 0.0f) spec.features |= kFeatureSoftCap;
  if (config.attention_sinks) spec.features |= kFeatureSinks;
  return spec;
}

}  // namespace llm
