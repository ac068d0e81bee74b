// CPU reference paged attention (fp32 cache). The numerical oracle for the GPU kernels.
#pragma once

#include <cstddef>

#include "kernels/attention_backend.h"

namespace llm {

struct PagedAttentionShape {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
};

// Calls f(block, h, offset, src, dst) for each new row of `batch` that appends (slot >= 0) and
// each KV head h: src is the row's element offset in k_new / v_new
// [num_tokens, num_kv_heads, head_dim], dst in the cache [num_blocks, num_kv_heads, block_size,
// head_dim], both of head_dim elements.
template <typename F>
void ForEachAppendedRow(const PagedAttentionShape& s, const AttentionBatch& batch, F f) {
  const size_t d = s.head_dim;
  for (int t = 0; t < batch.num_tokens; ++t) {
    const int slot = batch.slot_mapping[t];
    if (slot < 0) continue;  // a row that appends nothing
    const int block = slot / s.block_size, offset = slot % s.block_size;
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const size_t dst =
          ((static_cast<size_t>(block) * s.num_kv_heads + h) * s.block_size + offset) * d;
      const size_t src = (static_cast<size_t>(t) * s.num_kv_heads + h) * d;
      f(block, h, offset, src, dst);
    }
  }
}

// Writes k_new/v_new rows into the cache at batch.slot_mapping.
// k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim]
void CpuAppendKv(const PagedAttentionShape& shape, const AttentionBatch& batch, const float* k_new,
                 const float* v_new, float* k_cache, float* v_cache);

// Causal attention of every query row over its sequence's paged cache (already appended): the
// row at position p attends to [0, p], or to [p - window_left, p] when window_left >= 0 (sliding
// window; cache positions left of every row's window are never read).
// Score modifiers (AttentionParams::logit_softcap / sink_logits): scores are scaled, then
// soft-capped (cap * tanh(s / cap) when logit_softcap > 0); a head with a sink logit gets one more
// softmax column of that logit and a zero value vector; with ALiBi slopes a row at position p adds
// slope[h] * (j - p) to its score for position j (after the soft-cap, as the FMHA kernel does).
// q, out: [num_tokens, num_q_heads, head_dim]; sink_logits, alibi_slopes: [num_q_heads] or null
void CpuPagedAttention(const PagedAttentionShape& shape, const AttentionBatch& batch,
                       const float* q, const float* k_cache, const float* v_cache,
                       float softmax_scale, float* out, int window_left = -1,
                       float logit_softcap = 0.0f, const float* sink_logits = nullptr,
                       const float* alibi_slopes = nullptr);

// First cache position a query row at position pos attends to.
inline int WindowStart(int pos, int window_left) {
  return window_left >= 0 && pos - window_left > 0 ? pos - window_left : 0;
}

}  // namespace llm
