// The bf16 and fp8 GEMV paths of the grouped expert GEMMs (kernels/cuda/moe/moe_gemv.cu,
// LaunchMoeGemv) against an fp64 host reference of the same weights: random routings of 1 to 16
// tokens (and experts of up to 33 rows: several tiles, passes over a tile's rows), gather, biases,
// the clamped SwiGLU and SiLU, the shared experts' dense group, shapes the tiled GEMMs refuse
// (k not a multiple of 64, n_out not of 64), and the down GEMV's combine against
// LaunchMoeCombine's bits; then the same launches captured in a CUDA graph and replayed under
// changing routings, against eager runs. The MXFP4 GEMV is test_moe_mxfp4.cc's; the layer's
// choice of it test_moe_layer.cc's.
//
//   build/cuda/tests/gpu_tests "[gemv]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm {
namespace {

using cuda::DeviceAllocs;
using cuda::Download;
using cuda::Upload;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

double GateAct(double g, double u, float limit, float alpha) {
  if (limit <= 0.f) return g / (1.0 + std::exp(-g)) * u;
  const double gt = std::min(g, static_cast<double>(limit));
  const double up = std::clamp(u, -static_cast<double>(limit), static_cast<double>(limit));
  return (up + 1.0) * gt / (1.0 + std::exp(-alpha * gt));
}

// The weight forms of the GEMV with bf16 activations: bf16, or e4m3 with one scale per expert
// (a checkpoint's per-tensor scales), per weight row, or per 128x128 block (MoeGemmScales).
enum class Form { kBf16, kFp8Expert, kFp8Row, kFp8Block };
const char* FormName(Form f) {
  return f == Form::kBf16        ? "bf16"
         : f == Form::kFp8Expert ? "fp8 per expert"
         : f == Form::kFp8Row    ? "fp8 per row"
                                 : "fp8 128x128 blocks";
}

// `groups` random matrices [rows, k] (the experts, or the dense group) in form f: h the values
// the kernel multiplies (bf16, or e4m3 code times its scale), d the device copy, sc its scales.
struct WMat {
  std::vector<float> h;
  const void* d = nullptr;
  cuda::MoeGemmScales sc;
};
template <typename Rng>
WMat RandomWeights(Form f, int groups, int rows, int k, float sd, Rng& rng, DeviceAllocs* d) {
  std::normal_distribution<float> nd(0.f, 1.f);
  WMat m;
  const size_t n = static_cast<size_t>(groups) * rows * k;
  m.h.resize(n);
  if (f == Form::kBf16) {
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) {
      b[i] = F32ToBf16(sd * nd(rng));
      m.h[i] = Bf16ToF32(b[i]);
    }
    m.d = d->Up(b);
    return m;
  }
  // Codes of values about 16 (e4m3's normal range), scales about sd / 16 and each different.
  std::vector<uint8_t> q(n);
  for (uint8_t& b : q) b = FloatToFp8E4M3(16.f * nd(rng));
  std::uniform_real_distribution<float> spread(0.5f, 2.0f);
  const int bl = (k + 127) / 128, rb = (rows + 127) / 128;
  const size_t per_group = f == Form::kFp8Expert ? 1 : f == Form::kFp8Row ? rows : rb * bl;
  std::vector<float> sc(groups * per_group);
  for (float& v : sc) v = sd / 16.f * spread(rng);
  m.sc.expert_stride = static_cast<int>(per_group);
  m.sc.row_stride = f == Form::kFp8Row ? 1 : 0;
  m.sc.block_ld = f == Form::kFp8Block ? bl : 0;
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < k; ++c) {
        const size_t i = (static_cast<size_t>(g) * rows + r) * k + c;
        const float s = f == Form::kFp8Expert ? sc[g]
                        : f == Form::kFp8Row  ? sc[static_cast<size_t>(g) * rows + r]
                                              : sc[g * per_group + (r / 128) * bl + c / 128];
        m.h[i] = Fp8E4M3ToFloat(q[i]) * s;
      }
    }
  }
  m.d = d->Up(q);
  m.sc.scale = d->Up(sc);
  return m;
}

