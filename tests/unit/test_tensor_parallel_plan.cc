// The tensor-parallel plan (engine/loader/tensor_parallel_plan.h) on its own: rank-local shapes
// of a Llama-3-8B-sized and a DeepSeek-V3-sized configuration, KV heads split or replicated, the
// vocabulary padded, every refusal's message; the sharded weights' cuts (gpt-oss's MXFP4 experts
// as stored: dequantize(cut) == cut(dequantize)); and the in-process
// communicator's collectives (same bits on every rank, rank order).
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "base/mxfp4.h"
#include "engine/layers/cpu/cpu_moe.h"
#include "engine/loader/kv_cache_quant.h"
#include "engine/loader/sharded_weights.h"
#include "engine/loader/tensor_parallel_plan.h"
#include "engine/runtime/cpu/in_process_communicator.h"

namespace llm {
namespace {

ModelConfig Llama3_8B() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab_size = 128256;
  return c;
}

std::string Message(const StatusOr<TensorParallelPlan>& p) {
  return p.ok() ? std::string("ok") : p.status().message();
}

TEST_CASE("TP plan: Llama-3-8B's rank-local shapes at 1 2 4 and 8 ranks", "[tensor_parallel]") {
  for (int n : {1, 2, 4, 8}) {
    INFO("size " << n);
    for (int r = 0; r < n; ++r) {
      auto plan = MakeTensorParallelPlan(Llama3_8B(), {.size = n, .rank = r});
      REQUIRE(plan.ok());
      CHECK(plan->local.num_q_heads == 32 / n);
      CHECK(plan->local.num_kv_heads == 8 / n);
      CHECK(plan->local.intermediate_size == 14336 / n);
      CHECK(plan->local.vocab_size == 128256 / n);
      CHECK(plan->first_q_head == r * 32 / n);
      CHECK(plan->first_kv_head == r * 8 / n);
      CHECK(plan->vocab_begin == r * (128256 / n));
      CHECK(plan->model.num_q_heads == 32);
      auto o = plan->ShardOf("model.layers.3.self_attn.o_proj.weight", {4096, 4096});
      REQUIRE(o.ok());
      CHECK(o->split == TensorSplit::kRow);
      CHECK(o->dim == 1);
      CHECK(o->begin == r * 4096 / n);
      CHECK(o->count == 4096 / n);
    }
  }
}

TEST_CASE("TP plan: fewer KV heads than ranks replicate the group's KV head", "[tensor_parallel]") {
  ModelConfig c = Llama3_8B();
  c.num_kv_heads = 2;  // 16 query heads per KV head
  for (int r = 0; r < 8; ++r) {
    auto plan = MakeTensorParallelPlan(c, {.size = 8, .rank = r});
    REQUIRE(plan.ok());
    CHECK(plan->local.num_kv_heads == 1);
    // Ranks 0-3 hold query heads 0-15 (KV head 0), ranks 4-7 heads 16-31 (KV head 1).
    CHECK(plan->first_kv_head == r / 4);
    auto k = plan->ShardOf("model.layers.0.self_attn.k_proj.weight", {2 * 128, 4096});
    REQUIRE(k.ok());
    CHECK(k->begin == (r / 4) * 128);
    CHECK(k->count == 128);
  }
}

TEST_CASE("TP plan: a static KV cache's scale tensors follow the rank's KV heads",
          "[tensor_parallel]") {
  for (int kv : {8, 2}) {  // split 4 ways, and fewer KV heads than ranks (replicated)
    ModelConfig c = Llama3_8B();
    c.num_kv_heads = kv;
    for (int r = 0; r < 4; ++r) {
      INFO("kv heads " << kv << ", rank " << r);
      auto plan = MakeTensorParallelPlan(c, {.size = 4, .rank = r});
      REQUIRE(plan.ok());
      const int local = plan->local.num_kv_heads;
      const std::string p = "model.layers.5.self_attn.";
      for (const std::string& name :
           {p + "k_scale", p + "v_scale", p + "attn.k_scale", p + "attn.cache_v_scale",
            p + "cache_k_scale", p + "k_proj.output_scale", p + "v_proj.output_scale"}) {
        INFO(name);
        auto head = plan->ShardOf(name, {kv});  // per head
        REQUIRE(head.ok());
        CHECK(head->split == TensorSplit::kKvHeads);
        CHECK(head->begin == plan->first_kv_head);
        CHECK(head->count == local);
        auto channel = plan->ShardOf(name, {kv * 128});  // per channel, flat
        REQUIRE(channel.ok());
        CHECK(channel->begin == plan->first_kv_head * 128);
        CHECK(channel->count == local * 128);
        auto rows = plan->ShardOf(name, {kv, 128});  // per channel, [heads, head_dim]
        REQUIRE(rows.ok());
        CHECK(rows->dim == 0);
        CHECK(rows->begin == plan->first_kv_head);
      }
    }
  }
}

TEST_CASE("TP: a rank's KV cache scales are its KV heads' of the whole model's",
          "[tensor_parallel]") {
  KvCacheScales whole;
  whole.source = "file";
  for (int l = 0; l < 2; ++l) {
    std::vector<float> k, v;
    for (int i = 0; i < 4 * 3; ++i) {  // 4 KV heads of 3 channels
      k.push_back(100.f * l + i);
      v.push_back(-100.f * l - i);
    }
    whole.k.push_back(k);
    whole.v.push_back(v);
  }
  auto part = KvCacheScalesOfHeads(whole, 2, 2, 3);  // heads 2 and 3, per channel
  REQUIRE(part.ok());
  REQUIRE(part->k.size() == 2);
  REQUIRE(part->v.size() == 2);
  CHECK(part->k[1] == std::vector<float>{106, 107, 108, 109, 110, 111});
  CHECK(part->v[0] == std::vector<float>{-6, -7, -8, -9, -10, -11});
  auto head = KvCacheScalesOfHeads(whole, 1, 1, 1);  // as per-head lists: entry 1
  REQUIRE(head.ok());
  CHECK(head->k[1] == std::vector<float>{101});
  auto outside = KvCacheScalesOfHeads(whole, 3, 2, 3);
  REQUIRE_FALSE(outside.ok());
  CHECK(outside.status().message() ==
        "KV cache scales of layer 0 hold 12 floats, not KV heads [3, 5) of 3");
}

TEST_CASE("TP plan: a vocabulary that does not divide is padded with zero rows",
          "[tensor_parallel]") {
  ModelConfig c = Llama3_8B();
  c.vocab_size = 61;
  int64_t covered = 0;
  for (int r = 0; r < 8; ++r) {
    auto plan = MakeTensorParallelPlan(c, {.size = 8, .rank = r});
    REQUIRE(plan.ok());
    CHECK(plan->local.vocab_size == 8);
    CHECK(plan->vocab_begin == covered);
    CHECK(plan->vocab_rows == (r < 7 ? 8 : 5));
    covered += plan->vocab_rows;
    auto e = plan->ShardOf("model.embed_tokens.weight", {61, 4096});
    REQUIRE(e.ok());
    CHECK(e->padded == 8);
    CHECK(e->count == plan->vocab_rows);
  }
  CHECK(covered == 61);
}

TEST_CASE("TP plan: refusals name the value", "[tensor_parallel]") {
  CHECK(Message(MakeTensorParallelPlan(Llama3_8B(), {.size = 3})) ==
        "tensor_parallel_size must be 1, 2, 4 or 8, got 3");
  CHECK(Message(MakeTensorParallelPlan(Llama3_8B(), {.size = 16})) ==
        "tensor_parallel_size must be 1, 2, 4 or 8, got 16");
  CHECK(Message(MakeTensorParallelPlan(Llama3_8B(), {.size = 2, .rank = 2})) ==
        "tensor_parallel_size 2: rank 2 is outside [0, 2)");
  ModelConfig c = Llama3_8B();
  c.num_q_heads = 12;
  CHECK(Message(MakeTensorParallelPlan(c, {.size = 8})) ==
        "tensor_parallel_size 8: num_attention_heads 12 is not divisible by it");
  c = Llama3_8B();
  c.num_kv_heads = 6;
  c.num_q_heads = 48;
  CHECK(Message(MakeTensorParallelPlan(c, {.size = 4})) ==
        "tensor_parallel_size 4: num_key_value_heads 6 is neither a multiple nor a divisor of it");
  c = Llama3_8B();
  c.intermediate_size = 100;
  CHECK(Message(MakeTensorParallelPlan(c, {.size = 8})) ==
        "tensor_parallel_size 8: intermediate_size 100 is not divisible by it");
  c = Llama3_8B();
  c.architecture = Architecture::kQwen3Moe;
  c.moe.num_experts = 8;
  c.moe.intermediate = 6;
  CHECK(Message(MakeTensorParallelPlan(c, {.size = 4})) ==
        "tensor_parallel_size 4: moe_intermediate_size 6 is not divisible by it");
  CHECK(Message(MakeTensorParallelPlan(Llama3_8B(), {.size = 2, .expert_parallel = true})) ==
        "tensor_parallel_size 2: expert parallelism is not implemented; the MoE layers split "
        "every expert's intermediate dimension across the ranks");
  c = Llama3_8B();
  c.quantization.method = WeightQuantization::Method::kFp8Block;
  c.quantization.quant_method = "fp8";
  CHECK(Message(MakeTensorParallelPlan(c, {.size = 2})) ==
        "tensor_parallel_size 2: the pre-quantized checkpoint (quantization_config fp8) is not "
        "split; tensor parallelism reads float checkpoints and gpt-oss's MXFP4 experts only");
  c = Llama3_8B();
  c.architecture = Architecture::kDeepseekV3;
  c.architecture_name = "DeepseekV3ForCausalLM";
  CHECK(Message(MakeTensorParallelPlan(c, {.size = 2})) ==
        "tensor_parallel_size 2: no tensor-parallel plan for DeepseekV3ForCausalLM");
  auto plan = MakeTensorParallelPlan(Llama3_8B(), {.size = 2});
  REQUIRE(plan.ok());
  auto unknown = plan->ShardOf("model.layers.0.self_attn.qkv_proj.weight", {1, 1});
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message() ==
        "tensor 'model.layers.0.self_attn.qkv_proj.weight' has no tensor-parallel rule "
        "(engine/loader/tensor_parallel_plan.h)");
}

