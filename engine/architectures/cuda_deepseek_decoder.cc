#include "engine/architectures/cuda_deepseek_decoder.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_gated_mlp.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "engine/runtime/communicator.h"
#include "kernels/cpu/cpu_mla_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/deepseek_ops.h"
#include "kernels/cuda/ops/elementwise_ops.h"

namespace llm {
namespace {

// HF DeepSeek's q_a_layernorm / kv_a_layernorm use the RMSNorm default eps (as the CPU model).
constexpr float kLatentNormEps = 1e-6f;

struct Layer {
  DeviceBuffer attn_norm, mlp_norm;  // bf16 [hidden]
  CudaLinear w_a;                    // [QA + C + R, hidden]: q_a_proj or q_proj, kv_a_proj
  DeviceBuffer q_a_norm;             // bf16 [q_lora_rank] (q LoRA only)
  CudaLinear w_q_b;                  // [H * QK, q_lora_rank] (q LoRA only)
  DeviceBuffer kv_a_norm;            // bf16 [C]
  DeviceBuffer w_kv_b;               // bf16 [H * (N + V), C]: per head W_UK [N, C] then W_UV [V, C]
  CudaLinear wo;                     // [hidden, H * V]
  float cache_scale = 1.0f;          // fp8 latent cache dequant scale
  bool moe = false;
  CudaGatedMlp dense;
  CudaMoeWeights experts;
  void* cache = nullptr;  // the runner's [num_blocks, block_size, C + R] bf16 or fp8 bytes
};

// Activations of the layers for `cap` rows (the runner holds the residual and the norm output).
struct Scratch {
  DeviceBuffer a, qa, q, latent, q_pe, q_latent, out_latent, attn, tmp, gate_up, act;
  DeviceBuffer xq, row_scales;  // fp8 weights: CudaLinear::Apply's per-row input
  CudaMoeScratch moe;           // MoE layers (their router's fp32 input too)
  int cap = 0;
  cuda::Fp8Rows fp8() const { return {xq.ptr, row_scales.as<float>()}; }
};

StatusOr<DType> GpuCacheDType(const DeepseekConfig& config, const ModelLoadOptions& options) {
  if (!options.kv_scales_file.empty()) {
    return InvalidArgument("kv_scales_file is not supported for MLA models");
  }
  const std::string& t = options.kv_cache_dtype;
  if (t.empty() || t == "auto") {
    return config.mla_cache_dtype == DType::kFp8E4M3 ? DType::kFp8E4M3 : DType::kBF16;
  }
  if (t == "bf16" || t == "bfloat16") return DType::kBF16;
  if (t == "fp8_e4m3") return DType::kFp8E4M3;
  return InvalidArgument("kv_cache_dtype '" + t +
                         "' is not supported for DeepSeek on CUDA: use auto (bf16 latent cache), "
                         "bf16 or fp8_e4m3 (one static scale per layer)");
}

class CudaDeepseekDecoder final : public CudaDecoder {
 public:
  CudaDeepseekDecoder(const DeepseekConfig& config, int first_layer, int num_layers)
      : d_(config),
        first_layer_(first_layer),
        num_layers_(num_layers),
        moe_(config.Routing(), config.base.hidden_size, config.moe_intermediate_size,
             config.moe_intermediate_size * config.n_shared_experts) {}
  const ModelConfig& config() const override { return d_.base; }
  const char* name() const override { return "deepseek"; }
  StatusOr<AttentionSpec> AttentionNeeds(const CudaLoadContext& ctx) override;
  Status UseAttention(AttentionBackends backends) override;
  Status Load(const CudaLoadContext& ctx) override;
  AttentionBackend& attention() override { return *mla_; }
  std::string kv_cache_dtype_name() const override { return DTypeName(cache_dtype_); }
  Status BindCache(const CudaLoadContext& ctx, const std::vector<KvCacheLayer>& layers) override;
  // A decode step reads only the runner's staged device inputs (ids, positions), the backend's
  // graph area (PlanGraph) and the MoE layer's own device buffers (it never waits for the host), so
  // it runs in the runner's graphs when cuda_mla has its graph form (the runner runs eager steps
  // while a routing trace is set).
  bool graph_safe() const override { return moe_.graph_safe() && mla_->supports_graphs(); }
  // The projections, the dense MLP and the experts keep a checkpoint's fp8; kv_b_proj (the MLA
  // absorbs it in bf16) is dequantized by the loader.
  bool keeps_checkpoint_fp8() const override { return true; }
  // A tensor-parallel rank (plan.deepseek): its query heads, every expert's slice, the latent
  // replicated (AttentionNeeds).
  bool computes_tensor_parallel() const override { return true; }
  Status Reserve(int set, int rows) override;
  Status Plan(const ForwardBatch& batch) override;
  // Every row of a graph step is a decode row (cuda_mla's graph form plans all q rows of each
  // sequence, K = 4's five included: MlaDecode::GraphPlanConfig).
  Status PlanGraph(const ForwardBatch& batch, GraphShape shape) override {
    SetDecodeRows(shape.rows());
    any_prefill_ = false;
    return mla_->PlanGraph(batch.attn, shape);
  }
  StatusOr<CudaLayersOut> RunLayers(const CudaStep& step) override;
  std::string Summary() const override { return std::to_string(num_moe_layers()) + " MoE"; }
  // Each MoE layer copies its top-k ids back and waits for them (no margin: NaN); eager steps
  // only (CudaMoeLayer::Run refuses a trace inside a capture).
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    routing_trace_ = trace;
    return true;
  }

