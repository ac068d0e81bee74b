// The one CUDA model runner: every architecture's forward on the GPU goes through it. It owns the
// compute stream, cuBLAS / cuBLASLt (CudaLinearOps), the input staging (token ids, positions,
// logit rows), the embedding, final norm and LM head, the attention backends the registry picks
// for the definition's AttentionSpec, the KV pool (sized and allocated), the CUDA graphs of
// decode-shaped steps (one per padded batch size and query rows per sequence: one-token decode
// steps and speculative verify steps; graph_step_plan.h), overlapped steps (Launch / Collect with
// fed-back tokens), device sampling and the logits readback. An architecture is a CudaDecoder: its
// layer weights, what its attention needs, and the launches of its layers, written against
// CudaLinear (cuda_linear.h) and the kernels in kernels/cuda. Built only with the CUDA backend.
//
// Definitions: cuda_dense_decoder.h (every per-head K/V architecture of decoder_spec.h: Llama,
// Mistral, Qwen2 / 3, Gemma 2 / 3, Mixtral, Qwen3-MoE; gpt-oss as far as its spec allows),
// cuda_deepseek_decoder.h (DeepSeek V2 / V3: MLA + MoE).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/layers/cuda/cuda_linear.h"
#include "engine/loader/deepseek_config.h"
#include "engine/loader/safetensors.h"
#include "engine/runtime/model.h"
#include "kernels/attention_backend.h"
#include "kernels/backend_registry.h"

namespace llm {

class Communicator;
struct TensorParallelPlan;

// One rank of a tensor-parallel model on the runner (engine/loader/tensor_parallel_plan.h): the
// plan its definition and weights were cut by (the definition is built on plan->local, the
// weights are ShardWeights') and its group's communicator. Both null: the whole model, on the
// path the runner always had (no collective, no extra launch).
struct CudaTensorParallelRank {
  const TensorParallelPlan* plan = nullptr;
  Communicator* comm = nullptr;
};

// What the runner lends a definition while it loads.
struct CudaLoadContext {
  const ModelLoadOptions* options = nullptr;
  const WeightStore* weights = nullptr;  // null: dummy weights
  Bf16WeightLoader* loader = nullptr;
  const CudaLinearOps* ops = nullptr;
  WeightQuant weight_quant = WeightQuant::kBf16;  // for the projections (ModelLoadOptions)
  // A pre-quantized fp8 checkpoint whose e4m3 projections the definition keeps as they are
  // (CudaLinear::LoadCheckpoint; weight_quant then applies to its unquantized projections).
  bool fp8_checkpoint = false;
  int device_arch = 0;  // e.g. 90
  // A tensor-parallel rank's group (CudaTensorParallelRank), or null: the definition all-reduces
  // the outputs of its row-split projections on the runner's stream.
  Communicator* comm = nullptr;
  const TensorParallelPlan* plan = nullptr;  // its plan (with comm), or null
};

// One step's activations that the runner owns, in the scratch set the step runs on (eager, or the
// fixed set that decode graphs capture).
struct CudaStep {
  int set = 0;                          // 0 eager, 1 graph (a definition keeps one scratch per set)
  int rows = 0;                         // rows to compute: the batch's tokens, or a graph's rows
  const ForwardBatch* batch = nullptr;  // the step (a captured step's first instance)
  const int32_t* positions = nullptr;   // device [rows]
  float* residual = nullptr;            // fp32 [rows, hidden]: the embedding, layers add into it
  void* xn = nullptr;                   // bf16 [rows, hidden] scratch (norm outputs)
  // fp32 [rows, hidden] on the device: ForwardBatch::input_hidden (an MTP layer), else null.
  const float* input_hidden = nullptr;
};

// The last layer's output, not yet in the residual: the runner's final norm adds it.
struct CudaLayersOut {
  const void* delta = nullptr;         // bf16 [rows, hidden]
  const float* delta_scale = nullptr;  // [rows] row scales (raw fp8 GEMM output) or null
  const void* delta_norm = nullptr;    // bf16 [hidden]: the branch's own norm first, or null
};

// What an architecture changes around its layers, in the runner's embedding, final norm and LM
// head (DecoderSpec's model-level fields; Gemma's values in the comments).
struct CudaModelSettings {
  float embed_scale = 1.0f;          // the embedding rows times this (sqrt(hidden))
  float norm_weight_offset = 0.0f;   // the final norm scales by (offset + w) (1)
  float final_logit_softcap = 0.0f;  // logits -> cap * tanh(logits / cap); 0: none (Gemma 2)
  // The embedding, final norm and LM head tensors (an MTP layer names its own or the model's).
  std::string embed_tokens = "model.embed_tokens.weight";
  std::string final_norm = "model.norm.weight";
  std::string lm_head = "lm_head.weight";
};

// An architecture on the runner.
class CudaDecoder {
 public:
  virtual ~CudaDecoder() = default;
  virtual const ModelConfig& config() const = 0;
  // Valid after AttentionNeeds.
  virtual CudaModelSettings settings() const { return {}; }
  // Log name, e.g. "llama" or "deepseek".
  virtual const char* name() const = 0;
  // Checks what the definition computes under the options and declares what its attention
  // needs, before any weight is read: an unsupported combination fails first.
  virtual StatusOr<AttentionSpec> AttentionNeeds(const CudaLoadContext& ctx) = 0;
  // The registry's choice for that spec (BackendRegistry::CreateBackends), on the runner's stream.
  virtual Status UseAttention(AttentionBackends backends) = 0;
  // Loads the layers (after the runner's embedding, final norm and LM head; before the KV pool).
  virtual Status Load(const CudaLoadContext& ctx) = 0;
  // The decode backend: its name, BlockBytes and graph support are the model's.
  virtual AttentionBackend& attention() = 0;
  virtual std::string kv_cache_dtype_name() const = 0;
  // The runner's KV cache, one view per layer in the spec's layout (KvCacheLayout); the
  // definition adds what it owns beside it (static 8-bit scales).
  virtual Status BindCache(const CudaLoadContext& ctx, const std::vector<KvCacheLayer>& layers) = 0;
  // Whether a decode step's layers never wait for the host (no device-to-host copy or sync), so
  // the runner may capture them in CUDA graphs (the attention backend must support them too).
  virtual bool graph_safe() const = 0;
  // Activations of scratch set `set` for `rows` rows (a multiple of 16). The graph set is
  // reserved once, before the first capture: captured graphs hold its pointers.
  virtual Status Reserve(int set, int rows) = 0;
  // Host-side planning of an eager step (attention plans, uploads the layers need).
  virtual Status Plan(const ForwardBatch& batch) = 0;
  // A decode-shaped step padded to `shape` (shape.rows() rows), in graph form
  // (AttentionBackend::PlanGraph).
  virtual Status PlanGraph(const ForwardBatch& batch, GraphShape shape) {
    return attention().PlanGraph(batch.attn, shape);
  }
  // Every layer over step.rows rows (the residual holds the embedding).
  virtual StatusOr<CudaLayersOut> RunLayers(const CudaStep& step) = 0;
  // An extra clause of the load summary (e.g. "2 MoE"), or empty.
  virtual std::string Summary() const { return ""; }
  // Whether Load honours CudaLoadContext::fp8_checkpoint; otherwise the loader dequantizes a
  // pre-quantized checkpoint's weights to bf16 (then weight_quant).
  virtual bool keeps_checkpoint_fp8() const { return false; }
  // Whether the layers read CudaStep::input_hidden (an MTP layer): the runner then requires
  // ForwardBatch::input_hidden, one row per token, and runs such steps eagerly.
  virtual bool reads_input_hidden() const { return false; }
  virtual bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) {
    (void)trace;
    return false;
  }
  // Whether the definition computes a tensor-parallel rank (CudaLoadContext::comm); the runner
  // refuses a rank of one that does not, naming it.
  virtual bool computes_tensor_parallel() const { return false; }
};

