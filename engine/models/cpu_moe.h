// The routed mixture-of-experts feed-forward block of the CPU models (Mixtral, Qwen3-MoE,
// DeepSeekMoE): an fp32 router, the top-k gate of moe_router.h, each selected expert's gated MLP
// on its rows, the weighted sum, plus always-on shared experts (DeepSeek).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/base/status.h"
#include "engine/models/cpu_mlp.h"
#include "engine/models/model.h"
#include "engine/models/moe_router.h"
#include "engine/safetensors.h"

namespace llm {

// Where one MoE block's tensors are, under the layer prefix ("model.layers.3."):
//   block + router + ".weight"                    [num_experts, hidden]
//   block + router + "." + selection_bias         [num_experts] (when not empty)
//   block + experts + "." + e + "." + expert names (gate, up, down)
//   block + shared + "." + expert names           (when shared_intermediate > 0)
struct MoeTensorNames {
  std::string block = "mlp.";
  std::string router = "gate";
  std::string selection_bias;  // DeepSeek noaux_tc: e_score_correction_bias
  std::string experts = "experts";
  MlpTensorNames expert;
  std::string shared = "shared_experts";
};

struct CpuMoe {
  MoeRouting routing;
  std::vector<float> router;          // [num_experts, hidden]
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

// Reads one MoE block: router, optional selection bias, experts of `intermediate`, shared
// experts of `shared_intermediate` (0: none).
Status ReadCpuMoe(const WeightStore& w, const std::string& layer_prefix,
                  const MoeTensorNames& names, const MoeRouting& routing, int hidden,
                  int intermediate, int shared_intermediate, CpuMoe* out);

}  // namespace llm
