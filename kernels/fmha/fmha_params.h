// Paged-KV flash attention forward ("fmha", in the spirit of CK tile's fmha_fwd_pagedkv): the
// parameter struct shared by the CPU reference (kernels/cpu/cpu_fmha.h) and the one-source
// CUDA/HIP kernel (kernels/fmha/). Plain C++: no CUDA or HIP types.
//
// Shapes (element type `dtype`, bf16 or fp16, unless noted):
//   q, out:  [total_q, num_q_heads, head_dim]   total_q = batch * seqlen_q (batch mode) or
//                                               seqstart_q[batch] (group / varlen mode)
//   lse:     [total_q, num_q_heads] fp32, optional
//   k, v paged (block_size > 0):   [num_blocks, num_kv_heads, block_size, head_dim]; sequence b's
//            key j lives in block block_table[b * max_blocks_per_seq + j / block_size], slot
//            j % block_size (the engine's KV cache layout, docs/ARCHITECTURE.md)
//   k, v contiguous (block_size == 0): [num_cache_rows, cache_seqlen, num_kv_heads, head_dim];
//            sequence b reads cache row cache_batch_idx[b] (or b when cache_batch_idx is null)
//   k, v packed (block_size == 0 and seqstart_k): [total_k, num_kv_heads, head_dim]; sequence b's
//            key j is row seqstart_k[b] + j (FlashAttention's cu_seqlens_k: the fresh K/V of a
//            step's prefill chunks, as the projections wrote them)
// Query head h reads KV head h / (num_q_heads / num_kv_heads) (MHA, GQA, MQA).
//
// Scores, for query row i (0-based within its sequence) and key j < seqlen_k[b]:
//   s = softmax_scale * (q_i . k_j)
//   s = softcap * tanh(s / softcap)            if softcap > 0
//   s = s + alibi_slopes[h] * (j - p)          if alibi_slopes; p = the query's diagonal key
//   visible(i, j) (FmhaMask) else s = -inf
// where p = i (top-left alignment) or p = i + seqlen_k - seqlen_q (bottom-right alignment: the
// last query row sits on the last key, as in decode/append). Top-left is used only by
// kCausalTopLeft; kNone, kCausalBottomRight and kWindow use bottom-right (this matters for ALiBi).
//   out_i = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + [sink_logits] e^(sink_logits[h] - m))
//   lse_i = ln(sum_j e^(s_j) [+ e^(sink_logits[h])])        (natural log, fp32)
// A row with no visible key and no sink logit has out = 0 and lse = -inf.
#pragma once

#include <cstdint>

namespace llm {

enum class FmhaDType { kBf16, kFp16 };

// Visibility of key j to query row i with diagonal key p (see above):
//   kNone:               all keys j < seqlen_k
//   kCausalTopLeft:      j <= i
//   kCausalBottomRight:  j <= p
//   kWindow:             p - window_left <= j <= p + window_right (bottom-right aligned);
//                        a negative size means unbounded on that side. Causal sliding window
//                        (Mistral, Qwen2) is window_left = W - 1, window_right = 0.
// sink_tokens > 0 additionally keeps keys j < sink_tokens visible wherever the right bound
// (causality) allows them: StreamingLLM-style attention sinks.
enum class FmhaMaskType { kNone, kCausalTopLeft, kCausalBottomRight, kWindow };

struct FmhaMask {
  FmhaMaskType type = FmhaMaskType::kCausalBottomRight;
  int window_left = -1;
  int window_right = 0;
  int sink_tokens = 0;
};

struct FmhaParams {
  FmhaDType dtype = FmhaDType::kBf16;
  int batch = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 128;  // 64 or 128

  // Query layout: batch mode (seqstart_q null) with seqlen_q rows per sequence, or group mode
  // with seqstart_q [batch + 1] (varlen, CSR like the engine's q_indptr).
  int seqlen_q = 0;
  const int32_t* seqstart_q = nullptr;
  int max_seqlen_q = 0;               // group mode: the longest sequence's rows (grid sizing)
  const int32_t* seqlen_k = nullptr;  // [batch] keys of each sequence (both modes)

  const void* q = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // optional
  // Set: the output goes here instead of out, as e4m3fn bytes [total_q, num_q_heads, head_dim] of
  // out * out_fp8_inv_scale, saturated to +-448 (an fp8 projection's input with a static scale).
  void* out_fp8 = nullptr;
  float out_fp8_inv_scale = 1.0f;

  const void* k = nullptr;
  const void* v = nullptr;
  // Paged KV (block_size > 0, any multiple of 16).
  int block_size = 0;
  const int32_t* block_table = nullptr;  // [batch, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  // Contiguous KV (block_size == 0).
  int cache_seqlen = 0;
  const int32_t* cache_batch_idx = nullptr;  // [batch], optional
  // Packed KV (block_size == 0, instead of cache rows): [batch + 1] key row offsets; then
  // cache_seqlen and cache_batch_idx are unused and max_seqlen_k bounds every seqlen_k (host-side
  // planning).
  const int32_t* seqstart_k = nullptr;
  int max_seqlen_k = 0;

  float softmax_scale = 1.0f;
  FmhaMask mask;
  float softcap = 0.0f;                 // 0: off
  const float* alibi_slopes = nullptr;  // [num_q_heads], optional
  const float* sink_logits = nullptr;   // [num_q_heads], optional (learned per-head sinks)
};

// Total query rows: batch * seqlen_q, or seqstart_q[batch] (host pointers only: the CPU
// reference and tests; GPU launches size their grid from batch and max_seqlen_q).
inline int FmhaTotalQ(const FmhaParams& p) {
  return p.seqstart_q ? p.seqstart_q[p.batch] : p.batch * p.seqlen_q;
}

}  // namespace llm
