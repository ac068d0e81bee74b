#include "engine/runtime/cuda/cuda_model_runner.h"

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>

#include <spdlog/spdlog.h>

#include "engine/loader/kv_cache_quant.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/communicator.h"
#include "engine/runtime/cuda/cuda_logits_readback.h"
#include "engine/runtime/graph_step_plan.h"
#include "kernels/backend_registry.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/common/pinned_staging.h"
#include "kernels/cuda/ops/dense_gemv.h"
#include "kernels/cuda/ops/elementwise_ops.h"

namespace llm {

namespace {

// The registry's whole choice for `spec` under the options' attention choices
// (attention_backend, prefill_attention_backend, c8_prefill, mla_kernel), logged, on `stream`.
StatusOr<AttentionBackends> SelectAttention(const AttentionSpec& spec,
                                            const ModelLoadOptions& options, cudaStream_t stream) {
  AttentionOptions o;
  o.backend = options.attention_backend;
  o.prefill_backend = options.prefill_attention_backend;
  o.c8_prefill = options.c8_prefill;
  o.mla_kernel = options.mla_kernel;
  std::vector<std::string> log;
  auto backends = BackendRegistry::Global().CreateBackends(spec, o, &log);
  for (const std::string& line : log) spdlog::info("{}", line);
  if (!backends.ok()) return backends.status();
  backends->decode->set_stream(stream);
  if (backends->prefill) backends->prefill->set_stream(stream);
  return backends;
}

class CudaModelRunner final : public Model {
 public:
  explicit CudaModelRunner(std::unique_ptr<CudaDecoder> decoder) : dec_(std::move(decoder)) {}
  ~CudaModelRunner() override {
    for (auto& [shape, exec] : graphs_) cudaGraphExecDestroy(exec);
    dec_.reset();  // its buffers and backends before the stream
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const WeightStore* weights, const ModelLoadOptions& options,
              const CudaTensorParallelRank& tp);
  // The model's configuration: a tensor-parallel rank's definition has the rank-local one.
  const ModelConfig& config() const override { return model_config_; }
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
  Status SupplyMasks(std::vector<uint32_t> token_masks) override;
  std::string attention_backend_name() const override { return dec_->attention().name(); }
  std::string kv_cache_dtype_name() const override { return dec_->kv_cache_dtype_name(); }
  int num_kv_blocks() const override { return num_blocks_; }
  Status AllocateKvCache(int num_blocks) override;
  int64_t graph_steps() const override { return graph_steps_; }
  size_t kv_bytes_per_block() const override {
    return dec_->attention().BlockBytes() * config().num_layers;
  }
  // Hidden states come back through the host (a D2H copy of the rows asked for after the final
  // norm, which runs outside the decode graphs; in ForwardSampled only: a launched forward
  // refuses them) from the residual stream in fp32 or, after the final norm, from its bf16
  // output. A step that reads input_hidden (an MTP layer) runs eagerly.
  bool returns_hidden_states() const override { return true; }
  std::span<const float> hidden_states() const override { return hidden_; }
  // A captured step would replay without recording: steps run eagerly while a trace is set.
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    tracing_ = trace != nullptr;
    return dec_->set_routing_trace(trace);
  }

 private:
  // The runner's part of a scratch set: the step's ints, the residual stream, the norm output.
  struct Scratch {
    DeviceBuffer ints;  // [ids: cap][positions: cap][logit rows: cap]
    DeviceBuffer residual, xn;
    int cap = 0;
    const int32_t* ids() const { return ints.as<int32_t>(); }
    const int32_t* positions() const { return ints.as<int32_t>() + cap; }
    const int32_t* rows() const { return ints.as<int32_t>() + 2 * cap; }
  };
  // Scratch set `set` (and the definition's) for at least `rows` rows, in 16-row groups.
  Status Reserve(int set, int rows);
  // One upload of the batch's ids, positions and logit rows into the set's ints; rows past the
  // batch (graph padding) get token 0 at position 0. Pinned staging: a pageable source may make
  // the copy wait for the stream, i.e. for the previous step, which overlapped steps must not.
  Status UploadInputs(const ForwardBatch& batch, Scratch& s);
  // Embedding and every layer for `rows` rows of set `set` (the part a decode graph captures).
  StatusOr<CudaLayersOut> LaunchLayers(const ForwardBatch& batch, int set, int rows,
                                       const float* input_hidden = nullptr);
  // A tensor-parallel rank's LM head: its vocabulary slice of the R rows in last_, gathered from
  // every rank into logits_ [R, vocab] (the padding rows dropped).
  Status GatherLogits(const void* head, int R);
  // After the final norm of an eager step: the rows of batch.hidden_rows into hidden_.
  Status ReadHidden(const ForwardBatch& batch, const Scratch& s);
  // The graph a step replays (PlanGraphStep under this runner's limits); shape.seqs 0: eager.
  GraphStepPlan PlanGraph(const ForwardBatch& batch) const;
  // Runs one throw-away step per bucket of q query rows per sequence, which captures its graph
  // (ModelLoadOptions::cuda_graph_warmup: q = 1 and q = graph_max_q_). The first q slots of the
  // pool are the only KV any of them writes or reads.
  Status CaptureAllGraphs(int q);
  // Plans, uploads and runs the layers of a step of `shape` (every sequence shape.q rows) through
  // its graph (captured on first use, after one eager run of the same step).
  StatusOr<CudaLayersOut> RunGraph(const ForwardBatch& batch, GraphShape shape);
  // Records LaunchLayers for `shape` into graphs_ (nothing runs).
  Status Capture(const ForwardBatch& batch, GraphShape shape);
  // Queues the whole forward, sampling and readback of a batch; returns its readback slot. With
  // masks_deferred, only the forward: the sampling waits in deferred_ for SupplyMasks (-1).
  StatusOr<int> Enqueue(const ForwardBatch& batch);
  // The KV pool of `num_blocks` blocks bound to the definition (ctx as at load), the load's
  // summary line, and the warm-up graphs (which need the cache).
  Status BuildKvPool(const CudaLoadContext& ctx, int num_blocks);

