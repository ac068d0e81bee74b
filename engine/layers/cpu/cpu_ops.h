// fp32 building blocks shared by the CPU models (the numerical oracle): matrix products through
// OpenBLAS, RMSNorm, the gated activations (SiLU, GELU-tanh, gpt-oss's clamped SwiGLU), and the
// final norm + LM head over the sampled rows.
#pragma once

#include <cstdint>
#include <vector>

namespace llm::cpu {

// y[m, n] = x[m, k] @ w[n, k]^T (+ bias[n] when not null).
void Linear(const float* x, const float* w, const float* bias, int m, int n, int k, float* y);

// y[r] = x[r] / rms(x[r]) * w, for `rows` rows of `dim` (sum of squares in double).
void RmsNorm(const float* x, const float* w, int rows, int dim, float eps, float* y);

// act[t, :] = silu(gate_up[t, :inter]) * gate_up[t, inter:], for `rows` rows.
void SiluMul(const float* gate_up, int rows, int inter, float* act);

// act[t, :] = gelu_tanh(gate_up[t, :inter]) * gate_up[t, inter:] (Gemma's GeGLU with
// hidden_activation gelu_pytorch_tanh: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))).
void GeluTanhMul(const float* gate_up, int rows, int inter, float* act);

// gpt-oss's clamped SwiGLU over an interleaved projection: gate = gate_up[t, 2i], up =
// gate_up[t, 2i + 1]; gate clamped to <= limit, up to [-limit, limit];
// act[t, i] = (up + 1) * gate * sigmoid(alpha * gate).
void ClampedSwiGlu(const float* gate_up, int rows, int inter, float alpha, float limit, float* act);

// logits[r, :] = head @ rmsnorm(x[rows[r]]) for every sampled row; logits is resized.
void FinalLogits(const float* x, const std::vector<int32_t>& rows, const float* norm,
                 const float* head, int hidden, int vocab, float eps, std::vector<float>* logits);

}  // namespace llm::cpu
