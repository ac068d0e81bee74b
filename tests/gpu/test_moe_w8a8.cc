// The W8A8 grouped expert GEMMs (kernels/cuda/moe/moe_gemm_w8a8.cu: e4m3 weights, e4m3
// activations, the e4m3 tensor cores) against a host reference that quantizes the activations
// exactly as the device does (base/quant.h: per token, or per token and 128-wide k group beside
// 128x128 block weights; the device quantization kernels the layer runs are checked byte for
// byte against it): per-tensor, per-row and 128x128-block weight scales, gate_up (SiLU, and
// gpt-oss's clamped SwiGLU with biases) and down, the dense group (shared experts), random
// routings and experts of 1 to 200 rows, through every tile size (16, 32, 64 rows).
//
//   build/cuda/tests/gpu_tests "[moe][fp8]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/quant.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/ops/fp8_quant.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm {
namespace {

using cuda::DeviceAllocs;
using cuda::Download;
using cuda::Upload;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

enum class Scales { kTensor, kRow, kBlock };
const char* ScalesName(Scales s) {
  return s == Scales::kTensor ? "per-tensor" : s == Scales::kRow ? "per-row" : "128x128 blocks";
}

// One stack of `groups` e4m3 matrices [rows, k] with their scales in MoeGemmScales' layout, and
// the dequantized weights (code x scale, in double: exact) for the reference.
struct Fp8Stack {
  int groups = 0, rows = 0, k = 0;
  std::vector<uint8_t> q;
  std::vector<float> scale;
  std::vector<double> w;  // [groups, rows, k]
  cuda::MoeGemmScales view;
};

template <typename Rng>
Fp8Stack MakeStack(Scales mode, int groups, int rows, int k, Rng& rng, DeviceAllocs* d) {
  Fp8Stack s;
  s.groups = groups, s.rows = rows, s.k = k;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  s.q.resize(static_cast<size_t>(groups) * rows * k);
  // Codes of N(0, 64) values (well inside +-448, many binades), scales around 1 / (64 sqrt(k)).
  for (uint8_t& v : s.q) v = FloatToFp8E4M3(64.f * nd(rng));
  const float base = 1.0f / (64.f * std::sqrt(static_cast<float>(k)));
  const int bl = (k + 127) / 128;
  auto scale_of = [&](int g, int r, int c) -> float {
    switch (mode) {
      case Scales::kTensor:
        return s.scale[static_cast<size_t>(g) * 4];
      case Scales::kRow:
        return s.scale[static_cast<size_t>(g) * rows + r];
      case Scales::kBlock:
        return s.scale[(static_cast<size_t>(g) * (rows / 128) + r / 128) * bl + c / 128];
    }
    return 0.f;
  };
  switch (mode) {
    case Scales::kTensor:  // one scale per matrix in a 16-byte slot (CudaLinear::kScaleSlot)
      s.scale.assign(static_cast<size_t>(groups) * 4, 0.f);
      for (int g = 0; g < groups; ++g) s.scale[static_cast<size_t>(g) * 4] = base * ud(rng);
      s.view.expert_stride = 4;
      break;
    case Scales::kRow:
      s.scale.resize(static_cast<size_t>(groups) * rows);
      for (float& v : s.scale) v = base * ud(rng);
      s.view.expert_stride = rows;
      s.view.row_stride = 1;
      break;
    case Scales::kBlock:
      REQUIRE(rows % 128 == 0);
      s.scale.resize(static_cast<size_t>(groups) * (rows / 128) * bl);
      for (float& v : s.scale) v = base * ud(rng);
      s.view.block_ld = bl;
      s.view.expert_stride = rows / 128 * bl;
      break;
  }
  s.w.resize(s.q.size());
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < k; ++c) {
        const size_t i = (static_cast<size_t>(g) * rows + r) * k + c;
        s.w[i] = static_cast<double>(Fp8E4M3ToFloat(s.q[i])) * scale_of(g, r, c);
      }
    }
  }
  s.view.scale = d->Up(s.scale);
  return s;
}

