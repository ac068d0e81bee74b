// DeepSeek-V3's MTP layer (engine/architectures/cpu_deepseek_mtp.h) against a reference computed
// outside this code base: tests/fixtures/models/deepseek_v3_mtp/mtp_reference.json, written by
// tools/hf_fixtures/mtp_reference.py from vLLM's definition of the layer (its "impl" names the
// decoder-layer implementation: transformers' DeepseekV3DecoderLayer, or the independent torch
// forward of tests/python/torch_deepseek.py). For each prompt: the target's hidden states (after
// its final norm) feed the MTP rows at positions 0 .. n-2, which read the prompt's next token;
// the chained row at n-1 reads the reference's draft and the last row's output before the
// layer's final norm. Every logit must agree within 1e-4 of the row's largest |logit|, and a
// nudged hnorm weight must break the agreement.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime/model.h"
#include "tiny_checkpoint.h"

namespace llm {
namespace {

const std::string kFixture = std::string(LLM_SOURCE_DIR) + "/tests/fixtures/models/deepseek_v3_mtp";
constexpr int kBlock = 4, kBlocks = 64;

// One sequence's rows at positions [from, from + tokens), over blocks 0.. of the cache.
ForwardBatch Rows(const std::vector<int32_t>& tokens, int from) {
  ForwardBatch b;
  AttentionBatch& a = b.attn;
  const int to = from + static_cast<int>(tokens.size());
  b.token_ids = tokens;
  for (int p = from; p < to; ++p) {
    b.positions.push_back(p);
    a.slot_mapping.push_back(p);  // block p / 4, offset p % 4
  }
  a.num_seqs = 1;
  a.num_tokens = static_cast<int>(tokens.size());
  a.q_indptr = {0, a.num_tokens};
  a.kv_lens = {to};
  for (int blk = 0; blk < (to + kBlock - 1) / kBlock; ++blk) a.page_indices.push_back(blk);
  a.page_indptr = {0, static_cast<int32_t>(a.page_indices.size())};
  return b;
}

// The largest |ours - reference| of each row over the row's largest |reference logit|.
double WorstRelativeError(const std::string& model_dir, const nlohmann::json& ref) {
  ModelLoadOptions o;
  o.model_dir = model_dir;
  o.block_size = kBlock;
  o.num_kv_blocks = kBlocks;
  auto target = LoadModel(o);
  REQUIRE(target.ok());
  o.defer_kv_cache = true;
  auto mtp = LoadMtpModel(o);
  INFO(mtp.status().ToString());
  REQUIRE(mtp.ok());
  REQUIRE((*mtp)->AllocateKvCache(kBlocks).ok());
  const int H = (*target)->config().hidden_size, V = (*target)->config().vocab_size;
  double worst = 0;
  for (const auto& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(prompt.size());
    // The target over the prompt, keeping every row's hidden state after the final norm.
    ForwardBatch t = Rows(prompt, 0);
    t.logit_rows = {n - 1};
    for (int r = 0; r < n; ++r) t.hidden_rows.push_back(r);
    std::vector<float> logits;
    REQUIRE((*target)->Forward(t, &logits).ok());
    const std::span<const float> hidden = (*target)->hidden_states();
    // MTP rows 0 .. n-2: token t_{i+1}, the target's h_i.
    ForwardBatch m = Rows(std::vector<int32_t>(prompt.begin() + 1, prompt.end()), 0);
    m.input_hidden.assign(hidden.begin(), hidden.begin() + static_cast<size_t>(n - 1) * H);
    for (int r = 0; r < n - 1; ++r) m.logit_rows.push_back(r);
    m.hidden_rows = {n - 2};
    m.hidden_before_final_norm = true;
    std::vector<float> rows;
    REQUIRE((*mtp)->Forward(m, &rows).ok());
    // The chained row at n - 1: the reference's draft and the last row's output.
    ForwardBatch c = Rows({p["draft"].get<int32_t>()}, n - 1);
    const std::span<const float> last = (*mtp)->hidden_states();
    c.input_hidden.assign(last.begin(), last.end());
    c.logit_rows = {0};
    std::vector<float> chained;
    REQUIRE((*mtp)->Forward(c, &chained).ok());
    rows.insert(rows.end(), chained.begin(), chained.end());
    const auto& want = p["logits"];
    REQUIRE(static_cast<int>(want.size()) == n);
    REQUIRE(rows.size() == static_cast<size_t>(n) * V);
    for (int r = 0; r < n; ++r) {
      double scale = 0, err = 0;
      for (int v = 0; v < V; ++v) scale = std::max(scale, std::abs(want[r][v].get<double>()));
      for (int v = 0; v < V; ++v) {
        err = std::max(err,
                       std::abs(rows[static_cast<size_t>(r) * V + v] - want[r][v].get<double>()));
      }
      worst = std::max(worst, err / scale);
    }
  }
  return worst;
}

nlohmann::json Reference() {
  std::ifstream f(kFixture + "/mtp_reference.json");
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

TEST_CASE("the MTP layer's logits match the reference", "[mtp][reference]") {
  const nlohmann::json ref = Reference();
  INFO("reference by " << ref["impl"].get<std::string>());
  const double worst = WorstRelativeError(kFixture, ref);
  INFO("worst relative error " << worst);
  CHECK(worst < 1e-4);
}

// The comparison sees a change in the layer's inputs: hnorm scales the target's hidden state.
TEST_CASE("the MTP reference comparison fails for a nudged hnorm", "[mtp][reference]") {
  test::TempDir dir("mtp_nudged");
  std::filesystem::copy_file(kFixture + "/config.json", dir.path() / "config.json");
  auto file = SafetensorsFile::Open(kFixture + "/model.safetensors");
  REQUIRE(file.ok());
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : (*file)->tensors()) {
    REQUIRE(t.dtype == DType::kF32);
    TensorToWrite w{name, DType::kF32, t.shape, std::vector<std::byte>(t.data, t.data + t.nbytes)};
    if (name == "model.layers.2.hnorm.weight") {
      float x;
      std::memcpy(&x, w.data.data() + 12, 4);
      x += 0.05f;
      std::memcpy(w.data.data() + 12, &x, 4);
    }
    tensors.push_back(std::move(w));
  }
  REQUIRE(WriteSafetensors((dir.path() / "model.safetensors").string(), tensors).ok());
  CHECK(WorstRelativeError(dir.path().string(), Reference()) > 1e-3);
}

}  // namespace
}  // namespace llm
