// Fused element-wise kernels of the decoders on CUDA (embedding, norms, rotary, activations),
// shared by every architecture. Plain C++ launcher header: pointers are device pointers, `stream`
// is a cudaStream_t. Activations are bf16 unless noted; the residual stream is fp32 (it is what the
// CPU oracle keeps, and it keeps long sums exact).
#pragma once

#include <cstdint>

#include "kernels/cuda/ops/fp8_quant.h"

namespace llm::cuda {

// out[t, :] = table[id, :] * scale (bf16 table [vocab, hidden]) -> fp32 residual [T, hidden],
// with id = ids[t], or feed[-ids[t] - 1] for ids[t] < 0 (a token the previous step sampled on the
// device; feed may be null when no id is negative). scale: Gemma's sqrt(hidden), else 1.
// A tensor-parallel rank's vocabulary slice: table holds the rows [vocab_begin, vocab_begin +
// vocab_rows) of the whole table, and a token outside them gets a zero row (the ranks' rows are
// then summed); vocab_rows < 0: the whole table.
void LaunchEmbedding(const void* table, const int32_t* ids, int num_tokens, int hidden,
                     float* residual, void* stream, const int32_t* feed = nullptr,
                     float scale = 1.0f, int vocab_begin = 0, int vocab_rows = -1);

struct RmsNormArgs {
  float* residual = nullptr;           // fp32 [T, H], updated in place when delta is set
  const void* delta = nullptr;         // bf16 [T, H] or null
  const float* delta_scale = nullptr;  // [T]: delta row t is delta[t] * delta_scale[t] (the raw
                                       // output of an fp8 GEMM, fp8_quant.h Fp8Rows), or null
  // bf16 [H] or null: the bias of the projection that wrote delta (gpt-oss's o_proj), added to
  // every delta row after its row scale (y = raw * scale + bias) and before delta_norm.
  const void* delta_bias = nullptr;
  // bf16 [H] or null: delta is first RMS-normalized over its own row and scaled by
  // (weight_offset + delta_norm) before it joins the residual (Gemma's post-attention and
  // post-feedforward norms on the branch outputs).
  const void* delta_norm = nullptr;
  const void* weight = nullptr;   // bf16 [H]
  float weight_offset = 0.f;      // the norms scale by (weight_offset + w): 1 for Gemma's (1 + w)
  const int32_t* rows = nullptr;  // optional gather: output row r normalizes row rows[r]
  int num_rows = 0, hidden = 0;
  float eps = 1e-5f;
  void* out = nullptr;       // bf16 [R, H], or
  Fp8Rows out_fp8;           // e4m3 [R, H] with row scales (the next fp8 GEMM's input)
  float* out_f32 = nullptr;  // also the normed rows in fp32 [R, H] (an MoE router's input), or null
};
// residual (+)= delta * delta_scale + delta_bias (or its norm); out = rmsnorm(residual) *
// (weight_offset + weight), per row.
void LaunchAddRmsNorm(const RmsNormArgs& a, void* stream);
// The bf16 form: residual[T, H] (+)= delta (may be null); out = bf16(rmsnorm(residual) * weight).
void LaunchAddRmsNorm(float* residual, const void* delta, const void* weight, const int32_t* rows,
                      int num_rows, int hidden, float eps, void* out, void* stream);

struct RopeArgs {
  const void* qkv = nullptr;           // bf16 [T, (Hq + 2 Hkv) * D] from the fused projection
  const void* bias = nullptr;          // bf16 [(Hq + 2 Hkv) * D] or null
  const float* qkv_scale = nullptr;    // [T] row scales of qkv (an fp8 GEMM's raw output) or null
  const int32_t* positions = nullptr;  // [T]
  const float* inv_freq = nullptr;     // [D / 2], rope scaling already applied
  void* q = nullptr;                   // bf16 [T, Hq, D]
  void* k = nullptr;                   // bf16 [T, Hkv, D]
  void* v = nullptr;                   // bf16 [T, Hkv, D]
  int num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  // Per-head RMSNorm of q and of k before rotary (Qwen3, Gemma 3 self_attn.q_norm / k_norm): bf16
  // [D] weights, both or neither; x * rsqrt(mean(x^2) + norm_eps) * (norm_offset + w) in fp32.
  // Needs head_dim % 8 == 0 and head_dim <= kMaxQkNormHeadDim.
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float norm_eps = 1e-6f;
  float norm_offset = 0.f;  // 1 for Gemma's (1 + w)
};
constexpr int kMaxQkNormHeadDim = 512;
// Splits q/k/v, scales rows by qkv_scale, adds the bias, applies the q/k norms when set, then
// rotary ("rotate_half" pairs (i, i + D/2)) to q and k.
void LaunchBiasRope(const RopeArgs& a, void* stream);

struct SiluMulArgs {
  const void* gate_up = nullptr;         // bf16 [T, 2 I]
  const float* gate_up_scale = nullptr;  // [T] row scales of gate_up (fp8 GEMM output) or null
  int num_tokens = 0, inter = 0;
  bool gelu_tanh = false;  // GeGLU: gelu(g) with the tanh approximation instead of silu(g) (Gemma)
  void* act = nullptr;     // bf16 [T, I], or
  Fp8Rows act_fp8;         // e4m3 [T, I] with row scales
};
// act = silu(g) * u (or gelu_tanh(g) * u) with g = gate_up[:, :I] and u = gate_up[:, I:] (after
// the row scale).
void LaunchSiluMul(const SiluMulArgs& a, void* stream);
void LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* act, void* stream);

// x[i] = cap * tanh(x[i] / cap) over n fp32 values (the final logit soft-cap of Gemma 2).
void LaunchSoftCap(float* x, int64_t n, float cap, void* stream);

// Deterministic pseudo-random bf16 values mean + std * U(-sqrt3, sqrt3), for dummy weights.
void LaunchFillRandomBf16(void* p, int64_t n, float mean, float std, uint64_t seed, void* stream);

}  // namespace llm::cuda
