#include "engine/architectures/decoder_spec.h"

#include <cmath>

#include "base/dtype.h"
#include "engine/loader/rope.h"

namespace llm {
namespace {

// A scale as the checkpoint's dtype holds it: transformers multiplies by a tensor of the model
// dtype (Gemma's embedding normalizer), so a bf16 model scales by the bf16-rounded value.
float InModelDtype(float v, DType t) {
  switch (t) {
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(v));
    case DType::kF16:
      return F16ToF32(F32ToF16(v));
    default:
      return v;
  }
}

CpuMlp::Activation GateActivation(HiddenAct a) {
  switch (a) {
    case HiddenAct::kSilu:
      break;
    case HiddenAct::kGeluTanh:
      return CpuMlp::Activation::kGeluTanh;
  }
  return CpuMlp::Activation::kSilu;
}

// Every architecture here: pre-norm attention with optional biases, per-head q/k norms, windows
// and per-layer rope tables from the config, then a dense gated MLP; the MoE and Gemma families
// change parts of it below.
DecoderSpec CommonLayers(const ModelConfig& c) {
  DecoderSpec spec;
  spec.rms_norm_eps = c.rms_norm_eps;
  spec.final_logit_softcap = c.final_logit_softcap;
  spec.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    DecoderLayerSpec& L = spec.layers[l];
    L.qkv_bias = c.qkv_bias;
    L.qk_norm = c.qk_norm;
    L.o_bias = c.o_bias;
    L.inv_freq =
        RopeInvFreq(c.head_dim, static_cast<double>(c.LayerRopeTheta(l)), c.LayerRopeScaling(l));
    L.window_left = c.WindowLeft(l);
    L.softmax_scale = c.SoftmaxScale();
    L.logit_softcap = c.attn_logit_softcap;
    L.sinks = c.attention_sinks;
    L.intermediate = c.intermediate_size;
    L.mlp_bias = c.mlp_bias;
    L.gate.activation = GateActivation(c.hidden_act);
  }
  return spec;
}

// Mixtral: block_sparse_moe.{gate, experts.N.{w1, w3, w2}}, softmax top-k renormalized.
// Qwen3-MoE: mlp.{gate, experts.N.{gate,up,down}_proj} on its MoE layers, softmax top-k,
// renormalized with norm_topk_prob.
void MoeLayers(const ModelConfig& c, DecoderSpec* spec) {
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.moe.Layer(l)) continue;
    DecoderLayerSpec& L = spec->layers[l];
    L.ffn = DecoderLayerSpec::Ffn::kMoe;
    L.moe_intermediate = c.moe.intermediate;
    L.routing.num_experts = c.moe.num_experts;
    L.routing.top_k = c.moe.top_k;
    L.routing.scoring = MoeRouting::Scoring::kSoftmax;
    L.routing.normalize = c.moe.normalize;
    if (c.architecture == Architecture::kMixtral) {
      L.moe_names.block = "block_sparse_moe.";
      L.moe_names.expert = {"w1", "w3", "w2"};
    }
  }
}

// Gemma 2 / 3: (1 + w) RMSNorms, four per layer (post-attention and pre/post-feed-forward), the
// embedding scaled by sqrt(hidden) in the model dtype; scale, soft-caps, GeGLU, windows and the
// per-layer-type rope come through the config.
void GemmaLayers(const ModelConfig& c, DecoderSpec* spec) {
  spec->norm_weight_offset = 1.0f;
  spec->embed_scale = InModelDtype(std::sqrt(static_cast<float>(c.hidden_size)), c.dtype);
  for (DecoderLayerSpec& L : spec->layers) {
    L.attn_out_norm = "post_attention_layernorm";
    L.ffn_in_norm = "pre_feedforward_layernorm";
    L.ffn_out_norm = "post_feedforward_layernorm";
  }
}

// gpt-oss: every layer MoE under mlp.{router (with bias), experts} with the experts stacked
// (gate_up_proj [E, hidden, 2I] interleaved, down_proj [E, I, hidden], with biases; or MXFP4
// blocks), top-k of the router logits then softmax over them, clamped SwiGLU.
void GptOssLayers(const ModelConfig& c, DecoderSpec* spec) {
  for (DecoderLayerSpec& L : spec->layers) {
    L.ffn = DecoderLayerSpec::Ffn::kMoe;
    L.moe_intermediate = c.moe.intermediate;
    L.routing.num_experts = c.moe.num_experts;
    L.routing.top_k = c.moe.top_k;
    L.routing.scoring = MoeRouting::Scoring::kSoftmaxOfTopK;
    L.gate.activation = CpuMlp::Activation::kClampedSwiGlu;
    L.gate.swiglu_limit = c.moe.swiglu_limit;
    L.moe_names.router = "router";
    L.moe_names.router_bias = true;
    L.moe_names.stacked_experts = true;
    L.moe_names.expert = {"gate_up_proj", "", "down_proj"};
    L.moe_names.expert_bias = true;
  }
}

}  // namespace

StatusOr<DecoderSpec> MakeDecoderSpec(const ModelConfig& c) {
  switch (c.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return CommonLayers(c);
    case Architecture::kMixtral:
    case Architecture::kQwen3Moe: {
      DecoderSpec spec = CommonLayers(c);
      MoeLayers(c, &spec);
      return spec;
    }
    case Architecture::kGemma2:
    case Architecture::kGemma3: {
      DecoderSpec spec = CommonLayers(c);
      GemmaLayers(c, &spec);
      return spec;
    }
    case Architecture::kGptOss: {
      DecoderSpec spec = CommonLayers(c);
      GptOssLayers(c, &spec);
      return spec;
    }
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      break;  // cpu_deepseek_decoder (multi-head latent attention)
  }
  return Unimplemented("the CPU decoder does not implement " + c.architecture_name);
}

}  // namespace llm