TEST_CASE("TP plan: DeepSeek-V3's MLA heads and latent and experts", "[tensor_parallel]") {
  DeepseekConfig d;
  d.base = Llama3_8B();
  d.base.architecture = Architecture::kDeepseekV3;
  d.base.hidden_size = 7168;
  d.base.num_q_heads = d.base.num_kv_heads = 128;
  d.base.intermediate_size = 18432;
  d.base.num_layers = 61;
  d.q_lora_rank = 1536;
  d.kv_lora_rank = 512;
  d.qk_rope_head_dim = 64;
  d.qk_nope_head_dim = 128;
  d.v_head_dim = 128;
  d.moe_intermediate_size = 2048;
  d.n_routed_experts = 256;
  d.n_shared_experts = 1;
  d.num_nextn_predict_layers = 1;
  auto plan = MakeTensorParallelPlan(d, {.size = 8, .rank = 5});
  REQUIRE(plan.ok());
  REQUIRE(plan->deepseek.has_value());
  CHECK(plan->deepseek->base.num_q_heads == 16);
  CHECK(plan->deepseek->moe_intermediate_size == 256);
  CHECK(plan->deepseek->n_routed_experts == 256);  // every expert, each an eighth of it
  CHECK(plan->deepseek->base.intermediate_size == 2304);
  CHECK(plan->deepseek->kv_lora_rank == 512);  // the whole latent on every rank
  auto q_b = plan->ShardOf("model.layers.0.self_attn.q_b_proj.weight", {128 * 192, 1536});
  REQUIRE(q_b.ok());
  CHECK(q_b->begin == 5 * 16 * 192);
  CHECK(q_b->count == 16 * 192);
  auto kv_a = plan->ShardOf("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", {576, 7168});
  REQUIRE(kv_a.ok());
  CHECK(kv_a->split == TensorSplit::kReplicated);
  auto router = plan->ShardOf("model.layers.3.mlp.gate.e_score_correction_bias", {256});
  REQUIRE(router.ok());
  CHECK(router->split == TensorSplit::kReplicated);
  CHECK(plan->Dropped("model.layers.61.eh_proj.weight"));  // the MTP layer
  CHECK_FALSE(plan->Dropped("model.layers.60.mlp.gate.weight"));
  CHECK_FALSE(plan->Dropped("model.layers.62.eh_proj.weight"));  // not the config's: reported
  CHECK_FALSE(plan->Dropped("model.embed_tokens.weight"));
}

