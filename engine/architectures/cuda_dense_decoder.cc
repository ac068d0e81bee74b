#include "engine/architectures/cuda_dense_decoder.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <spdlog/spdlog.h>

#include "base/dtype.h"
#include "base/quant.h"
#include "engine/architectures/decoder_spec.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "engine/layers/mha_attention_spec.h"
#include "engine/loader/kv_cache_quant.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/communicator.h"
#include "kernels/backend_registry.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ops/elementwise_ops.h"
#include "kernels/cuda/ops/fp8_quant.h"
#include "kernels/fmha/fmha_launcher.h"

namespace llm {
namespace {

// The four projections of a layer, indexing LayerWeights::proj and the activations' row scales.
enum Proj { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kNumProj = 4 };

struct LayerWeights {
  // The four RMSNorms of DecoderLayerSpec (bf16 [hidden]); an unnamed one stays empty (null).
  DeviceBuffer attn_in_norm, attn_out_norm, ffn_in_norm, ffn_out_norm;
  DeviceBuffer bqkv;            // bf16
  DeviceBuffer bo;              // bf16 [hidden] o_proj bias (DecoderLayerSpec::o_bias)
  DeviceBuffer sinks;           // fp32 [num_q_heads] learned sink logits (DecoderLayerSpec::sinks)
  DeviceBuffer q_norm, k_norm;  // bf16 [head_dim] (DecoderLayerSpec::qk_norm)
  DeviceBuffer inv_freq;        // fp32 [head_dim / 2]: this layer's rotary
  CudaLinear proj[kNumProj];    // a MoE layer loads only kQkv and kO
  bool moe = false;             // DecoderLayerSpec::Ffn::kMoe: the experts below, not the MLP
  CudaMoeWeights experts;
};

struct LayerCache {
  KvCacheLayer kv;                // the runner's cache of this layer, with the static scales
  DeviceBuffer k_scale, v_scale;  // static scales (fp32)
  // fp8 weights over a static 8-bit cache (ModelLoadOptions::fp8_static_attention_output): the
  // attention writes o_proj's e4m3 input as out * out_inv (out_inv = 448 / V bound), and
  // out_scale holds 1 / out_inv for the GEMM. out_inv 0: a per-row quantization pass instead.
  DeviceBuffer out_scale;
  float out_inv = 0.f;
};

// Activations of the layers for `cap` rows (the runner holds the residual and the norm output).
struct Scratch {
  DeviceBuffer qkv, q, k, v, attn, tmp, gate_up, act;
  // fp8 weights: the e4m3 input of the current projection, and per projection the row scales
  // of its input [kNumProj][cap], which the projection's consumer applies to its output;
  // apply_scales: the scales of an input that the projection quantizes itself (CudaLinear::Apply:
  // static input scales, 1x128 blocks), [ceil(max k / 128)][cap].
  DeviceBuffer xq, row_scales, apply_scales;
  CudaMoeScratch moe;  // MoE layers (their router's fp32 input too)
  int cap = 0;
  Status Reserve(const ModelConfig& c, int tokens, bool fp8, cudaStream_t stream);
  cuda::Fp8Rows Fp8In(Proj proj) const {
    return {xq.ptr, row_scales.as<float>() + static_cast<size_t>(proj) * cap};
  }
};

class CudaDenseDecoder final : public CudaDecoder {
 public:
  explicit CudaDenseDecoder(const ModelConfig& config) : config_(config) {}
  const ModelConfig& config() const override { return config_; }
  const char* name() const override { return "dense"; }
  CudaModelSettings settings() const override {
    CudaModelSettings s;
    s.embed_scale = layers_spec_.embed_scale;
    s.norm_weight_offset = layers_spec_.norm_weight_offset;
    s.final_logit_softcap = layers_spec_.final_logit_softcap;
    return s;
  }
  StatusOr<AttentionSpec> AttentionNeeds(const CudaLoadContext& ctx) override;
  Status UseAttention(AttentionBackends backends) override;
  Status Load(const CudaLoadContext& ctx) override;
  AttentionBackend& attention() override { return *attention_.decode; }
  std::string kv_cache_dtype_name() const override {
    std::string s = DTypeName(spec_.kv_dtype);
    if (spec_.kv_quant != KvQuant::kNone) s += std::string("/") + KvQuantName(spec_.kv_quant);
    return s;
  }
  Status BindCache(const CudaLoadContext& ctx, const std::vector<KvCacheLayer>& layers) override;
  bool graph_safe() const override { return true; }
  bool computes_tensor_parallel() const override { return true; }
  bool keeps_checkpoint_fp8() const override { return true; }
  Status Reserve(int set, int rows) override {
    if (moe_) LLM_RETURN_IF_ERROR(moe_->Reserve(rows, &scratch_[set].moe));
    return scratch_[set].Reserve(config_, rows, fp8_, ops_->stream);
  }
  Status Plan(const ForwardBatch& batch) override;
  // Graph steps (one-token decode steps and verify steps of up to 1 + K rows per sequence) all
  // attend through the decode backend, whatever their rows.
  Status PlanGraph(const ForwardBatch& batch, GraphShape shape) override {
    step_attention_ = attention_.decode.get();
    return step_attention_->PlanGraph(batch.attn, shape);
  }
  StatusOr<CudaLayersOut> RunLayers(const CudaStep& step) override;
  std::string Summary() const override {
    const int n = static_cast<int>(
        std::count_if(layers_spec_.layers.begin(), layers_spec_.layers.end(),
                      [](const auto& L) { return L.ffn == DecoderLayerSpec::Ffn::kMoe; }));
    return n > 0 ? std::to_string(n) + " MoE" : std::string();
  }
  // Each MoE layer copies its top-k ids back and waits for them; eager steps only (the runner
  // runs no graphs while a trace is set, and CudaMoeLayer::Run refuses one inside a capture).
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    if (!moe_) return false;
    routing_trace_ = trace;
    return true;
  }

