// The model's projection GEMMs on the GPU, at the decode batch sizes: y[m, n] = x[m, k] w[n, k]^T
// in bf16 with fp32 accumulation, as engine/layers/cuda/cuda_linear.cc issues them
// (cublasGemmEx, CUBLAS_GEMM_DEFAULT), against the fastest of the algorithms cuBLASLt's heuristic
// offers for the same problem. Shapes: Llama-3-8B (qkv, o, gate_up, down, lm_head).
//
//   build/cuda/bench/gemm_bench [--ms 1,8,64,256] [--iters 50] [--fp8 | --fp8-search]
//
// --fp8: the e4m3 projections as engine/layers/cuda/cuda_fp8_gemm.cc issues them (cuBLASLt,
// per-tensor scale pointers, bf16 out): the heuristic's first algorithm with and without fast
// accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM), and the fastest of its candidates with it.
//
// Per row: microseconds, weight bytes over time (TB/s) and TFLOP/s; then the per-step sum over
// 32 layers and the LM head, for each m.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/int_list.h"

namespace {

#define CK(x)                                                                                  \
  do {                                                                                         \
    auto _e = (x);                                                                             \
    if (static_cast<int>(_e) != 0) {                                                           \
      std::fprintf(stderr, "%s failed (%d) at line %d\n", #x, static_cast<int>(_e), __LINE__); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

struct Shape {
  const char* name;
  int n, k;
  bool f32_out;
  int per_step;  // times per decode step (32 layers, or 1 for the LM head)
};

template <typename F>
float TimeUs(F&& f, int iters, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1000.f / iters;
}

struct Fp8Problem {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
};

Fp8Problem MakeFp8(int m, int n, int k, bool fast, const float* scale) {
  Fp8Problem p;
  CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale,
                                    sizeof(scale)));
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale,
                                    sizeof(scale)));
  const int8_t f = fast ? 1 : 0;
  CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof(f)));
  CK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, k, n, k));
  CK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, k, m, k));
  CK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, n, m, n));
  return p;
}

void FreeFp8(Fp8Problem& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.c);
  cublasLtMatmulDescDestroy(p.op);
}

// The fp8 projections of Llama-3-8B (n x k of each weight).
struct Fp8Shape {
  const char* name;
  int n, k;
};
constexpr Fp8Shape kFp8Shapes[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
constexpr int kCopies = 4;  // weight copies rotate so one GEMM's weights are not in L2 for the next

// The fp8 runs, over device buffers for m up to max_m (small finite e4m3 values, unit scale), a
// stream and a cuBLASLt handle. The benchmark exits after one run: nothing is freed.
struct Fp8Bench {
  void* w[kCopies];
  void *x = nullptr, *y = nullptr, *ws = nullptr;
  float* scale = nullptr;
  size_t ws_bytes = 32ull << 20;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  int rot = 0;  // next weight copy
  explicit Fp8Bench(int max_m) {
    const size_t max_w = 28672ull * 4096, max_x = static_cast<size_t>(max_m) * 14336;
    const size_t max_y = static_cast<size_t>(max_m) * 28672 * 2;
    for (auto& p : w) CK(cudaMalloc(&p, max_w));
    CK(cudaMalloc(&x, max_x));
    CK(cudaMalloc(&y, max_y));
    CK(cudaMalloc(&scale, sizeof(float)));
    CK(cudaMalloc(&ws, ws_bytes));
    for (auto& p : w) CK(cudaMemset(p, 0x30, max_w));
    CK(cudaMemset(x, 0x30, max_x));
    const float one = 1.f;
    CK(cudaMemcpy(scale, &one, sizeof(one), cudaMemcpyHostToDevice));
    CK(cudaStreamCreate(&stream));
    CK(cublasLtCreate(&lt));
  }
  // Microseconds per call of `algo` on `p`, the weights rotating over the copies.
  float Time(const Fp8Problem& p, const cublasLtMatmulAlgo_t& algo, int iters) {
    const float alpha = 1.f, beta = 0.f;
    return TimeUs(
        [&] {
          CK(cublasLtMatmul(lt, p.op, &alpha, w[rot++ % kCopies], p.a, x, p.b, &beta, y, p.c, y,
                            p.c, &algo, ws, ws_bytes, stream));
        },
        iters, stream);
  }
  // A heuristic preference allowing the workspace (the caller destroys it).
  cublasLtMatmulPreference_t Preference() const {
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof(ws_bytes)));
    return pref;
  }
  // Heuristic[0] without / with fast accumulation, and the best candidate with it.
  void Run(const std::vector<int>& ms, int iters);
  // --fp8-search (see Search's definition).
  void Search(const std::vector<int>& ms, int iters);
};

