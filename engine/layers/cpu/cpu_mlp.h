// The gated feed-forward block of the CPU models (dense layers, MoE experts, shared experts):
// out = down(act(gate(x)) * up(x)) (+ biases), fp32, gate and up stacked into one matrix at load.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/loader/safetensors.h"

namespace llm {

// Tensor names of one gated MLP under its prefix ("model.layers.3.mlp."): Llama's gate_proj /
// up_proj / down_proj, Mixtral's experts' w1 / w3 / w2.
struct MlpTensorNames {
  std::string gate = "gate_proj";
  std::string up = "up_proj";
  std::string down = "down_proj";
};

struct CpuMlp {
  // The gate activation (cpu_ops.h): SiLU (Llama), GELU-tanh (Gemma's GeGLU), gpt-oss's clamped
  // SwiGLU, whose gate/up rows are interleaved (gate 2i, up 2i + 1) as its checkpoint stores them.
  enum class Activation { kSilu, kGeluTanh, kClampedSwiGlu };
  struct Gate {
    Activation activation = Activation::kSilu;
    float swiglu_alpha = 1.702f;  // kClampedSwiGlu (GptOssExperts' constants)
    float swiglu_limit = 7.0f;
  };

  int hidden = 0;
  int intermediate = 0;  // 0: absent
  Gate gate;
  std::vector<float> w_gate_up;  // [2 * intermediate, hidden] (gate, up stacked or interleaved)
  std::vector<float> w_down;     // [hidden, intermediate]
  std::vector<float> b_gate_up;  // [2 * intermediate] or empty
  std::vector<float> b_down;     // [hidden] or empty

  bool present() const { return intermediate > 0; }
  // out[rows, hidden] = the block applied to x[rows, hidden].
  void Forward(const float* x, int rows, float* out) const;
};

// Reads `prefix + name + ".weight"` (and ".bias" when `bias`) for gate, up and down.
Status ReadCpuMlp(const WeightStore& w, const std::string& prefix, const MlpTensorNames& names,
                  int hidden, int intermediate, bool bias, CpuMlp* out,
                  const CpuMlp::Gate& gate = {});

}  // namespace llm