// Activations quantized as the W8A8 GEMMs read them: e4m3 codes [rows, k] and scales, per row
// ([rows]) or per row and 128-wide group ([k / 128][rows]); x ~ code x scale (double, exact).
struct Fp8Act {
  std::vector<uint8_t> q;
  std::vector<float> scale;
  std::vector<double> x;
};

// The host quantization (base/quant.h), rows of bf16 values `v` [rows, k].
Fp8Act QuantizeHost(const std::vector<uint16_t>& v, int rows, int k, bool blocks) {
  Fp8Act a;
  a.q.resize(static_cast<size_t>(rows) * k);
  a.x.resize(a.q.size());
  const int bl = blocks ? k / 128 : 1, width = blocks ? 128 : k;
  a.scale.resize(static_cast<size_t>(bl) * rows);
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < bl; ++b) {
      float amax = 0.f;
      for (int c = b * width; c < (b + 1) * width; ++c) {
        amax = std::max(amax, std::fabs(Bf16ToF32(v[static_cast<size_t>(r) * k + c])));
      }
      const float s = DynamicScale(amax, kFp8E4M3Max);
      a.scale[static_cast<size_t>(b) * rows + r] = s;
      for (int c = b * width; c < (b + 1) * width; ++c) {
        const size_t i = static_cast<size_t>(r) * k + c;
        a.q[i] = QuantizeFp8(Bf16ToF32(v[i]), s);
        a.x[i] = static_cast<double>(Fp8E4M3ToFloat(a.q[i])) * s;
      }
    }
  }
  return a;
}

// v (bf16 [rows, k], on the device) quantized by the kernels the layer runs (fp8_quant.h), the
// device buffers handed to the GEMM; their bytes and scales must equal the host's.
struct DeviceAct {
  const uint8_t* q = nullptr;
  const float* scale = nullptr;
  int ld = 0;
};
DeviceAct QuantizeDevice(const void* v, int rows, int k, bool blocks, const Fp8Act& host,
                         DeviceAllocs* d) {
  DeviceAct out;
  uint8_t* q = d->Up(std::vector<uint8_t>(static_cast<size_t>(rows) * k, 0));
  float* sc = d->Up(std::vector<float>(host.scale.size(), 0.f));
  if (blocks) {
    cuda::LaunchQuantizeBlocks128Fp8(v, rows, k, q, sc, rows, nullptr);
    out.ld = rows;
  } else {
    cuda::LaunchQuantizeRowsFp8(v, rows, k, cuda::Fp8Rows{q, sc}, nullptr);
  }
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<uint8_t> hq = Download(q, host.q.size());
  const std::vector<float> hs = Download(sc, host.scale.size());
  size_t bad_q = 0, bad_s = 0;
  for (size_t i = 0; i < hq.size(); ++i) bad_q += hq[i] != host.q[i];
  for (size_t i = 0; i < hs.size(); ++i) bad_s += hs[i] != host.scale[i];
  INFO("device quantization against base/quant.h: " << bad_q << " codes, " << bad_s
                                                    << " scales differ");
  CHECK(bad_q == 0);
  CHECK(bad_s == 0);
  out.q = q;
  out.scale = sc;
  return out;
}

// The gate of the reference: gpt-oss's clamped SwiGLU (limit > 0) or silu(g) * u.
double GateAct(double g, double u, float limit, float alpha) {
  if (limit <= 0.f) return g / (1.0 + std::exp(-g)) * u;
  const double gt = std::min(g, static_cast<double>(limit));
  const double up = std::clamp(u, -static_cast<double>(limit), static_cast<double>(limit));
  return (up + 1.0) * gt / (1.0 + std::exp(-alpha * gt));
}

