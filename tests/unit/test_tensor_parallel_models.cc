// Tensor-parallel CPU models against the whole model: each tiny checkpoint is split N ways
// (LoadTensorParallelRank, one rank per thread, the in-process communicator), run over a prefill
// step of two sequences and several greedy decode steps, and its logits compared with the
// unsharded model's (LoadModel) at every step.
//
// Tolerance: the ranks add the same products in another order (each rank's partial sums, then the
// sum over ranks), so the logits differ by fp32 rounding only: max |sharded - whole| <= 1e-4 x
// max |whole| per step, and the greedy tokens are equal. Every rank gets the same bits (the
// collectives sum in rank order), and size 1 is the whole model bit for bit. A plan with a wrong
// rule fails: a replicated row-split bias by the tolerance, a column-split o_proj at load.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/architectures/cpu_dense_decoder.h"
#include "engine/loader/sharded_weights.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/cpu/cpu_model_runner.h"
#include "engine/runtime/cpu/in_process_communicator.h"
#include "engine/runtime/tensor_parallel_model.h"
#include "tests/gpu/engine_generate.h"  // device-neutral: drives the CPU model here
#include "tests/unit/tensor_parallel_trace.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

constexpr int kBlockSize = 4;
constexpr int kBlocksPerSeq = 8;
constexpr int kDecodeSteps = 4;
constexpr double kRelTolerance = 1e-4;

using tp_trace::RelativeError;
using tp_trace::Trace;

// Prompts of 5 and 9 tokens prefilled together, then kDecodeSteps one-token steps.
Trace Drive(Model& model) {
  return tp_trace::Drive(model, {kBlockSize,
                                 kBlocksPerSeq,
                                 kDecodeSteps,
                                 {{3, 9, 27, 17, 51}, {2, 40, 11, 5, 33, 8, 1, 60, 7}}});
}

ModelLoadOptions Options(const std::string& dir) {
  ModelLoadOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  o.block_size = kBlockSize;
  o.num_kv_blocks = 2 * kBlocksPerSeq;
  return o;
}

Trace RunWhole(const std::string& dir) {
  auto model = LoadModel(Options(dir));
  INFO((model.ok() ? std::string() : model.status().message()));
  REQUIRE(model.ok());
  return Drive(**model);
}

// Loads rank r of `size` with `load`, then runs every rank in its own thread.
using RankLoader = std::function<StatusOr<std::unique_ptr<Model>>(Communicator*)>;

StatusOr<std::vector<Trace>> RunRanks(int size, const RankLoader& load) {
  InProcessCommunicatorGroup group(size);
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < size; ++r) {
    LLM_ASSIGN_OR_RETURN(auto m, load(group.rank(r)));
    ranks.push_back(std::move(m));
  }
  std::vector<Trace> traces(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { traces[r] = Drive(*ranks[r]); });
  for (std::thread& t : threads) t.join();
  return traces;
}

StatusOr<std::vector<Trace>> RunSharded(const std::string& dir, int size) {
  return RunRanks(size,
                  [&](Communicator* comm) { return LoadTensorParallelRank(Options(dir), comm); });
}

// Whether `sharded` matches `whole` within the tolerance at every step, with the same tokens.
bool Matches(const Trace& sharded, const Trace& whole, double* worst) {
  *worst = 0.0;
  if (!sharded.status.ok() || sharded.logits.size() != whole.logits.size()) return false;
  for (size_t s = 0; s < whole.logits.size(); ++s) {
    if (sharded.logits[s].size() != whole.logits[s].size()) return false;
    *worst = std::max(*worst, RelativeError(sharded.logits[s], whole.logits[s]));
  }
  return *worst <= kRelTolerance && sharded.tokens == whole.tokens;
}

// Every size: the sizes that split the model match it, rank for rank the same bits; the others
// are refused with the plan's message.
void CheckSplits(const std::string& dir, int num_heads, std::initializer_list<int> sizes) {
  const Trace whole = RunWhole(dir);
  REQUIRE(whole.status.ok());
  for (int n : sizes) {
    INFO("tensor_parallel_size " << n);
    auto traces = RunSharded(dir, n);
    if (num_heads % n != 0) {
      REQUIRE_FALSE(traces.ok());
      CHECK(traces.status().message() == "tensor_parallel_size " + std::to_string(n) +
                                             ": num_attention_heads " + std::to_string(num_heads) +
                                             " is not divisible by it");
      continue;
    }
    INFO((traces.ok() ? std::string() : traces.status().message()));
    REQUIRE(traces.ok());
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << (*traces)[r].status.message());
      REQUIRE((*traces)[r].status.ok());
      CHECK((*traces)[r].logits == (*traces)[0].logits);
    }
    if (n == 1) {
      CHECK((*traces)[0].logits == whole.logits);
      continue;
    }
    double worst = 0.0;
    const bool matches = Matches((*traces)[0], whole, &worst);
    INFO("max error / logit scale " << worst);
    CHECK(matches);  // the tolerance and the greedy tokens
  }
}

