#include "engine/models/cuda_llama_model.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include <spdlog/spdlog.h>

#include "engine/base/dtype.h"
#include "engine/base/quant.h"
#include "engine/models/cuda_fp8_gemm.h"
#include "engine/models/cuda_logits_readback.h"
#include "engine/models/cuda_weights.h"
#include "engine/models/kv_cache_quant.h"
#include "engine/models/rope.h"
#include "kernels/backend_registry.h"
#include "kernels/cuda/c8_attention.h"
#include "kernels/cuda/cuda_c8_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_quant.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/pinned_staging.h"
#include "kernels/cuda/sampling.h"
#include "kernels/fmha/fmha_launcher.h"

namespace llm {
namespace {

struct LayerWeights {
  DeviceBuffer attn_norm, wqkv, bqkv, wo, mlp_norm, w_gate_up, w_down;  // bf16
  // fp8 weights (weight_dtype "fp8"): the four projections in e4m3 with per-tensor scales
  // [qkv, o, gate_up, down]; their bf16 buffers above are then released.
  DeviceBuffer wqkv_q, wo_q, w_gate_up_q, w_down_q, scales;
};

// The four projections of a layer, indexing LayerWeights::scales and the activations' row scales.
enum Proj { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kNumProj = 4 };
// Each fp8 weight scale sits in its own 16-byte slot: cuBLASLt rejects (NOT_SUPPORTED) scale
// pointers that are only 4-byte aligned.
constexpr int kScaleSlot = 4;  // floats

struct LayerCache {
  DeviceBuffer k, v, k_block_scales, v_block_scales;  // cache in the kv dtype; dynamic scales
  DeviceBuffer k_scale, v_scale;                      // static scales (fp32)
  // fp8 weights over a static 8-bit cache (ModelLoadOptions::fp8_static_attention_output): the
  // attention writes o_proj's e4m3 input as out * out_inv (out_inv = 448 / V bound), and
  // out_scale holds 1 / out_inv for the GEMM. out_inv 0: a per-row quantization pass instead.
  DeviceBuffer out_scale;
  float out_inv = 0.f;
};

class CudaLlamaModel final : public Model {
 public:
  explicit CudaLlamaModel(const ModelConfig& config) : config_(config) {}
  ~CudaLlamaModel() override {
    for (auto& [bucket, exec] : graphs_) cudaGraphExecDestroy(exec);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const WeightStore* weights, const ModelLoadOptions& options);
  const ModelConfig& config() const override { return config_; }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override {
    std::vector<int32_t> unused;
    ForwardBatch full = batch;
    full.device_sampled.clear();  // every row's logits
    return ForwardSampled(full, logits, &unused);
  }
  Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                        std::vector<int32_t>* tokens) override;
  bool samples_on_device() const override { return true; }
  bool supports_overlap() const override { return true; }
  Status Launch(const ForwardBatch& batch) override;
  Status Collect(std::vector<int32_t>* tokens) override;
  std::string attention_backend_name() const override { return attention_->name(); }
  std::string kv_cache_dtype_name() const override {
    std::string s = DTypeName(spec_.kv_dtype);
    if (spec_.kv_quant != KvQuant::kNone) s += std::string("/") + KvQuantName(spec_.kv_quant);
    return s;
  }
  int num_kv_blocks() const override { return num_blocks_; }
  int64_t graph_steps() const override { return graph_steps_; }
  size_t kv_bytes_per_block() const override {
    return attention_->BlockBytes() * config_.num_layers;
  }

 private:
  // y[m, n] = x[m, k] @ w[n, k]^T; bf16 in, out_type out, fp32 accumulation.
  Status Gemm(const void* x, const void* w, int m, int n, int k, void* y, cudaDataType out_type) {
    return GemmBf16(blas_, x, w, m, n, k, y, out_type);
  }
  // Quantizes a loaded bf16 projection to e4m3 (scale into scales[proj]) and frees the bf16.
  Status QuantizeWeight(DeviceBuffer* bf16, DeviceBuffer* q, LayerWeights* L, Proj proj);

