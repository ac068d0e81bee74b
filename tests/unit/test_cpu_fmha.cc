// Tests for the CPU FMHA reference (kernels/cpu/cpu_fmha.h): against an independent dense
// implementation (full score matrix, explicit mask matrix, double precision) for every feature of
// kernels/fmha/fmha_params.h, plus metamorphic checks between KV layouts, query modes, sink
// formulations, key splits merged by LSE, window sizes and GQA ratios.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/cpu_fmha.h"
#include "tests/unit/fmha_mask.h"

namespace llm {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// One problem, independent of how K/V are laid out.
struct Case {
  FmhaDType dtype = FmhaDType::kBf16;
  int hq = 4, hkv = 2, d = 64;
  std::vector<int> sq, sk;  // per sequence: query rows and keys (batch mode: sq all equal)
  bool group = false;       // group (varlen) mode: seqstart_q
  FmhaMask mask;
  float scale = 0.2f;
  float softcap = 0.0f;
  bool alibi = false, sinks = false;
  uint32_t seed = 1;
};

std::string Describe(const Case& c) {
  static const char* kMasks[] = {"none", "causal_tl", "causal_br", "window"};
  std::ostringstream s;
  s << (c.dtype == FmhaDType::kBf16 ? "bf16" : "fp16") << " heads " << c.hq << "/" << c.hkv << " d "
    << c.d << (c.group ? " group" : " batch") << " mask " << kMasks[static_cast<int>(c.mask.type)]
    << "(" << c.mask.window_left << "," << c.mask.window_right << ",sink " << c.mask.sink_tokens
    << ") softcap " << c.softcap << (c.alibi ? " alibi" : "") << (c.sinks ? " sink_logits" : "")
    << " seqs";
  for (size_t b = 0; b < c.sq.size(); ++b) s << " " << c.sq[b] << "x" << c.sk[b];
  return s.str();
}

// Logical inputs as fp32 values that bf16 and fp16 both hold exactly (n / 64, |n| <= 64), so the
// dense reference needs no conversion and a kernel that misreads the format cannot pass.
struct Data {
  std::vector<float> q;                  // [total_q, hq, d]
  std::vector<std::vector<float>> k, v;  // per sequence [sk, hkv, d]
  std::vector<float> alibi, sinks;       // [hq]
};

Data MakeData(const Case& c) {
  std::mt19937 rng(c.seed);
  std::uniform_int_distribution<int> val(-64, 64);
  auto fill = [&](std::vector<float>& x) {
    for (float& e : x) e = static_cast<float>(val(rng)) / 64.0f;
  };
  Data data;
  const int total_q = std::accumulate(c.sq.begin(), c.sq.end(), 0);
  data.q.resize(static_cast<size_t>(total_q) * c.hq * c.d);
  fill(data.q);
  for (int sk : c.sk) {
    data.k.emplace_back(static_cast<size_t>(sk) * c.hkv * c.d);
    data.v.emplace_back(static_cast<size_t>(sk) * c.hkv * c.d);
    fill(data.k.back());
    fill(data.v.back());
  }
  std::uniform_real_distribution<float> slope(0.01f, 0.3f), sink(-2.0f, 3.0f);
  for (int h = 0; h < c.hq; ++h) {
    data.alibi.push_back(slope(rng));
    data.sinks.push_back(sink(rng));
  }
  return data;
}

uint16_t ToBits(FmhaDType t, float x) {
  return t == FmhaDType::kBf16 ? F32ToBf16(x) : F32ToF16(x);
}

// How K/V are stored: paged with a shuffled block table, or contiguous cache rows.
struct Layout {
  int block_size = 0;           // > 0: paged
  bool cache_batch_idx = true;  // contiguous: sequences sit in permuted rows (else row b)
  uint32_t seed = 7;
  // Paged: table entries of blocks no query row can see name a block far outside the cache, so
  // any read of them faults (the engine may free such blocks).
  bool wild_hidden_blocks = false;
  // Contiguous only: keys packed as [total_k, hkv, d] at seqstart_k offsets, with NaN rows between
  // sequences (so a read past seqlen_k shows).
  bool packed = false;
};

std::vector<std::vector<bool>> DenseMask(const FmhaMask& m, int sq, int sk);

// Device-style buffers for one (case, layout); everything not owned by a key is NaN.
struct Built {
  std::vector<uint16_t> q, k, v;
  std::vector<int32_t> seqstart, seqlen_k, table, wild_table, rows, seqstart_k;
  FmhaParams p;
};

void Build(const Case& c, const Data& data, const Layout& lay, Built* out) {
  const int batch = static_cast<int>(c.sq.size());
  const int d = c.d, hkv = c.hkv;
  const uint16_t nan_bits = ToBits(c.dtype, kNan);
  std::mt19937 rng(lay.seed);
  Built& o = *out;
  o.q.resize(data.q.size());
  for (size_t i = 0; i < data.q.size(); ++i) o.q[i] = ToBits(c.dtype, data.q[i]);
  o.seqlen_k.assign(c.sk.begin(), c.sk.end());
  o.seqstart = {0};
  for (int s : c.sq) o.seqstart.push_back(o.seqstart.back() + s);

  FmhaParams& p = o.p;
  p = FmhaParams{};
  // Where key j of sequence b, KV head h starts, once the layout below is fixed.
  std::function<size_t(int, int, int)> at;
  if (lay.block_size > 0) {
    const int bs = lay.block_size;
    int max_blocks = 0, total = 0;
    for (int sk : c.sk) {
      max_blocks = std::max(max_blocks, (sk + bs - 1) / bs);
      total += (sk + bs - 1) / bs;
    }
    const int num_blocks = total + 3;  // spare blocks nobody owns
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    p.max_blocks_per_seq = max_blocks + 1;  // one unused column per sequence
    // Unused entries name a spare (all-NaN) block: reading them would poison the output.
    o.table.assign(static_cast<size_t>(batch) * p.max_blocks_per_seq, perm.back());
    int next = 0;
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < (c.sk[b] + bs - 1) / bs; ++i) {
        o.table[static_cast<size_t>(b) * p.max_blocks_per_seq + i] = perm[next++];
      }
    }
    std::vector<int32_t> wild = o.table;  // installed after the data is written
    if (lay.wild_hidden_blocks) {
      for (int b = 0; b < batch; ++b) {
        const auto allow = DenseMask(c.mask, c.sq[b], c.sk[b]);
        for (int i = 0; i < (c.sk[b] + bs - 1) / bs; ++i) {
          bool seen = false;
          for (int j = i * bs; j < std::min(c.sk[b], (i + 1) * bs); ++j) {
            for (int r = 0; r < c.sq[b]; ++r) seen = seen || allow[r][j];
          }
          if (!seen) wild[static_cast<size_t>(b) * p.max_blocks_per_seq + i] = 1 << 24;
        }
      }
    }
    o.wild_table = std::move(wild);
    o.k.assign(static_cast<size_t>(num_blocks) * hkv * bs * d, nan_bits);
    p.block_size = bs;
    at = [&o, &p, hkv, d, bs](int b, int j, int h) {
      const int blk = o.table[static_cast<size_t>(b) * p.max_blocks_per_seq + j / bs];
      return ((static_cast<size_t>(blk) * hkv + h) * bs + j % bs) * d;
    };
  } else if (lay.packed) {
    std::uniform_int_distribution<int> gap(0, 3);
    o.seqstart_k = {gap(rng)};
    for (int b = 0; b < batch; ++b)
      o.seqstart_k.push_back(o.seqstart_k.back() + c.sk[b] + gap(rng));
    o.k.assign((static_cast<size_t>(o.seqstart_k.back()) + 2) * hkv * d, nan_bits);
    at = [&o, hkv, d](int b, int j, int h) {
      return ((static_cast<size_t>(o.seqstart_k[b]) + j) * hkv + h) * d;
    };
  } else {
    const int num_rows = lay.cache_batch_idx ? batch + 2 : batch;
    p.cache_seqlen = *std::max_element(c.sk.begin(), c.sk.end()) + 3;  // padded rows
    o.rows.resize(num_rows);
    std::iota(o.rows.begin(), o.rows.end(), 0);
    if (lay.cache_batch_idx) std::shuffle(o.rows.begin(), o.rows.end(), rng);
    o.k.assign(static_cast<size_t>(num_rows) * p.cache_seqlen * hkv * d, nan_bits);
    at = [&o, &p, hkv, d](int b, int j, int h) {
      return ((static_cast<size_t>(o.rows[b]) * p.cache_seqlen + j) * hkv + h) * d;
    };
  }
  o.v = o.k;
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < c.sk[b]; ++j) {
      for (int h = 0; h < hkv; ++h) {
        const size_t dst = at(b, j, h), src = (static_cast<size_t>(j) * hkv + h) * d;
        for (int x = 0; x < d; ++x) {
          o.k[dst + x] = ToBits(c.dtype, data.k[b][src + x]);
          o.v[dst + x] = ToBits(c.dtype, data.v[b][src + x]);
        }
      }
    }
  }
  p.dtype = c.dtype;
  p.batch = batch;
  p.num_q_heads = c.hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  if (c.group) {
    p.seqstart_q = o.seqstart.data();
    p.max_seqlen_q = *std::max_element(c.sq.begin(), c.sq.end());
  } else {
    p.seqlen_q = c.sq[0];
  }
  p.seqlen_k = o.seqlen_k.data();
  p.q = o.q.data();
  p.k = o.k.data();
  p.v = o.v.data();
  if (lay.block_size > 0) p.block_table = o.wild_table.data();
  if (lay.block_size == 0 && lay.packed) {
    p.seqstart_k = o.seqstart_k.data();
    p.max_seqlen_k = *std::max_element(c.sk.begin(), c.sk.end());
  } else if (lay.block_size == 0 && lay.cache_batch_idx) {
    p.cache_batch_idx = o.rows.data();
  }
  p.softmax_scale = c.scale;
  p.mask = c.mask;
  p.softcap = c.softcap;
  if (c.alibi) p.alibi_slopes = data.alibi.data();
  if (c.sinks) p.sink_logits = data.sinks.data();
}

