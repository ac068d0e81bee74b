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

#include "base/check.h"
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
    for (void* p : {static_cast<void*>(eager_.d_ints), static_cast<void*>(graph_.d_ints),
                    workspace_, graph_.workspace}) {
      if (p) (void)gpu::Free(p);
    }
    if (eager_.h_ints) (void)gpu::FreeHost(eager_.h_ints);
    if (graph_.h_ints) (void)gpu::FreeHost(graph_.h_ints);
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
    LLM_RETURN_IF_ERROR(Reserve(Area::Ints(n, max_pages, b.num_tokens) * sizeof(int32_t)));
    LLM_RETURN_IF_ERROR(Stage(eager_, b, n, max_pages, b.num_tokens));
    FmhaParams& p = eager_.params;
    p.batch = n;
    p.max_seqlen_q = max_q;
    eager_.num_tokens = b.num_tokens;
    {
      // Shape checks now, so a bad plan fails the step instead of a layer call; the tensors are
      // per layer, so stand-in (aligned, never dereferenced) pointers take their place.
      FmhaParams check = p;
      void* stand_in = reinterpret_cast<void*>(uintptr_t{256});
      check.q = check.k = check.v = check.out = stand_in;
      LLM_RETURN_IF_ERROR(FmhaCheckParams(check));
    }
    // Split-KV when one CTA per (sequence, KV head, row tile) would leave the GPU underfilled.
    eager_.splits = n > 0 ? FmhaAutoSplits(p) : 1;
    const size_t ws = eager_.splits > 1 ? FmhaWorkspaceBytes(p, eager_.splits) : 0;
    LLM_RETURN_IF_ERROR(GrowWorkspace(&workspace_, &workspace_bytes_, ws));
    eager_.workspace = workspace_;
    eager_.workspace_bytes = workspace_bytes_;
    active_ = &eager_;
    return Status::Ok();
  }

  // Graph area: fixed buffers for decode-shaped steps of up to max_seqs sequences of up to max_q
  // query rows each, the block table [max_seqs, max_pages / max_seqs] (padding sequences have no
  // query rows and no keys).
  bool supports_graphs() const override { return true; }
  Status ReserveGraphs(int max_seqs, int max_pages, int max_q) override {
    if (graph_.d_ints != nullptr) {
      return FailedPrecondition("the FMHA graph area is reserved once: graphs point into it");
    }
    if (max_seqs <= 0 || max_q <= 0) {
      return InvalidArgument("fmha graph area needs max_seqs and max_q > 0");
    }
    const int per_seq = std::max(1, max_pages / std::max(1, max_seqs));
    const size_t bytes = Area::Ints(max_seqs, per_seq, max_seqs * max_q) * sizeof(int32_t);
    void* d = nullptr;
    void* h = nullptr;
    if (gpu::Malloc(&d, bytes) != gpu::kSuccess) return ResourceExhausted("fmha graph area");
    graph_.d_ints = static_cast<int32_t*>(d);
    if (gpu::MallocHost(&h, bytes) != gpu::kSuccess) return ResourceExhausted("fmha graph staging");
    graph_.h_ints = static_cast<int32_t*>(h);
    graph_max_seqs_ = max_seqs;
    graph_max_q_ = max_q;
    graph_pages_per_seq_ = per_seq;
    // One workspace for every shape: the largest any shape's split choice needs.
    size_t ws = 0;
    for (int q = 1; q <= max_q; ++q) {
      for (int bucket = 1; bucket <= max_seqs; ++bucket) {
        const FmhaParams p = GraphParams(GraphShape{bucket, q});
        const int splits = FmhaAutoSplits(p);
        if (splits > 1) ws = std::max(ws, FmhaWorkspaceBytes(p, splits));
      }
    }
    return GrowWorkspace(&graph_.workspace, &graph_.workspace_bytes, ws);
  }
  Status PlanGraph(const AttentionBatch& b, GraphShape shape) override {
    const int n = b.num_seqs;
    if (graph_max_seqs_ == 0) return FailedPrecondition("PlanGraph before ReserveGraphs");
    if (n > shape.seqs || shape.seqs > graph_max_seqs_ || shape.q > graph_max_q_ ||
        !UniformQueryRows(b, shape.q)) {
      return InvalidArgument("fmha graph plan: " + std::to_string(n) + " sequences of " +
                             std::to_string(b.num_tokens) + " rows, shape " +
                             std::to_string(shape.seqs) + " x " + std::to_string(shape.q));
    }
    for (int s = 0; s < n; ++s) {
      if (b.page_indptr[s + 1] - b.page_indptr[s] > graph_pages_per_seq_) {
        return InvalidArgument("fmha graph plan: a block table is longer than the graph area's");
      }
    }
    // The whole fixed layout (GraphParams' offsets), padded to the largest bucket.
    LLM_RETURN_IF_ERROR(Stage(graph_, b, graph_max_seqs_, graph_pages_per_seq_, shape.rows()));
    graph_.params = GraphParams(shape);
    graph_.num_tokens = shape.rows();
    graph_.splits = FmhaAutoSplits(graph_.params);  // a function of the shape alone
    active_ = &graph_;
    return Status::Ok();
  }

  Status Run(const AttentionParams& params) override {
    const Area& a = *active_;
    if (a.num_tokens == 0) return Status::Ok();
    const auto stream = static_cast<gpu::Stream>(stream_);
    const int vecs_per_head = spec_.head_dim * 2 / 16;
    AppendKvKernel<<<a.num_tokens, 128, 0, stream>>>(
        static_cast<const uint4*>(params.k_new), static_cast<const uint4*>(params.v_new), a.slots,
        static_cast<uint4*>(params.cache.k), static_cast<uint4*>(params.cache.v),
        spec_.num_kv_heads, spec_.block_size, vecs_per_head);
    FmhaParams p = a.params;
    p.q = params.q;
    p.out = params.out;
    p.k = params.cache.k;
    p.v = params.cache.v;
    p.softmax_scale = params.softmax_scale;
    // The catalog lists kFeatureSoftCap | kFeatureSinks | kFeatureAlibi for this family.
    p.softcap = params.logit_softcap;
    p.sink_logits = params.sink_logits;
    p.alibi_slopes = params.alibi_slopes;
    if (params.window_left >= 0) {
      p.mask = FmhaMask{FmhaMaskType::kWindow, params.window_left, 0, 0};
    } else {
      p.mask = FmhaMask{FmhaMaskType::kCausalBottomRight, -1, 0, 0};
    }
    FmhaLaunchOptions opt;
    opt.num_splits = a.splits;
    opt.workspace = a.workspace;
    opt.workspace_bytes = a.workspace_bytes;
    const Status st = FmhaForward(p, opt, stream_);
    if (!st.ok()) return Status(st.code(), name() + ": " + st.message());
    return Status::Ok();
  }

 private:
  // One upload area: the device ints [seqstart_q: rows + 1][seqlen_k: rows][block table: rows x
  // stride][slots: tokens], the params that point into them, the split-KV choice.
  struct Area {
    int32_t* d_ints = nullptr;
    int32_t* h_ints = nullptr;  // pinned staging (the eager area's grows; the graph area's fixed)
    const int32_t* slots = nullptr;
    FmhaParams params;
    int num_tokens = 0;
    int splits = 1;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    static size_t Ints(int rows, int stride, int tokens) {
      return static_cast<size_t>(rows) * (2 + stride) + 1 + tokens;
    }
  };

  // Writes the batch into `a` padded to `rows` sequences (no query rows, no keys) and `tokens`
  // slots (-1), with a block table of `stride` entries per sequence, and uploads it.
  Status Stage(Area& a, const AttentionBatch& b, int rows, int stride, int tokens) {
    const int n = b.num_seqs;
    const size_t off_seqlen = rows + 1, off_table = off_seqlen + rows;
    const size_t off_slots = off_table + static_cast<size_t>(rows) * stride;
    const size_t total = off_slots + tokens;
    // The staging buffer may still feed the previous step's upload.
    const gpu::Error sync = gpu::StreamSynchronize(static_cast<gpu::Stream>(stream_));
    if (sync != gpu::kSuccess) return Internal(std::string("fmha plan: ") + gpu::ErrorString(sync));
    int32_t* h = a.h_ints;
    std::memcpy(h, b.q_indptr.data(), (n + 1) * sizeof(int32_t));
    std::fill(h + n + 1, h + rows + 1, b.q_indptr[n]);
    std::memcpy(h + off_seqlen, b.kv_lens.data(), n * sizeof(int32_t));
    std::fill(h + off_seqlen + n, h + off_seqlen + rows, 0);
    for (int s = 0; s < rows; ++s) {
      int32_t* row = h + off_table + static_cast<size_t>(s) * stride;
      const int pages = s < n ? b.page_indptr[s + 1] - b.page_indptr[s] : 0;
      // Blocks that slid out of a sliding window are -1 in the engine's tables; the kernel never
      // reads them, but block 0 keeps even a prefetched address inside the pool.
      const int32_t* src = b.page_indices.data() + (s < n ? b.page_indptr[s] : 0);
      for (int i = 0; i < pages; ++i) row[i] = std::max(src[i], 0);
      std::fill(row + pages, row + stride, 0);  // never read: seqlen_k bounds every sequence
    }
    std::memcpy(h + off_slots, b.slot_mapping.data(), b.num_tokens * sizeof(int32_t));
    std::fill(h + off_slots + b.num_tokens, h + off_slots + tokens, -1);
    const gpu::Error e = gpu::CopyToDeviceAsync(a.d_ints, h, total * sizeof(int32_t),
                                                static_cast<gpu::Stream>(stream_));
    if (e != gpu::kSuccess) {
      return Internal(std::string("fmha plan upload: ") + gpu::ErrorString(e));
    }
    a.params = base_;
    a.params.seqstart_q = a.d_ints;
    a.params.seqlen_k = a.d_ints + off_seqlen;
    a.params.block_table = a.d_ints + off_table;
    a.params.max_blocks_per_seq = stride;
    a.slots = a.d_ints + off_slots;
    return Status::Ok();
  }

  // The graph area's params for a shape: q query rows per sequence, the full table stride.
  FmhaParams GraphParams(GraphShape shape) const {
    const size_t off_seqlen = graph_max_seqs_ + 1, off_table = off_seqlen + graph_max_seqs_;
    FmhaParams p = base_;
    p.batch = shape.seqs;
    p.max_seqlen_q = shape.q;
    p.seqstart_q = graph_.d_ints;
    p.seqlen_k = graph_.d_ints + off_seqlen;
    p.block_table = graph_.d_ints + off_table;
    p.max_blocks_per_seq = graph_pages_per_seq_;
    return p;
  }

  static Status GrowWorkspace(void** ptr, size_t* bytes, size_t need) {
    if (need <= *bytes) return Status::Ok();
    if (*ptr) (void)gpu::Free(*ptr);
    *ptr = nullptr;
    *bytes = 0;
    if (gpu::Malloc(ptr, need) != gpu::kSuccess)
      return ResourceExhausted("fmha split-KV workspace");
    *bytes = need;
    return Status::Ok();
  }

  Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return Status::Ok();
    const size_t cap = std::max(bytes, capacity_ * 2);
    if (eager_.d_ints) (void)gpu::Free(eager_.d_ints);
    if (eager_.h_ints) (void)gpu::FreeHost(eager_.h_ints);
    eager_.d_ints = nullptr;
    eager_.h_ints = nullptr;
    capacity_ = 0;
    void* d = nullptr;
    void* h = nullptr;
    if (gpu::Malloc(&d, cap) != gpu::kSuccess) return ResourceExhausted("fmha plan buffer");
    eager_.d_ints = static_cast<int32_t*>(d);
    if (gpu::MallocHost(&h, cap) != gpu::kSuccess) return ResourceExhausted("fmha plan staging");
    eager_.h_ints = static_cast<int32_t*>(h);
    capacity_ = cap;
    return Status::Ok();
  }

  AttentionSpec spec_;
  FmhaParams base_;  // shapes; each area adds its pointers and batch
  void* stream_ = nullptr;
  Area eager_, graph_;
  Area* active_ = &eager_;
  size_t capacity_ = 0;        // of the eager area's buffers
  void* workspace_ = nullptr;  // the eager area's split-KV workspace
  size_t workspace_bytes_ = 0;
  int graph_max_seqs_ = 0, graph_max_q_ = 0, graph_pages_per_seq_ = 0;
};

// Capabilities are this family's row in KernelCatalog() (cuda_fmha or hip_fmha).
const BackendRegistrar kRegistrar(std::string(gpu::kPlatformName) + "_fmha",
                                  BackendFactoryOf<FmhaBackend>());

}  // namespace
}  // namespace llm::fmha