  ModelConfig config_;
  bool dummy_ = false;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer embed_, lm_head_, final_norm_, inv_freq_;
  std::vector<std::unique_ptr<LayerWeights>> layers_;
  std::vector<std::unique_ptr<LayerCache>> cache_;
  std::unique_ptr<AttentionBackend> attention_;
  // Steps with a prefill chunk may attend through a second family on the same cache (16-bit:
  // cuda_fmha's prefill tiles run at about twice cuda_c8's rate); null: attention_ for all steps.
  std::unique_ptr<AttentionBackend> prefill_attention_;
  AttentionBackend* step_attention_ = nullptr;  // the one this step planned
  AttentionSpec spec_;
  int num_blocks_ = 0;
  // Activations of the layers for `tokens` rows. Eager steps grow theirs on demand; the graph set
  // is allocated once for the largest bucket, since captured graphs hold its pointers.
  struct Scratch {
    DeviceBuffer ints;  // [ids: cap][positions: cap][logit rows: cap]
    DeviceBuffer residual, xn, qkv, q, k, v, attn, tmp, gate_up, act;
    // fp8 weights: the e4m3 input of the current projection, and per projection the row scales
    // of its input [kNumProj][cap], which the projection's consumer applies to its output.
    DeviceBuffer xq, row_scales;
    int cap = 0;
    // fp8: also the quantized-activation buffer and the row scales.
    Status Reserve(const ModelConfig& c, int tokens, bool fp8, cudaStream_t stream);
    cuda::Fp8Rows Fp8In(Proj proj) const {
      return {xq.ptr, row_scales.as<float>() + static_cast<size_t>(proj) * cap};
    }
    // One upload of the batch's ids, positions and logit rows into `ints`; rows past the batch
    // (graph padding) get token 0 at position 0. Pinned staging: a pageable source may make the
    // copy wait for the stream, i.e. for the previous step, which overlapped steps must not.
    Status UploadInputs(const ForwardBatch& batch, cuda::PinnedStaging* staging,
                        cudaStream_t stream);
    const int32_t* ids() const { return ints.as<int32_t>(); }
    const int32_t* positions() const { return ints.as<int32_t>() + cap; }
    const int32_t* rows() const { return ints.as<int32_t>() + 2 * cap; }
  };
  // prefill_attention_ from the option: "auto" (cuda_fmha for a 16-bit cache whose decode
  // backend is another family), "none", or a backend name (fails if it cannot serve the spec).
  Status SelectPrefillBackend(const std::string& choice);
  // ModelLoadOptions::c8_prefill onto the backend that attends steps with a prefill chunk.
  Status SelectC8Prefill(const std::string& choice);
  // A layer projection y[T, n] = x[T, k] W^T (bf16 out). bf16 weights: cuBLAS on x. fp8
  // weights: x is ignored; the input is s.Fp8In(proj), which x's producer wrote, and y is the raw
  // product without the input's row scales (RowScales(s, proj) holds them for y's consumer).
  // x_scale: the fp8 input's scale (a device scalar); null: 1, the row scales come after.
  Status Project(Scratch& s, int layer, Proj proj, const void* x, int T, int n, int k, void* y,
                 const float* x_scale = nullptr);
  // The fp8 input of proj (what the producer of x writes), or nothing with bf16 weights.
  cuda::Fp8Rows Fp8In(const Scratch& s, Proj proj) const {
    return fp8_ ? s.Fp8In(proj) : cuda::Fp8Rows{};
  }
  // The row scales that proj's output still needs (null with bf16 weights).
  const float* RowScales(const Scratch& s, Proj proj) const { return Fp8In(s, proj).scale; }
  // Embedding and every layer for T rows of `s` (the part a decode graph captures).
  Status LaunchLayers(Scratch& s, int T);
  // Decode-only step of at most graph_max_batch_ sequences on a graph-capable backend: the padded
  // row count of its graph, else 0 (eager).
  int GraphBucket(const ForwardBatch& batch) const;
  // The padded row count of a decode step of n <= graph_max_batch_ sequences.
  int BucketFor(int n) const;
  // Runs one throw-away decode step per bucket, which captures its graph (ModelLoadOptions::
  // cuda_graph_warmup). Block 0's first slot is the only KV any of them writes or reads.
  Status CaptureAllGraphs();
  // Plans, uploads and runs the layers of a bucket's step through its graph (captured on first
  // use, after one eager run of the same step).
  Status RunGraph(const ForwardBatch& batch, int bucket);
  // Records LaunchLayers for `bucket` into graphs_ (nothing runs).
  Status Capture(int bucket);
  // Queues the whole forward, sampling and readback of a batch; returns its readback slot.
  StatusOr<int> Enqueue(const ForwardBatch& batch);

