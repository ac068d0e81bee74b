// DeepSeek-V2 / DeepSeek-V3 hyper-parameters read from a Hugging Face `config.json`
// (+ `generation_config.json`): multi-head latent attention (MLA), DeepSeekMoE routing and YaRN.
//
// Semantics follow the Hugging Face DeepSeek modelling code (modeling_deepseek.py of the
// deepseek-ai checkpoints, which transformers' deepseek_v2 / deepseek_v3 reproduce):
//   * MoE layer l: n_routed_experts > 0 && l >= first_k_dense_replace && l % moe_layer_freq == 0;
//     every other layer is a dense MLP of intermediate_size.
//   * Routing weights: V3 normalizes (norm_topk_prob && top_k > 1) and then always multiplies by
//     routed_scaling_factor; V2 either normalizes or (when not normalizing) multiplies by
//     routed_scaling_factor, exactly as DeepSeek-V2's MoEGate does. Real V2 checkpoints have
//     norm_topk_prob = false, where both rules agree.
//   * YaRN: DeepSeek's yarn_get_mscale; cos/sin are multiplied by
//     mscale(factor, mscale) / mscale(factor, mscale_all_dim) and the softmax scale by
//     mscale(factor, mscale_all_dim)^2 when mscale_all_dim is non-zero.
//
// Non-HF extensions (optional keys in config.json) for the latent KV cache:
//   "mla_cache_dtype": "float32" (default) | "fp8_e4m3"
//   "mla_cache_scale": the fp8 dequant scale used for every layer that has no checkpoint tensor
//                      `model.layers.N.self_attn.kv_scale` (default 1.0).
#pragma once

#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/loader/model_config.h"
#include "engine/loader/moe_routing.h"

namespace llm {

constexpr int kMaxRopeDim = 512;  // qk_rope_head_dim bound (64 for DeepSeek)

struct YarnScaling {
  // The inverse frequencies' settings (factor, original_max_position_embeddings, beta_fast,
  // beta_slow, truncate), as the Llama-family code carries them: type kYarn when yarn is on,
  // kNone otherwise. RopeInvFreq (engine/loader/rope.h) applies them for both.
  RopeScaling freq;
  float mscale = 1.0f;
  float mscale_all_dim = 0.0f;
  bool enabled() const { return freq.type == RopeScaling::Type::kYarn; }
};

struct DeepseekConfig {
  ModelConfig base;  // shared fields; head_dim = qk_nope + qk_rope, for display only

  // Attention (MLA).
  int q_lora_rank = 0;  // 0: no q LoRA (q_proj) — config null
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
  YarnScaling yarn;

  // MoE.
  enum class Scoring { kSoftmax, kSigmoid };
  enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
  int moe_intermediate_size = 0;
  int n_routed_experts = 0;  // 0: every layer is dense
  int n_shared_experts = 0;  // 0: none
  int num_experts_per_tok = 0;
  float routed_scaling_factor = 1.0f;
  Scoring scoring = Scoring::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  // DeepSeek-V3 multi-token-prediction layers stored after the decoder layers; not run.
  int num_nextn_predict_layers = 0;

  // Latent cache (see the file comment).
  DType mla_cache_dtype = DType::kF32;
  float mla_cache_scale = 1.0f;

  bool is_v3() const { return base.architecture == Architecture::kDeepseekV3; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // cached per token
  bool IsMoeLayer(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // The MoE gate's options (moe_router.h) for these routing keys.
  MoeRouting Routing() const;
  // qk_head_dim^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2 when that is set.
  float SoftmaxScale() const;
  // Factor on the roped q_pe / k_pe (cos and sin): mscale(mscale) / mscale(mscale_all_dim).
  float RopeMscale() const;
  // Per-frequency inverse frequencies of the rope part ([qk_rope_head_dim / 2]), YaRN applied.
  std::vector<float> RopeInvFreq() const;
};

// DeepSeek's yarn_get_mscale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double YarnGetMscale(double scale, double mscale);

// True when config.json's architectures[0] is DeepseekV2ForCausalLM or DeepseekV3ForCausalLM.
// Unreadable or malformed files answer false (the regular loader then reports them).
bool IsDeepseekModelDir(const std::string& model_dir);

// Unknown or inconsistent fields are errors that name them.
StatusOr<DeepseekConfig> LoadDeepseekConfig(const std::string& model_dir);

}  // namespace llm