// The tensor cores' fp8 products are exact and summed in fp32 (on Hopper with an accumulator
// narrower than fp32 inside each mma: at most 128 products, four mma, before the kernel's own
// fp32 add), then scaled in fp32: relative to the sum of |terms| the differences stay near
// 2^-13 per slice; a wrong fragment, scale or row misses by a sizable fraction of it.
constexpr double kSumTol = 1e-3;

struct Experts {
  int E = 0, H = 0, I = 0, SI = 0;  // SI: the dense group's intermediate (0: none)
  Scales mode = Scales::kTensor;
  Fp8Stack gu, dn, sgu, sdn;            // gate_up [E, 2 I, H] (gate rows, then up), down [E, H, I]
  std::vector<float> gu_bias, dn_bias;  // [E][2 I], [E][H]
  const float *d_gu_bias = nullptr, *d_dn_bias = nullptr;
  const uint8_t *d_gu = nullptr, *d_dn = nullptr, *d_sgu = nullptr, *d_sdn = nullptr;
};

template <typename Rng>
Experts MakeExperts(Scales mode, int E, int H, int I, int SI, Rng& rng, DeviceAllocs* d) {
  Experts m;
  m.E = E, m.H = H, m.I = I, m.SI = SI, m.mode = mode;
  m.gu = MakeStack(mode, E, 2 * I, H, rng, d);
  m.dn = MakeStack(mode, E, H, I, rng, d);
  m.d_gu = d->Up(m.gu.q);
  m.d_dn = d->Up(m.dn.q);
  if (SI > 0) {
    m.sgu = MakeStack(mode, 1, 2 * SI, H, rng, d);
    m.sdn = MakeStack(mode, 1, H, SI, rng, d);
    m.d_sgu = d->Up(m.sgu.q);
    m.d_sdn = d->Up(m.sdn.q);
  }
  std::normal_distribution<float> nd(0.f, 1.f);
  m.gu_bias.resize(static_cast<size_t>(E) * 2 * I);
  m.dn_bias.resize(static_cast<size_t>(E) * H);
  for (float& x : m.gu_bias) x = 0.5f * nd(rng);
  for (float& x : m.dn_bias) x = 0.2f * nd(rng);
  m.d_gu_bias = d->Up(m.gu_bias);
  m.d_dn_bias = d->Up(m.dn_bias);
  return m;
}

struct Worst {
  double gu = 0, dn = 0;  // gate_up: error over its bound; down: error over the sum of |terms|
};

// One output of the gate_up reference: weight rows j (gate) and I + j (up) of matrix `w` (group
// g) against activation row x, with biases; *tol its bound.
double GateUpRef(const Fp8Stack& w, int g, int j, const double* x, const float* bias, float limit,
                 float alpha, double* tol) {
  const int H = w.k, I = w.rows / 2;
  const double* wg = w.w.data() + (static_cast<size_t>(g) * w.rows + j) * H;
  const double* wu = wg + static_cast<size_t>(I) * H;
  double gs = bias ? bias[j] : 0.0, us = bias ? bias[I + j] : 0.0;
  double gm = std::fabs(gs), um = std::fabs(us);
  for (int c = 0; c < H; ++c) {
    gs += x[c] * wg[c];
    us += x[c] * wu[c];
    gm += std::fabs(x[c] * wg[c]);
    um += std::fabs(x[c] * wu[c]);
  }
  const double ref = GateAct(gs, us, limit, alpha);
  // bf16 rounding of the result, and the sums' differences through the gate's slopes.
  *tol = 8e-3 * std::fabs(ref) + 1e-3 +
         kSumTol * (gm * (std::fabs(us) + 1.0) + um * (std::fabs(gs) + 1.0));
  return ref;
}

double DownRef(const Fp8Stack& w, int g, int n, const double* a, double bias, double* mag) {
  const int K = w.k;
  const double* wr = w.w.data() + (static_cast<size_t>(g) * w.rows + n) * K;
  double y = bias;
  *mag = std::fabs(bias);
  for (int c = 0; c < K; ++c) {
    y += a[c] * wr[c];
    *mag += std::fabs(a[c] * wr[c]);
  }
  return y;
}

