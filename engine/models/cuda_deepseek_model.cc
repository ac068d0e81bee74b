#include "engine/models/cuda_deepseek_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <spdlog/spdlog.h>

#include "engine/base/dtype.h"
#include "engine/models/cuda_llama_model.h"
#include "engine/models/cuda_logits_readback.h"
#include "engine/models/cuda_weights.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_mla_attention.h"
#include "kernels/cuda/cuda_c8_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_mla_backend.h"
#include "kernels/cuda/deepseek_ops.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/sampling.h"

namespace llm {
namespace {

// HF DeepSeek's q_a_layernorm / kv_a_layernorm use the RMSNorm default eps (as the CPU model).
constexpr float kLatentNormEps = 1e-6f;
// Bound on the materialized prefill scores (fp32) + probabilities (bf16) of one query tile.
constexpr size_t kPrefillScoreBytes = 256ull << 20;

struct Mlp {
  int inter = 0;           // 0: absent
  DeviceBuffer w_gate_up;  // bf16 [2 * inter, hidden] (gate, up stacked)
  DeviceBuffer w_down;     // bf16 [hidden, inter]
};

struct Layer {
  DeviceBuffer attn_norm, mlp_norm;  // bf16 [hidden]
  DeviceBuffer w_a;                  // bf16 [QA + C + R, hidden]: q_a_proj or q_proj, kv_a_proj
  DeviceBuffer q_a_norm;             // bf16 [q_lora_rank] (q LoRA only)
  DeviceBuffer w_q_b;                // bf16 [H * QK, q_lora_rank] (q LoRA only)
  DeviceBuffer kv_a_norm;            // bf16 [C]
  DeviceBuffer w_kv_b;               // bf16 [H * (N + V), C]: per head W_UK [N, C] then W_UV [V, C]
  DeviceBuffer wo;                   // bf16 [hidden, H * V]
  float cache_scale = 1.0f;          // fp8 latent cache dequant scale
  bool moe = false;
  Mlp dense, shared;
  DeviceBuffer router;          // bf16 [E, hidden]
  DeviceBuffer router_bias;     // fp32 [E] (noaux_tc) or empty
  DeviceBuffer expert_gate_up;  // bf16 [E, 2 * I, hidden]
  DeviceBuffer expert_down;     // bf16 [E, hidden, I]
  DeviceBuffer cache;           // [num_blocks, block_size, C + R] bf16 or fp8 bytes
};

class CudaDeepseekModel final : public Model {
 public:
  explicit CudaDeepseekModel(const DeepseekConfig& config) : d_(config) {}
  ~CudaDeepseekModel() override {
    if (pinned_) cudaFreeHost(pinned_);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const WeightStore* weights, const ModelLoadOptions& options);
  const ModelConfig& config() const override { return d_.base; }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override {
    std::vector<int32_t> unused;
    ForwardBatch full = batch;
    full.device_sampled.clear();
    return ForwardSampled(full, logits, &unused);
  }
  Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                        std::vector<int32_t>* tokens) override;
  bool samples_on_device() const override { return true; }
  std::string attention_backend_name() const override { return mla_->name(); }
  std::string kv_cache_dtype_name() const override { return DTypeName(cache_dtype_); }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t kv_bytes_per_block() const override { return mla_->BlockBytes() * d_.base.num_layers; }
  // Records the top-k ids RunMoe already copies to the host (no margin: NaN).
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    routing_trace_ = trace;
    return true;
  }

