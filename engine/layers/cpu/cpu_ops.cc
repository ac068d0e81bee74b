#include "engine/layers/cpu/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace llm::cpu {

void Linear(const float* x, const float* w, const float* bias, int m, int n, int k, float* y) {
  if (m == 0) return;
  if (bias != nullptr) {
    for (int i = 0; i < m; ++i) std::copy(bias, bias + n, y + static_cast<size_t>(i) * n);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k,
              bias != nullptr ? 1.0f : 0.0f, y, n);
}

void RmsNorm(const float* x, const float* w, int rows, int dim, float eps, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* yr = y + static_cast<size_t>(r) * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

void SiluMul(const float* gate_up, int rows, int inter, float* act) {
  for (int t = 0; t < rows; ++t) {
    const float* g = gate_up + static_cast<size_t>(t) * 2 * inter;
    const float* u = g + inter;
    float* a = act + static_cast<size_t>(t) * inter;
    for (int i = 0; i < inter; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void GeluTanhMul(const float* gate_up, int rows, int inter, float* act) {
  const float k = std::sqrt(2.0f / std::numbers::pi_v<float>);
  for (int t = 0; t < rows; ++t) {
    const float* g = gate_up + static_cast<size_t>(t) * 2 * inter;
    const float* u = g + inter;
    float* a = act + static_cast<size_t>(t) * inter;
    for (int i = 0; i < inter; ++i) {
      const float x = g[i];
      a[i] = 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x))) * u[i];
    }
  }
}

void ClampedSwiGlu(const float* gate_up, int rows, int inter, float alpha, float limit,
                   float* act) {
  for (int t = 0; t < rows; ++t) {
    const float* gu = gate_up + static_cast<size_t>(t) * 2 * inter;
    float* a = act + static_cast<size_t>(t) * inter;
    for (int i = 0; i < inter; ++i) {
      const float gate = std::min(gu[2 * i], limit);
      const float up = std::clamp(gu[2 * i + 1], -limit, limit);
      const float glu = gate / (1.0f + std::exp(-alpha * gate));
      a[i] = (up + 1.0f) * glu;
    }
  }
}

void FinalLogits(const float* x, const std::vector<int32_t>& rows, const float* norm,
                 const float* head, int hidden, int vocab, float eps, std::vector<float>* logits) {
  const int r_count = static_cast<int>(rows.size());
  std::vector<float> last(static_cast<size_t>(r_count) * hidden);
  for (int r = 0; r < r_count; ++r) {
    RmsNorm(x + static_cast<size_t>(rows[r]) * hidden, norm, 1, hidden, eps,
            last.data() + static_cast<size_t>(r) * hidden);
  }
  logits->resize(static_cast<size_t>(r_count) * vocab);
  Linear(last.data(), head, nullptr, r_count, vocab, hidden, logits->data());
}

}  // namespace llm::cpu
