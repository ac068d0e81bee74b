// The MXFP4 grouped expert GEMMs (kernels/cuda/moe/moe_gemm_mxfp4.cu) against the host
// dequantization of base/mxfp4.h: every e2m1 code at every scale the kernel accepts widened
// exactly, and random gpt-oss-like experts (interleaved gate_up rows, biases, the clamped SwiGLU
// or plain SiLU, k not a multiple of the 128-wide stage, weight rows not a multiple of a CTA's)
// over random routings and over experts of 1 to 200 rows, gate_up and down, through every tile
// size (16, 32, 64 rows: each kernel configuration), against an fp64 reference of the same
// dequantized weights.
//
//   build/cuda/tests/gpu_tests "[mxfp4]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/mxfp4.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm {
namespace {

using cuda::DeviceAllocs;
using cuda::Download;
using cuda::Upload;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

// One 64-row down GEMM over k = 128 with identity activations: out[m, n] = W[n, m] for m < 16,
// the widened weight itself. Rows n cover every (code, scale) pair: the 16 codes at row n's 16
// first k, and a scale per row running over [2, 252] (MoeMxfp4ScaleOk's range) in steps.
TEST_CASE("MXFP4 GEMM widens every e2m1 code at every accepted scale exactly",
          "[gpu][moe][mxfp4]") {
  const int N = cuda::kMoeGemmN, K = 128, M = 16, G = K / 32;
  int checked = 0;
  for (int s0 = 2; s0 <= 252; s0 += N) {
    std::vector<uint8_t> blocks(static_cast<size_t>(N) * G * 16, 0), scales(N * G, 127);
    for (int n = 0; n < N; ++n) {
      for (int m = 0; m < M; m += 2) {
        const uint8_t lo = static_cast<uint8_t>((m + n) & 15),
                      hi = static_cast<uint8_t>((m + n + 1) & 15);
        blocks[static_cast<size_t>(n) * G * 16 + m / 2] = static_cast<uint8_t>(lo | hi << 4);
      }
      scales[n * G] = static_cast<uint8_t>(std::min(252, s0 + n));
    }
    std::vector<float> w(static_cast<size_t>(N) * K);
    DequantizeMxfp4(blocks.data(), scales.data(), static_cast<size_t>(N) * G, w.data());
    std::vector<uint8_t> values, packed_scales;
    cuda::PackMoeMxfp4(blocks.data(), scales.data(), 1, N, K, false, &values, &packed_scales);
    std::vector<uint16_t> x(static_cast<size_t>(M) * K, 0);
    for (int m = 0; m < M; ++m) x[static_cast<size_t>(m) * K + m] = F32ToBf16(1.0f);
    for (const int tile_rows : {16, 32, 64}) {
      INFO("tile rows " << tile_rows);
      DeviceAllocs d;
      cuda::MoeGemmArgs a;
      a.x = d.Up(x);
      a.w = d.Up(values);
      a.mx_scales = d.Up(packed_scales);
      a.mx_k_pad = cuda::MoeMxfp4KPad(K);
      a.n_out = N;
      a.k = K;
      a.tiles = d.Up(std::vector<int32_t>{0, 0, M});
      a.num_tiles = d.Up(std::vector<int32_t>{1});
      a.max_tiles = 1;
      a.tile_rows = tile_rows;
      uint16_t* out = d.Up(std::vector<uint16_t>(static_cast<size_t>(M) * N, 0xffff));
      a.out = out;
      REQUIRE(cuda::LaunchMoeGemmMxfp4(a, nullptr));
      CUDA_REQUIRE(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = Download(out, static_cast<size_t>(M) * N);
      for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n) {
          const float want = w[static_cast<size_t>(n) * K + m];
          INFO("row " << n << " k " << m << " scale " << static_cast<int>(scales[n * G]));
          REQUIRE(Bf16ToF32(got[static_cast<size_t>(m) * N + n]) == want);  // -0 sums to +0
          ++checked;
        }
      }
    }
  }
  std::printf("mxfp4: %d widened weights exact\n", checked);
  CHECK(checked > 0);
}

