// The FMHA family as an engine attention backend: "cuda_fmha" when nvcc builds this file,
// "hip_fmha" when hipcc does (same source, kernels/gpu_port.h). It serves what the C8 kernel does
// not: sliding windows (Mistral, Qwen2) and fp16 caches, on a 16-bit paged cache in the engine's
// layout [num_blocks, num_kv_heads, block_size, head_dim].
//
// Plan (once per step) turns the engine's CSR batch into group-mode FmhaParams: seqstart_q =
// q_indptr, seqlen_k = kv_lens, a dense block table [num_seqs, max_pages], the slot mapping, and
// the split-KV choice with its workspace; one async upload. Run (per layer) appends the new K/V and
// launches the attention with bottom-right causal alignment (the new tokens are the last ones),
// or a window of window_left keys, consuming only what Plan uploaded.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/check.h"
#include "kernels/backend_registry.h"
#include "kernels/fmha/fmha_launcher.h"
#include "kernels/gpu_port.h"

namespace llm::fmha {
namespace {

// One CTA per new token: copies its K and V rows (all KV heads) into their cache slots, 16 bytes
// per thread and step. Slots < 0 are padding and skipped.
__global__ void AppendKvKernel(const uint4* __restrict__ k_new, const uint4* __restrict__ v_new,
                               const int32_t* __restrict__ slots, uint4* __restrict__ k_cache,
                               uint4* __restrict__ v_cache, int num_kv_heads, int block_size,
                               int vecs_per_head) {
  const int t = blockIdx.x;
  const int slot = slots[t];
  if (slot < 0) return;
  const int block = slot / block_size, offset = slot % block_size;
  const int row_vecs = num_kv_heads * vecs_per_head;
  for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) {
    const int h = i / vecs_per_head, c = i % vecs_per_head;
    const size_t dst =
        ((static_cast<size_t>(block) * num_kv_heads + h) * block_size + offset) * vecs_per_head + c;
    const size_t src = static_cast<size_t>(t) * row_vecs + i;
    k_cache[dst] = k_new[src];
    v_cache[dst] = v_new[src];
  }
}

class FmhaBackend final : public AttentionBackend {
 public:
  explicit FmhaBackend(const AttentionSpec& spec) : spec_(spec) {
    base_.dtype = spec.kv_dtype == DType::kF16 ? FmhaDType::kFp16 : FmhaDType::kBf16;
    base_.num_q_heads = spec.num_q_heads;
    base_.num_kv_heads = spec.num_kv_heads;
    base_.head_dim = spec.head_dim;
    base_.block_size = spec.block_size;
  }
  ~FmhaBackend() override {
    // Frees never fail meaningfully at teardown; errors are ignored on purpose.
    if (d_ints_) (void)gpu::Free(d_ints_);
    if (workspace_) (void)gpu::Free(workspace_);
    if (h_ints_) (void)gpu::FreeHost(h_ints_);
  }

  std::string name() const override { return std::string(gpu::kPlatformName) + "_fmha"; }
  size_t BlockBytes() const override {
    return 2ull * spec_.num_kv_heads * spec_.block_size * spec_.head_dim * 2;
  }
  void set_stream(void* stream) override { stream_ = stream; }

