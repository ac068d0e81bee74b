// Attaches the CUDA MLA decode kernel to the "cuda_mla" catalog entry (kernels/kernel_catalog.cc):
// AttentionKind::kMla, latent width 576 with rope 64, bf16 or fp8 e4m3 cache (one per-layer
// scale, MlaParams::cache_scale), bf16 activations, causal, 1..kMlaMaxDecodeQueryLen query rows
// per decode sequence, any block size. Plan uploads the step's plan; RunMla appends every row's
// latent, then attends the decode sequences on the backend's stream (the model's compute stream)
// and leaves the other rows of out_latent untouched. Decode steps of one token per sequence can
// run in CUDA graphs (ReserveGraphs / PlanGraph: MlaDecode's graph form).
//
// The prefill chunks of a step (sequences RunMla leaves) are attended by RunMlaPrefill in the
// expanded form (MlaPrefill, mla_prefill.h). Configure applies mla_kernel (the registry's call,
// before the first Plan); the model reaches RunMla and RunMlaPrefill through
// AttentionBackend::mla().
#include <memory>

#include "base/check.h"
#include "kernels/backend_registry.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/mla/mla_decode.h"
#include "kernels/cuda/mla/mla_prefill.h"

namespace llm::cuda {
namespace {

class CudaMlaBackend final : public MlaAttentionBackend {
 public:
  explicit CudaMlaBackend(const AttentionSpec& spec)
      : spec_(spec),
        attn_(std::make_unique<MlaDecode>(MlaDecodeShape{
            spec.num_q_heads, spec.block_size,
            spec.kv_dtype == DType::kFp8E4M3 ? MlaCacheType::kFp8E4M3 : MlaCacheType::kBf16})),
        prefill_(MlaPrefillShape{spec.num_q_heads, spec.block_size, spec.head_dim,
                                 spec.mla_rope_dim, spec.kv_dtype == DType::kFp8E4M3}) {
    LLM_CHECK(spec.head_dim == kMlaCacheDim && spec.mla_rope_dim == kMlaRopeDim)
        << "cuda_mla needs head_dim " << kMlaCacheDim << " with mla_rope_dim " << kMlaRopeDim;
    LLM_CHECK(spec.kv_dtype == DType::kBF16 || spec.kv_dtype == DType::kFp8E4M3)
        << "cuda_mla cache dtype " << DTypeName(spec.kv_dtype);
    config_ = attn_->plan_config();
  }

  // mla_kernel "auto" | "wgmma" | "portable" (MlaKernel, mla_decode.h). "wgmma" where it cannot
  // run (not compute capability 9.0, or no sm_90a in the build) fails the load; MlaDecode checks
  // the same at every upload.
  Status Configure(const AttentionOptions& options) override {
    MlaKernel kernel = MlaKernel::kAuto;
    if (options.mla_kernel == "wgmma") {
      kernel = MlaKernel::kWgmma;
    } else if (options.mla_kernel == "portable") {
      kernel = MlaKernel::kPortable;
    } else if (options.mla_kernel != "auto") {
      return InvalidArgument("mla_kernel must be one of auto, wgmma, portable, got '" +
                             options.mla_kernel + "'");
    }
    if (kernel == MlaKernel::kWgmma && !MlaWgmmaAvailable()) {
      return InvalidArgument(
          "mla_kernel wgmma: the sm_90a MLA kernel needs a compute capability 9.0 device and a "
          "build whose CUDA architectures include 90a");
    }
    MlaDecodeShape shape = attn_->shape();
    shape.kernel = kernel;
    attn_ = std::make_unique<MlaDecode>(shape);  // holds no device memory before its first Upload
    config_ = attn_->plan_config();
    choice_ = options.mla_kernel;
    return Status::Ok();
  }
  std::string kernel_choice() const override {
    static_assert(kMlaNumRowVariants == 3 && kMlaVariantRows[0] == 16 && kMlaVariantRows[1] == 32 &&
                  kMlaVariantRows[2] == 64);
    auto on = [this](int variant) -> std::string {
      return !attn_->uses_wgmma(variant)   ? "portable"
             : attn_->uses_seesaw(variant) ? "wgmma (seesaw)"
                                           : "wgmma";
    };
    return "mla_kernel=" + choice_ + " -> 16-row items on " + on(0) + ", 32-row on " + on(1) +
           ", 64-row on " + on(2);
  }

  std::string name() const override { return "cuda_mla"; }
  size_t BlockBytes() const override {
    return static_cast<size_t>(spec_.block_size) * kMlaCacheDim *
           (spec_.kv_dtype == DType::kBF16 ? 2 : 1);
  }
  void set_stream(void* stream) override { stream_ = stream; }
  Status Plan(const AttentionBatch& batch) override {
    LLM_RETURN_IF_ERROR(prefill_.Plan(batch, stream_));
    return attn_->Upload(batch, BuildMlaPlan(attn_->shape(), batch, config_), stream_);
  }
  // Decode steps in CUDA graphs: MlaDecode's graph form (mla_decode.h). The split-KV choice is
  // still made on the host for every step, only bounded by the bucket's grid.
  bool supports_graphs() const override { return true; }
  Status ReserveGraphs(int max_seqs, int max_pages, int max_q) override {
    return attn_->ReserveGraph(max_seqs, max_pages, max_q);
  }
  Status PlanGraph(const AttentionBatch& batch, GraphShape shape) override {
    prefill_.PlanNone();
    return attn_->UploadGraph(
        batch, BuildMlaPlan(attn_->shape(), batch, attn_->GraphPlanConfig(shape)), shape, stream_);
  }
  Status Run(const AttentionParams&) override {
    LLM_CHECK(false) << "cuda_mla is an MLA backend: call RunMla";
    return Status::Ok();
  }
  Status RunMla(const MlaParams& p) override {
    MlaDecode::LayerArgs a;
    a.q_latent = p.q_latent;
    a.q_pe = p.q_pe;
    a.latent_new = p.latent_new;
    a.out_latent = p.out_latent;
    a.cache = p.cache;
    a.cache_scale = p.cache_scale;
    a.softmax_scale = p.softmax_scale;
    return attn_->Run(a, stream_);
  }
  Status RunMlaPrefill(const MlaPrefillParams& p) override { return prefill_.Run(p, stream_); }
  Status ReserveMlaPrefill(int max_rows, int nope_dim, int v_dim) override {
    return prefill_.Reserve(max_rows, nope_dim, v_dim);
  }

 private:
  AttentionSpec spec_;
  std::unique_ptr<MlaDecode> attn_;  // replaced by Configure before the first Plan
  MlaPlanConfig config_;
  MlaPrefill prefill_;
  void* stream_ = nullptr;
  std::string choice_ = "auto";  // the mla_kernel value Configure applied
};

// Capabilities are this family's row in KernelCatalog().
const BackendRegistrar kRegistrar("cuda_mla", BackendFactoryOf<CudaMlaBackend>());

}  // namespace
}  // namespace llm::cuda
