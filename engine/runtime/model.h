// The model-runner interface: one forward pass over a flattened batch of prefill and decode tokens.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/layers/moe_router.h"
#include "engine/loader/model_config.h"
#include "kernels/attention_backend.h"
#include "kernels/cuda/sampling/sampling.h"

namespace llm {

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // [num_tokens]
  std::vector<int32_t> positions;   // [num_tokens]
  AttentionBatch attn;              // block tables and slots for the same tokens
  std::vector<int32_t> logit_rows;  // rows of the batch whose logits are wanted
  // Hidden states (Model::returns_hidden_states): the rows whose last hidden state the forward
  // keeps for Model::hidden_states(), after the final norm (what the LM head reads; DeepSeek's
  // MTP layer reads the target's so) or, with hidden_before_final_norm, before it (what an MTP
  // layer hands to its own next step).
  std::vector<int32_t> hidden_rows;
  bool hidden_before_final_norm = false;
  // A network that reads a hidden state beside each token (an MTP layer): [num_tokens, hidden]
  // row-major, one row per token; empty for every other model.
  std::vector<float> input_hidden;
  // Device sampling (only filled for a model whose samples_on_device() is true): per logit row,
  // 1 if the row wants a token, not logits, drawn from sampling_jobs[r] with the penalty entries
  // penalties[penalty_indptr[r] .. penalty_indptr[r + 1]) (kernels/cuda/sampling/sampling.h). Rows
  // that need their logits (logprobs, a logits observer) are 0. Empty: every row returns logits.
  std::vector<uint8_t> device_sampled;     // [logit_rows]
  std::vector<SamplingJob> sampling_jobs;  // [logit_rows]
  std::vector<int32_t> penalty_indptr;     // [logit_rows + 1]
  std::vector<PenaltyEntry> penalties;     // CSR values
  // Structured outputs on device-sampled rows: SamplingJob::mask_row indexes rows of mask_words
  // words here (kernels/cuda/sampling/sampling.h; bits past the vocabulary are 0).
  std::vector<uint32_t> token_masks;
  int mask_words = 0;
  // Launch only: the masks are not in token_masks yet. The constrained rows' masks depend on the
  // tokens the previous step is still sampling, so the engine computes them while this forward
  // runs and hands them to SupplyMasks, which queues the sampling (mask_words and each job's
  // mask_row are set already).
  bool masks_deferred = false;

  // Logit row r's mask, or null (no job, or an unconstrained one).
  const uint32_t* mask_of(size_t r) const {
    const int32_t m = r < sampling_jobs.size() ? sampling_jobs[r].mask_row : -1;
    return m < 0 ? nullptr : token_masks.data() + static_cast<size_t>(m) * mask_words;
  }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // logits: [logit_rows.size(), vocab_size], resized by the call.
  virtual Status Forward(const ForwardBatch& batch, std::vector<float>* logits) = 0;
  // Forward, sampling the device_sampled rows where the model can: tokens[r] >= 0 is the token of
  // logit row r, whose logits are then not filled. The default computes every row's logits and
  // leaves tokens empty (the engine samples them on the host, by the same definition).
  virtual Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                std::vector<int32_t>* tokens) {
    tokens->clear();
    return Forward(batch, logits);
  }
  // Whether ForwardSampled samples device_sampled rows (the engine builds jobs only then).
  virtual bool samples_on_device() const { return false; }
  // Whether a forward keeps the hidden states of ForwardBatch::hidden_rows; hidden_states() is
  // then [hidden_rows.size(), hidden_size] of the last Forward / ForwardSampled, valid until the
  // next one. False (the default): hidden_rows must be empty.
  virtual bool returns_hidden_states() const { return false; }
  virtual std::span<const float> hidden_states() const { return {}; }

  // Overlapped steps, for models that sample on the device. Launch queues a forward whose logit
  // rows are all device_sampled and returns without waiting for it; Collect waits for the oldest
  // launched forward and returns its tokens, one per logit row. At most one launched forward may
  // be outstanding when the next forward (Launch or ForwardSampled) is issued.
  // Fed-back tokens: token_ids[t] = -(r + 1) stands for the token that the previous forward
  // sampled at its logit row r, read on the device, so that step k + 1 can be queued before step
  // k's tokens reach the host. The previous forward must have sampled all its rows on the device.
  virtual bool supports_overlap() const { return false; }
  virtual Status Launch(const ForwardBatch& batch) {
    (void)batch;
    return Unimplemented("this model cannot overlap steps");
  }
  virtual Status Collect(std::vector<int32_t>* tokens) {
    (void)tokens;
    return Unimplemented("this model cannot overlap steps");
  }
  // After Launch of a batch with masks_deferred: the masks ([mask rows, mask_words]), with which
  // the launched forward's sampling is queued. Every model that overlaps steps takes them; until
  // they come, that forward cannot be collected.
  virtual Status SupplyMasks(std::vector<uint32_t> token_masks) {
    (void)token_masks;
    return Unimplemented("this model cannot overlap steps");
  }
  virtual std::string attention_backend_name() const = 0;
  virtual int num_kv_blocks() const = 0;  // 0 until a deferred cache is allocated
  // A model loaded with ModelLoadOptions::defer_kv_cache has no KV cache until this call, which
  // allocates `num_blocks` blocks (a draft model: the target's block count, so both caches are
  // indexed by the same block ids). FailedPrecondition when the model has a cache already.
  virtual Status AllocateKvCache(int num_blocks) {
    (void)num_blocks;
    return Unimplemented("this model cannot allocate its KV cache after loading");
  }
  virtual size_t kv_bytes_per_block() const = 0;  // all layers, K and V
  // Element type (and 8-bit scaling) of the KV cache, for logs and GetModelInfo.
  virtual std::string kv_cache_dtype_name() const { return "float32"; }
  // Forward passes whose layers ran from a captured CUDA graph (0 for models without graphs).
  virtual int64_t graph_steps() const { return 0; }
  // Opt-in routing record (tests, diagnosis): while `trace` is set, every forward appends one
  // decision per (batch row, MoE layer) to it; the caller empties it. Null (the default) records
  // nothing and costs nothing. False: the model has no routing to record.
  virtual bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) {
    (void)trace;
    return false;
  }
};