  Scratch eager_, graph_;
  int graph_max_batch_ = 0;      // 0: no graphs
  int graph_pages_per_seq_ = 0;  // block-table entries a graph step's sequence may have
  bool graphs_reserved_ = false;
  int64_t graph_steps_ = 0;
  std::map<int, cudaGraphExec_t> graphs_;  // bucket -> instantiated decode graph
  DeviceBuffer blas_workspace_;            // fixed, so cuBLAS needs no allocation inside a capture
  bool fp8_ = false;                       // weight_dtype "fp8"
  bool fused_decode_append_ = false;       // ModelLoadOptions::fused_decode_append
  CudaFp8Gemm fp8_gemm_;
  DeviceBuffer weight_amax_;  // scratch for QuantizeWeight
  DeviceBuffer unit_scale_;   // 1.0f: the fp8 GEMMs' activation scale (row scales come after)
  DeviceBuffer last_, logits_;
  cuda::PinnedStaging input_staging_;
  CudaLogitsReadback readback_;
  std::deque<int> launched_;  // readback slots of launched, not yet collected forwards
  // Logit rows whose tokens the last forward left in readback_.device_tokens() (all its rows were
  // sampled on the device), which the next forward may feed back; 0 otherwise.
  int feed_rows_ = 0;
  std::vector<float> collect_logits_;  // unused logits output of Collect
};

Status CudaLlamaModel::Init(const WeightStore* w, const ModelLoadOptions& options) {
  const ModelConfig& c = config_;
  dummy_ = options.dummy_weights;
  fused_decode_append_ = options.fused_decode_append;
  GPU_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  BLAS_RETURN_IF_ERROR(cublasCreate(&blas_));
  BLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream_));
  LLM_RETURN_IF_ERROR(blas_workspace_.Alloc(32ull << 20));
  BLAS_RETURN_IF_ERROR(cublasSetWorkspace(blas_, blas_workspace_.ptr, blas_workspace_.bytes));
  if (options.weight_dtype == "fp8") {
    fp8_ = true;
    LLM_RETURN_IF_ERROR(fp8_gemm_.Init(stream_, blas_workspace_.ptr, blas_workspace_.bytes,
                                       /*tune_max_m=*/256, options.fp8_fast_accumulation));
    LLM_RETURN_IF_ERROR(weight_amax_.Alloc(sizeof(float)));
    LLM_RETURN_IF_ERROR(unit_scale_.Alloc(kScaleSlot * sizeof(float)));
    const float one = 1.0f;
    GPU_RETURN_IF_ERROR(cudaMemcpy(unit_scale_.ptr, &one, sizeof(one), cudaMemcpyHostToDevice));
  }

  // Attention backend first: an unsupported combination fails before any weight is loaded.
  LLM_ASSIGN_OR_RETURN(KvCacheType kv,
                       ParseKvCacheType(options.kv_cache_dtype, options.kv_scale_granularity));
  if (kv.dtype == DType::kF32) kv.dtype = DType::kBF16;  // "auto": the 16-bit cache on GPUs
  int dev = 0, major = 0, minor = 0;
  GPU_RETURN_IF_ERROR(cudaGetDevice(&dev));
  GPU_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GPU_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  spec_.device = DeviceKind::kCuda;
  spec_.device_arch = major * 10 + minor;
  spec_.kind = AttentionKind::kMha;
  spec_.kv_dtype = kv.dtype;
  spec_.kv_quant = kv.quant;
  spec_.num_q_heads = c.num_q_heads;
  spec_.num_kv_heads = c.num_kv_heads;
  spec_.head_dim = c.head_dim;
  spec_.block_size = options.block_size;
  spec_.features = kFeatureCausal;
  if (c.AnyLayerWindowed()) spec_.features |= kFeatureSlidingWindow;
  if ((options.block_size & (options.block_size - 1)) != 0) {
    return InvalidArgument("the CUDA backend needs a power-of-two block_size, got " +
                           std::to_string(options.block_size));
  }
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec_, options.attention_backend, &table);
  spdlog::info("{}", table);
  if (!backend.ok()) return backend.status();
  attention_ = std::move(backend.value());
  attention_->set_stream(stream_);
  step_attention_ = attention_.get();
  LLM_RETURN_IF_ERROR(SelectPrefillBackend(options.prefill_attention_backend));
  LLM_RETURN_IF_ERROR(SelectC8Prefill(options.c8_prefill));
  if (options.cuda_graph_max_batch > 0 && attention_->supports_graphs()) {
    graph_max_batch_ = options.cuda_graph_max_batch;
    graph_pages_per_seq_ =
        (c.max_position_embeddings + options.block_size - 1) / options.block_size;
  }

  const int64_t h = c.hidden_size, q = c.q_size(), kvs = c.kv_size(), inter = c.intermediate_size;
  const int64_t vocab = c.vocab_size;
  const float wstd = 0.02f;
  Bf16WeightLoader loader(dummy_ ? nullptr : w, stream_);
  LLM_RETURN_IF_ERROR(loader.Load({"model.embed_tokens.weight"}, {{vocab, h}}, 0, 1.0f, &embed_));
  LLM_RETURN_IF_ERROR(loader.Load({"model.norm.weight"}, {{h}}, 1.0f, 0.1f, &final_norm_));
  if (!c.tie_word_embeddings) {
    LLM_RETURN_IF_ERROR(loader.Load({"lm_head.weight"}, {{vocab, h}}, 0, wstd, &lm_head_));
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto L = std::make_unique<LayerWeights>();
    LLM_RETURN_IF_ERROR(loader.Load({p + "input_layernorm.weight"}, {{h}}, 1, 0.1f, &L->attn_norm));
    LLM_RETURN_IF_ERROR(
        loader.Load({p + "post_attention_layernorm.weight"}, {{h}}, 1, 0.1f, &L->mlp_norm));
    LLM_RETURN_IF_ERROR(loader.Load({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                                     p + "self_attn.v_proj.weight"},
                                    {{q, h}, {kvs, h}, {kvs, h}}, 0, wstd, &L->wqkv));
    if (c.qkv_bias) {
      LLM_RETURN_IF_ERROR(loader.Load(
          {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"},
          {{q}, {kvs}, {kvs}}, 0, wstd, &L->bqkv));
    }
    LLM_RETURN_IF_ERROR(loader.Load({p + "self_attn.o_proj.weight"}, {{h, q}}, 0, wstd, &L->wo));
    LLM_RETURN_IF_ERROR(loader.Load({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                                    {{inter, h}, {inter, h}}, 0, wstd, &L->w_gate_up));
    LLM_RETURN_IF_ERROR(
        loader.Load({p + "mlp.down_proj.weight"}, {{h, inter}}, 0, wstd, &L->w_down));
    if (fp8_) {
      LLM_RETURN_IF_ERROR(L->scales.Alloc(kNumProj * kScaleSlot * sizeof(float)));
      LLM_RETURN_IF_ERROR(QuantizeWeight(&L->wqkv, &L->wqkv_q, L.get(), kQkv));
      LLM_RETURN_IF_ERROR(QuantizeWeight(&L->wo, &L->wo_q, L.get(), kO));
      LLM_RETURN_IF_ERROR(QuantizeWeight(&L->w_gate_up, &L->w_gate_up_q, L.get(), kGateUp));
      LLM_RETURN_IF_ERROR(QuantizeWeight(&L->w_down, &L->w_down_q, L.get(), kDown));
    }
    layers_.push_back(std::move(L));
  }

  LLM_RETURN_IF_ERROR(readback_.Reserve());  // fed-back tokens: a fixed address for the graphs

  // Rotary frequencies: the CPU oracle's own definition.
  const std::vector<float> inv = RopeInvFreq(c);
  LLM_RETURN_IF_ERROR(inv_freq_.Alloc(inv.size() * 4));
  GPU_RETURN_IF_ERROR(
      cudaMemcpy(inv_freq_.ptr, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));

  // KV pool: an explicit block count, or a fraction of the memory left after the weights.
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const size_t per_block = attention_->BlockBytes() * c.num_layers;
  if (options.num_kv_blocks > 0) {
    num_blocks_ = options.num_kv_blocks;
  } else {
    size_t free_bytes = 0, total = 0;
    GPU_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
    const double budget = static_cast<double>(free_bytes) * options.gpu_memory_fraction;
    num_blocks_ = static_cast<int>(budget / per_block);
  }
  if (num_blocks_ < 1) return ResourceExhausted("no GPU memory left for a single KV block");
  KvCacheScales scales;
  if (kv.is_static()) {
    if (w == nullptr) {
      // Dummy weights have no checkpoint scales: unit-variance data fits absmax 4.
      const size_t n = kv.quant == KvQuant::kStaticPerHead ? c.num_kv_heads : c.kv_size();
      const float s = 4.0f / (kv.dtype == DType::kI8 ? 127.0f : 448.0f);
      scales.k.assign(c.num_layers, std::vector<float>(n, s));
      scales.v = scales.k;
    } else {
      LLM_ASSIGN_OR_RETURN(scales, LoadKvCacheScales(c, *w, kv, options.kv_scales_file));
    }
  }
  const size_t esize = kv.dtype == DType::kBF16 ? 2 : 1;
  const size_t elems = static_cast<size_t>(num_blocks_) * c.num_kv_heads * options.block_size;
  for (int l = 0; l < c.num_layers; ++l) {
    auto lc = std::make_unique<LayerCache>();
    LLM_RETURN_IF_ERROR(lc->k.Alloc(elems * c.head_dim * esize));
    LLM_RETURN_IF_ERROR(lc->v.Alloc(elems * c.head_dim * esize));
    if (kv.quant == KvQuant::kDynamicPerToken) {
      LLM_RETURN_IF_ERROR(lc->k_block_scales.Alloc(elems * 4));
      LLM_RETURN_IF_ERROR(lc->v_block_scales.Alloc(elems * 4));
    }
    if (kv.is_static()) {
      LLM_RETURN_IF_ERROR(lc->k_scale.Alloc(scales.k[l].size() * 4));
      LLM_RETURN_IF_ERROR(lc->v_scale.Alloc(scales.v[l].size() * 4));
      GPU_RETURN_IF_ERROR(cudaMemcpy(lc->k_scale.ptr, scales.k[l].data(), scales.k[l].size() * 4,
                                     cudaMemcpyHostToDevice));
      GPU_RETURN_IF_ERROR(cudaMemcpy(lc->v_scale.ptr, scales.v[l].data(), scales.v[l].size() * 4,
                                     cudaMemcpyHostToDevice));
      if (fp8_ && options.fp8_static_attention_output) {
        // |out| <= qmax x max(v_scale): softmax weights sum to 1 over dequantized V rows.
        const float qmax = kv.dtype == DType::kI8 ? kInt8Max : kFp8E4M3Max;
        const float bound = qmax * *std::max_element(scales.v[l].begin(), scales.v[l].end());
        if (bound > 0.f && std::isfinite(bound)) {
          const float out_scale = bound / kFp8E4M3Max;
          lc->out_inv = kFp8E4M3Max / bound;
          LLM_RETURN_IF_ERROR(lc->out_scale.Alloc(kScaleSlot * sizeof(float)));
          GPU_RETURN_IF_ERROR(
              cudaMemcpy(lc->out_scale.ptr, &out_scale, sizeof(out_scale), cudaMemcpyHostToDevice));
        }
      }
    }
    cache_.push_back(std::move(lc));
  }
  if (!cache_.empty() && cache_[0]->out_inv > 0.f) {
    spdlog::info(
        "cuda model: the attention writes o_proj's fp8 input, scaled by the static V "
        "bound of each layer (fp8_static_attention_output)");
  }
  spdlog::info("cuda model: decode steps of up to {} sequences run in CUDA graphs{}",
               graph_max_batch_,
               graph_max_batch_ > 0 ? "" : " (none: disabled or the backend cannot be captured)");
  spdlog::info("cuda model: {} layers on sm_{}, {} {} weights, KV {} {} x {} blocks ({:.1f} GiB)",
               c.num_layers, spec_.device_arch, dummy_ ? "DUMMY (random)" : "checkpoint",
               fp8_ ? "fp8-e4m3 (per-tensor scales)" : "bf16", DTypeName(kv.dtype),
               KvQuantName(kv.quant), num_blocks_,
               static_cast<double>(per_block) * num_blocks_ / (1ull << 30));
  if (graph_max_batch_ > 0 && options.cuda_graph_warmup) LLM_RETURN_IF_ERROR(CaptureAllGraphs());
  return Status::Ok();
}

Status CudaLlamaModel::SelectPrefillBackend(const std::string& choice) {
  if (choice == "none") return Status::Ok();
  std::string name = choice;
  if (choice == "auto") {
    const bool sixteen = spec_.kv_dtype == DType::kBF16 && spec_.kv_quant == KvQuant::kNone;
    if (!sixteen || attention_->name() == "cuda_fmha") return Status::Ok();
    name = "cuda_fmha";
  }
  if (name == attention_->name()) return Status::Ok();
  std::string table;
  auto backend = BackendRegistry::Global().Create(spec_, name, &table);
  if (!backend.ok()) {
    if (choice == "auto") return Status::Ok();  // not built in, or cannot serve this spec
    spdlog::info("prefill attention: {}", table);
    return backend.status();
  }
  if ((*backend)->BlockBytes() != attention_->BlockBytes()) {
    return FailedPrecondition("prefill attention backend " + name +
                              " lays out KV blocks differently from " + attention_->name());
  }
  prefill_attention_ = std::move(backend.value());
  prefill_attention_->set_stream(stream_);
  spdlog::info("cuda model: steps with a prefill chunk attend through {}, decode steps through {}",
               prefill_attention_->name(), attention_->name());
  return Status::Ok();
}

Status CudaLlamaModel::SelectC8Prefill(const std::string& choice) {
  LLM_RETURN_IF_ERROR(CheckC8PrefillOption(choice));
  AttentionBackend* backend = prefill_attention_ ? prefill_attention_.get() : attention_.get();
  auto* sw = dynamic_cast<cuda::C8PrefillSwitch*>(backend);
  const bool eight_bit = spec_.kv_quant != KvQuant::kNone;
  if (choice == "fmha" && (sw == nullptr || !eight_bit)) {
    return InvalidArgument(
        "c8_prefill fmha: needs the cuda_c8 backend over an 8-bit KV cache, got " +
        backend->name() + " over " + DTypeName(spec_.kv_dtype));
  }
  if (sw == nullptr) return Status::Ok();
  // auto: the FMHA path where it runs (an H100/H200 with sm_90a in the build): 1.8% off a mixed
  // prompt step, 0.6-1.0% more output tokens/s in the serving workload (docs/BENCHMARKS.md).
  const bool fmha = choice == "fmha" || (choice == "auto" && eight_bit && FmhaWgmmaAvailable());
  LLM_RETURN_IF_ERROR(sw->SetPrefillFmha(fmha));
  if (eight_bit) {
    spdlog::info("cuda model: c8_prefill={} -> prefill chunks on {}", choice,
                 fmha ? "the wgmma FMHA kernel over a bf16 copy of the 8-bit cache"
                      : "the C8 prefill tiles");
  }
  return Status::Ok();
}

Status CudaLlamaModel::Scratch::Reserve(const ModelConfig& c, int tokens, bool fp8,
                                        cudaStream_t stream) {
  tokens = (tokens + 15) / 16 * 16;  // fp8 GEMMs run on whole 16-row groups
  if (tokens <= cap) return Status::Ok();
  const size_t T = static_cast<size_t>(tokens);
  const size_t H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  LLM_RETURN_IF_ERROR(ints.Alloc(3 * T * 4));
  LLM_RETURN_IF_ERROR(residual.Alloc(T * H * 4));
  LLM_RETURN_IF_ERROR(xn.Alloc(T * H * 2));
  LLM_RETURN_IF_ERROR(qkv.Alloc(T * (Q + 2 * KV) * 2));
  LLM_RETURN_IF_ERROR(q.Alloc(T * Q * 2));
  LLM_RETURN_IF_ERROR(k.Alloc(T * KV * 2));
  LLM_RETURN_IF_ERROR(v.Alloc(T * KV * 2));
  LLM_RETURN_IF_ERROR(attn.Alloc(T * Q * 2));
  LLM_RETURN_IF_ERROR(tmp.Alloc(T * H * 2));
  LLM_RETURN_IF_ERROR(gate_up.Alloc(T * 2 * I * 2));
  LLM_RETURN_IF_ERROR(act.Alloc(T * I * 2));
  if (fp8) {
    LLM_RETURN_IF_ERROR(xq.Alloc(T * std::max({H, Q, I})));
    LLM_RETURN_IF_ERROR(row_scales.Alloc(kNumProj * T * 4));
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(xq.ptr, 0, xq.bytes, stream));
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(row_scales.ptr, 0, row_scales.bytes, stream));
  }
  // Padding rows of a graph bucket are computed too: keep them finite from the start.
  for (DeviceBuffer* b : {&residual, &xn, &qkv, &q, &k, &v, &attn, &tmp, &gate_up, &act}) {
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(b->ptr, 0, b->bytes, stream));
  }
  cap = tokens;
  return Status::Ok();
}

