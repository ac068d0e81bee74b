// Hopper (sm_90a) warpgroup MMA primitives for the sm_90a kernels (the FMHA prefill kernel,
// kernels/fmha/fmha_wgmma_kernel.cuh, and MLA decode, mla_decode_wgmma.cu): shared-memory matrix
// descriptors for the 128-byte swizzle, the wgmma fence / commit / wait protocol, mbarriers,
// setmaxnreg, and the product shapes the kernels issue. CUDA only, and only in translation units
// compiled for sm_90a (the wgmma instructions do not exist on any other target).
//
// Operand layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   - A warpgroup is 4 consecutive warps starting at a warp index divisible by 4; warp w of it owns
//     rows 16w .. 16w + 15 of the 64-row tile.
//   - Accumulator D[64 x N], fp32: lane l of warp w holds d[4j + e] = D[16w + l/4 + 8((e>>1)&1)]
//     [8j + 2(l%4) + (e&1)], j = 0 .. N/8 - 1: per 8-column slice, the mma.sync m16n8 C layout.
//   - A from registers (16 x 16 per warp): the mma.sync m16n8k16 A layout, so the accumulator of
//     S = Q K^T over keys 16kk .. 16kk + 15 (d[8kk .. 8kk + 7]) packed pairwise is the A operand of
//     O += P V for those keys.
//   - Shared-memory operands use the 128-byte swizzle: a tile is stored as panels of 64 columns
//     (128 bytes of 16-bit elements per row); within a panel, row r's 16-byte chunk c sits at
//     r * 128 + ((c ^ (r % 8)) * 16); panels and tiles are 1024-byte aligned (the swizzle is a
//     function of address bits 4-9).
//       K-major (rows = M or N, contiguous = K): stride byte offset (SBO) = 1024 (next 8 rows),
//       leading byte offset unused; the k-th 16-element slice of a panel starts 32k bytes in.
//       MN-major (rows = K, contiguous = N; V in O = P V): SBO = 1024 (next 8 k-rows), LBO = the
//       panel stride (next 64 columns of N); k-slice kk starts 16 * 128 * kk bytes in.
#pragma once

#include <cstdint>

namespace llm::cuda::wgmma {

// Swizzle modes of a shared-memory matrix descriptor (bits 62-63).
enum Swizzle : uint64_t { kSwizzle128B = 1, kSwizzle64B = 2 };

// Shared-memory matrix descriptor, by default with the 128-byte swizzle. With the 64-byte swizzle
// (the fp8 MLA tiles: 64-byte rows, chunk c of row r at c ^ (r / 2 % 4)) a K-major operand has
// SBO = 512 (next 8 rows) and its 32-byte k-slices start 32 bytes apart.
__device__ __forceinline__ uint64_t Desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                         Swizzle swizzle = kSwizzle128B) {
  uint64_t d = (smem_addr & 0x3FFFFu) >> 4;
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(swizzle) << 62;
  return d;
}

// A descriptor advanced by `bytes` (a multiple of 16): only the start-address field (bits 0-13,
// in 16-byte units) moves, and it cannot carry into the next field inside the 256 KB shared
// window. One 32-bit add (uniform registers) instead of a fresh Desc's masks and shifts per wgmma:
// 4 instructions per m64n64k16 instead of 13 in the MLA kernel's S chain.
__device__ __forceinline__ uint64_t DescAdd(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) |
         static_cast<uint32_t>(static_cast<uint32_t>(desc) + (bytes >> 4));
}

// Byte offset of 16-bit element (row, k) in a K-major panel of 64 k (128-byte rows, swizzled as
// above).
__device__ __forceinline__ int SwizzledOffset(int row, int k) {
  return row * 128 + ((((k >> 3) ^ row) & 7) << 4) + (k & 7) * 2;
}