// fp8 projections: heuristic[0] without / with fast accumulation, and the best candidate with it.
void Fp8Bench::Run(const std::vector<int>& ms, int iters) {
  cublasLtMatmulPreference_t pref = Preference();
  std::printf(
      "\n| m | fp8 gemm | n x k | heuristic us | fast-accum us | best fast us | TB/s | "
      "TFLOP/s | algos |\n|---|---|---|---|---|---|---|---|---|\n");
  for (int m : ms) {
    double sums[3] = {0, 0, 0};
    for (const Fp8Shape& s : kFp8Shapes) {
      float t[3] = {0, 0, 1e30f};
      int found_fast = 0;
      for (int fast = 0; fast < 2; ++fast) {
        Fp8Problem p = MakeFp8(m, s.n, s.k, fast != 0, scale);
        cublasLtMatmulHeuristicResult_t res[16];
        int found = 0;
        CK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 16, res, &found));
        for (int i = 0; i < (fast ? found : std::min(found, 1)); ++i) {
          const float us = Time(p, res[i].algo, iters);
          if (i == 0) t[fast] = us;
          if (fast) t[2] = std::min(t[2], us);
        }
        if (fast) found_fast = found;
        FreeFp8(p);
      }
      const double wbytes = 1.0 * s.n * s.k, flops = 2.0 * m * s.n * s.k;
      std::printf("| %d | %s | %d x %d | %.1f | %.1f | %.1f | %.2f | %.0f | %d |\n", m, s.name, s.n,
                  s.k, t[0], t[1], t[2], wbytes / t[2] / 1e6, flops / t[2] / 1e6, found_fast);
      for (int i = 0; i < 3; ++i) sums[i] += 32.0 * t[i];
    }
    std::printf("| %d | **32 layers** | | %.0f | %.0f | %.0f | | | |\n", m, sums[0], sums[1],
                sums[2]);
  }
  cublasLtMatmulPreferenceDestroy(pref);
}

// One cuBLASLt configuration and its time.
struct Config {
  cublasLtMatmulAlgo_t algo;
  float us = 1e30f;
};

int AlgoConfig(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;  // every config attribute fits 32 bits (cluster and tile ids are enums)
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written);
  return static_cast<int>(v);
}