  std::unique_ptr<CudaDecoder> dec_;
  ModelConfig model_config_;  // the whole model's (TensorParallelPlan::model on a rank)
  // A tensor-parallel rank's group (null: the whole model) and its vocabulary slice: the
  // embedding's and LM head's rows [vocab_begin_, vocab_begin_ + vocab_rows_) of the model's,
  // padded to the definition's vocab_size.
  Communicator* comm_ = nullptr;
  int vocab_begin_ = 0, vocab_rows_ = -1;
  DeviceBuffer head_slice_, head_gathered_;  // fp32 [R, local vocab], [ranks, R, local vocab]
  // ModelLoadOptions::defer_kv_cache: the options and the load's description, kept for
  // AllocateKvCache.
  ModelLoadOptions deferred_options_;
  std::string load_summary_;
  KvCacheLayout kv_layout_;  // of the attention spec, for the pool
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer blas_workspace_;  // fixed, so cuBLAS needs no allocation inside a capture
  CudaFp8Gemm fp8_gemm_;
  DeviceBuffer unit_scale_, amax_;  // CudaLinearOps::unit_scale / amax
  CudaLinearOps ops_;
  DeviceBuffer embed_, lm_head_, final_norm_;
  CudaModelSettings settings_;
  int block_size_ = 0;
  int num_blocks_ = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> kv_cache_;  // per layer, in the spec's layout
  Scratch sets_[2];                                      // eager, graph
  int graph_max_batch_ = 0;                              // 0: no graphs
  int graph_max_q_ = 1;   // query rows per sequence a graph may have (cuda_graph_max_query_rows)
  bool tracing_ = false;  // set_routing_trace: eager steps only
  int graph_pages_per_seq_ = 0;  // block-table entries a graph step's sequence may have
  bool graphs_reserved_ = false;
  int64_t graph_steps_ = 0;
  std::map<GraphShape, cudaGraphExec_t> graphs_;  // instantiated graphs by shape
  // The sampling part (rows, jobs, penalties) of a forward launched with deferred masks.
  std::optional<ForwardBatch> deferred_;
  CudaLayersOut graph_out_;  // where the graph set's last layer leaves its output
  DeviceBuffer last_, logits_;
  cuda::PinnedStaging input_staging_;
  CudaLogitsReadback readback_;
  std::deque<int> launched_;  // readback slots of launched, not yet collected forwards
  // Logit rows whose tokens the last forward left in readback_.device_tokens() (all its rows were
  // sampled on the device), which the next forward may feed back; 0 otherwise.
  int feed_rows_ = 0;
  std::vector<float> collect_logits_;  // unused logits output of Collect
  DeviceBuffer input_hidden_;          // fp32 [T, hidden]: ForwardBatch::input_hidden
  std::vector<float> hidden_;          // [hidden_rows, hidden] of the last forward
  std::vector<uint16_t> hidden_bf16_;  // staging of normed (bf16) hidden rows
};

Status CudaModelRunner::Init(const WeightStore* w, const ModelLoadOptions& options,
                             const CudaTensorParallelRank& tp) {
  if ((tp.plan == nullptr) != (tp.comm == nullptr)) {
    return InvalidArgument("a tensor-parallel rank needs both its plan and its communicator");
  }
  if (tp.plan != nullptr) {
    if (tp.comm->size() != tp.plan->size || tp.comm->rank() != tp.plan->rank) {
      return InvalidArgument("communicator rank " + std::to_string(tp.comm->rank()) + " of " +
                             std::to_string(tp.comm->size()) + " disagrees with the plan's rank " +
                             std::to_string(tp.plan->rank) + " of " +
                             std::to_string(tp.plan->size));
    }
    if (!dec_->computes_tensor_parallel()) {
      return Unimplemented(std::string("tensor_parallel_size ") + std::to_string(tp.plan->size) +
                           ": the cuda " + dec_->name() +
                           " definition has no tensor-parallel rank");
    }
    comm_ = tp.comm;
    vocab_begin_ = static_cast<int>(tp.plan->vocab_begin);
    vocab_rows_ = static_cast<int>(tp.plan->vocab_rows);
  }
  model_config_ = tp.plan != nullptr ? tp.plan->model : dec_->config();
  const ModelConfig& c = config();
  GPU_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  BLAS_RETURN_IF_ERROR(cublasCreate(&blas_));
  BLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream_));
  LLM_RETURN_IF_ERROR(blas_workspace_.Alloc(32ull << 20));
  BLAS_RETURN_IF_ERROR(cublasSetWorkspace(blas_, blas_workspace_.ptr, blas_workspace_.bytes));
  ops_.stream = stream_;
  ops_.blas = blas_;
  ops_.dense_gemv_max_rows = std::min(options.dense_gemv_max_rows, cuda::kDenseGemvMaxRows);
  CudaLoadContext ctx;
  ctx.options = &options;
  ctx.weights = w;
  ctx.ops = &ops_;
  ctx.comm = comm_;
  ctx.plan = comm_ != nullptr ? tp.plan : nullptr;
  // A pre-quantized checkpoint keeps its e4m3 projections (unless weight_dtype bf16 asks for the
  // dequantized model) where the definition can: no bf16 copy of them is ever made.
  ctx.fp8_checkpoint = w != nullptr && !options.dummy_weights && w->quantization().fp8() &&
                       options.weight_dtype != "bf16" && dec_->keeps_checkpoint_fp8();
  if (w != nullptr && w->quantization().fp8() && !ctx.fp8_checkpoint) {
    spdlog::warn("cuda model: {} checkpoint weights are dequantized to bf16 ({})",
                 w->quantization().quant_method,
                 options.weight_dtype == "bf16"
                     ? "weight_dtype bf16"
                     : std::string("the ") + dec_->name() + " definition keeps no checkpoint fp8");
  }
  if (options.weight_dtype == "fp8") ctx.weight_quant = WeightQuant::kFp8PerTensor;
  if (options.weight_dtype == "fp8" || ctx.fp8_checkpoint) {
    LLM_RETURN_IF_ERROR(fp8_gemm_.Init(stream_, blas_workspace_.ptr, blas_workspace_.bytes,
                                       /*tune_max_m=*/256, options.fp8_fast_accumulation));
    LLM_RETURN_IF_ERROR(amax_.Alloc(sizeof(float)));
    LLM_RETURN_IF_ERROR(unit_scale_.Alloc(CudaLinear::kScaleSlot * sizeof(float)));
    const float one = 1.0f;
    GPU_RETURN_IF_ERROR(cudaMemcpy(unit_scale_.ptr, &one, sizeof(one), cudaMemcpyHostToDevice));
    ops_.fp8 = &fp8_gemm_;
    ops_.unit_scale = unit_scale_.as<float>();
    ops_.amax = amax_.as<float>();
  }
  int dev = 0, major = 0, minor = 0;
  GPU_RETURN_IF_ERROR(cudaGetDevice(&dev));
  GPU_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GPU_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  ctx.device_arch = major * 10 + minor;
  block_size_ = options.block_size;
  Bf16WeightLoader loader(options.dummy_weights ? nullptr : w, stream_);
  ctx.loader = &loader;
  LLM_ASSIGN_OR_RETURN(const AttentionSpec spec, dec_->AttentionNeeds(ctx));
  if (options.defer_kv_cache && KvCacheType{spec.kv_dtype, spec.kv_quant}.is_static()) {
    return InvalidArgument(
        "a model whose KV cache is allocated later (a draft model) takes no static 8-bit KV "
        "cache (its scales are bound with the cache); use kv_cache_dtype auto or "
        "fp8_e4m3_dynamic");
  }
  LLM_ASSIGN_OR_RETURN(AttentionBackends backends, SelectAttention(spec, options, stream_));
  const KvCacheLayout layout = KvCacheLayout::Of(spec);
  if (layout.block_bytes() != backends.decode->BlockBytes()) {
    return Internal("attention backend " + backends.decode->name() + " reports " +
                    std::to_string(backends.decode->BlockBytes()) + " bytes per block, not the " +
                    std::to_string(layout.block_bytes()) + " of the spec's KV cache layout");
  }
  LLM_RETURN_IF_ERROR(dec_->UseAttention(std::move(backends)));
  kv_layout_ = layout;
  settings_ = dec_->settings();

  // Embedding, final norm and LM head stay bf16 whatever the projections' quantization. A rank
  // holds its vocabulary rows (the definition's vocab_size, padding included).
  const int64_t h = c.hidden_size, vocab = dec_->config().vocab_size;
  LLM_RETURN_IF_ERROR(loader.Load({settings_.embed_tokens}, {{vocab, h}}, 0, 1.0f, &embed_));
  LLM_RETURN_IF_ERROR(loader.Load({settings_.final_norm}, {{h}}, 1.0f, 0.1f, &final_norm_));
  if (!c.tie_word_embeddings) {
    LLM_RETURN_IF_ERROR(loader.Load({settings_.lm_head}, {{vocab, h}}, 0, 0.02f, &lm_head_));
  }
  LLM_RETURN_IF_ERROR(dec_->Load(ctx));
  const bool comm_captures = comm_ == nullptr || comm_->capturable();
  if (options.cuda_graph_max_batch > 0 && dec_->graph_safe() &&
      dec_->attention().supports_graphs() && comm_captures) {
    graph_max_batch_ = options.cuda_graph_max_batch;
    graph_max_q_ = std::max(1, options.cuda_graph_max_query_rows);
    graph_pages_per_seq_ =
        (c.max_position_embeddings + options.block_size - 1) / options.block_size;
  }
  LLM_RETURN_IF_ERROR(readback_.Reserve());  // fed-back tokens: a fixed address for the graphs

  const char* why_not =
      options.cuda_graph_max_batch <= 0      ? " (none: disabled)"
      : !dec_->attention().supports_graphs() ? " (none: the attention backend cannot be captured)"
      : !dec_->graph_safe()                  ? " (none: the layers synchronize with the host)"
      : !comm_captures ? " (none: the tensor-parallel communicator cannot be captured)"
                       : "";
  spdlog::info(
      "cuda model: decode steps of up to {} sequences and {} query rows each run in CUDA graphs{}",
      graph_max_batch_, graph_max_q_, why_not);
  const std::string extra = dec_->Summary();
  load_summary_ =
      std::string(dec_->name()) + " " + std::to_string(c.num_layers) + " layers" +
      (extra.empty() ? "" : " (" + extra + ")") + " on sm_" + std::to_string(ctx.device_arch) +
      ", " + (loader.dummy() ? "DUMMY (random)" : "checkpoint") + " " +
      (ctx.fp8_checkpoint ? "fp8-e4m3 as stored (" + w->quantization().quant_method + ")"
                          : std::string(WeightQuantName(ctx.weight_quant))) +
      " weights";
  // The eager steps' scratch first, so that the KV pool is sized from what is left after it.
  if (options.max_step_rows > 0) LLM_RETURN_IF_ERROR(Reserve(0, options.max_step_rows));
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (options.defer_kv_cache) {  // AllocateKvCache binds a cache without the weights
    deferred_options_ = options;
    return Status::Ok();
  }
  // KV pool: an explicit block count, or a fraction of the memory left after the weights (shared
  // with whatever another model keeps under the same block ids).
  int num_blocks = options.num_kv_blocks;
  if (num_blocks <= 0) {
    const size_t per_block = kv_bytes_per_block() + options.extra_kv_bytes_per_block;
    size_t free_bytes = 0, total = 0;
    GPU_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total));
    const double budget = static_cast<double>(free_bytes) * options.gpu_memory_fraction;
    num_blocks = static_cast<int>(budget / per_block);
  }
  if (num_blocks < 1) return ResourceExhausted("no GPU memory left for a single KV block");
  return BuildKvPool(ctx, num_blocks);
}

