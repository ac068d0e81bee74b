// MLA prefill attention in the expanded form (MlaPrefillParams, kernels/attention_backend.h), the
// cuda_mla backend's RunMlaPrefill: per prefill sequence, its cached latents gathered (fp8
// dequantized) and expanded through kv_b_proj into per-head k_nope and v by a cuBLAS GEMM, then
// the scores by two batched GEMMs (nope part, and the k_pe shared by every head), a softmax
// kernel and P @ V. Scores are materialized per tile: O(heads x tokens x kv) memory traffic, a
// fused kernel is the follow-up.
//
// Working memory is bounded whatever the context length (MlaPrefillTiling): the keys are expanded
// kv_chunk at a time. A sequence whose keys fit one chunk is attended as one softmax (scores of a
// query tile against all its keys, P @ V straight into bf16 out). A longer one is attended chunk
// by chunk with an online softmax, q_block query rows at a time: per chunk the scores of each
// tile of rows that see the chunk, the running max / sum of each (row, head) updated and its fp32
// accumulator rescaled (mla_prefill_softmax.h), P @ V added into the accumulator; after the last
// chunk the accumulator divided by the sum into out. Each row block expands the keys it sees
// again: the default q_block covers a whole 8,192-row prefill chunk at 128 heads, so that
// happens only past it.
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
  // Overrides of MlaPrefillTiling's fields (0: from the byte budgets), so that tests reach many
  // chunks, row blocks and score tiles at small contexts.
  int kv_chunk = 0;
  int q_block = 0;
  int score_rows = 0;
};

// How one step's prefill is cut, from the shape and the head dims alone (never the context).
struct MlaPrefillTiling {
  int kv_chunk = 0;    // keys gathered and expanded at once
  int q_block = 0;     // query rows with an fp32 accumulator at once (chunked sequences)
  int score_rows = 0;  // query rows per score tile of a chunked sequence (within kScoreBytes)
};
MlaPrefillTiling TileMlaPrefill(const MlaPrefillShape& shape, int nope_dim, int v_dim);

// Device bytes of MlaPrefill's working memory for steps of up to max_rows prefill rows (the
// block table and the cuBLAS workspace aside): what Reserve allocates.
size_t MlaPrefillScratchBytes(const MlaPrefillShape& shape, int nope_dim, int v_dim, int max_rows);

class MlaPrefill {
 public:
  // Byte budgets of the default tiling: the expanded chunk (bf16 k_nope and v of every head), the
  // scores (fp32) + probabilities (bf16) of one tile, the fp32 accumulator of one row block.
  static constexpr size_t kExpandedBytes = 128ull << 20;
  static constexpr size_t kScoreBytes = 256ull << 20;
  static constexpr size_t kAccumulatorBytes = 512ull << 20;
  // Chunks no longer than this leave score tiles of ~170 rows at 128 heads (kScoreBytes): P @ V
  // keeps enough output tiles to fill the GPU.
  static constexpr int kMaxKvChunk = 2048;

  explicit MlaPrefill(const MlaPrefillShape& shape) : shape_(shape) {}
  ~MlaPrefill();
  MlaPrefill(const MlaPrefill&) = delete;
  MlaPrefill& operator=(const MlaPrefill&) = delete;

  // Allocates the working memory of steps of up to max_rows prefill rows now (the runner calls
  // this before it sizes the KV pool); Run grows it on first use otherwise.
  Status Reserve(int max_rows, int nope_dim, int v_dim);
  // Host side of a step: which sequences are prefill chunks (not MlaDecodeSeqs), and the block
  // table uploaded on `stream` when there are any.
  Status Plan(const AttentionBatch& batch, void* stream);
  // A decode-only step (a graph bucket's): no prefill rows.
  void PlanNone() { seqs_.clear(); }
  // Attends the planned prefill sequences' rows into p.out on `stream`.
  Status Run(const MlaPrefillParams& p, void* stream);
  // Device memory held now (every buffer, the block table and cuBLAS workspace included).
  size_t device_bytes() const;

 private:
  struct Seq {
    int q_start, q_len, kv_len, page_base;
  };
  // cuBLAS workspace, fixed as the runner's (same size: the same GEMM heuristics).
  static constexpr size_t kBlasWorkspaceBytes = 32ull << 20;

  // scores[h] [tq, cols] (fp32, into kScores) of the tq query rows at q against the cols expanded
  // keys kvx / latents lat: the nope part per head, then the k_pe every head shares (stride 0).
  Status Scores(const MlaPrefillParams& p, const uint16_t* q, int tq, int cols, const uint16_t* kvx,
                const uint16_t* lat);

  Status CreateBlas();
  Status Batched(bool ta, bool tb, int m, int n, int k, const void* a, int lda, int64_t sa,
                 const void* b, int ldb, int64_t sb, void* c, bool c_fp32, int ldc, int64_t sc,
                 int batch, float beta = 0.0f);
  // Grows a buffer to at least `bytes`, doubling its capacity (to amortize) up to bound_.
  Status Grow(int buffer, size_t bytes);
  // Sets bound_ to what steps of up to max_rows prefill rows ever ask of each buffer.
  void SetBounds(int nope_dim, int v_dim, int max_rows);
  // Gathers keys [k0, k0 + count) of `sq` and expands them into kExpanded [count, H, nope + v].
  Status Expand(const MlaPrefillParams& p, const Seq& sq, int k0, int count, void* stream);
  // The two attention forms (see the top of this file).
  Status RunOneChunk(const MlaPrefillParams& p, const Seq& sq, void* stream);
  Status RunChunked(const MlaPrefillParams& p, const Seq& sq, const MlaPrefillTiling& t,
                    void* stream);

  MlaPrefillShape shape_;
  std::vector<Seq> seqs_;  // this step's prefill sequences
  void* blas_ = nullptr;   // cublasHandle_t, created at Reserve or the first Run
  enum {
    kPages,
    kLatents,
    kExpanded,
    kScores,
    kProbs,
    kAccumulator,
    kRowMax,
    kRowSum,
    kWorkspace,
    kNumBuffers
  };
  void* buf_[kNumBuffers] = {};
  size_t cap_[kNumBuffers] = {};
  size_t bound_[kNumBuffers] = {};  // 0: none (the block table, or before the first SetBounds)
  PinnedStaging pages_staging_;
};

}  // namespace llm::cuda
