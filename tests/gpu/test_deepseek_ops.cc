// The fused MLA input kernel (kernels/cuda/ops/deepseek_ops.h, LaunchMlaRopeNorm) against the
// three launches it replaces (LaunchRmsNormStrided of c_kv, LaunchDeepseekRope of k_pe and of the
// heads' q_pe), bit for bit, on DeepSeek-V2-Lite's layout (q inside the fused projection's rows)
// and V3's (q from its own projection, 128 heads), at decode and prompt-sized token counts; and
// that q itself is left as it was. The absorbed decode's per-head products for a few rows
// (LaunchMlaAbsorbQ / Out) against an fp64 reference.
//
//   build/cuda/tests/gpu_tests "[deepseek_ops]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cuda/ops/deepseek_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm::cuda {
namespace {

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

struct Shape {
  const char* name;
  int heads;
  bool q_in_a;  // V2-Lite: q is the first H * (N + R) columns of the fused projection's rows
};

TEST_CASE("MLA rope + norm in one launch gives the separate launches' bits",
          "[gpu][deepseek_ops]") {
  GPU_TEST_RNG(rng);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int N = 128, R = 64, C = 512;
  for (const Shape sh : {Shape{"v2-lite", 16, true}, Shape{"v3", 128, false}}) {
    const int H = sh.heads, QK = N + R;
    const int QA = sh.q_in_a ? H * QK : 1536;  // V3: the q LoRA's rank
    const int A = QA + C + R;
    const int q_stride = sh.q_in_a ? A : H * QK;
    for (const int T : {1, 5, 67}) {
      INFO(sh.name << ", tokens " << T);
      auto random_bf16 = [&](size_t n) {
        std::vector<uint16_t> v(n);
        for (auto& x : v) x = F32ToBf16(nd(rng));
        return v;
      };
      const std::vector<uint16_t> a_host = random_bf16(static_cast<size_t>(T) * A);
      const std::vector<uint16_t> q_host =
          sh.q_in_a ? std::vector<uint16_t>() : random_bf16(static_cast<size_t>(T) * q_stride);
      std::vector<uint16_t> norm_w = random_bf16(C);
      std::vector<float> inv_freq(R / 2);
      for (int i = 0; i < R / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / R);
      std::vector<int32_t> positions(T);
      std::uniform_int_distribution<int> pos(0, 20000);
      for (auto& p : positions) p = pos(rng);
      DeviceAllocs d;
      uint16_t* a = d.Up(a_host);
      uint16_t* q = sh.q_in_a ? a : d.Up(q_host);
      uint16_t* w = d.Up(norm_w);
      float* freq = d.Up(inv_freq);
      int32_t* d_pos = d.Up(positions);
      const int Lw = C + R;
      const std::vector<uint16_t> garbage(static_cast<size_t>(T) * H * R, 0x7fc0);
      const std::vector<uint16_t> nan_latent(static_cast<size_t>(T) * Lw, 0x7fc0);
      uint16_t* latent[2] = {d.Up(nan_latent), d.Up(nan_latent)};
      uint16_t* q_pe[2] = {d.Up(garbage), d.Up(garbage)};
      DeepseekRopeArgs ra;
      ra.positions = d_pos;
      ra.inv_freq = freq;
      ra.mscale = 1.3f;
      ra.num_tokens = T;
      ra.rope_dim = R;
      // The separate launches, as the decoder made them.
      LaunchRmsNormStrided(a + QA, A, w, T, C, 1e-6f, latent[0], Lw, nullptr);
      DeepseekRopeArgs k = ra;
      k.in = a + QA + C;
      k.in_row = A;
      k.out = latent[0] + C;
      k.out_row = Lw;
      k.num_heads = 1;
      LaunchDeepseekRope(k, nullptr);
      DeepseekRopeArgs qr = ra;
      qr.in = q + N;
      qr.in_row = q_stride;
      qr.in_head = QK;
      qr.out = q_pe[0];
      qr.out_row = static_cast<int64_t>(H) * R;
      qr.out_head = R;
      qr.num_heads = H;
      LaunchDeepseekRope(qr, nullptr);
      // The fused one.
      MlaRopeNormArgs m;
      m.kv = a + QA;
      m.kv_row = A;
      m.kv_norm = w;
      m.kv_rank = C;
      m.eps = 1e-6f;
      m.latent = latent[1];
      m.latent_row = Lw;
      m.q = q;
      m.q_row = q_stride;
      m.q_head = QK;
      m.q_nope = N;
      m.q_pe = q_pe[1];
      m.rope = ra;
      m.rope.num_heads = H;
      LaunchMlaRopeNorm(m, nullptr);
      CUDA_REQUIRE(cudaDeviceSynchronize());
      const size_t nl = static_cast<size_t>(T) * Lw, nq = static_cast<size_t>(T) * H * R;
      const std::vector<uint16_t> l0 = Download(latent[0], nl), l1 = Download(latent[1], nl);
      const std::vector<uint16_t> p0 = Download(q_pe[0], nq), p1 = Download(q_pe[1], nq);
      CHECK(l1 == l0);
      CHECK(p1 == p0);
      // Every value written (no NaN garbage left), and the inputs untouched.
      int nan = 0;
      for (uint16_t v : l1) nan += std::isnan(Bf16ToF32(v));
      for (uint16_t v : p1) nan += std::isnan(Bf16ToF32(v));
      CHECK(nan == 0);
      CHECK(Download(a, a_host.size()) == a_host);
      if (!sh.q_in_a) CHECK(Download(q, q_host.size()) == q_host);
    }
  }
}

// fp64 sums of bf16 products, and the sum of |products| that bounds their fp32 rounding.
struct RefSum {
  double sum = 0, mag = 0;
  void Add(float w, float x) {
    sum += static_cast<double>(w) * x;
    mag += std::fabs(static_cast<double>(w) * x);
  }
};

TEST_CASE("MLA absorb kernels match an fp64 reference (1 to 4 decode rows)",
          "[gpu][deepseek_ops]") {
  GPU_TEST_RNG(rng);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto random_bf16 = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = F32ToBf16(nd(rng));
    return v;
  };
  const int N = 128, V = 128, C = 512;
  {  // refused, nothing launched
    MlaAbsorbArgs bad;
    bad.heads = 16, bad.nope = N, bad.v_dim = V, bad.rank = C;
    bad.rows = kMlaAbsorbMaxRows + 1;
    CHECK_FALSE(LaunchMlaAbsorbQ(bad, nullptr));
    bad.rows = 1;
    bad.rank = 576;  // not whole 256-column blocks
    CHECK_FALSE(LaunchMlaAbsorbOut(bad, nullptr));
  }
  for (const int H : {16, 128}) {
    const int QK = N + 64, q_stride = H * QK + 8;  // q rows with a stride of their own
    const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(H) * (N + V) * C);
    for (int rows = 1; rows <= kMlaAbsorbMaxRows; ++rows) {
      INFO("heads " << H << ", rows " << rows);
      const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(rows) * q_stride);
      const std::vector<uint16_t> lat = random_bf16(static_cast<size_t>(rows) * H * C);
      DeviceAllocs d;
      MlaAbsorbArgs a;
      a.w_kv_b = d.Up(w);
      a.heads = H, a.nope = N, a.v_dim = V, a.rank = C, a.rows = rows;
      a.q = d.Up(q);
      a.q_row = q_stride;
      a.q_head = QK;
      a.q_latent = d.Up(std::vector<uint16_t>(static_cast<size_t>(rows) * H * C, 0x7fc0));
      a.out_latent = d.Up(lat);
      a.attn = d.Up(std::vector<uint16_t>(static_cast<size_t>(rows) * H * V, 0x7fc0));
      REQUIRE(LaunchMlaAbsorbQ(a, nullptr));
      REQUIRE(LaunchMlaAbsorbOut(a, nullptr));
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      const auto ql =
          Download(static_cast<const uint16_t*>(a.q_latent), static_cast<size_t>(rows) * H * C);
      const auto at =
          Download(static_cast<const uint16_t*>(a.attn), static_cast<size_t>(rows) * H * V);
      auto W = [&](int h, int row, int c) {
        return Bf16ToF32(w[(static_cast<size_t>(h) * (N + V) + row) * C + c]);
      };
      int bad = 0;
      auto check = [&](uint16_t got, const RefSum& ref) {
        // bf16 rounding of the result plus fp32 rounding of the sum.
        const double err = std::fabs(Bf16ToF32(got) - ref.sum);
        if (!(err <= std::fabs(ref.sum) / 256 + 1e-5 * ref.mag)) ++bad;
      };
      for (int r = 0; r < rows; ++r) {
        for (int h = 0; h < H; ++h) {
          for (int c = 0; c < C; ++c) {
            RefSum ref;
            for (int n = 0; n < N; ++n) {
              ref.Add(W(h, n, c), Bf16ToF32(q[static_cast<size_t>(r) * q_stride + h * QK + n]));
            }
            check(ql[(static_cast<size_t>(r) * H + h) * C + c], ref);
          }
          for (int v = 0; v < V; ++v) {
            RefSum ref;
            for (int c = 0; c < C; ++c) {
              ref.Add(W(h, N + v, c), Bf16ToF32(lat[(static_cast<size_t>(r) * H + h) * C + c]));
            }
            check(at[(static_cast<size_t>(r) * H + h) * V + v], ref);
          }
        }
      }
      CHECK(bad == 0);
    }
  }
}

}  // namespace
}  // namespace llm::cuda
