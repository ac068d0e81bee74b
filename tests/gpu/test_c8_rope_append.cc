// The C8 append with the rotary (and the q / k norms) fused in (FusedRope) against the two
// launches it replaces: the model's BiasRope kernel (its q/k-norm form) followed by the plain
// append. Both are checked against host definitions
// elsewhere (test_elementwise_ops.cc, test_c8_attention.cc); here the fused launch must store the
// same bits: q, every cache byte, every dynamic scale, and the attention output. Fresh random
// inputs: raw projections with and without bias and row scales, random positions, shuffled pages,
// mixed prefill/decode batches, decode-only batches of whole or split sequences, and graph-area
// steps whose padding rows append nothing.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/ops/elementwise_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

struct RopeCase {
  int hq, hkv, d, bs;
  CacheType cache;
  ScaleMode scale;
  bool bias, row_scale;
  int graph_padding;    // > 0: a decode step in the graph area, bucket = sequences + padding
  int decode_seqs = 0;  // > 0 (eager): that many one-token decodes instead of the mixed batch
  float qk_norm_offset = -1.f;  // >= 0: per-head q / k RMSNorm first, weights (offset + w)
};

void RunRopeCase(const RopeCase& c, std::mt19937& rng) {
  const char* cache_name[] = {"bf16", "int8", "fp8"};
  INFO(cache_name[static_cast<int>(c.cache)]
       << " scale " << static_cast<int>(c.scale) << " hq " << c.hq << " hkv " << c.hkv << " d "
       << c.d << " bs " << c.bs << " bias " << c.bias << " row scale " << c.row_scale << " padding "
       << c.graph_padding << " decode seqs " << c.decode_seqs << " qk norm offset "
       << c.qk_norm_offset);
  const int D = c.d, hq = c.hq, hkv = c.hkv, bs = c.bs;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  std::uniform_int_distribution<int> kv_len(1, 500);

  // Sequences (q_len, kv_len): decodes of 1..4 tokens, an append after a prefix, a fresh prompt;
  // graph steps have one token per sequence.
  std::vector<std::pair<int, int>> seqs;
  if (c.graph_padding > 0) {
    for (int i = 0; i < 5; ++i) seqs.push_back({1, kv_len(rng)});
  } else if (c.decode_seqs > 0) {
    std::uniform_int_distribution<int> long_kv(1, 700);
    for (int i = 0; i < c.decode_seqs; ++i) seqs.push_back({1, long_kv(rng)});
  } else {
    for (int i = 0; i < 4; ++i) seqs.push_back({1 + i, 4 + kv_len(rng)});
    seqs.push_back({37, 37 + 90});
    seqs.push_back({70, 70});
    std::shuffle(seqs.begin(), seqs.end(), rng);
  }
  int num_blocks = 0;
  const AttentionBatch b = ShuffledPagedBatch(seqs, bs, 5, rng, &num_blocks);
  const int rows = b.num_tokens + c.graph_padding;  // the launches' rows (padding included)

  // Cache images: random finite old contents (fp8 bytes avoid the NaN encodings), one copy per
  // path; scales positive.
  const size_t elems = static_cast<size_t>(num_blocks) * hkv * bs * D;
  const bool eight = c.cache != CacheType::kBf16;
  std::vector<uint8_t> cache_img(elems * (eight ? 1 : 2) * 2);  // K then V
  if (eight) {
    for (auto& x : cache_img) x = static_cast<uint8_t>((rng() % 0x78) | (rng() & 0x80));
  } else {
    for (size_t i = 0; i < 2 * elems; ++i) {
      const uint16_t v = F32ToBf16(nd(rng));
      std::memcpy(&cache_img[i * 2], &v, 2);
    }
  }
  size_t n_scale = 0;
  if (c.scale == ScaleMode::kPerHead) n_scale = hkv;
  if (c.scale == ScaleMode::kPerChannel) n_scale = static_cast<size_t>(hkv) * D;
  if (c.scale == ScaleMode::kPerToken) n_scale = static_cast<size_t>(num_blocks) * hkv * bs;
  const float qmax = c.cache == CacheType::kInt8 ? 127.f : 448.f;
  std::vector<float> scale_img(2 * n_scale);  // K then V
  for (auto& s : scale_img) s = 3.0f * ud(rng) / qmax;

  // Raw projection rows, bias, row scales, positions, rotary frequencies.
  const int width = (hq + 2 * hkv) * D;
  std::vector<uint16_t> qkv(static_cast<size_t>(rows) * width), bias(width);
  for (auto& x : qkv) x = F32ToBf16(nd(rng));
  for (auto& x : bias) x = F32ToBf16(0.3f * nd(rng));
  std::vector<float> row_scale(rows);
  for (auto& s : row_scale) s = ud(rng);
  std::vector<int32_t> pos(rows);
  for (auto& p : pos) p = static_cast<int32_t>(rng() % 9000);
  std::vector<float> inv_freq(D / 2);
  for (int i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(500000.f, -2.f * i / D);
  const bool qk_norm = c.qk_norm_offset >= 0.f;
  std::vector<uint16_t> q_norm(D), k_norm(D);
  for (auto& x : q_norm) x = F32ToBf16(1.0f + 0.2f * nd(rng) - c.qk_norm_offset);
  for (auto& x : k_norm) x = F32ToBf16(1.0f + 0.2f * nd(rng) - c.qk_norm_offset);
  uint16_t* d_qn = Upload(q_norm);
  uint16_t* d_kn = Upload(k_norm);

  uint16_t* d_qkv = Upload(qkv);
  uint16_t* d_bias = Upload(bias);
  float* d_rs = Upload(row_scale);
  int32_t* d_pos = Upload(pos);
  float* d_freq = Upload(inv_freq);
  const size_t q_bytes = static_cast<size_t>(rows) * hq * D * 2;
  const size_t kv_bytes = static_cast<size_t>(rows) * hkv * D * 2;
  void *d_k = nullptr, *d_v = nullptr;
  CUDA_REQUIRE(cudaMalloc(&d_k, kv_bytes));
  CUDA_REQUIRE(cudaMalloc(&d_v, kv_bytes));

  C8Shape shape{hq, hkv, D, bs, c.cache, c.scale};
  C8Attention attn(shape);
  C8PlanConfig pc = attn.plan_config();
  pc.min_chunk_tokens = 64;
  if (c.graph_padding > 0) {
    REQUIRE(attn.ReserveGraph(rows, num_blocks).ok());
    pc.max_decode_items = attn.GraphItemCapacity(rows);
    REQUIRE(attn.UploadGraph(b, BuildC8Plan(shape, b, pc), rows, nullptr).ok());
  } else {
    REQUIRE(attn.Upload(b, BuildC8Plan(shape, b, pc), nullptr).ok());
  }

  struct Result {
    std::vector<uint8_t> q, out, cache;
    std::vector<float> scales;
  };
  // BiasRope + append, or the fused append launch.
  auto run = [&](bool fused) {
    void *d_q = nullptr, *d_out = nullptr;
    CUDA_REQUIRE(cudaMalloc(&d_q, q_bytes));
    CUDA_REQUIRE(cudaMalloc(&d_out, q_bytes));
    CUDA_REQUIRE(cudaMemset(d_q, 0xff, q_bytes));
    CUDA_REQUIRE(cudaMemset(d_out, 0xff, q_bytes));  // poison: NaN bf16
    uint8_t* d_cache = Upload(cache_img);
    float* d_scales = Upload(scale_img);
    C8Attention::LayerArgs la;
    la.out = d_out;
    la.k_cache = d_cache;
    la.v_cache = d_cache + cache_img.size() / 2;
    la.k_scale = n_scale ? d_scales : nullptr;
    la.v_scale = n_scale ? d_scales + n_scale : nullptr;
    la.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    FusedRope r;
    r.qkv = d_qkv;
    r.bias = c.bias ? d_bias : nullptr;
    r.qkv_scale = c.row_scale ? d_rs : nullptr;
    r.positions = d_pos;
    r.inv_freq = d_freq;
    if (qk_norm) {
      r.q_norm = d_qn;
      r.k_norm = d_kn;
      r.norm_eps = 1e-6f;
      r.norm_offset = c.qk_norm_offset;
    }
    if (fused) {
      r.q = d_q;
      la.rope = r;
    } else {
      RopeArgs ra;
      ra.qkv = r.qkv;
      ra.bias = r.bias;
      ra.qkv_scale = r.qkv_scale;
      ra.positions = r.positions;
      ra.inv_freq = r.inv_freq;
      ra.q_norm = r.q_norm;
      ra.k_norm = r.k_norm;
      ra.norm_eps = r.norm_eps;
      ra.norm_offset = r.norm_offset;
      ra.q = d_q;
      ra.k = d_k;
      ra.v = d_v;
      ra.num_tokens = rows;
      ra.num_q_heads = hq;
      ra.num_kv_heads = hkv;
      ra.head_dim = D;
      LaunchBiasRope(ra, nullptr);
      la.q = d_q;
      la.k_new = d_k;
      la.v_new = d_v;
    }
    const Status st = attn.Run(la, nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    Result res{Download(static_cast<const uint8_t*>(d_q), q_bytes),
               Download(static_cast<const uint8_t*>(d_out), q_bytes),
               Download(static_cast<const uint8_t*>(d_cache), cache_img.size()),
               Download(static_cast<const float*>(d_scales), scale_img.size())};
    for (void* p : {d_q, d_out, static_cast<void*>(d_cache), static_cast<void*>(d_scales)}) {
      cudaFree(p);
    }
    return res;
  };
  const Result plain = run(false), fused = run(true);
  CHECK(fused.q == plain.q);
  CHECK(fused.cache == plain.cache);
  CHECK(fused.scales == plain.scales);
  CHECK(fused.out == plain.out);
  // The step did append: the cache changed (a check that could not pass with a no-op launch).
  CHECK(plain.cache != cache_img);
  for (void* p : {static_cast<void*>(d_qkv), static_cast<void*>(d_bias), static_cast<void*>(d_rs),
                  static_cast<void*>(d_pos), static_cast<void*>(d_freq), d_k, d_v,
                  static_cast<void*>(d_qn), static_cast<void*>(d_kn)}) {
    cudaFree(p);
  }
}

TEST_CASE("C8 append with the rotary fused in stores what BiasRope + append store", "[gpu][c8]") {
  GPU_TEST_RNG(rng);
  const std::pair<CacheType, ScaleMode> modes[] = {
      {CacheType::kBf16, ScaleMode::kNone},          {CacheType::kInt8, ScaleMode::kPerHead},
      {CacheType::kInt8, ScaleMode::kPerChannel},    {CacheType::kInt8, ScaleMode::kPerToken},
      {CacheType::kFp8E4M3, ScaleMode::kPerChannel}, {CacheType::kFp8E4M3, ScaleMode::kPerToken}};
  const std::pair<int, int> heads[] = {{32, 8}, {4, 1}, {6, 3}};  // GQA 4, 4, 2 (odd head counts)
  for (auto [cache, scale] : modes) {
    for (auto [hq, hkv] : heads) {
      for (int d : {64, 128}) {
        const int bs = d == 64 ? 16 : 64;
        RunRopeCase({hq, hkv, d, bs, cache, scale, true, true, 0}, rng);
        RunRopeCase({hq, hkv, d, bs, cache, scale, false, false, 0}, rng);
        RunRopeCase({hq, hkv, d, bs, cache, scale, false, true, 3}, rng);
        // Decode-only steps: few sequences (split into chunks) and many (run whole).
        RunRopeCase({hq, hkv, d, bs, cache, scale, true, true, 0, 7}, rng);
        RunRopeCase({hq, hkv, d, bs, cache, scale, true, false, 0, 64}, rng);
        // The q / k norms first (Qwen3: weights w; Gemma 3: 1 + w), against the model's q/k-norm
        // rotary kernel: mixed, graph-area and decode-only steps.
        RunRopeCase({hq, hkv, d, bs, cache, scale, false, true, 0, 0, 0.f}, rng);
        RunRopeCase({hq, hkv, d, bs, cache, scale, true, true, 3, 0, 1.f}, rng);
        RunRopeCase({hq, hkv, d, bs, cache, scale, false, false, 0, 7, 0.f}, rng);
      }
    }
  }
}

}  // namespace
}  // namespace llm::cuda