// A Llama with q/k/v/o and MLP biases (attention_bias, mlp_bias): the row-split biases.
test::TinyCheckpoint LlamaWithBiases(const test::TinyLlamaShape& shape) {
  test::TinyCheckpoint c = test::TinyLlama("llama", 7, shape);
  c.config["attention_bias"] = true;
  c.config["mlp_bias"] = true;
  uint32_t seed = 7700;
  const int q = shape.heads * shape.d, kv = shape.kv_heads * shape.d;
  for (int l = 0; l < shape.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    c.AddF32(p + "self_attn.q_proj.bias", {q}, 0, 0.3f, ++seed);
    c.AddF32(p + "self_attn.k_proj.bias", {kv}, 0, 0.3f, ++seed);
    c.AddF32(p + "self_attn.v_proj.bias", {kv}, 0, 0.3f, ++seed);
    c.AddF32(p + "self_attn.o_proj.bias", {shape.h}, 0, 0.3f, ++seed);
    c.AddF32(p + "mlp.gate_proj.bias", {shape.inter}, 0, 0.3f, ++seed);
    c.AddF32(p + "mlp.up_proj.bias", {shape.inter}, 0, 0.3f, ++seed);
    c.AddF32(p + "mlp.down_proj.bias", {shape.h}, 0, 0.3f, ++seed);
  }
  return c;
}

// 8 query heads, so every size splits them; a vocabulary of 61 is padded at 2, 4 and 8 ranks.
test::TinyLlamaShape EightHeads(int kv_heads) {
  return {.h = 32, .heads = 8, .kv_heads = kv_heads, .d = 8, .inter = 48, .layers = 2, .vocab = 61};
}

TEST_CASE("TP Llama: GQA with 2 KV heads (replicated at 4 and 8 ranks) matches the whole model",
          "[tensor_parallel]") {
  test::TempDir dir("tp_llama_gqa");
  test::TinyLlama("llama", 11, EightHeads(2)).Write(dir.path());
  CheckSplits(dir.path().string(), 8, {1, 2, 4, 8});
}

TEST_CASE("TP Llama: 8 KV heads (split at every size) matches the whole model",
          "[tensor_parallel]") {
  test::TempDir dir("tp_llama_mha");
  test::TinyLlama("llama", 12, EightHeads(8)).Write(dir.path());
  CheckSplits(dir.path().string(), 8, {1, 2, 4, 8});
}

TEST_CASE("TP Qwen2 (q/k/v biases) and Llama with attention and MLP biases match",
          "[tensor_parallel]") {
  {
    test::TempDir dir("tp_qwen2");
    test::TinyLlama("qwen2", 13, EightHeads(4)).Write(dir.path());
    CheckSplits(dir.path().string(), 8, {2, 4, 8});
  }
  test::TempDir dir("tp_llama_bias");
  LlamaWithBiases(EightHeads(2)).Write(dir.path());
  CheckSplits(dir.path().string(), 8, {1, 2, 4, 8});
}

// The Hugging Face fixture of `family` (tests/fixtures/models: its config.json as transformers
// wrote it, its tensor names and shapes from weights.json) with random weights of the recorded
// scales, its vocabulary cut to 509 rows (prime: padded at every size).
test::TinyCheckpoint FixtureCheckpoint(const std::string& family) {
  const std::string dir = std::string(LLM_SOURCE_DIR) + "/tests/fixtures/models/" + family;
  test::TinyCheckpoint c;
  c.config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  const nlohmann::json weights = nlohmann::json::parse(std::ifstream(dir + "/weights.json"));
  const int64_t vocab = 509;
  const std::string old_vocab = c.config["vocab_size"].dump();
  c.config["vocab_size"] = vocab;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (c.config.contains(key)) c.config[key] = 1;
  }
  uint32_t seed = 41000;
  for (const auto& t : weights["tensors"]) {
    std::vector<int64_t> shape = t["shape"].get<std::vector<int64_t>>();
    const std::string name = t["name"].get<std::string>();
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") shape[0] = vocab;
    c.AddF32(name, shape, t["offset"].get<float>(), t["scale"].get<float>(), ++seed);
  }
  return c;
}