struct Result {
  std::vector<float> out, lse;
};

Result Run(const Case& c, const Data& data, const Layout& lay = {}) {
  Built built;
  Build(c, data, lay, &built);
  const int total_q = FmhaTotalQ(built.p);
  Result r;
  r.out.assign(static_cast<size_t>(total_q) * c.hq * c.d, kNan);  // unwritten stays NaN
  r.lse.assign(static_cast<size_t>(total_q) * c.hq, kNan);
  built.p.lse = r.lse.data();
  built.p.out = nullptr;  // ignored by the reference
  CpuFmhaForward(built.p, r.out.data());
  return r;
}

// Mask matrix [sq][sk] of one sequence, built row by row from index ranges (a second reading of
// fmha_params.h, separate from FmhaKeyVisible's predicate).
std::vector<std::vector<bool>> DenseMask(const FmhaMask& m, int sq, int sk) {
  std::vector<std::vector<bool>> allow(sq, std::vector<bool>(sk, false));
  for (int i = 0; i < sq; ++i) {
    const int center = i + sk - sq;  // bottom-right diagonal
    int lo = 0, hi = sk - 1;
    switch (m.type) {
      case FmhaMaskType::kNone:
        break;
      case FmhaMaskType::kCausalTopLeft:
        hi = std::min(hi, i);
        break;
      case FmhaMaskType::kCausalBottomRight:
        hi = std::min(hi, center);
        break;
      case FmhaMaskType::kWindow:
        if (m.window_left >= 0) lo = std::max(lo, center - m.window_left);
        if (m.window_right >= 0) hi = std::min(hi, center + m.window_right);
        break;
    }
    for (int j = lo; j <= hi; ++j) allow[i][j] = true;
    if (m.type == FmhaMaskType::kWindow) {
      for (int j = 0; j < std::min(m.sink_tokens, hi + 1); ++j) allow[i][j] = true;
    }
  }
  return allow;
}

