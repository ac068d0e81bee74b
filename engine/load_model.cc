// Model factory: picks the implementation for a model directory.
#include <algorithm>

#include "engine/architectures/cpu_deepseek_decoder.h"
#include "engine/architectures/cpu_deepseek_mtp.h"
#include "engine/architectures/cpu_dense_decoder.h"
#include "engine/loader/sharded_weights.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/cpu/cpu_model_runner.h"
#include "engine/runtime/cpu/in_process_communicator.h"
#include "engine/runtime/model.h"
#include "engine/runtime/synthetic_model.h"
#include "engine/runtime/tensor_parallel_model.h"
#ifdef LLM_HAVE_CUDA
#include <cuda_runtime.h>

#include "engine/architectures/cuda_deepseek_decoder.h"
#include "engine/architectures/cuda_deepseek_mtp.h"
#include "engine/runtime/cuda/cuda_model_runner.h"
#include "engine/runtime/cuda/device_local_communicator.h"
#endif
#ifdef LLM_HAVE_NCCL
#include "engine/runtime/cuda/nccl_communicator.h"
#endif

namespace llm {
namespace {

// DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers of them, numbered from
// num_hidden_layers): a speculative-decoding head that HF does not load either.
bool IsMtpLayerTensor(const std::string& name, const void* ctx) {
  const auto& d = *static_cast<const DeepseekConfig*>(ctx);
  for (int l = d.base.num_layers; l < d.base.num_layers + d.num_nextn_predict_layers; ++l) {
    if (name.rfind("model.layers." + std::to_string(l) + ".", 0) == 0) return true;
  }
  return false;
}

// Every tensor but the first MTP layer's: the target's, which an MTP model does not read (the
// embedding and LM head it shares are read, so consumed, when the layer has none of its own).
bool NotFirstMtpLayerTensor(const std::string& name, const void* ctx) {
  const auto& d = *static_cast<const DeepseekConfig*>(ctx);
  return name.rfind("model.layers." + std::to_string(DeepseekMtpLayer(d)) + ".", 0) != 0;
}

#ifdef LLM_HAVE_CUDA
// The CUDA ranks: rank r on device r through NCCL, or every rank on device 0 through the
// device-local communicator (ModelLoadOptions::tensor_parallel_one_device). Each rank is loaded
// with its device current, and its thread keeps that device (TensorParallelModel's start hook).
StatusOr<std::unique_ptr<Model>> LoadCudaSplitModel(const ModelLoadOptions& options) {
  const int n = options.tensor_parallel_size;
  const std::string prefix = "tensor_parallel_size " + std::to_string(n) + ": ";
  std::unique_ptr<CommunicatorGroup> group;
  std::vector<int> devices(n, 0);
  if (options.tensor_parallel_one_device) {
    // Every rank would size its pool from the memory the ranks before it left.
    if (options.num_kv_blocks <= 0) {
      return InvalidArgument(prefix + "tensor_parallel_one_device needs an explicit num_kv_blocks");
    }
    LLM_ASSIGN_OR_RETURN(group, DeviceLocalCommunicatorGroup::Create(n, 0));
  } else {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (count < n) {
      return Unavailable(prefix + "needs " + std::to_string(n) +
                         " CUDA devices (one per rank); this machine has " + std::to_string(count));
    }
    for (int r = 0; r < n; ++r) devices[r] = r;
#ifdef LLM_HAVE_NCCL
    LLM_ASSIGN_OR_RETURN(group, NcclCommunicatorGroup::Create(devices));
#else
    return Unavailable(prefix + "this build has no NCCL (the CUDA ranks' communicator)");
#endif
  }
  const auto set_device = [devices](int r) -> Status {
    const cudaError_t e = cudaSetDevice(devices[r]);
    if (e == cudaSuccess) return Status::Ok();
    return Internal("cudaSetDevice(" + std::to_string(devices[r]) + "): " + cudaGetErrorString(e));
  };
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < n; ++r) {
    LLM_RETURN_IF_ERROR(set_device(r));
    auto rank = LoadTensorParallelRank(options, group->rank(r));
    if (!rank.ok()) {
      (void)set_device(0);
      return rank.status();
    }
    ranks.push_back(std::move(rank).value());
  }
  LLM_RETURN_IF_ERROR(set_device(0));
  auto model =
      std::make_unique<TensorParallelModel>(std::move(group), std::move(ranks), set_device);
  LLM_RETURN_IF_ERROR(model->start_status());
  return std::unique_ptr<Model>(std::move(model));
}
#endif

// The model split options.tensor_parallel_size ways: its ranks, one thread each, behind one Model.
StatusOr<std::unique_ptr<Model>> LoadSplitModel(const ModelLoadOptions& options) {
  const int n = options.tensor_parallel_size;
  if (std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), n) ==
      std::end(kTensorParallelSizes)) {
    return InvalidArgument("tensor_parallel_size must be 1, 2, 4 or 8, got " + std::to_string(n));
  }
  LLM_RETURN_IF_ERROR(CheckChoice("device", options.device, kDeviceChoices));
