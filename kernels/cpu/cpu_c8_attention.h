// CPU reference for 8-bit ("C8") paged KV caches: int8 or fp8 e4m3fn elements with static
// per-head / per-channel scales or dynamic per-token fp8 scales. The numerical oracle for GPU C8
// kernels: the append must produce bit-identical cache bytes and scales, and the attention is the
// fp32 reference (CpuPagedAttention) run on the dequantized values, with the same operation order.
//
// Element formats: base/quant.h. Layouts: docs/ARCHITECTURE.md, "KV cache storage".
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/cpu_paged_attention.h"

namespace llm {

// One layer's 8-bit paged cache and its scales, in host memory.
struct QuantKvCacheView {
  PagedAttentionShape shape;
  DType dtype = DType::kI8;                 // kI8 or kFp8E4M3
  KvQuant quant = KvQuant::kStaticPerHead;  // never kNone
  void* k = nullptr;                        // [num_blocks, num_kv_heads, block_size, head_dim]
  void* v = nullptr;
  const float* k_scale = nullptr;  // static: [num_kv_heads] or [num_kv_heads, head_dim]
  const float* v_scale = nullptr;
  float* k_block_scales = nullptr;  // dynamic: [num_blocks, num_kv_heads, block_size]
  float* v_block_scales = nullptr;
};

// Builds the view for a backend call from the spec and a layer's KvCacheLayer.
QuantKvCacheView MakeQuantKvCacheView(const AttentionSpec& spec, const KvCacheLayer& layer);

// The largest quantized magnitude of a dtype: 127 (int8) or 448 (fp8 e4m3fn).
float KvQuantMax(DType dtype);
// One element, exactly as stored: QuantizeInt8 / QuantizeFp8 of base/quant.h (the int8
// result is returned as its two's-complement byte).
uint8_t QuantizeKvElement(DType dtype, float x, float scale);
float DequantizeKvElement(DType dtype, uint8_t q, float scale);
// Dynamic scale of one token-head vector x[0..n): absmax / KvQuantMax(dtype), where absmax is the
// fmax-reduction of |x[i]| starting at 0 (NaN elements are ignored); 1 when that is not a
// positive finite number (absmax 0, underflow, or an infinite element).
float KvDynamicScale(DType dtype, const float* x, int n);

// Quantizes this step's k_new/v_new rows ([num_tokens, num_kv_heads, head_dim] fp32) into the
// cache at batch.slot_mapping. Dynamic mode also writes each slot's scales.
void CpuAppendKvQuant(const QuantKvCacheView& cache, const AttentionBatch& batch,
                      const float* k_new, const float* v_new);

// Causal attention of every query row over its sequence's 8-bit paged cache (already appended),
// dequantizing each element as q * scale; window_left and sink_logits ([num_q_heads] or null) as
// in CpuPagedAttention (positions left of every row's window are neither read nor dequantized;
// a sink is one more softmax column with a zero value vector).
// q, out: [num_tokens, num_q_heads, head_dim].
void CpuPagedAttentionQuant(const QuantKvCacheView& cache, const AttentionBatch& batch,
                            const float* q, float softmax_scale, float* out, int window_left = -1,
                            const float* sink_logits = nullptr);

// Dequantizes blocks [0, num_blocks) to fp32 caches of the same layout (test oracle helper).
// Dynamic mode reads the block scales, so every slot read must have been written.
void CpuDequantizeKvCache(const QuantKvCacheView& cache, int num_blocks, float* k_out,
                          float* v_out);

}  // namespace llm
