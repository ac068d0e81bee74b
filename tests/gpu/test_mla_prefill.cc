// MLA prefill on the GPU (kernels/cuda/mla/mla_prefill.h, the cuda_mla backend's RunMlaPrefill)
// against a double-precision reference of the expanded attention, on fresh random inputs every
// run: batches mixing prefill chunks that start mid-context (kv_len > q_len) and whole prompts
// with decode sequences the prefill path must leave alone, shuffled block tables, bf16 and fp8
// caches, 16 and 128 heads. Each input set runs on the default tiling (contexts up to ~1000
// tokens: one chunk, one softmax per row) and on forced small tilings: keys in chunks of 64, 128
// or 100 (not a multiple of the block size), query rows in blocks of 48 or 40, score tiles of 16,
// 9 or 7 rows, so rows whose visible keys end inside a chunk, chunks a row cannot see, tiles
// starting at rows that differ from chunk to chunk and running maxima that move from chunk to
// chunk all occur. A last case reserves the default working memory first and attends contexts
// past the default 2,048-key chunk in it without growing it.
//
// The reference takes the operands in the precision the expanded form defines them: the cached
// latents as bf16 (fp8 bytes times the scale, rounded), k_nope and v = W_UK c, W_UV c rounded to
// bf16 after an exact product, q as bf16; scores, softmax and output in double. The GPU rounds
// the probabilities and the output to bf16: |gpu - ref| <= 2e-2 + 1e-2 |ref| per element and a
// relative L2 error below 1e-2; the chunked result against the one-chunk result likewise.
//
//   build/cuda/tests/gpu_tests "[mla_prefill]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cpu/cpu_mla_attention.h"
#include "kernels/cuda/mla/mla_prefill.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

// DeepSeek-V2/V3 head dims: latent 512 + rope 64, k_nope 128, v 128.
constexpr int kC = 512, kR = 64, kL = kC + kR, kN = 128, kV = 128, kNV = kN + kV;

struct PrefillInputs {
  int heads = 0, block_size = 64;
  bool fp8 = false;
  float cache_scale = 1.0f, softmax_scale = 0.0721688f;  // 1 / sqrt(192)
  AttentionBatch batch;
  std::vector<uint8_t> cache;  // [num_blocks, block_size, kL]: bf16, or e4m3 bytes
  int q_stride = 0;            // elements between q rows (H * (kN + kR) plus padding)
  std::vector<uint16_t> q;     // [T, q_stride] bf16
  std::vector<uint16_t> w;     // [H * kNV, kC] bf16 kv_b_proj: per head W_UK then W_UV
};

// Cache row i of a sequence of length n is scaled by 1 + kv_ramp * i / n: with a large softmax
// scale the scores keep growing along the context and the running max moves chunk after chunk.
PrefillInputs MakeInputs(int heads, bool fp8, std::vector<std::pair<int, int>> seqs,
                         std::mt19937& rng, float kv_ramp = 0.f, int block_size = 64) {
  PrefillInputs in;
  in.heads = heads;
  in.fp8 = fp8;
  in.block_size = block_size;
  in.cache_scale = fp8 ? 4.0f * (1.f + kv_ramp) / kFp8E4M3Max : 1.0f;
  std::shuffle(seqs.begin(), seqs.end(), rng);
  int num_blocks = 0;
  in.batch = ShuffledPagedBatch(seqs, block_size, 3, rng, &num_blocks);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t esize = fp8 ? 1 : 2;
  // NaN bytes (0xff in bf16 pairs and e4m3) outside the sequences: a stray read shows.
  in.cache.assign(static_cast<size_t>(num_blocks) * block_size * kL * esize, 0xff);
  const AttentionBatch& b = in.batch;
  for (int s = 0; s < b.num_seqs; ++s) {
    for (int i = 0; i < b.kv_lens[s]; ++i) {
      const size_t row =
          static_cast<size_t>(b.page_indices[b.page_indptr[s] + i / block_size]) * block_size +
          i % block_size;
      const float ramp = 1.f + kv_ramp * static_cast<float>(i) / b.kv_lens[s];
      for (int d = 0; d < kL; ++d) {
        const float x = nd(rng) * ramp;
        if (fp8) {
          in.cache[row * kL + d] = QuantizeFp8(x, in.cache_scale);
        } else {
          const uint16_t v = F32ToBf16(x);
          std::memcpy(&in.cache[(row * kL + d) * 2], &v, 2);
        }
      }
    }
  }
  in.q_stride = heads * (kN + kR) + 64;
  in.q.resize(static_cast<size_t>(b.num_tokens) * in.q_stride);
  for (auto& x : in.q) x = F32ToBf16(nd(rng));
  in.w.resize(static_cast<size_t>(heads) * kNV * kC);
  for (auto& x : in.w) x = F32ToBf16(nd(rng) / std::sqrt(static_cast<float>(kC)));
  return in;
}

