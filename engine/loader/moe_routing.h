// What a model's config says about its MoE gate: the scoring, the expert groups, top-k and the
// weights' normalization. Read by each architecture's config loader; the selection it defines is
// written out in engine/layers/moe_router.h, which the CPU router and the CUDA routing kernel
// follow.
#pragma once

namespace llm {

struct MoeRouting {
  enum class Scoring { kSoftmax, kSigmoid, kSoftmaxOfTopK };
  enum class Groups { kNone, kGroupLimited, kGroupSumTop2 };
  int num_experts = 0;
  int top_k = 0;
  Scoring scoring = Scoring::kSoftmax;
  Groups groups = Groups::kNone;
  int n_group = 1;
  int topk_group = 1;
  bool weigh_unbiased = false;  // weights from the scores, not the biased choices
  bool normalize = false;
  float norm_eps = 0.0f;
  float scaling = 1.0f;
};

}  // namespace llm