TensorToWrite F32Tensor(const std::string& name, std::vector<int64_t> shape,
                        const std::vector<float>& v) {
  TensorToWrite t{name, DType::kF32, std::move(shape), std::vector<std::byte>(v.size() * 4)};
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

std::vector<float> Read(const WeightStore& w, const std::string& name,
                        const std::vector<int64_t>& shape) {
  std::vector<float> v;
  const Status st = w.ReadF32(name, shape, &v);
  INFO(st.message());
  REQUIRE(st.ok());
  return v;
}

TEST_CASE("TP sharded weights: row and column and first-rank and vocabulary cuts",
          "[tensor_parallel]") {
  ModelConfig c = Llama3_8B();
  c.hidden_size = 2;
  c.num_q_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 1;
  c.intermediate_size = 2;
  c.vocab_size = 3;
  std::vector<TensorToWrite> t;
  t.push_back(F32Tensor("model.embed_tokens.weight", {3, 2}, {1, 2, 3, 4, 5, 6}));
  t.push_back(F32Tensor("model.layers.0.self_attn.o_proj.weight", {2, 2}, {1, 2, 3, 4}));
  t.push_back(F32Tensor("model.layers.0.self_attn.o_proj.bias", {2}, {7, 8}));
  t.push_back(F32Tensor("model.layers.0.self_attn.q_proj.weight", {2, 2}, {1, 2, 3, 4}));
  t.push_back(F32Tensor("model.layers.0.self_attn.k_proj.weight", {1, 2}, {5, 6}));
  t.push_back(F32Tensor("model.layers.0.input_layernorm.weight", {2}, {9, 10}));
  t.push_back(F32Tensor("model.layers.0.self_attn.rotary_emb.inv_freq", {1}, {1}));
  auto full = WeightStore::FromTensors(std::move(t));
  REQUIRE(full.ok());
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    auto plan = MakeTensorParallelPlan(c, {.size = 2, .rank = r});
    REQUIRE(plan.ok());
    auto w = ShardWeights(**full, *plan);
    REQUIRE(w.ok());
    CHECK(Read(**w, "model.embed_tokens.weight", {2, 2}) ==
          (r == 0 ? std::vector<float>{1, 2, 3, 4} : std::vector<float>{5, 6, 0, 0}));
    CHECK(Read(**w, "model.layers.0.self_attn.o_proj.weight", {2, 1}) ==
          (r == 0 ? std::vector<float>{1, 3} : std::vector<float>{2, 4}));
    CHECK(Read(**w, "model.layers.0.self_attn.o_proj.bias", {2}) ==
          (r == 0 ? std::vector<float>{7, 8} : std::vector<float>{0, 0}));
    CHECK(Read(**w, "model.layers.0.self_attn.q_proj.weight", {1, 2}) ==
          (r == 0 ? std::vector<float>{1, 2} : std::vector<float>{3, 4}));
    CHECK(Read(**w, "model.layers.0.self_attn.k_proj.weight", {1, 2}) == std::vector<float>{5, 6});
    CHECK(Read(**w, "model.layers.0.input_layernorm.weight", {2}) == std::vector<float>{9, 10});
    CHECK(Read(**w, "model.layers.0.self_attn.rotary_emb.inv_freq", {1}) ==
          std::vector<float>{1});  // ignored by the loaders, carried whole
    CHECK((*w)->CheckAllConsumed("test").ok());
    // The CUDA ranks add o_proj's bias after the all-reduce: every rank holds all of it, and
    // nothing else changes.
    ReplicateOProjBias(&*plan);
    auto replicated = ShardWeights(**full, *plan);
    REQUIRE(replicated.ok());
    CHECK(Read(**replicated, "model.layers.0.self_attn.o_proj.bias", {2}) ==
          std::vector<float>{7, 8});
    CHECK(Read(**replicated, "model.layers.0.self_attn.o_proj.weight", {2, 1}) ==
          (r == 0 ? std::vector<float>{1, 3} : std::vector<float>{2, 4}));
  }
}

