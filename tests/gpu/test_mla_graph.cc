// MLA decode in CUDA graphs (MlaDecode::ReserveGraph / UploadGraph, kernels/cuda/mla/mla_decode.h):
// per bucket, one capture of the append + attention + merge launches, replayed for decode steps
// of other sequence counts (padding rows), context lengths, block tables and split-KV plans. Each
// replay must give exactly what the eager launches give for the same step and plan: the same
// out_latent bits for every real row and the same cache bytes (padding rows append nothing). The
// eager path's accuracy against the CPU oracle is test_mla_decode.cc's subject.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cuda/mla/mla_decode.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

constexpr int kC = kMlaLatentDim, kR = kMlaRopeDim, kL = kMlaCacheDim;

struct Buffers {
  void *q_latent = nullptr, *q_pe = nullptr, *latent = nullptr, *out = nullptr, *cache = nullptr;
  void Free() {
    for (void* p : {q_latent, q_pe, latent, out, cache}) cudaFree(p);
  }
};

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(nd(rng));
  return v;
}

// One bucket's graph of q query rows per sequence (q > 1: a speculative verify step) against
// eager launches of the same plans over several steps; returns the replays done.
int RunBucket(MlaCacheType cache_type, int heads, int bucket, int max_kv, bool force_split,
              std::mt19937& rng, int q = 1) {
  constexpr int kBs = 64;
  const bool fp8 = cache_type == MlaCacheType::kFp8E4M3;
  const float cache_scale = fp8 ? 4.0f / kFp8E4M3Max : 1.0f;
  const size_t esize = fp8 ? 1 : 2;
  const int max_pages = bucket * ((max_kv + kBs - 1) / kBs);
  const int rows = bucket * q;  // the graph's query rows
  const int num_blocks = max_pages + 4;
  const size_t cache_bytes = static_cast<size_t>(num_blocks) * kBs * kL * esize;
  MlaDecode graph({heads, kBs, cache_type}), eager({heads, kBs, cache_type});
  REQUIRE(graph.ReserveGraph(bucket, max_pages, q).ok());
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Fixed buffers: the captured launches hold their pointers.
  Buffers g, e;
  for (Buffers* b : {&g, &e}) {
    CUDA_REQUIRE(cudaMalloc(&b->q_latent, static_cast<size_t>(rows) * heads * kC * 2));
    CUDA_REQUIRE(cudaMalloc(&b->q_pe, static_cast<size_t>(rows) * heads * kR * 2));
    CUDA_REQUIRE(cudaMalloc(&b->latent, static_cast<size_t>(rows) * kL * 2));
    CUDA_REQUIRE(cudaMalloc(&b->out, static_cast<size_t>(rows) * heads * kC * 2));
    CUDA_REQUIRE(cudaMalloc(&b->cache, cache_bytes));
  }
  auto args = [&](const Buffers& b) {
    MlaDecode::LayerArgs a;
    a.q_latent = b.q_latent;
    a.q_pe = b.q_pe;
    a.latent_new = b.latent;
    a.out_latent = b.out;
    a.cache = b.cache;
    a.cache_scale = cache_scale;
    a.softmax_scale = 0.0721688f;
    return a;
  };
  cudaGraphExec_t exec = nullptr;
  int replays = 0;
  std::uniform_int_distribution<int> kv_len(q, max_kv);
  // Full, then fewer sequences (padding rows), then one: long and short contexts each time.
  for (int n : {bucket, std::max(1, bucket - 3), std::max(1, bucket / 2 + 1), 1}) {
    std::vector<std::pair<int, int>> seqs;
    for (int i = 0; i < n; ++i) seqs.push_back({q, kv_len(rng)});
    int used_blocks = 0;
    const AttentionBatch batch = ShuffledPagedBatch(seqs, kBs, 2, rng, &used_blocks);
    REQUIRE(used_blocks <= num_blocks);
    MlaPlanConfig config = graph.GraphPlanConfig(GraphShape{bucket, q});
    config.force_split = force_split;
    const MlaPlan plan = BuildMlaPlan(graph.shape(), batch, config);
    INFO("heads " << heads << " bucket " << bucket << " q " << q << " seqs " << n << " partials "
                  << plan.num_partials << (fp8 ? " fp8" : " bf16"));
    // Inputs of every bucket row (padding rows too), and a cache of finite old values.
    const auto q_latent = RandomBf16(static_cast<size_t>(rows) * heads * kC, rng);
    const auto q_pe = RandomBf16(static_cast<size_t>(rows) * heads * kR, rng);
    const auto latent = RandomBf16(static_cast<size_t>(rows) * kL, rng);
    std::vector<uint8_t> cache(cache_bytes);
    if (fp8) {
      std::normal_distribution<float> nd(0.f, 1.f);
      for (auto& x : cache) x = QuantizeFp8(nd(rng), cache_scale);
    } else {
      const auto c16 = RandomBf16(cache_bytes / 2, rng);
      std::memcpy(cache.data(), c16.data(), cache_bytes);
    }
    for (const Buffers* b : {&g, &e}) {
      CUDA_REQUIRE(
          cudaMemcpy(b->q_latent, q_latent.data(), q_latent.size() * 2, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemcpy(b->q_pe, q_pe.data(), q_pe.size() * 2, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemcpy(b->latent, latent.data(), latent.size() * 2, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemcpy(b->cache, cache.data(), cache_bytes, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemset(b->out, 0, static_cast<size_t>(rows) * heads * kC * 2));
    }
    // Eager: the same plan, exact grids.
    REQUIRE(eager.Upload(batch, plan, stream).ok());
    REQUIRE(eager.Run(args(e), stream).ok());
    // Graph: the step uploaded into the fixed area, then the bucket's one capture replayed.
    REQUIRE(graph.UploadGraph(batch, plan, GraphShape{bucket, q}, stream).ok());
    if (exec == nullptr) {
      cudaGraph_t captured = nullptr;
      CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const Status st = graph.Run(args(g), stream);
      CUDA_REQUIRE(cudaStreamEndCapture(stream, &captured));
      REQUIRE(st.ok());
      CUDA_REQUIRE(cudaGraphInstantiate(&exec, captured, 0));
      cudaGraphDestroy(captured);
    }
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    ++replays;
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const size_t out_n = static_cast<size_t>(n) * q * heads * kC;  // the real rows
    const auto out_e = Download(static_cast<const uint16_t*>(e.out), out_n);
    const auto out_g = Download(static_cast<const uint16_t*>(g.out), out_n);
    size_t diff = 0;
    for (size_t i = 0; i < out_n; ++i) diff += out_e[i] != out_g[i];
    CHECK(diff == 0);
    size_t nonzero = 0;
    for (uint16_t x : out_g) nonzero += x != 0;
    CHECK(nonzero > out_n / 2);  // the replay wrote its rows
    const auto cache_e = Download(static_cast<const uint8_t*>(e.cache), cache_bytes);
    const auto cache_g = Download(static_cast<const uint8_t*>(g.cache), cache_bytes);
    CHECK(cache_e == cache_g);  // same appends; padding rows wrote nothing
    CHECK(cache_g != cache);    // and the real rows did append
  }
  cudaGraphExecDestroy(exec);
  g.Free();
  e.Free();
  cudaStreamDestroy(stream);
  return replays;
}

TEST_CASE("MLA decode in CUDA graphs: one capture per bucket replays other steps and plans",
          "[gpu][mla][mla_graph]") {
  GPU_TEST_RNG(rng);
  // 16 heads (DeepSeek-V2-Lite): one 16-row item per token; long contexts split for the small
  // buckets and not for the large one. 128 heads: two 64-row items per token.
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    for (auto [bucket, max_kv] : {std::pair{1, 5000}, {4, 3000}, {16, 1500}, {64, 600}}) {
      CHECK(RunBucket(cache, 16, bucket, max_kv, false, rng) == 4);
    }
    CHECK(RunBucket(cache, 128, 8, 2000, false, rng) == 4);
  }
  // Forced splits into 128-token chunks: merges in every step, within the bucket's grid.
  CHECK(RunBucket(MlaCacheType::kBf16, 16, 4, 900, true, rng) == 4);
}

// Verify steps (issue 52): q = 2..5 query rows per sequence in the graph form, and 9, past
// kMlaMaxDecodeQueryLen (MlaPlanConfig::max_decode_query_len); 16 heads put up to 4 tokens in one
// 64-row item (5 rows: a 4-token and a 1-token item), 128 heads two 64-row items per token.
TEST_CASE("MLA decode in CUDA graphs: verify steps of 2 to 9 rows per sequence",
          "[gpu][mla][mla_graph][speculative_graph]") {
  GPU_TEST_RNG(rng);
  for (MlaCacheType cache : {MlaCacheType::kBf16, MlaCacheType::kFp8E4M3}) {
    for (int q : {2, 3, 4, 5, kMlaMaxDecodeQueryLen + 1}) {
      for (auto [bucket, max_kv] : {std::pair{1, 5000}, {4, 3000}, {24, 800}}) {
        CHECK(RunBucket(cache, 16, bucket, max_kv, false, rng, q) == 4);
      }
      CHECK(RunBucket(cache, 128, 8, 2000, false, rng, q) == 4);
      CHECK(RunBucket(cache, 16, 4, 900, true, rng, q) == 4);  // forced splits: merges
    }
  }
}

TEST_CASE("MLA graph upload refuses steps its bucket cannot hold", "[gpu][mla][mla_graph]") {
  MlaDecode d({16, 64, MlaCacheType::kBf16});
  CHECK(!d.UploadGraph(AttentionBatch{}, MlaPlan{}, 1, nullptr).ok());  // before ReserveGraph
  REQUIRE(d.ReserveGraph(8, 64).ok());
  CHECK(d.ReserveGraph(4, 32).ok());    // within the reservation
  CHECK(!d.ReserveGraph(16, 64).ok());  // larger: captured pointers would move
  int blocks = 0;
  std::mt19937 rng(1);
  const AttentionBatch two = ShuffledPagedBatch({{1, 100}, {1, 10}}, 64, 0, rng, &blocks);
  const MlaPlan plan = BuildMlaPlan(d.shape(), two, d.GraphPlanConfig(2));
  CHECK(!d.UploadGraph(two, plan, 1, nullptr).ok());  // more sequences than the bucket
  const AttentionBatch prefill = ShuffledPagedBatch({{2, 100}}, 64, 0, rng, &blocks);
  CHECK(!d.UploadGraph(prefill, BuildMlaPlan(d.shape(), prefill, d.GraphPlanConfig(2)), 2, nullptr)
             .ok());  // two query tokens
  // The planner stays within the bucket's grid however long the contexts.
  for (int bucket : {1, 2, 8}) {
    std::vector<std::pair<int, int>> seqs(bucket, {1, 60000});
    const AttentionBatch b = ShuffledPagedBatch(seqs, 64, 0, rng, &blocks);
    const MlaPlanConfig c = d.GraphPlanConfig(bucket);
    const MlaPlan p = BuildMlaPlan(d.shape(), b, c);
    for (int v = 0; v < kMlaNumRowVariants; ++v) {
      CHECK(static_cast<int>(p.items[v].size()) <= d.GraphItemCapacity(bucket, v));
    }
    CHECK(static_cast<int>(p.merges.size()) <= d.GraphMergeCapacity(bucket));
  }
}

}  // namespace
}  // namespace llm::cuda