Status CudaModelRunner::AllocateKvCache(int num_blocks) {
  if (num_blocks_ > 0) return FailedPrecondition("the KV cache is allocated already");
  if (num_blocks < 1) return InvalidArgument("a KV cache needs at least one block");
  // The definition binds a non-static cache from the options alone (Init refused a static one).
  CudaLoadContext ctx;
  ctx.options = &deferred_options_;
  ctx.ops = &ops_;
  return BuildKvPool(ctx, num_blocks);
}

Status CudaModelRunner::BuildKvPool(const CudaLoadContext& ctx, int num_blocks) {
  const KvCacheLayout& layout = kv_layout_;
  num_blocks_ = num_blocks;
  std::vector<KvCacheLayer> views;
  for (int l = 0; l < config().num_layers; ++l) {
    kv_cache_.push_back(std::make_unique<DeviceBuffer>());
    LLM_RETURN_IF_ERROR(kv_cache_.back()->Alloc(layout.block_bytes() * num_blocks_));
    views.push_back(layout.Carve(kv_cache_.back()->ptr, num_blocks_));
  }
  LLM_RETURN_IF_ERROR(dec_->BindCache(ctx, views));
  spdlog::info("cuda model: {}, KV {} x {} blocks ({:.1f} GiB)", load_summary_,
               dec_->kv_cache_dtype_name(), num_blocks_,
               static_cast<double>(kv_bytes_per_block()) * num_blocks_ / (1ull << 30));
  if (graph_max_batch_ > 0 && ctx.options->cuda_graph_warmup) {
    LLM_RETURN_IF_ERROR(CaptureAllGraphs(1));
    // The verify steps of the configured K (other row counts: on first use).
    if (graph_max_batch_ > 0 && graph_max_q_ > 1) {
      LLM_RETURN_IF_ERROR(CaptureAllGraphs(graph_max_q_));
    }
  }
  return Status::Ok();
}

