#include "engine/models/deepseek_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace llm {

DeepseekRouter::DeepseekRouter(const DeepseekConfig& config)
    : d_(config),
      scores_(config.n_routed_experts),
      choice_(config.n_routed_experts),
      masked_(config.n_routed_experts),
      group_score_(config.n_group),
      order_(config.n_routed_experts),
      alt_order_(config.n_routed_experts),
      group_order_(config.n_group),
      keep_(config.n_group, 1) {}

void DeepseekRouter::TopExperts(int count, std::vector<int>* order) {
  const int E = d_.n_routed_experts, per = E / d_.n_group;
  for (int e = 0; e < E; ++e) masked_[e] = keep_[e / per] ? choice_[e] : 0.0f;
  std::iota(order->begin(), order->begin() + E, 0);
  std::partial_sort(order->begin(), order->begin() + count, order->begin() + E, [&](int a, int b) {
    return masked_[a] > masked_[b] || (masked_[a] == masked_[b] && a < b);
  });
}

void DeepseekRouter::Route(const float* l, const float* bias, int32_t* experts, float* weights,
                           float* margin) {
  using Method = DeepseekConfig::TopkMethod;
  const int E = d_.n_routed_experts, K = d_.num_experts_per_tok, G = d_.n_group;
  if (d_.scoring == DeepseekConfig::Scoring::kSoftmax) {
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (scores_[e] = std::exp(l[e] - mx));
    for (int e = 0; e < E; ++e) scores_[e] /= sum;
  } else {
    for (int e = 0; e < E; ++e) scores_[e] = 1.0f / (1.0f + std::exp(-l[e]));
  }
  // Selection scores; noaux_tc adds the correction bias (selection only, not the weights).
  for (int e = 0; e < E; ++e) choice_[e] = scores_[e] + (bias == nullptr ? 0.0f : bias[e]);
  const bool grouped = d_.topk_method != Method::kGreedy;
  // The margin needs the best group and expert left out as well: one more of each, sorted by the
  // same total order, so the first topk_group / top_k are unchanged.
  const int extra = margin != nullptr ? 1 : 0;
  if (grouped) {
    const int per = E / G;
    for (int g = 0; g < G; ++g) {
      const float* s = choice_.data() + g * per;
      if (d_.topk_method == Method::kGroupLimitedGreedy) {
        group_score_[g] = *std::max_element(s, s + per);  // best expert of the group
      } else {
        float a = -INFINITY, b = -INFINITY;  // sum of the group's top two
        for (int i = 0; i < per; ++i) {
          if (s[i] > a) {
            b = a;
            a = s[i];
          } else if (s[i] > b) {
            b = s[i];
          }
        }
        group_score_[g] = a + b;
      }
    }
    std::iota(group_order_.begin(), group_order_.end(), 0);
    const int ng = std::min(G, d_.topk_group + extra);
    std::partial_sort(
        group_order_.begin(), group_order_.begin() + ng, group_order_.end(), [&](int a, int b) {
          return group_score_[a] > group_score_[b] || (group_score_[a] == group_score_[b] && a < b);
        });
    std::fill(keep_.begin(), keep_.end(), 0);
    for (int i = 0; i < d_.topk_group; ++i) keep_[group_order_[i]] = 1;
  }
  TopExperts(std::min(E, K + extra), &order_);
  float sum = 0.0f;
  for (int i = 0; i < K; ++i) {
    experts[i] = order_[i];
    // noaux_tc weighs with the unbiased scores; the others with the (masked) topk values.
    weights[i] = d_.topk_method == Method::kNoauxTc ? scores_[order_[i]] : masked_[order_[i]];
    sum += weights[i];
  }
  const bool normalize = K > 1 && d_.norm_topk_prob;
  for (int i = 0; i < K; ++i) {
    if (normalize) weights[i] /= sum + 1e-20f;
    // V3 always scales; DeepSeek-V2's gate scales only when it does not normalize.
    if (d_.is_v3() || !normalize) weights[i] *= d_.routed_scaling_factor;
  }
  if (margin == nullptr) return;

  float m = K < E ? masked_[order_[K - 1]] - masked_[order_[K]] : INFINITY;
  if (grouped && d_.topk_group < G) {
    const int last = group_order_[d_.topk_group - 1], dropped = group_order_[d_.topk_group];
    const float gap = group_score_[last] - group_score_[dropped];
    if (gap < m) {
      // Counted only if keeping `dropped` instead of `last` selects another expert set.
      keep_[last] = 0;
      keep_[dropped] = 1;
      TopExperts(K, &alt_order_);
      std::vector<int> a(order_.begin(), order_.begin() + K);
      std::vector<int> b(alt_order_.begin(), alt_order_.begin() + K);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) m = gap;
    }
  }
  *margin = m;
}

}  // namespace llm