// The gate of the reference: gpt-oss's clamped SwiGLU (limit > 0) or silu(g) * u.
double GateAct(double g, double u, float limit, float alpha) {
  if (limit <= 0.f) return g / (1.0 + std::exp(-g)) * u;
  const double gt = std::min(g, static_cast<double>(limit));
  const double up = std::clamp(u, -static_cast<double>(limit), static_cast<double>(limit));
  return (up + 1.0) * gt / (1.0 + std::exp(-alpha * gt));
}

// E random MXFP4 experts of gpt-oss's layout (gate_up rows interleaved in the checkpoint), their
// host dequantization and the device copies in the kernels' layout. Scales random in
// [scale_lo, scale_hi] (within MoeMxfp4ScaleOk; the exactness test above covers all of it).
struct RandomMxfp4Experts {
  int E = 0, H = 0, I = 0;
  std::vector<float> gu_w, dn_w;        // [E, 2 I, H] (checkpoint rows), [E, H, I]
  std::vector<float> gu_bias, dn_bias;  // [E][2 I] gate then up, [E][H]
  const uint8_t *gu = nullptr, *gu_s = nullptr, *dn = nullptr, *dn_s = nullptr;
  const float *d_gu_bias = nullptr, *d_dn_bias = nullptr;
};
template <typename Rng>
RandomMxfp4Experts MakeRandomExperts(int E, int H, int I, int scale_lo, int scale_hi, Rng& rng,
                                     DeviceAllocs* d) {
  RandomMxfp4Experts m;
  m.E = E, m.H = H, m.I = I;
  std::uniform_int_distribution<int> byte(0, 255), scale(scale_lo, scale_hi);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random_mx = [&](int64_t rows, int64_t k, std::vector<uint8_t>* b, std::vector<uint8_t>* s) {
    b->resize(static_cast<size_t>(E * rows * k / 2));
    s->resize(static_cast<size_t>(E * rows * k / 32));
    for (auto& x : *b) x = static_cast<uint8_t>(byte(rng));
    for (auto& x : *s) {
      x = static_cast<uint8_t>(scale(rng));
      REQUIRE(cuda::MoeMxfp4ScaleOk(x));
    }
  };
  std::vector<uint8_t> gu_b, gu_s, dn_b, dn_s;
  random_mx(2 * I, H, &gu_b, &gu_s);
  random_mx(H, I, &dn_b, &dn_s);
  m.gu_w.resize(static_cast<size_t>(E) * 2 * I * H);
  m.dn_w.resize(static_cast<size_t>(E) * H * I);
  DequantizeMxfp4(gu_b.data(), gu_s.data(), gu_s.size(), m.gu_w.data());
  DequantizeMxfp4(dn_b.data(), dn_s.data(), dn_s.size(), m.dn_w.data());
  m.gu_bias.resize(static_cast<size_t>(E) * 2 * I);
  m.dn_bias.resize(static_cast<size_t>(E) * H);
  for (float& x : m.gu_bias) x = 0.5f * nd(rng);
  for (float& x : m.dn_bias) x = 0.2f * nd(rng);
  std::vector<uint8_t> gu_v, gu_ps, dn_v, dn_ps;
  cuda::PackMoeMxfp4(gu_b.data(), gu_s.data(), E, 2 * I, H, true, &gu_v, &gu_ps);
  cuda::PackMoeMxfp4(dn_b.data(), dn_s.data(), E, H, I, false, &dn_v, &dn_ps);
  m.gu = d->Up(gu_v);
  m.gu_s = d->Up(gu_ps);
  m.dn = d->Up(dn_v);
  m.dn_s = d->Up(dn_ps);
  m.d_gu_bias = d->Up(m.gu_bias);
  m.d_dn_bias = d->Up(m.dn_bias);
  return m;
}

struct Worst {
  double gu = 0, dn = 0;
};

