// Model hyper-parameters read from a Hugging Face `config.json` (+ `generation_config.json`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/sampling/sampling_params.h"

namespace llm {

// DeepSeek configs are read by loader/deepseek_config.h (LoadModel dispatches on the name).
enum class Architecture {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kDeepseekV2,
  kDeepseekV3,
  kMixtral,
  kQwen3Moe,
  kGemma2,
  kGemma3,  // Gemma3ForCausalLM (model_type gemma3_text)
  kGptOss,
};

const char* ArchitectureName(Architecture a);

// The rope scalings the Llama-family code applies (CPU and CUDA share RopeInvFreq).
struct RopeScaling {
  enum class Type { kNone, kLlama3, kLinear, kYarn } type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
  // yarn (HF _compute_yarn_parameters).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  bool truncate = true;
  // HF multiplies cos and sin by this; q.k then scales by its square, which the models fold
  // into the softmax scale (V is not rotated, so the two are the same).
  float attention_factor = 1.0f;
};

// The activation of the gated MLPs (hidden_act; Gemma's hidden_activation). gpt-oss's experts
// use their own clamped SwiGLU whatever hidden_act says (transformers ignores it there).
enum class HiddenAct { kSilu, kGeluTanh };

// Routed mixture-of-experts layers (Mixtral, Qwen3-MoE, gpt-oss); num_experts 0: none.
struct MoeSettings {
  int num_experts = 0;   // num_local_experts (Mixtral, gpt-oss) / num_experts (Qwen3-MoE)
  int top_k = 0;         // num_experts_per_tok
  int intermediate = 0;  // per expert: moe_intermediate_size (Qwen3-MoE), else intermediate_size
  // Routing weights renormalized over the top-k (Mixtral always; Qwen3-MoE norm_topk_prob).
  bool normalize = true;
  // [num_layers]: true where the layer is MoE; a false layer is a dense MLP of intermediate_size
  // (Qwen3-MoE's mlp_only_layers / decoder_sparse_step).
  std::vector<bool> layers;
  float swiglu_limit = 7.0f;  // gpt-oss experts' clamp
  bool Layer(int l) const { return num_experts > 0 && layers[l]; }
};

// Pre-quantized checkpoint weights (config.json "quantization_config").
struct WeightQuantization {
  // kMxfp4: gpt-oss's MXFP4 experts (*_blocks u8 + *_scales e8m0), dequantized at load.
  enum class Method {
    kNone,
    kFp8PerTensor,
    kFp8PerChannel,
    kFp8Block,
    kMxfp4
  } method = Method::kNone;
  std::string quant_method;            // as written: compressed-tensors, modelopt, fbgemm_fp8, fp8
  int block_rows = 0, block_cols = 0;  // kFp8Block: weight_block_size
  // Static per-tensor activation scales (input_scale tensors) are present and consumed; the CPU
  // path computes activations in fp32 and does not apply them.
  bool static_input_scales = false;
  bool quantized() const { return method != Method::kNone; }
  // An fp8 method: e4m3 linear weights the CUDA fp8 GEMMs can keep (MXFP4 experts are only ever
  // dequantized).
  bool fp8() const { return quantized() && method != Method::kMxfp4; }
};

// Sampling defaults from generation_config.json; unset fields leave the server defaults.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<int> max_new_tokens;
  // Keys present in the file that are not applied (logged at start-up, as vLLM ignores them).
  std::vector<std::string> not_applied;
  bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty && !max_new_tokens;
  }
  // Sets the fields this file gives; the request's own fields are applied after.
  void ApplyTo(SamplingParams* sp) const {
    if (temperature) sp->temperature = *temperature;
    if (top_p) sp->top_p = *top_p;
    if (top_k) sp->top_k = *top_k;
    if (min_p) sp->min_p = *min_p;
    if (repetition_penalty) sp->repetition_penalty = *repetition_penalty;
  }
  // "temperature 0.6, top_p 0.9" or "none", for the start-up table.
  std::string Describe() const;
};

