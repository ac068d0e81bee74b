// Tensor-parallel CUDA ranks of the dense and DeepSeek decoders against the unsharded CUDA model,
// on ONE GPU: N ranks (2 or 4) on device 0 through the device-local communicator
// (engine/runtime/cuda/device_local_communicator.h), one thread per rank, over a prefill of two
// sequences and kDecodeSteps one-token steps. Each step is teacher-forced with the unsharded
// model's greedy tokens, so that every step's logits are compared on the same history.
//
// Tolerance: the whole model rounds each o_proj / down_proj output to bf16 once; a rank rounds its
// partial sum to bf16 and the all-reduce rounds the sum again, so the logits differ by bf16
// rounding carried through the layers: max |sharded - whole| <= 5e-2 x max |whole| per step (a
// missing all-reduce, a wrong cut or a misplaced vocabulary slice is an error of the order of the
// logits themselves); greedy tokens that differ (near-ties) are counted, not failed. The MoE
// routers read a residual that carries that rounding too: the random top-2 gpt-oss model turns it
// into routing flips and gets 0.2.
// Every rank returns the same bits (the device-local all-reduce
// sums in rank order on every rank). Cases: Llama with its KV heads split (N = 2) and replicated
// (N = 4 > 2 KV heads, one and two query heads per rank; a vocabulary that N does not divide),
// Qwen3 (q/k norms per head) and Gemma 2 (embedding scale, post-norms of the summed outputs,
// soft-caps); Mixtral, Qwen3-MoE and gpt-oss (every expert split, the router replicated, gpt-oss's
// o_proj bias added after the all-reduce, its experts' down biases by rank 0), DeepSeek V2 / V3
// (query heads split over the replicated latent, MoE as above); gpt-oss's MXFP4 experts cut as
// stored (kept for the MXFP4 GEMMs, and dequantized); their refusals (MXFP4 expert slices that are
// not whole 32-value blocks, expert slices the grouped GEMMs do not tile, a plan that leaves
// o_proj's bias to rank 0); 8-bit KV caches and fp8 weights; dummy weights drawn per rank;
// LoadModel's TensorParallelModel (the rank threads' start hook) against
// the ranks run by hand; with NCCL, a rank of size 1 (Llama, Mixtral, gpt-oss) through
// NcclCommunicator with its decode steps in CUDA graphs (the collectives captured) against the
// whole model.
//
//   build/cuda/tests/gpu_tests "[tensor_parallel_cuda]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/loader/sharded_weights.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/cuda/cuda_model_runner.h"
#include "engine/runtime/cuda/device_local_communicator.h"
#include "engine/runtime/model.h"
#include "engine/runtime/tensor_parallel_model.h"
#include "tests/gpu/random_deepseek.h"
#include "tests/gpu/random_llama.h"
#include "tests/gpu/random_moe.h"
#include "tests/unit/tensor_parallel_trace.h"
#ifdef LLM_HAVE_NCCL
#include "engine/runtime/cuda/nccl_communicator.h"
#endif