bool IsPrefill(const AttentionBatch& b, int s) {
  return b.q_indptr[s + 1] - b.q_indptr[s] > kMlaMaxDecodeQueryLen;
}

// a . b in double over n (a multiple of 8) elements, in 8 independent sums.
double Dot(const float* a, const float* b, int n) {
  double s[8] = {};
  for (int i = 0; i < n; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += static_cast<double>(a[i + k]) * b[i + k];
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// out [T, H, kV] as double, NaN where not computed (decode rows, heads not in `heads`).
std::vector<double> Reference(const PrefillInputs& in, const std::vector<int>& heads) {
  const AttentionBatch& b = in.batch;
  const int H = in.heads, bs = in.block_size;
  std::vector<double> out(static_cast<size_t>(b.num_tokens) * H * kV, NAN);
  for (int s = 0; s < b.num_seqs; ++s) {
    if (!IsPrefill(b, s)) continue;
    const int kv = b.kv_lens[s], q_begin = b.q_indptr[s], q_end = b.q_indptr[s + 1];
    std::vector<float> lat(static_cast<size_t>(kv) * kL);  // bf16 values, as the GPU gathers
    for (int j = 0; j < kv; ++j) {
      const size_t row =
          static_cast<size_t>(b.page_indices[b.page_indptr[s] + j / bs]) * bs + j % bs;
      for (int d = 0; d < kL; ++d) {
        float x;
        if (in.fp8) {
          x = Fp8E4M3ToFloat(in.cache[row * kL + d]) * in.cache_scale;
        } else {
          uint16_t v;
          std::memcpy(&v, &in.cache[(row * kL + d) * 2], 2);
          x = Bf16ToF32(v);
        }
        lat[static_cast<size_t>(j) * kL + d] = Bf16ToF32(F32ToBf16(x));
      }
    }
    std::vector<float> w_h(static_cast<size_t>(kNV) * kC), kvx(static_cast<size_t>(kv) * kNV);
    std::vector<double> p(kv);
    for (int h : heads) {
      for (size_t i = 0; i < w_h.size(); ++i) {
        w_h[i] = Bf16ToF32(in.w[static_cast<size_t>(h) * kNV * kC + i]);
      }
      for (int j = 0; j < kv; ++j) {  // [k_nope | v] of key j, rounded to bf16
        const float* c = &lat[static_cast<size_t>(j) * kL];
        for (int e = 0; e < kNV; ++e) {
          const double x = Dot(&w_h[static_cast<size_t>(e) * kC], c, kC);
          kvx[static_cast<size_t>(j) * kNV + e] = Bf16ToF32(F32ToBf16(static_cast<float>(x)));
        }
      }
      for (int t = q_begin; t < q_end; ++t) {
        const int pos = kv - (q_end - t);
        float qf[kN + kR];  // [q_nope | q_pe] of row t, head h
        for (int i = 0; i < kN + kR; ++i) {
          qf[i] = Bf16ToF32(in.q[static_cast<size_t>(t) * in.q_stride + h * (kN + kR) + i]);
        }
        double mx = -INFINITY;
        for (int j = 0; j <= pos; ++j) {
          const double dot = Dot(qf, &kvx[static_cast<size_t>(j) * kNV], kN) +
                             Dot(qf + kN, &lat[static_cast<size_t>(j) * kL + kC], kR);
          p[j] = dot * in.softmax_scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= pos; ++j) sum += (p[j] = std::exp(p[j] - mx));
        double* o = &out[(static_cast<size_t>(t) * H + h) * kV];
        std::fill(o, o + kV, 0.0);
        for (int j = 0; j <= pos; ++j) {
          const float* v = &kvx[static_cast<size_t>(j) * kNV + kN];
          for (int e = 0; e < kV; ++e) o[e] += p[j] * v[e];
        }
        for (int e = 0; e < kV; ++e) o[e] /= sum;
      }
    }
  }
  return out;
}

// Runs MlaPrefill over `in` with the tiling overrides `t` (zeros: the defaults); returns out
// [T, H, kV] bf16, poisoned (NaN) before the run. With `reserve`, Reserve runs first and the
// working memory must not grow in Run.
std::vector<uint16_t> RunGpu(const PrefillInputs& in, const MlaPrefillTiling& t,
                             bool reserve = false) {
  const AttentionBatch& b = in.batch;
  const size_t out_elems = static_cast<size_t>(b.num_tokens) * in.heads * kV;
  DeviceAllocs d;
  void* cache = d.Up(in.cache);
  void* q = d.Up(in.q);
  void* w = d.Up(in.w);
  void* out = d.Up(std::vector<uint16_t>(out_elems, 0xffff));
  MlaPrefillShape shape{in.heads, in.block_size, kL,        kR,
                        in.fp8,   t.kv_chunk,    t.q_block, t.score_rows};
  MlaPrefill prefill(shape);
  if (reserve) REQUIRE(prefill.Reserve(b.num_tokens, kN, kV).ok());
  REQUIRE(prefill.Plan(b, nullptr).ok());
  const size_t planned_bytes = prefill.device_bytes();
  MlaPrefillParams p;
  p.q = q;
  p.q_stride = in.q_stride;
  p.w_kv_b = w;
  p.nope_dim = kN;
  p.v_dim = kV;
  p.out = out;
  p.cache = cache;
  p.cache_scale = in.cache_scale;
  p.softmax_scale = in.softmax_scale;
  const Status st = prefill.Run(p, nullptr);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CUDA_REQUIRE(cudaGetLastError());
  if (reserve) CHECK(prefill.device_bytes() == planned_bytes);
  return Download(static_cast<const uint16_t*>(out), out_elems);
}

// Compares `gpu` with `ref` (double, NaN where not computed) on prefill rows, and checks that
// decode rows kept their poison.
void Compare(const PrefillInputs& in, const std::vector<uint16_t>& gpu,
             const std::vector<double>& ref, const char* against) {
  const AttentionBatch& b = in.batch;
  const size_t row = static_cast<size_t>(in.heads) * kV;
  // The elementwise bound scales with the largest output: a peaked softmax puts nearly all of a
  // row's weight on one value, whose bf16 probability (P is bf16 before P @ V, in the one-chunk
  // path as before) is off by up to 2^-8 of it.
  double ref_scale = 0;
  for (double r : ref) {
    if (!std::isnan(r)) ref_scale = std::max(ref_scale, std::fabs(r));
  }
  double err2 = 0, ref2 = 0, max_err = 0;
  size_t bad = 0, non_finite = 0, touched = 0, compared = 0;
  for (int s = 0; s < b.num_seqs; ++s) {
    for (int t = b.q_indptr[s]; t < b.q_indptr[s + 1]; ++t) {
      for (size_t i = t * row; i < (t + 1) * row; ++i) {
        if (!IsPrefill(b, s)) {
          touched += gpu[i] != 0xffff;
          continue;
        }
        const double g = Bf16ToF32(gpu[i]);
        if (!std::isfinite(g)) {
          ++non_finite;
          continue;
        }
        if (std::isnan(ref[i])) continue;
        ++compared;
        const double e = std::fabs(g - ref[i]);
        err2 += e * e;
        ref2 += ref[i] * ref[i];
        max_err = std::max(max_err, e);
        bad += e > 2e-2 * ref_scale + 1e-2 * std::fabs(ref[i]);
      }
    }
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  INFO("against " << against << ": relative L2 error " << rel << ", max abs error " << max_err
                  << " (largest |reference| " << ref_scale << ")"
                  << ", out of tolerance " << bad << " of " << compared << ", non-finite "
                  << non_finite << ", decode elements written " << touched);
  CHECK(compared > 0);
  CHECK(non_finite == 0);
  CHECK(touched == 0);
  CHECK(bad == 0);
  CHECK(rel < 1e-2);
}

std::string Describe(const PrefillInputs& in) {
  std::ostringstream s;
  s << (in.fp8 ? "fp8" : "bf16") << " heads=" << in.heads << " block_size=" << in.block_size
    << " softmax_scale=" << in.softmax_scale << " seqs(q,kv)=";
  for (int i = 0; i < in.batch.num_seqs; ++i) {
    s << "(" << in.batch.q_indptr[i + 1] - in.batch.q_indptr[i] << "," << in.batch.kv_lens[i]
      << ")";
  }
  return s.str();
}

// Heads the reference computes: all of 16, a spread of 128 (the first, the last, three inside).
std::vector<int> CheckedHeads(int heads, std::mt19937& rng) {
  if (heads <= 16) {
    std::vector<int> all(heads);
    for (int h = 0; h < heads; ++h) all[h] = h;
    return all;
  }
  std::uniform_int_distribution<int> pick(1, heads - 2);
  return {0, pick(rng), pick(rng), pick(rng), heads - 1};
}

// The longest prefill context of `in` must exceed kv_chunk, or the forced tiling tests nothing.
int LongestPrefillKv(const PrefillInputs& in) {
  int kv = 0;
  for (int s = 0; s < in.batch.num_seqs; ++s) {
    if (IsPrefill(in.batch, s)) kv = std::max(kv, in.batch.kv_lens[s]);
  }
  return kv;
}

// Runs the default tiling and each forced one against the reference, and the forced ones
// against the default's result.
void RunTilings(const PrefillInputs& in, const std::vector<MlaPrefillTiling>& tilings,
                std::mt19937& rng) {
  INFO(Describe(in));
  const std::vector<double> ref = Reference(in, CheckedHeads(in.heads, rng));
  const std::vector<uint16_t> one = RunGpu(in, MlaPrefillTiling{});
  Compare(in, one, ref, "the reference (default tiling)");
  std::vector<double> one_d(one.size());
  for (size_t i = 0; i < one.size(); ++i) one_d[i] = Bf16ToF32(one[i]);
  for (const MlaPrefillTiling& t : tilings) {
    INFO("forced kv_chunk " << t.kv_chunk << ", q_block " << t.q_block << ", score_rows "
                            << t.score_rows);
    REQUIRE(LongestPrefillKv(in) > t.kv_chunk);
    const std::vector<uint16_t> chunked = RunGpu(in, t);
    Compare(in, chunked, ref, "the reference");
    Compare(in, chunked, one_d, "the default tiling's result");
  }
}

// Prefill chunks mid-context and whole prompts, lengths no multiple of 64 or 100, the shortest
// prefill (5 rows) and two decode sequences; one random prefill chunk.
std::vector<std::pair<int, int>> MixedPrefillBatch(std::mt19937& rng) {
  std::uniform_int_distribution<int> q(5, 200);
  const int ql = q(rng);
  std::uniform_int_distribution<int> kv(ql, 900);
  return {{37, 37},   {5, 130}, {300, 1000}, {150, 613},
          {200, 200}, {1, 300}, {3, 65},     {ql, kv(rng)}};
}

TEST_CASE("MLA prefill in kv chunks matches the reference and the one-chunk result",
          "[gpu][mla][mla_prefill]") {
  GPU_TEST_RNG(rng);
  for (bool fp8 : {false, true}) {
    for (int heads : {16, 128}) {
      const PrefillInputs in = MakeInputs(heads, fp8, MixedPrefillBatch(rng), rng);
      RunTilings(in, {{64, 0, 0}, {128, 0, 16}, {100, 48, 7}}, rng);
    }
  }
}

TEST_CASE("MLA prefill chunks: peaked scores that keep growing along the context",
          "[gpu][mla][mla_prefill]") {
  // Scores of std ~10 that grow with the position: nearly every chunk raises a row's max, and
  // a row's last chunk often holds its largest score; block size 128 with chunks of 64.
  GPU_TEST_RNG(rng);
  for (bool fp8 : {false, true}) {
    PrefillInputs in = MakeInputs(16, fp8, {{100, 700}, {64, 64}, {9, 333}, {2, 90}}, rng,
                                  /*kv_ramp=*/3.f, /*block_size=*/128);
    in.softmax_scale = 0.5f;
    RunTilings(in, {{64, 0, 0}, {96, 40, 9}}, rng);
  }
}

TEST_CASE("MLA prefill: reserved working memory covers long contexts without growing",
          "[gpu][mla][mla_prefill]") {
  // Default tiling, contexts past its 2048-key chunk: the chunked path, in memory Reserve
  // allocated before (MlaPrefill::device_bytes unchanged by Run).
  GPU_TEST_RNG(rng);
  for (bool fp8 : {false, true}) {
    const PrefillInputs in = MakeInputs(128, fp8, {{24, 5000}, {7, 2049}, {40, 40}}, rng);
    INFO(Describe(in));
    const std::vector<double> ref = Reference(in, CheckedHeads(in.heads, rng));
    Compare(in, RunGpu(in, MlaPrefillTiling{}, /*reserve=*/true), ref, "the reference (reserved)");
  }
}

TEST_CASE("MLA prefill tiling is bounded by the byte budgets, not by the context",
          "[host][mla][mla_prefill]") {
  for (int heads : {16, 128}) {
    INFO("heads " << heads);
    const MlaPrefillShape shape{heads, 64, kL, kR, false};
    const MlaPrefillTiling t = TileMlaPrefill(shape, kN, kV);
    CHECK(t.kv_chunk >= 1);
    CHECK(t.kv_chunk <= MlaPrefill::kMaxKvChunk);
    CHECK(static_cast<size_t>(t.kv_chunk) * heads * kNV * 2 <= MlaPrefill::kExpandedBytes);
    CHECK(t.score_rows >= 1);
    CHECK(static_cast<size_t>(t.score_rows) * heads * t.kv_chunk * 6 <= MlaPrefill::kScoreBytes);
    CHECK(static_cast<size_t>(t.q_block) * heads * kV * 4 <= MlaPrefill::kAccumulatorBytes);
    // A step of 8192 prefill rows, whatever their contexts: the three budgets and the latents.
    const size_t bytes = MlaPrefillScratchBytes(shape, kN, kV, 8192);
    CHECK(bytes <= MlaPrefill::kExpandedBytes + MlaPrefill::kScoreBytes +
                       MlaPrefill::kAccumulatorBytes + (size_t{16} << 20));
    // Fewer rows need less; the forced tiling is taken as given.
    CHECK(MlaPrefillScratchBytes(shape, kN, kV, 16) < bytes);
    const MlaPrefillShape forced{heads, 64, kL, kR, false, 64, 48, 7};
    const MlaPrefillTiling f = TileMlaPrefill(forced, kN, kV);
    CHECK(f.kv_chunk == 64);
    CHECK(f.q_block == 48);
    CHECK(f.score_rows == 7);
  }
}

}  // namespace
}  // namespace llm::cuda