// Dense attention in double: the full score matrix, the mask matrix, then a row softmax with the
// sink logit as one more column.
struct DenseResult {
  std::vector<double> out, lse;
};

DenseResult Dense(const Case& c, const Data& data) {
  const int d = c.d, group = c.hq / c.hkv;
  DenseResult r;
  const int total_q = std::accumulate(c.sq.begin(), c.sq.end(), 0);
  r.out.assign(static_cast<size_t>(total_q) * c.hq * d, 0.0);
  r.lse.assign(static_cast<size_t>(total_q) * c.hq, 0.0);
  int q0 = 0;
  for (size_t b = 0; b < c.sq.size(); ++b) {
    const int sq = c.sq[b], sk = c.sk[b];
    const auto allow = DenseMask(c.mask, sq, sk);
    for (int h = 0; h < c.hq; ++h) {
      const int kvh = h / group;
      std::vector<std::vector<double>> s(sq, std::vector<double>(sk));
      for (int i = 0; i < sq; ++i) {
        const float* qv = data.q.data() + (static_cast<size_t>(q0 + i) * c.hq + h) * d;
        const int diag = c.mask.type == FmhaMaskType::kCausalTopLeft ? i : i + sk - sq;
        for (int j = 0; j < sk; ++j) {
          const float* kv = data.k[b].data() + (static_cast<size_t>(j) * c.hkv + kvh) * d;
          double dot = 0.0;
          for (int x = 0; x < d; ++x) dot += static_cast<double>(qv[x]) * kv[x];
          double v = dot * c.scale;
          if (c.softcap > 0) v = c.softcap * std::tanh(v / c.softcap);
          if (c.alibi) v += static_cast<double>(data.alibi[h]) * (j - diag);
          s[i][j] = allow[i][j] ? v : -std::numeric_limits<double>::infinity();
        }
      }
      for (int i = 0; i < sq; ++i) {
        const size_t row = static_cast<size_t>(q0 + i) * c.hq + h;
        double mx = -std::numeric_limits<double>::infinity();
        for (double v : s[i]) mx = std::max(mx, v);
        if (c.sinks) mx = std::max(mx, static_cast<double>(data.sinks[h]));
        if (std::isinf(mx)) {  // nothing visible, no sink
          r.lse[row] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double denom = c.sinks ? std::exp(data.sinks[h] - mx) : 0.0;
        for (int j = 0; j < sk; ++j) denom += std::exp(s[i][j] - mx);
        for (int j = 0; j < sk; ++j) {
          const double w = std::exp(s[i][j] - mx) / denom;
          if (w == 0.0) continue;
          const float* vv = data.v[b].data() + (static_cast<size_t>(j) * c.hkv + kvh) * d;
          for (int x = 0; x < d; ++x) r.out[row * d + x] += w * vv[x];
        }
        r.lse[row] = mx + std::log(denom);
      }
    }
    q0 += sq;
  }
  return r;
}

// Elements differing by more than tol (infinities must match exactly; NaN never matches).
template <typename A, typename B>
size_t Mismatches(const std::vector<A>& a, const std::vector<B>& b, double tol,
                  double* worst = nullptr) {
  REQUIRE(a.size() == b.size());
  size_t bad = 0;
  double w = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (std::isinf(x) || std::isinf(y)) {
      bad += x != y;
      continue;
    }
    const double err = std::abs(x - y);
    if (!(err <= tol * std::max(1.0, std::abs(y)))) ++bad;
    w = std::isnan(err) ? kInf : std::max(w, err);
  }
  if (worst) *worst = w;
  return bad;
}

