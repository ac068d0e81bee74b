// Tests for the CPU reference paged attention against a naive dense causal attention (with and
// without a sliding window, soft-cap and sink logits), and for the attention backend registry.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_c8_attention.h"
#include "kernels/cpu/cpu_paged_attention.h"
#include "kvcache/block_allocator.h"
#include "tests/unit/paged_batch.h"
#include "tests/unit/stand_in_backend.h"

namespace llm {
namespace {

struct SeqSpec {
  int kv_len;  // tokens in the cache after this step
  int q_len;   // new tokens this step (the last q_len of kv_len)
};

struct AttnCase {
  int block_size;
  int head_dim;
  int num_q_heads;
  int num_kv_heads;
  std::vector<SeqSpec> seqs;
  uint32_t seed;
};

// Everything one test step needs: the batch, the inputs and the caches with the earlier
// (already computed) tokens appended in a previous step.
struct AttnSetup {
  PagedAttentionShape shape;
  AttentionBatch batch;
  int num_blocks = 0;
  std::vector<std::vector<float>> dense_k, dense_v;  // per seq: [kv_len, Hkv, D]
  std::vector<float> q, k_new, v_new;                // [num_tokens, H, D]
  std::vector<float> k_cache, v_cache;               // [num_blocks, Hkv, block_size, D]
};

AttnSetup Build(const AttnCase& c) {
  AttnSetup s;
  s.shape = {c.num_q_heads, c.num_kv_heads, c.head_dim, c.block_size};
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int hkv = c.num_kv_heads, d = c.head_dim, bs = c.block_size;
  const size_t row = static_cast<size_t>(hkv) * d;

  int needed = 0;
  for (const SeqSpec& q : c.seqs) needed += BlocksForTokens(q.kv_len, bs);
  s.num_blocks = needed + 5;  // spare blocks that nobody owns
  std::vector<int32_t> perm(static_cast<size_t>(s.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);

  const size_t cache_elems = static_cast<size_t>(s.num_blocks) * hkv * bs * d;
  // NaN everywhere: reading any slot that was never written poisons the output.
  s.k_cache.assign(cache_elems, std::numeric_limits<float>::quiet_NaN());
  s.v_cache.assign(cache_elems, std::numeric_limits<float>::quiet_NaN());

  AttentionBatch& b = s.batch;
  AttentionBatch prior;  // the earlier step that wrote the cached prefix
  std::vector<float> prior_k, prior_v;
  b.num_seqs = static_cast<int>(c.seqs.size());
  b.q_indptr = {0};
  b.page_indptr = {0};
  size_t next_page = 0;
  for (const SeqSpec& q : c.seqs) {
    REQUIRE(q.q_len >= 1);
    REQUIRE(q.q_len <= q.kv_len);
    std::vector<float> k(static_cast<size_t>(q.kv_len) * row), v(k.size());
    for (float& x : k) x = uni(rng);
    for (float& x : v) x = uni(rng);
    const std::vector<int32_t> slots =
        test::AppendSequence(b, perm, &next_page, q.kv_len, q.q_len, bs);
    for (int p = 0; p < q.kv_len; ++p) {
      const int32_t slot = slots[p];
      const auto kr = k.begin() + static_cast<long>(p * row);
      const auto vr = v.begin() + static_cast<long>(p * row);
      if (p < q.kv_len - q.q_len) {
        prior.slot_mapping.push_back(slot);
        prior_k.insert(prior_k.end(), kr, kr + static_cast<long>(row));
        prior_v.insert(prior_v.end(), vr, vr + static_cast<long>(row));
      } else {
        b.slot_mapping.push_back(slot);
        s.k_new.insert(s.k_new.end(), kr, kr + static_cast<long>(row));
        s.v_new.insert(s.v_new.end(), vr, vr + static_cast<long>(row));
      }
    }
    s.dense_k.push_back(std::move(k));
    s.dense_v.push_back(std::move(v));
  }
  b.num_tokens = b.q_indptr.back();
  prior.num_tokens = static_cast<int>(prior.slot_mapping.size());
  s.q.resize(static_cast<size_t>(b.num_tokens) * c.num_q_heads * d);
  for (float& x : s.q) x = uni(rng);
  if (prior.num_tokens > 0) {
    CpuAppendKv(s.shape, prior, prior_k.data(), prior_v.data(), s.k_cache.data(), s.v_cache.data());
  }
  return s;
}

// Naive dense causal attention in double: query row i of sequence s sits at position
// kv_len - q_len + i and attends to positions [0, that], or to the last window_left + 1 of them.
// With logit_softcap > 0 each scaled score s becomes cap * tanh(s / cap); with sink logits a
// head's softmax gets one more column e^sink whose value is zero; with ALiBi slopes the score of
// position j gets slope[h] * (j - pos) after the soft-cap.
std::vector<double> Reference(const AttnCase& c, const AttnSetup& s, float scale,
                              int window_left = -1, double logit_softcap = 0.0,
                              const float* sink_logits = nullptr,
                              const float* alibi_slopes = nullptr) {
  const int hq = c.num_q_heads, hkv = c.num_kv_heads, d = c.head_dim;
  const int group = hq / hkv;
  std::vector<double> out(s.q.size());
  for (size_t si = 0; si < c.seqs.size(); ++si) {
    const SeqSpec& spec = c.seqs[si];
    const auto& k = s.dense_k[si];
    const auto& v = s.dense_v[si];
    for (int i = 0; i < spec.q_len; ++i) {
      const int t = s.batch.q_indptr[si] + i;
      const int pos = spec.kv_len - spec.q_len + i;
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / group;
        const float* qv = s.q.data() + (static_cast<size_t>(t) * hq + h) * d;
        std::vector<double> scores(static_cast<size_t>(pos) + 1);
        double max = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= pos; ++j) {
          if (window_left >= 0 && pos - j > window_left) {  // slid out of the window
            scores[static_cast<size_t>(j)] = -std::numeric_limits<double>::infinity();
            continue;
          }
          const float* kv = k.data() + (static_cast<size_t>(j) * hkv + kvh) * d;
          double dot = 0.0;
          for (int x = 0; x < d; ++x) dot += static_cast<double>(qv[x]) * kv[x];
          double sc = dot * scale;
          if (logit_softcap > 0.0) sc = logit_softcap * std::tanh(sc / logit_softcap);
          if (alibi_slopes != nullptr) sc += static_cast<double>(alibi_slopes[h]) * (j - pos);
          scores[static_cast<size_t>(j)] = sc;
          max = std::max(max, sc);
        }
        if (sink_logits != nullptr) max = std::max(max, static_cast<double>(sink_logits[h]));
        double sum = sink_logits != nullptr ? std::exp(sink_logits[h] - max) : 0.0;
        for (double& sc : scores) {
          sc = std::exp(sc - max);
          sum += sc;
        }
        double* o = out.data() + (static_cast<size_t>(t) * hq + h) * d;
        for (int j = 0; j <= pos; ++j) {
          const float* vv = v.data() + (static_cast<size_t>(j) * hkv + kvh) * d;
          const double p = scores[static_cast<size_t>(j)] / sum;
          for (int x = 0; x < d; ++x) o[x] += p * vv[x];
        }
      }
    }
  }
  return out;
}

// Appends this step's K/V, runs the paged kernel, and compares with the dense reference.
// Returns the kernel output.
std::vector<float> CheckAgainstReference(const AttnCase& c, int window_left = -1,
                                         float logit_softcap = 0.0f,
                                         const float* sink_logits = nullptr, float scale = 0.0f,
                                         const float* alibi_slopes = nullptr) {
  AttnSetup s = Build(c);
  if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  CpuAppendKv(s.shape, s.batch, s.k_new.data(), s.v_new.data(), s.k_cache.data(), s.v_cache.data());
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), s.k_cache.data(), s.v_cache.data(), scale,
                    out.data(), window_left, logit_softcap, sink_logits, alibi_slopes);
  const std::vector<double> ref =
      Reference(c, s, scale, window_left, logit_softcap, sink_logits, alibi_slopes);
  double worst = 0.0;
  size_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = std::abs(static_cast<double>(out[i]) - ref[i]);
    const double tol = 1e-5 * std::max(1.0, std::abs(ref[i]));
    if (!(err <= tol)) ++bad;  // NaN counts as bad
    if (std::isnan(out[i]))
      worst = std::numeric_limits<double>::infinity();
    else
      worst = std::max(worst, err);
  }
  INFO("block_size=" << c.block_size << " head_dim=" << c.head_dim << " heads=" << c.num_q_heads
                     << "/" << c.num_kv_heads << " window_left=" << window_left
                     << " softcap=" << logit_softcap << " sinks=" << (sink_logits != nullptr)
                     << " alibi=" << (alibi_slopes != nullptr) << " worst abs error " << worst);
  CHECK(bad == 0);
  return out;
}

