// Block-wide fold of max |x| into a global fp8 absmax slot (internal; shared by the absmax
// kernel in fp8_quant.cu and the kernels in elementwise_ops.cu that produce an fp8 GEMM's input).
#pragma once

#include <cuda_runtime.h>

namespace llm::cuda::detail {

// m: this thread's max |x| (non-negative). Every thread of the block must call it (it has a
// barrier). One atomic per block, skipped when the block's max cannot raise *amax: non-negative
// floats order like their bit patterns, so an integer atomic max is a float max, and a stale read
// of *amax only costs an extra atomic.
__device__ __forceinline__ void BlockFoldAbsMax(float m, float* amax) {
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  __shared__ float warp_max[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>((blockDim.x + 31) / 32); ++w) m = fmaxf(m, warp_max[w]);
    if (m > *reinterpret_cast<volatile float*>(amax)) {
      atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
    }
  }
}

}  // namespace llm::cuda::detail
