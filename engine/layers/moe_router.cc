#include "engine/layers/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace llm {

MoeRouter::MoeRouter(const MoeRouting& routing)
    : r_(routing),
      scores_(routing.num_experts),
      choice_(routing.num_experts),
      masked_(routing.num_experts),
      group_score_(routing.n_group),
      order_(routing.num_experts),
      alt_order_(routing.num_experts),
      group_order_(routing.n_group),
      keep_(routing.n_group, 1) {}

void MoeRouter::TopExperts(int count, std::vector<int>* order) {
  const int E = r_.num_experts, per = E / r_.n_group;
  for (int e = 0; e < E; ++e) masked_[e] = keep_[e / per] ? choice_[e] : -INFINITY;
  std::iota(order->begin(), order->begin() + E, 0);
  std::partial_sort(order->begin(), order->begin() + count, order->begin() + E, [&](int a, int b) {
    return masked_[a] > masked_[b] || (masked_[a] == masked_[b] && a < b);
  });
}

void MoeRouter::Route(const float* l, const float* bias, int32_t* experts, float* weights,
                      float* margin) {
  const int E = r_.num_experts, K = r_.top_k, G = r_.n_group;
  if (r_.scoring == MoeRouting::Scoring::kSoftmax) {
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (scores_[e] = std::exp(l[e] - mx));
    for (int e = 0; e < E; ++e) scores_[e] /= sum;
  } else if (r_.scoring == MoeRouting::Scoring::kSigmoid) {
    for (int e = 0; e < E; ++e) scores_[e] = 1.0f / (1.0f + std::exp(-l[e]));
  } else {
    std::copy(l, l + E, scores_.begin());
  }
  // Selection scores; a selection bias (noaux_tc) changes the choice, not the weights.
  for (int e = 0; e < E; ++e) choice_[e] = scores_[e] + (bias == nullptr ? 0.0f : bias[e]);
  const bool grouped = r_.groups != MoeRouting::Groups::kNone;
  // The margin needs the best group and expert left out as well: one more of each, sorted by the
  // same total order, so the first topk_group / top_k are unchanged.
  const int extra = margin != nullptr ? 1 : 0;
  if (grouped) {
    const int per = E / G;
    for (int g = 0; g < G; ++g) {
      const float* s = choice_.data() + g * per;
      if (r_.groups == MoeRouting::Groups::kGroupLimited) {
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
    const int ng = std::min(G, r_.topk_group + extra);
    std::partial_sort(
        group_order_.begin(), group_order_.begin() + ng, group_order_.end(), [&](int a, int b) {
          return group_score_[a] > group_score_[b] || (group_score_[a] == group_score_[b] && a < b);
        });
    std::fill(keep_.begin(), keep_.end(), 0);
    for (int i = 0; i < r_.topk_group; ++i) keep_[group_order_[i]] = 1;
  }
  TopExperts(std::min(E, K + extra), &order_);
  float sum = 0.0f;
  for (int i = 0; i < K; ++i) {
    experts[i] = order_[i];
    // noaux_tc weighs with the unbiased scores; the others with the (masked) topk values.
    weights[i] = r_.weigh_unbiased ? scores_[order_[i]] : masked_[order_[i]];
    sum += weights[i];
  }
  if (r_.scoring == MoeRouting::Scoring::kSoftmaxOfTopK) {
    const float mx = *std::max_element(weights, weights + K);
    sum = 0.0f;
    for (int i = 0; i < K; ++i) sum += (weights[i] = std::exp(weights[i] - mx));
    for (int i = 0; i < K; ++i) weights[i] /= sum;
  }
  for (int i = 0; i < K; ++i) {
    if (r_.normalize) weights[i] /= sum + r_.norm_eps;
    weights[i] *= r_.scaling;
  }
  if (margin == nullptr) return;

  float m = K < E ? masked_[order_[K - 1]] - masked_[order_[K]] : INFINITY;
  if (grouped && r_.topk_group < G) {
    const int last = group_order_[r_.topk_group - 1], dropped = group_order_[r_.topk_group];
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