TEST_CASE("CpuPagedAttention matches dense causal attention", "[cpu_attention]") {
  const int kv_lens[] = {1, 17, 63, 64, 65, 130};
  const std::pair<int, int> heads[] = {{4, 4}, {8, 2}, {8, 8}, {16, 2}, {8, 1}};
  uint32_t seed = 1;
  int cases = 0;
  for (int block_size : {16, 64}) {
    for (int head_dim : {32, 64, 128}) {
      for (const auto& [hq, hkv] : heads) {
        AttnCase c{block_size, head_dim, hq, hkv, {}, seed++};
        std::mt19937 rng(seed * 7919);
        for (size_t i = 0; i < std::size(kv_lens); ++i) {
          const int kv = kv_lens[i];
          // Rotate through decode (1), whole prefill, a prefill chunk and a random length.
          const int chunk = std::min(kv, 24);
          const int random_q = std::uniform_int_distribution<int>(1, kv)(rng);
          const int choices[] = {1, kv, chunk, random_q};
          c.seqs.push_back({kv, choices[(i + static_cast<size_t>(seed)) % 4]});
        }
        CheckAgainstReference(c);
        ++cases;
      }
    }
  }
  CHECK(cases == 30);
}

TEST_CASE("CpuPagedAttention handles several query tokens per decode (speculative shape)",
          "[cpu_attention]") {
  for (int block_size : {16, 64}) {
    AttnCase c{block_size, 64, 8, 2, {{40, 3}, {1, 1}, {130, 3}, {65, 1}}, 77};
    CheckAgainstReference(c);
  }
  // Every sequence a full prefill from empty.
  AttnCase prefill{16, 32, 4, 1, {{17, 17}, {64, 64}, {1, 1}}, 78};
  CheckAgainstReference(prefill);
}