struct ModelLoadOptions {
  std::string model_dir;
  int block_size = 64;
  int num_kv_blocks = 0;  // 0: derive from kv_cache_bytes
  size_t kv_cache_bytes = 256ull << 20;
  // Bytes per block that another model keeps under the same block ids (a draft model's KV in
  // the target's blocks): a block count derived from the memory budget divides it by
  // kv_bytes_per_block() + this, so that both caches fit.
  size_t extra_kv_bytes_per_block = 0;
  // No KV cache at load: the caller allocates it with Model::AllocateKvCache once it knows the
  // block count (a draft model, whose count is its target's). The CUDA runner refuses it with
  // a static 8-bit cache (its scales are bound with the cache, from the weights).
  bool defer_kv_cache = false;
  std::string attention_backend;  // forced backend name, empty for automatic
  // KV cache element type and scales (engine/loader/kv_cache_quant.h): "auto" (fp32 on CPU),
  // "int8", "fp8_e4m3" (static scales, per_head or per_channel), "fp8_e4m3_dynamic".
  std::string kv_cache_dtype = "auto";
  std::string kv_scale_granularity = "per_head";
  std::string kv_scales_file;  // llm-calibrate-kv output; empty: scales from the checkpoint
  // "cpu", "cuda", or "auto" (cuda when this build has it and a device is present).
  std::string device = "cpu";
  // Ranks the model is split across (engine/loader/tensor_parallel_plan.h): 1, 2, 4 or 8. Above 1,
  // LoadModel returns a TensorParallelModel over that many ranks, each in its own thread: on the
  // cpu device with the in-process communicator; on the cuda device (the dense families without
  // MoE layers; the others are refused by name) rank r on device r with NCCL, refused naming the
  // device count where fewer than N devices are present. Each rank sizes its own KV cache from
  // num_kv_blocks / kv_cache_bytes / gpu_memory_fraction (a rank's blocks hold its heads' share,
  // so a budget holds more of them).
  int tensor_parallel_size = 1;
  // Tests only (no server flag): the cuda ranks all on device 0, through the device-local
  // communicator (engine/runtime/cuda/device_local_communicator.h; eager steps, no CUDA graphs),
  // so that a split model is testable on one GPU. Needs num_kv_blocks.
  bool tensor_parallel_one_device = false;
  double gpu_memory_fraction = 0.85;  // of the memory free after weights, for the KV pool
  // The most rows one eager step brings (EngineCore: the scheduler's max_batched_tokens). The
  // CUDA runner reserves its step scratch for them before the KV pool takes its fraction of the
  // free memory, so that a full prefill chunk cannot fail on memory the pool took. 0: the
  // scratch grows on first use.
  int max_step_rows = 0;
  // Fill the config's tensors with deterministic random values on the device instead of reading
  // model.safetensors (benchmarking models too large to ship). CUDA only.
  bool dummy_weights = false;
  // Decode-only steps of up to this many sequences replay a CUDA graph captured per padded batch
  // size (1, 2, 4, then multiples of 8; engine/runtime/graph_step_plan.h) when the attention
  // backend supports it; 0 disables.
  int cuda_graph_max_batch = 256;
  // Decode-shaped steps whose sequences have up to this many query rows each also replay graphs,
  // one per (padded batch size, rows): speculative verify steps (1 + K rows; EngineCore sets it
  // from SpeculativeConfig, a draft model gets 2 for its catch-up steps). Graphs of more than one
  // row are captured on first use, except those of this many rows, which the warm-up captures
  // too. 1: one-token decode steps only.
  int cuda_graph_max_query_rows = 1;
  // Capture every one of those graphs while loading (vLLM and TensorRT-LLM do it at start-up), so
  // no request pays for a bucket's first eager step, its fp8 GEMM tuning and its capture;
  // false: each is captured on its first decode step.
  bool cuda_graph_warmup = true;
  // Steps of up to this many rows (decode batches of 1 to 4, a batch-1 verify step of up to 3
  // drafts) apply their bf16 projection weights through the small-batch GEMVs
  // (kernels/cuda/ops/dense_gemv.h, at most kDenseGemvMaxRows) where those are faster than cuBLAS
  // (one row; up to four on small weights: cuda::DenseGemvPreferred); 0: cuBLAS for every step
  // (benchmarks compare the two). CUDA only.
  int dense_gemv_max_rows = 4;
  // Attention family for steps with a prefill chunk (CUDA): "auto" (the registry's fitting family
  // of highest prefill_priority, cuda_fmha for a 16-bit cache), "none" (the decode backend), or a
  // backend name that shares the decode backend's cache layout. The cpu device takes auto / none.
  std::string prefill_attention_backend = "auto";
  // Projection weights on the GPU (CUDA models): "auto"/"bf16", or "fp8": e4m3 with one scale per
  // tensor (per expert for MoE experts), activations quantized per row (token) at run time,
  // cuBLASLt fp8 GEMMs (embedding, norms, LM head, DeepSeek's router and kv_b_proj stay bf16).
  // A pre-quantized fp8 checkpoint keeps its e4m3 bytes and scales under "auto" and "fp8"
  // (CudaLinear::LoadCheckpoint); "bf16" dequantizes it.
  std::string weight_dtype = "auto";
  // Routed experts a checkpoint stores as MXFP4 (gpt-oss) on CUDA: "mxfp4" keeps its e2m1 values
  // and e8m0 scales for the MXFP4 grouped GEMMs (a quarter of the bf16 bytes per step; the load
  // fails naming what those do not serve; beside weight_dtype "fp8", which then quantizes the
  // other projections), "bf16" dequantizes them at load, and "auto" keeps them where the MXFP4
  // GEMMs serve them and dequantizes them (logged) where not (CudaMoeLayer::Mxfp4::kAuto).
  // "mxfp4" fails the load of a model without MXFP4 experts, and on the cpu device.
  std::string moe_weight_dtype = "auto";
  // Activations of fp8 routed experts on CUDA (CudaMoeLayer::ActivationDtype): "fp8" quantizes
  // them to e4m3 (per token and 128-wide k group beside 128x128 block-scaled weights, as
  // DeepSeek-V3; per token beside per-row or per-tensor scales) for the W8A8 grouped GEMMs on the
  // e4m3 tensor cores, and the load fails naming what those do not serve (experts not fp8,
  // shapes not multiples of 128, a device or build without sm_89+ e4m3 mma; a checkpoint's
  // static input_scale, where it has one, replaces the per-token scales); "auto" does so
  // where they serve a layer (else bf16 activations, logged) for batches of at least
  // CudaMoeLayer::kAutoW8a8MinTokens tokens (prompt chunks), and keeps bf16 activations for
  // decode-sized batches, where the W8A16 GEMMs are the faster form; "bf16" keeps bf16
  // activations (the W8A16 GEMMs: each weight widened to bf16). "fp8" fails the load of a model
  // without routed experts, and on the cpu device.
  std::string moe_activation_dtype = "bf16";
  // fp8 weights only: cuBLASLt fast accumulation for the fp8 projections (CudaFp8Gemm::Init). On
  // by default, as in vLLM's and TensorRT-LLM's fp8 GEMMs: prompt steps are faster with it
  // (docs/KERNEL_SELECTION.md); its error is bounded by tests/gpu/test_fp8_weights.cc.
  bool fp8_fast_accumulation = true;
  // fp8 weights with a static int8 / fp8 KV cache (CUDA Llama; ignored otherwise): the attention
  // kernel writes o_proj's e4m3 input itself, with one static scale per layer (the cache's V
  // bound: qmax x the largest V scale, which no attention output can exceed), instead of a bf16
  // output and a per-row quantization pass (one pass and one bf16 round trip fewer per layer);
  // false: the per-row pass.
  bool fp8_static_attention_output = true;
  // MLA decode kernel of the CUDA DeepSeek model (kernels/cuda/mla/mla_decode.h MlaKernel): "auto"
  // (the sm_90a wgmma kernels where they run: every bf16 work item, fp8 16-row items), "wgmma"
  // (the same; the load fails where it cannot run: not compute capability 9.0, or no sm_90a in
  // the build), "portable" (every item on the portable kernel). Applied by the registry
  // (AttentionBackend::Configure); the cpu device refuses a value other than "auto", and so does
  // the registry where decode steps attend through another family than cuda_mla (the dense CUDA
  // models).
  std::string mla_kernel = "auto";
  // Prefill attention of the cuda_c8 backend over an 8-bit cache (CUDA Llama): "tiles" (the C8
  // prefill tiles), "fmha" (the prefill sequences through the sm_90a wgmma FMHA kernel over a bf16
  // copy of their cached K/V, dequantized each step; the load fails where it cannot run: a 16-bit
  // cache, not compute capability 9.0, no sm_90a in the build), "auto" (fmha where it runs, else
  // the tiles). Applied by the registry (AttentionBackend::Configure); the cpu device refuses a
  // value other than "auto", and so does the registry where prefill chunks attend through another
  // family than cuda_c8 (a 16-bit cache's cuda_fmha prefill backend, DeepSeek's cuda_mla).
  std::string c8_prefill = "auto";
};