// E routed experts [E, 2 I, H] (gate rows, then up) and [E, H, I] with fp32 biases, and the
// shared experts' dense group [2 SI, H], [H, SI] (no biases, as CudaMoeLayer keeps them).
struct Experts {
  int E, H, I, SI;
  Form form;
  WMat gu, dn, sgu, sdn;
  std::vector<float> gu_bias, dn_bias;
  const float *d_gu_bias = nullptr, *d_dn_bias = nullptr;
};
template <typename Rng>
Experts MakeExperts(int E, int H, int I, int SI, Rng& rng, DeviceAllocs* d,
                    Form form = Form::kBf16) {
  Experts x{E, H, I, SI, form, {}, {}, {}, {}, {}, {}};
  const float sh = 1.5f / std::sqrt(float(H));
  x.gu = RandomWeights(form, E, 2 * I, H, sh, rng, d);
  x.dn = RandomWeights(form, E, H, I, 1.0f / std::sqrt(float(I)), rng, d);
  x.sgu = RandomWeights(form, 1, 2 * SI, H, sh, rng, d);
  x.sdn = RandomWeights(form, 1, H, SI, 1.0f / std::sqrt(float(SI)), rng, d);
  std::normal_distribution<float> nd(0.f, 1.f);
  x.gu_bias.resize(static_cast<size_t>(E) * 2 * I);
  x.dn_bias.resize(static_cast<size_t>(E) * H);
  for (float& v : x.gu_bias) v = 0.5f * nd(rng);
  for (float& v : x.dn_bias) v = 0.2f * nd(rng);
  x.d_gu_bias = d->Up(x.gu_bias);
  x.d_dn_bias = d->Up(x.dn_bias);
  return x;
}

// The device side of one step: ids [S] in, the permutation, act [S, I], shared act [T, SI],
// y [S, H], shared out [T, H], combined out [T, H] (the down GEMV's) and LaunchMoeCombine's.
struct Step {
  int T = 0, top_k = 0, S = 0, max_tiles = 0;
  int32_t *ids = nullptr, *sorted = nullptr, *slot_of = nullptr, *tiles = nullptr,
          *num_tiles = nullptr;
  float* topk_w = nullptr;
  uint16_t *x = nullptr, *act = nullptr, *sact = nullptr, *y = nullptr, *sout = nullptr,
           *out = nullptr, *out_ref = nullptr;
  uint32_t* tickets = nullptr;
};
Step MakeStep(const Experts& m, int T, int top_k, DeviceAllocs* d) {
  Step s;
  s.T = T, s.top_k = top_k, s.S = T * top_k;
  s.max_tiles = cuda::MoeMaxTiles(s.S, m.E, T);
  auto nan = [&](size_t n) { return d->Up(std::vector<uint16_t>(n, 0x7fc0)); };
  s.ids = d->Up(std::vector<int32_t>(s.S, 0));
  s.sorted = d->Up(std::vector<int32_t>(s.S, -1));
  s.slot_of = d->Up(std::vector<int32_t>(s.S, -1));
  s.tiles = d->Up(std::vector<int32_t>(static_cast<size_t>(s.max_tiles) * 3 + 4, 0));
  s.num_tiles = d->Up(std::vector<int32_t>(4, 0));
  s.topk_w = d->Up(std::vector<float>(s.S, 0.f));
  s.x = nan(static_cast<size_t>(T) * m.H);
  s.act = nan(static_cast<size_t>(s.S) * m.I);
  s.sact = nan(static_cast<size_t>(T) * m.SI);
  s.y = nan(static_cast<size_t>(s.S) * m.H);
  s.sout = nan(static_cast<size_t>(T) * m.H);
  s.out = nan(static_cast<size_t>(T) * m.H);
  s.out_ref = nan(static_cast<size_t>(T) * m.H);
  s.tickets = d->Up(std::vector<uint32_t>(cuda::MoeCombineTickets(m.H), 0));
  return s;
}