void CheckAgainstDense(const Case& c, const Layout& lay) {
  const Data data = MakeData(c);
  const Result got = Run(c, data, lay);
  const DenseResult want = Dense(c, data);
  double worst_out = 0, worst_lse = 0;
  const size_t bad_out = Mismatches(got.out, want.out, 3e-5, &worst_out);
  const size_t bad_lse = Mismatches(got.lse, want.lse, 3e-5, &worst_lse);
  INFO(Describe(c) << " block_size " << lay.block_size << " worst out err " << worst_out
                   << " worst lse err " << worst_lse);
  CHECK(bad_out == 0);
  CHECK(bad_lse == 0);
}

using test::Mask;

// ---------------------------------------------------------------------------------------------

TEST_CASE("FmhaKeyVisible follows the documented mask table", "[fmha]") {
  // Rows are query rows i, characters keys j ('1' visible).
  auto table = [](const FmhaMask& m, int sq, int sk) {
    std::vector<std::string> rows;
    for (int i = 0; i < sq; ++i) {
      std::string r;
      for (int j = 0; j < sk; ++j) r += FmhaKeyVisible(m, i, j, sq, sk) ? '1' : '0';
      rows.push_back(r);
    }
    return rows;
  };
  using V = std::vector<std::string>;
  CHECK(table(Mask(FmhaMaskType::kNone), 3, 5) == V{"11111", "11111", "11111"});
  CHECK(table(Mask(FmhaMaskType::kCausalTopLeft), 3, 5) == V{"10000", "11000", "11100"});
  CHECK(table(Mask(FmhaMaskType::kCausalBottomRight), 3, 5) == V{"11100", "11110", "11111"});
  CHECK(table(Mask(FmhaMaskType::kCausalBottomRight), 4, 2) == V{"00", "00", "10", "11"});
  CHECK(table(Mask(FmhaMaskType::kCausalTopLeft), 4, 2) == V{"10", "11", "11", "11"});
  // Causal sliding window of W = 2 (window_left 1).
  CHECK(table(Mask(FmhaMaskType::kWindow, 1, 0), 3, 5) == V{"01100", "00110", "00011"});
  CHECK(table(Mask(FmhaMaskType::kWindow, 1, 0, 1), 3, 5) == V{"11100", "10110", "10011"});
  CHECK(table(Mask(FmhaMaskType::kWindow, 0, 1), 3, 5) == V{"00110", "00011", "00001"});
  CHECK(table(Mask(FmhaMaskType::kWindow, -1, 1), 3, 5) == V{"11110", "11111", "11111"});
  CHECK(table(Mask(FmhaMaskType::kWindow, 2, -1), 3, 5) == V{"11111", "01111", "00111"});
  CHECK(table(Mask(FmhaMaskType::kWindow, 0, 0, 2), 3, 5) == V{"11100", "11010", "11001"});
  // Sinks stay behind the right bound: rows left of every key see nothing.
  CHECK(table(Mask(FmhaMaskType::kWindow, 0, 0, 3), 5, 3) == V{"000", "000", "100", "110", "111"});
  // Sink tokens change nothing under the causal masks (already visible there).
  CHECK(table(Mask(FmhaMaskType::kCausalBottomRight, -1, 0, 2), 3, 5) ==
        V{"11100", "11110", "11111"});
  CHECK(table(Mask(FmhaMaskType::kCausalBottomRight, -1, 0, 2), 4, 2) == V{"00", "00", "10", "11"});
  CHECK(table(Mask(FmhaMaskType::kCausalTopLeft, -1, 0, 3), 3, 5) == V{"10000", "11000", "11100"});
  for (const FmhaMask& m : {Mask(FmhaMaskType::kNone), Mask(FmhaMaskType::kWindow, -1, -1)}) {
    CHECK_FALSE(FmhaKeyVisible(m, 0, -1, 3, 5));
    CHECK_FALSE(FmhaKeyVisible(m, 0, 5, 3, 5));
    CHECK_FALSE(FmhaKeyVisible(m, 0, 0, 3, 0));
  }
}