Status CudaModelRunner::Reserve(int set, int rows) {
  rows = Fp8Rows16(rows);
  Scratch& s = sets_[set];
  LLM_RETURN_IF_ERROR(dec_->Reserve(set, rows));
  if (rows <= s.cap) return Status::Ok();
  const size_t T = static_cast<size_t>(rows), H = config().hidden_size;
  LLM_RETURN_IF_ERROR(s.ints.Alloc(3 * T * 4));
  LLM_RETURN_IF_ERROR(s.residual.Alloc(T * H * 4));
  LLM_RETURN_IF_ERROR(s.xn.Alloc(T * H * 2));
  // Padding rows of a graph bucket are computed too: keep them finite from the start.
  GPU_RETURN_IF_ERROR(cudaMemsetAsync(s.residual.ptr, 0, s.residual.bytes, stream_));
  GPU_RETURN_IF_ERROR(cudaMemsetAsync(s.xn.ptr, 0, s.xn.bytes, stream_));
  s.cap = rows;
  return Status::Ok();
}

Status CudaModelRunner::UploadInputs(const ForwardBatch& batch, Scratch& s) {
  const size_t n = 2 * static_cast<size_t>(s.cap) + batch.logit_rows.size();
  LLM_ASSIGN_OR_RETURN(void* buf, input_staging_.Acquire(n * 4));
  auto* host = static_cast<int32_t*>(buf);
  std::fill(host, host + n, 0);
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), host);
  std::copy(batch.positions.begin(), batch.positions.end(), host + s.cap);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), host + 2 * s.cap);
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(s.ints.ptr, host, n * 4, cudaMemcpyHostToDevice, stream_));
  return input_staging_.Queued(stream_);
}