TEST_CASE("TP sharded weights: a static KV cache's scales are cut to the rank's KV heads",
          "[tensor_parallel]") {
  ModelConfig c = Llama3_8B();
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 2;
  std::vector<TensorToWrite> t;
  const std::string p = "model.layers.0.self_attn.";
  t.push_back(F32Tensor(p + "k_scale", {2}, {0.5f, 0.25f}));                   // per head
  t.push_back(F32Tensor(p + "v_scale", {2, 2}, {1, 2, 3, 4}));                 // per channel
  t.push_back(F32Tensor(p + "k_proj.output_scale", {4}, {5, 6, 7, 8}));        // flat channels
  t.push_back(F32Tensor("model.layers.1.self_attn.k_scale", {}, {0.125f}));    // a scalar
  t.push_back(F32Tensor("model.layers.1.self_attn.kv_scale", {}, {0.0625f}));  // MLA's, a scalar
  auto full = WeightStore::FromTensors(std::move(t));
  REQUIRE(full.ok());
  for (int size : {2, 4}) {  // KV heads split, then replicated (ranks 0-1 head 0, 2-3 head 1)
    for (int r = 0; r < size; ++r) {
      INFO("size " << size << ", rank " << r);
      auto plan = MakeTensorParallelPlan(c, {.size = size, .rank = r});
      REQUIRE(plan.ok());
      auto w = ShardWeights(**full, *plan);
      REQUIRE(w.ok());
      const int h = plan->first_kv_head;
      CHECK(Read(**w, p + "k_scale", {1}) == std::vector<float>{h == 0 ? 0.5f : 0.25f});
      CHECK(Read(**w, p + "v_scale", {1, 2}) ==
            (h == 0 ? std::vector<float>{1, 2} : std::vector<float>{3, 4}));
      CHECK(Read(**w, p + "k_proj.output_scale", {2}) ==
            (h == 0 ? std::vector<float>{5, 6} : std::vector<float>{7, 8}));
      CHECK(Read(**w, "model.layers.1.self_attn.k_scale", {}) == std::vector<float>{0.125f});
      CHECK(Read(**w, "model.layers.1.self_attn.kv_scale", {}) == std::vector<float>{0.0625f});
      CHECK((*w)->CheckAllConsumed("test").ok());
    }
  }
}