// Tokens x [T, H] routed to ids [T, top_k] (distinct per token) and, with m.SI > 0, the dense
// group of every token, through the permutation, the quantization kernels and both W8A8 GEMMs
// with tiles of each size; every slot's activation and output (and the dense group's) against
// the host reference, the down reference over the GPU's own bf16 activations quantized on the
// host.
void CheckRouting(const Experts& m, const std::vector<uint16_t>& x, const std::vector<int32_t>& ids,
                  int T, int top_k, float limit, float alpha, bool biases, Worst* worst) {
  const int E = m.E, H = m.H, I = m.I, SI = m.SI, S = T * top_k, D = SI > 0 ? T : 0;
  const bool blocks = m.mode == Scales::kBlock;
  INFO(ScalesName(m.mode) << ", T " << T << ", limit " << limit << (biases ? ", biases" : ""));
  const Fp8Act xq = QuantizeHost(x, T, H, blocks);
  // gate_up references: per slot (t, k), and per token for the dense group.
  std::vector<double> a_ref(static_cast<size_t>(S) * I), a_tol(a_ref.size());
  std::vector<double> sa_ref(static_cast<size_t>(D) * SI), sa_tol(sa_ref.size());
  for (int t = 0; t < T; ++t) {
    const double* xr = xq.x.data() + static_cast<size_t>(t) * H;
    for (int k = 0; k < top_k; ++k) {
      const int e = ids[t * top_k + k];
      const float* b = biases ? m.gu_bias.data() + static_cast<size_t>(e) * 2 * I : nullptr;
      for (int j = 0; j < I; ++j) {
        const size_t i = static_cast<size_t>(t * top_k + k) * I + j;
        a_ref[i] = GateUpRef(m.gu, e, j, xr, b, limit, alpha, &a_tol[i]);
      }
    }
    for (int j = 0; j < (D > 0 ? SI : 0); ++j) {
      const size_t i = static_cast<size_t>(t) * SI + j;
      sa_ref[i] = GateUpRef(m.sgu, 0, j, xr, nullptr, limit, alpha, &sa_tol[i]);
    }
  }
  for (const int tile_rows : {16, 32, 64}) {
    INFO("tile rows " << tile_rows);
    DeviceAllocs d;
    const int max_tiles = cuda::MoeMaxTiles(S, E, D, tile_rows);
    cuda::MoePermuteArgs pa;
    pa.topk_ids = d.Up(ids);
    pa.num_slots = S;
    pa.num_experts = E;
    pa.top_k = top_k;
    pa.dense_rows = D;
    pa.tile_rows = tile_rows;
    int32_t* sorted = d.Up(std::vector<int32_t>(S, -1));
    int32_t* slot_of = d.Up(std::vector<int32_t>(S, -1));
    int32_t* tiles = d.Up(std::vector<int32_t>(static_cast<size_t>(max_tiles) * 3 + 4, 0));
    int32_t* num_tiles = d.Up(std::vector<int32_t>(4, 0));
    pa.sorted_token = sorted;
    pa.slot_of = slot_of;
    pa.tiles = tiles;
    pa.num_tiles = num_tiles;
    cuda::LaunchMoePermute(pa, nullptr);
    const DeviceAct dx = QuantizeDevice(d.Up(x), T, H, blocks, xq, &d);
    // Outputs pre-filled with NaN bits: a slot or column the kernels never write fails.
    uint16_t* act = d.Up(std::vector<uint16_t>(static_cast<size_t>(S) * I, 0x7fc0));
    uint16_t* y = d.Up(std::vector<uint16_t>(static_cast<size_t>(S) * H, 0x7fc0));
    uint16_t* sact = d.Up(std::vector<uint16_t>(static_cast<size_t>(D) * SI, 0x7fc0));
    uint16_t* sy = d.Up(std::vector<uint16_t>(static_cast<size_t>(D) * H, 0x7fc0));
    cuda::MoeGemmArgs g;
    g.x = dx.q;
    g.x_scale = dx.scale;
    g.x_scale_ld = dx.ld;
    g.sorted_token = sorted;
    g.w = m.d_gu;
    g.w_scale = m.gu.view;
    g.fp8 = true;
    g.silu_mul = true;
    g.bias = biases ? m.d_gu_bias : nullptr;
    g.swiglu_limit = limit;
    g.swiglu_alpha = alpha;
    g.n_out = I;
    g.k = H;
    g.tiles = tiles;
    g.num_tiles = num_tiles;
    g.max_tiles = max_tiles;
    g.tile_rows = tile_rows;
    g.out = act;
    if (D > 0) {
      g.dense_x = dx.q;
      g.dense_x_scale = dx.scale;
      g.dense_x_scale_ld = dx.ld;
      g.dense_w = m.d_sgu;
      g.dense_w_scale = m.sgu.view;
      g.dense_n_out = SI;
      g.dense_k = H;
      g.dense_out = sact;
    }
    REQUIRE(cuda::LaunchMoeGemmW8a8(g, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const auto h_act = Download(act, static_cast<size_t>(S) * I);
    const auto h_sact = Download(sact, static_cast<size_t>(D) * SI);
    // The down GEMM's inputs: the GPU's activations, quantized on both sides.
    const Fp8Act aq = QuantizeHost(h_act, S, I, blocks);
    const DeviceAct da = QuantizeDevice(act, S, I, blocks, aq, &d);
    Fp8Act saq;
    DeviceAct dsa;
    if (D > 0) {
      saq = QuantizeHost(h_sact, D, SI, blocks);
      dsa = QuantizeDevice(sact, D, SI, blocks, saq, &d);
    }
    cuda::MoeGemmArgs dn = g;
    dn.x = da.q;
    dn.x_scale = da.scale;
    dn.x_scale_ld = da.ld;
    dn.sorted_token = nullptr;
    dn.w = m.d_dn;
    dn.w_scale = m.dn.view;
    dn.silu_mul = false;
    dn.bias = biases ? m.d_dn_bias : nullptr;
    dn.swiglu_limit = 0.f;
    dn.n_out = H;
    dn.k = I;
    dn.out = y;
    if (D > 0) {
      dn.dense_x = dsa.q;
      dn.dense_x_scale = dsa.scale;
      dn.dense_x_scale_ld = dsa.ld;
      dn.dense_w = m.d_sdn;
      dn.dense_w_scale = m.sdn.view;
      dn.dense_n_out = H;
      dn.dense_k = SI;
      dn.dense_out = sy;
    }
    REQUIRE(cuda::LaunchMoeGemmW8a8(dn, nullptr));
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const auto h_sorted = Download(sorted, S);
    const auto h_slot = Download(slot_of, S);
    const auto h_y = Download(y, static_cast<size_t>(S) * H);
    const auto h_sy = Download(sy, static_cast<size_t>(D) * H);
    auto check_gate_up = [&](float got, double ref, double tol) {
      worst->gu = std::max(worst->gu, std::fabs(got - ref) / tol);
      REQUIRE(std::fabs(got - ref) <= tol);  // NaN fails too
    };
    auto check_down = [&](float got, double ref, double mag) {
      const double err = std::fabs(got - ref);
      worst->dn = std::max(worst->dn, err / (mag + 1e-6));
      REQUIRE(err <= 8e-3 * std::fabs(ref) + kSumTol * mag + 1e-6);
    };
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < top_k; ++k) {
        const int slot = h_slot[t * top_k + k], e = ids[t * top_k + k];
        REQUIRE(slot >= 0);
        REQUIRE(slot < S);
        REQUIRE(h_sorted[slot] == t);
        for (int j = 0; j < I; ++j) {
          const size_t i = static_cast<size_t>(t * top_k + k) * I + j;
          const float got = Bf16ToF32(h_act[static_cast<size_t>(slot) * I + j]);
          INFO("gate_up token " << t << " expert " << e << " j " << j << ": " << got << " vs "
                                << a_ref[i] << " (bound " << a_tol[i] << ")");
          check_gate_up(got, a_ref[i], a_tol[i]);
        }
        const double* ar = aq.x.data() + static_cast<size_t>(slot) * I;
        for (int n = 0; n < H; ++n) {
          double mag = 0;
          const double ref = DownRef(
              m.dn, e, n, ar, biases ? m.dn_bias[static_cast<size_t>(e) * H + n] : 0.0, &mag);
          const float got = Bf16ToF32(h_y[static_cast<size_t>(slot) * H + n]);
          INFO("down token " << t << " expert " << e << " n " << n << ": " << got << " vs " << ref);
          check_down(got, ref, mag);
        }
      }
      if (D == 0) continue;
      for (int j = 0; j < SI; ++j) {
        const size_t i = static_cast<size_t>(t) * SI + j;
        const float got = Bf16ToF32(h_sact[i]);
        INFO("dense gate_up token " << t << " j " << j << ": " << got << " vs " << sa_ref[i]);
        check_gate_up(got, sa_ref[i], sa_tol[i]);
      }
      const double* sar = saq.x.data() + static_cast<size_t>(t) * SI;
      for (int n = 0; n < H; ++n) {
        double mag = 0;
        const double ref = DownRef(m.sdn, 0, n, sar, 0.0, &mag);
        const float got = Bf16ToF32(h_sy[static_cast<size_t>(t) * H + n]);
        INFO("dense down token " << t << " n " << n << ": " << got << " vs " << ref);
        check_down(got, ref, mag);
      }
    }
  }
}