TEST_CASE("CpuFmhaForward matches dense attention for every mask and feature", "[fmha]") {
  const FmhaMask masks[] = {
      Mask(FmhaMaskType::kNone),
      Mask(FmhaMaskType::kCausalTopLeft),
      Mask(FmhaMaskType::kCausalBottomRight),
      Mask(FmhaMaskType::kWindow, 4, 0),     // Mistral-style causal window W = 5
      Mask(FmhaMaskType::kWindow, 6, 3),     // two-sided
      Mask(FmhaMaskType::kWindow, -1, 2),    // unbounded left
      Mask(FmhaMaskType::kWindow, 5, -1),    // unbounded right
      Mask(FmhaMaskType::kWindow, 0, 0),     // the diagonal only
      Mask(FmhaMaskType::kWindow, 3, 0, 4),  // StreamingLLM: window + sink tokens
      Mask(FmhaMaskType::kWindow, 2, 1, 1),  // two-sided + a sink token
  };
  // {softcap, alibi, sink logits}: each alone, none, and all together.
  const bool features[][3] = {
      {false, false, false}, {true, false, false}, {false, true, false},
      {false, false, true},  {true, true, true},
  };
  const std::pair<int, int> heads[] = {{4, 4}, {8, 2}, {8, 1}, {3, 1}, {6, 3}};
  std::mt19937 rng(2024);
  int cases = 0;
  for (const FmhaMask& mask : masks) {
    for (const auto& f : features) {
      Case c;
      c.seed = 100 + cases;
      c.dtype = cases % 2 ? FmhaDType::kFp16 : FmhaDType::kBf16;
      std::tie(c.hq, c.hkv) = heads[cases % 5];
      c.d = (cases / 2) % 2 ? 128 : 64;
      c.group = (cases / 3) % 2 == 1;
      c.mask = mask;
      c.scale = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
      if (f[0]) c.softcap = 1.5f;
      c.alibi = f[1];
      c.sinks = f[2];
      const int batch = 1 + cases % 3;
      std::uniform_int_distribution<int> qlen(1, 17), klen(0, 75);
      const int uniform_q = qlen(rng);
      for (int b = 0; b < batch; ++b) {
        // Group mode: ragged rows, sometimes none; keys sometimes fewer than rows.
        c.sq.push_back(c.group ? std::uniform_int_distribution<int>(0, 17)(rng) : uniform_q);
        c.sk.push_back(klen(rng));
      }
      if (c.group && c.sq[0] == 0) c.sq[0] = 5;  // at least one row somewhere
      Layout lay;
      lay.block_size = (cases % 4 == 3) ? 0 : 16 << (cases % 3);  // 16, 32, 64 or contiguous
      lay.cache_batch_idx = cases % 8 != 3;
      lay.seed = 900 + cases;
      CheckAgainstDense(c, lay);
      ++cases;
    }
  }
  CHECK(cases == 50);
}

TEST_CASE("CpuFmhaForward decode and prefill shapes match dense attention", "[fmha]") {
  // Odd sizes around block boundaries, the engine's causal bottom-right mask, GQA 1/4/8.
  int n = 0;
  for (int ratio : {1, 4, 8}) {
    for (int d : {64, 128}) {
      Case c;
      c.seed = 300 + n;
      c.hq = 8;
      c.hkv = 8 / ratio;
      c.d = d;
      c.dtype = n % 2 ? FmhaDType::kBf16 : FmhaDType::kFp16;
      c.group = true;
      c.mask = Mask(FmhaMaskType::kCausalBottomRight);
      c.scale = 1.0f / std::sqrt(static_cast<float>(d));
      c.sq = {1, 1, 31, 3};     // two decodes, a prefill chunk, a speculative step
      c.sk = {1, 65, 97, 129};  // first token, just past one block, ...
      CheckAgainstDense(c, Layout{16 << (n % 3), true, 40u + n});
      ++n;
    }
  }
}