 private:
  // A layer projection y[T, n] = x[T, k] W^T (bf16 out). bf16 weights: cuBLAS on x. fp8 weights
  // with dynamic row inputs: x is ignored; the input is Fp8In(s, layer, proj), which x's producer
  // wrote, and y is the product; per-tensor weights leave the input's row scales out
  // (RowScales holds them for y's consumer). Other fp8 weights quantize x themselves (Apply).
  // x_scale: the fp8 input's scale (a device scalar); null: 1, the row scales come after.
  Status Project(Scratch& s, int layer, Proj proj, const void* x, int T, void* y,
                 const float* x_scale = nullptr) {
    const CudaLinear& w = layers_[layer]->proj[proj];
    if (!w.fp8()) return w.RunBf16(*ops_, x, T, y);
    if (!w.takes_fp8_rows()) return w.Apply(*ops_, x, T, y, {s.xq.ptr, s.apply_scales.as<float>()});
    return w.RunFp8(*ops_, s.xq.ptr, x_scale, T, y, 0, s.Fp8In(proj).scale);
  }
  // The fp8 input of proj (what the producer of x writes), or nothing (x in bf16).
  cuda::Fp8Rows Fp8In(const Scratch& s, int layer, Proj proj) const {
    return layers_[layer]->proj[proj].takes_fp8_rows() ? s.Fp8In(proj) : cuda::Fp8Rows{};
  }
  // A tensor-parallel rank: the partial sums of a row-split projection's (o_proj, down_proj, a
  // MoE layer) bf16 output y[T, hidden] summed over the ranks, in place, on the stream (nothing
  // for the whole model). An fp8 projection whose raw output lacks its input's row scales gets
  // them first: they are this rank's (the absmax of its slice of the input), so the partial sums
  // are only summable once scaled. `scaled`: the GEMM applied a static input scale already.
  Status AllReduce(Scratch& s, int layer, Proj proj, void* y, int T, bool scaled = false) const {
    if (comm_ == nullptr) return Status::Ok();
    const int H = config_.hidden_size;
    const float* pending = scaled ? nullptr : UnappliedRowScales(s, layer, proj);
    if (pending != nullptr) cuda::LaunchScaleRowsBf16(y, pending, T, H, ops_->stream);
    return comm_->AllReduceSum(y, static_cast<size_t>(T) * H, DType::kBF16, ops_->stream);
  }
  // The row scales that proj's output still needs (null where the GEMM applied them, and for a
  // rank's row-split projections, whose outputs AllReduce scaled).
  const float* RowScales(const Scratch& s, int layer, Proj proj) const {
    if (comm_ != nullptr && (proj == kO || proj == kDown)) return nullptr;
    return UnappliedRowScales(s, layer, proj);
  }
  // The row scales that the GEMM left out of proj's output (null where it applied them; a MoE
  // layer's down_proj is no projection of this layer: null).
  const float* UnappliedRowScales(const Scratch& s, int layer, Proj proj) const {
    return layers_[layer]->proj[proj].raw_output() ? Fp8In(s, layer, proj).scale : nullptr;
  }