TEST_CASE("CpuPagedAttention query rows only see their causal prefix", "[cpu_attention]") {
  // Changing a later cache position must not change an earlier query row's output.
  AttnCase c{16, 32, 4, 2, {{20, 5}}, 5};
  AttnSetup s = Build(c);
  CpuAppendKv(s.shape, s.batch, s.k_new.data(), s.v_new.data(), s.k_cache.data(), s.v_cache.data());
  std::vector<float> out1(s.q.size()), out2(s.q.size());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), s.k_cache.data(), s.v_cache.data(), 0.2f,
                    out1.data());
  // Overwrite the K/V of the last position (19) and recompute.
  AttentionBatch last;
  last.num_tokens = 1;
  last.slot_mapping = {s.batch.slot_mapping.back()};
  const std::vector<float> junk(static_cast<size_t>(2 * 32), 9.0f);
  CpuAppendKv(s.shape, last, junk.data(), junk.data(), s.k_cache.data(), s.v_cache.data());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), s.k_cache.data(), s.v_cache.data(), 0.2f,
                    out2.data());
  const size_t per_row = static_cast<size_t>(4 * 32);
  // Rows 0..3 (positions 15..18) are unchanged; row 4 (position 19) changes.
  for (size_t i = 0; i < 4 * per_row; ++i) REQUIRE(out1[i] == out2[i]);
  bool changed = false;
  for (size_t i = 4 * per_row; i < 5 * per_row; ++i) changed |= out1[i] != out2[i];
  CHECK(changed);
}

TEST_CASE("CpuPagedAttention sliding window matches dense windowed attention", "[cpu_attention]") {
  // Decode, a prefill chunk straddling blocks, a whole prefill, a first token; windows from the
  // diagonal alone to wider than every sequence (== no window).
  int n = 0;
  for (int block_size : {16, 64}) {
    for (int window_left : {0, 1, 4, 15, 16, 63, 500}) {
      AttnCase c{block_size, 32, 8, 2, {{130, 1}, {65, 24}, {17, 17}, {1, 1}}, 200u + n++};
      const std::vector<float> windowed = CheckAgainstReference(c, window_left);
      const std::vector<float> full = CheckAgainstReference(c, -1);
      if (window_left < 129) {
        CHECK(windowed != full);  // the window matters, so the comparison above can fail
      } else {
        CHECK(windowed == full);
      }
    }
  }
}