 private:
  Status Gemm(const void* x, const void* w, int m, int n, int k, void* y,
              cudaDataType out_type = CUDA_R_16BF, float beta = 0.0f) {
    return GemmBf16(blas_, x, w, m, n, k, y, out_type, beta);
  }
  // Column-major strided-batched GEMM, bf16 A and B, fp32 accumulation.
  Status Batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
                 int lda, int64_t sa, const void* b, int ldb, int64_t sb, void* c,
                 cudaDataType c_type, int ldc, int64_t sc, int batch, float beta = 0.0f);
  Status RunMlp(const Mlp& m, const void* x, int rows, void* out);
  // MoE of layer `layer` over xn_ [T, hidden] into tmp_; positions[T] for the routing trace.
  Status RunMoe(const Layer& L, int layer, int T, const std::vector<int32_t>& positions);
  // ModelLoadOptions::mla_kernel onto the cuda_mla backend, logged.
  Status SelectMlaKernel(const std::string& option);
  // Expanded-heads causal attention of one prefill sequence into its rows of attn_.
  Status PrefillAttention(const Layer& L, const AttentionBatch& batch, int seq,
                          const int32_t* d_pages, const uint16_t* q_all, int q_stride);
  Status SampleTail(const ForwardBatch& batch, int T, const int32_t* d_rows,
                    std::vector<float>* logits, std::vector<int32_t>* tokens);

  DeepseekConfig d_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<MlaAttentionBackend> mla_;
  DType cache_dtype_ = DType::kBF16;
  int block_size_ = 64;
  int num_blocks_ = 0;
  float rope_mscale_ = 1.0f;
  DeviceBuffer embed_, lm_head_, final_norm_, inv_freq_;
  std::vector<std::unique_ptr<Layer>> layers_;

  // Step scratch, grown on demand.
  DeviceBuffer ints_, residual_, xn_, a_, qa_, q_, latent_, q_pe_, q_latent_, out_latent_, attn_,
      tmp_, gate_up_, act_, last_, logits_;
  DeviceBuffer lat_, kvx_, scores_, probs_;  // prefill
  DeviceBuffer router_logits_, topk_ids_, topk_w_, moe_ints_, xg_, ge_, ae_, ye_,
      shared_out_;  // MoE
  CudaLogitsReadback readback_;
  std::vector<int32_t> host_ints_;
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
  void* pinned_ = nullptr;                                    // MoE routing copies
  size_t pinned_bytes_ = 0;
  Status Pinned(size_t bytes) {
    if (bytes <= pinned_bytes_) return Status::Ok();
    GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // no copy may still use the old one
    if (pinned_) GPU_RETURN_IF_ERROR(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    GPU_RETURN_IF_ERROR(cudaMallocHost(&pinned_, bytes));
    pinned_bytes_ = bytes;
    return Status::Ok();
  }
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

Status CudaDeepseekModel::Init(const WeightStore* w, const ModelLoadOptions& options) {
  const ModelConfig& c = d_.base;
  GPU_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  BLAS_RETURN_IF_ERROR(cublasCreate(&blas_));
  BLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream_));
  if (d_.n_routed_experts > cuda::kMoeMaxExperts || d_.n_group > 64) {
    return Unimplemented("DeepSeek on CUDA supports at most " +
                         std::to_string(cuda::kMoeMaxExperts) + " routed experts and 64 groups");
  }

  // Backend first: an unsupported shape (the kernel is built for kv_lora_rank 512 + rope 64)
  // fails before any weight is loaded.
  LLM_ASSIGN_OR_RETURN(cache_dtype_, GpuCacheDType(d_, options));
  int dev = 0, major = 0, minor = 0;
  GPU_RETURN_IF_ERROR(cudaGetDevice(&dev));
  GPU_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GPU_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  AttentionSpec spec;
  spec.device = DeviceKind::kCuda;
  spec.device_arch = major * 10 + minor;
  spec.kind = AttentionKind::kMla;
  spec.kv_dtype = cache_dtype_;
  spec.num_q_heads = c.num_q_heads;
  spec.num_kv_heads = 1;
  spec.head_dim = d_.latent_dim();
  spec.mla_rope_dim = d_.qk_rope_head_dim;
  spec.block_size = options.block_size;
  spec.features = kFeatureCausal;
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec, options.attention_backend, &table);
  spdlog::info("{}", table);
  if (!backend.ok()) return backend.status();
  auto* mla = dynamic_cast<MlaAttentionBackend*>(backend.value().get());
  auto* streamed = dynamic_cast<cuda::CudaAttentionBackend*>(backend.value().get());
  if (mla == nullptr || streamed == nullptr) {
    return Internal("backend '" + backend.value()->name() + "' is not a CUDA MlaAttentionBackend");
  }
  backend.value().release();
  mla_.reset(mla);
  streamed->set_stream(stream_);
  LLM_RETURN_IF_ERROR(SelectMlaKernel(options.mla_kernel));
  block_size_ = options.block_size;

  Bf16WeightLoader loader(w, stream_);
  const int64_t h = c.hidden_size, H = c.num_q_heads, vocab = c.vocab_size;
  const int64_t QK = d_.qk_head_dim(), C = d_.kv_lora_rank, Lw = d_.latent_dim();
  const int64_t NV = d_.qk_nope_head_dim + d_.v_head_dim, V = d_.v_head_dim;
  const float wstd = 0.02f;
  auto load = [&](const std::string& name, std::vector<int64_t> shape, float mean, float std,
                  DeviceBuffer* out) { return loader.Load({name}, {shape}, mean, std, out); };
  LLM_RETURN_IF_ERROR(load("model.embed_tokens.weight", {vocab, h}, 0, 1.0f, &embed_));
  LLM_RETURN_IF_ERROR(load("model.norm.weight", {h}, 1.0f, 0.1f, &final_norm_));
  if (!c.tie_word_embeddings) {
    LLM_RETURN_IF_ERROR(load("lm_head.weight", {vocab, h}, 0, wstd, &lm_head_));
  }
  auto load_mlp = [&](const std::string& p, int64_t inter, Mlp* m) -> Status {
    m->inter = static_cast<int>(inter);
    LLM_RETURN_IF_ERROR(loader.Load({p + "gate_proj.weight", p + "up_proj.weight"},
                                    {{inter, h}, {inter, h}}, 0, wstd, &m->w_gate_up));
    return load(p + "down_proj.weight", {h, inter}, 0, wstd, &m->w_down);
  };
  const size_t cache_bytes_per_block = mla_->BlockBytes();
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    auto L = std::make_unique<Layer>();
    LLM_RETURN_IF_ERROR(load(p + "input_layernorm.weight", {h}, 1, 0.1f, &L->attn_norm));
    LLM_RETURN_IF_ERROR(load(p + "post_attention_layernorm.weight", {h}, 1, 0.1f, &L->mlp_norm));
    if (d_.q_lora_rank > 0) {
      const int64_t QL = d_.q_lora_rank;
      LLM_RETURN_IF_ERROR(loader.Load({a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"},
                                      {{QL, h}, {Lw, h}}, 0, wstd, &L->w_a));
      LLM_RETURN_IF_ERROR(load(a + "q_a_layernorm.weight", {QL}, 1, 0.1f, &L->q_a_norm));
      LLM_RETURN_IF_ERROR(load(a + "q_b_proj.weight", {H * QK, QL}, 0, wstd, &L->w_q_b));
    } else {
      LLM_RETURN_IF_ERROR(loader.Load({a + "q_proj.weight", a + "kv_a_proj_with_mqa.weight"},
                                      {{H * QK, h}, {Lw, h}}, 0, wstd, &L->w_a));
    }
    LLM_RETURN_IF_ERROR(load(a + "kv_a_layernorm.weight", {C}, 1, 0.1f, &L->kv_a_norm));
    LLM_RETURN_IF_ERROR(load(a + "kv_b_proj.weight", {H * NV, C}, 0, wstd, &L->w_kv_b));
    LLM_RETURN_IF_ERROR(load(a + "o_proj.weight", {h, H * V}, 0, wstd, &L->wo));
    L->cache_scale = d_.mla_cache_scale;
    if (w != nullptr && w->Has(a + "kv_scale")) {
      std::vector<float> s;
      LLM_RETURN_IF_ERROR(w->ReadF32(a + "kv_scale", {}, &s));
      if (s.size() != 1 || !(s[0] > 0.0f) || !std::isfinite(s[0])) {
        return InvalidArgument("tensor '" + a + "kv_scale' must be one positive finite float");
      }
      L->cache_scale = s[0];
    }
    L->moe = d_.IsMoeLayer(l);
    if (!L->moe) {
      LLM_RETURN_IF_ERROR(load_mlp(p + "mlp.", c.intermediate_size, &L->dense));
    } else {
      const int64_t E = d_.n_routed_experts, I = d_.moe_intermediate_size;
      LLM_RETURN_IF_ERROR(load(p + "mlp.gate.weight", {E, h}, 0, wstd, &L->router));
      if (d_.topk_method == DeepseekConfig::TopkMethod::kNoauxTc) {
        std::vector<float> bias(E, 0.0f);  // dummy weights: no correction
        if (w != nullptr) {
          LLM_RETURN_IF_ERROR(w->ReadF32(p + "mlp.gate.e_score_correction_bias", {E}, &bias));
        }
        LLM_RETURN_IF_ERROR(L->router_bias.Alloc(E * 4));
        GPU_RETURN_IF_ERROR(
            cudaMemcpy(L->router_bias.ptr, bias.data(), E * 4, cudaMemcpyHostToDevice));
      }
      std::vector<std::string> gu_names, down_names;
      std::vector<std::vector<int64_t>> gu_shapes, down_shapes;
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        gu_names.insert(gu_names.end(), {ep + "gate_proj.weight", ep + "up_proj.weight"});
        gu_shapes.insert(gu_shapes.end(), {{I, h}, {I, h}});
        down_names.push_back(ep + "down_proj.weight");
        down_shapes.push_back({h, I});
      }
      LLM_RETURN_IF_ERROR(loader.Load(gu_names, gu_shapes, 0, wstd, &L->expert_gate_up));
      LLM_RETURN_IF_ERROR(loader.Load(down_names, down_shapes, 0, wstd, &L->expert_down));
      if (d_.n_shared_experts > 0) {
        LLM_RETURN_IF_ERROR(
            load_mlp(p + "mlp.shared_experts.", I * d_.n_shared_experts, &L->shared));
      }
    }
    layers_.push_back(std::move(L));
  }

  const std::vector<float> inv = d_.RopeInvFreq();
  rope_mscale_ = d_.RopeMscale();
  LLM_RETURN_IF_ERROR(inv_freq_.Alloc(inv.size() * 4));
  GPU_RETURN_IF_ERROR(
      cudaMemcpy(inv_freq_.ptr, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));

  // Latent pool: an explicit block count, or a fraction of the memory left after the weights.
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const size_t per_block = cache_bytes_per_block * c.num_layers;
  if (options.num_kv_blocks > 0) {
    num_blocks_ = options.num_kv_blocks;
  } else {
    size_t free_bytes = 0, total = 0;
    GPU_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
    num_blocks_ =
        static_cast<int>(static_cast<double>(free_bytes) * options.gpu_memory_fraction / per_block);
  }
  if (num_blocks_ < 1) return ResourceExhausted("no GPU memory left for a single latent block");
  for (auto& L : layers_) {
    LLM_RETURN_IF_ERROR(L->cache.Alloc(cache_bytes_per_block * num_blocks_));
  }
  spdlog::info(
      "cuda deepseek: {} layers ({} MoE) on sm_{}, {} weights, latent cache {} x {} blocks "
      "({:.1f} GiB)",
      c.num_layers, std::count_if(layers_.begin(), layers_.end(), [](auto& L) { return L->moe; }),
      spec.device_arch, loader.dummy() ? "DUMMY (random)" : "checkpoint", DTypeName(cache_dtype_),
      num_blocks_, static_cast<double>(per_block) * num_blocks_ / (1ull << 30));
  return Status::Ok();
}