// Tokens x [T, H] routed to ids [T, top_k] (distinct per token) through the permutation and both
// MXFP4 GEMMs with tiles of each size in tile_rows_list; every slot's activation and output
// against the fp64 reference (the down reference over the GPU's own bf16 activations). With
// gemv_rows >= 0 the GEMMs are LaunchMoeGemv's (MoeGemmArgs::gemv_max_rows = gemv_rows), and its
// down GEMM also combines (random weights): the same bits as LaunchMoeCombine over its y, the
// tickets left zero.
void CheckRouting(const RandomMxfp4Experts& m, const std::vector<uint16_t>& x,
                  const std::vector<int32_t>& ids, int T, int top_k, float limit, float alpha,
                  const std::vector<int>& tile_rows_list, Worst* worst, int gemv_rows = -1,
                  int gemv_split_k = 0) {
  const int E = m.E, H = m.H, I = m.I, S = T * top_k;
  // gate_up reference per slot (t, k), and the magnitudes of its sums for the error bound.
  std::vector<double> a_ref(static_cast<size_t>(S) * I), a_tol(static_cast<size_t>(S) * I);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < top_k; ++k) {
      const int e = ids[t * top_k + k];
      for (int j = 0; j < I; ++j) {
        double gs = m.gu_bias[static_cast<size_t>(e) * 2 * I + j];
        double us = m.gu_bias[static_cast<size_t>(e) * 2 * I + I + j];
        double gm = std::fabs(gs), um = std::fabs(us);
        const float* wg = m.gu_w.data() + (static_cast<size_t>(e) * 2 * I + 2 * j) * H;
        const float* wu = wg + H;  // checkpoint rows 2 j (gate) and 2 j + 1 (up)
        for (int c = 0; c < H; ++c) {
          const double xv = Bf16ToF32(x[static_cast<size_t>(t) * H + c]);
          gs += xv * wg[c];
          us += xv * wu[c];
          gm += std::fabs(xv * wg[c]);
          um += std::fabs(xv * wu[c]);
        }
        const double ref = GateAct(gs, us, limit, alpha);
        const size_t i = static_cast<size_t>(t * top_k + k) * I + j;
        a_ref[i] = ref;
        // bf16 rounding of the result, and the fp32 sums' rounding (about 2^-24 per term, in
        // another order; 3e-5 of the sum of |terms| leaves room for a k of a few thousand) through
        // the gate's slopes. A wrong fragment, scale group or row misses by a sizable fraction
        // of the terms.
        a_tol[i] = 8e-3 * std::fabs(ref) + 1e-3 +
                   3e-5 * (gm * (std::fabs(us) + 1.0) + um * (std::fabs(gs) + 1.0));
      }
    }
  }
  for (const int tile_rows : tile_rows_list) {
    INFO("tile rows " << tile_rows);
    REQUIRE(cuda::MoeMxfp4TileRowsOk(tile_rows));
    DeviceAllocs d;
    const int max_tiles = cuda::MoeMaxTiles(S, E, 0, tile_rows);
    cuda::MoePermuteArgs pa;
    pa.topk_ids = d.Up(ids);
    pa.num_slots = S;
    pa.num_experts = E;
    pa.top_k = top_k;
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
    // Outputs pre-filled with NaN bits: a slot or column the kernels never write fails.
    uint16_t* act = d.Up(std::vector<uint16_t>(static_cast<size_t>(S) * I, 0x7fc0));
    uint16_t* y = d.Up(std::vector<uint16_t>(static_cast<size_t>(S) * H, 0x7fc0));
    cuda::MoeGemmArgs g;
    g.x = d.Up(x);
    g.sorted_token = sorted;
    g.w = m.gu;
    g.mx_scales = m.gu_s;
    g.mx_k_pad = cuda::MoeMxfp4KPad(H);
    g.silu_mul = true;
    g.bias = m.d_gu_bias;
    g.swiglu_limit = limit;
    g.swiglu_alpha = alpha;
    g.n_out = I;
    g.k = H;
    g.tiles = tiles;
    g.num_tiles = num_tiles;
    g.max_tiles = max_tiles;
    g.tile_rows = tile_rows;
    g.out = act;
    const bool gemv = gemv_rows >= 0;
    g.gemv_max_rows = gemv ? gemv_rows : 0;
    g.gemv_split_k = gemv_split_k;
    REQUIRE((gemv ? cuda::LaunchMoeGemv(g, nullptr) : cuda::LaunchMoeGemmMxfp4(g, nullptr)));
    g.x = act;
    g.sorted_token = nullptr;
    g.w = m.dn;
    g.mx_scales = m.dn_s;
    g.mx_k_pad = cuda::MoeMxfp4KPad(I);
    g.silu_mul = false;
    g.bias = m.d_dn_bias;
    g.n_out = H;
    g.k = I;
    g.out = y;
    std::vector<float> topk_w(S);
    std::uniform_real_distribution<float> uw(0.1f, 1.0f);
    std::mt19937 wrng(static_cast<uint32_t>(S * 31 + tile_rows));
    for (float& v : topk_w) v = uw(wrng);
    uint16_t* combined = d.Up(std::vector<uint16_t>(static_cast<size_t>(T) * H, 0x7fc0));
    uint16_t* combined_ref = d.Up(std::vector<uint16_t>(static_cast<size_t>(T) * H, 0x7fc0));
    uint32_t* tickets = d.Up(std::vector<uint32_t>(cuda::MoeCombineTickets(H), 0));
    if (gemv) {
      g.combine.slot_of = slot_of;
      g.combine.topk_w = d.Up(topk_w);
      g.combine.num_tokens = T;
      g.combine.top_k = top_k;
      g.combine.tickets = tickets;
      g.combine.out = combined;
      g.tiles_before_wait = true;  // as the layer: the tiles were complete before gate_up
      REQUIRE(cuda::LaunchMoeGemv(g, nullptr));
      cuda::LaunchMoeCombine(y, slot_of, g.combine.topk_w, nullptr, T, top_k, H, combined_ref,
                             nullptr);
    } else {
      REQUIRE(cuda::LaunchMoeGemmMxfp4(g, nullptr));
    }
    CUDA_REQUIRE(cudaDeviceSynchronize());
    if (gemv) {
      const auto got = Download(combined, static_cast<size_t>(T) * H);
      const auto want = Download(combined_ref, static_cast<size_t>(T) * H);
      REQUIRE(got == want);
      const auto left = Download(tickets, cuda::MoeCombineTickets(H));
      CHECK(std::all_of(left.begin(), left.end(), [](uint32_t v) { return v == 0; }));
    }
    const auto h_sorted = Download(sorted, S);
    const auto h_slot = Download(slot_of, S);
    const auto h_act = Download(act, static_cast<size_t>(S) * I);
    const auto h_y = Download(y, static_cast<size_t>(S) * H);
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < top_k; ++k) {
        const int slot = h_slot[t * top_k + k], e = ids[t * top_k + k];
        REQUIRE(slot >= 0);
        REQUIRE(slot < S);
        REQUIRE(h_sorted[slot] == t);
        for (int j = 0; j < I; ++j) {
          const size_t i = static_cast<size_t>(t * top_k + k) * I + j;
          const float got = Bf16ToF32(h_act[static_cast<size_t>(slot) * I + j]);
          const double err = std::fabs(got - a_ref[i]);
          worst->gu = std::max(worst->gu, err / (std::fabs(a_ref[i]) + 1e-2));
          INFO("gate_up token " << t << " expert " << e << " j " << j << ": " << got << " vs "
                                << a_ref[i]);
          REQUIRE(err <= a_tol[i]);  // NaN fails too
        }
        for (int n = 0; n < H; ++n) {
          double ys = m.dn_bias[static_cast<size_t>(e) * H + n];
          double mag = std::fabs(ys);
          const float* w = m.dn_w.data() + (static_cast<size_t>(e) * H + n) * I;
          for (int j = 0; j < I; ++j) {
            const double av = Bf16ToF32(h_act[static_cast<size_t>(slot) * I + j]);
            ys += av * w[j];
            mag += std::fabs(av * w[j]);
          }
          const float got = Bf16ToF32(h_y[static_cast<size_t>(slot) * H + n]);
          const double err = std::fabs(got - ys);
          worst->dn = std::max(worst->dn, err / (mag + 1e-6));
          INFO("down token " << t << " expert " << e << " n " << n << ": " << got << " vs " << ys);
          REQUIRE(err <= 8e-3 * std::fabs(ys) + 3e-5 * mag + 1e-6);
        }
      }
    }
  }
}