// The permutation, both GEMVs (the down one combining into s.out) and LaunchMoeCombine into
// s.out_ref, on `stream` (capturable).
void Launch(const Experts& m, const Step& s, float limit, int gemv_rows, cudaStream_t stream) {
  cuda::MoePermuteArgs pa;
  pa.topk_ids = s.ids;
  pa.num_slots = s.S;
  pa.num_experts = m.E;
  pa.top_k = s.top_k;
  pa.dense_rows = s.T;
  pa.sorted_token = s.sorted;
  pa.slot_of = s.slot_of;
  pa.tiles = s.tiles;
  pa.num_tiles = s.num_tiles;
  cuda::LaunchMoePermute(pa, stream);
  cuda::MoeGemmArgs g;
  g.x = s.x;
  g.sorted_token = s.sorted;
  g.w = m.gu.d;
  g.fp8 = m.form != Form::kBf16;
  g.w_scale = m.gu.sc;
  g.silu_mul = true;
  g.bias = m.d_gu_bias;
  g.swiglu_limit = limit;
  g.n_out = m.I;
  g.k = m.H;
  g.tiles = s.tiles;
  g.num_tiles = s.num_tiles;
  g.max_tiles = s.max_tiles;
  g.out = s.act;
  g.dense_x = s.x;
  g.dense_w = m.sgu.d;
  g.dense_w_scale = m.sgu.sc;
  g.dense_n_out = m.SI;
  g.dense_k = m.H;
  g.dense_out = s.sact;
  g.gemv_max_rows = gemv_rows;
  REQUIRE(cuda::LaunchMoeGemv(g, stream));
  g.x = s.act;
  g.sorted_token = nullptr;
  g.w = m.dn.d;
  g.w_scale = m.dn.sc;
  g.silu_mul = false;
  g.bias = m.d_dn_bias;
  g.swiglu_limit = 0.f;
  g.n_out = m.H;
  g.k = m.I;
  g.out = s.y;
  g.dense_x = s.sact;
  g.dense_w = m.sdn.d;
  g.dense_w_scale = m.sdn.sc;
  g.dense_n_out = m.H;
  g.dense_k = m.SI;
  g.dense_out = s.sout;
  g.combine.slot_of = s.slot_of;
  g.combine.topk_w = s.topk_w;
  g.combine.shared = s.sout;
  g.combine.num_tokens = s.T;
  g.combine.top_k = s.top_k;
  g.combine.tickets = s.tickets;
  g.combine.out = s.out;
  g.tiles_before_wait = true;  // as the layer: right after gate_up, which waited for the tiles
  REQUIRE(cuda::LaunchMoeGemv(g, stream));
  cuda::LaunchMoeCombine(s.y, s.slot_of, s.topk_w, s.sout, s.T, s.top_k, m.H, s.out_ref, stream);
}

// ids [T, top_k] (distinct per token) and routing weights.
template <typename Rng>
void RandomRouting(int E, int T, int top_k, Rng& rng, std::vector<int32_t>* ids,
                   std::vector<float>* w) {
  std::uniform_int_distribution<int> expert(0, E - 1);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  ids->assign(static_cast<size_t>(T) * top_k, -1);
  w->resize(ids->size());
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < top_k; ++k) {
      int e;
      do {
        e = expert(rng);
      } while (std::find(ids->begin() + t * top_k, ids->begin() + t * top_k + k, e) !=
               ids->begin() + t * top_k + k);
      (*ids)[t * top_k + k] = e;
      (*w)[t * top_k + k] = uw(rng);
    }
  }
}

// Row `r` of a GEMV output against sum_c xr[c] * wr[c] + bias in fp64.
struct RefSum {
  double sum = 0, mag = 0;
};
RefSum Dot(const float* w, const std::vector<float>& xr, double bias) {
  RefSum r{bias, std::fabs(bias)};
  for (size_t c = 0; c < xr.size(); ++c) {
    r.sum += static_cast<double>(xr[c]) * w[c];
    r.mag += std::fabs(static_cast<double>(xr[c]) * w[c]);
  }
  return r;
}