Status CudaDeepseekModel::Batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const void* a, int lda, int64_t sa, const void* b, int ldb,
                                  int64_t sb, void* c, cudaDataType c_type, int ldc, int64_t sc,
                                  int batch, float beta) {
  const float alpha = 1.0f;
  BLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
      blas_, ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, sa, b, CUDA_R_16BF, ldb, sb, &beta, c,
      c_type, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

Status CudaDeepseekModel::RunMlp(const Mlp& m, const void* x, int rows, void* out) {
  const int Hd = d_.base.hidden_size, I = m.inter;
  LLM_RETURN_IF_ERROR(gate_up_.Alloc(static_cast<size_t>(rows) * 2 * I * 2));
  LLM_RETURN_IF_ERROR(act_.Alloc(static_cast<size_t>(rows) * I * 2));
  LLM_RETURN_IF_ERROR(Gemm(x, m.w_gate_up.ptr, rows, 2 * I, Hd, gate_up_.ptr));
  cuda::LaunchSiluMul(gate_up_.ptr, rows, I, act_.ptr, stream_);
  return Gemm(act_.ptr, m.w_down.ptr, rows, Hd, I, out);
}

Status CudaDeepseekModel::SelectMlaKernel(const std::string& option) {
  LLM_RETURN_IF_ERROR(CheckChoice("mla_kernel", option, kMlaKernelChoices));
  const cuda::MlaKernel kernel = option == "wgmma"      ? cuda::MlaKernel::kWgmma
                                 : option == "portable" ? cuda::MlaKernel::kPortable
                                                        : cuda::MlaKernel::kAuto;
  auto* sw = dynamic_cast<cuda::MlaKernelSwitch*>(mla_.get());
  if (sw == nullptr) {
    if (kernel == cuda::MlaKernel::kAuto) return Status::Ok();
    return InvalidArgument("mla_kernel " + option + ": backend '" + mla_->name() +
                           "' has no MLA kernel choice");
  }
  LLM_RETURN_IF_ERROR(sw->SetMlaKernel(kernel));
  static_assert(cuda::kMlaNumRowVariants == 3 && cuda::kMlaVariantRows[0] == 16 &&
                cuda::kMlaVariantRows[1] == 32 && cuda::kMlaVariantRows[2] == 64);
  auto on = [sw](int variant) {
    return !sw->uses_wgmma(variant)   ? "portable"
           : sw->uses_seesaw(variant) ? "wgmma (seesaw)"
                                      : "wgmma";
  };
  spdlog::info("cuda_mla kernel: mla_kernel={} -> 16-row items on {}, 32-row on {}, 64-row on {}",
               option, on(0), on(1), on(2));
  return Status::Ok();
}

Status CudaDeepseekModel::RunMoe(const Layer& L, int layer, int T,
                                 const std::vector<int32_t>& positions) {
  using Method = DeepseekConfig::TopkMethod;
  const int Hd = d_.base.hidden_size, E = d_.n_routed_experts, K = d_.num_experts_per_tok;
  const int I = d_.moe_intermediate_size, S = T * K;  // S: (token, expert) slots
  LLM_RETURN_IF_ERROR(router_logits_.Alloc(static_cast<size_t>(T) * E * 4));
  LLM_RETURN_IF_ERROR(topk_ids_.Alloc(static_cast<size_t>(S) * 4));
  LLM_RETURN_IF_ERROR(topk_w_.Alloc(static_cast<size_t>(S) * 4));
  LLM_RETURN_IF_ERROR(moe_ints_.Alloc(static_cast<size_t>(S) * 2 * 4));
  LLM_RETURN_IF_ERROR(xg_.Alloc(static_cast<size_t>(S) * Hd * 2));
  LLM_RETURN_IF_ERROR(ge_.Alloc(static_cast<size_t>(S) * 2 * I * 2));
  LLM_RETURN_IF_ERROR(ae_.Alloc(static_cast<size_t>(S) * I * 2));
  LLM_RETURN_IF_ERROR(ye_.Alloc(static_cast<size_t>(S) * Hd * 2));
  LLM_RETURN_IF_ERROR(Pinned(static_cast<size_t>(S) * 3 * 4));

  // Router logits in fp32 (the routing decisions are the sensitive part), then top-k on device.
  LLM_RETURN_IF_ERROR(Gemm(xn_.ptr, L.router.ptr, T, E, Hd, router_logits_.ptr, CUDA_R_32F));
  cuda::MoeRoutingArgs ra;
  ra.logits = router_logits_.as<float>();
  ra.bias = L.router_bias.ptr ? L.router_bias.as<float>() : nullptr;
  ra.num_tokens = T;
  ra.num_experts = E;
  ra.top_k = K;
  ra.sigmoid = d_.scoring == DeepseekConfig::Scoring::kSigmoid;
  ra.method = d_.topk_method == Method::kGreedy               ? 0
              : d_.topk_method == Method::kGroupLimitedGreedy ? 1
                                                              : 2;
  ra.n_group = d_.n_group;
  ra.topk_group = d_.topk_group;
  ra.normalize = K > 1 && d_.norm_topk_prob;
  ra.scale_after_norm = d_.is_v3();
  ra.routed_scaling_factor = d_.routed_scaling_factor;
  ra.topk_ids = topk_ids_.as<int32_t>();
  ra.topk_w = topk_w_.as<float>();
  cuda::LaunchMoeRouting(ra, stream_);

  // Grouping by expert on the host: cuBLAS takes each expert's row count from the host, so one
  // S-int copy back is needed anyway; a device prefix sum would only move that sync (a grouped
  // GEMM with device-side sizes is the follow-up). One sync per MoE layer.
  auto* h_ids = static_cast<int32_t*>(pinned_);
  GPU_RETURN_IF_ERROR(
      cudaMemcpyAsync(h_ids, topk_ids_.ptr, S * 4, cudaMemcpyDeviceToHost, stream_));
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::vector<int32_t> offsets(E + 1, 0);
  for (int i = 0; i < S; ++i) {
    if (h_ids[i] < 0 || h_ids[i] >= E) return Internal("MoE routing produced an invalid expert");
    ++offsets[h_ids[i] + 1];
  }
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  if (routing_trace_ != nullptr) {  // h_ids holds each token's K experts, best first
    for (int r = 0; r < T; ++r) {
      MoeRoutingDecision& rec = routing_trace_->emplace_back();
      rec.row = r;
      rec.position = positions[r];
      rec.layer = layer;
      rec.experts.assign(h_ids + static_cast<size_t>(r) * K,
                         h_ids + static_cast<size_t>(r + 1) * K);
      std::sort(rec.experts.begin(), rec.experts.end());
    }
  }
  int32_t* h_rows = h_ids + S;   // [S] token of each expert-ordered slot
  int32_t* h_slot = h_rows + S;  // [S] slot of each (token, k)
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  for (int i = 0; i < S; ++i) {  // token order within an expert, as the CPU model
    const int s = fill[h_ids[i]]++;
    h_rows[s] = i / K;
    h_slot[i] = s;
  }
  GPU_RETURN_IF_ERROR(
      cudaMemcpyAsync(moe_ints_.ptr, h_rows, 2 * S * 4, cudaMemcpyHostToDevice, stream_));
  const int32_t* d_rows = moe_ints_.as<int32_t>();
  const int32_t* d_slot = d_rows + S;
  cuda::LaunchGatherRows(xn_.ptr, d_rows, S, Hd, xg_.ptr, stream_);
  const size_t gu_elems = static_cast<size_t>(2) * I * Hd, down_elems = static_cast<size_t>(Hd) * I;
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    LLM_RETURN_IF_ERROR(Gemm(xg_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * Hd,
                             L.expert_gate_up.as<uint16_t>() + e * gu_elems, n, 2 * I, Hd,
                             ge_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * 2 * I));
  }
  cuda::LaunchSiluMul(ge_.ptr, S, I, ae_.ptr, stream_);
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    LLM_RETURN_IF_ERROR(Gemm(ae_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * I,
                             L.expert_down.as<uint16_t>() + e * down_elems, n, Hd, I,
                             ye_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * Hd));
  }
  const void* shared = nullptr;
  if (L.shared.inter > 0) {
    LLM_RETURN_IF_ERROR(shared_out_.Alloc(static_cast<size_t>(T) * Hd * 2));
    LLM_RETURN_IF_ERROR(RunMlp(L.shared, xn_.ptr, T, shared_out_.ptr));
    shared = shared_out_.ptr;
  }
  cuda::LaunchMoeCombine(ye_.ptr, d_slot, topk_w_.as<float>(), shared, T, K, Hd, tmp_.ptr, stream_);
  return Status::Ok();
}

