// The attention backend interface shared by every device, and the plain-C++ parameter structs
// its kernels consume. No CUDA or HIP types appear here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace llm {

enum class DeviceKind { kCpu, kCuda, kHip };
enum class AttentionKind { kMha, kMla };  // kMha covers MHA, GQA and MQA

const char* DeviceKindName(DeviceKind d);
const char* AttentionKindName(AttentionKind k);

// How an 8-bit KV cache (kv_dtype kI8 or kFp8E4M3) is scaled; kNone for fp32/fp16/bf16 caches.
// The element formats are defined in base/quant.h and the layouts in docs/ARCHITECTURE.md
// ("KV cache storage"). Per-tensor scales are deliberately not offered.
enum class KvQuant {
  kNone,
  kStaticPerHead,     // one dequant scale per KV head per layer: [num_kv_heads]
  kStaticPerChannel,  // one per KV head and channel per layer: [num_kv_heads, head_dim]
  kDynamicPerToken,   // absmax/448 (fp8; int8: /127) of each token's head vector, at append
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
  // kMla only: head_dim is the cached latent width (kv_lora_rank + rope dim, 576 for DeepSeek)
  // and this is its trailing roped part; num_kv_heads is 1. See MlaParams.
  int mla_rope_dim = 0;
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

// The shape a CUDA graph of a decode-shaped step is captured for: `seqs` sequences (the padded
// batch) of `q` query rows each (1 for a decode step, 1 + K for a speculative verify step).
struct GraphShape {
  int seqs = 0;
  int q = 1;
  int rows() const { return seqs * q; }
  bool operator<(const GraphShape& o) const { return seqs != o.seqs ? seqs < o.seqs : q < o.q; }
  bool operator==(const GraphShape& o) const { return seqs == o.seqs && q == o.q; }
};

// Whether every sequence of `batch` has exactly q query rows (and num_tokens = num_seqs * q).
bool UniformQueryRows(const AttentionBatch& batch, int q);

// Whether `batch` is well formed over a cache of num_blocks blocks of block_size tokens: index
// arrays of the right sizes, q_indptr and page_indptr non-decreasing from 0, each sequence's
// pages covering its kv_len, 0 <= q_len <= kv_len, page ids and slots inside the cache (or page
// -1: a block the scheduler freed left of every sliding window, never read; or slot -1: the row
// appends nothing, as a CUDA graph bucket's padding rows).
// Models check every step's batch before planning it: a malformed block table must fail the
// step with a status, not send a kernel to read or write outside the cache.
Status CheckAttentionBatch(const AttentionBatch& batch, int block_size, int num_blocks);

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

// How one layer's cache for `spec` is laid out in one allocation of num_blocks blocks, for every
// backend of the spec (whose BlockBytes() must equal block_bytes()): all K blocks, then all V
// blocks, then for kDynamicPerToken K's and V's per-token scales. kMla caches one latent row per
// token, in K alone. Runners allocate from this; static scales are the model's, not per block.
struct KvCacheLayout {
  int tensors = 2;         // K and V; 1 for kMla
  size_t data_bytes = 0;   // per tensor and block
  size_t scale_bytes = 0;  // per tensor and block (dynamic per-token scales)
  size_t block_bytes() const { return tensors * (data_bytes + scale_bytes); }
  static KvCacheLayout Of(const AttentionSpec& spec);
  // The views of an allocation of block_bytes() * num_blocks bytes at base; static scales null.
  KvCacheLayer Carve(void* base, int num_blocks) const;
};

// Rotary embedding fused into the KV append (the C8 seed's design; backends with
// supports_fused_rope()). The backend splits the raw fused q/k/v projection, scales each row,
// adds the bias, rotates q and k ("rotate_half" pairs, angle = position x inv_freq), writes q and
// appends K and V, storing exactly what a separate rotary kernel followed by the append would.
struct FusedRope {
  const void* qkv = nullptr;           // [num_tokens, (Hq + 2 Hkv) * head_dim] raw projection
  const void* bias = nullptr;          // [(Hq + 2 Hkv) * head_dim] or null
  const float* qkv_scale = nullptr;    // [num_tokens] row scales (an fp8 GEMM's output) or null
  const int32_t* positions = nullptr;  // [num_tokens]
  const float* inv_freq = nullptr;     // [head_dim / 2], rope scaling already applied
  void* q = nullptr;                   // out: [num_tokens, num_q_heads, head_dim], then attended
  // Per-head RMSNorm of q and of k before the rotary (Qwen3's q_norm / k_norm), both or neither,
  // only for backends with supports_fused_qk_norm(): bf16 [head_dim] weights, x * rsqrt(mean(x^2)
  // + norm_eps) * (norm_offset + w) in fp32, as the model's own q/k-norm rotary kernel computes.
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float norm_eps = 0.0f;
  float norm_offset = 0.0f;
};

// Inputs of one layer call. Pointers are in the backend's memory space and element type.
struct AttentionParams {
  const void* q = nullptr;      // [num_tokens, num_q_heads, head_dim]
  const void* k_new = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  const void* v_new = nullptr;  // [num_tokens, num_kv_heads, head_dim]
  void* out = nullptr;          // [num_tokens, num_q_heads, head_dim]
  KvCacheLayer cache;
  float softmax_scale = 1.0f;
  // Causal sliding window of this layer (Mistral, Qwen2): a query at position p sees cache
  // positions [p - window_left, p]; -1 = the whole prefix. Layers of one model may differ (Qwen2's
  // max_window_layers). Only backends listing kFeatureSlidingWindow get a non-negative value.
  int window_left = -1;
  // Attention logit soft-cap of this layer (Gemma 2's attn_logit_softcapping): each scaled score
  // s becomes cap * tanh(s / cap) before the softmax; 0 = none. Only backends listing
  // kFeatureSoftCap get a non-zero value.
  float logit_softcap = 0.0f;
  // Learned per-head sink logits (gpt-oss self_attn.sinks), [num_q_heads] fp32 in the backend's
  // memory space: one more softmax column per head whose value vector is zero, so the weights of
  // the real keys sum to less than one. Null = none. Only backends listing kFeatureSinks get one.
  const float* sink_logits = nullptr;
  // ALiBi slopes, [num_q_heads] fp32 in the backend's memory space: a query at position p adds
  // slope[h] * (j - p) to its (scaled, soft-capped) score for cache position j. Null = none. Only
  // backends listing kFeatureAlibi get them.
  const float* alibi_slopes = nullptr;
  // Set (rope.qkv non-null) only for backends with supports_fused_rope(): then q, k_new and v_new
  // are unused.
  FusedRope rope;
  // Set (non-null) only for backends with supports_fp8_out(): the output goes here instead of
  // out, as e4m3 bytes [num_tokens, num_q_heads, head_dim] of out * out_fp8_inv_scale, saturated
  // to +-448 (an fp8 o_proj's input with a static scale).
  void* out_fp8 = nullptr;
  float out_fp8_inv_scale = 1.0f;
};

// How a user steers attention (the server's attention options). Only the registry reads them
// (BackendRegistry::CreateBackends): a model never sees a family's own kernel choices. A family's
// option other than "auto" fails the load unless the backend attending the steps it steers
// applies it (kKernelOptions, backend_registry.h).
struct AttentionOptions {
  std::string backend;                   // forced backend name; empty: the registry's priority
  std::string prefill_backend = "auto";  // steps with a prefill chunk: "auto", "none" or a name
  std::string c8_prefill = "auto";       // cuda_c8's prefill kernel: "auto", "tiles" or "fmha"
  std::string mla_kernel = "auto";       // cuda_mla's decode kernel: "auto", "wgmma", "portable"
};

class MlaAttentionBackend;

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual std::string name() const = 0;
  // Bytes one KV block takes for K and V together in one layer (with its dynamic scales, if any).
  virtual size_t BlockBytes() const = 0;
  // Host-side work for a step, done once before the layers run (block tables, split-KV list).
  // The layer calls only consume the plan, so a GPU step can be captured in a graph.
  virtual Status Plan(const AttentionBatch& batch) = 0;
  // Appends this step's K/V into the cache, then attends. Valid after Plan for the same step. An
  // error (a failed launch) fails the step, not the process.
  virtual Status Run(const AttentionParams& params) = 0;
  // Whether Run takes the raw projection and does the rotary itself (AttentionParams::rope).
  virtual bool supports_fused_rope() const { return false; }
  // Whether that fused rotary also takes the per-head q / k norms (FusedRope::q_norm).
  virtual bool supports_fused_qk_norm() const { return false; }
  // Whether Run can write its output as e4m3 with a caller-given scale (AttentionParams::out_fp8),
  // for the step last planned (a backend may attend some steps through a kernel without it).
  virtual bool supports_fp8_out() const { return false; }
  // GPU backends: the stream (cudaStream_t / hipStream_t) every Plan upload and Run launch goes
  // to, owned by the model. CPU backends ignore it.
  virtual void set_stream(void* stream) {}
  // Applies the options that choose among this family's own kernels (those its catalog row lists
  // in BackendInfo::kernel_options). The registry calls it once, right after creating the backend
  // and refusing the options no chosen backend can apply; an error fails the load. The default
  // has no such choice.
  virtual Status Configure(const AttentionOptions& options) { return Status::Ok(); }
  // What Configure chose, for the load log ("" when there is no choice to report).
  virtual std::string kernel_choice() const { return ""; }
  // This backend's MLA interface; null for kMha families.
  virtual MlaAttentionBackend* mla() { return nullptr; }