// The Hugging Face fixtures of every family the dense decoder serves, and DeepSeek's: 4 query
// heads, so 8 ranks are refused.
TEST_CASE("TP: every family's HF fixture matches at 2 and 4 ranks and 8 is refused",
          "[tensor_parallel]") {
  const std::string family = GENERATE("mistral", "qwen2", "qwen3", "gemma2", "gemma3", "mixtral",
                                      "qwen3_moe", "gpt_oss", "deepseek_v2", "deepseek_v3");
  INFO(family);
  test::TempDir dir("tp_fixture");
  FixtureCheckpoint(family).Write(dir.path());
  CheckSplits(dir.path().string(), 4, {2, 4, 8});
}

// gpt-oss's MXFP4 checkpoint as transformers writes it (tests/fixtures/models/gpt_oss_mxfp4:
// uint8 *_blocks / *_scales experts of intermediate 128, 4 query heads): the ranks cut the
// blocks as stored (64 and 32 values of down_proj's k at 2 and 4 ranks) and dequantize their
// cut at load as the whole model dequantizes all of it; 8 ranks are refused by the heads. On a
// cpu rank, moe_weight_dtype mxfp4 is refused as the unsharded load refuses it.
TEST_CASE("TP gpt-oss: the MXFP4 checkpoint matches at 2 and 4 ranks and 8 is refused",
          "[tensor_parallel][mxfp4]") {
  const std::string dir = std::string(LLM_SOURCE_DIR) + "/tests/fixtures/models/gpt_oss_mxfp4";
  CheckSplits(dir, 4, {2, 4, 8});
  InProcessCommunicatorGroup group(2);
  ModelLoadOptions o = Options(dir);
  o.moe_weight_dtype = "mxfp4";
  auto m = LoadTensorParallelRank(o, group.rank(0));
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().message() ==
        "moe_weight_dtype mxfp4 needs the cuda device (the cpu models compute in fp32)");
}

// A DeepSeek of 8 MLA heads (kv_lora 16, rope 8) with MoE layers after one dense layer: V2-Lite's
// routing (softmax, greedy, two shared experts) or V3's (q LoRA, sigmoid scores with a selection
// bias, 4 groups of which 2 are kept, one shared expert, scaled).
test::TinyCheckpoint TinyDeepseekMoe(bool v3) {
  // TinyDeepseekV2's MLA dimensions with 8 heads, 3 layers (one dense), 8 experts.
  const int heads = 8, layers = 3, moe_inter = 16, experts = 8, q_lora = 24, vocab = 61;
  const int shared = v3 ? 1 : 2;
  test::TinyCheckpoint c;
  c.config = test::TinyDeepseekV2().config;
  c.config.update({{"num_attention_heads", heads},
                   {"num_key_value_heads", heads},
                   {"num_hidden_layers", layers},
                   {"vocab_size", vocab},
                   {"moe_intermediate_size", moe_inter},
                   {"n_routed_experts", experts},
                   {"n_shared_experts", shared},
                   {"num_experts_per_tok", 2},
                   {"first_k_dense_replace", 1},
                   {"moe_layer_freq", 1},
                   {"norm_topk_prob", false},
                   {"routed_scaling_factor", 1.0},
                   {"topk_method", "greedy"},
                   {"scoring_func", "softmax"}});
  if (v3) {
    c.config.update({{"architectures", {"DeepseekV3ForCausalLM"}},
                     {"model_type", "deepseek_v3"},
                     {"q_lora_rank", q_lora},
                     {"routed_scaling_factor", 2.5},
                     {"scoring_func", "sigmoid"},
                     {"topk_method", "noaux_tc"},
                     {"n_group", 4},
                     {"topk_group", 2},
                     {"norm_topk_prob", true}});
  }
  test::AddTinyDeepseekMoeTensors(&c, {.std = 0.3f,
                                       .router_std = 0.5f,
                                       .router_bias_std = v3 ? 0.1f : -1.0f,
                                       .seed = v3 ? 31000u : 32000u});
  return c;
}

