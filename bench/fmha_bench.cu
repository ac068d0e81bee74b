// FMHA forward benchmark on the GPU (not a test): the paged-KV FMHA kernel (kernels/fmha/) on
// Llama-3-8B shapes, with the C8 attention kernel (bf16 cache) on the same shapes in the same
// run, plus the device copy bandwidth as the decode roofline. The torch SDPA peer (cuDNN, FA2)
// for the same shapes: python3 bench/torch_sdpa_peer.py.
//
//   build/cuda/bench/fmha_bench [--iters 30] [--no-c8] [--gemma3]
//
// --gemma3: Gemma-3-12B attention shapes instead (Hq 16, Hkv 8, head_dim 256; FMHA only: C8 has
// no head_dim 256).
//
// Timing: each kernel is captured in a CUDA graph (as decode steps run in production); before
// every timed replay a 512 MB memset evicts the L2 (tens of MB), outside the timed events; the
// median of --iters replays after warm-up is reported. Inputs are random non-zero bf16.
// On Hopper the prefill shapes run twice: "fmha" (the automatic choice, the wgmma kernel) and
// "fmha_portable" (the one-source kernel).
// Output: one CSV line per measurement ("result,<shape>,<kernel>,<us>,<TFLOP/s>,<KV TB/s>,
// <splits>"), then a table. Prefill FLOPs = 2 * 2 * B * Hq * L^2 * d / 2 (causal); decode
// KV bytes = 2 * B * L * Hkv * d * 2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "kernels/cuda/c8/c8_attention.h"
#include "kernels/fmha/fmha_launcher.h"

namespace {

int g_iters = 30;
void* g_flush = nullptr;
constexpr size_t kFlushBytes = 512ull << 20;

// Random bf16 in [-2, 2] with random mantissas (never zeros).
__global__ void FillBf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = static_cast<uint16_t>((x & 0x8000u) | 0x3f00u | (x & 0xffu));  // sign | ~[0.5, 2)
  }
}

void* AllocFilled(size_t elems, uint32_t seed) {
  void* p;
  CK(cudaMalloc(&p, std::max<size_t>(elems * 2, 16)));
  FillBf16<<<1024, 256>>>(static_cast<uint16_t*>(p), elems, seed);
  CK(cudaGetLastError());
  return p;
}

// Median time (ms) of graph replays of `enqueue`, L2 flushed before each.
template <typename F>
float TimeGraph(F&& enqueue) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  enqueue(s);  // first call outside capture: one-time host setup (smem opt-in, queries)
  CK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue(s);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s));
  std::vector<float> t;
  for (int i = 0; i < g_iters; ++i) {
    CK(cudaMemsetAsync(g_flush, i & 0xff, kFlushBytes, s));
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
  return t[t.size() / 2];
}

__global__ void CopyKernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    b[i] = a[i];
  }
}

// Device-to-device copy bandwidth through a plain copy kernel (read + write): the decode roofline.
double CopyTbps() {
  const size_t bytes = 2ull << 30;
  void* a = AllocFilled(bytes / 2, 1);
  void* b;
  CK(cudaMalloc(&b, bytes));
  const float ms = TimeGraph([&](cudaStream_t s) {
    CopyKernel<<<132 * 16, 512, 0, s>>>(static_cast<const uint4*>(a), static_cast<uint4*>(b),
                                        bytes / 16);
    CK(cudaGetLastError());
  });
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / (ms * 1e-3) / 1e12;
}

struct Shape {
  std::string name;
  int batch, q_len, kv_len;
  bool prefill;
  bool contiguous = false;  // FMHA only: contiguous [batch, kv_len, Hkv, d] cache, no block table
};

struct Row {
  std::string shape, kernel;
  float us;
  double tflops, tbps;
  int splits;
};

// Llama-3-8B by default; --gemma3 sets Gemma-3-12B's 16 / 8 / 256.
int kHq = 32, kHkv = 8, kD = 128;
constexpr int kBs = 64;

double Flops(const Shape& s) {
  // Causal pairs: row t sees kv_len - q_len + t + 1 keys.
  double pairs = 0;
  for (int t = 0; t < s.q_len; ++t) pairs += s.kv_len - s.q_len + t + 1;
  if (s.prefill && s.q_len == s.kv_len) pairs = 0.5 * s.q_len * static_cast<double>(s.kv_len);
  return 4.0 * s.batch * kHq * kD * pairs;
}
double KvBytes(const Shape& s) {
  return 2.0 * s.batch * s.kv_len * kHkv * kD * 2;
}

