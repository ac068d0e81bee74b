// Warp-level PTX wrappers shared by the CUDA-only kernels (C8 attention, MLA decode): shared-
// memory addresses, cp.async, ldmatrix, mma.sync m16n8k16 (bf16 and f16 inputs) and m16n8k32
// (e4m3 inputs) with fp32 accumulators, register packing and 8-byte bf16x4 loads/stores. The
// portable FMHA family has its own in kernels/gpu_port.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace llm::cuda::ptx {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; !valid zero-fills (rows past the end must not hold NaNs).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4T(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// Transposes an 8x8 matrix of 16-bit values held as an mma accumulator-style fragment (lane
// 4r + c holds elements (r, 2c) and (r, 2c + 1)): afterwards the lane holds (2c, r), (2c + 1, r).
__device__ __forceinline__ uint32_t MovMatrixT(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// c += a (16x16, row) * b (16x8, col), bf16 inputs, fp32 accumulate.
__device__ __forceinline__ void MmaBf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same with f16 inputs.
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (sm_90+; no-ops before): a kernel launched with the
// programmatic-serialization attribute may start while the kernel before it in the stream
// finishes. GridDependencyWait blocks until that kernel has completed and its writes are visible:
// everything before it may only read what was written before that kernel started (uploaded work
// lists, block tables). GridDependencyLaunch lets the next such kernel start its own prologue.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void GridDependencyLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}
// The whole prologue of a small element-wise kernel in a launch chain: wait for the previous
// kernel, then let the next one start launching (its CTAs wait in their own prologue), so the
// launch latency between two dependent kernels overlaps the tail of the first.
__device__ __forceinline__ void GridDependencySync() {
  GridDependencyWait();
  GridDependencyLaunch();
}

// c += a (16x32, row) * b (32x8, col), e4m3 inputs, fp32 accumulate. The instruction exists from
// sm_89 on; callers choose it on the host only for such devices (ComputeCapability() >= 89).
__device__ __forceinline__ void MmaE4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two e4m3 bytes (low byte = lower element) -> f16x2, exact (one hardware cvt on sm_89+).
__device__ __forceinline__ uint32_t Fp8x2ToF16x2(uint32_t pair) {
  const __half2_raw r =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xffffu), __NV_E4M3);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Four e4m3 bytes (byte 0 the lowest element) -> bf16x2 *lo (bytes 0, 1) and *hi (bytes 2, 3),
// exactly, on the integer and bf16 FMA pipes: the hardware path (e4m3x2 -> f16x2 -> f32 -> bf16x2)
// takes two conversions per pair on the slow conversion unit, which bounds a weight-streaming GEMM.
// Each byte's exponent and mantissa bits move to bf16's positions, which reads as the value times
// 2^-120 (subnormals too: both formats scale theirs alike), and one bf16x2 multiply by 2^120
// (exact, subnormal inputs kept) restores it. e4m3's NaN codes (0x7f, 0xff) do not stay NaN.
__device__ __forceinline__ void E4m3x4ToBf16x4(uint32_t w, uint32_t* lo, uint32_t* hi) {
  const uint32_t a = __byte_perm(w, 0u, 0x1302);  // bytes (b2, b0, b3, b1): b0, b1 high in a half
  const uint32_t b = a << 8;                      // b2, b3 high in a half
  uint32_t r[2] = {(a & 0x80008000u) | ((a & 0x7f007f00u) >> 4),
                   (b & 0x80008000u) | ((b & 0x7f007f00u) >> 4)};
  const __nv_bfloat162 two120 =
      __halves2bfloat162(__ushort_as_bfloat16(0x7b80), __ushort_as_bfloat16(0x7b80));
#pragma unroll
  for (uint32_t& x : r) {
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&x), two120);
    x = *reinterpret_cast<const uint32_t*>(&v);
  }
  *lo = r[0];
  *hi = r[1];
}

// e4m3 helpers: two floats -> two e4m3 bytes (a in the low byte), saturating, and back.
__device__ __forceinline__ uint32_t F32x2ToE4m3x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float2 E4m3x2ToF32x2(uint32_t pair) {
  const uint32_t h = Fp8x2ToF16x2(pair);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}
// x ~ hi + lo with both in e4m3: hi carries 4 significant bits, lo the next 4, so the pair holds
// ~8 bits (bf16 has 8). Returns the two bytes of (a, b) in the low 16 bits of *hi and *lo.
__device__ __forceinline__ void SplitE4m3x2(float a, float b, uint32_t* hi, uint32_t* lo) {
  *hi = F32x2ToE4m3x2(a, b);
  const float2 h = E4m3x2ToF32x2(*hi);
  *lo = F32x2ToE4m3x2(a - h.x, b - h.y);
}

// 2^x with denormal results flushed: one MUFU.EX2, where exp2f adds range fix-ups around it.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Four bf16 <-> four floats through one 8-byte access (p 8-byte aligned).
__device__ __forceinline__ void LoadBf16x4(const void* p, float (&f)[4]) {
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&w.x);
  const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&w.y);
  f[0] = __low2float(lo);
  f[1] = __high2float(lo);
  f[2] = __low2float(hi);
  f[3] = __high2float(hi);
}
__device__ __forceinline__ void StoreBf16x4(void* p, const float (&f)[4]) {
  uint2 w;
  w.x = PackBf16(f[0], f[1]);
  w.y = PackBf16(f[2], f[3]);
  *reinterpret_cast<uint2*>(p) = w;
}

}  // namespace llm::cuda::ptx