// Every output of one eager step against the reference: act and shared act from x; y and the
// shared output from the GPU's own act (bf16); out bitwise LaunchMoeCombine's; tickets zero.
void CheckStep(const Experts& m, const Step& s, const std::vector<float>& x,
               const std::vector<int32_t>& ids, float limit) {
  const int T = s.T, K = s.top_k, H = m.H, I = m.I, SI = m.SI;
  const auto slot_of = Download(s.slot_of, s.S);
  const auto act = Download(s.act, static_cast<size_t>(s.S) * I);
  const auto sact = Download(s.sact, static_cast<size_t>(T) * SI);
  const auto y = Download(s.y, static_cast<size_t>(s.S) * H);
  const auto sout = Download(s.sout, static_cast<size_t>(T) * H);
  auto row = [](const std::vector<uint16_t>& v, size_t r, int n) {
    std::vector<float> f(n);
    for (int i = 0; i < n; ++i) f[i] = Bf16ToF32(v[r * n + i]);
    return f;
  };
  // Gated rows (gate rows 0..n-1 of w, up rows n..2n-1) of xr against got (bf16 [n]).
  auto check_gated = [&](const float* w, const float* bias, int n, const std::vector<float>& xr,
                         const std::vector<float>& got, float lim) {
    for (int j = 0; j < n; ++j) {
      const RefSum g = Dot(w + static_cast<size_t>(j) * H, xr, bias ? bias[j] : 0.0);
      const RefSum u = Dot(w + static_cast<size_t>(n + j) * H, xr, bias ? bias[n + j] : 0.0);
      const double ref = GateAct(g.sum, u.sum, lim, 1.702f);
      const double tol =
          8e-3 * std::fabs(ref) + 1e-3 +
          3e-5 * (g.mag * (std::fabs(u.sum) + 1.0) + u.mag * (std::fabs(g.sum) + 1.0));
      INFO("gated column " << j << ": " << got[j] << " vs " << ref);
      REQUIRE(std::fabs(got[j] - ref) <= tol);  // NaN fails too
    }
  };
  auto check_rows = [&](const float* w, const float* bias, int n, int k,
                        const std::vector<float>& xr, const std::vector<float>& got) {
    for (int j = 0; j < n; ++j) {
      const RefSum r = Dot(w + static_cast<size_t>(j) * k, xr, bias ? bias[j] : 0.0);
      INFO("column " << j << ": " << got[j] << " vs " << r.sum);
      REQUIRE(std::fabs(got[j] - r.sum) <= 8e-3 * std::fabs(r.sum) + 3e-5 * r.mag + 1e-6);
    }
  };
  for (int t = 0; t < T; ++t) {
    INFO("token " << t);
    const std::vector<float> xr(x.begin() + static_cast<size_t>(t) * H,
                                x.begin() + static_cast<size_t>(t + 1) * H);
    for (int k = 0; k < K; ++k) {
      const int e = ids[t * K + k], slot = slot_of[t * K + k];
      INFO("expert " << e << " slot " << slot);
      REQUIRE(slot >= 0);
      REQUIRE(slot < s.S);
      check_gated(m.gu.h.data() + static_cast<size_t>(e) * 2 * I * H,
                  m.gu_bias.data() + static_cast<size_t>(e) * 2 * I, I, xr, row(act, slot, I),
                  limit);
      check_rows(m.dn.h.data() + static_cast<size_t>(e) * H * I,
                 m.dn_bias.data() + static_cast<size_t>(e) * H, H, I, row(act, slot, I),
                 row(y, slot, H));
    }
    check_gated(m.sgu.h.data(), nullptr, SI, xr, row(sact, t, SI), limit);
    check_rows(m.sdn.h.data(), nullptr, H, SI, row(sact, t, SI), row(sout, t, H));
  }
  const auto out = Download(s.out, static_cast<size_t>(T) * H);
  const auto out_ref = Download(s.out_ref, static_cast<size_t>(T) * H);
  REQUIRE(out == out_ref);
  const auto left = Download(s.tickets, cuda::MoeCombineTickets(H));
  CHECK(std::all_of(left.begin(), left.end(), [](uint32_t v) { return v == 0; }));
}