// Shared inputs of one shape: paged bf16 cache [blocks, Hkv, 64, 128] with a shuffled pool.
struct Inputs {
  int blocks_per_seq = 0, num_blocks = 0;
  std::vector<int32_t> table;  // [batch, blocks_per_seq]
  void *q = nullptr, *out = nullptr, *k = nullptr, *v = nullptr;
  int32_t *d_table = nullptr, *d_seqlen_k = nullptr;
  explicit Inputs(const Shape& s) {
    blocks_per_seq = (s.kv_len + kBs - 1) / kBs;
    num_blocks = s.batch * blocks_per_seq;
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::mt19937 rng(7);
    std::shuffle(pool.begin(), pool.end(), rng);
    table = pool;
    const size_t cache = static_cast<size_t>(num_blocks) * kHkv * kBs * kD;
    k = AllocFilled(cache, 2);
    v = AllocFilled(cache, 3);
    q = AllocFilled(static_cast<size_t>(s.batch) * s.q_len * kHq * kD, 4);
    CK(cudaMalloc(&out, static_cast<size_t>(s.batch) * s.q_len * kHq * kD * 2));
    CK(cudaMalloc(&d_table, table.size() * 4));
    CK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> lens(s.batch, s.kv_len);
    CK(cudaMalloc(&d_seqlen_k, lens.size() * 4));
    CK(cudaMemcpy(d_seqlen_k, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  }
  ~Inputs() {
    cudaFree(q);
    cudaFree(out);
    cudaFree(k);
    cudaFree(v);
    cudaFree(d_table);
    cudaFree(d_seqlen_k);
  }
};

Row RunFmha(const Shape& s, const Inputs& in, llm::FmhaKernel kernel, const char* name) {
  llm::FmhaParams p;
  p.dtype = llm::FmhaDType::kBf16;
  p.batch = s.batch;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = kD;
  p.seqlen_q = s.q_len;
  p.seqlen_k = in.d_seqlen_k;
  p.q = in.q;
  p.out = in.out;
  p.k = in.k;
  p.v = in.v;
  if (s.contiguous) {  // the same cache bytes read as [batch, kv_len, Hkv, d]
    p.cache_seqlen = s.kv_len;
  } else {
    p.block_size = kBs;
    p.block_table = in.d_table;
    p.max_blocks_per_seq = in.blocks_per_seq;
  }
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kD));
  p.mask.type = llm::FmhaMaskType::kCausalBottomRight;
  llm::FmhaLaunchOptions opt;
  opt.kernel = kernel;
  opt.num_splits = 0;  // automatic: splits only when the grid leaves SMs idle
  opt.workspace_bytes = llm::FmhaWorkspaceBytes(p, 0);
  void* ws = nullptr;
  if (opt.workspace_bytes) CK(cudaMalloc(&ws, opt.workspace_bytes));
  opt.workspace = ws;
  const float ms = TimeGraph([&](cudaStream_t st) { OK(llm::FmhaForward(p, opt, st)); });
  if (ws) CK(cudaFree(ws));
  return {s.name,
          name,
          ms * 1000.f,
          Flops(s) / (ms * 1e-3) / 1e12,
          KvBytes(s) / (ms * 1e-3) / 1e12,
          llm::FmhaAutoSplits(p)};
}

Row RunC8(const Shape& s, const Inputs& in) {
  llm::AttentionBatch b;
  b.num_seqs = s.batch;
  b.q_indptr.push_back(0);
  b.page_indptr.push_back(0);
  for (int i = 0; i < s.batch; ++i) {
    for (int j = 0; j < in.blocks_per_seq; ++j) {
      b.page_indices.push_back(in.table[static_cast<size_t>(i) * in.blocks_per_seq + j]);
    }
    b.page_indptr.push_back(static_cast<int32_t>(b.page_indices.size()));
    b.kv_lens.push_back(s.kv_len);
    b.q_indptr.push_back(b.q_indptr.back() + s.q_len);
  }
  b.num_tokens = b.q_indptr.back();
  const llm::cuda::C8Shape shape{
      kHq, kHkv, kD, kBs, llm::cuda::CacheType::kBf16, llm::cuda::ScaleMode::kNone};
  llm::cuda::C8Attention attn(shape);
  llm::cuda::C8PlanConfig pc;
  pc.num_sms = llm::cuda::CudaNumSms();
  pc.ctas_per_sm = attn.decode_ctas_per_sm();
  const auto plan = llm::cuda::BuildC8Plan(shape, b, pc);
  OK(attn.Upload(b, plan, nullptr));
  CK(cudaDeviceSynchronize());
  llm::cuda::C8Attention::LayerArgs la;
  la.q = in.q;
  la.out = in.out;
  la.k_cache = in.k;
  la.v_cache = in.v;
  la.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kD));
  const float ms = TimeGraph([&](cudaStream_t st) { OK(attn.Attend(la, st)); });
  return {s.name,
          "c8_bf16",
          ms * 1000.f,
          Flops(s) / (ms * 1e-3) / 1e12,
          KvBytes(s) / (ms * 1e-3) / 1e12,
          plan.num_partials};
}

}  // namespace

