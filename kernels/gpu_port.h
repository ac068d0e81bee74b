// The one CUDA/HIP portability header: the only place in the kernels that branches on the
// platform. Kernels written against it (kernels/fmha/) compile unchanged with nvcc (sm_80+) and
// with hipcc (CDNA: gfx90a and later, wave64).
//
// It provides
//   - runtime names: kPlatformName, Stream, Error, ErrorString, GetLastError, Malloc/Free,
//     MallocHost/FreeHost (pinned), CopyToDeviceAsync, StreamSynchronize, device queries, smem
//     opt-in, occupancy;
//   - warp size, lane id, xor shuffles, warp votes;
//   - 16-byte global -> shared copies (cp.async on CUDA, plain loads on HIP) with zero fill;
//   - bf16 / fp16 element tags (storage is uint16_t bits; conversions round to nearest even);
//   - the warp tile MMA: C[16x16] (fp32) += A[16x16] * B[16x16] (bf16 or fp16), with fragment
//     loaders from shared memory, the accumulator element -> (row, col) map, row reductions, and
//     the accumulator -> A-operand conversion that flash attention needs for P = softmax(S).
//
// Logical fragment layouts (what a kernel may rely on; l = lane):
//   Both platforms: accumulator elements 2k and 2k+1 of one lane sit in the same row, in adjacent
//   columns (AccCol(2k + 1) == AccCol(2k) + 1), and the accumulator layout equals the A-operand
//   layout, so AccToA turns C (rows x 16 keys) into the A operand of the next product in
//   registers.
//   CUDA (32 lanes, g = l / 4, t = l % 4): one tile = two mma.sync.m16n8k16 (n = 0..7, 8..15).
//     A: 4 x b32 = A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8, 2t+9], A[g+8][2t+8, 2t+9]
//     B: 4 x b32 = B[2t, 2t+1][g], B[2t+8, 2t+9][g], B[2t, 2t+1][g+8], B[2t+8, 2t+9][g+8]
//     C: 8 x f32, element e: row g + 8 * ((e >> 1) & 1), col 8 * (e >> 2) + 2t + (e & 1)
//     -> two row slots per lane (rows g, g + 8); the 4 lanes of a quad share a row.
//   HIP (64 lanes, x = l % 16, y = l / 16): one v_mfma_f32_16x16x16{bf16_1k,f16}. AMD documents
//   the hardware operands (amd-lab-notes matrix-cores, mfma_fp32_16x16x16fp16.cpp; the bf16_1k
//   variant has the same layout) as
//     hwA: lane holds hwA[x][4y + i], hwB: lane holds hwB[4y + i][x], D: lane holds D[4y + i][x]
//   (i = 0..3 the element within the lane's 4-vector). We issue mfma(hwA = B^T, hwB = A^T), which
//   computes D = B^T A^T = C^T, so the logical layouts become
//     A: 2 x b32 = A[x][4y .. 4y+3]    B: 2 x b32 = B[4y .. 4y+3][x]
//     C: 4 x f32, element e: row x, col 4y + e
//   -> one row slot per lane; the 4 lanes x, x+16, x+32, x+48 share a row.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__HIPCC__) || defined(LLM_HIP)
#define LLM_GPU_HIP 1
#include <hip/hip_bfloat16.h>
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#define LLM_GPU_CUDA 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#endif

