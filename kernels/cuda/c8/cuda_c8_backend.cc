// Registers the CUDA C8 attention kernel as the "cuda_c8" backend: MHA/GQA, bf16 / int8 / fp8
// caches with per-head, per-channel or per-token scales, head dims 64 and 128, power-of-two
// blocks of at least 16 tokens, causal. Plan uploads the step's plan; Run appends (with the
// rotary fused in when given the raw projection) and attends on the backend's stream (the
// model's compute stream).
#include <memory>

#include "kernels/backend_registry.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/c8/cuda_c8_backend.h"

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

class CudaC8Backend final : public CudaAttentionBackend, public C8PrefillSwitch {
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
  bool supports_fp8_out() const override { return true; }
  Status SetPrefillFmha(bool on) override { return attn_.SetPrefillFmha(on); }
  bool prefill_fmha() const override { return attn_.prefill_fmha(); }
  Status ReserveGraphs(int max_seqs, int max_pages) override {
    return attn_.ReserveGraph(max_seqs, max_pages);
  }
  Status PlanGraph(const AttentionBatch& batch, int bucket) override {
    C8PlanConfig config = config_;
    config.max_decode_items = attn_.GraphItemCapacity(bucket);
    return attn_.UploadGraph(batch, BuildC8Plan(attn_.shape(), batch, config), bucket, stream_);
  }
  void Run(const AttentionParams& p) override {
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
    a.rope = p.rope;
    const Status st = attn_.Run(a, stream_);
    LLM_CHECK(st.ok()) << st.ToString();
  }

 private:
  AttentionSpec spec_;
  C8Attention attn_;
  C8PlanConfig config_;
  void* stream_ = nullptr;
};

// Capabilities (cache dtypes and scalings, head dims, block sizes) are this family's row in
// KernelCatalog().
const BackendRegistrar kRegistrar("cuda_c8", BackendFactoryOf<CudaC8Backend>());

}  // namespace

void LinkCudaC8Backend() {}

}  // namespace llm::cuda