  ModelConfig config_;
  DecoderSpec layers_spec_;  // the architecture's layers, as the CPU decoder computes them
  const CudaLinearOps* ops_ = nullptr;
  Communicator* comm_ = nullptr;  // a tensor-parallel rank's group (CudaLoadContext::comm)
  bool fp8_ = false;  // weight_dtype "fp8" or a pre-quantized checkpoint's fp8 projections
  std::vector<std::unique_ptr<LayerWeights>> layers_;
  std::vector<std::unique_ptr<LayerCache>> cache_;
  // The MoE layers' one definition (every MoE layer of these architectures routes alike); null
  // without MoE layers.
  std::unique_ptr<CudaMoeLayer> moe_;
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
  // The registry's choice: the decode backend, and a second family on the same cache for steps
  // with a prefill chunk where it has one.
  AttentionBackends attention_;
  AttentionBackend* step_attention_ = nullptr;  // the one this step planned
  AttentionSpec spec_;
  KvCacheType kv_;
  Scratch scratch_[2];  // eager, graph
};

// What of a DecoderSpec this definition computes; the rest is refused by name at load.
Status CheckComputable(const ModelConfig& c, const DecoderSpec& spec) {
  auto refuse = [&](const std::string& what) {
    return Unimplemented(c.architecture_name + ": " + what +
                         " is not implemented on the cuda device; use device cpu");
  };
  for (const DecoderLayerSpec& L : spec.layers) {
    if (L.attn_in_norm.empty() || L.ffn_in_norm.empty()) return refuse("a layer without pre-norms");
    if (L.ffn == DecoderLayerSpec::Ffn::kMoe) {
      // The MoE layer: Mixtral / Qwen3-MoE (SiLU experts, per-expert tensors) and gpt-oss
      // (router bias, softmax of the selected logits, stacked experts with biases, clamped
      // SwiGLU); its Check refuses the rest.
      const MoeTensorNames& n = L.moe_names;
      if (n.expert_bias && !n.stacked_experts) return refuse("per-expert tensors with biases");
      if (!n.selection_bias.empty()) return refuse("a router selection bias");
      // gpt-oss's MXFP4 experts (a rank's 1440 of 2880 included) need multiples of 32 only where
      // kept as stored; the layer's Load checks the bf16 GEMMs' shapes where it dequantizes them.
      const bool mxfp4 =
          n.stacked_experts && c.quantization.method == WeightQuantization::Method::kMxfp4;
      LLM_RETURN_IF_ERROR(CudaMoeLayer::Check(L.routing, c.hidden_size, L.moe_intermediate,
                                              L.shared_intermediate, L.gate, mxfp4));
    } else if (L.gate.activation != CpuMlp::Activation::kSilu &&
               L.gate.activation != CpuMlp::Activation::kGeluTanh) {
      return refuse("the MLP activation");
    }
    if (L.mlp_bias) return refuse("mlp_bias");
    if (L.qk_norm && (c.head_dim % 8 != 0 || c.head_dim > cuda::kMaxQkNormHeadDim)) {
      return refuse("q/k norm over head_dim " + std::to_string(c.head_dim) +
                    " (needs a multiple of 8, at most " + std::to_string(cuda::kMaxQkNormHeadDim) +
                    ")");
    }
  }
  return Status::Ok();
}

// The start-up table of the layer types (window, soft-cap, rotary base) and the backend that
// serves them: one backend serves every layer, so it must list the union of their features.
void LogLayerTypes(const DecoderSpec& spec, const std::string& backend) {
  std::map<std::string, int> types;
  for (const DecoderLayerSpec& L : spec.layers) {
    std::string t = L.window_left >= 0
                        ? "sliding (window " + std::to_string(L.window_left + 1) + ")"
                        : std::string("global");
    if (L.logit_softcap > 0.f) t += ", soft-cap " + std::to_string(L.logit_softcap);
    if (L.qk_norm) t += ", q/k norm";
    if (L.sinks) t += ", sink logits";
    ++types[t];
  }
  for (const auto& [t, n] : types) {
    spdlog::info("cuda model: {} layer(s) {} attend through {}", n, t, backend);
  }
}

StatusOr<AttentionSpec> CudaDenseDecoder::AttentionNeeds(const CudaLoadContext& ctx) {
  const ModelConfig& c = config_;
  const ModelLoadOptions& options = *ctx.options;
  LLM_ASSIGN_OR_RETURN(layers_spec_, MakeDecoderSpec(c));
  LLM_RETURN_IF_ERROR(CheckComputable(c, layers_spec_));
  for (const DecoderLayerSpec& L : layers_spec_.layers) {
    if (L.ffn != DecoderLayerSpec::Ffn::kMoe) continue;
    if (!moe_) {
      moe_ = std::make_unique<CudaMoeLayer>(L.routing, c.hidden_size, L.moe_intermediate,
                                            L.shared_intermediate, L.gate);
      continue;
    }
    const MoeRouting& r = moe_->routing();
    if (r.num_experts != L.routing.num_experts || r.top_k != L.routing.top_k ||
        r.normalize != L.routing.normalize || r.scoring != L.routing.scoring) {
      return Unimplemented(c.architecture_name + ": MoE layers that route differently");
    }
  }
  if (moe_) {
    // "auto" keeps a checkpoint's MXFP4 experts where the MXFP4 GEMMs serve them: they pass their
    // GPU tests (tests/gpu "[mxfp4]") and outrun the bf16 experts (docs/BENCHMARKS.md).
    const std::string& m = options.moe_weight_dtype;
    moe_->set_mxfp4(m == "mxfp4"  ? CudaMoeLayer::Mxfp4::kKeep
                    : m == "bf16" ? CudaMoeLayer::Mxfp4::kDequantize
                                  : CudaMoeLayer::Mxfp4::kAuto);
  } else if (options.moe_weight_dtype == "mxfp4") {
    return InvalidArgument("moe_weight_dtype mxfp4: " + c.architecture_name +
                           " has no routed experts");
  }
  if (moe_) {
    moe_->set_activation_dtype(MoeActivationDtypeOf(options.moe_activation_dtype));
  } else if (options.moe_activation_dtype == "fp8") {
    return InvalidArgument("moe_activation_dtype fp8: " + c.architecture_name +
                           " has no routed experts");
  }
  ops_ = ctx.ops;
  fp8_ = ctx.weight_quant != WeightQuant::kBf16 || ctx.fp8_checkpoint;
  comm_ = ctx.comm;
  if (comm_ != nullptr) {
    // A rank all-reduces the bf16 outputs of o_proj, down_proj and the MoE layers (split inside
    // every expert, router replicated: every rank routes alike) before they join the residual
    // (inside the next norm). fp8 weights (weight_dtype fp8) are each rank's shard quantized with
    // one scale per (stacked) shard; the raw outputs of o_proj / down_proj get this rank's input
    // row scales before the sum (AllReduce). o_proj's bias joins in that norm, after the sum, so
    // every rank holds all of it (ReplicateOProjBias, checked by CreateCudaDenseModel); the
    // experts' down biases are rank 0's (zeros elsewhere: the sum adds them once).
    const std::string prefix = "tensor_parallel_size " + std::to_string(comm_->size()) + ": ";
    if (ctx.fp8_checkpoint) {
      // The plan refuses pre-quantized checkpoints before this (their 128x128 block scales are
      // not cut with the weights).
      return Unimplemented(prefix +
                           "the fp8 projections of a pre-quantized checkpoint on a cuda rank are "
                           "not implemented");
    }
    // gpt-oss's MXFP4 experts arrive cut as stored (whole 32-value blocks of each rank's k, the
    // plan's rules): the MoE layer keeps or dequantizes them as the whole model's does, its
    // GEMMs padding the rank's k (intermediate / N for down_proj) to kMoeMxfp4KPad.
  }
  LLM_ASSIGN_OR_RETURN(kv_, ParseKvCacheType(options.kv_cache_dtype, options.kv_scale_granularity));
  if (kv_.dtype == DType::kF32) kv_.dtype = DType::kBF16;  // "auto": the 16-bit cache on GPUs
  spec_ = MhaAttentionSpec(c, kv_, options.block_size, DeviceKind::kCuda, ctx.device_arch,
                           c.AnyLayerWindowed());
  if ((options.block_size & (options.block_size - 1)) != 0) {
    return InvalidArgument("the CUDA backend needs a power-of-two block_size, got " +
                           std::to_string(options.block_size));
  }
  return spec_;
}

Status CudaDenseDecoder::UseAttention(AttentionBackends backends) {
  attention_ = std::move(backends);
  step_attention_ = attention_.decode.get();
  LogLayerTypes(layers_spec_, attention_.decode->name());
  return Status::Ok();
}

Status CudaDenseDecoder::Load(const CudaLoadContext& ctx) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, q = c.q_size(), kvs = c.kv_size(), inter = c.intermediate_size;
  const float wstd = 0.02f;
  Bf16WeightLoader& loader = *ctx.loader;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto L = std::make_unique<LayerWeights>();
    const DecoderLayerSpec& S = layers_spec_.layers[l];
    // Dummy norm weights near 1 as (offset + w): near 0 for Gemma's (1 + w).
    const float norm_mean = 1.0f - layers_spec_.norm_weight_offset;
    auto load_norm = [&](const std::string& name, int64_t dim, DeviceBuffer* out) {
      if (name.empty()) return Status::Ok();
      return loader.Load({p + name + ".weight"}, {{dim}}, norm_mean, 0.1f, out);
    };
    LLM_RETURN_IF_ERROR(load_norm(S.attn_in_norm, h, &L->attn_in_norm));
    LLM_RETURN_IF_ERROR(load_norm(S.attn_out_norm, h, &L->attn_out_norm));
    LLM_RETURN_IF_ERROR(load_norm(S.ffn_in_norm, h, &L->ffn_in_norm));
    LLM_RETURN_IF_ERROR(load_norm(S.ffn_out_norm, h, &L->ffn_out_norm));
    if (S.qk_norm) {
      const int64_t d = c.head_dim;
      LLM_RETURN_IF_ERROR(load_norm("self_attn.q_norm", d, &L->q_norm));
      LLM_RETURN_IF_ERROR(load_norm("self_attn.k_norm", d, &L->k_norm));
    }
    if (S.o_bias) {
      LLM_RETURN_IF_ERROR(loader.Load({p + "self_attn.o_proj.bias"}, {{h}}, 0, wstd, &L->bo));
    }
    if (S.sinks) {
      std::vector<float> sinks(c.num_q_heads, 0.0f);  // dummy weights: sink logits 0
      if (!loader.dummy()) {
        LLM_RETURN_IF_ERROR(ctx.weights->ReadF32(p + "self_attn.sinks", {c.num_q_heads}, &sinks));
      }
      LLM_RETURN_IF_ERROR(L->sinks.Alloc(sinks.size() * 4));
      GPU_RETURN_IF_ERROR(
          cudaMemcpy(L->sinks.ptr, sinks.data(), sinks.size() * 4, cudaMemcpyHostToDevice));
    }
    LLM_RETURN_IF_ERROR(L->inv_freq.Alloc(S.inv_freq.size() * 4));
    GPU_RETURN_IF_ERROR(cudaMemcpy(L->inv_freq.ptr, S.inv_freq.data(), S.inv_freq.size() * 4,
                                   cudaMemcpyHostToDevice));
    const std::vector<std::string> parts[kNumProj] = {
        {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
         p + "self_attn.v_proj.weight"},
        {p + "self_attn.o_proj.weight"},
        {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
        {p + "mlp.down_proj.weight"}};
    const std::vector<std::vector<int64_t>> part_shapes[kNumProj] = {
        {{q, h}, {kvs, h}, {kvs, h}}, {{h, q}}, {{inter, h}, {inter, h}}, {{h, inter}}};
    const int64_t shapes[kNumProj][2] = {{q + 2 * kvs, h}, {h, q}, {2 * inter, h}, {h, inter}};
    const char* names[kNumProj] = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};
    if (S.qkv_bias) {
      LLM_RETURN_IF_ERROR(loader.Load(
          {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"},
          {{q}, {kvs}, {kvs}}, 0, wstd, &L->bqkv));
    }
    L->moe = S.ffn == DecoderLayerSpec::Ffn::kMoe;
    if (L->moe) {
      LLM_RETURN_IF_ERROR(moe_->Load(loader, ctx.weights, *ops_, ctx.weight_quant,
                                     p + S.moe_names.block, S.moe_names, &L->experts,
                                     ctx.fp8_checkpoint));
    }
    for (int j = 0; j < (L->moe ? kGateUp : kNumProj); ++j) {
      if (ctx.fp8_checkpoint) {  // the checkpoint's e4m3 bytes and scales, no bf16 copy
        LLM_RETURN_IF_ERROR(L->proj[j].LoadCheckpoint(
            *ops_, *ctx.weights, loader, parts[j], part_shapes[j], p + names[j], ctx.weight_quant));
        continue;
      }
      LLM_RETURN_IF_ERROR(loader.Load(parts[j], part_shapes[j], 0, wstd, L->proj[j].bf16_target()));
      LLM_RETURN_IF_ERROR(L->proj[j].Quantize(*ops_, ctx.weight_quant,
                                              static_cast<int>(shapes[j][0]),
                                              static_cast<int>(shapes[j][1]), 1, p + names[j]));
    }
    layers_.push_back(std::move(L));
  }
  return Status::Ok();
}