#ifdef LLM_HAVE_CUDA
  if (ResolveDevice(options.device) == "cuda" && options.model_dir.rfind("synthetic", 0) != 0) {
    return LoadCudaSplitModel(options);
  }
#endif
  if (options.tensor_parallel_one_device) {
    return InvalidArgument("tensor_parallel_one_device: a choice of the cuda device");
  }
  auto group = std::make_unique<InProcessCommunicatorGroup>(n);
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < n; ++r) {
    LLM_ASSIGN_OR_RETURN(auto rank, LoadTensorParallelRank(options, group->rank(r)));
    ranks.push_back(std::move(rank));
  }
  return std::unique_ptr<Model>(new TensorParallelModel(std::move(group), std::move(ranks)));
}

StatusOr<std::unique_ptr<WeightStore>> OpenWeights(const std::string& model_dir,
                                                   const ModelConfig& config) {
  LLM_ASSIGN_OR_RETURN(auto weights, WeightStore::Open(model_dir));
  weights->set_quantization(config.quantization);
  return weights;
}

}  // namespace

Status CheckChoice(const char* option, const std::string& value,
                   std::span<const char* const> choices) {
  std::string list;
  for (const char* c : choices) {
    if (value == c) return Status::Ok();
    list += (list.empty() ? "" : ", ") + std::string(c);
  }
  return InvalidArgument(std::string(option) + " must be one of " + list + ", got '" + value + "'");
}