template <typename Rng>
std::vector<float> UploadX(const Step& s, int H, Rng& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> b(static_cast<size_t>(s.T) * H);
  std::vector<float> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    b[i] = F32ToBf16(nd(rng));
    x[i] = Bf16ToF32(b[i]);
  }
  CUDA_REQUIRE(cudaMemcpy(s.x, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  return x;
}

void UploadRouting(const Step& s, const std::vector<int32_t>& ids, const std::vector<float>& w) {
  CUDA_REQUIRE(cudaMemcpy(s.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemcpy(s.topk_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
}

// What LaunchMoeGemv refuses (false, nothing launched: the checks run before any device call, so
// this case runs without a GPU too): fp8 activations, shapes outside MoeGemvShapeOk for either
// group, an MXFP4 dense group or padding not of PackMoeMxfp4's form, fp8 weights without scales,
// a gate_up GEMM asked to combine, a combine beside a dense group of another width. An empty grid
// (max_tiles 0) of served operands launches nothing and succeeds.
TEST_CASE("MoE GEMV refuses the operands it does not serve", "[moe][gemv][host]") {
  cuda::MoeGemmArgs ok;
  ok.n_out = 64;
  ok.k = 96;
  ok.max_tiles = 0;
  CHECK(cuda::LaunchMoeGemv(ok, nullptr));
  auto refused = [](const cuda::MoeGemmArgs& a) { return !cuda::LaunchMoeGemv(a, nullptr); };
  cuda::MoeGemmArgs a = ok;
  a.n_out = 48;  // not a combine block
  CHECK(refused(a));
  a = ok;
  a.k = 100;  // bf16 rows of 16-byte loads
  CHECK(refused(a));
  a = ok;
  a.fp8 = true;  // e4m3 weights need their scales
  CHECK(refused(a));
  const float scale = 1.0f;
  a.w_scale.scale = &scale;
  CHECK(cuda::LaunchMoeGemv(a, nullptr));
  a.k = 104;  // 16 values per load
  CHECK(refused(a));
  a = ok;
  float xs = 1.0f;
  a.x_scale = &xs;  // fp8 activations: the W8A8 GEMMs
  CHECK(refused(a));
  a = ok;
  const uint8_t mx = 127;
  a.mx_scales = &mx;
  a.k = 96;
  a.mx_k_pad = 128;
  CHECK(cuda::LaunchMoeGemv(a, nullptr));
  a.mx_k_pad = 96;  // not PackMoeMxfp4's padding
  CHECK(refused(a));
  a.mx_k_pad = 128;
  a.k = 80;  // whole scale groups
  CHECK(refused(a));
  a.k = 96;
  a.dense_w = &scale;  // no MXFP4 dense group
  a.dense_n_out = 64;
  a.dense_k = 96;
  CHECK(refused(a));
  a = ok;
  a.silu_mul = true;
  uint16_t out = 0;
  a.combine.out = &out;  // only the down GEMM combines
  CHECK(refused(a));
  a.silu_mul = false;
  CHECK(cuda::LaunchMoeGemv(a, nullptr));
  a.dense_w = &scale;
  a.dense_n_out = 32;  // the shared output must be the combine's width
  a.dense_k = 96;
  CHECK(refused(a));
  a.combine.out = nullptr;
  CHECK(cuda::LaunchMoeGemv(a, nullptr));
  a.dense_k = 12;  // the dense group's shapes too
  CHECK(refused(a));
}

// Shapes: hidden 224 (28 16-byte chunks per row: fewer than a warp's lanes) and 1248 (156: a
// lane's last unrolled loads past the row), intermediate 96 and 416, shared 160 and 832; none
// a multiple of 64 in k, most not in n_out.
TEST_CASE("bf16 GEMV matches the reference (gather, biases, gates, dense group, combine)",
          "[gpu][moe][gemv]") {
  GPU_TEST_RNG(rng);
  struct Shape {
    int E, K, H, I, SI;
  };
  for (const Shape sh : {Shape{8, 2, 224, 96, 160}, Shape{16, 4, 1248, 416, 832}}) {
    INFO("E " << sh.E << " top-" << sh.K << " H " << sh.H << " I " << sh.I << " SI " << sh.SI);
    REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kBf16, sh.I, sh.H));
    REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kBf16, sh.H, sh.I));
    REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kBf16, sh.SI, sh.H));
    REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kBf16, sh.H, sh.SI));
    DeviceAllocs d;
    const Experts m = MakeExperts(sh.E, sh.H, sh.I, sh.SI, rng, &d);
    for (const int T : {1, 2, 3, 8, 16}) {
      for (const int bound : {T, 1, 0}) {  // the layer's bound, a pass per row, unknown
        const float limit = T % 2 ? 7.0f : 0.0f;
        INFO("T " << T << " gemv_max_rows " << bound << " swiglu limit " << limit);
        DeviceAllocs ds;
        const Step s = MakeStep(m, T, sh.K, &ds);
        std::vector<int32_t> ids;
        std::vector<float> w;
        RandomRouting(sh.E, T, sh.K, rng, &ids, &w);
        UploadRouting(s, ids, w);
        const std::vector<float> x = UploadX(s, sh.H, rng);
        Launch(m, s, limit, bound, nullptr);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        CheckStep(m, s, x, ids, limit);
      }
    }
  }
}