// weights may be null when options.dummy_weights is set: tensors are then filled on the device
// with deterministic random values (benchmarking models too large to ship). A tensor-parallel
// rank (tp set): the model's configuration is tp.plan->model, the embedding looks up the rank's
// vocabulary rows (zeros elsewhere, all-reduced), the LM head's slices are all-gathered before
// the soft-cap, sampling and readback, and the decode steps replay CUDA graphs only where the
// communicator is capturable(). The calling thread's device is the rank's.
StatusOr<std::unique_ptr<Model>> CreateCudaModel(std::unique_ptr<CudaDecoder> decoder,
                                                 const WeightStore* weights,
                                                 const ModelLoadOptions& options,
                                                 CudaTensorParallelRank tp = {});

// The dense family (cuda_dense_decoder.cc: every per-head K/V architecture) and DeepSeek V2 / V3
// (cuda_deepseek_decoder.cc) on the runner.
// A tensor-parallel rank of the dense family: config is tp.plan->local, weights the rank's.
StatusOr<std::unique_ptr<Model>> CreateCudaDenseModel(const ModelConfig& config,
                                                      const WeightStore* weights,
                                                      const ModelLoadOptions& options,
                                                      CudaTensorParallelRank tp = {});
StatusOr<std::unique_ptr<Model>> CreateCudaDeepseekModel(const DeepseekConfig& config,
                                                         const WeightStore* weights,
                                                         const ModelLoadOptions& options);

// True when this build has the CUDA backend and a device is present.
bool CudaAvailable();

}  // namespace llm