std::string ResolveDevice(const std::string& device) {
#ifdef LLM_HAVE_CUDA
  if (device == "auto") return CudaAvailable() ? "cuda" : "cpu";
#endif
  return device == "auto" ? "cpu" : device;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const ModelLoadOptions& options) {
  LLM_RETURN_IF_ERROR(CheckChoice("device", options.device, kDeviceChoices));
  LLM_RETURN_IF_ERROR(CheckChoice("weight_dtype", options.weight_dtype, kWeightDtypeChoices));
  LLM_RETURN_IF_ERROR(
      CheckChoice("moe_weight_dtype", options.moe_weight_dtype, kMoeWeightDtypeChoices));
  LLM_RETURN_IF_ERROR(CheckChoice("moe_activation_dtype", options.moe_activation_dtype,
                                  kMoeActivationDtypeChoices));
  LLM_RETURN_IF_ERROR(CheckChoice("mla_kernel", options.mla_kernel, kMlaKernelChoices));
  LLM_RETURN_IF_ERROR(CheckChoice("c8_prefill", options.c8_prefill, kC8PrefillChoices));
  if (options.block_size <= 0 || options.block_size > 1024) {
    return InvalidArgument("block_size must be in [1, 1024]");
  }
  if (options.tensor_parallel_size != 1) return LoadSplitModel(options);
  if (options.model_dir.rfind("synthetic", 0) == 0) {
    // The synthetic model computes on the host; "auto" means the cpu for it.
    if (options.device == "cuda") return InvalidArgument("synthetic models run on device cpu only");
    if (options.dummy_weights) return InvalidArgument("dummy weights need the cuda device");
    return SyntheticModel::Create(options);
  }
#ifndef LLM_HAVE_CUDA
  if (options.device == "cuda") {
    return Unavailable(
        "device 'cuda' requested but this build has no CUDA backend "
        "(configure with the cuda preset)");
  }
#endif
  [[maybe_unused]] const bool on_cuda = ResolveDevice(options.device) == "cuda";
  const bool fp8_weights = options.weight_dtype == "fp8";
  const bool mxfp4_experts = options.moe_weight_dtype == "mxfp4";
  const bool fp8_moe_activations = options.moe_activation_dtype == "fp8";
  if (IsDeepseekModelDir(options.model_dir)) {  // MLA + MoE: its own config and model
    LLM_ASSIGN_OR_RETURN(DeepseekConfig config, LoadDeepseekConfig(options.model_dir));
    if (mxfp4_experts) {
      return InvalidArgument("moe_weight_dtype mxfp4: " + config.base.architecture_name +
                             " has no MXFP4 experts (gpt-oss checkpoints have)");
    }
#ifdef LLM_HAVE_CUDA
    if (on_cuda) {
      if (options.dummy_weights) return CreateCudaDeepseekModel(config, nullptr, options);
      LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config.base));
      LLM_ASSIGN_OR_RETURN(auto model, CreateCudaDeepseekModel(config, weights.get(), options));
      LLM_RETURN_IF_ERROR(
          weights->CheckAllConsumed(config.base.architecture_name, IsMtpLayerTensor, &config));
      return model;
    }
#endif
    if (options.dummy_weights) return InvalidArgument("dummy weights need the cuda device");
    if (fp8_weights) return InvalidArgument("fp8 weights need the cuda device");
    if (fp8_moe_activations) {
      return InvalidArgument(
          "moe_activation_dtype fp8 needs the cuda device (the cpu models compute in fp32)");
    }
    LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config.base));
    LLM_ASSIGN_OR_RETURN(auto model,
                         CpuModelRunner::Create(NewCpuDeepseekDecoder(config), *weights, options));
    LLM_RETURN_IF_ERROR(
        weights->CheckAllConsumed(config.base.architecture_name, IsMtpLayerTensor, &config));
    return std::unique_ptr<Model>(std::move(model));
  }
  LLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
#ifdef LLM_HAVE_CUDA
  if (on_cuda) {
    // The CUDA decoder definition computes Llama, Mistral, Qwen2, Qwen3, Gemma 2 / 3, Mixtral and
    // Qwen3-MoE (its MoE layers through the CUDA MoE layer); gpt-oss loads as far as its
    // DecoderSpec, which the definition refuses by name where it does not compute it.
    if (config.architecture != Architecture::kLlama &&
        config.architecture != Architecture::kMistral &&
        config.architecture != Architecture::kQwen2 &&
        config.architecture != Architecture::kQwen3 &&
        config.architecture != Architecture::kGemma2 &&
        config.architecture != Architecture::kGemma3 &&
        config.architecture != Architecture::kMixtral &&
        config.architecture != Architecture::kQwen3Moe &&
        config.architecture != Architecture::kGptOss) {
      return Unimplemented(config.architecture_name +
                           " is not implemented on device cuda (it runs on --device cpu)");
    }
    if (mxfp4_experts && config.architecture != Architecture::kGptOss) {
      return InvalidArgument("moe_weight_dtype mxfp4: " + config.architecture_name +
                             " has no MXFP4 experts (gpt-oss checkpoints have)");
    }
    if (options.dummy_weights) return CreateCudaDenseModel(config, nullptr, options);
    LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config));
    LLM_ASSIGN_OR_RETURN(auto model, CreateCudaDenseModel(config, weights.get(), options));
    LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.architecture_name));
    return model;
  }