// gpt-oss-20b's sizes (hidden 2880, experts of intermediate 2880, 64 query and 8 KV heads),
// its checkpoint's MXFP4 experts.
ModelConfig GptOss20B() {
  ModelConfig c = Llama3_8B();
  c.architecture = Architecture::kGptOss;
  c.architecture_name = "GptOssForCausalLM";
  c.hidden_size = 2880;
  c.intermediate_size = 2880;
  c.num_q_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 201088;
  c.moe.num_experts = 32;
  c.moe.top_k = 4;
  c.moe.intermediate = 2880;
  c.quantization.method = WeightQuantization::Method::kMxfp4;
  c.quantization.quant_method = "mxfp4";
  return c;
}

TEST_CASE("TP plan: gpt-oss's MXFP4 experts split in whole 32-value blocks or are refused",
          "[tensor_parallel][mxfp4]") {
  auto plan = MakeTensorParallelPlan(GptOss20B(), {.size = 2, .rank = 1});
  INFO(Message(plan));
  REQUIRE(plan.ok());
  CHECK(plan->local.moe.intermediate == 1440);  // 45 blocks of 32
  const std::string p = "model.layers.3.mlp.experts.";
  auto gate_up = plan->ShardOf(p + "gate_up_proj_blocks", {32, 5760, 90, 16});
  REQUIRE(gate_up.ok());
  CHECK((gate_up->dim == 1 && gate_up->begin == 2880 && gate_up->count == 2880));
  auto gate_up_scales = plan->ShardOf(p + "gate_up_proj_scales", {32, 5760, 90});
  REQUIRE(gate_up_scales.ok());
  CHECK((gate_up_scales->dim == 1 && gate_up_scales->begin == 2880));
  auto down = plan->ShardOf(p + "down_proj_blocks", {32, 2880, 90, 16});
  REQUIRE(down.ok());
  CHECK((down->split == TensorSplit::kRow && down->dim == 2 && down->begin == 45 &&
         down->count == 45));
  auto down_scales = plan->ShardOf(p + "down_proj_scales", {32, 2880, 90});
  REQUIRE(down_scales.ok());
  CHECK((down_scales->dim == 2 && down_scales->begin == 45 && down_scales->count == 45));
  auto down_bias = plan->ShardOf(p + "down_proj_bias", {32, 2880});
  REQUIRE(down_bias.ok());
  CHECK((down_bias->split == TensorSplit::kFirstRank && down_bias->zeros));
  // 2880 / 4 = 720 and / 8 = 360: not whole blocks.
  CHECK(Message(MakeTensorParallelPlan(GptOss20B(), {.size = 4})) ==
        "tensor_parallel_size 4: the MXFP4 experts' intermediate_size 2880 splits into slices of "
        "720, not whole 32-value blocks (a multiple of 32 per rank)");
  CHECK(Message(MakeTensorParallelPlan(GptOss20B(), {.size = 8})) ==
        "tensor_parallel_size 8: the MXFP4 experts' intermediate_size 2880 splits into slices of "
        "360, not whole 32-value blocks (a multiple of 32 per rank)");
  // The same sizes in bf16 split 4 ways (no blocks to keep whole).
  ModelConfig bf16 = GptOss20B();
  bf16.quantization = {};
  CHECK(Message(MakeTensorParallelPlan(bf16, {.size = 4})) == "ok");
}