Status CudaDenseDecoder::BindCache(const CudaLoadContext& ctx,
                                   const std::vector<KvCacheLayer>& layers) {
  const ModelConfig& c = config_;
  const ModelLoadOptions& options = *ctx.options;
  KvCacheScales scales;
  if (kv_.is_static()) {
    if (ctx.loader->dummy()) {
      // Dummy weights have no checkpoint scales: unit-variance data fits absmax 4.
      const size_t n = kv_.quant == KvQuant::kStaticPerHead ? c.num_kv_heads : c.kv_size();
      const float s = 4.0f / (kv_.dtype == DType::kI8 ? 127.0f : 448.0f);
      scales.k.assign(c.num_layers, std::vector<float>(n, s));
      scales.v = scales.k;
    } else if (ctx.plan != nullptr && !options.kv_scales_file.empty()) {
      // The calibration file holds every KV head (the whole model's): this rank's are cut from
      // it. A checkpoint's scale tensors come already cut by the plan (its KV-head rules).
      LLM_ASSIGN_OR_RETURN(
          const KvCacheScales whole,
          LoadKvCacheScales(ctx.plan->model, *ctx.weights, kv_, options.kv_scales_file));
      LLM_ASSIGN_OR_RETURN(
          scales, KvCacheScalesOfHeads(whole, ctx.plan->first_kv_head, c.num_kv_heads,
                                       kv_.quant == KvQuant::kStaticPerHead ? 1 : c.head_dim));
    } else {
      LLM_ASSIGN_OR_RETURN(scales, LoadKvCacheScales(c, *ctx.weights, kv_, options.kv_scales_file));
    }
  }
  for (int l = 0; l < c.num_layers; ++l) {
    auto lc = std::make_unique<LayerCache>();
    lc->kv = layers[l];
    if (kv_.is_static()) {
      LLM_RETURN_IF_ERROR(lc->k_scale.Alloc(scales.k[l].size() * 4));
      LLM_RETURN_IF_ERROR(lc->v_scale.Alloc(scales.v[l].size() * 4));
      GPU_RETURN_IF_ERROR(cudaMemcpy(lc->k_scale.ptr, scales.k[l].data(), scales.k[l].size() * 4,
                                     cudaMemcpyHostToDevice));
      GPU_RETURN_IF_ERROR(cudaMemcpy(lc->v_scale.ptr, scales.v[l].data(), scales.v[l].size() * 4,
                                     cudaMemcpyHostToDevice));
      lc->kv.k_scale = lc->k_scale.as<float>();
      lc->kv.v_scale = lc->v_scale.as<float>();
      if (fp8_ && options.fp8_static_attention_output) {
        // |out| <= qmax x max(v_scale): softmax weights sum to 1 over dequantized V rows.
        const float qmax = kv_.dtype == DType::kI8 ? kInt8Max : kFp8E4M3Max;
        const float bound = qmax * *std::max_element(scales.v[l].begin(), scales.v[l].end());
        if (bound > 0.f && std::isfinite(bound)) {
          const float out_scale = bound / kFp8E4M3Max;
          lc->out_inv = kFp8E4M3Max / bound;
          LLM_RETURN_IF_ERROR(lc->out_scale.Alloc(CudaLinear::kScaleSlot * sizeof(float)));
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
  return Status::Ok();
}

Status Scratch::Reserve(const ModelConfig& c, int tokens, bool fp8, cudaStream_t stream) {
  if (tokens <= cap) return Status::Ok();
  const size_t T = static_cast<size_t>(tokens);
  const size_t H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
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
    LLM_RETURN_IF_ERROR(apply_scales.Alloc((std::max({H, Q, I}) + 127) / 128 * T * 4));
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(xq.ptr, 0, xq.bytes, stream));
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(row_scales.ptr, 0, row_scales.bytes, stream));
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(apply_scales.ptr, 0, apply_scales.bytes, stream));
  }
  // Padding rows of a graph bucket are computed too: keep them finite from the start.
  for (DeviceBuffer* b : {&qkv, &q, &k, &v, &attn, &tmp, &gate_up, &act}) {
    GPU_RETURN_IF_ERROR(cudaMemsetAsync(b->ptr, 0, b->bytes, stream));
  }
  cap = tokens;
  return Status::Ok();
}