// gpt-oss's expert GEMMs on random MXFP4 experts: E experts, hidden H (not a multiple of 128),
// expert intermediate I, T tokens routed top-k by random ids through the permutation kernel,
// through every tile size (MoeMxfp4TileRows picks one of them per T).
TEST_CASE("MXFP4 expert GEMMs match the dequantized experts (gate_up with SwiGLU, down)",
          "[gpu][moe][mxfp4]") {
  GPU_TEST_RNG(rng);
  const int E = 8, H = 192, I = 128, top_k = 2;
  DeviceAllocs d;
  const RandomMxfp4Experts m = MakeRandomExperts(E, H, I, 118, 124, rng, &d);
  std::uniform_int_distribution<int> expert(0, E - 1);
  std::normal_distribution<float> nd(0.f, 1.f);
  Worst worst;
  for (const int T : {1, 5, 33, 130}) {
    INFO("T " << T);
    std::vector<uint16_t> x(static_cast<size_t>(T) * H);
    for (auto& v : x) v = F32ToBf16(nd(rng));
    std::vector<int32_t> ids(T * top_k);
    for (int t = 0; t < T; ++t) {  // distinct experts per token
      for (int k = 0; k < top_k; ++k) {
        int e;
        do {
          e = expert(rng);
        } while (std::find(ids.begin() + t * top_k, ids.begin() + t * top_k + k, e) !=
                 ids.begin() + t * top_k + k);
        ids[t * top_k + k] = e;
      }
    }
    CheckRouting(m, x, ids, T, top_k, 7.0f, 1.702f, {16, 32, 64}, &worst);
  }
  std::printf("mxfp4: worst gate_up error %.2e (relative), down %.2e (of the sum of |terms|)\n",
              worst.gu, worst.dn);
}

