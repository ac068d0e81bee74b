// Fused element-wise kernels of the Llama-family decoder on CUDA. Plain C++ launcher header:
// pointers are device pointers, `stream` is a cudaStream_t. Activations are bf16 unless noted;
// the residual stream is fp32 (it is what the CPU oracle keeps, and it keeps long sums exact).
#pragma once

#include <cstdint>

namespace llm::cuda {

// out[t, :] = table[ids[t], :]  (bf16 table [vocab, hidden]) -> fp32 residual [T, hidden]
void LaunchEmbedding(const void* table, const int32_t* ids, int num_tokens, int hidden,
                     float* residual, void* stream);

// residual[T, H] (+)= delta (bf16, may be null); out = bf16(rmsnorm(residual) * weight).
// rows: optional row indices (gather; null = all T rows), out has one row per index.
// amax (optional): *amax = max(*amax, max |out|), as LaunchAbsMaxBf16 (fp8_quant.h) would compute
// it, so an fp8 GEMM consuming out needs no separate absmax pass.
void LaunchAddRmsNorm(float* residual, const void* delta, const void* weight, const int32_t* rows,
                      int num_rows, int hidden, float eps, void* out, void* stream,
                      float* amax = nullptr);

struct RopeArgs {
  const void* qkv = nullptr;           // bf16 [T, (Hq + 2 Hkv) * D] from the fused projection
  const void* bias = nullptr;          // bf16 [(Hq + 2 Hkv) * D] or null
  const int32_t* positions = nullptr;  // [T]
  const float* inv_freq = nullptr;     // [D / 2], rope scaling already applied
  void* q = nullptr;                   // bf16 [T, Hq, D]
  void* k = nullptr;                   // bf16 [T, Hkv, D]
  void* v = nullptr;                   // bf16 [T, Hkv, D]
  int num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
};
// Splits q/k/v, adds the bias, applies rotary ("rotate_half" pairs (i, i + D/2)) to q and k.
void LaunchBiasRope(const RopeArgs& a, void* stream);

// act[T, I] = silu(gate_up[:, :I]) * gate_up[:, I:]   (bf16); amax as in LaunchAddRmsNorm.
void LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* act, void* stream,
                   float* amax = nullptr);

// Deterministic pseudo-random bf16 values mean + std * U(-sqrt3, sqrt3), for dummy weights.
void LaunchFillRandomBf16(void* p, int64_t n, float mean, float std, uint64_t seed, void* stream);

}  // namespace llm::cuda
