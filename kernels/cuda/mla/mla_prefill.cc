#include "kernels/cuda/mla/mla_prefill.h"

#include <algorithm>
#include <string>

#include "kernels/cpu/cpu_mla_attention.h"
#include "kernels/cuda/common/blas_check.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/deepseek_ops.h"

namespace llm::cuda {

MlaPrefill::~MlaPrefill() {
  if (blas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(blas_));
  for (void* b : buf_) {
    if (b != nullptr) cudaFree(b);
  }
}

Status MlaPrefill::Grow(int buffer, size_t bytes) {
  return GrowDeviceBuffer(&buf_[buffer], &cap_[buffer], bytes);
}

Status MlaPrefill::Plan(const AttentionBatch& batch, void* stream) {
  seqs_.clear();
  std::vector<char> decode(batch.num_seqs, 0);
  for (int32_t s : MlaDecodeSeqs(batch)) decode[s] = 1;
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q_len = batch.q_indptr[s + 1] - batch.q_indptr[s];
    if (decode[s] || q_len == 0) continue;
    seqs_.push_back({batch.q_indptr[s], q_len, batch.kv_lens[s], batch.page_indptr[s]});
  }
  if (seqs_.empty() || batch.page_indices.empty()) return Status::Ok();
  const size_t bytes = batch.page_indices.size() * sizeof(int32_t);
  LLM_RETURN_IF_ERROR(Grow(kPages, bytes));
  LLM_ASSIGN_OR_RETURN(void* host, pages_staging_.Acquire(bytes));
  std::copy(batch.page_indices.begin(), batch.page_indices.end(), static_cast<int32_t*>(host));
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(buf_[kPages], host, bytes, cudaMemcpyHostToDevice,
                                      static_cast<cudaStream_t>(stream)));
  return pages_staging_.Queued(stream);
}

Status MlaPrefill::Init(void* stream) {
  if (blas_ == nullptr) {
    cublasHandle_t h = nullptr;
    BLAS_RETURN_IF_ERROR(cublasCreate(&h));
    blas_ = h;
    LLM_RETURN_IF_ERROR(Grow(kWorkspace, kBlasWorkspaceBytes));
    BLAS_RETURN_IF_ERROR(cublasSetWorkspace(h, buf_[kWorkspace], cap_[kWorkspace]));
  }
  BLAS_RETURN_IF_ERROR(
      cublasSetStream(static_cast<cublasHandle_t>(blas_), static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

// Column-major strided-batched GEMM, bf16 A and B, fp32 accumulation, bf16 or fp32 C.
Status MlaPrefill::Batched(bool ta, bool tb, int m, int n, int k, const void* a, int lda,
                           int64_t sa, const void* b, int ldb, int64_t sb, void* c, bool c_fp32,
                           int ldc, int64_t sc, int batch, float beta) {
  const float alpha = 1.0f;
  BLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(blas_), ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16BF, lda, sa, b, CUDA_R_16BF, ldb,
      sb, &beta, c, c_fp32 ? CUDA_R_32F : CUDA_R_16BF, ldc, sc, batch, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

Status MlaPrefill::Run(const MlaPrefillParams& p, void* stream) {
  if (seqs_.empty()) return Status::Ok();
  LLM_RETURN_IF_ERROR(Init(stream));
  const int H = shape_.num_heads, N = p.nope_dim, R = shape_.rope_dim, V = p.v_dim;
  const int Lw = shape_.latent_dim, C = Lw - R, NV = N + V;
  const auto* q_all = static_cast<const uint16_t*>(p.q);
  auto* out = static_cast<uint16_t*>(p.out);
  for (const Seq& sq : seqs_) {
    const int qb = sq.q_start, Tq = sq.q_len, kv_len = sq.kv_len;
    LLM_RETURN_IF_ERROR(Grow(kLatents, static_cast<size_t>(kv_len) * Lw * 2));
    LLM_RETURN_IF_ERROR(Grow(kExpanded, static_cast<size_t>(kv_len) * H * NV * 2));
    // lat [kv_len, C + R]: the sequence's latents, this step's included (RunMla appended them).
    LaunchGatherLatents(p.cache, shape_.fp8_cache, p.cache_scale,
                        static_cast<const int32_t*>(buf_[kPages]) + sq.page_base, shape_.block_size,
                        Lw, kv_len, buf_[kLatents], stream);
    // kvx [kv_len, H, N + V]: per head k_nope then v = c @ kv_b_proj^T (lda Lw skips k_pe).
    const float one = 1.0f, zero = 0.0f;
    BLAS_RETURN_IF_ERROR(cublasGemmEx(
        static_cast<cublasHandle_t>(blas_), CUBLAS_OP_T, CUBLAS_OP_N, H * NV, kv_len, C, &one,
        p.w_kv_b, CUDA_R_16BF, C, buf_[kLatents], CUDA_R_16BF, Lw, &zero, buf_[kExpanded],
        CUDA_R_16BF, H * NV, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const auto* kvx = static_cast<const uint16_t*>(buf_[kExpanded]);
    const auto* lat = static_cast<const uint16_t*>(buf_[kLatents]);
    const int tile = static_cast<int>(std::clamp<size_t>(
        kScoreBytes / (static_cast<size_t>(H) * kv_len * 6), 1, static_cast<size_t>(Tq)));
    for (int i0 = 0; i0 < Tq; i0 += tile) {
      const int tq = std::min(tile, Tq - i0);
      const int first_pos = kv_len - Tq + i0;  // position of the tile's first query row
      const int kv = first_pos + tq;           // keys the tile can see
      LLM_RETURN_IF_ERROR(Grow(kScores, static_cast<size_t>(H) * tq * kv * 4));
      LLM_RETURN_IF_ERROR(Grow(kProbs, static_cast<size_t>(H) * tq * kv * 2));
      const uint16_t* q = q_all + static_cast<size_t>(qb + i0) * p.q_stride;
      const int64_t score_stride = static_cast<int64_t>(tq) * kv;
      // scores[h] [tq, kv] = q_nope_h . k_nope_h^T + q_pe_h . k_pe^T (k_pe shared: stride 0).
      LLM_RETURN_IF_ERROR(Batched(true, false, kv, tq, N, kvx, H * NV, NV, q, p.q_stride, N + R,
                                  buf_[kScores], true, kv, score_stride, H));
      LLM_RETURN_IF_ERROR(Batched(true, false, kv, tq, R, lat + C, Lw, 0, q + N, p.q_stride, N + R,
                                  buf_[kScores], true, kv, score_stride, H, 1.0f));
      LaunchCausalSoftmax(static_cast<const float*>(buf_[kScores]), H, tq, kv, first_pos,
                          p.softmax_scale, buf_[kProbs], stream);
      // out[t, h, :] [tq, V] = p_h [tq, kv] @ v_h [kv, V].
      LLM_RETURN_IF_ERROR(Batched(false, false, V, tq, kv, kvx + N, H * NV, NV, buf_[kProbs], kv,
                                  score_stride, out + static_cast<size_t>(qb + i0) * H * V, false,
                                  H * V, V, H));
    }
  }
  return Status::Ok();
}

}  // namespace llm::cuda