// Top-1 tokens over 4 experts holding R, (R + 1) / 2, 0 and 1 of them, shuffled: *ids, and the
// tokens' random rows of H values, *x. Returns the token count.
int SkewedTokens(int R, int H, std::mt19937& rng, std::vector<int32_t>* ids,
                 std::vector<uint16_t>* x) {
  std::normal_distribution<float> nd(0.f, 1.f);
  ids->clear();
  const int counts[4] = {R, (R + 1) / 2, 0, 1};
  for (int e = 0; e < 4; ++e) ids->insert(ids->end(), counts[e], e);
  std::shuffle(ids->begin(), ids->end(), rng);
  const int T = static_cast<int>(ids->size());  // top-1: one slot per token
  x->resize(static_cast<size_t>(T) * H);
  for (auto& v : *x) v = F32ToBf16(nd(rng));
  return T;
}

// Experts of exactly R rows for R from 1 (decode) to 200 (several 64-row tiles, the last one
// partly filled), beside experts of (R + 1) / 2 rows, one row and none, through every tile size:
// every n8 block count, idle n8 blocks of a tile, and tiles cut from one expert. H 1216 and I 800
// give k extents of 10 and 7 stages (the 8- and 4-stage pipelines wrap), k tails inside a stage,
// and weight rows (1600 gate_up, 1216 down) that leave a CTA of 128 rows half empty. Odd R use the
// clamped SwiGLU, even R plain SiLU.
TEST_CASE("MXFP4 expert GEMMs at 1 to 200 rows per expert, every tile size", "[gpu][moe][mxfp4]") {
  GPU_TEST_RNG(rng);
  const int E = 4, H = 1216, I = 800;
  DeviceAllocs d;
  const RandomMxfp4Experts m = MakeRandomExperts(E, H, I, 116, 122, rng, &d);
  Worst worst;
  for (const int R : {1, 2, 3, 7, 8, 9, 16, 33, 64, 200}) {
    INFO("rows per expert " << R);
    std::vector<int32_t> ids;
    std::vector<uint16_t> x;
    const int T = SkewedTokens(R, H, rng, &ids, &x);
    CheckRouting(m, x, ids, T, 1, R % 2 ? 7.0f : 0.0f, 1.702f, {16, 32, 64}, &worst);
  }
  std::printf("mxfp4 rows sweep: worst gate_up error %.2e (relative), down %.2e\n", worst.gu,
              worst.dn);
}

