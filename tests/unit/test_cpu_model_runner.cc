// The CPU model runner's own duties on tiny random checkpoints: KV cache sizing from the backend's
// BlockBytes() and the options, the KV observer (per-head K/V architectures only), token id
// checks, and that a forward of one prompt in two chunks gives the logits
// of the prompt in one (the runner's cache carries the first chunk's K/V, or latents, over).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/runtime/cpu/cpu_model_runner.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

// One sequence's rows [begin, end) of a prompt whose cache lives in blocks 0, 1, ...
ForwardBatch Chunk(const std::vector<int32_t>& prompt, int begin, int end, int block_size) {
  ForwardBatch b;
  b.token_ids.assign(prompt.begin() + begin, prompt.begin() + end);
  for (int p = begin; p < end; ++p) {
    b.positions.push_back(p);
    b.attn.slot_mapping.push_back(p);  // block p / bs, offset p % bs: block ids in order
  }
  b.attn.num_seqs = 1;
  b.attn.num_tokens = end - begin;
  b.attn.q_indptr = {0, end - begin};
  b.attn.kv_lens = {end};
  const int pages = (end + block_size - 1) / block_size;
  b.attn.page_indptr = {0, pages};
  for (int i = 0; i < pages; ++i) b.attn.page_indices.push_back(i);
  b.logit_rows = {end - begin - 1};
  return b;
}

struct Loaded {
  test::TempDir dir{"cpu_model_runner"};
  std::unique_ptr<Model> model;
  CpuModelRunner* runner = nullptr;
};

std::unique_ptr<Loaded> Load(const test::TinyCheckpoint& ck, ModelLoadOptions options) {
  auto l = std::make_unique<Loaded>();
  ck.Write(l->dir.path());
  options.model_dir = l->dir.path().string();
  auto m = LoadModel(options);
  INFO((m.ok() ? std::string() : m.status().message()));
  REQUIRE(m.ok());
  l->model = std::move(m).value();
  l->runner = dynamic_cast<CpuModelRunner*>(l->model.get());
  REQUIRE(l->runner != nullptr);
  return l;
}

ModelLoadOptions Options(int block_size, int num_blocks) {
  ModelLoadOptions o;
  o.block_size = block_size;
  o.num_kv_blocks = num_blocks;
  return o;
}

TEST_CASE("CPU runner: KV blocks from num_kv_blocks or from the byte budget", "[cpu_runner]") {
  const test::TinyCheckpoint ck = test::TinyLlama("llama");
  auto fixed = Load(ck, Options(4, 7));
  CHECK(fixed->model->num_kv_blocks() == 7);
  // fp32 cache, 2 layers, 2 KV heads of 8: K and V of 4 slots per head.
  const size_t per_block = 2 * 2 * (2 * 4 * 8 * sizeof(float));
  CHECK(fixed->model->kv_bytes_per_block() == per_block);

  ModelLoadOptions budget = Options(4, 0);
  budget.kv_cache_bytes = 3 * per_block + per_block / 2;
  CHECK(Load(ck, budget)->model->num_kv_blocks() == 3);

  test::TempDir dir("cpu_model_runner_small");
  ck.Write(dir.path());
  budget.model_dir = dir.path().string();
  budget.kv_cache_bytes = per_block - 1;
  auto none = LoadModel(budget);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(none.status().message(), Catch::Contains("holds no block"));
}

TEST_CASE("CPU runner: the KV observer sees every layer's new K and V", "[cpu_runner]") {
  auto l = Load(test::TinyLlama("llama"), Options(4, 8));
  std::vector<std::pair<int, int>> seen;  // (layer, tokens)
  REQUIRE(l->runner->set_kv_observer([&](int layer, int n, const float* k, const float* v) {
    CHECK(k != nullptr);
    CHECK(v != nullptr);
    seen.emplace_back(layer, n);
  }));
  const std::vector<int32_t> prompt = {3, 9, 27, 17, 51};
  std::vector<float> logits;
  REQUIRE(l->model->Forward(Chunk(prompt, 0, 5, 4), &logits).ok());
  CHECK(seen == std::vector<std::pair<int, int>>{{0, 5}, {1, 5}});
  REQUIRE(l->runner->set_kv_observer({}));  // removed: nothing more is seen
  REQUIRE(l->model->Forward(Chunk({3, 9, 27, 17, 51, 2}, 5, 6, 4), &logits).ok());
  CHECK(seen.size() == 2);
  CHECK_FALSE(l->model->set_routing_trace(nullptr));  // no MoE layers
}

TEST_CASE("CPU runner: DeepSeek's latent cache, and no per-head K/V to observe", "[cpu_runner]") {
  auto l = Load(test::TinyDeepseekV2(), Options(4, 8));
  CHECK(l->model->attention_backend_name() == "cpu_mla");
  // One latent row of kv_lora 16 + rope 8 fp32 values per slot, 2 layers.
  CHECK(l->model->kv_bytes_per_block() == 2 * 4 * 24 * sizeof(float));
  CHECK_FALSE(l->runner->set_kv_observer([](int, int, const float*, const float*) {}));
}

TEST_CASE("CPU runner: a prompt in two chunks gives the one-chunk logits", "[cpu_runner]") {
  const bool deepseek = GENERATE(false, true);
  INFO((deepseek ? "deepseek" : "llama"));
  const test::TinyCheckpoint ck = deepseek ? test::TinyDeepseekV2() : test::TinyLlama("llama");
  const std::vector<int32_t> prompt = {3, 9, 27, 17, 51, 2, 40, 11, 5};
  std::vector<float> whole, split;
  {
    auto l = Load(ck, Options(4, 8));
    REQUIRE(l->model->Forward(Chunk(prompt, 0, 9, 4), &whole).ok());
  }
  {
    auto l = Load(ck, Options(4, 8));
    std::vector<float> first;
    REQUIRE(l->model->Forward(Chunk(prompt, 0, 6, 4), &first).ok());
    // DeepSeek: 3 rows attend in the absorbed form through the MLA backend, the rest expanded.
    REQUIRE(l->model->Forward(Chunk(prompt, 6, 9, 4), &split).ok());
  }
  REQUIRE(whole.size() == 64);
  REQUIRE(split.size() == whole.size());
  for (size_t i = 0; i < whole.size(); ++i) CHECK(split[i] == Approx(whole[i]).margin(1e-4));
}

TEST_CASE("CPU runner: a token id outside the vocabulary fails the step", "[cpu_runner]") {
  auto l = Load(test::TinyLlama("llama"), Options(4, 8));
  std::vector<float> logits;
  const Status st = l->model->Forward(Chunk({3, 64}, 0, 2, 4), &logits);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("token id out of range"));
}

}  // namespace
}  // namespace llm