TEST_CASE("CpuFmhaForward paged KV equals contiguous and packed KV", "[fmha]") {
  for (int block_size : {16, 32, 64}) {
    Case c;
    c.seed = 11 + block_size;
    c.hq = 8;
    c.hkv = 2;
    c.d = 64;
    c.group = true;
    c.sq = {7, 1, 19};
    c.sk = {150, 33, 19};
    c.mask = Mask(FmhaMaskType::kWindow, 20, 0, 2);
    c.softcap = 2.0f;
    c.alibi = true;
    c.sinks = true;
    c.scale = 0.3f;
    const Data data = MakeData(c);
    const Result paged = Run(c, data, Layout{block_size, false, 5});
    const Result paged2 = Run(c, data, Layout{block_size, false, 6});  // another shuffle
    const Result rows = Run(c, data, Layout{0, true, 7});
    const Result plain = Run(c, data, Layout{0, false, 8});
    Layout packed_layout{0, false, 9};
    packed_layout.packed = true;
    const Result packed = Run(c, data, packed_layout);
    INFO("block_size " << block_size);
    CHECK(Mismatches(paged.out, rows.out, 1e-6) == 0);
    CHECK(Mismatches(paged.lse, rows.lse, 1e-6) == 0);
    CHECK(Mismatches(paged2.out, paged.out, 1e-6) == 0);
    CHECK(Mismatches(plain.out, rows.out, 1e-6) == 0);
    CHECK(Mismatches(plain.lse, rows.lse, 1e-6) == 0);
    CHECK(Mismatches(packed.out, rows.out, 1e-6) == 0);
    CHECK(Mismatches(packed.lse, rows.lse, 1e-6) == 0);
  }
}

TEST_CASE("CpuFmhaForward group mode equals batch mode for uniform lengths", "[fmha]") {
  for (FmhaMaskType t :
       {FmhaMaskType::kCausalTopLeft, FmhaMaskType::kCausalBottomRight, FmhaMaskType::kWindow}) {
    Case c;
    c.seed = 21 + static_cast<uint32_t>(t);
    c.hq = 4;
    c.hkv = 1;
    c.d = 128;
    c.sq = {9, 9, 9};
    c.sk = {30, 9, 51};
    c.mask = Mask(t, 6, 1, 1);
    c.alibi = true;
    const Data data = MakeData(c);
    const Result batch = Run(c, data, Layout{32, true, 3});
    c.group = true;
    const Result group = Run(c, data, Layout{32, true, 3});
    CHECK(Mismatches(group.out, batch.out, 0.0) == 0);
    CHECK(Mismatches(group.lse, batch.lse, 0.0) == 0);
  }
}

TEST_CASE("CpuFmhaForward sink logits are one more key column with a zero value", "[fmha]") {
  Case c;
  c.seed = 31;
  c.hq = 4;
  c.hkv = 2;
  c.d = 64;
  c.group = true;
  c.sq = {5, 1, 12};
  c.sk = {40, 17, 8};
  c.softcap = 3.0f;
  c.scale = 0.25f;

  SECTION("logit 0 == a prepended key whose K and V are zero") {
    c.sk = {40, 17, 30};  // every row sees a key, so the extra one is visible wherever the sink is
    // q . 0 = 0 = the sink logit (and tanh(0) = 0). Under a window the extra key at position 0
    // stays visible as a sink token; bottom-right alignment shifts with the extra key.
    for (const FmhaMask& m :
         {Mask(FmhaMaskType::kCausalBottomRight), Mask(FmhaMaskType::kWindow, 6, 0)}) {
      Case with_sink = c;
      with_sink.mask = m;
      with_sink.sinks = true;
      Data data = MakeData(with_sink);
      std::fill(data.sinks.begin(), data.sinks.end(), 0.0f);
      const Result sink = Run(with_sink, data);

      Case extra = c;
      extra.mask = m;
      if (m.type == FmhaMaskType::kWindow) extra.mask.sink_tokens = 1;
      Data data2 = data;
      const size_t row = static_cast<size_t>(c.hkv) * c.d;
      for (size_t b = 0; b < c.sk.size(); ++b) {
        extra.sk[b] += 1;
        data2.k[b].insert(data2.k[b].begin(), row, 0.0f);
        data2.v[b].insert(data2.v[b].begin(), row, 0.0f);
      }
      const Result column = Run(extra, data2);
      CHECK(Mismatches(sink.out, column.out, 2e-6) == 0);
      CHECK(Mismatches(sink.lse, column.lse, 2e-6) == 0);
    }
  }
  SECTION("any logit rescales the no-sink result by its LSE") {
    // out_s = out * e^(lse - lse_s), lse_s = ln(e^lse + e^sink); a masked row has out 0 and
    // lse_s = sink.
    c.mask = Mask(FmhaMaskType::kCausalBottomRight);  // the last sequence: 4 rows see no key
    const Data data = MakeData(c);
    const Result plain = Run(c, data);
    Case s = c;
    s.sinks = true;
    const Result sink = Run(s, data);
    std::vector<double> want_out(plain.out.size()), want_lse(plain.lse.size());
    int masked_rows = 0;
    for (size_t r = 0; r < plain.lse.size(); ++r) {
      const double sl = data.sinks[r % c.hq], l = plain.lse[r];
      const double ls =
          std::isinf(l) ? sl : std::max(l, sl) + std::log1p(std::exp(-std::abs(l - sl)));
      masked_rows += std::isinf(l);
      want_lse[r] = ls;
      for (int x = 0; x < c.d; ++x) {
        want_out[r * c.d + x] = std::isinf(l) ? 0.0 : plain.out[r * c.d + x] * std::exp(l - ls);
      }
    }
    CHECK(masked_rows == 4 * c.hq);
    CHECK(Mismatches(sink.out, want_out, 2e-6) == 0);
    CHECK(Mismatches(sink.lse, want_lse, 2e-6) == 0);
  }
}