template <typename Rng>
std::vector<int32_t> DistinctIds(int T, int top_k, int E, Rng& rng) {
  std::uniform_int_distribution<int> expert(0, E - 1);
  std::vector<int32_t> ids(static_cast<size_t>(T) * top_k);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < top_k; ++k) {
      int e;
      do {
        e = expert(rng);
      } while (std::find(ids.begin() + t * top_k, ids.begin() + t * top_k + k, e) !=
               ids.begin() + t * top_k + k);
      ids[static_cast<size_t>(t) * top_k + k] = e;
    }
  }
  return ids;
}

template <typename Rng>
std::vector<uint16_t> RandomRows(int T, int H, Rng& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(T) * H);
  for (auto& v : x) v = F32ToBf16(nd(rng));
  return x;
}

TEST_CASE("W8A8 expert GEMMs: the device's binary and the refused operands", "[gpu][moe][fp8]") {
  // The test machine's GPUs (H100 / H200) run the sm_90a binary: e4m3 mma.
  REQUIRE(cuda::MoeW8a8Available());
  DeviceAllocs d;
  cuda::MoeGemmArgs a;
  a.tiles = d.Up(std::vector<int32_t>{0, 0, 1});
  a.num_tiles = d.Up(std::vector<int32_t>{1});
  a.max_tiles = 1;
  a.n_out = 64;
  a.k = 128;
  a.w_scale.scale = d.Up(std::vector<float>(4, 1.f));
  a.x_scale = d.Up(std::vector<float>(4, 1.f));
  a.tile_rows = 8;  // no kernel
  CHECK(!cuda::LaunchMoeGemmW8a8(a, nullptr));
  a.tile_rows = 16;
  a.x_scale_ld = 1;  // per-group activation scales beside per-tensor weights
  CHECK(!cuda::LaunchMoeGemmW8a8(a, nullptr));
  a.x_scale_ld = 0;
  a.w_scale.block_ld = 1;  // block weights beside per-token activation scales
  CHECK(!cuda::LaunchMoeGemmW8a8(a, nullptr));
  CHECK(cuda::MoeW8a8ShapeOk(true, 2048, 7168));
  CHECK(cuda::MoeW8a8ShapeOk(false, 7168, 2048));
  CHECK(!cuda::MoeW8a8ShapeOk(false, 7168, 2880));  // 2880 = 22.5 x 128
}