// Blocks wholly left of the first query row's window get a page index far outside the cache, so
// reading them faults: windowed attention must not touch them (the engine may free them).
TEST_CASE("Windowed CPU attention never reads blocks left of the window, and C8 matches fp32",
          "[cpu_attention]") {
  const int window_left = 6;
  AttnCase c{16, 32, 4, 2, {{100, 1}, {70, 5}, {20, 20}}, 31};
  AttnSetup s = Build(c);
  CpuAppendKv(s.shape, s.batch, s.k_new.data(), s.v_new.data(), s.k_cache.data(), s.v_cache.data());
  const float scale = 0.3f;
  std::vector<float> clean(s.q.size()), wild(s.q.size());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), s.k_cache.data(), s.v_cache.data(), scale,
                    clean.data(), window_left);

  // The same cache as int8 with per-head scales (NaN in never-written slots quantizes to 0).
  const size_t elems = s.k_cache.size();
  std::vector<uint8_t> k8(elems), v8(elems);
  const std::vector<float> head_scale(c.num_kv_heads, 1.0f / 127.0f);
  for (size_t i = 0; i < elems; ++i) {
    k8[i] = QuantizeKvElement(DType::kI8, s.k_cache[i], 1.0f / 127.0f);
    v8[i] = QuantizeKvElement(DType::kI8, s.v_cache[i], 1.0f / 127.0f);
  }
  QuantKvCacheView view;
  view.shape = s.shape;
  view.dtype = DType::kI8;
  view.quant = KvQuant::kStaticPerHead;
  view.k = k8.data();
  view.v = v8.data();
  view.k_scale = head_scale.data();
  view.v_scale = head_scale.data();
  std::vector<float> kf(elems), vf(elems), ref(s.q.size()), c8(s.q.size()), c8_wild(s.q.size());
  CpuDequantizeKvCache(view, s.num_blocks, kf.data(), vf.data());
  CpuPagedAttention(s.shape, s.batch, s.q.data(), kf.data(), vf.data(), scale, ref.data(),
                    window_left);
  CpuPagedAttentionQuant(view, s.batch, s.q.data(), scale, c8.data(), window_left);
  CHECK(c8 == ref);  // same operations in the same order on the dequantized values

  AttentionBatch hidden = s.batch;
  int wild_pages = 0;
  for (int seq = 0; seq < hidden.num_seqs; ++seq) {
    const int first_pos = hidden.kv_lens[seq] - (hidden.q_indptr[seq + 1] - hidden.q_indptr[seq]);
    const int lo = std::max(0, first_pos - window_left);
    for (int blk = 0; (blk + 1) * c.block_size <= lo; ++blk) {
      hidden.page_indices[hidden.page_indptr[seq] + blk] = 1 << 24;
      ++wild_pages;
    }
  }
  CHECK(wild_pages == 5 + 3);  // positions < 93 and < 59: 5 and 3 whole blocks
  CpuPagedAttention(s.shape, hidden, s.q.data(), s.k_cache.data(), s.v_cache.data(), scale,
                    wild.data(), window_left);
  CHECK(wild == clean);
  CpuPagedAttentionQuant(view, hidden, s.q.data(), scale, c8_wild.data(), window_left);
  CHECK(c8_wild == c8);
}