std::string Describe(const cublasLtMatmulAlgo_t& a) {
  char buf[160];
  std::snprintf(
      buf, sizeof(buf), "id %d tile %d stages %d splitk %d red %d swz %d cluster %d opt %d",
      AlgoConfig(a, CUBLASLT_ALGO_CONFIG_ID), AlgoConfig(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
      AlgoConfig(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), AlgoConfig(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
      AlgoConfig(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
      AlgoConfig(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
      AlgoConfig(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
      AlgoConfig(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  return buf;
}

// --fp8-search: how far cuBLASLt's own heuristic list is from the best configuration it can run.
// Candidates: the heuristic's best-fit list (what the model tunes over), the heuristic limited to
// each algorithm id, and split-K / swizzle variants of the best few. Each is checked
// (cublasLtMatmulAlgoCheck) and timed with rotating weight copies (L2-cold weights).
void Fp8Bench::Search(const std::vector<int>& ms, int iters) {
  std::printf(
      "\n| m | fp8 gemm | heuristic[0] us | best of 8 us | searched | best us | gain | best "
      "config |\n|---|---|---|---|---|---|---|---|\n");
  for (int m : ms) {
    double sums[3] = {0, 0, 0};
    for (const Fp8Shape& s : kFp8Shapes) {
      Fp8Problem p = MakeFp8(m, s.n, s.k, false, scale);
      auto time = [&](const cublasLtMatmulAlgo_t& algo) -> float {
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(lt, p.op, p.a, p.b, p.c, p.c, &algo, &check) !=
                CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > ws_bytes) {
          return 1e30f;
        }
        const float alpha = 1.f, beta = 0.f;  // a trial call: a configuration may not run
        if (cublasLtMatmul(lt, p.op, &alpha, w[0], p.a, x, p.b, &beta, y, p.c, y, p.c, &algo, ws,
                           ws_bytes, stream) != CUBLAS_STATUS_SUCCESS) {
          return 1e30f;
        }
        return Time(p, algo, iters);
      };
      std::vector<Config> all;
      cublasLtMatmulPreference_t pref = Preference();
      cublasLtMatmulHeuristicResult_t res[32];
      int found = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 8, res, &found));
      float h0 = 1e30f, h8 = 1e30f;
      for (int i = 0; i < found; ++i) {
        Config c{res[i].algo, time(res[i].algo)};
        if (i == 0) h0 = c.us;
        h8 = std::min(h8, c.us);
        all.push_back(c);
      }
      // The heuristic limited to one algorithm id at a time.
      int ids[64], nids = 0;
      CK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3,
                                  CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, 64, ids, &nids));
      const uint32_t mode = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode,
                                              sizeof(mode)));
      for (int id = 0; id < nids; ++id) {
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3,
                                   CUDA_R_8F_E4M3, CUDA_R_16BF, CUDA_R_16BF, ids[id],
                                   &algo) != CUBLAS_STATUS_SUCCESS) {
          continue;
        }
        int n = 0;
        res[0].algo = algo;
        if (cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 32, res, &n) !=
            CUBLAS_STATUS_SUCCESS) {
          continue;
        }
        for (int i = 0; i < n; ++i) all.push_back({res[i].algo, time(res[i].algo)});
      }
      cublasLtMatmulPreferenceDestroy(pref);
      // Split-K and swizzle variants of the fastest few.
      std::sort(all.begin(), all.end(),
                [](const Config& a, const Config& b) { return a.us < b.us; });
      const size_t top = std::min<size_t>(all.size(), 4);
      for (size_t i = 0; i < top; ++i) {
        for (int splitk : {1, 2, 3, 4, 6, 8}) {
          for (uint32_t red : {1u, 2u, 4u}) {
            for (uint32_t swz : {0u, 1u}) {
              cublasLtMatmulAlgo_t a = all[i].algo;
              const uint32_t sk = splitk;
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk,
                                                   sizeof(sk));
              const uint32_t r = splitk > 1 ? red : 0u;
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &r,
                                                   sizeof(r));
              cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                                                   sizeof(swz));
              all.push_back({a, time(a)});
              if (splitk == 1) break;  // the reduction scheme is unused
            }
          }
        }
      }
      const auto best = std::min_element(
          all.begin(), all.end(), [](const Config& a, const Config& b) { return a.us < b.us; });
      std::printf("| %d | %s | %.1f | %.1f | %zu | %.1f | %.1f%% | %s |\n", m, s.name, h0, h8,
                  all.size(), best->us, 100.0 * (h8 - best->us) / h8, Describe(best->algo).c_str());
      sums[0] += 32.0 * h0;
      sums[1] += 32.0 * h8;
      sums[2] += 32.0 * best->us;
      FreeFp8(p);
    }
    std::printf("| %d | **32 layers** | %.0f | %.0f | | %.0f | %.1f%% | |\n", m, sums[0], sums[1],
                sums[2], 100.0 * (sums[1] - sums[2]) / sums[1]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ms = {1, 8, 16, 64, 128, 256};
  int iters = 50;
  bool fp8 = false, search = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--fp8") {
      fp8 = true;
    } else if (k == "--fp8-search") {
      search = true;
    } else if (k == "--ms" && i + 1 < argc) {
      ms = bench::ParseIntList(argv[++i]);
    } else if (k == "--iters" && i + 1 < argc) {
      iters = std::stoi(argv[++i]);
    }
  }
  if (search) {
    Fp8Bench(*std::max_element(ms.begin(), ms.end())).Search(ms, iters);
    return 0;
  }
  if (fp8) {
    Fp8Bench(*std::max_element(ms.begin(), ms.end())).Run(ms, iters);
    return 0;
  }
  const Shape shapes[] = {{"qkv", 6144, 4096, false, 32},
                          {"o", 4096, 4096, false, 32},
                          {"gate_up", 28672, 4096, false, 32},
                          {"down", 4096, 14336, false, 32},
                          {"lm_head", 128256, 4096, true, 1}};
  const int max_m = *std::max_element(ms.begin(), ms.end());
  size_t max_w = 0, max_x = 0, max_y = 0;
  for (const Shape& s : shapes) {
    max_w = std::max(max_w, static_cast<size_t>(s.n) * s.k * 2);
    max_x = std::max(max_x, static_cast<size_t>(max_m) * s.k * 2);
    max_y = std::max(max_y, static_cast<size_t>(max_m) * s.n * 4);
  }
  void* w[kCopies];
  void *x, *y, *ws;
  for (auto& p : w) CK(cudaMalloc(&p, max_w));
  CK(cudaMalloc(&x, max_x));
  CK(cudaMalloc(&y, max_y));
  const size_t ws_bytes = 32ull << 20;
  CK(cudaMalloc(&ws, ws_bytes));
  for (auto& p : w) CK(cudaMemset(p, 0x3c, max_w));  // small finite bf16 values
  CK(cudaMemset(x, 0x3c, max_x));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CK(cublasCreate(&blas));
  CK(cublasSetStream(blas, stream));
  CK(cublasSetWorkspace(blas, ws, ws_bytes));
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));

  std::printf("| m | gemm | n x k | gemmEx us | TB/s | TFLOP/s | best Lt us | TB/s | algos |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int m : ms) {
    double step_ex = 0, step_lt = 0;
    for (const Shape& s : shapes) {
      const float alpha = 1.f, beta = 0.f;
      const cudaDataType out = s.f32_out ? CUDA_R_32F : CUDA_R_16BF;
      int rot = 0;
      const float ex = TimeUs(
          [&] {
            CK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, m, s.k, &alpha, w[rot++ % kCopies],
                            CUDA_R_16BF, s.k, x, CUDA_R_16BF, s.k, &beta, y, out, s.n,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          },
          iters, stream);
      // cuBLASLt: the same column-major problem, every algorithm the heuristic returns.
      cublasLtMatmulDesc_t op;
      CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, m, s.k));
      CK(cublasLtMatrixLayoutCreate(&lc, out, s.n, m, s.n));
      cublasLtMatmulPreference_t pref;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &ws_bytes, sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[32];
      int found = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, res, &found));
      float best = 1e30f;
      for (int i = 0; i < found; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        const float t = TimeUs(
            [&] {
              CK(cublasLtMatmul(lt, op, &alpha, w[rot++ % kCopies], la, x, lb, &beta, y, lc, y, lc,
                                &res[i].algo, ws, ws_bytes, stream));
            },
            iters, stream);
        best = std::min(best, t);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);
      const double wbytes = 2.0 * s.n * s.k, flops = 2.0 * m * s.n * s.k;
      std::printf("| %d | %s | %d x %d | %.1f | %.2f | %.0f | %.1f | %.2f | %d |\n", m, s.name, s.n,
                  s.k, ex, wbytes / ex / 1e6, flops / ex / 1e6, best, wbytes / best / 1e6, found);
      step_ex += ex * s.per_step;
      step_lt += best * s.per_step;
    }
    std::printf("| %d | **step (32 layers + head)** | | %.0f | | | %.0f | | |\n", m, step_ex,
                step_lt);
  }
  return 0;
}