// Random experts of every scale form with the dense group (its intermediate unlike the routed
// experts', so the grid covers both and one group's extra CTAs exit), top-2 over 8 experts.
TEST_CASE("W8A8 expert GEMMs match the host reference (tensor, row, block scales, dense group)",
          "[gpu][moe][fp8]") {
  GPU_TEST_RNG(rng);
  const int E = 8, H = 512, I = 256, SI = 384, top_k = 2;
  for (const Scales mode : {Scales::kTensor, Scales::kRow, Scales::kBlock}) {
    DeviceAllocs d;
    const Experts m = MakeExperts(mode, E, H, I, SI, rng, &d);
    Worst worst;
    for (const int T : {1, 5, 33, 130}) {
      const std::vector<uint16_t> x = RandomRows(T, H, rng);
      const std::vector<int32_t> ids = DistinctIds(T, top_k, E, rng);
      // SiLU without biases (DeepSeek, Qwen3-MoE), the clamped SwiGLU with biases (gpt-oss).
      CheckRouting(m, x, ids, T, top_k, 0.f, 1.702f, false, &worst);
      CheckRouting(m, x, ids, T, top_k, 7.0f, 1.702f, true, &worst);
    }
    std::printf("w8a8 %s: worst gate_up error %.2f of its bound, down %.2e of the sum of |terms|\n",
                ScalesName(mode), worst.gu, worst.dn);
  }
}