StatusOr<CudaLayersOut> CudaModelRunner::LaunchLayers(const ForwardBatch& batch, int set, int rows,
                                                      const float* input_hidden) {
  Scratch& s = sets_[set];
  const int H = config().hidden_size;
  cuda::LaunchEmbedding(embed_.ptr, s.ids(), rows, H, s.residual.as<float>(), stream_,
                        readback_.device_tokens(), settings_.embed_scale, vocab_begin_,
                        vocab_rows_);
  if (comm_ != nullptr) {  // the rank's rows, zeros elsewhere: the sum is the embedding
    LLM_RETURN_IF_ERROR(
        comm_->AllReduceSum(s.residual.ptr, static_cast<size_t>(rows) * H, DType::kF32, stream_));
  }
  CudaStep step;
  step.set = set;
  step.rows = rows;
  step.batch = &batch;
  step.positions = s.positions();
  step.residual = s.residual.as<float>();
  step.xn = s.xn.ptr;
  step.input_hidden = input_hidden;
  return dec_->RunLayers(step);
}

Status CudaModelRunner::GatherLogits(const void* head, int R) {
  const int n = comm_->size(), H = config().hidden_size, V = config().vocab_size;
  const int Vr = dec_->config().vocab_size;  // rows per rank, padding included
  const size_t slice = static_cast<size_t>(R) * Vr;
  LLM_RETURN_IF_ERROR(head_slice_.Alloc(std::max<size_t>(slice * 4, 64)));
  LLM_RETURN_IF_ERROR(head_gathered_.Alloc(std::max<size_t>(n * slice * 4, 64)));
  LLM_RETURN_IF_ERROR(GemmBf16(blas_, last_.ptr, head, R, Vr, H, head_slice_.ptr, CUDA_R_32F));
  LLM_RETURN_IF_ERROR(
      comm_->AllGather(head_slice_.ptr, head_gathered_.ptr, slice, DType::kF32, stream_));
  // Rank k's [R, Vr] block holds the columns [k Vr, k Vr + Vr) of every row.
  for (int k = 0; k < n; ++k) {
    const int cols = std::min(Vr, V - k * Vr);
    if (cols <= 0) break;
    GPU_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        logits_.as<float>() + static_cast<size_t>(k) * Vr, static_cast<size_t>(V) * 4,
        head_gathered_.as<float>() + k * slice, static_cast<size_t>(Vr) * 4,
        static_cast<size_t>(cols) * 4, R, cudaMemcpyDeviceToDevice, stream_));
  }
  return Status::Ok();
}

Status CudaModelRunner::ReadHidden(const ForwardBatch& batch, const Scratch& s) {
  const size_t H = config().hidden_size;
  const size_t n = batch.hidden_rows.size();
  hidden_.resize(n * H);
  if (!batch.hidden_before_final_norm) hidden_bf16_.resize(n * H);
  // One copy per run of consecutive rows (a sequence's rows are consecutive). A copy into
  // pageable memory returns once it is done, after the stream's earlier work.
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && batch.hidden_rows[j] == batch.hidden_rows[j - 1] + 1) ++j;
    const size_t row = batch.hidden_rows[i], count = j - i;
    if (batch.hidden_before_final_norm) {
      GPU_RETURN_IF_ERROR(cudaMemcpyAsync(hidden_.data() + i * H, s.residual.as<float>() + row * H,
                                          count * H * 4, cudaMemcpyDeviceToHost, stream_));
    } else {
      GPU_RETURN_IF_ERROR(cudaMemcpyAsync(hidden_bf16_.data() + i * H,
                                          static_cast<const uint16_t*>(s.xn.ptr) + row * H,
                                          count * H * 2, cudaMemcpyDeviceToHost, stream_));
    }
    i = j;
  }
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (!batch.hidden_before_final_norm) {
    ConvertToF32(DType::kBF16, hidden_bf16_.data(), hidden_.data(), n * H);
  }
  return Status::Ok();
}

