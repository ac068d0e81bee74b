// Small-batch products with a bf16 weight, y = x W^T for a few rows of x, streaming W once from
// global memory (the decode steps of batch 1 to kDenseGemvMaxRows: the projections that
// CudaLinear::RunBf16 applies; the LM head stays on cuBLAS). Plain C++ launcher header: pointers
// are device pointers, `stream` is a cudaStream_t.
//
// cuBLAS serves these shapes with tiles made for many rows (a 64 x 8 tile and a split-k
// reduction for 4,096 x 2,880 at one row), a second launch and a ramp for a few microseconds of
// weight stream; here one launch reads each weight row with a warp (or a few warps that split
// its k), sums in fp32 and rounds once at the store.
#pragma once

#include <cstdint>

namespace llm::cuda {

inline constexpr int kDenseGemvMaxRows = 4;

// W [n, k] (the nn.Linear layout), x [rows, k] with rows 1 .. kDenseGemvMaxRows, k a multiple of 8
// (16-byte weight loads).
inline bool DenseGemvShapeOk(int rows, int64_t n, int64_t k) {
  return rows >= 1 && rows <= kDenseGemvMaxRows && n > 0 && k > 0 && k % 8 == 0 &&
         n <= (int64_t{1} << 30);
}

// y[r, j] = sum_c x[r, c] W[j, c] (fp32 sums in a fixed order: the same bits on every run for
// the same rows), y bf16 or (out_fp32) fp32 [rows, n]. Launched with programmatic dependent
// launch: the kernel's first weight loads overlap the kernel before it. split_k: warps per
// column (1, 2, 4 or 8), or 0 for DenseGemvDefaultSplitK. False (nothing launched) for a shape
// outside DenseGemvShapeOk.
[[nodiscard]] bool LaunchDenseGemvBf16(const void* x, const void* w, int rows, int64_t n, int64_t k,
                                       void* y, bool out_fp32, void* stream, int split_k = 0);

// Where the GEMV beats cuBLAS ("[.bench][dense_gemv]" on an H100): one row at every projection
// shape measured (a 576 x 2,048 weight in 2.5 us against 5.9, 4,096 x 4,096 in 13.5 against 15.1);
// two to four rows only on small weights, where cuBLAS's fixed cost dominates (each extra row
// costs the GEMV another activation load per weight chunk: 6,144 x 4,096 at four rows takes
// 25.6 us against 20.1).
inline bool DenseGemvPreferred(int rows, int64_t n, int64_t k) {
  constexpr int64_t kSmallWeight = int64_t{2} << 20;  // elements: 4 MB of bf16
  return rows == 1 || (rows <= kDenseGemvMaxRows && n * k <= kSmallWeight);
}

// Warps per column by default: enough warps for one wave of the device (num_sms SMs) where there
// are few columns, one where there are many.
int DenseGemvDefaultSplitK(int64_t n, int64_t k, int num_sms);

}  // namespace llm::cuda