// Experts of exactly R rows for R from 1 (decode) to 200 (several 64-row tiles, the last one
// partly filled), beside experts of (R + 1) / 2 rows, one row and none, through every tile size:
// every n8 block count, idle n8 blocks of a tile, tiles cut from one expert. H 1280 and I 640
// give k extents of 10 and 5 stages (the 8- and 4-stage pipelines wrap). Odd R use the clamped
// SwiGLU with biases, even R plain SiLU; the dense group rides along at R 7 and 64.
TEST_CASE("W8A8 expert GEMMs at 1 to 200 rows per expert, every tile size", "[gpu][moe][fp8]") {
  GPU_TEST_RNG(rng);
  const int E = 4, H = 1280, I = 640;
  for (const Scales mode : {Scales::kTensor, Scales::kRow, Scales::kBlock}) {
    DeviceAllocs d;
    const Experts routed = MakeExperts(mode, E, H, I, 0, rng, &d);
    const Experts with_dense = MakeExperts(mode, E, H, I, 256, rng, &d);
    Worst worst;
    for (const int R : {1, 2, 3, 7, 8, 9, 16, 33, 64, 200}) {
      INFO("rows per expert " << R);
      std::vector<int32_t> ids;
      const int counts[4] = {R, (R + 1) / 2, 0, 1};
      for (int e = 0; e < E; ++e) ids.insert(ids.end(), counts[e], e);
      std::shuffle(ids.begin(), ids.end(), rng);
      const int T = static_cast<int>(ids.size());  // top-1: one slot per token
      const std::vector<uint16_t> x = RandomRows(T, H, rng);
      CheckRouting(R == 7 || R == 64 ? with_dense : routed, x, ids, T, 1, R % 2 ? 7.0f : 0.0f,
                   1.702f, R % 2 == 1, &worst);
    }
    std::printf("w8a8 %s rows sweep: worst gate_up error %.2f of its bound, down %.2e\n",
                ScalesName(mode), worst.gu, worst.dn);
  }
}

}  // namespace
}  // namespace llm