#endif
  if (options.dummy_weights) return InvalidArgument("dummy weights need the cuda device");
  if (fp8_weights) return InvalidArgument("fp8 weights need the cuda device");
  if (mxfp4_experts) {
    return InvalidArgument(
        "moe_weight_dtype mxfp4 needs the cuda device (the cpu models compute in fp32)");
  }
  if (fp8_moe_activations) {
    return InvalidArgument(
        "moe_activation_dtype fp8 needs the cuda device (the cpu models compute in fp32)");
  }
  LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(options.model_dir, config));
  LLM_ASSIGN_OR_RETURN(auto decoder, NewCpuDenseDecoder(config));
  LLM_ASSIGN_OR_RETURN(auto model, CpuModelRunner::Create(std::move(decoder), *weights, options));
  LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.architecture_name));
  return std::unique_ptr<Model>(std::move(model));
}

#ifdef LLM_HAVE_CUDA
// A cuda rank's cut of the checkpoint, or null with dummy_weights: the runner then draws each
// tensor at the rank's own shapes (benchmarking split models too large to ship).
static StatusOr<std::unique_ptr<WeightStore>> RankWeights(const ModelLoadOptions& options,
                                                          const ModelConfig& config,
                                                          const TensorParallelPlan& plan) {
  if (options.dummy_weights) return std::unique_ptr<WeightStore>();
  LLM_ASSIGN_OR_RETURN(auto full, OpenWeights(options.model_dir, config));
  return ShardWeights(*full, plan);
}

// LoadTensorParallelRank on the cuda device (its refusals of options already made): the dense
// decoder's families, MoE layers included, and DeepSeek V2 / V3; the calling thread's device is
// the rank's.
static StatusOr<std::unique_ptr<Model>> LoadCudaTensorParallelRank(const ModelLoadOptions& options,
                                                                   Communicator* comm) {
  const TensorParallelOptions tp{.size = comm->size(), .rank = comm->rank()};
  const std::string prefix = "tensor_parallel_size " + std::to_string(tp.size) + ": ";
  // A warm-up capture at load would run a step's collectives while the other ranks are not
  // loaded yet: a rank's graphs are captured on first use, by every rank thread together.
  ModelLoadOptions rank_options = options;
  rank_options.cuda_graph_warmup = false;
  if (IsDeepseekModelDir(options.model_dir)) {  // MLA: query heads split, the latent replicated
    LLM_ASSIGN_OR_RETURN(DeepseekConfig config, LoadDeepseekConfig(options.model_dir));
    if (options.moe_weight_dtype == "mxfp4") {
      return InvalidArgument("moe_weight_dtype mxfp4: " + config.base.architecture_name +
                             " has no MXFP4 experts (gpt-oss checkpoints have)");
    }
    LLM_ASSIGN_OR_RETURN(const TensorParallelPlan plan, MakeTensorParallelPlan(config, tp));
    LLM_ASSIGN_OR_RETURN(auto weights, RankWeights(options, config.base, plan));
    const CudaTensorParallelRank rank =
        plan.size > 1 ? CudaTensorParallelRank{&plan, comm} : CudaTensorParallelRank{};
    LLM_ASSIGN_OR_RETURN(auto model, CreateCudaModel(NewCudaDeepseekDecoder(*plan.deepseek),
                                                     weights.get(), rank_options, rank));
    if (weights) LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.base.architecture_name));
    return model;
  }
  LLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  const Architecture a = config.architecture;
  if (a != Architecture::kLlama && a != Architecture::kMistral && a != Architecture::kQwen2 &&
      a != Architecture::kQwen3 && a != Architecture::kGemma2 && a != Architecture::kGemma3 &&
      a != Architecture::kMixtral && a != Architecture::kQwen3Moe && a != Architecture::kGptOss) {
    return Unimplemented(prefix + config.architecture_name +
                         " has no cuda tensor-parallel rank (it runs on --device cpu)");
  }
  if (options.moe_weight_dtype == "mxfp4" && a != Architecture::kGptOss) {
    return InvalidArgument("moe_weight_dtype mxfp4: " + config.architecture_name +
                           " has no MXFP4 experts (gpt-oss checkpoints have)");
  }
  LLM_ASSIGN_OR_RETURN(TensorParallelPlan plan, MakeTensorParallelPlan(config, tp));
  ReplicateOProjBias(&plan);  // the CUDA dense decoder adds it after the all-reduce
  LLM_ASSIGN_OR_RETURN(auto weights, RankWeights(options, config, plan));
  const CudaTensorParallelRank rank =
      plan.size > 1 ? CudaTensorParallelRank{&plan, comm} : CudaTensorParallelRank{};
  LLM_ASSIGN_OR_RETURN(auto model,
                       CreateCudaDenseModel(plan.local, weights.get(), rank_options, rank));
  if (weights) LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.architecture_name));
  return model;
}
#endif