namespace llm::gpu {

// ---------------------------------------------------------------------------------------------
// Runtime
#if LLM_GPU_HIP
inline constexpr const char* kPlatformName = "hip";
using Stream = hipStream_t;
using Error = hipError_t;
inline constexpr Error kSuccess = hipSuccess;
inline const char* ErrorString(Error e) {
  return hipGetErrorString(e);
}
inline Error GetLastError() {
  return hipGetLastError();
}
inline Error Malloc(void** p, size_t bytes) {
  return hipMalloc(p, bytes);
}
inline Error Free(void* p) {
  return hipFree(p);
}
inline Error MallocHost(void** p, size_t bytes) {  // pinned
  return hipHostMalloc(p, bytes, hipHostMallocDefault);
}
inline Error FreeHost(void* p) {
  return hipHostFree(p);
}
inline Error CopyToDeviceAsync(void* dst, const void* src, size_t bytes, Stream s) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, s);
}
inline Error StreamSynchronize(Stream s) {
  return hipStreamSynchronize(s);
}
inline Error SetMaxDynamicSmem(const void* kernel, int bytes) {
  return hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
inline Error CurrentDevice(int* dev) {
  return hipGetDevice(dev);
}
inline Error SmCount(int dev, int* n) {
  return hipDeviceGetAttribute(n, hipDeviceAttributeMultiprocessorCount, dev);
}
inline Error SmemOptinBytes(int dev, int* n) {
  return hipDeviceGetAttribute(n, hipDeviceAttributeMaxSharedMemoryPerBlock, dev);
}
inline Error SmemPerSmBytes(int dev, int* n) {
  return hipDeviceGetAttribute(n, hipDeviceAttributeMaxSharedMemoryPerMultiprocessor, dev);
}
inline Error MaxActiveBlocks(int* n, const void* kernel, int threads, size_t smem) {
  return hipOccupancyMaxActiveBlocksPerMultiprocessor(n, kernel, threads, smem);
}
inline constexpr bool kHasAsyncCopy = false;  // plain loads: single-stage KV pipeline
#else
inline constexpr const char* kPlatformName = "cuda";
using Stream = cudaStream_t;
using Error = cudaError_t;
inline constexpr Error kSuccess = cudaSuccess;
inline const char* ErrorString(Error e) {
  return cudaGetErrorString(e);
}
inline Error GetLastError() {
  return cudaGetLastError();
}
inline Error Malloc(void** p, size_t bytes) {
  return cudaMalloc(p, bytes);
}
inline Error Free(void* p) {
  return cudaFree(p);
}
inline Error MallocHost(void** p, size_t bytes) {  // pinned
  return cudaMallocHost(p, bytes);
}
inline Error FreeHost(void* p) {
  return cudaFreeHost(p);
}
inline Error CopyToDeviceAsync(void* dst, const void* src, size_t bytes, Stream s) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
}
inline Error StreamSynchronize(Stream s) {
  return cudaStreamSynchronize(s);
}
inline Error SetMaxDynamicSmem(const void* kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
inline Error CurrentDevice(int* dev) {
  return cudaGetDevice(dev);
}
inline Error SmCount(int dev, int* n) {
  return cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, dev);
}
inline Error SmemOptinBytes(int dev, int* n) {
  return cudaDeviceGetAttribute(n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
}
inline Error SmemPerSmBytes(int dev, int* n) {
  return cudaDeviceGetAttribute(n, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
}
inline Error MaxActiveBlocks(int* n, const void* kernel, int threads, size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, kernel, threads, smem);
}
inline constexpr bool kHasAsyncCopy = true;  // cp.async: double-buffered KV pipeline
#endif

// Evaluates a runtime call inside a function returning `const char*` (nullptr = success).
#define LLM_GPU_TRY(expr)                           \
  do {                                              \
    const ::llm::gpu::Error llm_gpu_err_ = (expr);  \
    if (llm_gpu_err_ != ::llm::gpu::kSuccess) {     \
      return ::llm::gpu::ErrorString(llm_gpu_err_); \
    }                                               \
  } while (0)

// ---------------------------------------------------------------------------------------------
// fp8

// Two floats -> e4m3fn bytes (base/quant.h: round to nearest even, saturating at +-448,
// NaN -> 0x7f), lo in the low byte: an fp8 GEMM's input. HIP (ROCm 5.2) has no fp8 conversion
// instructions, so it rounds in software.
#if LLM_GPU_HIP
__device__ __forceinline__ uint32_t E4m3Byte(float x) {
  if (isnan(x)) return 0x7fu;
  const uint32_t sign = signbit(x) ? 0x80u : 0u;
  const float a = fabsf(x);
  if (a >= 448.f) return sign | 0x7eu;
  if (a < 0.015625f) return sign | static_cast<uint32_t>(rintf(a * 512.f));  // subnormal grid
  int e;
  const float fr = frexpf(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
  int mant = static_cast<int>(rintf((fr * 2.f - 1.f) * 8.f));
  int biased = e + 6;
  if (mant >= 8) {
    mant = 0;
    ++biased;
  }
  if (biased > 15 || (biased == 15 && mant > 6)) return sign | 0x7eu;
  return sign | static_cast<uint32_t>((biased << 3) | mant);
}
__device__ __forceinline__ uint16_t PackE4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(E4m3Byte(lo) | (E4m3Byte(hi) << 8));
}
#else
__device__ __forceinline__ uint16_t PackE4m3x2(float lo, float hi) {
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}
#endif

// ---------------------------------------------------------------------------------------------
// Warp
#if LLM_GPU_HIP
inline constexpr int kWarpSize = 64;
#else
inline constexpr int kWarpSize = 32;
#endif

__device__ __forceinline__ int LaneId() {
  return static_cast<int>(threadIdx.x) % kWarpSize;
}
__device__ __forceinline__ int WarpId() {
  return static_cast<int>(threadIdx.x) / kWarpSize;
}

__device__ __forceinline__ float ShflXor(float v, int mask) {
#if LLM_GPU_HIP
  return __shfl_xor(v, mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

__device__ __forceinline__ bool WarpAll(bool pred) {
#if LLM_GPU_HIP
  return __all(pred);
#else
  return __all_sync(0xffffffffu, pred);
#endif
}

// 2^x on the special-function unit (relative error ~2^-22, flushes denormals, 2^-inf = 0): the
// softmax inner loop's exponential.
__device__ __forceinline__ float Exp2(float x) {
#if LLM_GPU_HIP
  return exp2f(x);  // v_exp_f32 (clang 15 has no __builtin_amdgcn_exp2f)
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// ---------------------------------------------------------------------------------------------
// Global -> shared copies of 16 bytes. `valid == false` writes zeros (rows past the end must not
// hold NaN: P = 0 times NaN is NaN). Both pointers 16-byte aligned.
__device__ __forceinline__ void CopyAsync16(void* smem, const void* gmem, bool valid) {
#if LLM_GPU_HIP
  uint4 v = make_uint4(0, 0, 0, 0);
  if (valid) v = *static_cast<const uint4*>(gmem);
  *static_cast<uint4*>(smem) = v;
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
               "r"(valid ? 16 : 0));
#endif
}
// 4-byte variant (both pointers 4-byte aligned).
__device__ __forceinline__ void CopyAsync4(void* smem, const void* gmem, bool valid) {
#if LLM_GPU_HIP
  *static_cast<uint32_t*>(smem) = valid ? *static_cast<const uint32_t*>(gmem) : 0u;
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(gmem),
               "r"(valid ? 4 : 0));
#endif
}
__device__ __forceinline__ void AsyncCommit() {
#if LLM_GPU_CUDA
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N committed copy groups are still in flight (this thread's copies only:
// follow with __syncthreads before reading other threads' data).
template <int N>
__device__ __forceinline__ void AsyncWait() {
#if LLM_GPU_CUDA
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ---------------------------------------------------------------------------------------------
// Element types: storage is the raw 16-bit pattern.
struct Bf16 {
  static constexpr bool kIsBf16 = true;
  __device__ __forceinline__ static float ToFloat(uint16_t u) {
    return __uint_as_float(static_cast<uint32_t>(u) << 16);
  }
  // Two floats -> packed pair (lo in the low half), round to nearest even.
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
#if LLM_GPU_HIP
    return static_cast<uint32_t>(Round(lo)) | (static_cast<uint32_t>(Round(hi)) << 16);
#else
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
#endif
  }
#if LLM_GPU_HIP
  __device__ __forceinline__ static uint16_t Round(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
#endif
};

struct F16 {
  static constexpr bool kIsBf16 = false;
  __device__ __forceinline__ static float ToFloat(uint16_t u) {
#if LLM_GPU_HIP
    return static_cast<float>(__builtin_bit_cast(_Float16, u));
#else
    return __half2float(__ushort_as_half(u));
#endif
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
#if LLM_GPU_HIP
    const uint16_t a = __builtin_bit_cast(uint16_t, static_cast<_Float16>(lo));
    const uint16_t b = __builtin_bit_cast(uint16_t, static_cast<_Float16>(hi));
    return static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
#else
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
#endif
  }
};

// ---------------------------------------------------------------------------------------------
// Warp tile MMA (layouts: see the top of this file).
#if LLM_GPU_HIP
inline constexpr int kFragRegs = 2;  // b32 registers per A or B fragment
inline constexpr int kAccElems = 4;  // fp32 accumulator elements per lane
inline constexpr int kRowSlots = 1;  // distinct rows per lane in one accumulator tile
#else
inline constexpr int kFragRegs = 4;
inline constexpr int kAccElems = 8;
inline constexpr int kRowSlots = 2;
#endif

struct FragA {
  uint32_t x[kFragRegs];
};
struct FragB {
  uint32_t x[kFragRegs];
};
struct FragC {
  float x[kAccElems];
};

__device__ __forceinline__ void Zero(FragC& c) {
#pragma unroll
  for (int e = 0; e < kAccElems; ++e) c.x[e] = 0.f;
}

// Row (0..15) and column (0..15) of accumulator element e of this lane.
__device__ __forceinline__ int AccRow(int e) {
#if LLM_GPU_HIP
  return LaneId() % 16;
#else
  return LaneId() / 4 + 8 * ((e >> 1) & 1);
#endif
}
__device__ __forceinline__ int AccCol(int e) {
#if LLM_GPU_HIP
  return 4 * (LaneId() / 16) + e;
#else
  return 8 * (e >> 2) + 2 * (LaneId() % 4) + (e & 1);
#endif
}
// Row slot (0..kRowSlots-1) of element e, and the row of a slot.
__device__ __forceinline__ constexpr int AccSlot(int e) {
#if LLM_GPU_HIP
  return 0 * e;
#else
  return (e >> 1) & 1;
#endif
}
__device__ __forceinline__ int SlotRow(int slot) {
#if LLM_GPU_HIP
  return LaneId() % 16 + 0 * slot;
#else
  return LaneId() / 4 + 8 * slot;
#endif
}

// Reductions over the lanes that hold the same row (every lane gets the result).
__device__ __forceinline__ float RowMax(float v) {
#if LLM_GPU_HIP
  v = fmaxf(v, ShflXor(v, 16));
  return fmaxf(v, ShflXor(v, 32));
#else
  v = fmaxf(v, ShflXor(v, 1));
  return fmaxf(v, ShflXor(v, 2));
#endif
}
__device__ __forceinline__ float RowSum(float v) {
#if LLM_GPU_HIP
  v += ShflXor(v, 16);
  return v + ShflXor(v, 32);
#else
  v += ShflXor(v, 1);
  return v + ShflXor(v, 2);
#endif
}

#if LLM_GPU_CUDA
namespace detail {
__device__ __forceinline__ unsigned SmemAddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
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
template <typename T>
__device__ __forceinline__ void Mma16816(float* c, const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (T::kIsBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
}  // namespace detail
#else
namespace detail {
typedef short Short4 __attribute__((ext_vector_type(4)));
typedef _Float16 Half4 __attribute__((ext_vector_type(4)));
typedef float Float4 __attribute__((ext_vector_type(4)));
}  // namespace detail
#endif

// Shared-memory fragment loaders. `p` points at element (0, 0) of the 16x16 block, `ld` is the
// row pitch in elements; rows 16-byte aligned (ld a multiple of 8).
// A[m][k] = p[m * ld + k]
__device__ __forceinline__ void LoadA(FragA& a, const uint16_t* p, int ld) {
  const int l = LaneId();
#if LLM_GPU_HIP
  const uint2 v = *reinterpret_cast<const uint2*>(p + (l % 16) * ld + 4 * (l / 16));
  a.x[0] = v.x;
  a.x[1] = v.y;
#else
  detail::LdMatrixX4(a.x, p + (l % 16) * ld + 8 * (l / 16));
#endif
}
// B[k][n] = p[n * ld + k] (B stored transposed: the K tile of S = Q K^T, rows = keys)
__device__ __forceinline__ void LoadBt(FragB& b, const uint16_t* p, int ld) {
  const int l = LaneId();
#if LLM_GPU_HIP
  const uint2 v = *reinterpret_cast<const uint2*>(p + (l % 16) * ld + 4 * (l / 16));
  b.x[0] = v.x;
  b.x[1] = v.y;
#else
  const int mi = l / 8;
  detail::LdMatrixX4(b.x, p + (l % 8 + 8 * (mi >> 1)) * ld + 8 * (mi & 1));
#endif
}
// B[k][n] = p[k * ld + n] (the V tile of O = P V, rows = keys)
__device__ __forceinline__ void LoadB(FragB& b, const uint16_t* p, int ld) {
  const int l = LaneId();
#if LLM_GPU_HIP
  const uint16_t* q = p + 4 * (l / 16) * ld + l % 16;
  b.x[0] = static_cast<uint32_t>(q[0]) | (static_cast<uint32_t>(q[ld]) << 16);
  b.x[1] = static_cast<uint32_t>(q[2 * ld]) | (static_cast<uint32_t>(q[3 * ld]) << 16);
#else
  const int mi = l / 8;
  detail::LdMatrixX4T(b.x, p + (l % 8 + 8 * (mi & 1)) * ld + 8 * (mi >> 1));
#endif
}

// c += a * b, element type T (Bf16 or F16).
template <typename T>
__device__ __forceinline__ void Mma(FragC& c, const FragA& a, const FragB& b) {
#if LLM_GPU_HIP
  detail::Float4 acc = {c.x[0], c.x[1], c.x[2], c.x[3]};
  if constexpr (T::kIsBf16) {
    const detail::Short4 ha = __builtin_bit_cast(detail::Short4, b);  // hwA = B^T
    const detail::Short4 hb = __builtin_bit_cast(detail::Short4, a);  // hwB = A^T
    acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(ha, hb, acc, 0, 0, 0);
  } else {
    const detail::Half4 ha = __builtin_bit_cast(detail::Half4, b);
    const detail::Half4 hb = __builtin_bit_cast(detail::Half4, a);
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(ha, hb, acc, 0, 0, 0);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) c.x[e] = acc[e];
#else
  detail::Mma16816<T>(c.x, a.x, b.x[0], b.x[1]);
  detail::Mma16816<T>(c.x + 4, a.x, b.x[2], b.x[3]);
#endif
}

// The accumulator tile (16 rows x 16 columns) rounded to T as an A operand (16 rows x k = 16).
template <typename T>
__device__ __forceinline__ FragA AccToA(const FragC& c) {
  FragA a;
#pragma unroll
  for (int r = 0; r < kFragRegs; ++r) a.x[r] = T::Pack(c.x[2 * r], c.x[2 * r + 1]);
  return a;
}

}  // namespace llm::gpu