AttentionSpec CpuSpec() {
  AttentionSpec spec;
  spec.device = DeviceKind::kCpu;
  spec.kind = AttentionKind::kMha;
  spec.kv_dtype = DType::kF32;
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.features = kFeatureCausal;
  return spec;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("BackendRegistry selects cpu_reference for a CPU fp32 MHA spec", "[cpu_attention]") {
  const AttentionSpec spec = CpuSpec();
  const Selection sel = BackendRegistry::Global().Select(spec);
  REQUIRE(sel.info != nullptr);
  CHECK(sel.info->name == "cpu_reference");
  const std::string table = sel.Table(spec);
  CHECK(Contains(table, "cpu_reference"));
  CHECK(Contains(table, "SELECTED"));

  std::string table_out;
  auto backend = BackendRegistry::Global().Create(spec, "", &table_out);
  REQUIRE(backend.ok());
  CHECK((*backend)->name() == "cpu_reference");
  CHECK((*backend)->BlockBytes() == 2u * 2 * 16 * 64 * sizeof(float));
  CHECK(Contains(table_out, "cpu_reference"));

  // Forcing it by name works too.
  auto forced = BackendRegistry::Global().Create(spec, "cpu_reference", nullptr);
  REQUIRE(forced.ok());
  CHECK((*forced)->name() == "cpu_reference");
}

TEST_CASE("cpu_reference backend Plan/Run equals the direct kernels", "[cpu_attention]") {
  AttnCase c{16, 64, 8, 2, {{17, 1}, {40, 3}, {65, 65}}, 99};
  const std::vector<float> direct = CheckAgainstReference(c);

  AttnSetup s = Build(c);
  AttentionSpec spec = CpuSpec();
  spec.num_q_heads = c.num_q_heads;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.block_size = c.block_size;
  auto backend = BackendRegistry::Global().Create(spec, "", nullptr);
  REQUIRE(backend.ok());
  REQUIRE((*backend)->Plan(s.batch).ok());
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  AttentionParams p;
  p.q = s.q.data();
  p.k_new = s.k_new.data();
  p.v_new = s.v_new.data();
  p.out = out.data();
  p.cache.k = s.k_cache.data();
  p.cache.v = s.v_cache.data();
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  REQUIRE((*backend)->Run(p).ok());
  CHECK(out == direct);
}

TEST_CASE("CPU backends implement the sliding window and honor window_left", "[cpu_attention]") {
  AttnCase c{16, 64, 8, 2, {{40, 1}, {70, 9}}, 123};
  for (DType kv : {DType::kF32, DType::kI8}) {
    AttentionSpec spec = CpuSpec();
    spec.features = kFeatureCausal | kFeatureSlidingWindow;
    spec.kv_dtype = kv;
    spec.kv_quant = kv == DType::kI8 ? KvQuant::kStaticPerHead : KvQuant::kNone;
    const Selection sel = BackendRegistry::Global().Select(spec);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == (kv == DType::kF32 ? "cpu_reference" : "cpu_c8"));
    CHECK((sel.info->features & kFeatureSlidingWindow) != 0);
    auto backend = BackendRegistry::Global().Create(spec, "", nullptr);
    REQUIRE(backend.ok());

    std::vector<float> out[2];
    for (int window_left : {-1, 5}) {
      AttnSetup s = Build(c);
      const std::vector<float> head_scale(c.num_kv_heads, 1.0f / 127.0f);
      std::vector<uint8_t> k8(s.k_cache.size(), 0), v8(s.v_cache.size(), 0);
      std::vector<float> direct(s.q.size());
      REQUIRE((*backend)->Plan(s.batch).ok());
      AttentionParams p;
      p.q = s.q.data();
      p.k_new = s.k_new.data();
      p.v_new = s.v_new.data();
      std::vector<float>& o = out[window_left < 0 ? 0 : 1];
      o.assign(s.q.size(), std::numeric_limits<float>::quiet_NaN());
      p.out = o.data();
      if (kv == DType::kF32) {
        p.cache.k = s.k_cache.data();
        p.cache.v = s.v_cache.data();
      } else {
        // Re-quantize the prefix the fp32 setup holds (NaN slots -> 0) into the 8-bit cache.
        for (size_t i = 0; i < k8.size(); ++i) {
          k8[i] = QuantizeKvElement(DType::kI8, s.k_cache[i], head_scale[0]);
          v8[i] = QuantizeKvElement(DType::kI8, s.v_cache[i], head_scale[0]);
        }
        p.cache.k = k8.data();
        p.cache.v = v8.data();
        p.cache.k_scale = head_scale.data();
        p.cache.v_scale = head_scale.data();
      }
      p.softmax_scale = 0.125f;
      p.window_left = window_left;
      REQUIRE((*backend)->Run(p).ok());
      // The direct kernel on the cache the backend just appended to.
      if (kv == DType::kF32) {
        CpuPagedAttention(s.shape, s.batch, s.q.data(), s.k_cache.data(), s.v_cache.data(), 0.125f,
                          direct.data(), window_left);
      } else {
        CpuPagedAttentionQuant(MakeQuantKvCacheView(spec, p.cache), s.batch, s.q.data(), 0.125f,
                               direct.data(), window_left);
      }
      INFO(DTypeName(kv) << " window_left " << window_left);
      CHECK(o == direct);
    }
    CHECK(out[0] != out[1]);  // window_left reached the kernel
  }
}