TensorToWrite U8Tensor(const std::string& name, std::vector<int64_t> shape, uint32_t seed, int lo,
                       int hi) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  TensorToWrite t{name, DType::kU8, std::move(shape), std::vector<std::byte>(n)};
  uint32_t x = seed;
  for (auto& b : t.data) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(lo + (x >> 8) % (hi - lo + 1));
  }
  return t;
}

// The whole tensor's MXFP4 blocks dequantized: [E, rows, k].
std::vector<float> Dequantized(const TensorToWrite& blocks, const TensorToWrite& scales) {
  std::vector<float> out(blocks.data.size() * 2);
  DequantizeMxfp4(reinterpret_cast<const uint8_t*>(blocks.data.data()),
                  reinterpret_cast<const uint8_t*>(scales.data.data()), scales.data.size(),
                  out.data());
  return out;
}

TEST_CASE("TP sharded weights: MXFP4 blocks and scales cut as stored dequantize to the cut",
          "[tensor_parallel][mxfp4]") {
  // Experts of hidden 64 and intermediate 128: gate_up [E, 256, 2 blocks], down [E, 64, 4 blocks].
  const int64_t E = 3, H = 64, I = 128;
  ModelConfig c = GptOss20B();
  c.hidden_size = H;
  c.intermediate_size = c.moe.intermediate = I;
  c.moe.num_experts = E;
  c.num_q_heads = c.num_kv_heads = 4;
  c.vocab_size = 8;
  const std::string p = "model.layers.0.mlp.experts.";
  // Every nibble, scales 2^-20 .. 2^20.
  const TensorToWrite gu_b = U8Tensor(p + "gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, 1, 0, 255);
  const TensorToWrite gu_s = U8Tensor(p + "gate_up_proj_scales", {E, 2 * I, H / 32}, 2, 107, 147);
  const TensorToWrite d_b = U8Tensor(p + "down_proj_blocks", {E, H, I / 32, 16}, 3, 0, 255);
  const TensorToWrite d_s = U8Tensor(p + "down_proj_scales", {E, H, I / 32}, 4, 107, 147);
  const std::vector<float> gate_up = Dequantized(gu_b, gu_s);  // [E, 2I, H]
  const std::vector<float> down = Dequantized(d_b, d_s);       // [E, H, I]
  auto full = WeightStore::FromTensors({gu_b, gu_s, d_b, d_s});
  REQUIRE(full.ok());
  (*full)->set_quantization(c.quantization);
  for (int n : {2, 4}) {
    const int64_t Ir = I / n;
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << " of " << n);
      auto plan = MakeTensorParallelPlan(c, {.size = n, .rank = r});
      INFO(Message(plan));
      REQUIRE(plan.ok());
      auto w = ShardWeights(**full, *plan);
      INFO((w.ok() ? std::string() : w.status().message()));
      REQUIRE(w.ok());
      CHECK(*(*w)->StoredDType(p + "down_proj_blocks") == DType::kU8);
      // The CPU loader's read of the rank's tensors ([E, out, in], dequantized).
      std::vector<float> got_gu, got_down;
      const Status st_gu = ReadExpertMatrix(**w, p + "gate_up_proj", E, H, 2 * Ir, &got_gu);
      INFO(st_gu.message());
      REQUIRE(st_gu.ok());
      const Status st_down = ReadExpertMatrix(**w, p + "down_proj", E, Ir, H, &got_down);
      INFO(st_down.message());
      REQUIRE(st_down.ok());
      // gate_up: rows [2 r Ir, 2 (r + 1) Ir) of each expert (interleaved gate / up pairs whole).
      std::vector<float> want_gu, want_down;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t row = 2 * r * Ir; row < 2 * (r + 1) * Ir; ++row) {
          const float* src = gate_up.data() + (e * 2 * I + row) * H;
          want_gu.insert(want_gu.end(), src, src + H);
        }
        // down: columns [r Ir, (r + 1) Ir) of every row.
        for (int64_t row = 0; row < H; ++row) {
          const float* src = down.data() + (e * H + row) * I + r * Ir;
          want_down.insert(want_down.end(), src, src + Ir);
        }
      }
      CHECK(got_gu == want_gu);
      CHECK(got_down == want_down);
      CHECK((*w)->CheckAllConsumed("test").ok());
    }
  }
}

