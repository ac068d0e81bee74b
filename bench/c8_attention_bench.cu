// C8 attention kernel benchmark on the GPU (not a test). Prints effective bandwidth / TFLOP/s and
// the ratio to the measured device copy bandwidth (the decode roofline).
//
//   build/cuda/bench/c8_attention_bench [--iters 50] [--layers 8] [--only SUBSTRING] [--sweep 1]
//       [--stages N] [--stage-sweep 1] [--int8-batches B1,B2,... [--ctx L]] [--probe 1]
//
// --int8-batches: only int8/head decode cases of those batch sizes at context --ctx (default
// 1,500): how the time grows with the number of CTA waves (8 KV heads per sequence).
//
// Two times per case: one graph replay of a single attention call (what a lone call costs,
// launch included), and the per-call time inside a graph of --layers calls over distinct caches,
// as a model's decode step runs them (launch amortized; each layer's cache is cold in L2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/bench_check.h"
#include "bench/int_list.h"
#include "kernels/cuda/c8/c8_attention.h"

namespace {

using llm::cuda::CacheType;
using llm::cuda::ScaleMode;

int g_iters = 50;
int g_layers = 8;
std::string g_only;
bool g_sweep = false;
int g_stages = 0;            // --stages N: decode ring depth forced on the plan (0: the planner's)
bool g_stage_sweep = false;  // --stage-sweep 1: every decode case at ring depths 2, 3 and 4
bool g_probe = false;        // --probe 1: a read-only stream of the same pages
std::vector<int> g_int8_batches;  // --int8-batches: int8/head decode at these batch sizes only
int g_ctx = 1500;                 // --ctx: their context length

// Fills device memory with non-zero random bytes that are valid finite values for every cache
// type (bf16 in [-2, 2], int8 in [-100, 100], fp8 bytes with the exponent kept small).
__global__ void FillKernel(uint8_t* p, size_t n, uint32_t seed, int mode) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    if (mode == 0) {  // bf16 pairs: sign | exponent 126..127 | random mantissa
      p[i] = (i & 1) ? static_cast<uint8_t>((x & 0x80) | 0x3f) : static_cast<uint8_t>(x);
    } else if (mode == 1) {
      p[i] = static_cast<uint8_t>(static_cast<int8_t>((x % 201) - 100));
    } else {
      p[i] = static_cast<uint8_t>((x & 0x80) | (x & 0x3f));  // e4m3 with exponent <= 7
    }
  }
}

void Fill(void* p, size_t bytes, int mode, uint32_t seed) {
  FillKernel<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, seed, mode);
  CK(cudaGetLastError());
}