TEST_CASE("CpuPagedAttention soft-cap and sink logits match dense attention", "[cpu_attention]") {
  // Random shapes (head_dim 256 included, Gemma's), windows, caps and sink logits; a large
  // softmax scale pushes scores past the cap, so tanh is far from the identity.
  std::mt19937 rng(4242);
  std::uniform_real_distribution<float> sink_dist(-3.0f, 3.0f);
  const int head_dims[] = {16, 64, 128, 256};
  const std::pair<int, int> heads[] = {{4, 2}, {8, 1}, {4, 4}};
  for (int i = 0; i < 24; ++i) {
    const int d = head_dims[i % 4];
    const auto [hq, hkv] = heads[i % 3];
    const int block_size = i % 2 == 0 ? 16 : 64;
    const int kv_a = std::uniform_int_distribution<int>(1, 150)(rng);
    const int kv_b = std::uniform_int_distribution<int>(1, 40)(rng);
    AttnCase c{block_size,
               d,
               hq,
               hkv,
               {{kv_a, 1}, {kv_b, kv_b}, {kv_a, std::min(kv_a, 9)}},
               900u + static_cast<uint32_t>(i)};
    const int window_left = i % 3 == 0 ? 15 : -1;
    const float cap = i % 4 == 3 ? 0.0f : 2.0f + static_cast<float>(i % 5) * 10.0f;
    std::vector<float> sinks(static_cast<size_t>(hq));
    for (float& x : sinks) x = sink_dist(rng);
    const float* sink_ptr = i % 2 == 0 ? sinks.data() : nullptr;
    const float scale = 4.0f / std::sqrt(static_cast<float>(d));
    const std::vector<float> modified = CheckAgainstReference(c, window_left, cap, sink_ptr, scale);
    const std::vector<float> plain = CheckAgainstReference(c, window_left, 0.0f, nullptr, scale);
    if (cap > 0.0f || sink_ptr != nullptr) CHECK(modified != plain);  // the modifiers took effect
  }
}

TEST_CASE("CpuPagedAttention ALiBi matches dense attention", "[cpu_attention]") {
  // Random shapes, windows, soft-caps and sinks with ALiBi slopes as BLOOM / MPT set them
  // (2^(-8 (h + 1) / H)), scaled up so that the bias is large against the scores.
  std::mt19937 rng(777);
  const int head_dims[] = {16, 64, 128, 256};
  const std::pair<int, int> heads[] = {{4, 2}, {8, 1}, {4, 4}};
  for (int i = 0; i < 12; ++i) {
    const int d = head_dims[i % 4];
    const auto [hq, hkv] = heads[i % 3];
    const int kv_a = std::uniform_int_distribution<int>(1, 150)(rng);
    const int kv_b = std::uniform_int_distribution<int>(1, 40)(rng);
    AttnCase c{i % 2 == 0 ? 16 : 64,
               d,
               hq,
               hkv,
               {{kv_a, 1}, {kv_b, kv_b}, {kv_a, std::min(kv_a, 9)}},
               1300u + static_cast<uint32_t>(i)};
    std::vector<float> slopes(static_cast<size_t>(hq)), sinks(static_cast<size_t>(hq), 0.5f);
    for (int h = 0; h < hq; ++h) slopes[h] = 4.0f * std::exp2(-8.0f * (h + 1) / hq);
    const int window_left = i % 3 == 0 ? 20 : -1;
    const float cap = i % 4 == 1 ? 5.0f : 0.0f;
    const float* sink_ptr = i % 4 == 2 ? sinks.data() : nullptr;
    const std::vector<float> with =
        CheckAgainstReference(c, window_left, cap, sink_ptr, 0.0f, slopes.data());
    const std::vector<float> without = CheckAgainstReference(c, window_left, cap, sink_ptr);
    CHECK(with != without);  // the bias took effect
  }
}

TEST_CASE("A sink logit far below every score changes nothing and a high one drains the row",
          "[cpu_attention]") {
  AttnCase c{16, 32, 4, 2, {{20, 4}, {3, 1}}, 31};
  const std::vector<float> low(4, -1e4f), high(4, 60.0f);
  const std::vector<float> plain = CheckAgainstReference(c);
  const std::vector<float> with_low = CheckAgainstReference(c, -1, 0.0f, low.data());
  CHECK(with_low == plain);
  // The sink takes nearly all the mass and its value is zero: the output goes to ~0.
  const std::vector<float> with_high = CheckAgainstReference(c, -1, 0.0f, high.data());
  for (float x : with_high) CHECK(std::abs(x) < 1e-20f);
}