Status CudaLlamaModel::Scratch::UploadInputs(const ForwardBatch& batch,
                                             cuda::PinnedStaging* staging, cudaStream_t stream) {
  const size_t n = 2 * static_cast<size_t>(cap) + batch.logit_rows.size();
  LLM_ASSIGN_OR_RETURN(void* buf, staging->Acquire(n * 4));
  auto* host = static_cast<int32_t*>(buf);
  std::fill(host, host + n, 0);
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), host);
  std::copy(batch.positions.begin(), batch.positions.end(), host + cap);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), host + 2 * cap);
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(ints.ptr, host, n * 4, cudaMemcpyHostToDevice, stream));
  return staging->Queued(stream);
}

Status CudaLlamaModel::LaunchLayers(Scratch& s, int T) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  const int QKV = Q + 2 * KV;
  cuda::LaunchEmbedding(embed_.ptr, s.ids(), T, H, s.residual.as<float>(), stream_,
                        readback_.device_tokens());
  const float scale = c.SoftmaxScale();
  // With fp8 weights every projection's input is produced as e4m3 rows by the kernel before it
  // (norm, SiluMul, or a row quantization of the attention output), and its raw output is scaled
  // back by the kernel after it (rotary, norm, SiluMul): no separate quantization pass.
  cuda::RmsNormArgs norm;
  norm.residual = s.residual.as<float>();
  norm.num_rows = T;
  norm.hidden = H;
  norm.eps = c.rms_norm_eps;
  norm.out = s.xn.ptr;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = *layers_[l];
    // The previous layer's MLP output joins the residual inside this norm.
    norm.delta = l == 0 ? nullptr : s.tmp.ptr;
    norm.delta_scale = l == 0 ? nullptr : RowScales(s, kDown);
    norm.weight = L.attn_norm.ptr;
    norm.out_fp8 = Fp8In(s, kQkv);
    cuda::LaunchAddRmsNorm(norm, stream_);
    LLM_RETURN_IF_ERROR(Project(s, l, kQkv, s.xn.ptr, T, QKV, H, s.qkv.ptr));
    cuda::RopeArgs ra;
    ra.qkv = s.qkv.ptr;
    ra.bias = L.bqkv.ptr;
    ra.qkv_scale = RowScales(s, kQkv);
    ra.positions = s.positions();
    ra.inv_freq = inv_freq_.as<float>();
    ra.q = s.q.ptr;
    ra.k = s.k.ptr;
    ra.v = s.v.ptr;
    ra.num_tokens = T;
    ra.num_q_heads = c.num_q_heads;
    ra.num_kv_heads = c.num_kv_heads;
    ra.head_dim = c.head_dim;
    AttentionParams p;
    p.out = s.attn.ptr;
    if (step_attention_->supports_fused_rope()) {  // one launch: rotary + KV append
      p.rope.qkv = ra.qkv;
      p.rope.bias = ra.bias;
      p.rope.qkv_scale = ra.qkv_scale;
      p.rope.positions = ra.positions;
      p.rope.inv_freq = ra.inv_freq;
      p.rope.q = s.q.ptr;
      p.rope.in_attention = fused_decode_append_;
    } else {
      cuda::LaunchBiasRope(ra, stream_);
      p.q = s.q.ptr;
      p.k_new = s.k.ptr;
      p.v_new = s.v.ptr;
    }
    const LayerCache& lc = *cache_[l];
    p.cache.k = lc.k.ptr;
    p.cache.v = lc.v.ptr;
    p.cache.k_scale = lc.k_scale.as<float>();
    p.cache.v_scale = lc.v_scale.as<float>();
    p.cache.k_block_scales = lc.k_block_scales.as<float>();
    p.cache.v_block_scales = lc.v_block_scales.as<float>();
    p.softmax_scale = scale;
    p.window_left = c.WindowLeft(l);
    // o_proj's fp8 input straight from the attention, with the layer's static scale; else a
    // per-row pass over its bf16 output.
    const bool static_out = fp8_ && lc.out_inv > 0.f && step_attention_->supports_fp8_out();
    if (static_out) {
      p.out_fp8 = s.xq.ptr;
      p.out_fp8_inv_scale = lc.out_inv;
    }
    step_attention_->Run(p);
    if (fp8_ && !static_out) cuda::LaunchQuantizeRowsFp8(s.attn.ptr, T, Q, Fp8In(s, kO), stream_);
    LLM_RETURN_IF_ERROR(Project(s, l, kO, s.attn.ptr, T, H, Q, s.tmp.ptr,
                                static_out ? lc.out_scale.as<float>() : nullptr));
    norm.delta = s.tmp.ptr;
    norm.delta_scale = static_out ? nullptr : RowScales(s, kO);
    norm.weight = L.mlp_norm.ptr;
    norm.out_fp8 = Fp8In(s, kGateUp);
    cuda::LaunchAddRmsNorm(norm, stream_);
    LLM_RETURN_IF_ERROR(Project(s, l, kGateUp, s.xn.ptr, T, 2 * I, H, s.gate_up.ptr));
    cuda::SiluMulArgs sm;
    sm.gate_up = s.gate_up.ptr;
    sm.gate_up_scale = RowScales(s, kGateUp);
    sm.num_tokens = T;
    sm.inter = I;
    sm.act = s.act.ptr;
    sm.act_fp8 = Fp8In(s, kDown);
    cuda::LaunchSiluMul(sm, stream_);
    LLM_RETURN_IF_ERROR(Project(s, l, kDown, s.act.ptr, T, H, I, s.tmp.ptr));
  }
  return Status::Ok();
}

