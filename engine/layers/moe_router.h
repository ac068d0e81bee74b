// The MoE gate of one token on the CPU, for every routed-MoE architecture (the CPU models' one
// router; the CUDA MoE layer's routing, kernels/cuda/moe/moe_route.cuh, follows it, one warp per
// token, in the routing kernel and in the fused small-batch routing), and the margin of its
// decision for the routing trace (Model::set_routing_trace).
//
// Selection, for one token's router logits [E = num_experts] (computed in fp32):
//   scores  = softmax(logits) or sigmoid(logits), or the logits themselves (kSoftmaxOfTopK)
//                                                                                  (scoring)
//   choice  = scores + selection bias (DeepSeek noaux_tc's e_score_correction_bias: selection
//           only), else scores
//   groups  (kGroupLimited, kGroupSumTop2): E / n_group consecutive experts per group; a group's
//           score is its best choice (kGroupLimited, DeepSeek group_limited_greedy) or the sum of
//           its two best (kGroupSumTop2, noaux_tc); the topk_group best groups are kept and the
//           other groups' experts get choice -inf: never selected (DeepSeek's reference and
//           transformers 5; transformers 4 masked them with 0.0, which a negative choice, a
//           sigmoid score plus a negative selection bias, loses to)
//   experts = the top_k largest choices; ties go to the lower index (groups likewise)
//   weights = scores (weigh_unbiased) or choices of those experts; divided by their sum (+
//           norm_eps) when `normalize`; times `scaling`. kSoftmaxOfTopK (gpt-oss): the softmax
//           of the selected logits (HF topk, then softmax over the k values)
//
// The architectures set these from their configs: Mixtral softmax, greedy, normalize; Qwen3-MoE
// softmax, greedy, normalize = norm_topk_prob; gpt-oss kSoftmaxOfTopK (its router bias is part
// of the logits, CpuMoe); DeepSeek its topk_method, scoring_func,
// norm_topk_prob (only with top_k > 1), norm_eps 1e-20 and routed_scaling_factor (V2: only
// without normalization) (DeepseekConfig::Routing).
//
// Margin: how far the selection scores are from selecting another expert set, in the units of
// `choice` (probabilities for softmax; sigmoid values, plus bias, for sigmoid):
//   expert gap = choice[last selected] - choice[best not selected], in the masked choices the
//                selection ranks (a dropped group's expert does not compete)
//   group gap  = score[last kept group] - score[best dropped group], counted only when keeping the
//                dropped group instead would select another expert set
//   margin     = the smaller counted gap: 0 at an exact tie, +inf when nothing can change (every
//                expert selected, no group dropped)
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "engine/loader/moe_routing.h"

namespace llm {

// One MoE routing decision, recorded on request (Model::set_routing_trace): the routed experts
// one token chose at one layer.
struct MoeRoutingDecision {
  int32_t row = 0;               // row of the forward batch
  int32_t position = 0;          // the token's position in its sequence
  int32_t layer = 0;             // decoder layer (MoE layers only)
  std::vector<int32_t> experts;  // the selected routed experts, ascending
  // How far the decision was from changing, in the router's selection-score units
  // (engine/layers/moe_router.h); NaN where the model does not compute it (CUDA).
  float margin = std::numeric_limits<float>::quiet_NaN();
};

class MoeRouter {
 public:
  explicit MoeRouter(const MoeRouting& routing);

  // Routes one token. logits: [E]; bias: [E] (selection bias) or null. Writes the top_k experts
  // in selection order (best first) and their weights; with `margin` non-null, the decision's
  // margin (file comment). Identical selections and weights either way.
  void Route(const float* logits, const float* bias, int32_t* experts, float* weights,
             float* margin);

 private:
  // The `count` best experts of choice_ with the groups not in keep_ masked to -inf (into
  // masked_), best first, into order[0, count).
  void TopExperts(int count, std::vector<int>* order);

  const MoeRouting r_;
  std::vector<float> scores_, choice_, masked_, group_score_;  // [E], [E], [E], [n_group]
  std::vector<int> order_, alt_order_, group_order_;           // [E], [E], [n_group]
  std::vector<char> keep_;                                     // [n_group]
};

}  // namespace llm
