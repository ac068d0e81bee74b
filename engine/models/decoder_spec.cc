#include "engine/models/decoder_spec.h"

#include "engine/models/rope.h"

namespace llm {
namespace {

// Llama, Mistral, Qwen2, Qwen3: pre-norm attention and a dense SiLU MLP; biases, windows and
// Qwen3's per-head q/k norms from the config.
DecoderSpec LlamaLayers(const ModelConfig& c) {
  DecoderSpec spec;
  spec.rms_norm_eps = c.rms_norm_eps;
  const std::vector<float> inv_freq = RopeInvFreq(c);
  spec.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    DecoderLayerSpec& L = spec.layers[l];
    L.qkv_bias = c.qkv_bias;
    L.qk_norm = c.qk_norm;
    L.o_bias = c.o_bias;
    L.inv_freq = inv_freq;
    L.window_left = c.WindowLeft(l);
    L.softmax_scale = c.SoftmaxScale();
    L.intermediate = c.intermediate_size;
    L.mlp_bias = c.mlp_bias;
  }
  return spec;
}

}  // namespace

StatusOr<DecoderSpec> MakeDecoderSpec(const ModelConfig& c) {
  switch (c.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return LlamaLayers(c);
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      break;  // DeepseekModel (multi-head latent attention)
  }
  return Unimplemented("the CPU decoder does not implement " + c.architecture_name);
}

}  // namespace llm
