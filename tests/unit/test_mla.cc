// Tests for multi-head latent attention (DeepSeek MLA): the absorbed form (W_UK folded into the
// query, W_UV applied after) equals the expanded per-head computation; the CPU MLA decode kernel
// matches a naive dense reference over shuffled pages with odd lengths and 1..4 query rows; the
// fp8 e4m3 latent cache stores exactly QuantizeFp8 bytes and attends on the dequantized values;
// the "cpu_mla" backend is selected for kMla and leaves prefill rows to the caller.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "base/quant.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_mla_attention.h"

namespace llm {
namespace {

struct Seq {
  int kv_len;  // cache length after this step
  int q_len;   // new rows this step (the last q_len positions)
};

// One step over several sequences: pages shuffled over a pool with spare blocks, dense copies of
// every sequence's latents [kv_len, L], fresh query inputs.
struct MlaSetup {
  MlaShape shape;
  AttentionBatch batch;
  int num_blocks = 0;
  std::vector<std::vector<float>> dense;  // per seq [kv_len, L]
  std::vector<float> latent_new;          // [num_tokens, L]
  std::vector<float> q_latent, q_pe;      // [num_tokens, H, C], [num_tokens, H, R]
};

MlaSetup Build(const MlaShape& shape, const std::vector<Seq>& seqs, uint32_t seed,
               float latent_range = 1.0f) {
  MlaSetup s;
  s.shape = shape;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int L = shape.latent_dim(), bs = shape.block_size;
  int needed = 0;
  for (const Seq& q : seqs) needed += (q.kv_len + bs - 1) / bs;
  s.num_blocks = needed + 3;
  std::vector<int32_t> perm(s.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  AttentionBatch& b = s.batch;
  b.num_seqs = static_cast<int>(seqs.size());
  b.q_indptr = {0};
  b.page_indptr = {0};
  int next = 0;
  for (const Seq& q : seqs) {
    const int pages = (q.kv_len + bs - 1) / bs;
    for (int p = 0; p < pages; ++p) b.page_indices.push_back(perm[next++]);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.q_indptr.push_back(b.q_indptr.back() + q.q_len);
    b.kv_lens.push_back(q.kv_len);
    std::vector<float> d(static_cast<size_t>(q.kv_len) * L);
    for (float& v : d) v = latent_range * uni(rng);
    const int32_t* pg = b.page_indices.data() + b.page_indptr[b.page_indptr.size() - 2];
    for (int j = q.kv_len - q.q_len; j < q.kv_len; ++j) {
      b.slot_mapping.push_back(pg[j / bs] * bs + j % bs);
      s.latent_new.insert(s.latent_new.end(), d.begin() + static_cast<size_t>(j) * L,
                          d.begin() + static_cast<size_t>(j + 1) * L);
    }
    s.dense.push_back(std::move(d));
  }
  b.num_tokens = b.q_indptr.back();
  s.q_latent.resize(static_cast<size_t>(b.num_tokens) * shape.num_heads * shape.kv_lora_rank);
  s.q_pe.resize(static_cast<size_t>(b.num_tokens) * shape.num_heads * shape.rope_dim);
  for (float& v : s.q_latent) v = uni(rng);
  for (float& v : s.q_pe) v = uni(rng);
  return s;
}

// Earlier tokens are "already in the cache": write them at their slots directly.
template <typename Store>
void FillHistory(const MlaSetup& s, Store store) {
  const int bs = s.shape.block_size, L = s.shape.latent_dim();
  for (int q = 0; q < s.batch.num_seqs; ++q) {
    const int q_len = s.batch.q_indptr[q + 1] - s.batch.q_indptr[q];
    const int32_t* pg = s.batch.page_indices.data() + s.batch.page_indptr[q];
    for (int j = 0; j < s.batch.kv_lens[q] - q_len; ++j) {
      const size_t row = (static_cast<size_t>(pg[j / bs]) * bs + j % bs) * L;
      store(row, s.dense[q].data() + static_cast<size_t>(j) * L);
    }
  }
}

// Naive dense causal attention in the absorbed form over `latents` (per seq [kv_len, L]).
void Reference(const MlaSetup& s, const std::vector<std::vector<float>>& latents, float scale,
               std::vector<float>* out, std::vector<float>* lse) {
  const int H = s.shape.num_heads, C = s.shape.kv_lora_rank, R = s.shape.rope_dim;
  const int L = s.shape.latent_dim();
  out->assign(static_cast<size_t>(s.batch.num_tokens) * H * C, 0.0f);
  lse->assign(static_cast<size_t>(s.batch.num_tokens) * H, 0.0f);
  for (int q = 0; q < s.batch.num_seqs; ++q) {
    const int qb = s.batch.q_indptr[q], qe = s.batch.q_indptr[q + 1];
    const int kv = s.batch.kv_lens[q];
    for (int t = qb; t < qe; ++t) {
      const int pos = kv - (qe - t);
      for (int h = 0; h < H; ++h) {
        std::vector<double> sc(pos + 1);
        double mx = -1e300;
        for (int j = 0; j <= pos; ++j) {
          const float* c = latents[q].data() + static_cast<size_t>(j) * L;
          double dot = 0;
          for (int i = 0; i < C; ++i) dot += double(s.q_latent[(size_t(t) * H + h) * C + i]) * c[i];
          for (int i = 0; i < R; ++i) dot += double(s.q_pe[(size_t(t) * H + h) * R + i]) * c[C + i];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (double& v : sc) sum += (v = std::exp(v - mx));
        for (int j = 0; j <= pos; ++j) {
          const float* c = latents[q].data() + static_cast<size_t>(j) * L;
          for (int i = 0; i < C; ++i) {
            (*out)[(size_t(t) * H + h) * C + i] += static_cast<float>(sc[j] / sum * c[i]);
          }
        }
        (*lse)[size_t(t) * H + h] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<int32_t> AllSeqs(const AttentionBatch& b) {
  std::vector<int32_t> v(b.num_seqs);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST_CASE("MLA absorbed decode equals the expanded per-head attention", "[mla]") {
  struct Dims {
    int H, N, R, V, C;
  };
  // Tiny test-model sizes, and DeepSeek's real per-head sizes (C 512, R 64, N 128, V 128).
  for (const Dims& dm : {Dims{4, 16, 16, 16, 32}, Dims{3, 128, 64, 128, 512}}) {
    CAPTURE(dm.H, dm.N, dm.R, dm.V, dm.C);
    const int H = dm.H, N = dm.N, R = dm.R, V = dm.V, C = dm.C, NV = N + V, L = C + R;
    std::mt19937 rng(7 + C);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // kv_b_proj [H * (N + V), C]: per head N rows of W_UK then V rows of W_UV.
    std::vector<float> w_kv_b(static_cast<size_t>(H) * NV * C);
    for (float& v : w_kv_b) v = nd(rng) / std::sqrt(static_cast<float>(C));
    const MlaShape shape{H, C, R, 5};
    for (int q_len = 1; q_len <= kMlaMaxDecodeQueryLen; ++q_len) {
      CAPTURE(q_len);
      MlaSetup s = Build(shape, {{23, q_len}}, 100 + q_len);
      const int T = q_len, kv = 23;
      std::vector<float> q_nope(static_cast<size_t>(T) * H * N);
      for (float& v : q_nope) v = nd(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(N + R)) * 1.3f;

      // Expanded: k_nope_h(j) = W_UK_h c_j, v_h(j) = W_UV_h c_j, scores over [q_nope, q_pe].
      std::vector<double> expanded(static_cast<size_t>(T) * H * V, 0.0);
      const std::vector<float>& lat = s.dense[0];
      for (int t = 0; t < T; ++t) {
        const int pos = kv - (T - t);
        for (int h = 0; h < H; ++h) {
          std::vector<double> sc(pos + 1), kn(N), vv(V);
          std::vector<std::vector<double>> vals(pos + 1);
          double mx = -1e300;
          for (int j = 0; j <= pos; ++j) {
            const float* c = lat.data() + static_cast<size_t>(j) * L;
            double dot = 0;
            for (int n = 0; n < N + V; ++n) {
              double acc = 0;
              for (int i = 0; i < C; ++i)
                acc += double(w_kv_b[(size_t(h) * NV + n) * C + i]) * c[i];
              if (n < N) {
                dot += acc * q_nope[(size_t(t) * H + h) * N + n];
              } else {
                vals[j].push_back(acc);
              }
            }
            for (int i = 0; i < R; ++i)
              dot += double(s.q_pe[(size_t(t) * H + h) * R + i]) * c[C + i];
            sc[j] = dot * scale;
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (double& v : sc) sum += (v = std::exp(v - mx));
          for (int j = 0; j <= pos; ++j) {
            for (int i = 0; i < V; ++i)
              expanded[(size_t(t) * H + h) * V + i] += sc[j] / sum * vals[j][i];
          }
        }
      }

      // Absorbed: q_latent = W_UK_h^T q_nope through the paged kernel, then W_UV_h out_latent.
      for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
          for (int i = 0; i < C; ++i) {
            double acc = 0;
            for (int n = 0; n < N; ++n) {
              acc += double(w_kv_b[(size_t(h) * NV + n) * C + i]) *
                     q_nope[(size_t(t) * H + h) * N + n];
            }
            s.q_latent[(size_t(t) * H + h) * C + i] = static_cast<float>(acc);
          }
        }
      }
      std::vector<float> cache(static_cast<size_t>(s.num_blocks) * shape.block_size * L, 0.0f);
      FillHistory(s,
                  [&](size_t row, const float* src) { std::copy_n(src, L, cache.data() + row); });
      CpuMlaAppendLatent(shape, s.batch, s.latent_new.data(), DType::kF32, 1.0f, cache.data());
      std::vector<float> out_lat(static_cast<size_t>(T) * H * C);
      MlaDecodeParams p;
      p.shape = shape;
      p.cache = cache.data();
      p.q_latent = s.q_latent.data();
      p.q_pe = s.q_pe.data();
      p.softmax_scale = scale;
      p.out_latent = out_lat.data();
      CpuMlaDecode(p, s.batch, AllSeqs(s.batch));
      double max_err = 0, max_ref = 0;
      for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
          for (int i = 0; i < V; ++i) {
            double acc = 0;
            for (int c = 0; c < C; ++c) {
              acc += double(w_kv_b[(size_t(h) * NV + N + i) * C + c]) *
                     out_lat[(size_t(t) * H + h) * C + c];
            }
            const double ref = expanded[(size_t(t) * H + h) * V + i];
            max_err = std::max(max_err, std::fabs(acc - ref));
            max_ref = std::max(max_ref, std::fabs(ref));
          }
        }
      }
      CHECK(max_ref > 0.1);
      CHECK(max_err <= 2e-5 * max_ref);
    }
  }
}

TEST_CASE("CPU MLA decode kernel matches a dense reference over shuffled pages", "[mla]") {
  struct Case {
    MlaShape shape;
    std::vector<Seq> seqs;
  };
  const std::vector<Case> cases = {
      {{4, 32, 16, 16}, {{1, 1}, {17, 1}, {33, 2}, {5, 3}, {48, 4}}},
      {{2, 24, 8, 3}, {{4, 4}, {2, 2}, {10, 3}, {31, 1}}},
      {{5, 16, 16, 1}, {{7, 4}, {1, 1}, {9, 2}}},
      {{8, 512, 64, 64}, {{130, 1}, {65, 4}, {64, 2}}},  // DeepSeek latent width 576
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    CAPTURE(c.shape.block_size, c.shape.kv_lora_rank, c.shape.num_heads);
    MlaSetup s = Build(c.shape, c.seqs, seed++);
    const int L = c.shape.latent_dim();
    std::vector<float> cache(static_cast<size_t>(s.num_blocks) * c.shape.block_size * L, -7.0f);
    FillHistory(s, [&](size_t row, const float* src) { std::copy_n(src, L, cache.data() + row); });
    CpuMlaAppendLatent(c.shape, s.batch, s.latent_new.data(), DType::kF32, 1.0f, cache.data());
    // The gather reads back exactly the dense latents.
    for (int q = 0; q < s.batch.num_seqs; ++q) {
      std::vector<float> g(s.dense[q].size());
      CpuMlaGatherLatents(c.shape, s.batch, q, DType::kF32, 1.0f, cache.data(), g.data());
      REQUIRE(g == s.dense[q]);
    }
    const float scale = 0.3f;
    std::vector<float> out(s.q_latent.size(), NAN), lse(s.batch.num_tokens * c.shape.num_heads);
    MlaDecodeParams p;
    p.shape = c.shape;
    p.cache = cache.data();
    p.q_latent = s.q_latent.data();
    p.q_pe = s.q_pe.data();
    p.softmax_scale = scale;
    p.out_latent = out.data();
    p.lse = lse.data();
    CpuMlaDecode(p, s.batch, MlaDecodeSeqs(s.batch));
    std::vector<float> ref, ref_lse;
    Reference(s, s.dense, scale, &ref, &ref_lse);
    CHECK(MaxAbsDiff(out, ref) < 2e-5f);
    CHECK(MaxAbsDiff(lse, ref_lse) < 2e-4f);
  }
}

TEST_CASE("MLA fp8 e4m3 latent cache round trip", "[mla]") {
  const MlaShape shape{4, 32, 16, 16};
  for (const float cache_scale : {1.0f, 0.02f, 0.5f}) {
    CAPTURE(cache_scale);
    // Latents up to +-3 cover normal and subnormal e4m3 values at these scales; with 0.02
    // everything above 8.96 would saturate, so also check saturation separately below.
    MlaSetup s = Build(shape, {{19, 1}, {5, 4}, {40, 2}, {1, 1}}, 77, 3.0f);
    const int L = shape.latent_dim();
    std::vector<uint8_t> cache(static_cast<size_t>(s.num_blocks) * shape.block_size * L, 0x7f);
    FillHistory(s, [&](size_t row, const float* src) {
      for (int i = 0; i < L; ++i) cache[row + i] = QuantizeFp8(src[i], cache_scale);
    });
    CpuMlaAppendLatent(shape, s.batch, s.latent_new.data(), DType::kFp8E4M3, cache_scale,
                       cache.data());
    // Appended bytes are exactly QuantizeFp8 of the new latents, at their slots.
    for (int t = 0; t < s.batch.num_tokens; ++t) {
      for (int i = 0; i < L; ++i) {
        REQUIRE(cache[static_cast<size_t>(s.batch.slot_mapping[t]) * L + i] ==
                QuantizeFp8(s.latent_new[static_cast<size_t>(t) * L + i], cache_scale));
      }
    }
    // Dequantized dense latents: what the kernel must attend over.
    std::vector<std::vector<float>> deq = s.dense;
    float max_q_err = 0.0f;
    for (auto& d : deq) {
      for (float& v : d) {
        const float back = DequantizeFp8(QuantizeFp8(v, cache_scale), cache_scale);
        max_q_err = std::max(max_q_err, std::fabs(back - v) / std::max(std::fabs(v), 1.0f));
        v = back;
      }
    }
    CHECK(max_q_err > 0.0f);   // quantization really happened
    CHECK(max_q_err < 0.07f);  // e4m3: 3 mantissa bits, half-ulp relative error <= 1/16
    for (int q = 0; q < s.batch.num_seqs; ++q) {
      std::vector<float> g(deq[q].size());
      CpuMlaGatherLatents(shape, s.batch, q, DType::kFp8E4M3, cache_scale, cache.data(), g.data());
      REQUIRE(g == deq[q]);
    }
    std::vector<float> out(s.q_latent.size());
    MlaDecodeParams p;
    p.shape = shape;
    p.cache_dtype = DType::kFp8E4M3;
    p.cache = cache.data();
    p.cache_scale = cache_scale;
    p.q_latent = s.q_latent.data();
    p.q_pe = s.q_pe.data();
    p.softmax_scale = 0.25f;
    p.out_latent = out.data();
    CpuMlaDecode(p, s.batch, AllSeqs(s.batch));
    std::vector<float> ref, lse, ref32, lse32;
    Reference(s, deq, 0.25f, &ref, &lse);
    CHECK(MaxAbsDiff(out, ref) < 2e-5f);
    Reference(s, s.dense, 0.25f, &ref32, &lse32);
    const float fp8_vs_fp32 = MaxAbsDiff(out, ref32);
    CHECK(fp8_vs_fp32 > 1e-4f);  // the fp8 path is not secretly fp32
    CHECK(fp8_vs_fp32 < 0.3f);
  }
  // Saturation: values beyond 448 * scale clamp to +-448 * scale.
  CHECK(DequantizeFp8(QuantizeFp8(100.0f, 0.02f), 0.02f) == Approx(448.0f * 0.02f));
  CHECK(DequantizeFp8(QuantizeFp8(-100.0f, 0.02f), 0.02f) == Approx(-448.0f * 0.02f));
}

TEST_CASE("cpu_mla backend: selection, block bytes, decode rows only", "[mla]") {
  AttentionSpec spec;
  spec.kind = AttentionKind::kMla;
  spec.num_q_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_dim = 48;
  spec.mla_rope_dim = 16;
  spec.block_size = 3;
  for (DType dt : {DType::kF32, DType::kFp8E4M3}) {
    spec.kv_dtype = dt;
    const Selection sel = BackendRegistry::Global().Select(spec);
    REQUIRE(sel.info != nullptr);
    CHECK(sel.info->name == "cpu_mla");
  }
  // An MHA model never gets the MLA backend, and an MLA model never gets an MHA backend.
  AttentionSpec mha = spec;
  mha.kind = AttentionKind::kMha;
  mha.kv_dtype = DType::kF32;
  mha.num_kv_heads = 4;
  const Selection msel = BackendRegistry::Global().Select(mha);
  REQUIRE(msel.info != nullptr);
  CHECK(msel.info->name != "cpu_mla");
  spec.kv_dtype = DType::kI8;
  CHECK_FALSE(BackendRegistry::Global().Create(spec, "", nullptr).ok());

  spec.kv_dtype = DType::kFp8E4M3;
  std::string table;
  auto be = BackendRegistry::Global().Create(spec, "", &table);
  REQUIRE(be.ok());
  CHECK(table.find("cpu_mla") != std::string::npos);
  CHECK(be.value()->BlockBytes() == 3u * 48u * 1u);
  spec.kv_dtype = DType::kF32;
  be = BackendRegistry::Global().Create(spec, "cpu_mla", nullptr);
  REQUIRE(be.ok());
  CHECK(be.value()->BlockBytes() == 3u * 48u * 4u);
  auto* mla = dynamic_cast<MlaAttentionBackend*>(be.value().get());
  REQUIRE(mla != nullptr);

  // A decode sequence, a 9-row prefill chunk and a 4-row one: RunMla appends all 14 latents and
  // writes only the rows of sequences with <= kMlaMaxDecodeQueryLen rows.
  static_assert(kMlaMaxDecodeQueryLen < 9);
  const MlaShape shape{4, 32, 16, 3};
  MlaSetup s = Build(shape, {{10, 1}, {11, 9}, {6, 4}}, 5);
  const int L = shape.latent_dim();
  std::vector<float> cache(static_cast<size_t>(s.num_blocks) * shape.block_size * L, 0.0f);
  FillHistory(s, [&](size_t row, const float* src) { std::copy_n(src, L, cache.data() + row); });
  std::vector<float> out(s.q_latent.size(), 12345.0f);
  REQUIRE(mla->Plan(s.batch).ok());
  MlaParams p;
  p.q_latent = s.q_latent.data();
  p.q_pe = s.q_pe.data();
  p.latent_new = s.latent_new.data();
  p.out_latent = out.data();
  p.cache = cache.data();
  p.softmax_scale = 0.2f;
  REQUIRE(mla->RunMla(p).ok());
  for (int q = 0; q < 3; ++q) {
    std::vector<float> g(s.dense[q].size());
    CpuMlaGatherLatents(shape, s.batch, q, DType::kF32, 1.0f, cache.data(), g.data());
    REQUIRE(g == s.dense[q]);
  }
  std::vector<float> ref, lse;
  Reference(s, s.dense, 0.2f, &ref, &lse);
  const size_t row = static_cast<size_t>(shape.num_heads) * shape.kv_lora_rank;
  for (int t = 0; t < s.batch.num_tokens; ++t) {
    const bool prefill = t >= 1 && t < 10;  // sequence 1's rows
    for (size_t i = 0; i < row; ++i) {
      if (prefill) {
        REQUIRE(out[t * row + i] == 12345.0f);
      } else {
        REQUIRE(std::fabs(out[t * row + i] - ref[t * row + i]) < 2e-5f);
      }
    }
  }
  CHECK(MlaDecodeSeqs(s.batch) == std::vector<int32_t>{0, 2});
}

}  // namespace
}  // namespace llm