TEST_CASE("CpuFmhaForward LSE merges two key halves into the full result", "[fmha]") {
  for (int split : {1, 20, 44}) {
    Case c;
    c.seed = 41 + split;
    c.hq = 8;
    c.hkv = 2;
    c.d = 128;
    c.group = true;
    c.sq = {3, 1};
    c.sk = {45, 45};
    c.mask = Mask(FmhaMaskType::kNone);
    c.softcap = 2.5f;
    c.scale = 0.2f;
    const Data data = MakeData(c);
    const Result full = Run(c, data, Layout{16, true, 1});

    auto half = [&](int begin, int end) {
      Case h = c;
      Data hd = data;
      const size_t row = static_cast<size_t>(c.hkv) * c.d;
      for (size_t b = 0; b < c.sk.size(); ++b) {
        h.sk[b] = end - begin;
        hd.k[b].assign(data.k[b].begin() + begin * row, data.k[b].begin() + end * row);
        hd.v[b].assign(data.v[b].begin() + begin * row, data.v[b].begin() + end * row);
      }
      return Run(h, hd, Layout{0, true, 2});
    };
    const Result a = half(0, split), b = half(split, 45);
    std::vector<double> merged(full.out.size()), lse(full.lse.size());
    for (size_t r = 0; r < lse.size(); ++r) {
      const double la = a.lse[r], lb = b.lse[r];
      const double m = std::max(la, lb);
      lse[r] = m + std::log(std::exp(la - m) + std::exp(lb - m));
      for (int x = 0; x < c.d; ++x) {
        merged[r * c.d + x] =
            std::exp(la - lse[r]) * a.out[r * c.d + x] + std::exp(lb - lse[r]) * b.out[r * c.d + x];
      }
    }
    INFO("split " << split);
    CHECK(Mismatches(full.out, merged, 2e-6) == 0);
    CHECK(Mismatches(full.lse, lse, 2e-6) == 0);
  }
}

TEST_CASE("CpuFmhaForward windows of unbounded or huge size equal the plain masks", "[fmha]") {
  Case c;
  c.seed = 51;
  c.hq = 4;
  c.hkv = 4;
  c.d = 64;
  c.group = true;
  c.sq = {6, 13, 1};
  c.sk = {6, 40, 70};
  c.alibi = true;
  c.sinks = true;
  const Data data = MakeData(c);
  auto run = [&](const FmhaMask& m) {
    Case x = c;
    x.mask = m;
    return Run(x, data, Layout{32, true, 4});
  };
  const Result none = run(Mask(FmhaMaskType::kNone));
  const Result causal = run(Mask(FmhaMaskType::kCausalBottomRight));
  for (const FmhaMask& m :
       {Mask(FmhaMaskType::kWindow, 1 << 20, 1 << 20), Mask(FmhaMaskType::kWindow, -1, -1),
        Mask(FmhaMaskType::kWindow, -1, 1 << 20, 3)}) {
    const Result w = run(m);
    CHECK(w.out == none.out);
    CHECK(w.lse == none.lse);
  }
  for (const FmhaMask& m :
       {Mask(FmhaMaskType::kWindow, 1 << 20, 0), Mask(FmhaMaskType::kWindow, -1, 0, 5)}) {
    const Result w = run(m);
    CHECK(w.out == causal.out);
    CHECK(w.lse == causal.lse);
  }
  // A finite window does differ (the test above can fail).
  const Result small = run(Mask(FmhaMaskType::kWindow, 3, 0));
  CHECK(small.out != causal.out);
}