  Status Plan(const AttentionBatch& b) override {
    const int n = b.num_seqs;
    int max_pages = 1, max_q = 0;
    for (int s = 0; s < n; ++s) {
      max_pages = std::max(max_pages, b.page_indptr[s + 1] - b.page_indptr[s]);
      max_q = std::max(max_q, b.q_indptr[s + 1] - b.q_indptr[s]);
    }
    // Layout of the one upload (int32 elements): seqstart_q, seqlen_k, block table, slots.
    const size_t off_seqlen = n + 1, off_table = off_seqlen + n;
    const size_t off_slots = off_table + static_cast<size_t>(n) * max_pages;
    const size_t total = off_slots + b.num_tokens;
    LLM_RETURN_IF_ERROR(Reserve(total * sizeof(int32_t)));
    // The staging buffer may still feed the previous step's upload.
    const gpu::Error sync = gpu::StreamSynchronize(static_cast<gpu::Stream>(stream_));
    if (sync != gpu::kSuccess) return Internal(std::string("fmha plan: ") + gpu::ErrorString(sync));
    std::memcpy(h_ints_, b.q_indptr.data(), (n + 1) * sizeof(int32_t));
    std::memcpy(h_ints_ + off_seqlen, b.kv_lens.data(), n * sizeof(int32_t));
    for (int s = 0; s < n; ++s) {
      int32_t* row = h_ints_ + off_table + static_cast<size_t>(s) * max_pages;
      const int pages = b.page_indptr[s + 1] - b.page_indptr[s];
      // Blocks that slid out of a sliding window are -1 in the engine's tables; the kernel never
      // reads them, but block 0 keeps even a prefetched address inside the pool.
      const int32_t* src = b.page_indices.data() + b.page_indptr[s];
      for (int i = 0; i < pages; ++i) row[i] = std::max(src[i], 0);
      std::fill(row + pages, row + max_pages, 0);  // never read: seqlen_k bounds every sequence
    }
    std::memcpy(h_ints_ + off_slots, b.slot_mapping.data(), b.num_tokens * sizeof(int32_t));
    const gpu::Error e = gpu::CopyToDeviceAsync(d_ints_, h_ints_, total * sizeof(int32_t),
                                                static_cast<gpu::Stream>(stream_));
    if (e != gpu::kSuccess)
      return Internal(std::string("fmha plan upload: ") + gpu::ErrorString(e));

    FmhaParams& p = base_;
    p.batch = n;
    p.seqstart_q = d_ints_;
    p.max_seqlen_q = max_q;
    p.seqlen_k = d_ints_ + off_seqlen;
    p.block_table = d_ints_ + off_table;
    p.max_blocks_per_seq = max_pages;
    slots_ = d_ints_ + off_slots;
    num_tokens_ = b.num_tokens;
    {
      // Shape checks now, so a bad plan fails the step instead of a layer call; the tensors are
      // per layer, so stand-in (aligned, never dereferenced) pointers take their place.
      FmhaParams check = p;
      void* stand_in = reinterpret_cast<void*>(uintptr_t{256});
      check.q = check.k = check.v = check.out = stand_in;
      LLM_RETURN_IF_ERROR(FmhaCheckParams(check));
    }
    // Split-KV when one CTA per (sequence, KV head, row tile) would leave the GPU underfilled.
    splits_ = n > 0 ? FmhaAutoSplits(p) : 1;
    const size_t ws = splits_ > 1 ? FmhaWorkspaceBytes(p, splits_) : 0;
    if (ws > workspace_bytes_) {
      if (workspace_) (void)gpu::Free(workspace_);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      const gpu::Error a = gpu::Malloc(&workspace_, ws);
      if (a != gpu::kSuccess) return ResourceExhausted("fmha split-KV workspace");
      workspace_bytes_ = ws;
    }
    return Status::Ok();
  }

  void Run(const AttentionParams& params) override {
    if (num_tokens_ == 0) return;
    const auto stream = static_cast<gpu::Stream>(stream_);
    const int vecs_per_head = spec_.head_dim * 2 / 16;
    AppendKvKernel<<<num_tokens_, 128, 0, stream>>>(
        static_cast<const uint4*>(params.k_new), static_cast<const uint4*>(params.v_new), slots_,
        static_cast<uint4*>(params.cache.k), static_cast<uint4*>(params.cache.v),
        spec_.num_kv_heads, spec_.block_size, vecs_per_head);
    FmhaParams p = base_;
    p.q = params.q;
    p.out = params.out;
    p.k = params.cache.k;
    p.v = params.cache.v;
    p.softmax_scale = params.softmax_scale;
    if (params.window_left >= 0) {
      p.mask = FmhaMask{FmhaMaskType::kWindow, params.window_left, 0, 0};
    } else {
      p.mask = FmhaMask{FmhaMaskType::kCausalBottomRight, -1, 0, 0};
    }
    FmhaLaunchOptions opt;
    opt.num_splits = splits_;
    opt.workspace = workspace_;
    opt.workspace_bytes = workspace_bytes_;
    const Status st = FmhaForward(p, opt, stream_);
    LLM_CHECK(st.ok()) << name() << ": " << st.ToString();
  }

 private:
  Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return Status::Ok();
    const size_t cap = std::max(bytes, capacity_ * 2);
    if (d_ints_) (void)gpu::Free(d_ints_);
    if (h_ints_) (void)gpu::FreeHost(h_ints_);
    d_ints_ = nullptr;
    h_ints_ = nullptr;
    capacity_ = 0;
    void* d = nullptr;
    void* h = nullptr;
    if (gpu::Malloc(&d, cap) != gpu::kSuccess) return ResourceExhausted("fmha plan buffer");
    d_ints_ = static_cast<int32_t*>(d);
    if (gpu::MallocHost(&h, cap) != gpu::kSuccess) return ResourceExhausted("fmha plan staging");
    h_ints_ = static_cast<int32_t*>(h);
    capacity_ = cap;
    return Status::Ok();
  }

  AttentionSpec spec_;
  FmhaParams base_;  // the step's plan: everything but the per-layer tensors and mask
  void* stream_ = nullptr;
  int32_t* d_ints_ = nullptr;
  int32_t* h_ints_ = nullptr;  // pinned staging: the upload stays asynchronous
  size_t capacity_ = 0;
  const int32_t* slots_ = nullptr;
  int num_tokens_ = 0;
  int splits_ = 1;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

const BackendRegistrar kRegistrar(std::string(gpu::kPlatformName) + "_fmha",
                                  [](const AttentionSpec& spec) {
                                    return std::unique_ptr<AttentionBackend>(new FmhaBackend(spec));
                                  });

}  // namespace
}  // namespace llm::fmha