StatusOr<std::unique_ptr<Model>> LoadTensorParallelRank(const ModelLoadOptions& options,
                                                        Communicator* comm) {
  const TensorParallelOptions tp{.size = comm->size(), .rank = comm->rank()};
  const std::string prefix = "tensor_parallel_size " + std::to_string(tp.size) + ": ";
  LLM_RETURN_IF_ERROR(CheckChoice("device", options.device, kDeviceChoices));
  if (options.model_dir.rfind("synthetic", 0) == 0) {
    return InvalidArgument(prefix + "a synthetic model has no weights to split");
  }
  const bool on_cuda = ResolveDevice(options.device) == "cuda";
#ifndef LLM_HAVE_CUDA
  if (on_cuda) {
    return Unavailable(
        "device 'cuda' requested but this build has no CUDA backend "
        "(configure with the cuda preset)");
  }
#endif
  // A cuda rank takes fp8 weights (each rank quantizes its shard), the 8-bit KV caches (its KV
  // heads, their scales cut with them) and dummy weights (drawn at its shapes); the cpu ranks
  // compute in fp32 over an fp32 cache, from a checkpoint.
  const std::pair<std::string, bool> refused[] = {
      {"kv_cache_dtype " + options.kv_cache_dtype + " (a cpu rank keeps an fp32 KV cache)",
       !on_cuda && options.kv_cache_dtype != "auto" && options.kv_cache_dtype != "float32" &&
           options.kv_cache_dtype != "fp32"},
      {"dummy_weights (on a cpu rank)", !on_cuda && options.dummy_weights},
      {"weight_dtype fp8 (on a cpu rank)", !on_cuda && options.weight_dtype == "fp8"},
      {"moe_activation_dtype fp8", options.moe_activation_dtype == "fp8"}};
  for (const auto& [what, set] : refused) {
    if (set) return Unimplemented(prefix + what + " is not supported with tensor parallelism");
  }
  if (!on_cuda && options.moe_weight_dtype == "mxfp4") {  // as the unsharded load refuses it
    return InvalidArgument(
        "moe_weight_dtype mxfp4 needs the cuda device (the cpu models compute in fp32)");
  }
#ifdef LLM_HAVE_CUDA
  if (on_cuda) return LoadCudaTensorParallelRank(options, comm);
#endif
  // Size 1: the whole model's runner, no collectives.
  const auto rank = [&](const TensorParallelPlan& plan) {
    return plan.size > 1 ? CpuTensorParallelRank{&plan, comm} : CpuTensorParallelRank{};
  };
  if (IsDeepseekModelDir(options.model_dir)) {
    LLM_ASSIGN_OR_RETURN(DeepseekConfig config, LoadDeepseekConfig(options.model_dir));
    LLM_ASSIGN_OR_RETURN(const TensorParallelPlan plan, MakeTensorParallelPlan(config, tp));
    LLM_ASSIGN_OR_RETURN(auto full, OpenWeights(options.model_dir, config.base));
    LLM_ASSIGN_OR_RETURN(auto weights, ShardWeights(*full, plan));
    LLM_ASSIGN_OR_RETURN(auto model, CpuModelRunner::Create(NewCpuDeepseekDecoder(*plan.deepseek),
                                                            *weights, options, rank(plan)));
    LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.base.architecture_name));
    return std::unique_ptr<Model>(std::move(model));
  }
  LLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(options.model_dir));
  LLM_ASSIGN_OR_RETURN(const TensorParallelPlan plan, MakeTensorParallelPlan(config, tp));
  LLM_ASSIGN_OR_RETURN(auto full, OpenWeights(options.model_dir, config));
  LLM_ASSIGN_OR_RETURN(auto weights, ShardWeights(*full, plan));
  LLM_ASSIGN_OR_RETURN(auto decoder, NewCpuDenseDecoder(plan.local));
  LLM_ASSIGN_OR_RETURN(auto model,
                       CpuModelRunner::Create(std::move(decoder), *weights, options, rank(plan)));
  LLM_RETURN_IF_ERROR(weights->CheckAllConsumed(config.architecture_name));
  return std::unique_ptr<Model>(std::move(model));
}