// The GEMV path (LaunchMoeGemv) on the same experts and reference: 1 to 16 rows per expert (the
// decode batches MoeGemvBatchOk admits) beside experts of half as many rows, one and none, with
// gather, biases and the clamped SwiGLU (odd R) or SiLU (even R), and its down GEMM's combine;
// gemv_max_rows at the true bound and at 1 (passes of 8 tokens, one n8 block: a 16-row tile in
// two passes, each reading the weights again; the result must not change); also 33 rows cut into
// 16-row tiles. H 1216 and I 800: k of 10 and 7 slices of 128, the last partly padding (lanes
// past k load nothing), n_out 800 and 1216 (not multiples of 64: CTAs of 8 columns, combine
// blocks of 32). Each with k split over the default number of warps per CTA, over 1, 2 and 4.
TEST_CASE("MXFP4 GEMV at 1 to 16 rows per expert, with the combine", "[gpu][moe][mxfp4]") {
  GPU_TEST_RNG(rng);
  const int E = 4, H = 1216, I = 800;
  REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kMxfp4, I, H));
  REQUIRE(cuda::MoeGemvShapeOk(cuda::MoeGemvWeights::kMxfp4, H, I));
  DeviceAllocs d;
  const RandomMxfp4Experts m = MakeRandomExperts(E, H, I, 116, 122, rng, &d);
  std::normal_distribution<float> nd(0.f, 1.f);
  Worst worst;
  for (const int R : {1, 2, 3, 4, 5, 8, 16, 33}) {
    for (const int bound : {R, 1}) {
      for (const int split : {0, 1, 2, 4}) {  // the default, then 1, 2 and 4 warps splitting k
        INFO("rows per expert " << R << ", gemv_max_rows " << bound << ", split_k " << split);
        std::vector<int32_t> ids;
        std::vector<uint16_t> x;
        const int T = SkewedTokens(R, H, rng, &ids, &x);
        CheckRouting(m, x, ids, T, 1, R % 2 ? 7.0f : 0.0f, 1.702f, {16}, &worst, bound, split);
      }
    }
  }
  // gpt-oss's routing shape: 8 experts top-4 over 1 to 16 tokens, distinct per token.
  const RandomMxfp4Experts m2 = MakeRandomExperts(8, 192, 128, 118, 124, rng, &d);
  std::uniform_int_distribution<int> expert(0, 7);
  for (const int T : {1, 2, 5, 8}) {
    INFO("top-4 of 8, T " << T);
    const int top_k = 4;
    REQUIRE(cuda::MoeGemvBatchOk(T, top_k, 8));
    std::vector<uint16_t> x(static_cast<size_t>(T) * 192);
    for (auto& v : x) v = F32ToBf16(nd(rng));
    std::vector<int32_t> ids(T * top_k);
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < top_k; ++k) {
        int e;
        do {
          e = expert(rng);
        } while (std::find(ids.begin() + t * top_k, ids.begin() + t * top_k + k, e) !=
                 ids.begin() + t * top_k + k);
        ids[t * top_k + k] = e;
      }
    }
    CheckRouting(m2, x, ids, T, top_k, 7.0f, 1.702f, {16}, &worst, T);
  }
  std::printf("mxfp4 GEMV: worst gate_up error %.2e (relative), down %.2e\n", worst.gu, worst.dn);
}

}  // namespace
}  // namespace llm
