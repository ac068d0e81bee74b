// Registers the CUDA C8 attention kernel as the "cuda_c8" backend: MHA/GQA, bf16 / int8 / fp8
// caches with per-head, per-channel or per-token scales, head dims 64 and 128, power-of-two
// blocks of at least 16 tokens, causal with sliding windows and learned sink logits. Plan uploads
// the step's plan; Run appends (with the rotary fused in when given the raw projection) and attends
// on the backend's stream (the model's compute stream). Configure applies c8_prefill: prefill
// chunks over an 8-bit cache on the C8 prefill tiles, or through the sm_90a wgmma FMHA kernel over
// a bf16 copy of their cache.
#include <memory>

#include "kernels/backend_registry.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/fmha/fmha_launcher.h"

namespace llm::cuda {
namespace {

CacheType ToCacheType(DType t) {
  if (t == DType::kI8) return CacheType::kInt8;
  if (t == DType::kFp8E4M3) return CacheType::kFp8E4M3;
  return CacheType::kBf16;
}

ScaleMode ToScaleMode(KvQuant q) {
  switch (q) {
    case KvQuant::kStaticPerHead:
      return ScaleMode::kPerHead;
    case KvQuant::kStaticPerChannel:
      return ScaleMode::kPerChannel;
    case KvQuant::kDynamicPerToken:
      return ScaleMode::kPerToken;
    case KvQuant::kNone:
      break;
  }
  return ScaleMode::kNone;
}

class CudaC8Backend final : public AttentionBackend {
 public:
  explicit CudaC8Backend(const AttentionSpec& spec)
      : spec_(spec),
        attn_(C8Shape{spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.block_size,
                      ToCacheType(spec.kv_dtype), ToScaleMode(spec.kv_quant)}) {
    config_ = attn_.plan_config();
  }
  std::string name() const override { return "cuda_c8"; }
  size_t BlockBytes() const override {
    const size_t elems = static_cast<size_t>(spec_.num_kv_heads) * spec_.block_size;
    size_t bytes = 2 * elems * spec_.head_dim * (spec_.kv_dtype == DType::kBF16 ? 2 : 1);
    if (spec_.kv_quant == KvQuant::kDynamicPerToken) bytes += 2 * elems * sizeof(float);
    return bytes;
  }
  void set_stream(void* stream) override { stream_ = stream; }
  Status Plan(const AttentionBatch& batch) override {
    return attn_.Upload(batch, BuildC8Plan(attn_.shape(), batch, config_), stream_);
  }
  bool supports_graphs() const override { return true; }
  bool supports_fused_rope() const override { return true; }
  bool supports_fused_qk_norm() const override { return true; }
  bool supports_fp8_out() const override { return true; }
  Status Configure(const AttentionOptions& options) override {
    eight_bit_ = spec_.kv_quant != KvQuant::kNone;
    if (options.c8_prefill == "fmha" && !eight_bit_) {
      return InvalidArgument(
          "c8_prefill fmha: needs the cuda_c8 backend over an 8-bit KV cache, got cuda_c8 over " +
          std::string(DTypeName(spec_.kv_dtype)));
    }
    // auto: the FMHA path where it runs (compute capability 9.0, sm_90a in the build): its
    // prefill tiles outrun C8's even with the bf16 copy (docs/BENCHMARKS.md).
    const bool fmha = options.c8_prefill == "fmha" ||
                      (options.c8_prefill == "auto" && eight_bit_ && FmhaWgmmaAvailable());
    choice_ = options.c8_prefill;
    return attn_.SetPrefillFmha(fmha);
  }
  std::string kernel_choice() const override {
    if (!eight_bit_) return "";
    return "c8_prefill=" + choice_ + " -> prefill chunks on " +
           (attn_.prefill_fmha() ? "the wgmma FMHA kernel over a bf16 copy of the 8-bit cache"
                                 : "the C8 prefill tiles");
  }
  Status ReserveGraphs(int max_seqs, int max_pages, int max_q) override {
    return attn_.ReserveGraph(max_seqs, max_pages, max_q);
  }
  Status PlanGraph(const AttentionBatch& batch, GraphShape shape) override {
    C8PlanConfig config = config_;
    config.max_decode_items = attn_.GraphItemCapacity(shape);
    config.decode_query_len = shape.q;  // every row on decode tiles: the graph has no others
    return attn_.UploadGraph(batch, BuildC8Plan(attn_.shape(), batch, config), shape, stream_);
  }
  Status Run(const AttentionParams& p) override {
    // Not in this family's catalog row, so selection never gives them to it.
    LLM_CHECK(p.logit_softcap == 0.0f && p.alibi_slopes == nullptr)
        << "cuda_c8 implements neither the logit soft-cap nor ALiBi";
    C8Attention::LayerArgs a;
    a.q = p.q;
    a.k_new = p.k_new;
    a.v_new = p.v_new;
    a.out = p.out;
    a.out_fp8 = p.out_fp8;
    a.out_fp8_inv_scale = p.out_fp8_inv_scale;
    a.k_cache = p.cache.k;
    a.v_cache = p.cache.v;
    const bool dynamic = spec_.kv_quant == KvQuant::kDynamicPerToken;
    a.k_scale = dynamic ? p.cache.k_block_scales : const_cast<float*>(p.cache.k_scale);
    a.v_scale = dynamic ? p.cache.v_block_scales : const_cast<float*>(p.cache.v_scale);
    a.softmax_scale = p.softmax_scale;
    a.window_left = p.window_left;
    a.sink_logits = p.sink_logits;
    a.rope = p.rope;
    return attn_.Run(a, stream_);
  }

 private:
  AttentionSpec spec_;
  C8Attention attn_;
  C8PlanConfig config_;
  void* stream_ = nullptr;
  bool eight_bit_ = false;  // Configure's view of the cache
  std::string choice_;      // the c8_prefill value Configure applied
};

// Capabilities (cache dtypes and scalings, head dims, block sizes) are this family's row in
// KernelCatalog().
const BackendRegistrar kRegistrar("cuda_c8", BackendFactoryOf<CudaC8Backend>());

}  // namespace
}  // namespace llm::cuda
