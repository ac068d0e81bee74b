// The softmax-and-weighted-sum step every CPU attention reference shares.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace llm {

// scores[0, n): scaled logits of one query row (overwritten with unnormalized probabilities).
// out[0, width) = softmax(scores) . rows, where row j starts at row(j). acc is scratch of width.
// Returns the natural-log sum-exp of the scores.
template <typename RowFn>
float SoftmaxWeightedSum(float* scores, int n, RowFn row, int width, float* acc, float* out) {
  float max_score = -INFINITY;
  for (int j = 0; j < n; ++j) max_score = std::max(max_score, scores[j]);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  std::fill(acc, acc + width, 0.0f);
  for (int j = 0; j < n; ++j) {
    const float* r = row(j);
    const float p = scores[j];
    for (int i = 0; i < width; ++i) acc[i] += p * r[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < width; ++i) out[i] = acc[i] * inv;
  return max_score + std::log(sum);
}

}  // namespace llm
