#include "kernels/cuda/mla/mla_prefill.h"

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cpu/cpu_mla_attention.h"
#include "kernels/cuda/common/blas_check.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/mla/mla_prefill_softmax.h"
#include "kernels/cuda/ops/deepseek_ops.h"

namespace llm::cuda {
namespace {

// Query rows (1..rows) of a score tile against `keys` keys whose scores (fp32) and probabilities
// (bf16) fit kScoreBytes; one row where even that does not.
int ScoreTileRows(int heads, int keys, int rows) {
  return static_cast<int>(
      std::clamp<size_t>(MlaPrefill::kScoreBytes / (static_cast<size_t>(heads) * keys * 6), 1,
                         static_cast<size_t>(rows)));
}

struct Bounds {
  size_t latents, expanded, scores, probs, accumulator, row_stats;
};

// The most each buffer is asked for by a step of up to max_rows prefill rows, whatever its
// contexts. Scores are heads x rows x keys per tile: a one-chunk sequence's tile has keys <=
// kv_chunk, rows <= max_rows and rows x keys within kScoreBytes / 6 per head unless it is a
// single row (ScoreTileRows); a chunked sequence's tile is score_rows (or fewer) x kv_chunk.
Bounds BoundsOf(const MlaPrefillShape& s, int nope_dim, int v_dim, int max_rows) {
  const MlaPrefillTiling t = TileMlaPrefill(s, nope_dim, v_dim);
  const size_t H = s.num_heads, C = t.kv_chunk, R = std::max(max_rows, 1);
  const size_t one_chunk = std::max(H * C, std::min(MlaPrefill::kScoreBytes / 6, H * R * C));
  const size_t chunked =
      H * C *
      std::min<size_t>({static_cast<size_t>(t.score_rows), static_cast<size_t>(t.q_block), R});
  const size_t score_elems = std::max(one_chunk, chunked);
  const size_t rows = std::min<size_t>(t.q_block, R);
  return {C * s.latent_dim * 2, C * H * (nope_dim + v_dim) * 2, score_elems * 4,
          score_elems * 2,      rows * H * v_dim * 4,           rows * H * 4};
}

}  // namespace

MlaPrefillTiling TileMlaPrefill(const MlaPrefillShape& s, int nope_dim, int v_dim) {
  const size_t H = s.num_heads;
  MlaPrefillTiling t;
  t.kv_chunk = s.kv_chunk > 0 ? s.kv_chunk
                              : static_cast<int>(std::clamp<size_t>(
                                    MlaPrefill::kExpandedBytes / (H * (nope_dim + v_dim) * 2), 1,
                                    MlaPrefill::kMaxKvChunk));
  t.q_block = s.q_block > 0 ? s.q_block
                            : static_cast<int>(std::clamp<size_t>(
                                  MlaPrefill::kAccumulatorBytes / (H * v_dim * 4), 1, INT_MAX));
  t.score_rows = s.score_rows > 0 ? s.score_rows : ScoreTileRows(s.num_heads, t.kv_chunk, INT_MAX);
  return t;
}

size_t MlaPrefillScratchBytes(const MlaPrefillShape& shape, int nope_dim, int v_dim, int max_rows) {
  const Bounds b = BoundsOf(shape, nope_dim, v_dim, max_rows);
  return b.latents + b.expanded + b.scores + b.probs + b.accumulator + 2 * b.row_stats;
}

MlaPrefill::~MlaPrefill() {
  if (blas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(blas_));
  for (void* b : buf_) {
    if (b != nullptr) cudaFree(b);
  }
}

size_t MlaPrefill::device_bytes() const {
  size_t n = 0;
  for (size_t c : cap_) n += c;
  return n;
}

Status MlaPrefill::Grow(int buffer, size_t bytes) {
  size_t& cap = cap_[buffer];
  if (bytes <= cap) return Status::Ok();
  const size_t bound = bound_[buffer] > 0 ? bound_[buffer] : SIZE_MAX;
  const size_t n = std::max(bytes, std::min(2 * cap, bound));
  if (buf_[buffer] != nullptr) GPU_RETURN_IF_ERROR(cudaFree(buf_[buffer]));
  buf_[buffer] = nullptr;
  cap = 0;
  LLM_RETURN_IF_ERROR(DeviceMalloc(&buf_[buffer], n));
  cap = n;
  return Status::Ok();
}

void MlaPrefill::SetBounds(int nope_dim, int v_dim, int max_rows) {
  const Bounds b = BoundsOf(shape_, nope_dim, v_dim, max_rows);
  bound_[kLatents] = b.latents;
  bound_[kExpanded] = b.expanded;
  bound_[kScores] = b.scores;
  bound_[kProbs] = b.probs;
  bound_[kAccumulator] = b.accumulator;
  bound_[kRowMax] = bound_[kRowSum] = b.row_stats;
}

Status MlaPrefill::Reserve(int max_rows, int nope_dim, int v_dim) {
  LLM_RETURN_IF_ERROR(CreateBlas());
  SetBounds(nope_dim, v_dim, max_rows);
  for (int b : {kLatents, kExpanded, kScores, kProbs, kAccumulator, kRowMax, kRowSum}) {
    LLM_RETURN_IF_ERROR(Grow(b, bound_[b]));
  }
  return Status::Ok();
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

Status MlaPrefill::CreateBlas() {
  if (blas_ != nullptr) return Status::Ok();
  cublasHandle_t h = nullptr;
  BLAS_RETURN_IF_ERROR(cublasCreate(&h));
  blas_ = h;
  LLM_RETURN_IF_ERROR(Grow(kWorkspace, kBlasWorkspaceBytes));
  BLAS_RETURN_IF_ERROR(cublasSetWorkspace(h, buf_[kWorkspace], cap_[kWorkspace]));
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

Status MlaPrefill::Expand(const MlaPrefillParams& p, const Seq& sq, int k0, int count,
                          void* stream) {
  const int H = shape_.num_heads, Lw = shape_.latent_dim, C = Lw - shape_.rope_dim;
  const int NV = p.nope_dim + p.v_dim;
  LLM_RETURN_IF_ERROR(Grow(kLatents, static_cast<size_t>(count) * Lw * 2));
  LLM_RETURN_IF_ERROR(Grow(kExpanded, static_cast<size_t>(count) * H * NV * 2));
  // lat [count, C + R]: the sequence's latents k0.., this step's included (RunMla appended them).
  LaunchGatherLatents(p.cache, shape_.fp8_cache, p.cache_scale,
                      static_cast<const int32_t*>(buf_[kPages]) + sq.page_base, shape_.block_size,
                      Lw, k0, count, buf_[kLatents], stream);
  // kvx [count, H, N + V]: per head k_nope then v = c @ kv_b_proj^T (lda Lw skips k_pe).
  const float one = 1.0f, zero = 0.0f;
  BLAS_RETURN_IF_ERROR(cublasGemmEx(static_cast<cublasHandle_t>(blas_), CUBLAS_OP_T, CUBLAS_OP_N,
                                    H * NV, count, C, &one, p.w_kv_b, CUDA_R_16BF, C,
                                    buf_[kLatents], CUDA_R_16BF, Lw, &zero, buf_[kExpanded],
                                    CUDA_R_16BF, H * NV, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

Status MlaPrefill::Scores(const MlaPrefillParams& p, const uint16_t* q, int tq, int cols,
                          const uint16_t* kvx, const uint16_t* lat) {
  const int H = shape_.num_heads, N = p.nope_dim, R = shape_.rope_dim;
  const int Lw = shape_.latent_dim, C = Lw - R, NV = N + p.v_dim;
  const int64_t score_stride = static_cast<int64_t>(tq) * cols;
  // scores[h] = q_nope_h . k_nope_h^T + q_pe_h . k_pe^T.
  LLM_RETURN_IF_ERROR(Batched(true, false, cols, tq, N, kvx, H * NV, NV, q, p.q_stride, N + R,
                              buf_[kScores], true, cols, score_stride, H));
  return Batched(true, false, cols, tq, R, lat + C, Lw, 0, q + N, p.q_stride, N + R, buf_[kScores],
                 true, cols, score_stride, H, 1.0f);
}

Status MlaPrefill::RunOneChunk(const MlaPrefillParams& p, const Seq& sq, void* stream) {
  const int H = shape_.num_heads, N = p.nope_dim, V = p.v_dim, NV = N + V;
  const int qb = sq.q_start, Tq = sq.q_len, kv_len = sq.kv_len;
  LLM_RETURN_IF_ERROR(Expand(p, sq, 0, kv_len, stream));
  const auto* kvx = static_cast<const uint16_t*>(buf_[kExpanded]);
  const auto* lat = static_cast<const uint16_t*>(buf_[kLatents]);
  const auto* q_all = static_cast<const uint16_t*>(p.q);
  auto* out = static_cast<uint16_t*>(p.out);
  const int tile = ScoreTileRows(H, kv_len, Tq);
  for (int i0 = 0; i0 < Tq; i0 += tile) {
    const int tq = std::min(tile, Tq - i0);
    const int first_pos = kv_len - Tq + i0;  // position of the tile's first query row
    const int kv = first_pos + tq;           // keys the tile can see
    LLM_RETURN_IF_ERROR(Grow(kScores, static_cast<size_t>(H) * tq * kv * 4));
    LLM_RETURN_IF_ERROR(Grow(kProbs, static_cast<size_t>(H) * tq * kv * 2));
    const uint16_t* q = q_all + static_cast<size_t>(qb + i0) * p.q_stride;
    const int64_t score_stride = static_cast<int64_t>(tq) * kv;
    LLM_RETURN_IF_ERROR(Scores(p, q, tq, kv, kvx, lat));
    LaunchCausalSoftmax(static_cast<const float*>(buf_[kScores]), H, tq, kv, first_pos,
                        p.softmax_scale, buf_[kProbs], stream);
    // out[t, h, :] [tq, V] = p_h [tq, kv] @ v_h [kv, V].
    LLM_RETURN_IF_ERROR(Batched(false, false, V, tq, kv, kvx + N, H * NV, NV, buf_[kProbs], kv,
                                score_stride, out + static_cast<size_t>(qb + i0) * H * V, false,
                                H * V, V, H));
  }
  return Status::Ok();
}

Status MlaPrefill::RunChunked(const MlaPrefillParams& p, const Seq& sq, const MlaPrefillTiling& t,
                              void* stream) {
  const int H = shape_.num_heads, N = p.nope_dim, V = p.v_dim, NV = N + V;
  const int qb = sq.q_start, Tq = sq.q_len;
  const int ctx = sq.kv_len - Tq;  // position of the sequence's first query row
  const auto* kvx = static_cast<const uint16_t*>(buf_[kExpanded]);
  const auto* lat = static_cast<const uint16_t*>(buf_[kLatents]);
  const auto* q_all = static_cast<const uint16_t*>(p.q);
  auto* out = static_cast<uint16_t*>(p.out);
  for (int r0 = 0; r0 < Tq; r0 += t.q_block) {
    const int rows = std::min(t.q_block, Tq - r0);
    LLM_RETURN_IF_ERROR(Grow(kAccumulator, static_cast<size_t>(rows) * H * V * 4));
    LLM_RETURN_IF_ERROR(Grow(kRowMax, static_cast<size_t>(rows) * H * 4));
    LLM_RETURN_IF_ERROR(Grow(kRowSum, static_cast<size_t>(rows) * H * 4));
    auto* acc = static_cast<float*>(buf_[kAccumulator]);  // [rows, H, V]
    auto* row_max = static_cast<float*>(buf_[kRowMax]);   // [rows, H]
    auto* row_sum = static_cast<float*>(buf_[kRowSum]);   // [rows, H]
    const int keys = ctx + r0 + rows;                     // keys the block's last row sees
    const int tile = std::min(t.score_rows, rows);
    for (int k0 = 0; k0 < keys; k0 += t.kv_chunk) {
      const int kc = std::min(t.kv_chunk, keys - k0);
      LLM_RETURN_IF_ERROR(Expand(p, sq, k0, kc, stream));
      kvx = static_cast<const uint16_t*>(buf_[kExpanded]);  // Expand may have grown them
      lat = static_cast<const uint16_t*>(buf_[kLatents]);
      // Rows before position k0 see none of the chunk: their tiles are skipped. Every row sees
      // chunk 0, which initializes its state.
      const int row_end = r0 + rows;
      for (int i0 = std::max(r0, k0 - ctx); i0 < row_end; i0 += tile) {
        const int tq = std::min(tile, row_end - i0);
        const int first_pos = ctx + i0;
        const int cols = std::min(kc, first_pos + tq - k0);  // keys of the chunk the tile sees
        LLM_RETURN_IF_ERROR(Grow(kScores, static_cast<size_t>(H) * tq * cols * 4));
        LLM_RETURN_IF_ERROR(Grow(kProbs, static_cast<size_t>(H) * tq * cols * 2));
        const uint16_t* q = q_all + static_cast<size_t>(qb + i0) * p.q_stride;
        const int64_t score_stride = static_cast<int64_t>(tq) * cols;
        LLM_RETURN_IF_ERROR(Scores(p, q, tq, cols, kvx, lat));  // against keys k0..
        mla::ChunkSoftmaxArgs a;
        a.scores = static_cast<const float*>(buf_[kScores]);
        a.probs = buf_[kProbs];
        a.row_max = row_max + static_cast<size_t>(i0 - r0) * H;
        a.row_sum = row_sum + static_cast<size_t>(i0 - r0) * H;
        a.acc = acc + static_cast<size_t>(i0 - r0) * H * V;
        a.heads = H;
        a.rows = tq;
        a.cols = cols;
        a.v_dim = V;
        a.first_pos = first_pos;
        a.k0 = k0;
        a.scale = p.softmax_scale;
        a.first_chunk = k0 == 0;
        mla::LaunchChunkSoftmax(a, stream);
        // acc[t, h, :] (+)= p_h [tq, cols] @ v_h [cols, V]: written on chunk 0, added after.
        LLM_RETURN_IF_ERROR(Batched(false, false, V, tq, cols, kvx + N, H * NV, NV, buf_[kProbs],
                                    cols, score_stride, a.acc, true, H * V, V, H,
                                    k0 == 0 ? 0.0f : 1.0f));
      }
    }
    mla::LaunchNormalizeRows(acc, row_sum, rows, H, V, out + static_cast<size_t>(qb + r0) * H * V,
                             stream);
  }
  return Status::Ok();
}

Status MlaPrefill::Run(const MlaPrefillParams& p, void* stream) {
  if (seqs_.empty()) return Status::Ok();
  LLM_RETURN_IF_ERROR(CreateBlas());
  BLAS_RETURN_IF_ERROR(
      cublasSetStream(static_cast<cublasHandle_t>(blas_), static_cast<cudaStream_t>(stream)));
  int max_rows = 0;
  for (const Seq& sq : seqs_) max_rows = std::max(max_rows, sq.q_len);
  SetBounds(p.nope_dim, p.v_dim, max_rows);
  const MlaPrefillTiling t = TileMlaPrefill(shape_, p.nope_dim, p.v_dim);
  for (const Seq& sq : seqs_) {
    LLM_RETURN_IF_ERROR(sq.kv_len <= t.kv_chunk ? RunOneChunk(p, sq, stream)
                                                : RunChunked(p, sq, t, stream));
  }
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace llm::cuda