TEST_CASE(
    "Models needing soft-cap or sinks get cpu_reference, and an 8-bit cache gets cpu_c8 for "
    "sinks and fails naming the soft-cap",
    "[cpu_attention]") {
  for (uint32_t feature :
       {static_cast<uint32_t>(kFeatureSoftCap), static_cast<uint32_t>(kFeatureSinks)}) {
    AttentionSpec spec = CpuSpec();
    spec.head_dim = 256;
    spec.features = kFeatureCausal | kFeatureSlidingWindow | feature;
    const Selection sel = BackendRegistry::Global().Select(spec);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "cpu_reference");
    spec.kv_dtype = DType::kI8;
    spec.kv_quant = KvQuant::kStaticPerHead;
    std::string table;
    auto backend = BackendRegistry::Global().Create(spec, "", &table);
    INFO(table);
    if (feature == kFeatureSinks) {  // gpt-oss: cpu_c8 has the sinks
      REQUIRE(backend.ok());
      CHECK((*backend)->name() == "cpu_c8");
      continue;
    }
    REQUIRE_FALSE(backend.ok());
    INFO(backend.status().message());
    CHECK(backend.status().message().find(FeatureNames(feature)) != std::string::npos);
  }
}

TEST_CASE("cpu_reference Run applies AttentionParams' soft-cap and sinks", "[cpu_attention]") {
  AttnCase c{16, 256, 4, 2, {{33, 1}, {18, 18}}, 77};
  AttentionSpec spec = CpuSpec();
  spec.num_q_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 256;
  spec.block_size = 16;
  spec.features = kFeatureCausal | kFeatureSoftCap | kFeatureSinks;
  auto backend = BackendRegistry::Global().Create(spec, "", nullptr);
  REQUIRE(backend.ok());
  AttnSetup s = Build(c);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  REQUIRE((*backend)->Plan(s.batch).ok());
  AttentionParams p;
  p.q = s.q.data();
  p.k_new = s.k_new.data();
  p.v_new = s.v_new.data();
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  p.out = out.data();
  p.cache.k = s.k_cache.data();
  p.cache.v = s.v_cache.data();
  p.softmax_scale = 0.25f;
  p.logit_softcap = 3.0f;
  p.sink_logits = sinks.data();
  REQUIRE((*backend)->Run(p).ok());
  const std::vector<double> ref = Reference(c, s, 0.25f, -1, 3.0, sinks.data());
  for (size_t i = 0; i < out.size(); ++i) {
    REQUIRE(std::abs(out[i] - ref[i]) <= 1e-5 * std::max(1.0, std::abs(ref[i])));
  }
}

TEST_CASE("BackendRegistry reports why nothing fits", "[cpu_attention]") {
  AttentionSpec spec = CpuSpec();
  std::string expect;
  SECTION("CUDA device") {
    spec.device = DeviceKind::kCuda;
    spec.device_arch = 90;
    expect = "device";
  }
  SECTION("int8 KV cache") {
    spec.kv_dtype = DType::kI8;
    expect = "int8";
  }
  SECTION("ALiBi with an 8-bit cache") {
    spec.kv_dtype = DType::kI8;
    spec.kv_quant = KvQuant::kStaticPerHead;
    spec.features = kFeatureCausal | kFeatureAlibi;
    expect = "alibi";
  }
  SECTION("MLA") {
    spec.kind = AttentionKind::kMla;
    spec.kv_dtype = DType::kI8;  // cpu_mla serves fp32 / fp8 latent caches only
    spec.mla_rope_dim = 16;
    expect = "kind";
  }
  const Selection sel = BackendRegistry::Global().Select(spec);
  CHECK(sel.info == nullptr);
  bool any_row_names_it = false;
  for (const SelectionRow& row : sel.rows) {
    CHECK_FALSE(row.fits);
    any_row_names_it |= Contains(row.reason, expect);
  }
  CHECK(any_row_names_it);

  std::string table;
  auto created = BackendRegistry::Global().Create(spec, "", &table);
  REQUIRE_FALSE(created.ok());
  CHECK(created.status().code() == StatusCode::kFailedPrecondition);
  CHECK(Contains(created.status().message(), expect));
  CHECK(Contains(created.status().message(), "cpu_reference"));
  CHECK(Contains(table, "cpu_reference"));
}

TEST_CASE("BackendRegistry forcing an unknown backend fails naming it", "[cpu_attention]") {
  auto created = BackendRegistry::Global().Create(CpuSpec(), "no_such_backend", nullptr);
  REQUIRE_FALSE(created.ok());
  CHECK(created.status().code() == StatusCode::kFailedPrecondition);
  CHECK(Contains(created.status().message(), "no_such_backend"));
}