// Experts of 1 to 33 rows (every token routed to expert 0 and one other): tiles of 16 rows cut
// from one expert, the last partly filled, and the dense group's T rows in tiles of 16 too.
TEST_CASE("bf16 GEMV over experts of up to 33 rows (several tiles per expert)",
          "[gpu][moe][gemv]") {
  GPU_TEST_RNG(rng);
  DeviceAllocs d;
  const Experts m = MakeExperts(4, 224, 96, 64, rng, &d);
  std::uniform_int_distribution<int> other(1, 3);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (const int T : {1, 15, 16, 17, 33}) {
    INFO("T " << T);
    DeviceAllocs ds;
    const Step s = MakeStep(m, T, 2, &ds);
    std::vector<int32_t> ids(2 * T);
    std::vector<float> w(2 * T);
    for (int t = 0; t < T; ++t) {
      ids[2 * t] = 0;
      ids[2 * t + 1] = other(rng);
      w[2 * t] = uw(rng), w[2 * t + 1] = uw(rng);
    }
    UploadRouting(s, ids, w);
    const std::vector<float> x = UploadX(s, m.H, rng);
    Launch(m, s, 7.0f, std::min(T, 16), nullptr);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CheckStep(m, s, x, ids, 7.0f);
  }
}

// fp8 e4m3 weights (W8A16, the GEMV's FMA path) with each scale form, routed experts and the dense
// group: hidden 1248 and intermediate 416 (k of 10 and 4 128-wide blocks, the last partial;
// weight rows 832 / 1248 / 1664: row blocks cut inside a gate or up half).
TEST_CASE("fp8 GEMV matches the reference (per expert, per row, 128x128 block scales)",
          "[gpu][moe][gemv][fp8]") {
  GPU_TEST_RNG(rng);
  const int E = 16, K = 4, H = 1248, I = 416, SI = 832;
  REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kFp8, I, H));
  REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kFp8, H, I));
  REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kFp8, SI, H));
  REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kFp8, H, SI));
  for (const Form f : {Form::kFp8Expert, Form::kFp8Row, Form::kFp8Block}) {
    INFO(FormName(f));
    DeviceAllocs d;
    const Experts m = MakeExperts(E, H, I, SI, rng, &d, f);
    for (const int T : {1, 3, 16}) {
      const float limit = T % 2 ? 7.0f : 0.0f;
      INFO("T " << T);
      DeviceAllocs ds;
      const Step s = MakeStep(m, T, K, &ds);
      std::vector<int32_t> ids;
      std::vector<float> w;
      RandomRouting(E, T, K, rng, &ids, &w);
      UploadRouting(s, ids, w);
      const std::vector<float> x = UploadX(s, H, rng);
      Launch(m, s, limit, T, nullptr);
      CUDA_REQUIRE(cudaDeviceSynchronize());
      CheckStep(m, s, x, ids, limit);
    }
  }
}

// The step captured once and replayed under a new routing and new x each time: every replay's
// outputs the bits of an eager run of the same launches (the grid fixed from max_tiles, absent
// tiles exiting; the combine's tickets back at zero after each replay).
TEST_CASE("bf16 GEMV in a CUDA graph replays like eager runs", "[gpu][moe][gemv]") {
  GPU_TEST_RNG(rng);
  DeviceAllocs d;
  const Experts m = MakeExperts(16, 224, 96, 160, rng, &d);
  const int T = 4, K = 4;
  DeviceAllocs ds;
  const Step g = MakeStep(m, T, K, &ds), e = MakeStep(m, T, K, &ds);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  Launch(m, g, 7.0f, T, stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    INFO("replay " << replay);
    std::vector<int32_t> ids;
    std::vector<float> w;
    RandomRouting(m.E, T, K, rng, &ids, &w);
    UploadRouting(g, ids, w);
    UploadRouting(e, ids, w);
    const std::vector<float> x = UploadX(g, m.H, rng);
    const auto xb = Download(g.x, static_cast<size_t>(T) * m.H);
    CUDA_REQUIRE(cudaMemcpy(e.x, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    Launch(m, e, 7.0f, T, stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const size_t n = static_cast<size_t>(T) * m.H;
    REQUIRE(Download(g.out, n) == Download(e.out, n));
    REQUIRE(Download(g.act, static_cast<size_t>(T) * K * m.I) ==
            Download(e.act, static_cast<size_t>(T) * K * m.I));
    CheckStep(m, g, x, ids, 7.0f);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace llm
