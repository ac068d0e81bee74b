// The attention backend interface shared by every device, and the plain-C++ parameter structs
// its kernels consume. No CUDA or HIP types appear here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/dtype.h"
#include "engine/base/status.h"

namespace llm {

enum class DeviceKind { kCpu, kCuda, kHip };
enum class AttentionKind { kMha, kMla };  // kMha covers MHA, GQA and MQA

const char* DeviceKindName(DeviceKind d);
const char* AttentionKindName(AttentionKind k);

// How an 8-bit KV cache (kv_dtype kI8 or kFp8E4M3) is scaled; kNone for fp32/fp16/bf16 caches.
// The element formats are defined in engine/base/quant.h and the layouts in docs/ARCHITECTURE.md
// ("KV cache storage"). Per-tensor scales are deliberately not offered.
enum class KvQuant {
  kNone,
  kStaticPerHead,     // one dequant scale per KV head per layer: [num_kv_heads]
  kStaticPerChannel,  // one per KV head and channel per layer: [num_kv_heads, head_dim]
  kDynamicPerToken,   // fp8 only: absmax/448 of each token's head vector, computed at append time
};
const char* KvQuantName(KvQuant q);

// Mask / score features a model may need; a backend lists those it implements.
enum AttentionFeature : uint32_t {
  kFeatureCausal = 1u << 0,
  kFeatureSlidingWindow = 1u << 1,
  kFeatureAlibi = 1u << 2,
  kFeatureSoftCap = 1u << 3,
  kFeatureSinks = 1u << 4,
};
std::string FeatureNames(uint32_t features);

// What a model asks of attention. Selection matches this against every registered backend.
struct AttentionSpec {
  DeviceKind device = DeviceKind::kCpu;
  int device_arch = 0;  // e.g. 90 for sm_90; 0 on CPU
  AttentionKind kind = AttentionKind::kMha;
  DType kv_dtype = DType::kF32;
  KvQuant kv_quant = KvQuant::kNone;  // must be kNone exactly when kv_dtype is not 8-bit
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 64;
  uint32_t features = kFeatureCausal;
};

// One step's batch, in the CSR layout every backend shares. Sequence s owns query rows
// [q_indptr[s], q_indptr[s+1]) of the flattened batch; after this step's append its cache holds
// kv_lens[s] tokens, the last (q_indptr[s+1]-q_indptr[s]) of which are the new ones, stored in
// blocks page_indices[page_indptr[s] .. page_indptr[s+1]). A query row at position p attends to
// cache positions [0, p] (causal).
struct AttentionBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  std::vector<int32_t> q_indptr;      // [num_seqs + 1]
  std::vector<int32_t> kv_lens;       // [num_seqs]
  std::vector<int32_t> page_indptr;   // [num_seqs + 1]
  std::vector<int32_t> page_indices;  // [page_indptr[num_seqs]]
  std::vector<int32_t> slot_mapping;  // [num_tokens] block * block_size + offset of each new token
};

// One layer's paged cache. Both tensors: [num_blocks, num_kv_heads, block_size, head_dim], with
// elements of AttentionSpec::kv_dtype (1 byte for int8 / fp8).
//
// 8-bit caches also carry dequant scales (x = q * scale; never zero), all fp32, in the backend's
// memory space. Which pointers are set depends on AttentionSpec::kv_quant:
//   kStaticPerHead:    k_scale, v_scale -> [num_kv_heads]              (read only, per layer)
//   kStaticPerChannel: k_scale, v_scale -> [num_kv_heads, head_dim]    (read only, per layer)
//   kDynamicPerToken:  k_block_scales, v_block_scales ->
//                      [num_blocks, num_kv_heads, block_size]          (written at append time)
// The dynamic arrays sit beside the blocks: the scale of the token in slot (block, offset) for
// KV head h is block_scales[(block * num_kv_heads + h) * block_size + offset]. Unused pointers are
// null. BlockBytes() counts the dynamic scales of a block; static scales are not per block.
struct KvCacheLayer {
  void* k = nullptr;
  void* v = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  float* k_block_scales = nullptr;
  float* v_block_scales = nullptr;
};

// Inputs of one layer call. Pointers are in the backend's memory space and element type.
struct AttentionParams {
  const void* q = nullptr;      // [num_tokens, num_q_heads, head_dim]
  const void* k_new = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  const void* v_new = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  void* out = nullptr;          // [num_tokens, num_q_heads, head_dim]
  KvCacheLayer cache;
  float softmax_scale = 1.0f;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string name() const = 0;
  // Bytes one KV block takes for K and V together in one layer (with its dynamic scales, if any).
  virtual size_t BlockBytes() const = 0;
  // Host-side work for a step, done once before the layers run (block tables, split-KV list).
  // The layer calls only consume the plan, so a GPU step can be captured in a graph.
  virtual Status Plan(const AttentionBatch& batch) = 0;
  // Appends this step's K/V into the cache, then attends. Valid after Plan for the same step.
  virtual void Run(const AttentionParams& params) = 0;
};

}  // namespace llm