BackendInfo FakeInfo(const std::string& name, int priority) {
  BackendInfo info;
  info.name = name;
  info.device = DeviceKind::kCpu;
  info.kind = AttentionKind::kMha;
  info.kv_dtypes = {DType::kF32, DType::kBF16};
  info.features = kFeatureCausal | kFeatureSlidingWindow;
  info.priority = priority;
  info.create = [name](const AttentionSpec&) -> std::unique_ptr<AttentionBackend> {
    return std::make_unique<test::StandInBackend>(name);
  };
  return info;
}

TEST_CASE("BackendRegistry local instance: priority, force_name and the table", "[cpu_attention]") {
  BackendRegistry reg;
  reg.Register(FakeInfo("fake_slow", 1));
  reg.Register(FakeInfo("fake_fast", 10));
  BackendInfo gpu = FakeInfo("fake_gpu", 100);
  gpu.device = DeviceKind::kCuda;
  gpu.min_arch = 80;
  reg.Register(gpu);
  BackendInfo picky = FakeInfo("fake_picky", 50);
  picky.head_dims = {128};
  picky.min_block_size = 32;
  reg.Register(picky);
  REQUIRE(reg.backends().size() == 4);
  // Registering locally leaves the global registry alone.
  for (const BackendInfo& b : BackendRegistry::Global().backends()) CHECK(b.name != "fake_fast");

  const AttentionSpec spec = CpuSpec();  // head_dim 64, block 16

  SECTION("highest priority among those that fit") {
    const Selection sel = reg.Select(spec);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "fake_fast");
    REQUIRE(sel.rows.size() == 4);
    CHECK(sel.rows[0].fits);
    CHECK(sel.rows[0].reason == "fits, lower priority");
    CHECK(sel.rows[1].fits);
    CHECK(sel.rows[1].reason.rfind("SELECTED", 0) == 0);
    CHECK_FALSE(sel.rows[2].fits);
    CHECK(Contains(sel.rows[2].reason, "device"));
    CHECK_FALSE(sel.rows[3].fits);
    CHECK(Contains(sel.rows[3].reason, "head_dim 64"));
    const std::string table = sel.Table(spec);
    for (const char* name : {"fake_slow", "fake_fast", "fake_gpu", "fake_picky"}) {
      CHECK(Contains(table, name));
    }
    CHECK(Contains(table, "SELECTED"));
    std::string table_out;
    auto created = reg.Create(spec, "", &table_out);
    REQUIRE(created.ok());
    CHECK((*created)->name() == "fake_fast");
    CHECK(table_out == table);
  }
  SECTION("force_name picks a lower-priority backend") {
    const Selection sel = reg.Select(spec, "fake_slow");
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "fake_slow");
    CHECK(sel.rows[1].reason == "not the forced backend");
    auto created = reg.Create(spec, "fake_slow", nullptr);
    REQUIRE(created.ok());
    CHECK((*created)->name() == "fake_slow");
  }
  SECTION("force_name of a backend that does not fit fails") {
    auto created = reg.Create(spec, "fake_gpu", nullptr);
    REQUIRE_FALSE(created.ok());
    CHECK(created.status().code() == StatusCode::kFailedPrecondition);
    CHECK(Contains(created.status().message(), "fake_gpu"));
  }
  SECTION("the picky backend wins when its constraints hold") {
    AttentionSpec big = spec;
    big.head_dim = 128;
    big.block_size = 64;
    const Selection sel = reg.Select(big);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "fake_picky");
    big.block_size = 48;  // not a multiple of 32
    const Selection sel2 = reg.Select(big);
    REQUIRE(sel2.info != nullptr);
    CHECK(sel2.info->name == "fake_fast");
    CHECK(Contains(sel2.rows[3].reason, "block_size 48"));
  }
  SECTION("device arch range") {
    AttentionSpec cuda = spec;
    cuda.device = DeviceKind::kCuda;
    cuda.device_arch = 75;
    Selection sel = reg.Select(cuda);
    CHECK(sel.info == nullptr);
    CHECK(Contains(sel.rows[2].reason, "arch sm_75"));
    cuda.device_arch = 90;
    sel = reg.Select(cuda);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "fake_gpu");
  }
  SECTION("missing features are named") {
    AttentionSpec soft = spec;
    soft.features = kFeatureCausal | kFeatureSoftCap | kFeatureSinks;
    const Selection sel = reg.Select(soft);
    CHECK(sel.info == nullptr);
    CHECK(Contains(sel.rows[0].reason, "softcap"));
    CHECK(Contains(sel.rows[0].reason, "sinks"));
  }
}

}  // namespace
}  // namespace llm
