// CPU reference multi-head latent attention (DeepSeek MLA) over a paged latent cache: the
// numerical oracle for GPU MLA decode kernels. Plain functions over a params struct; the
// registered backend ("cpu_mla", AttentionKind::kMla) is a thin wrapper around them.
//
// Cache layout (one layer): [num_blocks, block_size, L], L = kv_lora_rank + rope_dim; row
// (block, offset) holds token `block * block_size + offset`'s RMS-normalized c_kv (first
// kv_lora_rank values) and roped k_pe (last rope_dim values). Element type fp32, or fp8 e4m3
// bytes with one per-layer dequant scale: x = Fp8E4M3ToFloat(byte) * cache_scale, written with
// QuantizeFp8(x, cache_scale) (base/quant.h, round to nearest even, saturating at 448).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/dtype.h"
#include "kernels/attention_backend.h"

namespace llm {

struct MlaShape {
  int num_heads = 0;     // query heads; all share the one latent per token
  int kv_lora_rank = 0;  // latent (and absorbed query / output) width, 512 for DeepSeek
  int rope_dim = 0;      // roped part, 64 for DeepSeek
  int block_size = 0;
  int latent_dim() const { return kv_lora_rank + rope_dim; }
};

// Inputs of the decode kernel. Query row t of sequence s sits at position
// pos = kv_lens[s] - (q_indptr[s+1] - t) and attends to cache positions [0, pos] (causal), so
// 1..4 query rows of one sequence (speculative / multi-token decode) see increasing prefixes.
struct MlaDecodeParams {
  MlaShape shape;
  DType cache_dtype = DType::kF32;  // kF32 or kFp8E4M3
  const void* cache = nullptr;      // [num_blocks, block_size, L], already holding this step's rows
  float cache_scale = 1.0f;         // fp8 dequant scale (ignored for fp32)
  const float* q_latent = nullptr;  // [num_tokens, H, kv_lora_rank]: W_UK^T q_nope per head
  const float* q_pe = nullptr;      // [num_tokens, H, rope_dim], roped like the cached k_pe
  float softmax_scale = 1.0f;
  float* out_latent = nullptr;  // [num_tokens, H, kv_lora_rank]: softmax-weighted sum of c_kv
  float* lse = nullptr;         // optional [num_tokens, H]: ln(sum_j exp(score_j)), scaled scores
};

// Sequences of `batch` with 1..kMlaMaxDecodeQueryLen query rows (the ones the backend attends).
std::vector<int32_t> MlaDecodeSeqs(const AttentionBatch& batch);

// Writes latent_new [num_tokens, L] (fp32) into the cache at batch.slot_mapping.
void CpuMlaAppendLatent(const MlaShape& shape, const AttentionBatch& batch, const float* latent_new,
                        DType cache_dtype, float cache_scale, void* cache);

// Reads cache positions [0, kv_lens[seq]) of sequence `seq` as fp32 (dequantized): out is
// [kv_lens[seq], L].
void CpuMlaGatherLatents(const MlaShape& shape, const AttentionBatch& batch, int seq,
                         DType cache_dtype, float cache_scale, const void* cache, float* out);

// Absorbed-form attention for the query rows of the sequences in `seqs` (indices into batch);
// the rows of other sequences are not touched.
void CpuMlaDecode(const MlaDecodeParams& params, const AttentionBatch& batch,
                  std::span<const int32_t> seqs);

}  // namespace llm