TEST_CASE("TP DeepSeek: V2-Lite-like and V3-like MLA + MoE match at 1 2 4 and 8 ranks",
          "[tensor_parallel][deepseek]") {
  const bool v3 = GENERATE(false, true);
  INFO((v3 ? "V3-like" : "V2-Lite-like"));
  test::TempDir dir("tp_deepseek");
  TinyDeepseekMoe(v3).Write(dir.path());
  CheckSplits(dir.path().string(), 8, {1, 2, 4, 8});
}

TEST_CASE("TP: a rank refuses the options it does not run by name", "[tensor_parallel]") {
  test::TempDir dir("tp_refusals");
  test::TinyLlama("llama", 14, EightHeads(2)).Write(dir.path());
  InProcessCommunicatorGroup group(2);
  auto message = [&](const ModelLoadOptions& o) {
    auto m = LoadTensorParallelRank(o, group.rank(1));
    return m.ok() ? std::string("ok") : m.status().message();
  };
  ModelLoadOptions o = Options(dir.path().string());
#ifndef LLM_HAVE_CUDA
  o.device = "cuda";
  CHECK(message(o) ==
        "device 'cuda' requested but this build has no CUDA backend (configure with the cuda "
        "preset)");
#endif
  o = Options(dir.path().string());
  o.kv_cache_dtype = "int8";
  CHECK(message(o) ==
        "tensor_parallel_size 2: kv_cache_dtype int8 (a cpu rank keeps an fp32 KV cache) is not "
        "supported with tensor parallelism");
  o = Options(dir.path().string());
  o.weight_dtype = "fp8";
  CHECK(message(o) ==
        "tensor_parallel_size 2: weight_dtype fp8 (on a cpu rank) is not supported with tensor "
        "parallelism");
  o = Options("synthetic:vocab=40");
  CHECK(message(o) == "tensor_parallel_size 2: a synthetic model has no weights to split");
  CHECK(message(Options(dir.path().string())) == "ok");
}

TEST_CASE("TP: LoadModel with tensor_parallel_size runs the ranks behind one Model",
          "[tensor_parallel]") {
  const bool deepseek = GENERATE(false, true);
  INFO((deepseek ? "DeepSeek-V3-like" : "Llama GQA"));
  test::TempDir dir("tp_split_model");
  (deepseek ? TinyDeepseekMoe(true) : test::TinyLlama("llama", 15, EightHeads(2)))
      .Write(dir.path());
  const std::string d = dir.path().string();
  const Trace whole = RunWhole(d);
  ModelLoadOptions o = Options(d);
  o.tensor_parallel_size = 4;
  auto model = LoadModel(o);
  INFO((model.ok() ? std::string() : model.status().message()));
  REQUIRE(model.ok());
  auto* split = dynamic_cast<TensorParallelModel*>(model->get());
  REQUIRE(split != nullptr);
  CHECK(split->size() == 4);
  CHECK((*model)->config().num_q_heads == 8);  // the model's, not a rank's
  CHECK((*model)->config().vocab_size == 61);
  double worst = 0.0;
  const bool matches = Matches(Drive(**model), whole, &worst);
  INFO("max error / logit scale " << worst);
  CHECK(matches);

  o.tensor_parallel_size = 3;
  auto refused = LoadModel(o);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message() == "tensor_parallel_size must be 1, 2, 4 or 8, got 3");
}

TEST_CASE("TP: the rank threads run the start hook first, and a failed start runs no rank",
          "[tensor_parallel]") {
  const bool fail = GENERATE(false, true);
  INFO((fail ? "rank 1's start fails" : "every start succeeds"));
  test::TempDir dir("tp_start_hook");
  test::TinyLlama("llama", 16, EightHeads(2)).Write(dir.path());
  auto group = std::make_unique<InProcessCommunicatorGroup>(2);
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < 2; ++r) {
    auto m = LoadTensorParallelRank(Options(dir.path().string()), group->rank(r));
    REQUIRE(m.ok());
    ranks.push_back(std::move(m).value());
  }
  std::mutex mu;
  std::vector<std::pair<int, std::thread::id>> calls;  // (rank, thread) of every hook call
  TensorParallelModel model(std::move(group), std::move(ranks), [&](int r) {
    std::lock_guard<std::mutex> lock(mu);
    calls.emplace_back(r, std::this_thread::get_id());
    return fail && r == 1 ? Internal("no device for rank 1") : Status::Ok();
  });
  {
    // The constructor returned once rank 1's thread had run its hook.
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].first == 1);
    CHECK(calls[0].second != std::this_thread::get_id());
  }
  const Trace trace = Drive(model);
  if (fail) {
    CHECK(model.start_status().message() == "no device for rank 1");
    CHECK(trace.status.message() == "no device for rank 1");
    return;
  }
  REQUIRE(trace.status.ok());
  std::lock_guard<std::mutex> lock(mu);
  // Rank 0's hook on the calling thread before each forward; rank 1's once, on its thread.
  CHECK(calls.size() == 1 + kDecodeSteps + 1);
  for (size_t i = 1; i < calls.size(); ++i) {
    CHECK(calls[i].first == 0);
    CHECK(calls[i].second == std::this_thread::get_id());
  }
}