template <typename F>
float MedianMs(F&& f, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < g_iters; ++i) {
    CK(cudaEventRecord(a, stream));
    f();
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double CopyBandwidth() {
  const size_t bytes = 2ull << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  Fill(a, bytes, 1, 1);
  const float ms = MedianMs([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e12;  // read + write, TB/s
}

// --probe 1: the ceiling for the decode case's bytes. One CTA per (sequence, KV head) reads its
// K and V pages (each page's head slice is block_size x head_dim contiguous bytes) through the
// same shuffled block table with no compute; each thread keeps kLoads 16-byte loads in flight.
template <int kLoads, bool kStreaming = true>
__global__ void StreamPagesKernel(const uint4* k, const uint4* v, const int32_t* pages,
                                  int blocks_per_seq, int kv_heads, int chunk16, uint32_t* sink) {
  const int seq = blockIdx.x, head = blockIdx.y;
  uint32_t acc = 0;
  for (int blk = 0; blk < blocks_per_seq; ++blk) {
    const size_t base = (static_cast<size_t>(pages[seq * blocks_per_seq + blk]) * kv_heads + head) *
                        static_cast<size_t>(chunk16);
    for (int i0 = threadIdx.x; i0 < chunk16; i0 += blockDim.x * kLoads) {
      uint4 a[kLoads], b[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int i = i0 + u * blockDim.x;
        if (i < chunk16) {
          a[u] = kStreaming ? __ldcs(k + base + i) : __ldg(k + base + i);
          b[u] = kStreaming ? __ldcs(v + base + i) : __ldg(v + base + i);
        } else {
          a[u] = b[u] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) acc ^= a[u].x ^ a[u].w ^ b[u].y ^ b[u].z;
    }
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
}

struct Result {
  std::string name;
  float us_single;  // one call per graph replay
  float us;         // per call in a graph of g_layers calls
  double tbps;      // effective KV bytes / time
  double tflops;
};

// chunk > 0: every decode sequence split into KV chunks of that many tokens (the planner's choice
// otherwise).
Result RunDecode(const char* name, int batch, int kv_len, int q_len, CacheType cache,
                 ScaleMode scale, int chunk = 0, int stages = g_stages) {
  const int hq = 32, hkv = 8, d = 128, bs = 64;
  const int esize = cache == CacheType::kBf16 ? 2 : 1;
  llm::AttentionBatch b;
  b.num_seqs = batch;
  b.q_indptr.push_back(0);
  b.page_indptr.push_back(0);
  const int blocks_per_seq = (kv_len + bs - 1) / bs;
  const int num_blocks = batch * blocks_per_seq;
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937 rng(5);
  std::shuffle(pool.begin(), pool.end(), rng);  // pages scattered like a real pool
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < blocks_per_seq; ++i) b.page_indices.push_back(pool[s * blocks_per_seq + i]);
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.kv_lens.push_back(kv_len);
    b.q_indptr.push_back(b.q_indptr.back() + q_len);
  }
  b.num_tokens = b.q_indptr.back();
  const size_t cache_bytes = static_cast<size_t>(num_blocks) * hkv * bs * d * esize;
  void *kc, *vc, *q, *out;
  float *ks = nullptr, *vs = nullptr;
  const size_t layers = static_cast<size_t>(g_layers);
  CK(cudaMalloc(&kc, cache_bytes * layers));
  CK(cudaMalloc(&vc, cache_bytes * layers));
  CK(cudaMalloc(&q, static_cast<size_t>(b.num_tokens) * hq * d * 2));
  CK(cudaMalloc(&out, static_cast<size_t>(b.num_tokens) * hq * d * 2));
  const int mode = cache == CacheType::kBf16 ? 0 : cache == CacheType::kInt8 ? 1 : 2;
  Fill(kc, cache_bytes * layers, mode, 2);
  Fill(vc, cache_bytes * layers, mode, 3);
  Fill(q, static_cast<size_t>(b.num_tokens) * hq * d * 2, 0, 4);
  size_t scale_n = 0;
  if (scale == ScaleMode::kPerHead) scale_n = hkv;
  if (scale == ScaleMode::kPerChannel) scale_n = hkv * d;
  if (scale == ScaleMode::kPerToken) scale_n = static_cast<size_t>(num_blocks) * hkv * bs;
  if (scale_n) {
    std::vector<float> ones(scale_n, 0.01f);
    CK(cudaMalloc(&ks, scale_n * 4));
    CK(cudaMalloc(&vs, scale_n * 4));
    CK(cudaMemcpy(ks, ones.data(), scale_n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(vs, ones.data(), scale_n * 4, cudaMemcpyHostToDevice));
  }
  llm::cuda::C8Shape shape{hq, hkv, d, bs, cache, scale};
  llm::cuda::C8Attention attn(shape);
  llm::cuda::C8PlanConfig pc = attn.plan_config();
  if (stages > 0) {
    pc.decode_stages = stages;
    pc.ctas_per_sm = attn.decode_ctas_per_sm(stages);
  }
  if (chunk > 0) {
    pc.force_split = true;
    pc.min_chunk_tokens = chunk;
  }
  const auto plan = llm::cuda::BuildC8Plan(shape, b, pc);
  std::printf("  [%s] decode items %zu, prefill items %zu, partials %d, ctas/sm %d, stages %d\n",
              name, plan.decode_items.size(), plan.prefill_items.size(), plan.num_partials,
              pc.ctas_per_sm, plan.decode_stages);
  if (!attn.Upload(b, plan, nullptr).ok()) std::exit(1);
  llm::cuda::C8Attention::LayerArgs la;
  la.q = q;
  la.out = out;
  la.k_cache = kc;
  la.v_cache = vc;
  la.k_scale = ks;
  la.v_scale = vs;
  la.softmax_scale = 1.0f / std::sqrt(128.0f);
  // Decode steps run as CUDA graphs in production: time graph replays, so launch gaps between
  // the tile and merge kernels are not counted as kernel time.
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  auto time_graph = [&](int calls) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < calls; ++l) {
      la.k_cache = static_cast<uint8_t*>(kc) + l * cache_bytes;
      la.v_cache = static_cast<uint8_t*>(vc) + l * cache_bytes;
      if (!attn.Attend(la, stream).ok()) std::exit(1);
    }
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const float ms = MedianMs([&] { CK(cudaGraphLaunch(exec, stream)); }, stream);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return ms / calls;
  };
  const float ms_single = time_graph(1);
  const float ms = time_graph(g_layers);
  if (g_probe && q_len == 1) {
    int32_t* d_pages;
    uint32_t* sink;
    CK(cudaMalloc(&d_pages, b.page_indices.size() * 4));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemcpy(d_pages, b.page_indices.data(), b.page_indices.size() * 4,
                  cudaMemcpyHostToDevice));
    const int chunk16 = bs * d * esize / 16;
    const double bytes = 2.0 * batch * blocks_per_seq * hkv * bs * d * esize;
    for (int threads : {128, 256}) {
      auto run = [&](auto loads_tag, auto streaming_tag) {
        constexpr int kLoads = decltype(loads_tag)::value;
        constexpr bool kStreaming = decltype(streaming_tag)::value;
        const float pms = MedianMs([&] {
          for (int l = 0; l < g_layers; ++l) {
            StreamPagesKernel<kLoads, kStreaming><<<dim3(batch, hkv), threads>>>(
                reinterpret_cast<const uint4*>(static_cast<uint8_t*>(kc) + l * cache_bytes),
                reinterpret_cast<const uint4*>(static_cast<uint8_t*>(vc) + l * cache_bytes),
                d_pages, blocks_per_seq, hkv, chunk16, sink);
          }
        });
        std::printf("  [%s] probe %d threads x %d %s loads: %.1f us per layer, %.2f TB/s\n", name,
                    threads, kLoads, kStreaming ? "streaming" : "cached", pms * 1000.f / g_layers,
                    bytes / (pms * 1e-3 / g_layers) / 1e12);
      };
      run(std::integral_constant<int, 2>{}, std::true_type{});
      run(std::integral_constant<int, 4>{}, std::true_type{});
      run(std::integral_constant<int, 2>{}, std::false_type{});
    }
    CK(cudaFree(d_pages));
    CK(cudaFree(sink));
  }
  CK(cudaStreamDestroy(stream));
  CK(cudaDeviceSynchronize());
  double kv_bytes = 2.0 * batch * kv_len * hkv * d * esize;
  if (scale == ScaleMode::kPerToken) kv_bytes += 2.0 * batch * kv_len * hkv * 4;
  // Causal FLOPs: QK^T and PV over the visible keys.
  double pairs = 0;
  for (int t = 0; t < q_len; ++t) pairs += kv_len - q_len + t + 1;
  const double flops = 4.0 * batch * hq * d * pairs;
  CK(cudaFree(kc));
  CK(cudaFree(vc));
  CK(cudaFree(q));
  CK(cudaFree(out));
  if (ks) CK(cudaFree(ks));
  if (vs) CK(cudaFree(vs));
  return {name, ms_single * 1000.f, ms * 1000.f, kv_bytes / (ms * 1e-3) / 1e12,
          flops / (ms * 1e-3) / 1e12};
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") g_iters = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--layers") g_layers = std::max(1, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--only") g_only = argv[i + 1];
    if (std::string(argv[i]) == "--sweep") g_sweep = std::atoi(argv[i + 1]) != 0;
    if (std::string(argv[i]) == "--stages") g_stages = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--stage-sweep") g_stage_sweep = std::atoi(argv[i + 1]) != 0;
    if (std::string(argv[i]) == "--probe") g_probe = std::atoi(argv[i + 1]) != 0;
    if (std::string(argv[i]) == "--ctx") g_ctx = std::max(1, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--int8-batches") {
      g_int8_batches = bench::ParseIntList(argv[i + 1]);
    }
  }
  if (llm::cuda::CudaDeviceCount() == 0) {
    std::printf("no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_tbps = CopyBandwidth();
  std::printf("device: %s, %d SMs; device-to-device copy %.2f TB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, copy_tbps);
  struct Case {
    const char* name;
    int batch, kv_len, q_len;
    CacheType cache;
    ScaleMode scale;
  };
  const Case cases[] = {
      {"bf16 decode 64x4096", 64, 4096, 1, CacheType::kBf16, ScaleMode::kNone},
      {"int8/head decode 64x4096", 64, 4096, 1, CacheType::kInt8, ScaleMode::kPerHead},
      {"int8/chan decode 64x4096", 64, 4096, 1, CacheType::kInt8, ScaleMode::kPerChannel},
      {"fp8/head decode 64x4096", 64, 4096, 1, CacheType::kFp8E4M3, ScaleMode::kPerHead},
      {"fp8/token decode 64x4096", 64, 4096, 1, CacheType::kFp8E4M3, ScaleMode::kPerToken},
      {"int8/head decode 256x1500", 256, 1500, 1, CacheType::kInt8, ScaleMode::kPerHead},
      {"bf16 decode 1x4096", 1, 4096, 1, CacheType::kBf16, ScaleMode::kNone},
      {"bf16 decode 8x4096", 8, 4096, 1, CacheType::kBf16, ScaleMode::kNone},
      {"int8/head decode 1x4096", 1, 4096, 1, CacheType::kInt8, ScaleMode::kPerHead},
      {"bf16 decode 32x16384", 32, 16384, 1, CacheType::kBf16, ScaleMode::kNone},
      {"bf16 4-token decode 64x4096", 64, 4096, 4, CacheType::kBf16, ScaleMode::kNone},
      {"bf16 prefill 1x4096 causal", 1, 4096, 4096, CacheType::kBf16, ScaleMode::kNone},
      {"bf16 prefill 4x4096 causal", 4, 4096, 4096, CacheType::kBf16, ScaleMode::kNone},
  };
  std::vector<Result> rs;
  for (int b : g_int8_batches) {
    if (b < 1) continue;
    const std::string name = "int8/head decode " + std::to_string(b) + "x" + std::to_string(g_ctx);
    rs.push_back(RunDecode(name.c_str(), b, g_ctx, 1, CacheType::kInt8, ScaleMode::kPerHead));
  }
  for (const Case& c : cases) {
    if (!g_int8_batches.empty()) break;
    if (!g_only.empty() && std::string(c.name).find(g_only) == std::string::npos) continue;
    rs.push_back(RunDecode(c.name, c.batch, c.kv_len, c.q_len, c.cache, c.scale));
    if (g_stage_sweep && c.q_len <= 4) {
      for (int st : {2, 3, 4}) {
        const std::string name = std::string(c.name) + " ring " + std::to_string(st);
        rs.push_back(RunDecode(name.c_str(), c.batch, c.kv_len, c.q_len, c.cache, c.scale, 0, st));
      }
    }
    // --sweep 1: the same decode case at forced split counts, to fit the planner's cost model.
    if (g_sweep && c.q_len <= 4) {
      for (int n : {1, 2, 3, 4, 6, 8, 16, 32, 64}) {
        const int chunk = (c.kv_len + n - 1) / n;
        if (chunk < 64 || (c.batch > 1 && n > 8)) continue;
        const std::string name = std::string(c.name) + " split " + std::to_string(n);
        rs.push_back(RunDecode(name.c_str(), c.batch, c.kv_len, c.q_len, c.cache, c.scale,
                               (chunk + 63) / 64 * 64));
      }
    }
  }
  std::printf(
      "\n| case | 1 call (us) | per call, %d-layer graph (us) | KV TB/s | of copy BW | TFLOP/s "
      "|\n|---|---|---|---|---|---|\n",
      g_layers);
  const Result* bf16 = nullptr;
  const Result* int8 = nullptr;
  for (const Result& r : rs) {
    std::printf("| %s | %.1f | %.1f | %.2f | %.0f%% | %.1f |\n", r.name.c_str(), r.us_single, r.us,
                r.tbps, 100.0 * r.tbps / copy_tbps, r.tflops);
    if (r.name == "bf16 decode 64x4096") bf16 = &r;
    if (r.name == "int8/head decode 64x4096") int8 = &r;
  }
  if (bf16 && int8) {
    std::printf("\nint8/head vs bf16 at 64x4096: %.2fx the time\n", int8->us / bf16->us);
  }
  return 0;
}