  // ---- Decode steps in CUDA graphs (GPU backends that support it) ----
  // ReserveGraphs fixes a second device area for decode-shaped steps (every sequence has the same
  // 1..max_q query rows: one-token decode steps, speculative verify steps) of up to max_seqs
  // sequences and max_pages block-table entries in all. PlanGraph plans such a step padded to
  // shape.seqs sequences of shape.q rows each (rows past num_tokens are padding: no append,
  // output unwritten); the Runs after it launch the same grids with the same pointers for every
  // step of that shape, reading the step's counts from device memory, so a model may capture
  // them once and replay.
  virtual bool supports_graphs() const { return false; }
  virtual Status ReserveGraphs(int max_seqs, int max_pages, int max_q) {
    return Unimplemented(name() + " cannot run in CUDA graphs");
  }
  virtual Status PlanGraph(const AttentionBatch& batch, GraphShape shape) {
    return Unimplemented(name() + " cannot run in CUDA graphs");
  }
};

// ---- Multi-head latent attention (AttentionKind::kMla, DeepSeek-V2/V3) ----
// The cache holds one latent row per token and no heads: [num_blocks, block_size, L] with
// L = kv_lora_rank + rope_dim (AttentionSpec::head_dim), the RMS-normalized c_kv followed by the
// roped k_pe, in the backend's kv dtype (fp32, or fp8 e4m3 bytes dequantized as
// Fp8E4M3ToFloat(byte) * cache_scale, base/quant.h). All query heads share that latent.
//
// "Decode" sequences are those with 1..kMlaMaxDecodeQueryLen query rows this step. For them the
// backend attends in the absorbed form: with W_UK folded into the query,
//   score(t, h, j) = softmax_scale * (q_latent[t,h] . c_j + q_pe[t,h] . k_pe_j)   (j <= pos(t))
//   out_latent[t, h] = sum_j softmax(score)_j * c_j
// and the caller applies W_UV (and o_proj) afterwards. Rows of longer sequences (prefill chunks)
// are neither read nor written by RunMla: the caller attends them itself (e.g. expanding the
// cached latents to full heads). The latents of every row are appended, decode or not.
// Eight rows cover every speculative verify step (K <= 4 drafts plus the last token) eagerly as
// in graphs; the expanded form would re-expand the whole context for each such step.
constexpr int kMlaMaxDecodeQueryLen = 8;

