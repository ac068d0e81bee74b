// The routed mixture-of-experts feed-forward block of the CPU models (Mixtral, Qwen3-MoE,
// DeepSeekMoE): an fp32 router, the top-k gate of moe_router.h, each selected expert's gated MLP
// on its rows, the weighted sum, plus always-on shared experts (DeepSeek).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/layers/cpu/cpu_mlp.h"
#include "engine/layers/moe_router.h"
#include "engine/loader/safetensors.h"

namespace llm {

// Where one MoE block's tensors are, under the layer prefix ("model.layers.3."):
//   block + router + ".weight"                    [num_experts, hidden]
//   block + router + ".bias"                      [num_experts] (router_bias: added to the logits)
//   block + router + "." + selection_bias         [num_experts] (when not empty)
//   block + experts + "." + e + "." + expert names (gate, up, down; ".bias" too with expert_bias)
//   block + shared + "." + expert names           (when shared_intermediate > 0)
// or, with stacked_experts (gpt-oss), all experts in one tensor each, input dimension first:
//   block + experts + "." + gate                  [E, hidden, 2 * intermediate] (gate/up
//                                                 interleaved), + "_bias" [E, 2 * intermediate]
//   block + experts + "." + down                  [E, intermediate, hidden], + "_bias" [E, hidden]
//   an MXFP4 checkpoint stores gate / down as "_blocks" + "_scales" instead (mxfp4.h), output
//   dimension first ([E, 2 * intermediate, hidden / 32, 16] and [E, hidden, intermediate / 32,
//   16]).
struct MoeTensorNames {
  std::string block = "mlp.";
  std::string router = "gate";
  std::string selection_bias;  // DeepSeek noaux_tc: e_score_correction_bias
  bool router_bias = false;    // gpt-oss
  std::string experts = "experts";
  MlpTensorNames expert;
  bool expert_bias = false;
  bool stacked_experts = false;
  std::string shared = "shared_experts";
};

struct CpuMoe {
  MoeRouting routing;
  std::vector<float> router;          // [num_experts, hidden]
  std::vector<float> router_bias;     // [num_experts] or empty
  std::vector<float> selection_bias;  // [num_experts] or empty
  std::vector<CpuMlp> experts;        // [num_experts]
  CpuMlp shared;                      // absent unless shared experts

  // Where Forward records its decisions (Model::set_routing_trace); null: none.
  struct Trace {
    std::vector<MoeRoutingDecision>* out = nullptr;
    int layer = 0;
    const int32_t* positions = nullptr;  // [rows]
  };
  // out[rows, hidden] = the block applied to x[rows, hidden].
  void Forward(const float* x, int rows, const Trace& trace, float* out) const;
};

// One stacked expert matrix `name` as [E, out_dim, in] fp32 (the Linear layout): from the
// checkpoint's [E, in, out_dim] float tensor (transposed), or from MXFP4 `name + "_blocks"`
// [E, out_dim, in / 32, 16] u8 and `name + "_scales"` [E, out_dim, in / 32] e8m0 (dequantized;
// only in a checkpoint whose quantization_config says mxfp4).
Status ReadExpertMatrix(const WeightStore& w, const std::string& name, int64_t E, int64_t in,
                        int64_t out_dim, std::vector<float>* out);

// Reads one MoE block: router, optional router and selection biases, experts of `intermediate`
// with the `gate` activation, shared experts of `shared_intermediate` (0: none).
Status ReadCpuMoe(const WeightStore& w, const std::string& layer_prefix,
                  const MoeTensorNames& names, const MoeRouting& routing, int hidden,
                  int intermediate, int shared_intermediate, CpuMoe* out,
                  const CpuMlp::Gate& gate = {});

}  // namespace llm
