// MLA decode benchmark (attention only; the cache already holds the step's rows): CUDA events,
// median of N timed samples after warm-up, random data, and several independent copies of small
// problems rotated so the L2 (tens of MB) does not serve them.
//
// Shapes (DeepSeek latent 512 + rope 64, block size 64, one query token per sequence):
//   128 heads x batch 128 x 4096 tokens: compute-bound, TFLOP/s with FLOPs = b h L (576 + 512) 2
//   16 heads x batch 128 x 4096 tokens:  memory-bound, cache-read TB/s (b L 576 bytes/element)
//   128 heads x batch 1 x 4096 tokens:   latency (split-KV), microseconds
// each in bf16 and fp8. The floor is max(cache bytes / bandwidth, FLOPs / matrix rate); the
// defaults are the GPU machine's measured copy and bf16 GEMM rates (docs/BENCHMARKS.md); override
// them with --bw-tbps / --tflops for another board. The same-run peer is bench/mla_torch_peer.py
// (plain torch, bf16).
//
// Usage: mla_decode_bench [--iters N] [--bw-tbps X] [--tflops Y] [--only SUBSTRING]
//                         [--sustain SECONDS] [--graph-form 0|1]
// --graph-form 1: every shape also in MlaDecode's graph form (ReserveGraph / UploadGraph with the
//   batch as its bucket: grids of the bucket's capacities, item counts read on the device), as
//   impl=<kernel>_graphform rows beside the eager ones.
// --sustain S: after the samples, replays the shape back to back for about S seconds and adds
//   sustained_us (wall time per call over that span: on a power-capped board a compute-bound row
//   slows once the cap bites), and where NVML can say (bench/gpu_energy.h),
//   mj_per_call and watts.
// Planner overrides for experiments: MLA_BENCH_MIN_CHUNK=tokens, MLA_BENCH_MAX_SPLITS=n,
// MLA_BENCH_FORCE_SPLIT=1 (every item in MLA_BENCH_MIN_CHUNK chunks).
// (--only h16_b128_memory_fp8 runs one shape, e.g. under ncu.) Each sample replays a CUDA graph
// of several steps and reports the time per step.
// The last lines are a table: one "MLA_BENCH" row per shape, space-separated key=value pairs.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/gpu_energy.h"

#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/cuda/mla/mla_decode.h"

using llm::AttentionBatch;
using llm::cuda::MlaCacheType;
using llm::cuda::MlaDecode;

namespace {

__device__ float HashUniform(uint64_t i, uint32_t seed) {  // in [-2, 2)
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) * (4.0f / 16777216.0f) - 2.0f;
}

__global__ void FillBf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(HashUniform(i, seed));
  }
}

__global__ void FillFp8(uint8_t* p, size_t n, uint32_t seed, float inv_scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = __nv_cvt_float_to_fp8(HashUniform(i, seed) * inv_scale, __NV_SATFINITE, __NV_E4M3);
  }
}

struct Shape {
  const char* name;
  int heads, batch, kv_len;
  MlaCacheType cache;
  llm::cuda::MlaKernel kernel = llm::cuda::MlaKernel::kAuto;
  llm::cuda::MlaFp8Math fp8_math = llm::cuda::MlaFp8Math::kAuto;
  llm::cuda::MlaBf16Schedule schedule = llm::cuda::MlaBf16Schedule::kAuto;
};

struct Result {
  std::string name, impl;
  int heads, batch, kv_len;
  const char* cache;
  double median_us, min_us, tflops, cache_tbps, floor_us;
  double sustained_us = -1, mj_per_call = -1, watts = -1;  // --sustain only; -1: not measured
};