int main(int argc, char** argv) {
  bool with_c8 = true, gemma3 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) g_iters = std::max(1, std::atoi(argv[++i]));
    if (a == "--no-c8") with_c8 = false;
    if (a == "--gemma3") gemma3 = true;
  }
  if (gemma3) {
    kHq = 16, kHkv = 8, kD = 256;
    with_c8 = false;
  }
  if (llm::cuda::CudaDeviceCount() == 0) {
    std::printf("fmha_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaMalloc(&g_flush, kFlushBytes));
  const double copy_tbps = CopyTbps();
  std::printf("device: %s, %d SMs; device-to-device copy %.2f TB/s (read + write); %d iters\n",
              prop.name, prop.multiProcessorCount, copy_tbps, g_iters);
  std::printf(
      "shapes: Hq %d, Hkv %d, d %d, bf16, paged KV block %d (shuffled), causal "
      "bottom-right\n",
      kHq, kHkv, kD, kBs);
  const std::vector<Shape> gemma3_shapes = {
      {"decode 64x4096", 64, 1, 4096, false},
      {"decode 1x4096", 1, 1, 4096, false},
      {"decode 4-token 64x4096", 64, 4, 4096, false},
      {"prefill 1x4096 causal", 1, 4096, 4096, true},
  };
  const std::vector<Shape> llama_shapes = {
      {"prefill 1x4096 causal", 1, 4096, 4096, true},
      {"prefill 4x4096 causal", 4, 4096, 4096, true},
      {"prefill 1x4096 causal contiguous", 1, 4096, 4096, true, true},
      {"decode 64x4096", 64, 1, 4096, false},
      {"decode 1x4096", 1, 1, 4096, false},
      {"decode 32x16384", 32, 1, 16384, false},
      {"decode 4-token 64x4096", 64, 4, 4096, false},
  };
  const std::vector<Shape>& shapes = gemma3 ? gemma3_shapes : llama_shapes;
  std::vector<Row> rows;
  std::printf("result,shape,kernel,us,tflops,kv_tbps,splits\n");
  for (const Shape& s : shapes) {
    const Inputs in(s);
    CK(cudaDeviceSynchronize());
    std::vector<Row> rs{RunFmha(s, in, llm::FmhaKernel::kAuto, "fmha")};
    // The auto row is wgmma on Hopper (head dims 64 / 128): the portable one beside it.
    if (s.prefill && llm::FmhaWgmmaAvailable() && kD != 256) {
      rs.push_back(RunFmha(s, in, llm::FmhaKernel::kPortable, "fmha_portable"));
    }
    if (with_c8 && !s.contiguous) rs.push_back(RunC8(s, in));
    for (const Row& r : rs) {
      std::printf("result,%s,%s,%.1f,%.1f,%.3f,%d\n", r.shape.c_str(), r.kernel.c_str(), r.us,
                  r.tflops, r.tbps, r.splits);
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  std::printf(
      "\n| shape | kernel | time (us) | TFLOP/s | KV TB/s | of copy BW | splits |\n"
      "|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %.1f | %.1f | %.2f | %.0f%% | %d |\n", r.shape.c_str(),
                r.kernel.c_str(), r.us, r.tflops, r.tbps, 100.0 * r.tbps / copy_tbps, r.splits);
  }
  std::printf(
      "\nfmha: the automatic kernel choice (%s for prefill); splits: fmha = automatic KV splits; "
      "c8 = partial slots of its plan (0: none).\n"
      "Peer (cuDNN / FA2 through torch SDPA, same shapes): python3 "
      "bench/torch_sdpa_peer.py\n",
      llm::FmhaWgmmaAvailable() && kD != 256 ? "wgmma" : "portable");
  CK(cudaFree(g_flush));
  return 0;
}