TEST_CASE("In-process communicator: rank-order sums and gathers with the same bits on every rank",
          "[tensor_parallel]") {
  for (int n : {1, 2, 4, 8}) {
    INFO("size " << n);
    InProcessCommunicatorGroup group(n);
    // Values whose fp32 sum depends on the order: 1e8 and 1 cancel differently by position.
    std::vector<std::vector<float>> bufs(n), gathered(n);
    std::vector<std::vector<uint16_t>> halves(n);
    std::vector<Status> status(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      bufs[r] = {r % 2 == 0 ? 1e8f : 1.0f, static_cast<float>(r), -0.5f * r};
      halves[r] = {F32ToBf16(0.1f * (r + 1)), F32ToBf16(-1.5f)};
      gathered[r].assign(2 * n, 0.0f);
    }
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        Communicator* c = group.rank(r);
        Status st = c->AllReduceSum(bufs[r].data(), bufs[r].size(), DType::kF32, nullptr);
        if (st.ok()) st = c->AllReduceSum(halves[r].data(), 2, DType::kBF16, nullptr);
        const float mine[2] = {static_cast<float>(r), static_cast<float>(10 * r)};
        if (st.ok()) st = c->AllGather(mine, gathered[r].data(), 2, DType::kF32, nullptr);
        status[r] = st;
      });
    }
    for (std::thread& t : threads) t.join();
    float expect0 = 0.0f, expect1 = 0.0f, expect2 = 0.0f, half0 = 0.0f;
    for (int r = 0; r < n; ++r) {  // rank order
      expect0 += r % 2 == 0 ? 1e8f : 1.0f;
      expect1 += static_cast<float>(r);
      expect2 += -0.5f * r;
      half0 += Bf16ToF32(F32ToBf16(0.1f * (r + 1)));
    }
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      REQUIRE(status[r].ok());
      CHECK(bufs[r] == std::vector<float>{expect0, expect1, expect2});
      CHECK(halves[r][0] == F32ToBf16(half0));
      CHECK(Bf16ToF32(halves[r][1]) == -1.5f * n);
      for (int k = 0; k < n; ++k) {
        CHECK(gathered[r][2 * k] == static_cast<float>(k));
        CHECK(gathered[r][2 * k + 1] == static_cast<float>(10 * k));
      }
    }
  }
}

TEST_CASE("In-process communicator: other dtypes and a stream are refused and empty buffers pass",
          "[tensor_parallel]") {
  InProcessCommunicatorGroup group(1);
  int8_t x = 0;
  CHECK(group.rank(0)->AllReduceSum(&x, 1, DType::kI8, nullptr).message() ==
        "collectives take float32 or bfloat16 buffers, not " + std::string(DTypeName(DType::kI8)));
  float f = 0.0f;
  CHECK(group.rank(0)->AllReduceSum(&f, 1, DType::kF32, &f).message() ==
        "the in-process communicator takes no stream");
  // Empty buffers (a step without logit rows) may be null.
  CHECK(group.rank(0)->AllReduceSum(nullptr, 0, DType::kF32, nullptr).ok());
  CHECK(group.rank(0)->AllGather(nullptr, nullptr, 0, DType::kBF16, nullptr).ok());
}

}  // namespace
}  // namespace llm
