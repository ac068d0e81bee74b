// What the GEMV kernels share (kernels/cuda/ops/dense_gemv.cu, kernels/cuda/moe/moe_gemv*.cu):
// the 16-byte weight load that bypasses L1, and the widening of a bf16 pair (internal; CUDA
// translation units).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace llm::cuda::ptx {

// 16 weight bytes, read once per step: not kept in L1 (the activations are). Volatile, so that a
// load issued before a PDL wait stays there.
__device__ __forceinline__ uint4 LoadStream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A bf16 pair (the first in the low half) as two floats (exact).
__device__ __forceinline__ float2 Bf16x2ToFloat2(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}

}  // namespace llm::cuda::ptx