Status CudaDenseDecoder::Plan(const ForwardBatch& batch) {
  // A prefill chunk (more query tokens than a decode of 1..4) goes to the prefill family.
  bool prefill = false;
  for (int i = 0; i < batch.attn.num_seqs && !prefill; ++i) {
    prefill = batch.attn.q_indptr[i + 1] - batch.attn.q_indptr[i] > 4;
  }
  step_attention_ = &attention_.For(prefill);
  return step_attention_->Plan(batch.attn);
}

StatusOr<CudaLayersOut> CudaDenseDecoder::RunLayers(const CudaStep& step) {
  const ModelConfig& c = config_;
  Scratch& s = scratch_[step.set];
  cudaStream_t stream = ops_->stream;
  const int T = step.rows;
  const int H = c.hidden_size, Q = c.q_size(), I = c.intermediate_size;
  // With fp8 weights every projection's input is produced as e4m3 rows by the kernel before it
  // (norm, SiluMul, or a row quantization of the attention output), and its raw output is scaled
  // back by the kernel after it (rotary, norm, SiluMul): no separate quantization pass. The same
  // kernel adds the projection's bias after the scale (q/k/v: the rotary; o: the norm), so a
  // bias costs no pass either.
  cuda::RmsNormArgs norm;
  norm.residual = step.residual;
  norm.num_rows = T;
  norm.hidden = H;
  norm.eps = c.rms_norm_eps;
  norm.weight_offset = layers_spec_.norm_weight_offset;
  norm.out = step.xn;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = *layers_[l];
    const DecoderLayerSpec& S = layers_spec_.layers[l];
    // The previous layer's MLP output (after its own norm, if any) joins the residual inside
    // this norm.
    norm.delta = l == 0 ? nullptr : s.tmp.ptr;
    norm.delta_scale = l == 0 ? nullptr : RowScales(s, l - 1, kDown);
    norm.delta_norm = l == 0 ? nullptr : layers_[l - 1]->ffn_out_norm.ptr;
    norm.weight = L.attn_in_norm.ptr;
    norm.out_fp8 = Fp8In(s, l, kQkv);
    cuda::LaunchAddRmsNorm(norm, stream);
    LLM_RETURN_IF_ERROR(Project(s, l, kQkv, step.xn, T, s.qkv.ptr));
    cuda::RopeArgs ra;
    ra.qkv = s.qkv.ptr;
    ra.bias = L.bqkv.ptr;
    ra.qkv_scale = RowScales(s, l, kQkv);
    ra.positions = step.positions;
    ra.inv_freq = L.inv_freq.as<float>();
    ra.q_norm = L.q_norm.ptr;
    ra.k_norm = L.k_norm.ptr;
    ra.norm_eps = c.rms_norm_eps;
    ra.norm_offset = layers_spec_.norm_weight_offset;
    ra.q = s.q.ptr;
    ra.k = s.k.ptr;
    ra.v = s.v.ptr;
    ra.num_tokens = T;
    ra.num_q_heads = c.num_q_heads;
    ra.num_kv_heads = c.num_kv_heads;
    ra.head_dim = c.head_dim;
    AttentionParams p;
    p.out = s.attn.ptr;
    // One launch for the q/k norms, the rotary and the KV append where the backend fuses them;
    // else the norms and the rotary in LaunchBiasRope.
    if (step_attention_->supports_fused_rope() &&
        (!S.qk_norm || step_attention_->supports_fused_qk_norm())) {
      p.rope.qkv = ra.qkv;
      p.rope.bias = ra.bias;
      p.rope.qkv_scale = ra.qkv_scale;
      p.rope.positions = ra.positions;
      p.rope.inv_freq = ra.inv_freq;
      p.rope.q = s.q.ptr;
      if (S.qk_norm) {
        p.rope.q_norm = ra.q_norm;
        p.rope.k_norm = ra.k_norm;
        p.rope.norm_eps = ra.norm_eps;
        p.rope.norm_offset = ra.norm_offset;
      }
    } else {
      cuda::LaunchBiasRope(ra, stream);
      p.q = s.q.ptr;
      p.k_new = s.k.ptr;
      p.v_new = s.v.ptr;
    }
    const LayerCache& lc = *cache_[l];
    p.cache = lc.kv;
    p.softmax_scale = S.softmax_scale;
    p.window_left = S.window_left;
    p.logit_softcap = S.logit_softcap;
    p.sink_logits = L.sinks.ptr ? L.sinks.as<float>() : nullptr;
    // o_proj's fp8 input straight from the attention, with the layer's static scale; else a
    // per-row pass over its bf16 output.
    const bool static_out = fp8_ && lc.out_inv > 0.f && step_attention_->supports_fp8_out() &&
                            L.proj[kO].takes_fp8_rows() && L.proj[kO].raw_output();
    if (static_out) {
      p.out_fp8 = s.xq.ptr;
      p.out_fp8_inv_scale = lc.out_inv;
    }
    LLM_RETURN_IF_ERROR(step_attention_->Run(p));
    if (!static_out && Fp8In(s, l, kO).enabled()) {
      cuda::LaunchQuantizeRowsFp8(s.attn.ptr, T, Q, Fp8In(s, l, kO), stream);
    }
    LLM_RETURN_IF_ERROR(Project(s, l, kO, s.attn.ptr, T, s.tmp.ptr,
                                static_out ? lc.out_scale.as<float>() : nullptr));
    LLM_RETURN_IF_ERROR(AllReduce(s, l, kO, s.tmp.ptr, T, static_out));
    // o_proj's bias joins in the norm, after the row scales (bf16 and fp8 weights alike).
    norm.delta = s.tmp.ptr;
    norm.delta_scale = static_out ? nullptr : RowScales(s, l, kO);
    norm.delta_bias = L.bo.ptr;
    norm.delta_norm = L.attn_out_norm.ptr;
    norm.weight = L.ffn_in_norm.ptr;
    norm.out_fp8 = Fp8In(s, l, kGateUp);  // empty for a MoE layer: its GEMMs take bf16 rows
    norm.out_f32 = L.moe ? s.moe.x_f32.as<float>() : nullptr;  // the router's fp32 input
    cuda::LaunchAddRmsNorm(norm, stream);
    norm.out_f32 = nullptr;
    norm.delta_bias = nullptr;  // the MLP's output, next, has none
    if (L.moe) {
      const CudaMoeLayer::Trace trace{routing_trace_, l, step.batch->positions.data()};
      LLM_RETURN_IF_ERROR(moe_->Run(*ops_, L.experts, step.xn, T, &s.moe, s.tmp.ptr, trace));
      LLM_RETURN_IF_ERROR(AllReduce(s, l, kDown, s.tmp.ptr, T));  // bf16, fully scaled
      continue;
    }
    LLM_RETURN_IF_ERROR(Project(s, l, kGateUp, step.xn, T, s.gate_up.ptr));
    cuda::SiluMulArgs sm;
    sm.gate_up = s.gate_up.ptr;
    sm.gate_up_scale = RowScales(s, l, kGateUp);
    sm.num_tokens = T;
    sm.inter = I;
    sm.gelu_tanh = S.gate.activation == CpuMlp::Activation::kGeluTanh;
    sm.act = s.act.ptr;
    sm.act_fp8 = Fp8In(s, l, kDown);
    cuda::LaunchSiluMul(sm, stream);
    LLM_RETURN_IF_ERROR(Project(s, l, kDown, s.act.ptr, T, s.tmp.ptr));
    LLM_RETURN_IF_ERROR(AllReduce(s, l, kDown, s.tmp.ptr, T));
  }
  const void* last_norm = layers_.empty() ? nullptr : layers_.back()->ffn_out_norm.ptr;
  return CudaLayersOut{
      s.tmp.ptr, c.num_layers > 0 ? RowScales(s, c.num_layers - 1, kDown) : nullptr, last_norm};
}

}  // namespace