// Orders this thread's register writes before the next wgmma that reads or writes them.
__device__ __forceinline__ void Fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the wgmma instructions issued since the last commit into one group.
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) becomes visible to the
// tensor cores' async proxy: each writing thread, before the barrier that publishes the data.
__device__ __forceinline__ void ProxyFence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The compiler does not know that a wgmma reads and writes its registers asynchronously: pinning
// them after a Wait keeps later reads (and reuse of the registers) behind it.
template <int N>
__device__ __forceinline__ void Pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// ---- mbarriers (shared-memory arrive/wait barriers) and warpgroup register reallocation.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// One arrival on `bar` once every cp.async this thread issued so far has landed (counted in the
// barrier's initial count: .noinc).
__device__ __forceinline__ void MbarArriveOnCopies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits for the completion of the barrier phase with this parity (0 for its first phase, then
// alternating).
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Non-blocking: whether the barrier phase with this parity has completed.
__device__ __forceinline__ bool MbarTest(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// One arrival that also expects `bytes` of tensor-copy (TMA) transactions on the barrier.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// A 2-D tensor copy (TMA): the box of the tensor map `map` (a CUtensorMap in parameter or
// constant space) at element coordinates (x, y) into shared memory at `dst`, completing bytes on
// the mbarrier `bar`. The map's swizzle mode lays the box out (128-byte: the wgmma layout).
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* map, int x, int y,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// The same copy with an L2 eviction-priority policy (EvictFirstPolicy): for data read once.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const void* map, int x, int y, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// Register file split between warpgroup roles (needs a register cap at kernel entry).
template <int N>
__device__ __forceinline__ void RegAlloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void RegDealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// This thread's partial per-row maxima of a 64 x 64 accumulator fragment (values x with
// (x >> 1) & 1 == h belong to its row h), as a tree: a chain of 16 dependent maxima per row sat
// on the MLA kernels' critical path. The four lanes of a quad still hold parts of the same row.
__device__ __forceinline__ void RowMax64(const float (&s)[32], float (&mx)[2]) {
  float tm[2][8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) tm[h][j] = fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
  }
#pragma unroll
  for (int step = 4; step >= 1; step /= 2) {
#pragma unroll
    for (int j = 0; j < step; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) tm[h][j] = fmaxf(tm[h][j], tm[h][j + step]);
    }
  }
  mx[0] = tm[0][0];
  mx[1] = tm[1][0];
}

// ptxas hoists a wgmma wait above independent arithmetic (seen in the FMHA kernel: the softmax
// of S_i moved below the wait for P_{i-1} V_{i-1}, and the two no longer overlapped). A shared
// store that depends on `x` (a result of that arithmetic) and is never executed (x >= 0 always)
// keeps the arithmetic above the wait; `scratch` is a shared word nothing else uses.
__device__ __forceinline__ void KeepAbove(float x, uint32_t scratch) {
  if (x < 0.f) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scratch), "f"(x) : "memory");
}
template <int N>
__device__ __forceinline__ void Pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Operand lists shared by the bf16 and fp16 forms: the element type (TY, "bf16" or "f16") is the
// only difference between them. The predicate p is scale-d (0: D = A B, 1: D += A B).
#define LLM_WGMMA_ACC64                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define LLM_WGMMA_ACC32                                                    \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define LLM_WGMMA_OUT64                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define LLM_WGMMA_OUT32                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define LLM_WGMMA_ACC128                                                                         \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "             \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "             \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "             \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "   \
  "%127}, "
#define LLM_WGMMA_OUT128                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),  \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),  \
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),  \
      "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),  \
      "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),  \
      "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),          \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),         \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),         \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),         \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// Both operands from shared memory; OPERANDS ends with the scale / transpose immediates and
// PRED names the register operand that sets scale-d.
#define LLM_WGMMA_SS(SHAPE, ACC, OUT, OPERANDS, PRED, TY)                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED                                           \
               ", 0;\n"                                                                           \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" ACC OPERANDS ";\n}\n" \
               : OUT                                                                              \
               : "l"(a), "l"(b), "r"(scale_d))
