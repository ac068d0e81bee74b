// CheckAttentionBatch and UniformQueryRows: the structural invariants every backend's planner
// relies on; the default Configure of the MLA backends without kernel choices; the KV cache layout
// runners allocate.
#include <string>

#include "kernels/attention_backend.h"

namespace llm {
namespace {

Status Bad(const std::string& what) {
  return Internal("malformed attention batch: " + what);
}

std::string Seq(int s) {
  return "sequence " + std::to_string(s) + ": ";
}

}  // namespace

bool UniformQueryRows(const AttentionBatch& b, int q) {
  if (q < 1 || b.num_tokens != b.num_seqs * q ||
      b.q_indptr.size() != static_cast<size_t>(b.num_seqs) + 1) {
    return false;
  }
  for (int s = 0; s <= b.num_seqs; ++s) {
    if (b.q_indptr[s] != s * q) return false;
  }
  return true;
}

Status CheckAttentionBatch(const AttentionBatch& b, int block_size, int num_blocks) {
  if (block_size < 1 || num_blocks < 0) return Bad("bad cache geometry");
  const size_t n = b.num_seqs < 0 ? 0 : static_cast<size_t>(b.num_seqs);
  if (b.num_seqs < 0 || b.q_indptr.size() != n + 1 || b.page_indptr.size() != n + 1 ||
      b.kv_lens.size() != n) {
    return Bad("num_seqs " + std::to_string(b.num_seqs) + " with q_indptr " +
               std::to_string(b.q_indptr.size()) + ", page_indptr " +
               std::to_string(b.page_indptr.size()) + ", kv_lens " +
               std::to_string(b.kv_lens.size()) + " entries");
  }
  if (b.q_indptr[0] != 0 || b.page_indptr[0] != 0) return Bad("indptr arrays must start at 0");
  if (b.q_indptr[n] != b.num_tokens || b.slot_mapping.size() != static_cast<size_t>(b.num_tokens)) {
    return Bad("num_tokens " + std::to_string(b.num_tokens) + ", q_indptr ends at " +
               std::to_string(b.q_indptr[n]) + ", " + std::to_string(b.slot_mapping.size()) +
               " slots");
  }
  if (static_cast<size_t>(b.page_indptr[n]) != b.page_indices.size()) {
    return Bad("page_indptr ends at " + std::to_string(b.page_indptr[n]) + " but there are " +
               std::to_string(b.page_indices.size()) + " page indices");
  }
  for (size_t s = 0; s < n; ++s) {
    const int q_len = b.q_indptr[s + 1] - b.q_indptr[s];
    const int pages = b.page_indptr[s + 1] - b.page_indptr[s];
    const int kv = b.kv_lens[s];
    if (q_len < 0 || pages < 0) return Bad(Seq(static_cast<int>(s)) + "indptr decreases");
    if (kv < 0 || q_len > kv) {
      return Bad(Seq(static_cast<int>(s)) + std::to_string(q_len) + " new tokens, kv_len " +
                 std::to_string(kv));
    }
    if (static_cast<int64_t>(pages) * block_size < kv) {
      return Bad(Seq(static_cast<int>(s)) + std::to_string(pages) + " pages of " +
                 std::to_string(block_size) + " for kv_len " + std::to_string(kv));
    }
  }
  for (int32_t p : b.page_indices) {
    if (p < -1 || p >= num_blocks) {  // -1: a block freed left of every sliding window
      return Bad("page " + std::to_string(p) + " outside the cache's " +
                 std::to_string(num_blocks) + " blocks");
    }
  }
  const int64_t slots = static_cast<int64_t>(num_blocks) * block_size;
  for (int32_t slot : b.slot_mapping) {
    if (slot < -1 || slot >= slots) {  // -1: a row that appends nothing (graph padding)
      return Bad("slot " + std::to_string(slot) + " outside the cache's " + std::to_string(slots) +
                 " slots");
    }
  }
  return Status::Ok();
}

Status MlaAttentionBackend::Configure(const AttentionOptions& options) {
  if (options.mla_kernel != "auto") {
    return InvalidArgument("mla_kernel " + options.mla_kernel + ": backend '" + name() +
                           "' has no MLA kernel choice");
  }
  return Status::Ok();
}

KvCacheLayout KvCacheLayout::Of(const AttentionSpec& spec) {
  KvCacheLayout l;
  l.tensors = spec.kind == AttentionKind::kMla ? 1 : 2;
  const size_t slots = static_cast<size_t>(spec.num_kv_heads) * spec.block_size;
  l.data_bytes = slots * spec.head_dim * DTypeSize(spec.kv_dtype);
  l.scale_bytes = spec.kv_quant == KvQuant::kDynamicPerToken ? slots * sizeof(float) : 0;
  return l;
}

KvCacheLayer KvCacheLayout::Carve(void* base, int num_blocks) const {
  char* p = static_cast<char*>(base);
  const size_t data = data_bytes * num_blocks, scales = scale_bytes * num_blocks;
  KvCacheLayer kv;
  kv.k = p;
  if (tensors == 2) kv.v = p + data;
  if (scales > 0) {
    kv.k_block_scales = reinterpret_cast<float*>(p + tensors * data);
    kv.v_block_scales = reinterpret_cast<float*>(p + tensors * data + scales);
  }
  return kv;
}

}  // namespace llm