Status CudaLlamaModel::Project(Scratch& s, int layer, Proj proj, const void* x, int T, int n, int k,
                               void* y, const float* x_scale) {
  const LayerWeights& L = *layers_[layer];
  if (!fp8_) {
    const void* w[] = {L.wqkv.ptr, L.wo.ptr, L.w_gate_up.ptr, L.w_down.ptr};
    return Gemm(x, w[proj], T, n, k, y, CUDA_R_16BF);
  }
  const void* w[] = {L.wqkv_q.ptr, L.wo_q.ptr, L.w_gate_up_q.ptr, L.w_down_q.ptr};
  // Whole 16-row groups (the scratch is sized for them; rows past T are never read back).
  const int rows = (T + 15) / 16 * 16;
  return fp8_gemm_.Run(s.xq.ptr, x_scale != nullptr ? x_scale : unit_scale_.as<float>(), w[proj],
                       L.scales.as<float>() + proj * kScaleSlot, rows, n, k, y);
}

Status CudaLlamaModel::QuantizeWeight(DeviceBuffer* bf16, DeviceBuffer* q, LayerWeights* L,
                                      Proj proj) {
  const int64_t n = static_cast<int64_t>(bf16->bytes / 2);
  LLM_RETURN_IF_ERROR(q->Alloc(n));
  GPU_RETURN_IF_ERROR(cudaMemsetAsync(weight_amax_.ptr, 0, sizeof(float), stream_));
  cuda::LaunchAbsMaxBf16(bf16->ptr, n, weight_amax_.as<float>(), stream_);
  cuda::LaunchQuantizeFp8(bf16->ptr, n, weight_amax_.as<float>(),
                          L->scales.as<float>() + proj * kScaleSlot, q->ptr, stream_);
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // before the bf16 copy goes
  bf16->Reset();
  return Status::Ok();
}