// A from registers, B from shared memory (MN-major: trans-b = 1), accumulating.
#define LLM_WGMMA_RS(SHAPE, ACC, OUT, OPERANDS, TY)                             \
  asm volatile(                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                \
      "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" ACC OPERANDS \
      ", p, 1, 1, 1;\n}\n"                                                      \
      : OUT                                                                     \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

// D[64 x 128] (fp32; D = A B when scale_d == 0, else D += A B) = A[64 x 16] * B[16 x 128], both
// from shared memory through K-major descriptors.
template <bool kBf16>
__device__ __forceinline__ void MmaSS128(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (kBf16) {
    LLM_WGMMA_SS("m64n128k16", LLM_WGMMA_ACC64, LLM_WGMMA_OUT64, "%64, %65, p, 1, 1, 0, 0", "%66",
                 "bf16");
  } else {
    LLM_WGMMA_SS("m64n128k16", LLM_WGMMA_ACC64, LLM_WGMMA_OUT64, "%64, %65, p, 1, 1, 0, 0", "%66",
                 "f16");
  }
}

// D[64 x N] += A[64 x 16] (registers: the accumulator-shaped fragment) * B[16 x N] (shared
// memory, MN-major descriptor: B is stored [k][n], n contiguous), N = 128 or 64.
template <bool kBf16>
__device__ __forceinline__ void MmaRS128(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kBf16) {
    LLM_WGMMA_RS("m64n128k16", LLM_WGMMA_ACC64, LLM_WGMMA_OUT64, "{%64, %65, %66, %67}, %68",
                 "bf16");
  } else {
    LLM_WGMMA_RS("m64n128k16", LLM_WGMMA_ACC64, LLM_WGMMA_OUT64, "{%64, %65, %66, %67}, %68",
                 "f16");
  }
}
template <bool kBf16>
__device__ __forceinline__ void MmaRS64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (kBf16) {
    LLM_WGMMA_RS("m64n64k16", LLM_WGMMA_ACC32, LLM_WGMMA_OUT32, "{%32, %33, %34, %35}, %36",
                 "bf16");
  } else {
    LLM_WGMMA_RS("m64n64k16", LLM_WGMMA_ACC32, LLM_WGMMA_OUT32, "{%32, %33, %34, %35}, %36", "f16");
  }
}

// D[64 x 64] (fp32; D = A B when scale_d == 0, else D += A B) = A[64 x 16] * B[16 x 64], both
// from shared memory through K-major descriptors (MLA: S = Q K^T).
template <bool kBf16>
__device__ __forceinline__ void MmaSS64(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (kBf16) {
    LLM_WGMMA_SS("m64n64k16", LLM_WGMMA_ACC32, LLM_WGMMA_OUT32, "%32, %33, p, 1, 1, 0, 0", "%34",
                 "bf16");
  } else {
    LLM_WGMMA_SS("m64n64k16", LLM_WGMMA_ACC32, LLM_WGMMA_OUT32, "%32, %33, p, 1, 1, 0, 0", "%34",
                 "f16");
  }
}
// D[64 x 256] += A[64 x 16] (registers) * B[16 x 256] (shared memory, MN-major), bf16 (MLA:
// O_half += P V_half).
__device__ __forceinline__ void MmaRS256Bf16(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  LLM_WGMMA_RS("m64n256k16", LLM_WGMMA_ACC128, LLM_WGMMA_OUT128, "{%128, %129, %130, %131}, %132",
               "bf16");
}
// D[64 x 256] += A[64 x 16] (shared memory, K-major) * B[16 x 256] (shared memory, MN-major),
// bf16 (MLA: the other warpgroup's P, published in shared memory).
__device__ __forceinline__ void MmaSS256TBf16(float (&d)[128], uint64_t a, uint64_t b) {
  const int scale_d = 1;
  LLM_WGMMA_SS("m64n256k16", LLM_WGMMA_ACC128, LLM_WGMMA_OUT128, "%128, %129, p, 1, 1, 0, 1",
               "%130", "bf16");
}

#undef LLM_WGMMA_RS
#undef LLM_WGMMA_SS
#undef LLM_WGMMA_OUT32
#undef LLM_WGMMA_OUT64
#undef LLM_WGMMA_ACC32
#undef LLM_WGMMA_ACC64
#undef LLM_WGMMA_OUT128
#undef LLM_WGMMA_ACC128

}  // namespace llm::cuda::wgmma
