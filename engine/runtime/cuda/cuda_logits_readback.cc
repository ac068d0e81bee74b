#include "engine/runtime/cuda/cuda_logits_readback.h"

#include <cstring>

#include "kernels/cuda/sampling/sampling.h"

namespace llm {

CudaLogitsReadback::~CudaLogitsReadback() {
  for (Slot& s : slots_) {
    if (s.done) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.pinned) cudaFreeHost(s.pinned);
  }
}

StatusOr<int> CudaLogitsReadback::Issue(const ForwardBatch& batch, float* d_logits, int vocab,
                                        cudaStream_t stream) {
  const int R = static_cast<int>(batch.logit_rows.size());
  const bool any_device = !batch.device_sampled.empty();
  if (any_device && (batch.device_sampled.size() != static_cast<size_t>(R) ||
                     batch.sampling_jobs.size() != static_cast<size_t>(R) ||
                     batch.penalty_indptr.size() != static_cast<size_t>(R) + 1)) {
    return InvalidArgument("device sampling arrays do not match the logit rows");
  }
  if (R > kMaxRows) return InvalidArgument("more than 65536 sampled rows in one step");
  for (int r = 0; any_device && r < R; ++r) {
    const int32_t m = batch.sampling_jobs[r].mask_row;
    if (m >= 0 && (batch.mask_words < (vocab + 31) / 32 ||
                   (static_cast<size_t>(m) + 1) * batch.mask_words > batch.token_masks.size())) {
      return InvalidArgument("a sampling job's token mask does not cover the vocabulary");
    }
  }
  const int slot = next_;
  Slot& sl = slots_[slot];
  if (sl.busy) return FailedPrecondition("two steps are already waiting to be read back");
  next_ ^= 1;
  if (sl.done == nullptr)
    GPU_RETURN_IF_ERROR(cudaEventCreateWithFlags(&sl.done, cudaEventDisableTiming));
  sl.rows = R;
  sl.vocab = vocab;
  sl.on_device.assign(R, 0);
  for (int r = 0; r < R; ++r) sl.on_device[r] = any_device && batch.device_sampled[r] != 0;
  const size_t row_bytes = static_cast<size_t>(vocab) * 4;
  sl.full_rows = 0;
  for (int r = 0; r < R; ++r) sl.full_rows += sl.on_device[r] ? 0 : 1;
  // Pinned space for the full rows only (a device-sampled step of 256 rows x 128k vocab would
  // otherwise pin 131 MB per slot), grown in powers of two: cudaFreeHost waits for the whole
  // device, which stalls the overlapped steps, so the buffer should rarely move.
  const size_t bytes = static_cast<size_t>(sl.full_rows) * row_bytes + R * sizeof(int32_t);
  if (bytes > sl.bytes) {
    size_t want = size_t{1} << 16;
    while (want < bytes) want <<= 1;
    if (sl.pinned) GPU_RETURN_IF_ERROR(cudaFreeHost(sl.pinned));
    sl.pinned = nullptr;
    sl.bytes = 0;
    GPU_RETURN_IF_ERROR(cudaMallocHost(&sl.pinned, want));
    sl.bytes = want;
  }
  LLM_RETURN_IF_ERROR(Reserve());
  auto* h_tokens =
      reinterpret_cast<int32_t*>(static_cast<char*>(sl.pinned) + sl.full_rows * row_bytes);
  // The device rows' jobs, compacted, in one upload: [jobs: n SamplingJob][rows: n]
  // [penalty indptr: n + 1][penalties: PenaltyEntry][token masks, as the batch holds them].
  std::vector<int32_t>& dev_rows = sl.dev_rows;
  std::vector<int32_t> indptr(1, 0);
  dev_rows.clear();
  for (int r = 0; r < R; ++r) {
    if (!sl.on_device[r]) continue;
    dev_rows.push_back(r);
    indptr.push_back(indptr.back() + batch.penalty_indptr[r + 1] - batch.penalty_indptr[r]);
  }
  const int n = static_cast<int>(dev_rows.size());
  if (n > 0) {
    const size_t jobs_bytes = n * sizeof(SamplingJob);
    const size_t ints_bytes = (2 * static_cast<size_t>(n) + 1) * sizeof(int32_t);
    const size_t pens_bytes = indptr.back() * sizeof(PenaltyEntry);
    const size_t masks_bytes = batch.token_masks.size() * sizeof(uint32_t);
    const size_t total = jobs_bytes + ints_bytes + pens_bytes + masks_bytes;
    // Assembled in pinned memory (a pageable source may make the copy wait for the previous
    // step), written once: the masks are most of it.
    LLM_RETURN_IF_ERROR(sampling_args_.Alloc(total));
    LLM_ASSIGN_OR_RETURN(void* staged, args_staging_.Acquire(total));
    char* h = static_cast<char*>(staged);
    char* pen_out = h + jobs_bytes + ints_bytes;
    if (masks_bytes > 0) {
      std::memcpy(pen_out + pens_bytes, batch.token_masks.data(), masks_bytes);
    }
    for (int k = 0; k < n; ++k) {
      const int r = dev_rows[k];
      std::memcpy(h + k * sizeof(SamplingJob), &batch.sampling_jobs[r], sizeof(SamplingJob));
      std::memcpy(pen_out + indptr[k] * sizeof(PenaltyEntry),
                  batch.penalties.data() + batch.penalty_indptr[r],
                  (indptr[k + 1] - indptr[k]) * sizeof(PenaltyEntry));
    }
    std::memcpy(h + jobs_bytes, dev_rows.data(), n * sizeof(int32_t));
    std::memcpy(h + jobs_bytes + n * sizeof(int32_t), indptr.data(), (n + 1) * sizeof(int32_t));
    GPU_RETURN_IF_ERROR(
        cudaMemcpyAsync(sampling_args_.ptr, staged, total, cudaMemcpyHostToDevice, stream));
    LLM_RETURN_IF_ERROR(args_staging_.Queued(stream));
    char* d = sampling_args_.as<char>();
    cuda::SamplingArgs sa;
    sa.logits = d_logits;
    sa.vocab = vocab;
    sa.num_jobs = n;
    sa.jobs = reinterpret_cast<const SamplingJob*>(d);
    sa.rows = reinterpret_cast<const int32_t*>(d + jobs_bytes);
    sa.penalty_indptr = sa.rows + n;
    sa.penalties = reinterpret_cast<const PenaltyEntry*>(d + jobs_bytes + ints_bytes);
    sa.masks = reinterpret_cast<const uint32_t*>(d + jobs_bytes + ints_bytes + pens_bytes);
    sa.mask_words = batch.mask_words;
    sa.tokens = sampled_dev_.as<int32_t>();
    cuda::LaunchSampling(sa, stream);
    GPU_RETURN_IF_ERROR(cudaMemcpyAsync(h_tokens, sampled_dev_.ptr, n * sizeof(int32_t),
                                        cudaMemcpyDeviceToHost, stream));
  }
  for (int r = 0, packed = 0; r < R;) {  // runs of consecutive full rows, packed
    if (sl.on_device[r]) {
      ++r;
      continue;
    }
    int e = r + 1;
    while (e < R && !sl.on_device[e]) ++e;
    GPU_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(sl.pinned) + packed * row_bytes,
                                        reinterpret_cast<const char*>(d_logits) + r * row_bytes,
                                        (e - r) * row_bytes, cudaMemcpyDeviceToHost, stream));
    packed += e - r;
    r = e;
  }
  GPU_RETURN_IF_ERROR(cudaEventRecord(sl.done, stream));
  sl.busy = true;
  return slot;
}