 private:
  // Column-major strided-batched GEMM, bf16 A and B, fp32 accumulation.
  Status Batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
                 int lda, int64_t sa, const void* b, int ldb, int64_t sb, void* c,
                 cudaDataType c_type, int ldc, int64_t sc, int batch, float beta = 0.0f);
  // A tensor-parallel rank: the partial sums of a row-split output y[T, hidden] (o_proj, the MLP
  // or the MoE layer) summed over the ranks, in place, on the stream (nothing for the whole model).
  Status AllReduce(void* y, int T) const {
    if (comm_ == nullptr) return Status::Ok();
    return comm_->AllReduceSum(y, static_cast<size_t>(T) * d_.base.hidden_size, DType::kBF16,
                               ops_->stream);
  }
  int num_moe_layers() const {
    return static_cast<int>(
        std::count_if(layers_.begin(), layers_.end(), [](const auto& L) { return L->moe; }));
  }
  // Decode rows [0, rows): every row of a decode-only step.
  void SetDecodeRows(int rows) {
    d0_ = 0;
    d1_ = rows;
  }

  DeepseekConfig d_;
  // The checkpoint layers [first_layer_, first_layer_ + num_layers_) this definition computes
  // (the model's, or an MTP layer's decoder layer), with caches layers[0 .. num_layers_).
  int first_layer_ = 0;
  int num_layers_ = 0;
  const CudaLinearOps* ops_ = nullptr;
  Communicator* comm_ = nullptr;        // a tensor-parallel rank's group (CudaLoadContext::comm)
  AttentionBackends backends_;          // the registry's choice (no separate prefill family)
  MlaAttentionBackend* mla_ = nullptr;  // backends_.decode's MLA interface
  DType cache_dtype_ = DType::kBF16;
  float rope_mscale_ = 1.0f;
  DeviceBuffer inv_freq_;
  std::vector<std::unique_ptr<Layer>> layers_;
  CudaMoeLayer moe_;
  MoeTensorNames moe_names_;
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
  Scratch scratch_[2];                                        // eager, graph
  // This step (Plan): decode rows lie in [d0_, d1_) (rows of other sequences in between are
  // computed and then overwritten by the backend's prefill path); whether there are others.
  int d0_ = 0, d1_ = 0;
  bool any_prefill_ = false;
};

