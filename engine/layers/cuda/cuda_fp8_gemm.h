// fp8 (e4m3) GEMMs through cuBLASLt, for fp8 linear weights: y[m, n] (bf16) =
// (x_scale * x[m, k]) @ (w_scale * w[n, k])^T with fp32 accumulation. Both scales are device
// pointers (a CUDA graph replays with whatever values they hold). Built only with the CUDA backend.
//
// Scalings (cuBLAS 12.9+ on sm_90: CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE, see Fp8Scaling):
//   kTensor  one fp32 scalar per operand (SCALAR_32F);
//   kOuter   w_scale [n] per output channel x x_scale [m] per row (OUTER_VEC_32F on both);
//   kBlock   w_scale per 128x128 block of w, row-major [ceil(n / 128)][Fp8BlockLd(k)] (BLK128x128),
//            x_scale per 1x128 block of x, [ceil(k / 128)][m] (m fastest: VEC128_32F). Both
//            layouts are what cuBLASLt reads (docs "scaling factors layouts": the 128x128 scale
//            rows padded to a multiple of 4 blocks, else wrong results where ceil(k / 128) % 4 !=
//            0).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "base/status.h"

namespace llm {

enum class Fp8Scaling { kTensor, kOuter, kBlock };
const char* Fp8ScalingName(Fp8Scaling s);

// Row stride (floats) of a 128x128 block-scale matrix for k columns: ceil(k / 128) rounded up to 4.
inline int Fp8BlockLd(int k) {
  return ((k + 127) / 128 + 3) / 4 * 4;
}

class CudaFp8Gemm {
 public:
  CudaFp8Gemm() = default;
  CudaFp8Gemm(const CudaFp8Gemm&) = delete;
  CudaFp8Gemm& operator=(const CudaFp8Gemm&) = delete;
  ~CudaFp8Gemm();

  // workspace: device memory the matmuls may use (shared with other work on the same stream).
  // tune_max_m: shapes with m <= tune_max_m (decode steps, replayed thousands of times) time the
  // heuristic's candidates once on their first call instead of taking its first choice.
  // fast_accum: CUBLASLT_MATMUL_DESC_FAST_ACCUM, products summed in the tensor cores' own
  // accumulator instead of being promoted to fp32 on the CUDA cores every few k-steps (what
  // vLLM's and TensorRT-LLM's fp8 GEMMs do; fewer instructions per FLOP, which counts at a
  // power cap).
  Status Init(cudaStream_t stream, void* workspace, size_t workspace_bytes, int tune_max_m = 256,
              bool fast_accum = false);
  // x: e4m3 [m, k], w: e4m3 [n, k], y: bf16 [m, n]; k and n multiples of 16, m > 0 (a multiple
  // of 16 for kOuter / kBlock: the scale vectors are read for m rows). The algorithm for each
  // (m, n, k, scaling) is chosen once and cached; a shape's first call must not be inside a CUDA
  // graph capture when it is tuned (it synchronizes the stream). Unimplemented when cuBLASLt has
  // no algorithm for the scaling on this GPU (block and outer scaling need sm_90).
  Status Run(const void* x, const float* x_scale, const void* w, const float* w_scale, int m, int n,
             int k, void* y, Fp8Scaling scaling = Fp8Scaling::kTensor);

 private:
  struct Shape {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
  };
  StatusOr<Shape*> Get(int m, int n, int k, Fp8Scaling scaling, const float* x_scale,
                       const float* w_scale, const void* x, const void* w, void* y);
  // The fastest of `found` candidates on this call's operands, each timed with a cold L2 (the
  // weights of a projection stream from HBM in a model step); index into candidates.
  StatusOr<int> Tune(const Shape& s, const cublasLtMatmulHeuristicResult_t* candidates, int found,
                     const void* x, const void* w, void* y);

  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int tune_max_m_ = 0;
  bool fast_accum_ = false;
  bool warmed_ = false;  // Tune has kept the GPU busy once (clock ramp-up)
  std::map<std::tuple<int, int, int, Fp8Scaling>, Shape> shapes_;
};

}  // namespace llm