TEST_CASE("CpuFmhaForward GQA equals MHA with each KV head repeated", "[fmha]") {
  for (int ratio : {1, 4, 8}) {
    for (int d : {64, 128}) {
      Case c;
      c.seed = 61 + ratio + d;
      c.hq = 8;
      c.hkv = 8 / ratio;
      c.d = d;
      c.group = true;
      c.sq = {4, 1};
      c.sk = {37, 70};
      c.mask = Mask(FmhaMaskType::kWindow, 9, 0, 1);
      c.alibi = true;
      c.sinks = true;
      const Data data = MakeData(c);
      const Result gqa = Run(c, data, Layout{16, true, 9});
      Case mha = c;
      mha.hkv = 8;
      Data md = data;
      for (size_t b = 0; b < c.sk.size(); ++b) {
        for (auto* kv : {&md.k[b], &md.v[b]}) {
          const std::vector<float>& src = kv == &md.k[b] ? data.k[b] : data.v[b];
          kv->assign(static_cast<size_t>(c.sk[b]) * 8 * d, 0.0f);
          for (int j = 0; j < c.sk[b]; ++j) {
            for (int h = 0; h < 8; ++h) {
              std::copy_n(src.begin() + (static_cast<size_t>(j) * c.hkv + h / ratio) * d, d,
                          kv->begin() + (static_cast<size_t>(j) * 8 + h) * d);
            }
          }
        }
      }
      const Result ref = Run(mha, md, Layout{16, true, 9});
      INFO("ratio " << ratio << " d " << d);
      CHECK(gqa.out == ref.out);
      CHECK(gqa.lse == ref.lse);
    }
  }
}

TEST_CASE("CpuFmhaForward fully masked rows give 0 and -inf", "[fmha]") {
  Case c;
  c.seed = 71;
  c.hq = 2;
  c.hkv = 1;
  c.d = 64;
  c.group = true;
  c.sq = {6, 3, 4};
  c.sk = {2, 0, 9};
  // Bottom-right: rows 0..3 of the first sequence sit left of every key; the second has no keys.
  c.mask = Mask(FmhaMaskType::kCausalBottomRight);
  const Data data = MakeData(c);
  const Result r = Run(c, data);
  auto row_masked = [&](const Result& res, int row, float lse) {
    bool zero = true;
    for (int h = 0; h < c.hq; ++h) {
      for (int x = 0; x < c.d; ++x)
        zero &= res.out[(static_cast<size_t>(row) * c.hq + h) * c.d + x] == 0.0f;
      zero &= res.lse[static_cast<size_t>(row) * c.hq + h] == lse;
    }
    return zero;
  };
  for (int row : {0, 1, 2, 3, 6, 7, 8}) CHECK(row_masked(r, row, -kInf));
  for (int row : {4, 5, 9, 12}) CHECK_FALSE(row_masked(r, row, -kInf));
  // With sink logits a masked row still has out 0, and lse is the sink logit.
  c.sinks = true;
  const Result s = Run(c, data);
  for (int row : {0, 3, 7}) {
    for (int h = 0; h < c.hq; ++h) {
      CHECK(s.lse[static_cast<size_t>(row) * c.hq + h] == data.sinks[h]);
      for (int x = 0; x < c.d; ++x) {
        CHECK(s.out[(static_cast<size_t>(row) * c.hq + h) * c.d + x] == 0.0f);
      }
    }
  }
  // The diagonal-only window masks the same rows of the first two sequences; the dense reference
  // agrees on every row.
  c.sinks = false;
  c.mask = Mask(FmhaMaskType::kWindow, 0, 0);
  CheckAgainstDense(c, Layout{16, true, 3});
}

TEST_CASE("CpuFmhaForward never reads keys outside every window", "[fmha]") {
  // Keys no row can see are NaN and blocks holding only such keys are not even in the cache (their
  // table entries point far outside it): the output must still equal the clean run exactly. This
  // is what lets the engine drop blocks that slid out of the window.
  Case c;
  c.seed = 81;
  c.hq = 4;
  c.hkv = 2;
  c.d = 64;
  c.group = true;
  c.sq = {1, 4, 2};
  c.sk = {90, 64, 33};
  c.mask = Mask(FmhaMaskType::kWindow, 6, 0, 2);
  c.sinks = true;
  const Data clean = MakeData(c);
  Data poisoned = clean;
  int hidden = 0;
  for (size_t b = 0; b < c.sk.size(); ++b) {
    const auto allow = DenseMask(c.mask, c.sq[b], c.sk[b]);
    for (int j = 0; j < c.sk[b]; ++j) {
      bool seen = false;
      for (int i = 0; i < c.sq[b]; ++i) seen |= allow[i][j];
      if (seen) continue;
      ++hidden;
      const size_t row = static_cast<size_t>(c.hkv) * c.d;
      std::fill_n(poisoned.k[b].begin() + j * row, row, kNan);
      std::fill_n(poisoned.v[b].begin() + j * row, row, kNan);
    }
  }
  CHECK(hidden > 100);
  for (int bs : {0, 16, 64}) {
    const Result a = Run(c, clean, Layout{bs, true, 5});
    const Result b = Run(c, poisoned, Layout{bs, true, 5, /*wild_hidden_blocks=*/true});
    CHECK(Mismatches(b.out, a.out, 0.0) == 0);
    CHECK(Mismatches(b.lse, a.lse, 0.0) == 0);
  }
}

}  // namespace
}  // namespace llm