std::unique_ptr<CudaDecoder> NewCudaDenseDecoder(const ModelConfig& config) {
  return std::make_unique<CudaDenseDecoder>(config);
}

StatusOr<std::unique_ptr<Model>> CreateCudaDenseModel(const ModelConfig& config,
                                                      const WeightStore* weights,
                                                      const ModelLoadOptions& options,
                                                      CudaTensorParallelRank tp) {
  // Before the runner reads any weight: what the definition does not compute fails by name.
  LLM_ASSIGN_OR_RETURN(const DecoderSpec spec, MakeDecoderSpec(config));
  LLM_RETURN_IF_ERROR(CheckComputable(config, spec));
  const bool o_bias = std::any_of(spec.layers.begin(), spec.layers.end(),
                                  [](const DecoderLayerSpec& L) { return L.o_bias; });
  if (tp.plan != nullptr && tp.plan->size > 1 && o_bias) {
    // The rank adds o_proj's bias inside the norm after the all-reduce, as the whole model does:
    // every rank must hold all of it.
    LLM_ASSIGN_OR_RETURN(const TensorShard bias,
                         tp.plan->ShardOf("model.layers.0.self_attn.o_proj.bias",
                                          {static_cast<int64_t>(config.hidden_size)}));
    if (bias.split != TensorSplit::kReplicated) {
      return InvalidArgument("tensor_parallel_size " + std::to_string(tp.plan->size) +
                             ": the cuda rank adds the o_proj bias after the all-reduce: its "
                             "plan must replicate it (ReplicateOProjBias)");
    }
  }
  return CreateCudaModel(NewCudaDenseDecoder(config), weights, options, tp);
}

}  // namespace llm
