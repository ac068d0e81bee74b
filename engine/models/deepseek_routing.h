// The DeepSeekMoE gate of one token on the CPU (HF MoEGate semantics; DeepseekModel's routing,
// which the CUDA routing kernel in kernels/cuda/deepseek_ops.cu mirrors line by line), and the
// margin of its decision for the routing trace (Model::set_routing_trace).
//
// Selection, for one token's router logits [E = n_routed_experts]:
//   scores  = softmax(logits) or sigmoid(logits)                          (scoring_func)
//   choice  = scores + e_score_correction_bias (noaux_tc; selection only), else scores
//   groups  (group_limited_greedy, noaux_tc): E / n_group consecutive experts per group; a group's
//           score is its best choice (group_limited_greedy) or the sum of its two best (noaux_tc);
//           the topk_group best groups are kept and the other groups' experts get choice 0.0
//           (HF masked_fill), not -inf
//   experts = the top_k largest choices; ties go to the lower index (groups likewise)
//   weights = scores (noaux_tc) or choices (the others) of those experts, normalized when
//           norm_topk_prob and top_k > 1, times routed_scaling_factor (V3 always; V2 only when it
//           does not normalize)
//
// Margin: how far the selection scores are from selecting another expert set, in the units of
// `choice` (probabilities for softmax; sigmoid values, plus bias, for sigmoid):
//   expert gap = choice[last selected] - choice[best not selected], in the masked choices the
//                selection ranks (a dropped group's expert competes with its 0.0)
//   group gap  = score[last kept group] - score[best dropped group], counted only when keeping the
//                dropped group instead would select another expert set
//   margin     = the smaller counted gap: 0 at an exact tie, +inf when nothing can change (every
//                expert selected, no group dropped)
#pragma once

#include <cstdint>
#include <vector>

#include "engine/models/deepseek_config.h"

namespace llm {

class DeepseekRouter {
 public:
  // Keeps a reference to `config`, which must outlive the router.
  explicit DeepseekRouter(const DeepseekConfig& config);

  // Routes one token. logits: [E]; bias: [E] (noaux_tc's correction bias) or null. Writes the
  // top_k experts in selection order (best first) and their weights; with `margin` non-null, the
  // decision's margin (file comment). Identical selections and weights either way.
  void Route(const float* logits, const float* bias, int32_t* experts, float* weights,
             float* margin);

 private:
  // The `count` best experts of choice_ with the groups not in keep_ masked to 0.0 (into
  // masked_), best first, into order[0, count).
  void TopExperts(int count, std::vector<int>* order);

  const DeepseekConfig& d_;
  std::vector<float> scores_, choice_, masked_, group_score_;  // [E], [E], [E], [n_group]
  std::vector<int> order_, alt_order_, group_order_;           // [E], [E], [n_group]
  std::vector<char> keep_;                                     // [n_group]
};

}  // namespace llm