StatusOr<std::unique_ptr<Model>> LoadMtpModel(const ModelLoadOptions& options) {
  const std::string& dir = options.model_dir;
  if (dir.rfind("synthetic", 0) == 0 || !IsDeepseekModelDir(dir)) {
    return InvalidArgument(
        "--speculative-method mtp needs a DeepSeek-V3 checkpoint with its multi-token-prediction "
        "layer (num_nextn_predict_layers >= 1); " +
        dir + " is not a DeepSeek checkpoint");
  }
  LLM_ASSIGN_OR_RETURN(DeepseekConfig config, LoadDeepseekConfig(dir));
  const std::string& arch = config.base.architecture_name;
  if (config.num_nextn_predict_layers < 1) {
    return InvalidArgument("--speculative-method mtp: " + arch + " in " + dir +
                           " has no multi-token-prediction layer (num_nextn_predict_layers is " +
                           std::to_string(config.num_nextn_predict_layers) + ")");
  }
  if (config.num_nextn_predict_layers > 1) {
    return InvalidArgument("--speculative-method mtp: num_nextn_predict_layers " +
                           std::to_string(config.num_nextn_predict_layers) +
                           " > 1 is not implemented (the first MTP layer chains; DeepSeek-V3 "
                           "ships one)");
  }
#ifndef LLM_HAVE_CUDA
  if (options.device == "cuda") {
    return Unavailable("device 'cuda' requested but this build has no CUDA backend");
  }
#endif
  if (options.dummy_weights) {
    return InvalidArgument(
        "--speculative-method mtp reads the MTP layer from the checkpoint "
        "(no dummy weights)");
  }
  LLM_ASSIGN_OR_RETURN(auto weights, OpenWeights(dir, config.base));
  const std::string eh_proj =
      "model.layers." + std::to_string(DeepseekMtpLayer(config)) + ".eh_proj.weight";
  if (!weights->Has(eh_proj)) {
    return InvalidArgument("--speculative-method mtp: the checkpoint in " + dir +
                           " has no MTP layer weights (" + eh_proj +
                           " is missing; some conversions drop them)");
  }
  std::unique_ptr<Model> model;
#ifdef LLM_HAVE_CUDA
  if (ResolveDevice(options.device) == "cuda") {
    LLM_ASSIGN_OR_RETURN(
        model, CreateCudaModel(NewCudaDeepseekMtp(config, weights.get()), weights.get(), options));
  }
#endif
  if (!model) {
    if (options.weight_dtype == "fp8") return InvalidArgument("fp8 weights need the cuda device");
    LLM_ASSIGN_OR_RETURN(
        model, CpuModelRunner::Create(NewCpuDeepseekMtp(config, *weights), *weights, options));
  }
  LLM_RETURN_IF_ERROR(
      weights->CheckAllConsumed(arch + " MTP layer", NotFirstMtpLayerTensor, &config));
  return model;
}

}  // namespace llm