Status CudaDeepseekModel::PrefillAttention(const Layer& L, const AttentionBatch& batch, int seq,
                                           const int32_t* d_pages, const uint16_t* q_all,
                                           int q_stride) {
  const int H = d_.base.num_q_heads, N = d_.qk_nope_head_dim, R = d_.qk_rope_head_dim;
  const int V = d_.v_head_dim, C = d_.kv_lora_rank, Lw = d_.latent_dim(), NV = N + V;
  const int qb = batch.q_indptr[seq], Tq = batch.q_indptr[seq + 1] - qb;
  const int kv_len = batch.kv_lens[seq];
  LLM_RETURN_IF_ERROR(lat_.Alloc(static_cast<size_t>(kv_len) * Lw * 2));
  LLM_RETURN_IF_ERROR(kvx_.Alloc(static_cast<size_t>(kv_len) * H * NV * 2));
  // lat [kv_len, C + R]: the sequence's latents, this step's included (RunMla appended them).
  cuda::LaunchGatherLatents(L.cache.ptr, cache_dtype_ == DType::kFp8E4M3, L.cache_scale,
                            d_pages + batch.page_indptr[seq], block_size_, Lw, kv_len, lat_.ptr,
                            stream_);
  // kvx [kv_len, H, N + V]: per head k_nope then v = c @ kv_b_proj^T (lda Lw skips k_pe).
  const float one = 1.0f, zero = 0.0f;
  BLAS_RETURN_IF_ERROR(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, H * NV, kv_len, C, &one,
                                    L.w_kv_b.ptr, CUDA_R_16BF, C, lat_.ptr, CUDA_R_16BF, Lw, &zero,
                                    kvx_.ptr, CUDA_R_16BF, H * NV, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  const auto* kvx = kvx_.as<uint16_t>();
  const auto* lat = lat_.as<uint16_t>();
  const int tile = static_cast<int>(std::clamp<size_t>(
      kPrefillScoreBytes / (static_cast<size_t>(H) * kv_len * 6), 1, static_cast<size_t>(Tq)));
  for (int i0 = 0; i0 < Tq; i0 += tile) {
    const int tq = std::min(tile, Tq - i0);
    const int first_pos = kv_len - Tq + i0;  // position of the tile's first query row
    const int kv = first_pos + tq;           // keys the tile can see
    LLM_RETURN_IF_ERROR(scores_.Alloc(static_cast<size_t>(H) * tq * kv * 4));
    LLM_RETURN_IF_ERROR(probs_.Alloc(static_cast<size_t>(H) * tq * kv * 2));
    const uint16_t* q = q_all + static_cast<size_t>(qb + i0) * q_stride;
    // scores[h] [tq, kv] = q_nope_h . k_nope_h^T + q_pe_h . k_pe^T (k_pe shared: stride 0).
    LLM_RETURN_IF_ERROR(Batched(CUBLAS_OP_T, CUBLAS_OP_N, kv, tq, N, kvx, H * NV, NV, q, q_stride,
                                N + R, scores_.ptr, CUDA_R_32F, kv, static_cast<int64_t>(tq) * kv,
                                H));
    LLM_RETURN_IF_ERROR(Batched(CUBLAS_OP_T, CUBLAS_OP_N, kv, tq, R, lat + C, Lw, 0, q + N,
                                q_stride, N + R, scores_.ptr, CUDA_R_32F, kv,
                                static_cast<int64_t>(tq) * kv, H, 1.0f));
    cuda::LaunchCausalSoftmax(scores_.as<float>(), H, tq, kv, first_pos, d_.SoftmaxScale(),
                              probs_.ptr, stream_);
    // attn[t, h, :] [tq, V] = p_h [tq, kv] @ v_h [kv, V].
    LLM_RETURN_IF_ERROR(Batched(CUBLAS_OP_N, CUBLAS_OP_N, V, tq, kv, kvx + N, H * NV, NV,
                                probs_.ptr, kv, static_cast<int64_t>(tq) * kv,
                                attn_.as<uint16_t>() + static_cast<size_t>(qb + i0) * H * V,
                                CUDA_R_16BF, H * V, V, H));
  }
  return Status::Ok();
}

Status CudaDeepseekModel::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                         std::vector<int32_t>* tokens) {
  const ModelConfig& c = d_.base;
  const int T = static_cast<int>(batch.token_ids.size());
  const int R = static_cast<int>(batch.logit_rows.size());
  const int Hd = c.hidden_size, H = c.num_q_heads, N = d_.qk_nope_head_dim;
  const int Rd = d_.qk_rope_head_dim, V = d_.v_head_dim, C = d_.kv_lora_rank;
  const int Lw = d_.latent_dim(), QK = N + Rd, NV = N + V;
  const int QA = d_.q_lora_rank > 0 ? d_.q_lora_rank : H * QK;
  const int A = QA + Lw;
  const int q_stride = d_.q_lora_rank > 0 ? H * QK : A;  // q lives inside a_ without q LoRA
  for (int32_t id : batch.token_ids) {
    if (id < 0 || id >= c.vocab_size) return InvalidArgument("token id out of range");
  }
  LLM_CHECK_EQ(batch.attn.num_tokens, T);
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, block_size_, num_blocks_));
  // One upload: ids, positions, logit rows, page indices.
  host_ints_.assign(batch.token_ids.begin(), batch.token_ids.end());
  host_ints_.insert(host_ints_.end(), batch.positions.begin(), batch.positions.end());
  host_ints_.insert(host_ints_.end(), batch.logit_rows.begin(), batch.logit_rows.end());
  host_ints_.insert(host_ints_.end(), batch.attn.page_indices.begin(),
                    batch.attn.page_indices.end());
  LLM_RETURN_IF_ERROR(ints_.Alloc(std::max<size_t>(host_ints_.size() * 4, 64)));
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(ints_.ptr, host_ints_.data(), host_ints_.size() * 4,
                                      cudaMemcpyHostToDevice, stream_));
  const int32_t* d_ids = ints_.as<int32_t>();
  const int32_t* d_pos = d_ids + T;
  const int32_t* d_rows = d_pos + T;
  const int32_t* d_pages = d_rows + R;

  // Decode sequences attend through the backend; the others (prefill chunks) are expanded here.
  const std::vector<int32_t> decode_seqs = MlaDecodeSeqs(batch.attn);
  std::vector<char> is_decode(batch.attn.num_seqs, 0);
  int d0 = T, d1 = 0;  // decode rows lie in [d0, d1) (rows of other sequences in between are
                       // computed and then overwritten by the prefill path)
  for (int32_t s : decode_seqs) {
    is_decode[s] = 1;
    d0 = std::min(d0, batch.attn.q_indptr[s]);
    d1 = std::max(d1, batch.attn.q_indptr[s + 1]);
  }
  const int nd = std::max(0, d1 - d0);

  const size_t t = static_cast<size_t>(T);
  LLM_RETURN_IF_ERROR(residual_.Alloc(t * Hd * 4));
  LLM_RETURN_IF_ERROR(xn_.Alloc(t * Hd * 2));
  LLM_RETURN_IF_ERROR(a_.Alloc(t * A * 2));
  if (d_.q_lora_rank > 0) {
    LLM_RETURN_IF_ERROR(qa_.Alloc(t * d_.q_lora_rank * 2));
    LLM_RETURN_IF_ERROR(q_.Alloc(t * H * QK * 2));
  }
  LLM_RETURN_IF_ERROR(latent_.Alloc(t * Lw * 2));
  LLM_RETURN_IF_ERROR(q_pe_.Alloc(t * H * Rd * 2));
  LLM_RETURN_IF_ERROR(q_latent_.Alloc(std::max<size_t>(t * H * C * 2, 64)));
  LLM_RETURN_IF_ERROR(out_latent_.Alloc(std::max<size_t>(t * H * C * 2, 64)));
  LLM_RETURN_IF_ERROR(attn_.Alloc(t * H * V * 2));
  LLM_RETURN_IF_ERROR(tmp_.Alloc(t * Hd * 2));
  LLM_RETURN_IF_ERROR(mla_->Plan(batch.attn));

  cuda::LaunchEmbedding(embed_.ptr, d_ids, T, Hd, residual_.as<float>(), stream_);
  const float softmax_scale = d_.SoftmaxScale();
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = *layers_[l];
    cuda::LaunchAddRmsNorm(residual_.as<float>(), l == 0 ? nullptr : tmp_.ptr, L.attn_norm.ptr,
                           nullptr, T, Hd, c.rms_norm_eps, xn_.ptr, stream_);
    // a [T, QA + C + R] = xn @ w_a^T.
    LLM_RETURN_IF_ERROR(Gemm(xn_.ptr, L.w_a.ptr, T, A, Hd, a_.ptr));
    auto* a = a_.as<uint16_t>();
    uint16_t* q = a;  // [T, H, QK] with row stride q_stride
    if (d_.q_lora_rank > 0) {
      cuda::LaunchRmsNormStrided(a, A, L.q_a_norm.ptr, T, QA, kLatentNormEps, qa_.ptr, QA, stream_);
      LLM_RETURN_IF_ERROR(Gemm(qa_.ptr, L.w_q_b.ptr, T, H * QK, QA, q_.ptr));
      q = q_.as<uint16_t>();
    }
    // latent [T, C + R] = RMSNorm(c_kv) ++ rope(k_pe).
    auto* latent = latent_.as<uint16_t>();
    cuda::LaunchRmsNormStrided(a + QA, A, L.kv_a_norm.ptr, T, C, kLatentNormEps, latent, Lw,
                               stream_);
    cuda::DeepseekRopeArgs ra;
    ra.positions = d_pos;
    ra.inv_freq = inv_freq_.as<float>();
    ra.mscale = rope_mscale_;
    ra.num_tokens = T;
    ra.rope_dim = Rd;
    ra.in = a + QA + C;
    ra.in_row = A;
    ra.out = latent + C;
    ra.out_row = Lw;
    ra.num_heads = 1;
    cuda::LaunchDeepseekRope(ra, stream_);
    // q_pe [T, H, R] for the backend (out of place), then q's own rope part in place for the
    // prefill path, in that order: the first reads the unroped values.
    ra.in = q + N;
    ra.in_row = q_stride;
    ra.in_head = QK;
    ra.out = q_pe_.ptr;
    ra.out_row = static_cast<int64_t>(H) * Rd;
    ra.out_head = Rd;
    ra.num_heads = H;
    cuda::LaunchDeepseekRope(ra, stream_);
    const bool any_prefill = static_cast<int>(decode_seqs.size()) < batch.attn.num_seqs;
    if (any_prefill) {
      ra.out = q + N;
      ra.out_row = q_stride;
      ra.out_head = QK;
      cuda::LaunchDeepseekRope(ra, stream_);
    }
    // Absorbed decode: q_latent[t, h] [C] = q_nope[t, h] [N] @ W_UK_h [N, C].
    if (nd > 0) {
      LLM_RETURN_IF_ERROR(Batched(
          CUBLAS_OP_N, CUBLAS_OP_N, C, nd, N, L.w_kv_b.ptr, C, static_cast<int64_t>(NV) * C,
          q + static_cast<size_t>(d0) * q_stride, q_stride, QK,
          q_latent_.as<uint16_t>() + static_cast<size_t>(d0) * H * C, CUDA_R_16BF, H * C, C, H));
    }
    MlaParams mp;
    mp.q_latent = q_latent_.ptr;
    mp.q_pe = q_pe_.ptr;
    mp.latent_new = latent;
    mp.out_latent = out_latent_.ptr;
    mp.cache = L.cache.ptr;
    mp.cache_scale = L.cache_scale;
    mp.softmax_scale = softmax_scale;
    mla_->RunMla(mp);  // appends every row's latent, attends the decode rows
    if (nd > 0) {
      // attn[t, h] [V] = W_UV_h [V, C] @ out_latent[t, h] [C].
      LLM_RETURN_IF_ERROR(Batched(
          CUBLAS_OP_T, CUBLAS_OP_N, V, nd, C, L.w_kv_b.as<uint16_t>() + static_cast<size_t>(N) * C,
          C, static_cast<int64_t>(NV) * C,
          out_latent_.as<uint16_t>() + static_cast<size_t>(d0) * H * C, H * C, C,
          attn_.as<uint16_t>() + static_cast<size_t>(d0) * H * V, CUDA_R_16BF, H * V, V, H));
    }
    for (int s = 0; s < batch.attn.num_seqs; ++s) {
      if (is_decode[s] || batch.attn.q_indptr[s + 1] == batch.attn.q_indptr[s]) continue;
      LLM_RETURN_IF_ERROR(PrefillAttention(L, batch.attn, s, d_pages, q, q_stride));
    }
    LLM_RETURN_IF_ERROR(Gemm(attn_.ptr, L.wo.ptr, T, Hd, H * V, tmp_.ptr));
    cuda::LaunchAddRmsNorm(residual_.as<float>(), tmp_.ptr, L.mlp_norm.ptr, nullptr, T, Hd,
                           c.rms_norm_eps, xn_.ptr, stream_);
    if (L.moe) {
      LLM_RETURN_IF_ERROR(RunMoe(L, l, T, batch.positions));
    } else {
      LLM_RETURN_IF_ERROR(RunMlp(L.dense, xn_.ptr, T, tmp_.ptr));
    }
  }
  return SampleTail(batch, T, d_rows, logits, tokens);
}