int CudaLlamaModel::GraphBucket(const ForwardBatch& batch) const {
  const AttentionBatch& a = batch.attn;
  if (graph_max_batch_ == 0 || a.num_seqs == 0 || a.num_tokens != a.num_seqs ||
      a.num_seqs > graph_max_batch_) {
    return 0;
  }
  for (int i = 0; i < a.num_seqs; ++i) {
    if (a.q_indptr[i + 1] - a.q_indptr[i] != 1) return 0;
    if (a.page_indptr[i + 1] - a.page_indptr[i] > graph_pages_per_seq_) return 0;
  }
  return BucketFor(a.num_seqs);
}

int CudaLlamaModel::BucketFor(int n) const {
  // 1, 2, 4, then multiples of 8 (as vLLM): at most 7 padding rows past 8.
  const int bucket = n <= 4 ? (n <= 1 ? 1 : n <= 2 ? 2 : 4) : (n + 7) / 8 * 8;
  return std::min(bucket, std::max(graph_max_batch_, n));
}

Status CudaLlamaModel::CaptureAllGraphs() {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  int captured = 0;
  for (int n = graph_max_batch_; n >= 1; --n) {
    const int bucket = BucketFor(n);
    if (bucket != n || graphs_.count(bucket)) continue;
    // `bucket` sequences of one token at position 0, all in block 0: row 0 appends the one K/V
    // entry every row then attends to (so the cache holds finite values); the others append none.
    ForwardBatch fb;
    AttentionBatch& a = fb.attn;
    a.num_seqs = bucket;
    a.num_tokens = bucket;
    for (int i = 0; i <= bucket; ++i) {
      a.q_indptr.push_back(i);
      a.page_indptr.push_back(i);
    }
    a.kv_lens.assign(bucket, 1);
    a.page_indices.assign(bucket, 0);
    a.slot_mapping.assign(bucket, -1);
    a.slot_mapping[0] = 0;
    fb.token_ids.assign(bucket, 0);
    fb.positions.assign(bucket, 0);
    for (int i = 0; i < bucket; ++i) fb.logit_rows.push_back(i);
    fb.device_sampled.assign(bucket, 1);
    fb.sampling_jobs.assign(bucket, SamplingJob{});
    fb.penalty_indptr.assign(bucket + 1, 0);
    LLM_RETURN_IF_ERROR(ForwardSampled(fb, &logits, &tokens));
    if (graph_max_batch_ == 0) break;  // a capture failed: decode steps run eagerly (logged)
    ++captured;
  }
  feed_rows_ = 0;  // nothing of these steps may be fed back
  spdlog::info("cuda model: captured {} decode graphs at start-up in {:.2f} s", captured,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

Status CudaLlamaModel::RunGraph(const ForwardBatch& batch, int bucket) {
  if (!graphs_reserved_) {
    const int cap = (graph_max_batch_ + 7) / 8 * 8;
    LLM_RETURN_IF_ERROR(graph_.Reserve(config_, cap, fp8_, stream_));
    LLM_RETURN_IF_ERROR(attention_->ReserveGraphs(cap, cap * graph_pages_per_seq_));
    graphs_reserved_ = true;
  }
  step_attention_ = attention_.get();
  LLM_RETURN_IF_ERROR(attention_->PlanGraph(batch.attn, bucket));
  // Padding rows: token 0 at position 0 (their results are never read).
  LLM_RETURN_IF_ERROR(graph_.UploadInputs(batch, &input_staging_, stream_));
  auto it = graphs_.find(bucket);
  if (it != graphs_.end()) {
    GPU_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
    ++graph_steps_;
    return Status::Ok();
  }
  // First step of this bucket: run it eagerly (its results are this step's), then capture the
  // same launches for the next ones. Capture records without executing.
  LLM_RETURN_IF_ERROR(LaunchLayers(graph_, bucket));
  const Status captured = Capture(bucket);
  if (!captured.ok()) {
    // The step itself already ran: a capture failure costs speed, never a request.
    spdlog::warn(
        "cuda model: capturing the decode graph for {} rows failed ({}); decode steps run "
        "eagerly from now on",
        bucket, captured.ToString());
    graph_max_batch_ = 0;
    (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
  }
  return Status::Ok();
}

Status CudaLlamaModel::Capture(int bucket) {
  GPU_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const Status launched = LaunchLayers(graph_, bucket);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (!launched.ok() || ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    LLM_RETURN_IF_ERROR(launched);
    GPU_RETURN_IF_ERROR(ended);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  GPU_RETURN_IF_ERROR(inst);
  graphs_[bucket] = exec;
  spdlog::info("cuda model: captured the decode graph for {} rows ({} graphs)", bucket,
               graphs_.size());
  return Status::Ok();
}

StatusOr<int> CudaLlamaModel::Enqueue(const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, spec_.block_size, num_blocks_));
  const int T = static_cast<int>(batch.token_ids.size());
  const int R = static_cast<int>(batch.logit_rows.size());
  const int H = c.hidden_size, V = c.vocab_size;
  for (int32_t id : batch.token_ids) {
    if (id >= V || (id < 0 && -(id + 1) >= feed_rows_)) {
      return InvalidArgument(id < 0 ? "fed-back token row " + std::to_string(-(id + 1)) +
                                          " is not a row the previous step sampled on the device"
                                    : "token id out of range");
    }
  }
  const int bucket = GraphBucket(batch);
  Scratch& s = bucket > 0 ? graph_ : eager_;
  const int rows = bucket > 0 ? bucket : T;  // rows the layers computed
  if (bucket > 0) {
    LLM_RETURN_IF_ERROR(RunGraph(batch, bucket));
  } else {
    LLM_RETURN_IF_ERROR(eager_.Reserve(c, std::max(T, 16), fp8_, stream_));
    LLM_RETURN_IF_ERROR(eager_.UploadInputs(batch, &input_staging_, stream_));
    // A prefill chunk (more query tokens than a decode of 1..4) goes to the prefill family.
    bool prefill = false;
    for (int i = 0; i < batch.attn.num_seqs && !prefill; ++i) {
      prefill = batch.attn.q_indptr[i + 1] - batch.attn.q_indptr[i] > 4;
    }
    step_attention_ = prefill && prefill_attention_ ? prefill_attention_.get() : attention_.get();
    LLM_RETURN_IF_ERROR(step_attention_->Plan(batch.attn));
    LLM_RETURN_IF_ERROR(LaunchLayers(eager_, T));
  }
  LLM_RETURN_IF_ERROR(last_.Alloc(std::max<size_t>(static_cast<size_t>(R) * H * 2, 64)));
  LLM_RETURN_IF_ERROR(logits_.Alloc(std::max<size_t>(static_cast<size_t>(R) * V * 4, 64)));
  if (R > 0) {
    // Final residual add for all rows, then the norm of the sampled rows only.
    cuda::RmsNormArgs fin;
    fin.residual = s.residual.as<float>();
    fin.delta = s.tmp.ptr;
    fin.delta_scale = RowScales(s, kDown);
    fin.weight = final_norm_.ptr;
    fin.num_rows = rows;
    fin.hidden = H;
    fin.eps = c.rms_norm_eps;
    fin.out = s.xn.ptr;
    cuda::LaunchAddRmsNorm(fin, stream_);
    cuda::LaunchAddRmsNorm(s.residual.as<float>(), nullptr, final_norm_.ptr, s.rows(), R, H,
                           c.rms_norm_eps, last_.ptr, stream_);
    const void* head = c.tie_word_embeddings ? embed_.ptr : lm_head_.ptr;
    LLM_RETURN_IF_ERROR(Gemm(last_.ptr, head, R, V, H, logits_.ptr, CUDA_R_32F));
  }
  LLM_ASSIGN_OR_RETURN(int slot, readback_.Issue(batch, logits_.as<float>(), V, stream_));
  bool all_device = batch.device_sampled.size() == static_cast<size_t>(R);
  for (int r = 0; r < R && all_device; ++r) all_device = batch.device_sampled[r] != 0;
  feed_rows_ = all_device ? R : 0;
  return slot;
}

Status CudaLlamaModel::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                      std::vector<int32_t>* tokens) {
  // A launched forward may still be outstanding (collected after this one); its slot is busy.
  if (launched_.size() > 1) return FailedPrecondition("two launched forwards are outstanding");
  LLM_ASSIGN_OR_RETURN(int slot, Enqueue(batch));
  return readback_.Finish(slot, logits, tokens);
}

Status CudaLlamaModel::Launch(const ForwardBatch& batch) {
  if (launched_.size() > 1) return FailedPrecondition("two launched forwards are outstanding");
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    if (batch.device_sampled.size() != batch.logit_rows.size() || !batch.device_sampled[r]) {
      return InvalidArgument("a launched forward must sample every logit row on the device");
    }
  }
  LLM_ASSIGN_OR_RETURN(int slot, Enqueue(batch));
  launched_.push_back(slot);
  return Status::Ok();
}

Status CudaLlamaModel::Collect(std::vector<int32_t>* tokens) {
  if (launched_.empty()) return FailedPrecondition("no launched forward to collect");
  const int slot = launched_.front();
  launched_.pop_front();
  return readback_.Finish(slot, &collect_logits_, tokens);
}

}  // namespace

bool CudaAvailable() {
  return cuda::CudaDeviceCount() > 0;
}

StatusOr<std::unique_ptr<Model>> CreateCudaLlamaModel(const ModelConfig& config,
                                                      const WeightStore* weights,
                                                      const ModelLoadOptions& options) {
  if (!CudaAvailable()) return Unavailable("device 'cuda' requested but no CUDA device is present");
  if (config.o_bias || config.mlp_bias) {  // the CPU model implements them
    return Unimplemented(std::string(config.o_bias ? "attention_bias (o_proj bias)" : "mlp_bias") +
                         " is not implemented on the cuda device; use device cpu");
  }
  auto m = std::make_unique<CudaLlamaModel>(config);
  LLM_RETURN_IF_ERROR(m->Init(weights, options));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace llm