TEST_CASE("TP: the engine generates the same greedy tokens split 2 and 8 ways",
          "[tensor_parallel]") {
  test::TempDir dir("tp_engine");
  TinyDeepseekMoe(false).Write(dir.path());
  // Prompts longer than the token budget: chunked prefill beside decode steps.
  const std::vector<std::vector<int32_t>> prompts = {{3, 9, 27, 17, 51, 2, 40, 11, 5, 33, 8},
                                                     {7, 1, 60}};
  gpu_test::GenerateOptions o{
      .device = "cpu", .block_size = 4, .num_kv_blocks = 32, .max_batched_tokens = 8, .steps = 6};
  const auto whole = gpu_test::Generate(dir.path().string(), prompts, o);
  REQUIRE(whole.tokens.size() == 2);
  CHECK(whole.tokens[0].size() == 6);
  CHECK(whole.tokens[1].size() == 6);
  for (int n : {2, 8}) {
    INFO("tensor_parallel_size " << n);
    o.tensor_parallel_size = n;
    const auto split = gpu_test::Generate(dir.path().string(), prompts, o);
    CHECK(split.tokens == whole.tokens);
  }
}

// Rank comm->rank()'s dense model, cut by the plan with `rule` in place of the rule of its key.
StatusOr<std::unique_ptr<Model>> LoadWithRule(const std::string& dir, Communicator* comm,
                                              const TensorRule& rule) {
  LLM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  LLM_ASSIGN_OR_RETURN(
      TensorParallelPlan plan,
      MakeTensorParallelPlan(config, {.size = comm->size(), .rank = comm->rank()}));
  for (TensorRule& r : plan.rules) {
    if (r.key == rule.key) r = rule;
  }
  LLM_ASSIGN_OR_RETURN(auto full, WeightStore::Open(dir));
  LLM_ASSIGN_OR_RETURN(auto weights, ShardWeights(*full, plan));
  LLM_ASSIGN_OR_RETURN(auto decoder, NewCpuDenseDecoder(plan.local));
  LLM_ASSIGN_OR_RETURN(auto model, CpuModelRunner::Create(std::move(decoder), *weights,
                                                          Options(dir), {&plan, comm}));
  return std::unique_ptr<Model>(std::move(model));
}

TEST_CASE("TP: a wrong rule in the plan fails the comparison or the load", "[tensor_parallel]") {
  test::TempDir dir("tp_wrong_rule");
  LlamaWithBiases(EightHeads(2)).Write(dir.path());
  const std::string d = dir.path().string();
  const Trace whole = RunWhole(d);
  REQUIRE(whole.status.ok());
  auto run = [&](const TensorRule& rule) {
    return RunRanks(4, [&](Communicator* comm) { return LoadWithRule(d, comm, rule); });
  };
  {
    INFO("the right rule passes the same comparison");
    auto traces = run({"o_proj.bias", TensorSplit::kFirstRank, 0});
    REQUIRE(traces.ok());
    double worst = 0.0;
    CHECK(Matches((*traces)[0], whole, &worst));
  }
  {
    INFO("o_proj's bias on every rank: added 4 times");
    auto traces = run({"o_proj.bias", TensorSplit::kReplicated, 0});
    REQUIRE(traces.ok());
    double worst = 0.0;
    CHECK_FALSE(Matches((*traces)[0], whole, &worst));
    CHECK(worst > 1e-2);
  }
  {
    INFO("o_proj split by output rows (column) instead of input columns (row)");
    auto traces = run({"o_proj.weight", TensorSplit::kColumn, 0});
    REQUIRE_FALSE(traces.ok());
    CHECK_THAT(traces.status().message(),
               Catch::Contains("model.layers.0.self_attn.o_proj.weight"));
  }
}

}  // namespace
}  // namespace llm