Status CudaDeepseekModel::SampleTail(const ForwardBatch& batch, int T, const int32_t* d_rows,
                                     std::vector<float>* logits, std::vector<int32_t>* tokens) {
  // As CudaLlamaModel's tail: final norm of the logit rows, LM head, then CudaLogitsReadback.
  const ModelConfig& c = d_.base;
  const int R = static_cast<int>(batch.logit_rows.size()), Hd = c.hidden_size, V = c.vocab_size;
  logits->resize(static_cast<size_t>(R) * V);
  tokens->clear();
  if (R == 0) {
    GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }
  LLM_RETURN_IF_ERROR(last_.Alloc(std::max<size_t>(static_cast<size_t>(R) * Hd * 2, 64)));
  LLM_RETURN_IF_ERROR(logits_.Alloc(static_cast<size_t>(R) * V * 4));
  // The last MLP output joins the residual, then the norm of the logit rows only.
  cuda::LaunchAddRmsNorm(residual_.as<float>(), tmp_.ptr, final_norm_.ptr, nullptr, T, Hd,
                         c.rms_norm_eps, xn_.ptr, stream_);
  cuda::LaunchAddRmsNorm(residual_.as<float>(), nullptr, final_norm_.ptr, d_rows, R, Hd,
                         c.rms_norm_eps, last_.ptr, stream_);
  const void* head = c.tie_word_embeddings ? embed_.ptr : lm_head_.ptr;
  LLM_RETURN_IF_ERROR(Gemm(last_.ptr, head, R, V, Hd, logits_.ptr, CUDA_R_32F));

  return readback_.Run(batch, logits_.as<float>(), V, stream_, logits, tokens);
}

}  // namespace

StatusOr<std::unique_ptr<Model>> CreateCudaDeepseekModel(const DeepseekConfig& config,
                                                         const WeightStore* weights,
                                                         const ModelLoadOptions& options) {
  if (!CudaAvailable()) return Unavailable("device 'cuda' requested but no CUDA device is present");
  if (weights == nullptr && !options.dummy_weights) {
    return InvalidArgument("CreateCudaDeepseekModel needs weights unless dummy_weights is set");
  }
  auto m = std::make_unique<CudaDeepseekModel>(config);
  LLM_RETURN_IF_ERROR(m->Init(weights, options));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace llm