Status CudaLogitsReadback::Finish(int slot, std::vector<float>* logits,
                                  std::vector<int32_t>* tokens) {
  Slot& sl = slots_[slot];
  if (!sl.busy) return FailedPrecondition("no step is waiting in this readback slot");
  sl.busy = false;
  GPU_RETURN_IF_ERROR(cudaEventSynchronize(sl.done));
  GPU_RETURN_IF_ERROR(cudaGetLastError());
  const int R = sl.rows;
  const size_t row_bytes = static_cast<size_t>(sl.vocab) * 4;
  const auto* h_tokens =
      reinterpret_cast<const int32_t*>(static_cast<char*>(sl.pinned) + sl.full_rows * row_bytes);
  tokens->assign(R, -1);
  for (size_t k = 0; k < sl.dev_rows.size(); ++k) (*tokens)[sl.dev_rows[k]] = h_tokens[k];
  // A step sampled wholly on the device leaves logits alone: resizing a 256 x 128k buffer is
  // host time the overlapped steps would wait for.
  if (sl.full_rows > 0) logits->resize(static_cast<size_t>(R) * sl.vocab);
  for (int r = 0, packed = 0; r < R; ++r) {
    if (sl.on_device[r]) continue;
    std::memcpy(logits->data() + r * static_cast<size_t>(sl.vocab),
                static_cast<char*>(sl.pinned) + packed++ * row_bytes, row_bytes);
  }
  return Status::Ok();
}

Status CudaLogitsReadback::Run(const ForwardBatch& batch, float* d_logits, int vocab,
                               cudaStream_t stream, std::vector<float>* logits,
                               std::vector<int32_t>* tokens) {
  LLM_ASSIGN_OR_RETURN(int slot, Issue(batch, d_logits, vocab, stream));
  return Finish(slot, logits, tokens);
}

}  // namespace llm
