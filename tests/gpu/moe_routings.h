// The routing rules of the MoE GPU tests (MoeRouting values of the real architectures' shapes),
// shared by test_moe_layer.cc and test_moe_route_fused.cc.
#pragma once

#include "engine/loader/moe_routing.h"

namespace llm::gpu_test {

inline MoeRouting V2Routing(int E, int K) {  // softmax, group max, no normalization
  MoeRouting r;
  r.num_experts = E;
  r.top_k = K;
  r.groups = MoeRouting::Groups::kGroupLimited;
  r.n_group = 4;
  r.topk_group = 2;
  r.scaling = 1.5f;
  return r;
}

inline MoeRouting V3Routing(int E, int K) {  // sigmoid + bias, sum of top two, normalized, scaled
  MoeRouting r;
  r.num_experts = E;
  r.top_k = K;
  r.scoring = MoeRouting::Scoring::kSigmoid;
  r.groups = MoeRouting::Groups::kGroupSumTop2;
  r.n_group = 4;
  r.topk_group = 2;
  r.weigh_unbiased = true;
  r.normalize = true;
  r.norm_eps = 1e-20f;
  r.scaling = 2.5f;
  return r;
}

inline MoeRouting GptOssRouting(int E, int K) {  // top-k of the logits, softmax over the selected
  MoeRouting r;
  r.num_experts = E;
  r.top_k = K;
  r.scoring = MoeRouting::Scoring::kSoftmaxOfTopK;
  return r;
}

inline MoeRouting GreedyRouting(int E, int K) {  // Mixtral / Qwen3-MoE
  MoeRouting r;
  r.num_experts = E;
  r.top_k = K;
  r.normalize = true;
  return r;
}

}  // namespace llm::gpu_test