// The values of ModelLoadOptions' string choices; the server's option table offers these.
inline constexpr const char* kDeviceChoices[] = {"cpu", "cuda", "auto"};
inline constexpr const char* kWeightDtypeChoices[] = {"auto", "bf16", "fp8"};
inline constexpr const char* kMoeWeightDtypeChoices[] = {"auto", "bf16", "mxfp4"};
inline constexpr const char* kMoeActivationDtypeChoices[] = {"auto", "bf16", "fp8"};
inline constexpr const char* kMlaKernelChoices[] = {"auto", "wgmma", "portable"};
inline constexpr const char* kC8PrefillChoices[] = {"auto", "tiles", "fmha"};

// InvalidArgument naming `option` unless `value` is one of `choices`.
Status CheckChoice(const char* option, const std::string& value,
                   std::span<const char* const> choices);
// "cpu" or "cuda": the device ModelLoadOptions::device ("auto" included) loads onto.
std::string ResolveDevice(const std::string& device);

// Loads config + weights and selects the attention backend (logging the selection table).
StatusOr<std::unique_ptr<Model>> LoadModel(const ModelLoadOptions& options);
class Communicator;
// Rank comm->rank() of the model in options.model_dir split comm->size() ways
// (engine/loader/tensor_parallel_plan.h), on the cpu or cuda device, for the thread that runs that
// rank (on cuda: with the rank's device current): every rank's Forward must be called with the
// same batch (they meet in collectives). Refused (the status names it): the plan's refusals, a
// synthetic model, a kv_cache_dtype other than auto, float32 or fp32; on cuda also DeepSeek (MLA)
// and the MoE architectures (Mixtral, Qwen3-MoE, gpt-oss). Size 1 is LoadModel's model. Ignores
// options.tensor_parallel_size (the group is comm's); a cuda rank captures no graph at load.
StatusOr<std::unique_ptr<Model>> LoadTensorParallelRank(const ModelLoadOptions& options,
                                                        Communicator* comm);
// The multi-token-prediction layer of the checkpoint in options.model_dir as a Model of its own
// (--speculative-method mtp): DeepSeek-V3's first MTP layer on the cpu or cuda runner, which
// reads ForwardBatch::input_hidden. InvalidArgument naming what is missing for another
// architecture, a config without num_nextn_predict_layers (or more than one), or a checkpoint
// without the layer's weights.
StatusOr<std::unique_ptr<Model>> LoadMtpModel(const ModelLoadOptions& options);

}  // namespace llm