StatusOr<AttentionSpec> CudaDeepseekDecoder::AttentionNeeds(const CudaLoadContext& ctx) {
  const ModelConfig& c = d_.base;
  const ModelLoadOptions& options = *ctx.options;
  ops_ = ctx.ops;
  comm_ = ctx.comm;
  if (comm_ != nullptr) {
    // A rank (the plan's DeepseekConfig) computes its query heads over the whole latent: q_a_proj
    // and kv_a_proj_with_mqa replicated, so every rank caches the same latent; q_b_proj (or
    // q_proj) and kv_b_proj cut by head, o_proj by its input columns; the dense MLP and every
    // expert (shared ones too) split in their intermediate dimension, the router replicated.
    // The outputs of o_proj and of the MLP / MoE layer are all-reduced (bf16) before they join
    // the residual. fp8 weights (weight_dtype fp8: each rank's shard with its own per-tensor
    // scale) go through CudaLinear::Apply, whose bf16 output carries every scale, so the partial
    // sums add as they are. A pre-quantized checkpoint's block scales are not cut with its
    // weights (the plan refuses it first): refused by name.
    if (ctx.fp8_checkpoint) {
      return Unimplemented("tensor_parallel_size " + std::to_string(comm_->size()) +
                           ": the fp8 projections of a pre-quantized checkpoint on a cuda rank "
                           "are not implemented");
    }
  }
  if (d_.n_routed_experts > 0) {
    LLM_RETURN_IF_ERROR(CudaMoeLayer::Check(moe_.routing(), c.hidden_size, d_.moe_intermediate_size,
                                            d_.moe_intermediate_size * d_.n_shared_experts));
    moe_.set_activation_dtype(MoeActivationDtypeOf(options.moe_activation_dtype));
  } else if (options.moe_activation_dtype == "fp8") {
    return InvalidArgument("moe_activation_dtype fp8: " + c.architecture_name +
                           " has no routed experts");
  }
  if (d_.topk_method == DeepseekConfig::TopkMethod::kNoauxTc) {
    moe_names_.selection_bias = "e_score_correction_bias";
  }
  // An unsupported shape (the kernel is built for kv_lora_rank 512 + rope 64) fails here.
  LLM_ASSIGN_OR_RETURN(cache_dtype_, GpuCacheDType(d_, options));
  AttentionSpec spec;
  spec.device = DeviceKind::kCuda;
  spec.device_arch = ctx.device_arch;
  spec.kind = AttentionKind::kMla;
  spec.kv_dtype = cache_dtype_;
  spec.num_q_heads = c.num_q_heads;
  spec.num_kv_heads = 1;
  spec.head_dim = d_.latent_dim();
  spec.mla_rope_dim = d_.qk_rope_head_dim;
  spec.block_size = options.block_size;
  spec.features = kFeatureCausal;
  return spec;
}

Status CudaDeepseekDecoder::UseAttention(AttentionBackends backends) {
  backends_ = std::move(backends);
  mla_ = backends_.decode->mla();
  if (mla_ == nullptr || backends_.prefill != nullptr) {
    return Internal("backend '" + backends_.decode->name() +
                    "' selected for MLA is not an MLA backend alone");
  }
  return Status::Ok();
}