struct MlaParams {
  const void* q_latent = nullptr;    // [num_tokens, num_q_heads, kv_lora_rank] (decode rows)
  const void* q_pe = nullptr;        // [num_tokens, num_q_heads, rope_dim], roped (decode rows)
  const void* latent_new = nullptr;  // [num_tokens, kv_lora_rank + rope_dim], every row
  void* out_latent = nullptr;        // [num_tokens, num_q_heads, kv_lora_rank] (decode rows)
  void* cache = nullptr;             // this layer's [num_blocks, block_size, L]
  float cache_scale = 1.0f;          // fp8 dequant scale of this layer (ignored for fp32)
  float softmax_scale = 1.0f;
};

// The rows RunMla leaves (sequences with more than kMlaMaxDecodeQueryLen query rows: prefill
// chunks), attended in the expanded form: each such sequence's cached latents (this step's
// included, so after RunMla of the same layer) expand through kv_b_proj into per-head keys
// [k_nope, k_pe] and values, and each query row attends causally with full heads:
//   score(t, h, j) = softmax_scale * (q_nope[t,h] . (W_UK_h c_j) + q_pe[t,h] . k_pe_j)
//   out[t, h] = sum_j softmax(score)_j * (W_UV_h c_j)
struct MlaPrefillParams {
  const void* q = nullptr;       // [num_tokens, num_q_heads, nope_dim + rope_dim], q_pe roped;
  int q_stride = 0;              //   rows q_stride elements apart
  const void* w_kv_b = nullptr;  // [num_q_heads * (nope_dim + v_dim), kv_lora_rank]: per head
                                 //   W_UK [nope_dim, C] then W_UV [v_dim, C] (kv_b_proj)
  int nope_dim = 0;
  int v_dim = 0;
  void* out = nullptr;    // [num_tokens, num_q_heads, v_dim]: the prefill rows are written
  void* cache = nullptr;  // this layer's [num_blocks, block_size, L]
  float cache_scale = 1.0f;
  float softmax_scale = 1.0f;
};

// Backends of kind kMla implement RunMla; their Run(AttentionParams) is never called.
class MlaAttentionBackend : public AttentionBackend {
 public:
  MlaAttentionBackend* mla() override { return this; }
  // The default has no kernel choice and refuses an mla_kernel other than "auto" (an MLA family
  // whose catalog row lists the option without implementing it).
  Status Configure(const AttentionOptions& options) override;
  // Appends this step's latents, then attends the decode sequences. Valid after Plan. An error
  // (a failed launch) fails the step, not the process.
  virtual Status RunMla(const MlaParams& params) = 0;
  // Attends the prefill rows of the step last planned (MlaPrefillParams), after RunMla of the
  // same layer; nothing when the step has none. The default has no prefill path.
  virtual Status RunMlaPrefill(const MlaPrefillParams& params) {
    return Unimplemented(name() + " cannot attend MLA prefill rows");
  }
  // Allocates RunMlaPrefill's working memory for steps of up to max_rows prefill rows now (it is
  // bounded whatever the context length), so that the KV pool is sized after it; RunMlaPrefill
  // grows it on first use otherwise. The default (no prefill path) has nothing to reserve.
  virtual Status ReserveMlaPrefill(int max_rows, int nope_dim, int v_dim) { return Status::Ok(); }
};

}  // namespace llm
