#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/ops/rank_sum.h"

namespace llm::cuda {
namespace {

struct Slots {
  const void* p[kMaxRankSlots];
};

template <typename T>
__device__ __forceinline__ float Widen(T x);
template <>
__device__ __forceinline__ float Widen<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float Widen<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T Narrow(float x);
template <>
__device__ __forceinline__ float Narrow<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Narrow<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

template <typename T>
__global__ void SumRankSlotsKernel(Slots slots, int n, T* out, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    float sum = 0.f;
    for (int r = 0; r < n; ++r) sum += Widen(static_cast<const T*>(slots.p[r])[i]);  // rank order
    out[i] = Narrow<T>(sum);
  }
}

}  // namespace

void LaunchSumRankSlots(const void* const* slots, int n, void* out, size_t count, bool bf16,
                        void* stream) {
  if (count == 0 || n <= 0 || n > kMaxRankSlots) return;  // the group's size is checked at creation
  Slots s{};
  for (int r = 0; r < n; ++r) s.p[r] = slots[r];
  const int blocks = static_cast<int>(std::min<size_t>((count + 255) / 256, 4096));
  auto st = static_cast<cudaStream_t>(stream);
  if (bf16) {
    SumRankSlotsKernel<<<blocks, 256, 0, st>>>(s, n, static_cast<__nv_bfloat16*>(out), count);
  } else {
    SumRankSlotsKernel<<<blocks, 256, 0, st>>>(s, n, static_cast<float*>(out), count);
  }
}

}  // namespace llm::cuda