GraphStepPlan CudaModelRunner::PlanGraph(const ForwardBatch& batch) const {
  // A step that reads input_hidden (an MTP layer) runs eagerly.
  if (graph_max_batch_ == 0 || tracing_ || !batch.input_hidden.empty()) return {};
  const GraphStepPlan plan =
      PlanGraphStep(batch.attn, {graph_max_batch_, graph_max_q_, graph_pages_per_seq_});
  // ReadHidden names the batch's rows: pad rows in front of a sequence's would move them.
  if (plan.padded && !batch.hidden_rows.empty()) return {};
  return plan;
}

Status CudaModelRunner::CaptureAllGraphs(int q) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  int captured = 0;
  for (int n = graph_max_batch_; n >= 1; --n) {
    const int bucket = GraphSeqBucket(n, graph_max_batch_);
    if (bucket != n || graphs_.count(GraphShape{bucket, q})) continue;
    // `bucket` sequences of q tokens at positions 0..q-1, all in the first blocks: sequence 0's
    // rows append the q K/V entries every row then attends to (so the cache holds finite
    // values); the others append none.
    const int pages = (q + block_size_ - 1) / block_size_;
    ForwardBatch fb;
    AttentionBatch& a = fb.attn;
    a.num_seqs = bucket;
    a.num_tokens = bucket * q;
    for (int i = 0; i <= bucket; ++i) {
      a.q_indptr.push_back(i * q);
      a.page_indptr.push_back(i * pages);
    }
    a.kv_lens.assign(bucket, q);
    for (int i = 0; i < bucket; ++i) {
      for (int p = 0; p < pages; ++p) a.page_indices.push_back(p);
    }
    a.slot_mapping.assign(a.num_tokens, -1);
    for (int t = 0; t < q; ++t) a.slot_mapping[t] = t;
    fb.token_ids.assign(a.num_tokens, 0);
    for (int i = 0; i < bucket; ++i) {
      for (int t = 0; t < q; ++t) fb.positions.push_back(t);
    }
    // One logit row per sequence: the LM head runs outside the graph, and a logits buffer for
    // every row of the largest verify graph would stay allocated.
    for (int i = 0; i < bucket; ++i) fb.logit_rows.push_back((i + 1) * q - 1);
    fb.device_sampled.assign(bucket, 1);
    fb.sampling_jobs.assign(bucket, SamplingJob{});
    fb.penalty_indptr.assign(bucket + 1, 0);
    LLM_RETURN_IF_ERROR(ForwardSampled(fb, &logits, &tokens));
    if (graph_max_batch_ == 0 || graph_max_q_ < q) break;  // a capture failed (logged)
    ++captured;
  }
  feed_rows_ = 0;  // nothing of these steps may be fed back
  spdlog::info(
      "cuda model: captured {} graphs of {} query rows per sequence at start-up in {:.2f} s",
      captured, q, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

StatusOr<CudaLayersOut> CudaModelRunner::RunGraph(const ForwardBatch& batch, GraphShape shape) {
  if (!graphs_reserved_) {
    const int cap = (graph_max_batch_ + 7) / 8 * 8;
    LLM_RETURN_IF_ERROR(Reserve(1, cap * graph_max_q_));
    LLM_RETURN_IF_ERROR(
        dec_->attention().ReserveGraphs(cap, cap * graph_pages_per_seq_, graph_max_q_));
    graphs_reserved_ = true;
  }
  LLM_RETURN_IF_ERROR(dec_->PlanGraph(batch, shape));
  // Padding rows: token 0 at position 0 (their results are never read).
  LLM_RETURN_IF_ERROR(UploadInputs(batch, sets_[1]));
  auto it = graphs_.find(shape);
  if (it != graphs_.end()) {
    GPU_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
    ++graph_steps_;
    return graph_out_;
  }
  // First step of this shape: run it eagerly (its results are this step's), then capture the
  // same launches for the next ones. Capture records without executing.
  LLM_ASSIGN_OR_RETURN(CudaLayersOut out, LaunchLayers(batch, 1, shape.rows()));
  graph_out_ = out;  // the graph set's pointers: the same for every shape
  const Status captured = Capture(batch, shape);
  if (!captured.ok()) {
    // The step itself already ran: a capture failure costs speed, never a request.
    spdlog::warn(
        "cuda model: capturing the graph for {} sequences of {} rows failed ({}); {} steps run "
        "eagerly from now on",
        shape.seqs, shape.q, captured.ToString(), shape.q > 1 ? "verify" : "decode");
    if (shape.q > 1) {
      graph_max_q_ = 1;
    } else {
      graph_max_batch_ = 0;
    }
    (void)cudaGetLastError();  // capture errors are not sticky; clear the last one
  }
  return out;
}

Status CudaModelRunner::Capture(const ForwardBatch& batch, GraphShape shape) {
  GPU_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const Status launched = LaunchLayers(batch, 1, shape.rows()).status();
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
  graphs_[shape] = exec;
  spdlog::info("cuda model: captured the graph for {} sequences of {} rows ({} graphs)", shape.seqs,
               shape.q, graphs_.size());
  return Status::Ok();
}

StatusOr<int> CudaModelRunner::Enqueue(const ForwardBatch& batch) {
  const ModelConfig& c = config();
  LLM_RETURN_IF_ERROR(CheckAttentionBatch(batch.attn, block_size_, num_blocks_));
  const int T = static_cast<int>(batch.token_ids.size());
  const int R = static_cast<int>(batch.logit_rows.size());
  const int H = c.hidden_size, V = c.vocab_size;
  if (batch.attn.num_tokens != T || batch.positions.size() != static_cast<size_t>(T)) {
    return InvalidArgument("the batch's token ids, positions and attention rows differ in count");
  }
  if (dec_->reads_input_hidden() ? batch.input_hidden.size() != static_cast<size_t>(T) * H
                                 : !batch.input_hidden.empty()) {
    return InvalidArgument("input_hidden has " + std::to_string(batch.input_hidden.size()) +
                           " values for " + std::to_string(T) + " tokens of hidden size " +
                           std::to_string(H) +
                           (dec_->reads_input_hidden() ? "" : "; this model reads none"));
  }
  for (int32_t r : batch.hidden_rows) {
    if (r < 0 || r >= T) return InvalidArgument("hidden row out of range");
  }
  for (int32_t id : batch.token_ids) {
    if (id >= V || (id < 0 && -(id + 1) >= feed_rows_)) {
      return InvalidArgument(id < 0 ? "fed-back token row " + std::to_string(-(id + 1)) +
                                          " is not a row the previous step sampled on the device"
                                    : "token id out of range");
    }
  }
  const GraphStepPlan graph = PlanGraph(batch);
  const bool graphed = graph.shape.seqs > 0;
  const int set = graphed ? 1 : 0;
  const int rows = graphed ? graph.shape.rows() : T;  // rows the layers computed
  CudaLayersOut out;
  if (graphed) {
    // Sequences with fewer rows than the graph's get pad rows; only the logit rows' order
    // (their gather below) differs from `batch`, whose sampling fields are the same.
    if (graph.padded) {
      const ForwardBatch padded = PadQueryRows(batch, graph.shape.q);
      LLM_ASSIGN_OR_RETURN(out, RunGraph(padded, graph.shape));
    } else {
      LLM_ASSIGN_OR_RETURN(out, RunGraph(batch, graph.shape));
    }
  } else {
    LLM_RETURN_IF_ERROR(Reserve(0, std::max(T, 16)));
    LLM_RETURN_IF_ERROR(UploadInputs(batch, sets_[0]));
    LLM_RETURN_IF_ERROR(dec_->Plan(batch));
    const float* input_hidden = nullptr;
    if (!batch.input_hidden.empty()) {
      const size_t bytes = batch.input_hidden.size() * 4;
      if (input_hidden_.bytes < bytes) LLM_RETURN_IF_ERROR(input_hidden_.Alloc(bytes));
      GPU_RETURN_IF_ERROR(cudaMemcpyAsync(input_hidden_.ptr, batch.input_hidden.data(), bytes,
                                          cudaMemcpyHostToDevice, stream_));
      input_hidden = input_hidden_.as<float>();
    }
    LLM_ASSIGN_OR_RETURN(out, LaunchLayers(batch, 0, T, input_hidden));
  }
  Scratch& s = sets_[set];
  LLM_RETURN_IF_ERROR(last_.Alloc(std::max<size_t>(static_cast<size_t>(R) * H * 2, 64)));
  LLM_RETURN_IF_ERROR(logits_.Alloc(std::max<size_t>(static_cast<size_t>(R) * V * 4, 64)));
  hidden_.clear();
  if (R > 0 || !batch.hidden_rows.empty()) {
    // Final residual add for all rows, then the norm of the sampled rows only.
    cuda::RmsNormArgs fin;
    fin.residual = s.residual.as<float>();
    fin.delta = out.delta;
    fin.delta_scale = out.delta_scale;
    fin.delta_norm = out.delta_norm;
    fin.weight = final_norm_.ptr;
    fin.weight_offset = settings_.norm_weight_offset;
    fin.num_rows = rows;
    fin.hidden = H;
    fin.eps = c.rms_norm_eps;
    fin.out = s.xn.ptr;
    cuda::LaunchAddRmsNorm(fin, stream_);
    if (!batch.hidden_rows.empty()) LLM_RETURN_IF_ERROR(ReadHidden(batch, s));
  }
  if (R > 0) {
    cuda::RmsNormArgs last;  // the sampled rows only, gathered
    last.residual = s.residual.as<float>();
    last.weight = final_norm_.ptr;
    last.weight_offset = settings_.norm_weight_offset;
    last.hidden = H;
    last.eps = c.rms_norm_eps;
    last.delta = nullptr;
    last.delta_scale = nullptr;
    last.delta_norm = nullptr;
    last.rows = s.rows();
    last.num_rows = R;
    last.out = last_.ptr;
    cuda::LaunchAddRmsNorm(last, stream_);
    const void* head = c.tie_word_embeddings ? embed_.ptr : lm_head_.ptr;
    if (comm_ == nullptr) {
      LLM_RETURN_IF_ERROR(GemmBf16(blas_, last_.ptr, head, R, V, H, logits_.ptr, CUDA_R_32F));
    } else {
      LLM_RETURN_IF_ERROR(GatherLogits(head, R));
    }
    if (settings_.final_logit_softcap > 0.f) {  // before the readback and every sampler
      cuda::LaunchSoftCap(logits_.as<float>(), static_cast<int64_t>(R) * V,
                          settings_.final_logit_softcap, stream_);
    }
  }
  bool all_device = batch.device_sampled.size() == static_cast<size_t>(R);
  for (int r = 0; r < R && all_device; ++r) all_device = batch.device_sampled[r] != 0;
  if (batch.masks_deferred) {
    ForwardBatch& d = deferred_.emplace();
    d.logit_rows = batch.logit_rows;
    d.device_sampled = batch.device_sampled;
    d.sampling_jobs = batch.sampling_jobs;
    d.penalty_indptr = batch.penalty_indptr;
    d.penalties = batch.penalties;
    d.mask_words = batch.mask_words;
    feed_rows_ = all_device ? R : 0;
    return -1;
  }
  LLM_ASSIGN_OR_RETURN(int slot, readback_.Issue(batch, logits_.as<float>(), V, stream_));
  feed_rows_ = all_device ? R : 0;
  return slot;
}

Status CudaModelRunner::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                       std::vector<int32_t>* tokens) {
  // A launched forward may still be outstanding (collected after this one); its slot is busy.
  if (launched_.size() > 1) return FailedPrecondition("two launched forwards are outstanding");
  if (deferred_) return FailedPrecondition("the launched forward still waits for its masks");
  if (batch.masks_deferred) return InvalidArgument("masks are deferred only in a launched forward");
  LLM_ASSIGN_OR_RETURN(int slot, Enqueue(batch));
  return readback_.Finish(slot, logits, tokens);
}

