// The cuda_fmha attention backend through the backend interface (AttentionParams), against the
// CPU oracle (CpuPagedAttention) on the same bf16 values: ALiBi slopes, alone and with a
// soft-cap, sink logits and a window, over a paged batch of decode rows and a prefill chunk.
// (The kernel's own tests cover the math shape by shape; this checks what reaches it from a model.)
//
//   build/.../tests/gpu_tests "[fmha_backend]"
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "kernels/attention_backend.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_paged_attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace llm {
namespace {

using cuda::Download;
using cuda::Upload;

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = F32ToBf16(v[i]);
  return b;
}

// Random values that bf16 holds exactly.
std::vector<float> RandomBf16Values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = Bf16ToF32(F32ToBf16(nd(rng)));
  return v;
}

struct Modifiers {
  bool alibi = false, softcap = false, sinks = false;
  int window_left = -1;
};

TEST_CASE("cuda_fmha backend applies ALiBi slopes from AttentionParams like the CPU oracle",
          "[gpu][fmha_backend]") {
  GPU_TEST_RNG(rng);
  int dev = 0;
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
  REQUIRE(cudaGetDeviceProperties(&prop, dev) == cudaSuccess);
  const int hq = 8, hkv = 2, d = 128, bs = 16;
  const std::vector<Modifiers> cases = {{true, false, false, -1},
                                        {true, true, false, -1},
                                        {true, false, true, 24},
                                        {false, false, false, -1}};
  for (const Modifiers& m : cases) {
    INFO("alibi " << m.alibi << " softcap " << m.softcap << " sinks " << m.sinks << " window "
                  << m.window_left);
    AttentionSpec spec;
    spec.device = DeviceKind::kCuda;
    spec.device_arch = prop.major * 10 + prop.minor;
    spec.kv_dtype = DType::kBF16;
    spec.num_q_heads = hq;
    spec.num_kv_heads = hkv;
    spec.head_dim = d;
    spec.block_size = bs;
    spec.features = kFeatureCausal | (m.alibi ? kFeatureAlibi : 0u) |
                    (m.softcap ? kFeatureSoftCap : 0u) | (m.sinks ? kFeatureSinks : 0u) |
                    (m.window_left >= 0 ? kFeatureSlidingWindow : 0u);
    std::string table;
    auto be = BackendRegistry::Global().Create(spec, "cuda_fmha", &table);
    INFO(table);
    REQUIRE(be.ok());
    AttentionBackend& backend = *be.value();
    backend.set_stream(nullptr);

    // Three decode rows at different lengths and one prefill chunk of 23 rows after 50 cached.
    int num_blocks = 0;
    const AttentionBatch b =
        cuda::ShuffledPagedBatch({{1, 97}, {1, 5}, {1, 160}, {23, 73}}, bs, 3, rng, &num_blocks);
    const size_t cache_elems = static_cast<size_t>(num_blocks) * hkv * bs * d;
    std::vector<float> k_cache = RandomBf16Values(cache_elems, rng);  // the cached prefixes
    std::vector<float> v_cache = RandomBf16Values(cache_elems, rng);
    const size_t T = b.num_tokens;
    const std::vector<float> q = RandomBf16Values(T * hq * d, rng);
    const std::vector<float> k_new = RandomBf16Values(T * hkv * d, rng);
    const std::vector<float> v_new = RandomBf16Values(T * hkv * d, rng);
    std::vector<float> slopes(hq), sinks(hq);
    for (int h = 0; h < hq; ++h) {
      slopes[h] = std::exp2(-8.0f * (h + 1) / hq);  // BLOOM's, 0.5 .. 2^-8
      sinks[h] = 0.5f * static_cast<float>(h % 3);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float cap = m.softcap ? 2.0f : 0.0f;

    uint16_t* dq = Upload(ToBf16(q));
    uint16_t* dk_new = Upload(ToBf16(k_new));
    uint16_t* dv_new = Upload(ToBf16(v_new));
    uint16_t* dk = Upload(ToBf16(k_cache));
    uint16_t* dv = Upload(ToBf16(v_cache));
    uint16_t* dout = Upload(std::vector<uint16_t>(T * hq * d, 0));
    float* dslopes = Upload(slopes);
    float* dsinks = Upload(sinks);
    REQUIRE(backend.Plan(b).ok());
    AttentionParams p;
    p.q = dq;
    p.k_new = dk_new;
    p.v_new = dv_new;
    p.out = dout;
    p.cache.k = dk;
    p.cache.v = dv;
    p.softmax_scale = scale;
    p.window_left = m.window_left;
    p.logit_softcap = cap;
    p.sink_logits = m.sinks ? dsinks : nullptr;
    p.alibi_slopes = m.alibi ? dslopes : nullptr;
    REQUIRE(backend.Run(p).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<uint16_t> got = Download(dout, T * hq * d);

    const PagedAttentionShape shape{hq, hkv, d, bs};
    CpuAppendKv(shape, b, k_new.data(), v_new.data(), k_cache.data(), v_cache.data());
    std::vector<float> ref(T * hq * d);
    CpuPagedAttention(shape, b, q.data(), k_cache.data(), v_cache.data(), scale, ref.data(),
                      m.window_left, cap, m.sinks ? sinks.data() : nullptr,
                      m.alibi ? slopes.data() : nullptr);
    std::vector<float> plain(T * hq * d);  // the same without the modifiers
    CpuPagedAttention(shape, b, q.data(), k_cache.data(), v_cache.data(), scale, plain.data(),
                      m.window_left);
    double worst = 0, moved = 0;
    for (size_t r = 0; r < T * hq; ++r) {
      double d2 = 0, r2 = 0, m2 = 0;
      for (int i = 0; i < d; ++i) {
        const double g = Bf16ToF32(got[r * d + i]), x = ref[r * d + i];
        d2 += (g - x) * (g - x);
        r2 += x * x;
        m2 += (plain[r * d + i] - x) * (plain[r * d + i] - x);
      }
      worst = std::max(worst, std::sqrt(d2 / std::max(r2, 1e-30)));
      moved = std::max(moved, std::sqrt(m2 / std::max(r2, 1e-30)));
    }
    INFO("worst row relative error " << worst << ", modifiers moved a row by up to " << moved);
    // bf16 output and bf16 probabilities in the kernel: well under 2% per row.
    CHECK(worst < 0.02);
    if (m.alibi || m.softcap || m.sinks) CHECK(moved > 0.1);  // the modifiers mattered
    for (void* ptr : std::vector<void*>{dq, dk_new, dv_new, dk, dv, dout, dslopes, dsinks}) {
      cudaFree(ptr);
    }
  }
}

}  // namespace
}  // namespace llm