Result RunShape(const Shape& s, int iters, double bw_tbps, double peak_tflops, double sustain_s,
                bool graph_form, const bench::GpuEnergy& energy) {
  constexpr int kBs = 64, kL = llm::cuda::kMlaCacheDim, kC = llm::cuda::kMlaLatentDim;
  const bool fp8 = s.cache == MlaCacheType::kFp8E4M3;
  const size_t esize = fp8 ? 1 : 2;
  const int blocks_per_seq = (s.kv_len + kBs - 1) / kBs;
  const size_t cache_bytes_per_copy =
      static_cast<size_t>(s.batch) * blocks_per_seq * kBs * kL * esize;
  // Enough copies that one pass over them is >= 256 MB (several times any L2), at most 16.
  const int copies = static_cast<int>(
      std::min<size_t>(16, std::max<size_t>(1, (256u << 20) / cache_bytes_per_copy + 1)));
  const int T = s.batch;  // one query token per sequence
  const size_t q_elems = static_cast<size_t>(T) * s.heads;

  void *cache, *q_latent, *q_pe, *out;
  const size_t total_cache = cache_bytes_per_copy * copies;
  CK(cudaMalloc(&cache, total_cache));
  CK(cudaMalloc(&q_latent, q_elems * kC * 2 * copies));
  CK(cudaMalloc(&q_pe, q_elems * 64 * 2 * copies));
  CK(cudaMalloc(&out, q_elems * kC * 2 * copies));
  const float cache_scale = 2.0f / 448.0f;
  if (fp8) {
    FillFp8<<<1024, 256>>>(static_cast<uint8_t*>(cache), total_cache, 1, 1.0f / cache_scale);
  } else {
    FillBf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(cache), total_cache / 2, 1);
  }
  FillBf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q_latent), q_elems * kC * copies, 2);
  FillBf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q_pe), q_elems * 64 * copies, 3);
  CK(cudaGetLastError());

  // One MlaDecode (plan + device batch) per copy: copy k uses blocks [k * per_copy, ...).
  std::vector<std::unique_ptr<MlaDecode>> attn;
  int splits = 0;
  for (int k = 0; k < copies; ++k) {
    AttentionBatch b;
    b.num_seqs = s.batch;
    b.num_tokens = T;
    b.q_indptr.push_back(0);
    b.page_indptr.push_back(0);
    for (int i = 0; i < s.batch; ++i) {
      for (int j = 0; j < blocks_per_seq; ++j) {
        b.page_indices.push_back((k * s.batch + i) * blocks_per_seq + j);
      }
      b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
      b.q_indptr.push_back(i + 1);
      b.kv_lens.push_back(s.kv_len);
      const int last = s.kv_len - 1;
      b.slot_mapping.push_back(b.page_indices[b.page_indptr[i] + last / kBs] * kBs + last % kBs);
    }
    attn.push_back(std::make_unique<MlaDecode>(
        llm::cuda::MlaDecodeShape{s.heads, kBs, s.cache, s.kernel, s.fp8_math, s.schedule}));
    if (graph_form) {
      const llm::Status st = attn.back()->ReserveGraph(s.batch, b.page_indices.size());
      if (!st.ok()) {
        std::fprintf(stderr, "reserve: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    }
    llm::cuda::MlaPlanConfig pc =
        graph_form ? attn.back()->GraphPlanConfig(s.batch) : attn.back()->plan_config();
    if (const char* env = std::getenv("MLA_BENCH_MIN_CHUNK")) pc.min_chunk_tokens = std::atoi(env);
    if (const char* env = std::getenv("MLA_BENCH_MAX_SPLITS")) pc.max_splits = std::atoi(env);
    if (const char* env = std::getenv("MLA_BENCH_FORCE_SPLIT"))
      pc.force_split = std::atoi(env) != 0;
    const llm::cuda::MlaPlan plan = llm::cuda::BuildMlaPlan(attn.back()->shape(), b, pc);
    splits = plan.merges.empty() ? 1 : plan.merges[0].num_partials;
    const llm::Status st = graph_form ? attn.back()->UploadGraph(b, plan, s.batch, nullptr)
                                      : attn.back()->Upload(b, plan, nullptr);
    if (!st.ok()) {
      std::fprintf(stderr, "upload: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  // One timed sample = one replay of a CUDA graph holding `reps` steps over the rotated copies
  // (no host launch overhead in the time; this also checks that a step captures).
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto launch_on = [&](int k, cudaStream_t st) {
    MlaDecode::LayerArgs a;
    a.q_latent = static_cast<char*>(q_latent) + q_elems * kC * 2 * k;
    a.q_pe = static_cast<char*>(q_pe) + q_elems * 64 * 2 * k;
    a.out_latent = static_cast<char*>(out) + q_elems * kC * 2 * k;
    a.cache = cache;
    a.cache_scale = cache_scale;
    a.softmax_scale = 0.0721688f;
    const llm::Status st2 = attn[k]->Attend(a, st);
    if (!st2.ok()) {
      std::fprintf(stderr, "attend: %s\n", st2.ToString().c_str());
      std::exit(1);
    }
  };
  for (int i = 0; i < 3; ++i) launch_on(i % copies, stream);
  CK(cudaStreamSynchronize(stream));
  const int reps = std::max(copies, 8);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) launch_on(i % copies, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, stream));  // warm-up
  CK(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(e0, stream));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms[i], e0, e1));
    ms[i] /= reps;
  }
  CK(cudaGetLastError());
  double sustained_us = -1, mj_per_call = -1, watts = -1;
  if (sustain_s > 0) {
    std::vector<float> sorted(ms);
    std::sort(sorted.begin(), sorted.end());
    const double graph_s = std::max(1e-6, sorted[iters / 2] * 1e-3 * reps);
    const int graphs = static_cast<int>(std::min(1e6, std::ceil(sustain_s / graph_s)));
    const long long mj0 = energy.millijoules();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < graphs; ++i) CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const long long mj1 = energy.millijoules();
    const double calls = static_cast<double>(graphs) * reps;
    sustained_us = wall / calls * 1e6;
    if (mj0 >= 0 && mj1 >= 0 && wall >= bench::GpuEnergy::kMinSpanSeconds) {
      mj_per_call = static_cast<double>(mj1 - mj0) / calls;
      watts = static_cast<double>(mj1 - mj0) / 1e3 / wall;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::sort(ms.begin(), ms.end());
  const double med_s = ms[iters / 2] * 1e-3, min_s = ms[0] * 1e-3;
  const double flops = 2.0 * s.batch * s.heads * double(s.kv_len) * (kL + kC);
  const double bytes = double(s.batch) * s.kv_len * kL * esize;
  // Rows of one item: one query token per sequence, at most max_item_rows heads per item.
  const int item_rows = std::min(s.heads, attn[0]->plan_config().max_item_rows);
  const int variant = item_rows > 32 ? 2 : item_rows > 16 ? 1 : 0;
  const char* impl = attn[0]->uses_seesaw(variant)  ? "cuda_mla_seesaw"
                     : attn[0]->uses_wgmma(variant) ? "cuda_mla_wgmma"
                     : !fp8                         ? "cuda_mla_portable"
                     : attn[0]->uses_fp8_mma()      ? "cuda_mla_e4m3"
                                                    : "cuda_mla_f16";
  Result r{s.name,
           std::string(impl) + (graph_form ? "_graphform" : ""),
           s.heads,
           s.batch,
           s.kv_len,
           fp8 ? "fp8" : "bf16",
           med_s * 1e6,
           min_s * 1e6,
           flops / med_s * 1e-12,
           bytes / med_s * 1e-12,
           std::max(bytes / (bw_tbps * 1e12), flops / (peak_tflops * 1e12)) * 1e6,
           sustained_us,
           mj_per_call,
           watts};
  std::printf(
      "%-18s %-17s heads=%3d batch=%3d L=%d %-4s copies=%d splits=%d: median %.1f us (min %.1f)"
      "  %.1f TFLOP/s  %.2f TB/s  floor %.1f us (%.0f%% of floor speed)\n",
      r.name.c_str(), r.impl.c_str(), s.heads, s.batch, s.kv_len, r.cache, copies, splits,
      r.median_us, r.min_us, r.tflops, r.cache_tbps, r.floor_us, 100.0 * r.floor_us / r.median_us);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  attn.clear();
  cudaFree(cache);
  cudaFree(q_latent);
  cudaFree(q_pe);
  cudaFree(out);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 30;
  const char* only = "";
  double bw = 4.3, tflops = 790.0, sustain_s = 0;
  bool graph_form = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) iters = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--bw-tbps")) bw = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tflops")) tflops = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--sustain")) sustain_s = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--graph-form")) graph_form = std::atoi(argv[i + 1]) != 0;
  }
  if (llm::cuda::CudaDeviceCount() == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  using llm::cuda::MlaKernel;
  // kAuto: the sm_90a kernels on sm_90 (every bf16 item; fp8 16- and 32-row items on the
  // transposed one); kPortable rows measure the sm_120 design on the same GPU: f16 MMA for fp8
  // on Hopper, and e4m3 MMA (sm_120's fp8 path) in the kE4m3 rows.
  using llm::cuda::MlaFp8Math;
  constexpr MlaKernel kPortable = MlaKernel::kPortable;
  constexpr MlaKernel kAutoK = MlaKernel::kAuto;
  constexpr MlaFp8Math kAutoM = MlaFp8Math::kAuto;
  // The ring schedule of the bf16 wgmma kernel, next to the default (seesaw) in the same run.
  constexpr llm::cuda::MlaBf16Schedule kRing = llm::cuda::MlaBf16Schedule::kRing;
  const Shape shapes[] = {
      {"h128_b128_compute", 128, 128, 4096, MlaCacheType::kBf16},
      {"h128_b128_compute", 128, 128, 4096, MlaCacheType::kBf16, kAutoK, kAutoM, kRing},
      {"h128_b128_compute", 128, 128, 4096, MlaCacheType::kBf16, MlaKernel::kPortable},
      {"h128_b128_compute", 128, 128, 4096, MlaCacheType::kFp8E4M3},
      {"h128_b128_compute", 128, 128, 4096, MlaCacheType::kFp8E4M3, kPortable, MlaFp8Math::kE4m3},
      {"h16_b128_memory", 16, 128, 4096, MlaCacheType::kBf16},
      {"h16_b128_memory", 16, 128, 4096, MlaCacheType::kBf16, kAutoK, kAutoM, kRing},
      {"h16_b128_memory", 16, 128, 4096, MlaCacheType::kBf16, MlaKernel::kPortable},
      {"h32_b128_memory", 32, 128, 4096, MlaCacheType::kBf16},
      {"h32_b128_memory", 32, 128, 4096, MlaCacheType::kBf16, kAutoK, kAutoM, kRing},
      {"h32_b128_memory", 32, 128, 4096, MlaCacheType::kBf16, MlaKernel::kPortable},
      {"h32_b128_memory", 32, 128, 4096, MlaCacheType::kFp8E4M3},
      {"h32_b128_memory", 32, 128, 4096, MlaCacheType::kFp8E4M3, MlaKernel::kPortable},
      {"h16_b128_memory", 16, 128, 4096, MlaCacheType::kFp8E4M3},
      {"h16_b128_memory", 16, 128, 4096, MlaCacheType::kFp8E4M3, kPortable, MlaFp8Math::kE4m3},
      {"h16_b128_memory", 16, 128, 4096, MlaCacheType::kFp8E4M3, MlaKernel::kPortable},
      {"h128_b1_latency", 128, 1, 4096, MlaCacheType::kBf16},
      {"h128_b1_latency", 128, 1, 4096, MlaCacheType::kBf16, kAutoK, kAutoM, kRing},
      {"h128_b1_latency", 128, 1, 4096, MlaCacheType::kBf16, MlaKernel::kPortable},
      {"h128_b1_latency", 128, 1, 4096, MlaCacheType::kFp8E4M3},
      {"h128_b1_latency", 128, 1, 4096, MlaCacheType::kFp8E4M3, kPortable, MlaFp8Math::kE4m3},
      // DeepSeek-V2-Lite decode steps at context 600 (model_step_bench's shapes).
      {"h16_b1_ctx600", 16, 1, 600, MlaCacheType::kBf16},
      {"h16_b64_ctx600", 16, 64, 600, MlaCacheType::kBf16},
      {"h16_b128_ctx600", 16, 128, 600, MlaCacheType::kBf16},
  };
  int device = 0;
  cudaGetDevice(&device);
  const bench::GpuEnergy energy(device);
  std::vector<Result> results;
  for (const Shape& s : shapes) {
    const std::string tag =
        std::string(s.name) + (s.cache == MlaCacheType::kBf16 ? "_bf16" : "_fp8");
    if (tag.find(only) == std::string::npos) continue;
    results.push_back(RunShape(s, iters, bw, tflops, sustain_s, false, energy));
    // The graph form of the same step: bucket-sized grids, device item counts.
    if (graph_form) results.push_back(RunShape(s, iters, bw, tflops, sustain_s, true, energy));
  }
  std::printf("\n# MLA decode, median of %d (floor: %.2f TB/s, %.0f TFLOP/s)\n", iters, bw, tflops);
  for (const Result& r : results) {
    std::printf(
        "MLA_BENCH impl=%s shape=%s heads=%d batch=%d kv_len=%d cache=%s "
        "median_us=%.2f min_us=%.2f tflops=%.1f cache_tbps=%.3f floor_us=%.2f\n",
        r.impl.c_str(), r.name.c_str(), r.heads, r.batch, r.kv_len, r.cache, r.median_us, r.min_us,
        r.tflops, r.cache_tbps, r.floor_us);
    if (r.sustained_us > 0) {
      std::printf(
          "MLA_BENCH_SUSTAINED impl=%s shape=%s cache=%s sustained_us=%.2f mj_per_call=%.3f "
          "watts=%.0f\n",
          r.impl.c_str(), r.name.c_str(), r.cache, r.sustained_us, r.mj_per_call, r.watts);
    }
  }
  return 0;
}