Status CudaModelRunner::Launch(const ForwardBatch& batch) {
  if (launched_.size() > 1) return FailedPrecondition("two launched forwards are outstanding");
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    if (batch.device_sampled.size() != batch.logit_rows.size() || !batch.device_sampled[r]) {
      return InvalidArgument("a launched forward must sample every logit row on the device");
    }
  }
  if (!batch.hidden_rows.empty()) {
    return InvalidArgument("a launched forward returns no hidden states (ForwardSampled does)");
  }
  if (deferred_) return FailedPrecondition("the launched forward still waits for its masks");
  LLM_ASSIGN_OR_RETURN(int slot, Enqueue(batch));
  if (!batch.masks_deferred) launched_.push_back(slot);
  return Status::Ok();
}

Status CudaModelRunner::SupplyMasks(std::vector<uint32_t> token_masks) {
  if (!deferred_) return FailedPrecondition("no launched forward waits for masks");
  ForwardBatch batch = std::move(*deferred_);
  deferred_.reset();
  batch.token_masks = std::move(token_masks);
  // Queued after the forward already on the stream: only the sampling waited for the host.
  LLM_ASSIGN_OR_RETURN(int slot,
                       readback_.Issue(batch, logits_.as<float>(), config().vocab_size, stream_));
  launched_.push_back(slot);
  return Status::Ok();
}

Status CudaModelRunner::Collect(std::vector<int32_t>* tokens) {
  if (launched_.empty()) {
    return FailedPrecondition(deferred_ ? "the launched forward still waits for its masks"
                                        : "no launched forward to collect");
  }
  const int slot = launched_.front();
  launched_.pop_front();
  return readback_.Finish(slot, &collect_logits_, tokens);
}

}  // namespace

bool CudaAvailable() {
  return cuda::CudaDeviceCount() > 0;
}

StatusOr<std::unique_ptr<Model>> CreateCudaModel(std::unique_ptr<CudaDecoder> decoder,
                                                 const WeightStore* weights,
                                                 const ModelLoadOptions& options,
                                                 CudaTensorParallelRank tp) {
  if (!CudaAvailable()) return Unavailable("device 'cuda' requested but no CUDA device is present");
  if (weights == nullptr && !options.dummy_weights) {
    return InvalidArgument("a CUDA model needs weights unless dummy_weights is set");
  }
  auto m = std::make_unique<CudaModelRunner>(std::move(decoder));
  LLM_RETURN_IF_ERROR(m->Init(weights, options, tp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace llm