struct ModelConfig {
  std::string name;  // directory name, for display
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written in config.json
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q/k/v biases (Qwen2; Llama attention_bias)
  bool o_bias = false;    // o_proj bias (Llama attention_bias)
  bool mlp_bias = false;  // gate/up/down biases (Llama mlp_bias)
  bool qk_norm = false;   // per-head q_norm / k_norm RMSNorm before rotary (Qwen3, Gemma 3)
  HiddenAct hidden_act = HiddenAct::kSilu;
  MoeSettings moe;
  // Gemma: the softmax scale is query_pre_attn_scalar^-0.5 instead of head_dim^-0.5.
  std::optional<float> query_pre_attn_scalar;
  // Soft-caps (Gemma 2, allowed by Gemma 3): cap * tanh(x / cap) of the attention scores and of
  // the LM head's logits; 0 = none.
  float attn_logit_softcap = 0.0f;
  float final_logit_softcap = 0.0f;
  // Learned per-head sink logits (gpt-oss self_attn.sinks [num_attention_heads]).
  bool attention_sinks = false;
  // Gemma 3: the sliding-window layers rotate with their own table (rope_local_base_freq, or
  // rope_parameters.sliding_attention); the other layers use rope_theta / rope_scaling.
  bool sliding_layers_own_rope = false;
  float sliding_rope_theta = 10000.0f;
  RopeScaling sliding_rope_scaling;
  // Sliding-window attention (Mistral, Mixtral, Qwen2, Gemma, gpt-oss): the window size W when
  // enabled; a windowed layer's query i sees keys j with i - j < W (HF). Which layers use it:
  // window_layers.
  std::optional<int> sliding_window;
  // [num_layers] when only some layers use the window (Qwen2: layer_types, or layer index >=
  // max_window_layers; Gemma, gpt-oss: layer_types or their alternation rule); empty means every
  // layer (Mistral, Mixtral).
  std::vector<bool> window_layers;
  DType dtype = DType::kF32;  // torch_dtype of the checkpoint
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  WeightQuantization quantization;
  GenerationDefaults generation;

  // Softmax scale of attention: head_dim^-0.5 (query_pre_attn_scalar^-0.5 where given), times
  // the yarn attention factor squared.
  float SoftmaxScale() const;
  // The rope settings a layer rotates with (sliding_layers_own_rope).
  float LayerRopeTheta(int layer) const {
    return sliding_layers_own_rope && WindowLeft(layer) >= 0 ? sliding_rope_theta : rope_theta;
  }
  const RopeScaling& LayerRopeScaling(int layer) const {
    return sliding_layers_own_rope && WindowLeft(layer) >= 0 ? sliding_rope_scaling : rope_scaling;
  }

  // AttentionParams::window_left of a layer: W - 1 when it uses the window, else -1.
  int WindowLeft(int layer) const {
    if (!sliding_window) return -1;
    if (!window_layers.empty() && !window_layers[layer]) return -1;
    return *sliding_window - 1;
  }
  bool AnyLayerWindowed() const {
    for (int l = 0; l < num_layers; ++l) {
      if (WindowLeft(l) >= 0) return true;
    }
    return false;
  }

  int q_size() const { return num_q_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
};

// bos/eos ids from config.json's object and generation_config.json (whose eos ids win unless
// null); every eos id must lie inside the vocabulary (c->vocab_size set first); the sampling
// defaults of generation_config.json. Shared by the config loaders.
Status ReadSpecialTokenIds(const std::string& model_dir, const nlohmann::json& config_json,
                           ModelConfig* c);

// "quantization_config" of config.json: fp8 methods are read (and mxfp4 when `allow_mxfp4`:
// gpt-oss), any other is Unimplemented ("quantization method X is not supported"). Shared by the
// config loaders.
Status ReadQuantizationConfig(const nlohmann::json& config_json, const std::string& file,
                              WeightQuantization* out, bool allow_mxfp4 = false);

// Reads config.json and, when present, generation_config.json (whose eos ids win).
// Unknown architectures and missing or inconsistent fields are errors that name them.
StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace llm