Status CudaDeepseekDecoder::Load(const CudaLoadContext& ctx) {
  const ModelConfig& c = d_.base;
  const WeightStore* w = ctx.weights;
  Bf16WeightLoader& loader = *ctx.loader;
  const WeightQuant quant = ctx.weight_quant;
  const int64_t h = c.hidden_size, H = c.num_q_heads;
  const int64_t QK = d_.qk_head_dim(), C = d_.kv_lora_rank, Lw = d_.latent_dim();
  const int64_t NV = d_.qk_nope_head_dim + d_.v_head_dim, V = d_.v_head_dim;
  const float wstd = 0.02f;
  auto load = [&](const std::string& name, std::vector<int64_t> shape, float mean, float std,
                  DeviceBuffer* out) { return loader.Load({name}, {shape}, mean, std, out); };
  // A projection: the checkpoint's fp8 as it is (CudaLinear::LoadCheckpoint), or bf16 from the
  // loader, then `quant`.
  auto linear = [&](CudaLinear* lin, const std::vector<std::string>& names,
                    const std::vector<std::vector<int64_t>>& shapes, const std::string& name) {
    int64_t n = 0;
    for (const auto& sh : shapes) n += sh[0];
    if (ctx.fp8_checkpoint) {
      return lin->LoadCheckpoint(*ops_, *w, loader, names, shapes, name, quant);
    }
    LLM_RETURN_IF_ERROR(loader.Load(names, shapes, 0, wstd, lin->bf16_target()));
    return lin->Quantize(*ops_, quant, static_cast<int>(n), static_cast<int>(shapes[0][1]), 1,
                         name);
  };
  if (ctx.fp8_checkpoint) {
    spdlog::info(
        "cuda deepseek: the projections, the dense MLP and the experts keep the checkpoint's fp8; "
        "kv_b_proj is dequantized to bf16 (the MLA absorbs it into its bf16 products)");
  }
  for (int l = first_layer_; l < first_layer_ + num_layers_; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    auto L = std::make_unique<Layer>();
    LLM_RETURN_IF_ERROR(load(p + "input_layernorm.weight", {h}, 1, 0.1f, &L->attn_norm));
    LLM_RETURN_IF_ERROR(load(p + "post_attention_layernorm.weight", {h}, 1, 0.1f, &L->mlp_norm));
    const int64_t QA = d_.q_lora_rank > 0 ? d_.q_lora_rank : H * QK;
    if (d_.q_lora_rank > 0) {
      LLM_RETURN_IF_ERROR(linear(&L->w_a, {a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"},
                                 {{QA, h}, {Lw, h}}, a + "q_a_proj + kv_a_proj"));
      LLM_RETURN_IF_ERROR(load(a + "q_a_layernorm.weight", {QA}, 1, 0.1f, &L->q_a_norm));
      LLM_RETURN_IF_ERROR(
          linear(&L->w_q_b, {a + "q_b_proj.weight"}, {{H * QK, QA}}, a + "q_b_proj"));
    } else {
      LLM_RETURN_IF_ERROR(linear(&L->w_a, {a + "q_proj.weight", a + "kv_a_proj_with_mqa.weight"},
                                 {{QA, h}, {Lw, h}}, a + "q_proj + kv_a_proj"));
    }
    LLM_RETURN_IF_ERROR(load(a + "kv_a_layernorm.weight", {C}, 1, 0.1f, &L->kv_a_norm));
    LLM_RETURN_IF_ERROR(load(a + "kv_b_proj.weight", {H * NV, C}, 0, wstd, &L->w_kv_b));
    LLM_RETURN_IF_ERROR(linear(&L->wo, {a + "o_proj.weight"}, {{h, H * V}}, a + "o_proj"));
    L->cache_scale = d_.mla_cache_scale;
    if (w != nullptr && !loader.dummy() && w->Has(a + "kv_scale")) {
      std::vector<float> s;
      LLM_RETURN_IF_ERROR(w->ReadF32(a + "kv_scale", {}, &s));
      if (s.size() != 1 || !(s[0] > 0.0f) || !std::isfinite(s[0])) {
        return InvalidArgument("tensor '" + a + "kv_scale' must be one positive finite float");
      }
      L->cache_scale = s[0];
    }
    L->moe = d_.IsMoeLayer(l);
    if (!L->moe) {
      LLM_RETURN_IF_ERROR(L->dense.Load(loader, *ops_, quant, p + "mlp.", static_cast<int>(h),
                                        c.intermediate_size, ctx.fp8_checkpoint ? w : nullptr));
    } else {
      LLM_RETURN_IF_ERROR(moe_.Load(loader, w, *ops_, quant, p + moe_names_.block, moe_names_,
                                    &L->experts, ctx.fp8_checkpoint));
    }
    layers_.push_back(std::move(L));
  }
  const std::vector<float> inv = d_.RopeInvFreq();
  rope_mscale_ = d_.RopeMscale();
  LLM_RETURN_IF_ERROR(inv_freq_.Alloc(inv.size() * 4));
  GPU_RETURN_IF_ERROR(
      cudaMemcpy(inv_freq_.ptr, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CudaDeepseekDecoder::BindCache(const CudaLoadContext& ctx,
                                      const std::vector<KvCacheLayer>& layers) {
  (void)ctx;
  for (size_t l = 0; l < layers_.size(); ++l) layers_[l]->cache = layers[l].k;
  return Status::Ok();
}

Status CudaDeepseekDecoder::Reserve(int set, int rows) {
  Scratch& s = scratch_[set];
  if (rows <= s.cap) return Status::Ok();
  const ModelConfig& c = d_.base;
  const size_t T = static_cast<size_t>(rows);
  const size_t Hd = c.hidden_size, H = c.num_q_heads, QK = d_.qk_head_dim();
  const size_t Rd = d_.qk_rope_head_dim, V = d_.v_head_dim, C = d_.kv_lora_rank;
  const size_t Lw = d_.latent_dim(), QL = d_.q_lora_rank;
  const size_t QA = QL > 0 ? QL : H * QK;
  const size_t I = c.intermediate_size;
  LLM_RETURN_IF_ERROR(s.a.Alloc(T * (QA + Lw) * 2));
  if (QL > 0) {
    LLM_RETURN_IF_ERROR(s.qa.Alloc(T * QL * 2));
    LLM_RETURN_IF_ERROR(s.q.Alloc(T * H * QK * 2));
  }
  LLM_RETURN_IF_ERROR(s.latent.Alloc(T * Lw * 2));
  LLM_RETURN_IF_ERROR(s.q_pe.Alloc(T * H * Rd * 2));
  LLM_RETURN_IF_ERROR(s.q_latent.Alloc(T * H * C * 2));
  LLM_RETURN_IF_ERROR(s.out_latent.Alloc(T * H * C * 2));
  LLM_RETURN_IF_ERROR(s.attn.Alloc(T * H * V * 2));
  LLM_RETURN_IF_ERROR(s.tmp.Alloc(T * Hd * 2));
  LLM_RETURN_IF_ERROR(s.gate_up.Alloc(T * 2 * I * 2));
  LLM_RETURN_IF_ERROR(s.act.Alloc(T * I * 2));
  if (ops_->fp8 != nullptr) {
    LLM_RETURN_IF_ERROR(s.xq.Alloc(T * std::max({Hd, QA, H * V, I})));
    // Per-row scales, or 1x128 block scales [ceil(k / 128)][T] for block-scaled checkpoint weights.
    LLM_RETURN_IF_ERROR(s.row_scales.Alloc(T * 4 * ((std::max({Hd, QA, H * V, I}) + 127) / 128)));
  }
  if (d_.n_routed_experts > 0) LLM_RETURN_IF_ERROR(moe_.Reserve(rows, &s.moe));
  // The prefill attention's working memory (eager steps only: graphs replay decode steps), one
  // area for every layer and bounded whatever the prompt length.
  if (set == 0) {
    LLM_RETURN_IF_ERROR(mla_->ReserveMlaPrefill(rows, d_.qk_nope_head_dim, d_.v_head_dim));
  }
  // Padding rows of a graph bucket are computed too: keep them finite from the start.
  for (DeviceBuffer* b : {&s.a, &s.qa, &s.q, &s.latent, &s.q_pe, &s.q_latent, &s.out_latent,
                          &s.attn, &s.tmp, &s.gate_up, &s.act, &s.xq, &s.row_scales}) {
    if (b->ptr) GPU_RETURN_IF_ERROR(cudaMemsetAsync(b->ptr, 0, b->bytes, ops_->stream));
  }
  s.cap = rows;
  return Status::Ok();
}

Status CudaDeepseekDecoder::Plan(const ForwardBatch& batch) {
  const AttentionBatch& a = batch.attn;
  // Decode sequences attend in the absorbed form (RunMla), the others (prefill chunks) in the
  // expanded one (RunMlaPrefill): the model absorbs W_UK / W_UV around the first only.
  const std::vector<int32_t> decode_seqs = MlaDecodeSeqs(a);
  d0_ = a.num_tokens;
  d1_ = 0;
  for (int32_t s : decode_seqs) {
    d0_ = std::min(d0_, a.q_indptr[s]);
    d1_ = std::max(d1_, a.q_indptr[s + 1]);
  }
  any_prefill_ = static_cast<int>(decode_seqs.size()) < a.num_seqs;
  return mla_->Plan(a);
}

Status CudaDeepseekDecoder::Batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                    const void* a, int lda, int64_t sa, const void* b, int ldb,
                                    int64_t sb, void* c, cudaDataType c_type, int ldc, int64_t sc,
                                    int batch, float beta) {
  const float alpha = 1.0f;
  BLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      ops_->blas, ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, sa, b, CUDA_R_16BF, ldb, sb, &beta,
      c, c_type, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

StatusOr<CudaLayersOut> CudaDeepseekDecoder::RunLayers(const CudaStep& step) {
  const ModelConfig& c = d_.base;
  Scratch& s = scratch_[step.set];
  cudaStream_t stream = ops_->stream;
  const int T = step.rows;
  const int Hd = c.hidden_size, H = c.num_q_heads, N = d_.qk_nope_head_dim;
  const int Rd = d_.qk_rope_head_dim, V = d_.v_head_dim, C = d_.kv_lora_rank;
  const int Lw = d_.latent_dim(), QK = N + Rd, NV = N + V;
  const int QA = d_.q_lora_rank > 0 ? d_.q_lora_rank : H * QK;
  const int A = QA + Lw;
  const int q_stride = d_.q_lora_rank > 0 ? H * QK : A;  // q lives inside s.a without q LoRA
  const int d0 = d0_, nd = std::max(0, d1_ - d0_);
  const cuda::Fp8Rows fp8 = s.fp8();
  auto* xn = step.xn;
  const float softmax_scale = d_.SoftmaxScale();
  for (int l = 0; l < num_layers_; ++l) {
    const Layer& L = *layers_[l];
    cuda::LaunchAddRmsNorm(step.residual, l == 0 ? nullptr : s.tmp.ptr, L.attn_norm.ptr, nullptr, T,
                           Hd, c.rms_norm_eps, xn, stream);
    // a [T, QA + C + R] = xn @ w_a^T.
    LLM_RETURN_IF_ERROR(L.w_a.Apply(*ops_, xn, T, s.a.ptr, fp8));
    auto* a = s.a.as<uint16_t>();
    uint16_t* q = a;  // [T, H, QK] with row stride q_stride
    if (d_.q_lora_rank > 0) {
      cuda::LaunchRmsNormStrided(a, A, L.q_a_norm.ptr, T, QA, kLatentNormEps, s.qa.ptr, QA, stream);
      LLM_RETURN_IF_ERROR(L.w_q_b.Apply(*ops_, s.qa.ptr, T, s.q.ptr, fp8));
      q = s.q.as<uint16_t>();
    }
    // latent [T, C + R] = RMSNorm(c_kv) ++ rope(k_pe), and q_pe [T, H, R] for the backend (out
    // of place), in one launch; then q's own rope part in place for the prefill path, in that
    // order: q_pe reads the unroped values.
    auto* latent = s.latent.as<uint16_t>();
    cuda::DeepseekRopeArgs ra;
    ra.positions = step.positions;
    ra.inv_freq = inv_freq_.as<float>();
    ra.mscale = rope_mscale_;
    ra.num_tokens = T;
    ra.rope_dim = Rd;
    ra.num_heads = H;
    cuda::MlaRopeNormArgs mr;
    mr.kv = a + QA;
    mr.kv_row = A;
    mr.kv_norm = L.kv_a_norm.ptr;
    mr.kv_rank = C;
    mr.eps = kLatentNormEps;
    mr.latent = latent;
    mr.latent_row = Lw;
    mr.q = q;
    mr.q_row = q_stride;
    mr.q_head = QK;
    mr.q_nope = N;
    mr.q_pe = s.q_pe.ptr;
    mr.rope = ra;
    cuda::LaunchMlaRopeNorm(mr, stream);
    if (any_prefill_) {
      ra.in = q + N;
      ra.in_row = q_stride;
      ra.in_head = QK;
      ra.out = q + N;
      ra.out_row = q_stride;
      ra.out_head = QK;
      cuda::LaunchDeepseekRope(ra, stream);
    }
    // Absorbed decode: q_latent[t, h] [C] = q_nope[t, h] [N] @ W_UK_h [N, C]. A few decode rows
    // take the PDL kernels (cuda::LaunchMlaAbsorbQ / Out), more the batched GEMMs.
    cuda::MlaAbsorbArgs ab;
    ab.w_kv_b = L.w_kv_b.ptr;
    ab.heads = H;
    ab.nope = N;
    ab.v_dim = V;
    ab.rank = C;
    ab.rows = nd;
    ab.q = q + static_cast<size_t>(d0) * q_stride;
    ab.q_row = q_stride;
    ab.q_head = QK;
    ab.q_latent = s.q_latent.as<uint16_t>() + static_cast<size_t>(d0) * H * C;
    ab.out_latent = s.out_latent.as<uint16_t>() + static_cast<size_t>(d0) * H * C;
    ab.attn = s.attn.as<uint16_t>() + static_cast<size_t>(d0) * H * V;
    const bool absorb_kernels = cuda::MlaAbsorbOk(ab);
    if (absorb_kernels) {
      if (!cuda::LaunchMlaAbsorbQ(ab, stream)) {
        return Internal("MLA absorb kernel refused its step");
      }
    } else if (nd > 0) {
      LLM_RETURN_IF_ERROR(Batched(
          CUBLAS_OP_N, CUBLAS_OP_N, C, nd, N, L.w_kv_b.ptr, C, static_cast<int64_t>(NV) * C,
          q + static_cast<size_t>(d0) * q_stride, q_stride, QK,
          s.q_latent.as<uint16_t>() + static_cast<size_t>(d0) * H * C, CUDA_R_16BF, H * C, C, H));
    }
    MlaParams mp;
    mp.q_latent = s.q_latent.ptr;
    mp.q_pe = s.q_pe.ptr;
    mp.latent_new = latent;
    mp.out_latent = s.out_latent.ptr;
    mp.cache = L.cache;
    mp.cache_scale = L.cache_scale;
    mp.softmax_scale = softmax_scale;
    LLM_RETURN_IF_ERROR(mla_->RunMla(mp));  // appends every row's latent, attends the decode rows
    if (absorb_kernels) {
      if (!cuda::LaunchMlaAbsorbOut(ab, stream)) {
        return Internal("MLA absorb kernel refused its step");
      }
    } else if (nd > 0) {
      // attn[t, h] [V] = W_UV_h [V, C] @ out_latent[t, h] [C].
      LLM_RETURN_IF_ERROR(Batched(
          CUBLAS_OP_T, CUBLAS_OP_N, V, nd, C, L.w_kv_b.as<uint16_t>() + static_cast<size_t>(N) * C,
          C, static_cast<int64_t>(NV) * C,
          s.out_latent.as<uint16_t>() + static_cast<size_t>(d0) * H * C, H * C, C,
          s.attn.as<uint16_t>() + static_cast<size_t>(d0) * H * V, CUDA_R_16BF, H * V, V, H));
    }
    if (any_prefill_) {
      MlaPrefillParams pp;
      pp.q = q;
      pp.q_stride = q_stride;
      pp.w_kv_b = L.w_kv_b.ptr;
      pp.nope_dim = N;
      pp.v_dim = V;
      pp.out = s.attn.ptr;
      pp.cache = L.cache;
      pp.cache_scale = L.cache_scale;
      pp.softmax_scale = softmax_scale;
      LLM_RETURN_IF_ERROR(mla_->RunMlaPrefill(pp));  // the prefill rows of s.attn
    }
    LLM_RETURN_IF_ERROR(L.wo.Apply(*ops_, s.attn.ptr, T, s.tmp.ptr, fp8));
    LLM_RETURN_IF_ERROR(AllReduce(s.tmp.ptr, T));
    cuda::RmsNormArgs na;
    na.residual = step.residual;
    na.delta = s.tmp.ptr;
    na.weight = L.mlp_norm.ptr;
    na.num_rows = T;
    na.hidden = Hd;
    na.eps = c.rms_norm_eps;
    na.out = xn;
    na.out_f32 = L.moe ? s.moe.x_f32.as<float>() : nullptr;  // the router's fp32 input
    cuda::LaunchAddRmsNorm(na, stream);
    if (L.moe) {
      const CudaMoeLayer::Trace trace{routing_trace_, l, step.batch->positions.data()};
      LLM_RETURN_IF_ERROR(moe_.Run(*ops_, L.experts, xn, T, &s.moe, s.tmp.ptr, trace));
    } else {
      LLM_RETURN_IF_ERROR(L.dense.Run(*ops_, xn, T, s.tmp.ptr, s.gate_up.ptr, s.act.ptr, fp8));
    }
    LLM_RETURN_IF_ERROR(AllReduce(s.tmp.ptr, T));
  }
  return CudaLayersOut{s.tmp.ptr, nullptr};
}

}  // namespace

std::unique_ptr<CudaDecoder> NewCudaDeepseekDecoder(const DeepseekConfig& config) {
  return std::make_unique<CudaDeepseekDecoder>(config, 0, config.base.num_layers);
}

std::unique_ptr<CudaDecoder> NewCudaDeepseekLayers(const DeepseekConfig& config, int first_layer,
                                                   int num_layers) {
  return std::make_unique<CudaDeepseekDecoder>(config, first_layer, num_layers);
}

StatusOr<std::unique_ptr<Model>> CreateCudaDeepseekModel(const DeepseekConfig& config,
                                                         const WeightStore* weights,
                                                         const ModelLoadOptions& options) {
  return CreateCudaModel(NewCudaDeepseekDecoder(config), weights, options);
}

}  // namespace llm