namespace llm {
namespace {

constexpr int kBlockSize = 64;  // cuda_mla takes blocks of 64 (DeepSeek)
constexpr int kBlocksPerSeq = 4;
constexpr int kDecodeSteps = 16;
constexpr double kRelTolerance = 5e-2;

using tp_trace::RelativeError;
using tp_trace::Trace;

// Prompts of 5 and 19 tokens prefilled together, then kDecodeSteps one-token steps; the history
// grows by `forced` (the reference's tokens, [steps * seqs]) where given, else by the greedy ones.
Trace Drive(Model& model, const std::vector<int32_t>* forced = nullptr) {
  return tp_trace::Drive(
      model,
      {kBlockSize,
       kBlocksPerSeq,
       kDecodeSteps,
       {{3, 9, 27, 17, 51},
        {2, 40, 11, 5, 33, 8, 1, 60, 7, 90, 14, 21, 300, 77, 4, 18, 550, 6, 12}}},
      forced);
}

// The quantization options a case runs with, the whole model and the ranks alike.
struct Quant {
  std::string weight_dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string kv_scales_file;  // a static cache's calibration (the whole model's heads)
  std::string moe_weight_dtype = "auto";
  bool dummy_weights = false;  // drawn at each model's (each rank's) shapes, the checkpoint unread
};

ModelLoadOptions Options(const std::string& dir, const Quant& q = {}) {
  ModelLoadOptions o;
  o.weight_dtype = q.weight_dtype;
  o.kv_cache_dtype = q.kv_cache_dtype;
  o.kv_scales_file = q.kv_scales_file;
  o.model_dir = dir;
  o.moe_weight_dtype = q.moe_weight_dtype;
  o.dummy_weights = q.dummy_weights;
  o.device = "cuda";
  o.block_size = kBlockSize;
  o.num_kv_blocks = 2 * kBlocksPerSeq;
  o.max_step_rows = 64;
  o.cuda_graph_max_batch = 4;  // the whole model's decode graphs: the two sequences' bucket
  return o;
}

Trace RunWhole(const std::string& dir, const Quant& q = {}) {
  auto model = LoadModel(Options(dir, q));
  INFO((model.ok() ? std::string() : model.status().message()));
  REQUIRE(model.ok());
  return Drive(**model);
}

// The ranks of `size` on device 0, loaded one after the other, then driven together (one thread
// each, rank r's device set in its thread), teacher-forced with `forced`.
std::vector<Trace> RunRanks(const std::string& dir, int size, const std::vector<int32_t>& forced,
                            const Quant& q = {}) {
  auto group = DeviceLocalCommunicatorGroup::Create(size, 0);
  REQUIRE(group.ok());
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < size; ++r) {
    auto m = LoadTensorParallelRank(Options(dir, q), (*group)->rank(r));
    INFO((m.ok() ? std::string() : m.status().message()));
    REQUIRE(m.ok());
    ranks.push_back(std::move(m).value());
  }
  std::vector<Trace> traces(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      if (cudaSetDevice(0) != cudaSuccess) {
        traces[r].status = Internal("cudaSetDevice");
        return;
      }
      traces[r] = Drive(*ranks[r], &forced);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) ranks[r].reset();  // before the group, whose slots they use
  return traces;
}

// `sharded` against `whole`, step by step: tolerance and (same_tokens) the greedy tokens;
// returns the largest error.
double CheckAgainstWhole(const Trace& sharded, const Trace& whole, double tolerance = kRelTolerance,
                         bool same_tokens = true) {
  INFO((sharded.status.ok() ? std::string() : sharded.status.message()));
  REQUIRE(sharded.status.ok());
  REQUIRE(sharded.logits.size() == whole.logits.size());
  double worst = 0;
  for (size_t step = 0; step < whole.logits.size(); ++step) {
    INFO("step " << step);
    REQUIRE(sharded.logits[step].size() == whole.logits[step].size());
    const double err = RelativeError(sharded.logits[step], whole.logits[step]);
    CHECK(err <= tolerance);
    worst = std::max(worst, err);
  }
  // Greedy tokens may differ only where the whole model's top two are closer than twice the
  // logit error, which the bound above limits: counted, not failed (the bf16 all-reduces sum in
  // another order than one GEMM does).
  if (same_tokens) {
    size_t flips = 0;
    for (size_t i = 0; i < whole.tokens.size(); ++i) flips += sharded.tokens[i] != whole.tokens[i];
    if (flips > 0) WARN(flips << " of " << whole.tokens.size() << " greedy tokens differ");
  }
  return worst;
}

// The largest logit error of `model` against the same checkpoint's bf16 whole model (default
// options) teacher-forced along model's tokens.
double ErrorAgainstBf16(const std::string& dir, const Trace& model) {
  auto bf16 = LoadModel(Options(dir));
  REQUIRE(bf16.ok());
  const Trace ref = Drive(**bf16, &model.tokens);
  REQUIRE(ref.status.ok());
  REQUIRE(ref.logits.size() == model.logits.size());
  double worst = 0;
  for (size_t step = 0; step < ref.logits.size(); ++step) {
    worst = std::max(worst, RelativeError(model.logits[step], ref.logits[step]));
  }
  return worst;
}

// tolerance < 0: the fp8 bound, max(-tolerance, twice the whole fp8 model's own error against the
// bf16 model). The sharded and the whole fp8 models are two e4m3 roundings of one bf16 model, so
// their distance is at most about the sum of their distances from it; how far fp8 moves a random
// model depends on the model (a top-k router turns rounding into other experts), so the bound is
// measured on the same checkpoint and path rather than fixed.
void CheckSplit(const std::string& dir, int size, const Quant& q = {},
                double tolerance = kRelTolerance, bool same_tokens = true) {
  INFO("tensor_parallel_size " << size << ", weight_dtype " << q.weight_dtype << ", kv_cache_dtype "
                               << q.kv_cache_dtype << ", moe_weight_dtype " << q.moe_weight_dtype);
  const Trace whole = RunWhole(dir, q);
  REQUIRE(whole.status.ok());
  if (tolerance < 0) {
    const double fp8_error = ErrorAgainstBf16(dir, whole);
    WARN(dir << ": the whole fp8 model's largest logit error against bf16 " << fp8_error);
    tolerance = std::max(-tolerance, 2 * fp8_error);
  }
  const std::vector<Trace> ranks = RunRanks(dir, size, whole.tokens, q);
  const double worst = CheckAgainstWhole(ranks[0], whole, tolerance, same_tokens);
  WARN(dir << " at " << size << " ranks: largest logit error " << worst << " of the logit scale");
  for (int r = 1; r < size; ++r) {
    INFO("rank " << r);
    REQUIRE(ranks[r].status.ok());
    REQUIRE(ranks[r].logits.size() == ranks[0].logits.size());
    for (size_t step = 0; step < ranks[0].logits.size(); ++step) {
      const auto& a = ranks[r].logits[step];
      const auto& b = ranks[0].logits[step];
      CHECK((a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0));
    }
  }
}

TEST_CASE("TP CUDA: Llama ranks on one GPU match the whole model (KV heads split, replicated)",
          "[gpu][tensor_parallel_cuda]") {
  // 4 query heads over 2 KV heads: N = 2 splits the KV heads, N = 4 replicates each over 2 ranks
  // (one query head per rank); 8 query heads at N = 4: two per rank over one KV head, and a
  // vocabulary of 602 (151 rows per rank, the last rank's padded with 2 zero rows).
  CheckSplit(gpu_test::WriteRandomDense("tp_llama", gpu_test::RandomArch::kLlama), 2);
  CheckSplit(gpu_test::WriteRandomDense("tp_llama", gpu_test::RandomArch::kLlama), 4);
  CheckSplit(gpu_test::WriteRandomDense("tp_llama_h8", gpu_test::RandomArch::kLlama, 64, 0,
                                        /*heads=*/8, /*vocab=*/602),
             4);
}

TEST_CASE("TP CUDA: Qwen3 and Gemma 2 ranks on one GPU match the whole model",
          "[gpu][tensor_parallel_cuda]") {
  CheckSplit(gpu_test::WriteRandomDense("tp_qwen3", gpu_test::RandomArch::kQwen3), 2);
  CheckSplit(gpu_test::WriteRandomDense("tp_gemma2", gpu_test::RandomArch::kGemma2), 2);
}

TEST_CASE("TP CUDA: Mixtral, Qwen3-MoE and gpt-oss ranks on one GPU match the whole model",
          "[gpu][tensor_parallel_cuda]") {
  // Every expert split in two, the router replicated: Mixtral's 512 -> 256, Qwen3-MoE's 128 -> 64
  // (the grouped GEMMs' least; its dense layer 1 too), gpt-oss's stacked 256 -> 128 with its
  // gate_up biases split, its down biases on rank 0 only, its sinks split and its o_proj bias
  // replicated and added after the all-reduce.
  CheckSplit(gpu_test::WriteRandomMoe("tp_mixtral", gpu_test::RandomMoeArch::kMixtral), 2);
  CheckSplit(gpu_test::WriteRandomMoe("tp_qwen3_moe", gpu_test::RandomMoeArch::kQwen3Moe), 2);
  // The random top-2 gpt-oss model turns the all-reduces' bf16 rounding into routing flips at
  // near-tied router logits, which move a step's logits by up to ~0.12 of their scale (the same
  // amplification docs/log/gpt_oss_gpu_fidelity.md finds against transformers' own bf16 model).
  CheckSplit(gpu_test::WriteRandomMoe("tp_gpt_oss", gpu_test::RandomMoeArch::kGptOss), 2, {},
             /*tolerance=*/0.2);
}

TEST_CASE("TP CUDA: gpt-oss's MXFP4 experts cut as stored match the whole model at 2 ranks",
          "[gpu][tensor_parallel_cuda][mxfp4]") {
  // Experts of 384 stored as MXFP4: each rank holds rows of gate_up_proj_blocks / _scales and 6
  // of down_proj's 12 blocks of k. Kept as stored (moe_weight_dtype mxfp4: the MXFP4 GEMMs and
  // GEMVs on the rank's k of 192, padded to 256 in the device layout, the kernels' predicates on
  // the true 192) and dequantized to bf16 at load (moe_weight_dtype bf16), each against the whole
  // model loaded the same way.
  gpu_test::GptOssShape mx;
  mx.mxfp4 = true;
  mx.expert_inter = 384;
  const std::string dir =
      gpu_test::WriteRandomMoe("tp_gpt_oss_mxfp4", gpu_test::RandomMoeArch::kGptOss, mx);
  // gpt-oss's random router: the amplification of the bf16 case above (0.05-0.06 on an H100).
  constexpr double kGptOssTolerance = 0.2;
  CheckSplit(dir, 2, {.moe_weight_dtype = "mxfp4"}, kGptOssTolerance);
  CheckSplit(dir, 2, {.moe_weight_dtype = "bf16"}, kGptOssTolerance);
  // Experts of 320: 160 per rank, 5 blocks of k (odd, as gpt-oss-20b's 1440 is 45), which the
  // MXFP4 GEMMs serve (multiples of 32; k padded to 256) and the bf16 ones do not (refused).
  mx.expert_inter = 320;
  const std::string dir160 =
      gpu_test::WriteRandomMoe("tp_gpt_oss_mxfp4_320", gpu_test::RandomMoeArch::kGptOss, mx);
  CheckSplit(dir160, 2, {.moe_weight_dtype = "mxfp4"}, kGptOssTolerance);
  CheckSplit(dir160, 2, {.moe_weight_dtype = "auto"},
             kGptOssTolerance);  // auto keeps them too (the scales are in range)
  auto group = DeviceLocalCommunicatorGroup::Create(2, 0);
  REQUIRE(group.ok());
  auto bf16 =
      LoadTensorParallelRank(Options(dir160, {.moe_weight_dtype = "bf16"}), (*group)->rank(0));
  REQUIRE_FALSE(bf16.ok());
  CHECK_THAT(bf16.status().message(),
             Catch::Contains("moe_intermediate 160: the grouped GEMMs need hidden % 64 == 0 and "
                             "intermediate % 64 == 0"));
}

TEST_CASE("TP CUDA: DeepSeek V2 and V3 ranks on one GPU match the whole model",
          "[gpu][tensor_parallel_cuda]") {
  // 16 query heads, 8 per rank, over the whole latent (q_a_proj and kv_a_proj_with_mqa
  // replicated, every rank caches the same latent); kv_b_proj and q_b_proj / q_proj cut by head,
  // o_proj by its input columns; the dense layer's 256 and every expert's 128 (the shared one
  // too) split in two, the router (V3: its correction bias) replicated. V2: q LoRA, grouped
  // softmax routing; V3: q_proj, sigmoid + noaux_tc.
  CheckSplit(gpu_test::WriteRandomDeepseek("tp_deepseek_v2", /*v3=*/false, nullptr,
                                           /*dense_only=*/false, /*fp8_block=*/false,
                                           /*moe_inter_size=*/128),
             2);
  CheckSplit(gpu_test::WriteRandomDeepseek("tp_deepseek_v3", /*v3=*/true, nullptr,
                                           /*dense_only=*/false, /*fp8_block=*/false,
                                           /*moe_inter_size=*/128),
             2);
}

// A static cache's calibration file for the model in `dir` (kv_cache_quant.h format): per-head
// absmax 6 (K) and 5 (V) with the first head's 8 (its scale differs, so a rank that takes the
// wrong heads' scales dequantizes with the wrong one), for every layer.
std::string WriteKvScales(const std::string& dir) {
  nlohmann::json config;
  std::ifstream(dir + "/config.json") >> config;
  const int kv = config.value("num_key_value_heads", config.value("num_attention_heads", 0));
  const int layers = config.value("num_hidden_layers", 0);
  REQUIRE(kv > 0);
  std::vector<double> k(kv, 6.0), v(kv, 5.0);
  k[0] = v[0] = 8.0;
  nlohmann::json list = nlohmann::json::array();
  for (int l = 0; l < layers; ++l) list.push_back({{"k_absmax", k}, {"v_absmax", v}});
  const std::string path = dir + "/kv_scales.json";
  std::ofstream(path) << nlohmann::json{
      {"format", "llm-kv-scales-v1"},
      {"granularity", "per_head"},
      {"layers", list}}.dump();
  return path;
}

// 8-bit KV caches: each rank caches its KV heads only. A static int8 cache's per-head scales are
// the whole model's cut to the rank's heads (KvCacheScalesOfHeads), fp8_e4m3_dynamic's per-token
// per-head scales are computed from the rank's heads at append; either way a rank quantizes the
// same K / V values with the same scales as the whole model, so the bf16-weight tolerance holds.
TEST_CASE("TP CUDA: int8 and dynamic fp8 KV caches on Llama ranks match the whole model",
          "[gpu][tensor_parallel_cuda]") {
  const std::string dir = gpu_test::WriteRandomDense("tp_llama_kv8", gpu_test::RandomArch::kLlama);
  const Quant int8{.kv_cache_dtype = "int8", .kv_scales_file = WriteKvScales(dir)};
  CheckSplit(dir, 2, int8);
  CheckSplit(dir, 4, int8);  // KV heads replicated: ranks 0-1 take head 0's scale, 2-3 head 1's
  CheckSplit(dir, 2, {.kv_cache_dtype = "fp8_e4m3_dynamic"});
}

// fp8 weights (weight_dtype fp8, the Llama-3-8B serving configuration with an int8 cache): each
// rank quantizes its own shards with one scale per (stacked) shard, CudaLinear::Quantize's
// per-tensor granularity, so a rank's e4m3 weights are NOT the whole model's (a shard's absmax is
// at most the whole matrix's: its grid is as fine or finer); o_proj's and down_proj's inputs are
// quantized per row over the rank's slice, and their raw outputs get those row scales before the
// all-reduce. The two models are two e4m3 roundings of the same bf16 model: ~3% rms per element
// per projection, compounding over the layers like fp8 against bf16 weights (test_fp8_weights.cc
// allows 0.2 relative L2), so the largest logit error is held to 0.25 of the logit scale, or to
// twice the whole fp8 model's own error against its bf16 model where that is larger (DeepSeek-V3's
// random sigmoid router moves whole experts under fp8 rounding: 0.49 at 2 ranks on an H100), and
// the greedy tokens may differ where two logits lie closer than that. A missing row scale (1/448
// of a row's absmax) or a partial sum left unscaled is an error of the order of the logits or
// larger.
TEST_CASE("TP CUDA: fp8 weights with 8-bit KV caches on Llama and DeepSeek ranks",
          "[gpu][tensor_parallel_cuda]") {
  constexpr double kFp8Tolerance = -0.25;  // CheckSplit's fp8 bound, at least 0.25
  const std::string dir = gpu_test::WriteRandomDense("tp_llama_fp8", gpu_test::RandomArch::kLlama);
  const std::string scales = WriteKvScales(dir);
  CheckSplit(dir, 2, {.weight_dtype = "fp8", .kv_cache_dtype = "int8", .kv_scales_file = scales},
             kFp8Tolerance, /*same_tokens=*/false);
  CheckSplit(dir, 2, {.weight_dtype = "fp8", .kv_cache_dtype = "fp8_e4m3_dynamic"}, kFp8Tolerance,
             /*same_tokens=*/false);
  CheckSplit(dir, 2, {.weight_dtype = "fp8"}, kFp8Tolerance, /*same_tokens=*/false);
  // DeepSeek: every projection through CudaLinear::Apply (its bf16 output fully scaled).
  CheckSplit(gpu_test::WriteRandomDeepseek("tp_deepseek_v3_fp8", /*v3=*/true, nullptr,
                                           /*dense_only=*/false, /*fp8_block=*/false,
                                           /*moe_inter_size=*/128),
             2, {.weight_dtype = "fp8"}, kFp8Tolerance, /*same_tokens=*/false);
}

// Dummy weights, for benchmarks of split models too large to ship: each rank draws its tensors at
// its own shapes, so the split model is another random model than the whole one; it loads, steps,
// and gives every rank the same finite logits.
TEST_CASE("TP CUDA: dummy weights load on every rank and step", "[gpu][tensor_parallel_cuda]") {
  const std::string dir = gpu_test::WriteRandomDense("tp_llama", gpu_test::RandomArch::kLlama);
  const Quant q{.dummy_weights = true};
  const Trace whole = RunWhole(dir, q);
  REQUIRE(whole.status.ok());
  const std::vector<Trace> ranks = RunRanks(dir, 2, whole.tokens, q);
  for (const Trace& t : ranks) {
    INFO((t.status.ok() ? std::string() : t.status.message()));
    REQUIRE(t.status.ok());
    REQUIRE(t.logits.size() == whole.logits.size());
    for (const auto& step : t.logits) {
      CHECK(std::all_of(step.begin(), step.end(), [](float v) { return std::isfinite(v); }));
    }
  }
  for (size_t step = 0; step < ranks[0].logits.size(); ++step) {
    const auto& a = ranks[1].logits[step];
    const auto& b = ranks[0].logits[step];
    CHECK((a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0));
  }
}

TEST_CASE("TP CUDA: MoE and o_proj bias refusals on a cuda rank", "[gpu][tensor_parallel_cuda]") {
  const auto refusal = [](const std::string& model_dir, int size) {
    ModelLoadOptions m = Options(model_dir);
    m.tensor_parallel_size = size;
    m.tensor_parallel_one_device = true;
    auto r = LoadModel(m);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  // gpt-oss's MXFP4 experts of 96 at 2 ranks: slices of 48 values, not whole 32-value blocks.
  gpu_test::GptOssShape mx;
  mx.mxfp4 = true;
  mx.expert_inter = 96;
  CHECK(
      refusal(gpu_test::WriteRandomMoe("tp_gpt_oss_mxfp4_96", gpu_test::RandomMoeArch::kGptOss, mx),
              2) ==
      "tensor_parallel_size 2: the MXFP4 experts' intermediate_size 96 splits into slices of 48, "
      "not whole 32-value blocks (a multiple of 32 per rank)");
  // Qwen3-MoE's experts of 128 at 4 ranks, DeepSeek's of 64 at 2: slices of 32, which the
  // grouped GEMMs do not tile.
  CHECK_THAT(
      refusal(gpu_test::WriteRandomMoe("tp_qwen3_moe", gpu_test::RandomMoeArch::kQwen3Moe), 4),
      Catch::Contains("moe_intermediate 32: the grouped GEMMs need"));
  CHECK_THAT(refusal(gpu_test::WriteRandomDeepseek("tp_deepseek", /*v3=*/true, nullptr), 2),
             Catch::Contains("moe_intermediate 32: the grouped GEMMs need"));

  // A rank built by hand on the plan as the CPU decoders take it (o_proj's bias on rank 0 only)
  // would add the bias on one rank after the sum: refused by name.
  const std::string dir = gpu_test::WriteRandomMoe("tp_gpt_oss", gpu_test::RandomMoeArch::kGptOss);
  auto group = DeviceLocalCommunicatorGroup::Create(2, 0);
  REQUIRE(group.ok());
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  auto plan = MakeTensorParallelPlan(*config, TensorParallelOptions{.size = 2, .rank = 0});
  REQUIRE(plan.ok());
  auto full = WeightStore::Open(dir);
  REQUIRE(full.ok());
  auto weights = ShardWeights(**full, *plan);
  REQUIRE(weights.ok());
  auto model = CreateCudaDenseModel(plan->local, weights->get(), Options(dir),
                                    CudaTensorParallelRank{&*plan, (*group)->rank(0)});
  REQUIRE(!model.ok());
  CHECK(model.status().message() ==
        "tensor_parallel_size 2: the cuda rank adds the o_proj bias after the all-reduce: its "
        "plan must replicate it (ReplicateOProjBias)");
}

TEST_CASE("TP CUDA: LoadModel's ranks behind one Model (device-local, eager) match by hand",
          "[gpu][tensor_parallel_cuda]") {
  const std::string dir = gpu_test::WriteRandomDense("tp_llama", gpu_test::RandomArch::kLlama);
  const Trace whole = RunWhole(dir);
  REQUIRE(whole.status.ok());
  ModelLoadOptions o = Options(dir);
  o.tensor_parallel_size = 2;
  o.tensor_parallel_one_device = true;
  auto model = LoadModel(o);
  INFO((model.ok() ? std::string() : model.status().message()));
  REQUIRE(model.ok());
  CHECK(static_cast<size_t>((*model)->config().vocab_size) * 2 == whole.logits[0].size());
  const Trace split = Drive(**model, &whole.tokens);
  CheckAgainstWhole(split, whole);
  CHECK((*model)->graph_steps() == 0);  // the device-local communicator: eager steps only
  // The same ranks driven by hand return the same bits as the model's rank threads.
  const std::vector<Trace> by_hand = RunRanks(dir, 2, whole.tokens);
  REQUIRE(by_hand[0].status.ok());
  for (size_t step = 0; step < split.logits.size(); ++step) {
    CHECK(std::memcmp(split.logits[step].data(), by_hand[0].logits[step].data(),
                      split.logits[step].size() * 4) == 0);
  }

  // Refusals by name: no explicit pool on one device, more devices than present.
  o.num_kv_blocks = 0;
  auto no_pool = LoadModel(o);
  REQUIRE(!no_pool.ok());
  CHECK(no_pool.status().message() ==
        "tensor_parallel_size 2: tensor_parallel_one_device needs an explicit num_kv_blocks");
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 8) {
    ModelLoadOptions many = Options(dir);
    many.tensor_parallel_size = 8;
    auto refused = LoadModel(many);
    REQUIRE(!refused.ok());
    CHECK(refused.status().message() ==
          "tensor_parallel_size 8: needs 8 CUDA devices (one per rank); this machine has " +
              std::to_string(devices));
  }
}

#ifdef LLM_HAVE_NCCL
// A rank of size 1 through NCCL: every collective runs (identity sum, one-slice gather), inside
// the captured decode graphs too; it must be the whole model.
void CheckNcclSizeOne(const std::string& dir) {
  INFO(dir);
  const Trace whole = RunWhole(dir);
  REQUIRE(whole.status.ok());
  auto group = NcclCommunicatorGroup::Create({0});
  INFO((group.ok() ? std::string() : group.status().message()));
  REQUIRE(group.ok());
  auto config = LoadModelConfig(dir);
  REQUIRE(config.ok());
  auto plan = MakeTensorParallelPlan(*config, TensorParallelOptions{.size = 1, .rank = 0});
  REQUIRE(plan.ok());
  auto full = WeightStore::Open(dir);
  REQUIRE(full.ok());
  auto weights = ShardWeights(**full, *plan);
  REQUIRE(weights.ok());
  ModelLoadOptions o = Options(dir);
  o.cuda_graph_warmup = false;  // captured on first use, with the rank's collectives
  auto model = CreateCudaDenseModel(plan->local, weights->get(), o,
                                    CudaTensorParallelRank{&*plan, (*group)->rank(0)});
  INFO((model.ok() ? std::string() : model.status().message()));
  REQUIRE(model.ok());
  const Trace rank = Drive(**model, &whole.tokens);
  CHECK(CheckAgainstWhole(rank, whole) <= 1e-6);
  CHECK((*model)->graph_steps() > 0);
}

TEST_CASE("TP CUDA: a rank of size 1 through NCCL, decode steps in CUDA graphs, is the whole model",
          "[gpu][tensor_parallel_cuda][nccl]") {
  CheckNcclSizeOne(gpu_test::WriteRandomDense("tp_llama", gpu_test::RandomArch::kLlama));
  // The MoE layer's all-reduce captured too; gpt-oss's o_proj bias (rank 0's at size 1).
  CheckNcclSizeOne(gpu_test::WriteRandomMoe("tp_mixtral", gpu_test::RandomMoeArch::kMixtral));
  CheckNcclSizeOne(gpu_test::WriteRandomMoe("tp_gpt_oss", gpu_test::RandomMoeArch::kGptOss));
}
#endif

}  // namespace
}  // namespace llm
