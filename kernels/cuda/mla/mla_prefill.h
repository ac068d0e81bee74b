// MLA prefill attention in the expanded form (MlaPrefillParams, kernels/attention_backend.h), the
// cuda_mla backend's RunMlaPrefill: per prefill sequence, its cached latents gathered (fp8
// dequantized), expanded through kv_b_proj into per-head k_nope and v by one cuBLAS GEMM, then per
// query tile the scores by two batched GEMMs (nope part, and the k_pe shared by every head), a
// causal softmax kernel and P @ V. Scores are materialized per tile, bounded by kScoreBytes:
// O(heads x tokens x kv) memory traffic, a fused kernel is the follow-up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/common/pinned_staging.h"

namespace llm::cuda {

struct MlaPrefillShape {
  int num_heads = 0;
  int block_size = 64;
  int latent_dim = 0;  // kv_lora_rank + rope_dim (AttentionSpec::head_dim)
  int rope_dim = 0;
  bool fp8_cache = false;
};

class MlaPrefill {
 public:
  explicit MlaPrefill(const MlaPrefillShape& shape) : shape_(shape) {}
  ~MlaPrefill();
  MlaPrefill(const MlaPrefill&) = delete;
  MlaPrefill& operator=(const MlaPrefill&) = delete;

  // Host side of a step: which sequences are prefill chunks (not MlaDecodeSeqs), and the block
  // table uploaded on `stream` when there are any.
  Status Plan(const AttentionBatch& batch, void* stream);
  // A decode-only step (a graph bucket's): no prefill rows.
  void PlanNone() { seqs_.clear(); }
  // Attends the planned prefill sequences' rows into p.out on `stream`.
  Status Run(const MlaPrefillParams& p, void* stream);

 private:
  struct Seq {
    int q_start, q_len, kv_len, page_base;
  };
  // Bound on the materialized scores (fp32) + probabilities (bf16) of one query tile.
  static constexpr size_t kScoreBytes = 256ull << 20;
  // cuBLAS workspace, fixed as the runner's (same size: the same GEMM heuristics).
  static constexpr size_t kBlasWorkspaceBytes = 32ull << 20;

  Status Init(void* stream);
  Status Batched(bool ta, bool tb, int m, int n, int k, const void* a, int lda, int64_t sa,
                 const void* b, int ldb, int64_t sb, void* c, bool c_fp32, int ldc, int64_t sc,
                 int batch, float beta = 0.0f);
  Status Grow(int buffer, size_t bytes);

  MlaPrefillShape shape_;
  std::vector<Seq> seqs_;  // this step's prefill sequences
  void* blas_ = nullptr;   // cublasHandle_t, created at the first Run
  enum { kPages, kLatents, kExpanded, kScores, kProbs, kWorkspace, kNumBuffers };
  void* buf_[kNumBuffers] = {};
  size_t cap_[kNumBuffers] = {};
  PinnedStaging pages_staging_;
};

}  // namespace llm::cuda
