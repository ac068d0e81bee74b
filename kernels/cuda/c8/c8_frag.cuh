// Cache-type traits and the MMA fragment helpers shared by the C8 tile kernel's two math layouts
// (internal; c8_row_math.cuh, c8_col_math.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/c8/c8_kernel_args.h"
#include "kernels/cuda/common/ptx_ops.cuh"

namespace llm::cuda::detail {

// Cache-type traits. The bf16 cache feeds bf16 tensor cores directly. 8-bit caches stay 8-bit in
// shared memory and are dequantized in registers right after ldmatrix (int8 by the 0x6400
// magic-number trick, e4m3 by the hardware f16x2 conversion) into fp16 fragments; both are exact.
// Loading 8-bit data with ldmatrix permutes which d (for K) and which output column (for V) a
// thread holds; q is loaded with the same permutation and the output is un-permuted at the end.
// kDecodeStages: the decode layout's ring depth when the plan does not pick one (prefill keeps
// 2). The planner picks 2, 3 or 4 stages per step from the grid (BuildC8Plan): a 3-stage ring
// (106 KB for bf16 at d = 128, 111 KB for 8-bit: 2 CTAs per SM on Hopper) keeps two tiles in
// flight per CTA, a 4-stage ring three at one CTA per SM. A ring runs only where a block may have
// that much shared memory, else the next shallower one (DecodeStages).
struct Bf16Cache {
  static constexpr int kBytes = 2;
  static constexpr int kTile = kKvTile16;  // KV tokens per shared-memory stage
  static constexpr int kDecodeStages = 3;
};
struct Int8Cache {
  static constexpr int kBytes = 1;
  static constexpr int kTile = kKvTile8;
  static constexpr int kDecodeStages = 2;
};
struct Fp8Cache {
  static constexpr int kBytes = 1;
  static constexpr int kTile = kKvTile8;
  static constexpr int kDecodeStages = 2;
};

// Two bytes of a 32-bit word (selected by a __byte_perm selector) -> f16x2. int8 values are
// stored excess-128 (byte = q ^ 0x80 = q + 128), so placing a byte in the mantissa of 1024.0
// gives 1024 + q + 128 = q + 1152, exact in fp16. kOffset: keep the +1152 (K: q.(k + 1152)
// shifts a query's scores by a constant, which softmax ignores; V: the caller subtracts
// 1152 x sum(P) at the end); otherwise subtract it here.
template <typename C, bool kOffset = false>
__device__ __forceinline__ uint32_t Bytes2ToF16x2(uint32_t w, uint32_t sel_int8, uint32_t sel_fp8) {
  if constexpr (std::is_same_v<C, Int8Cache>) {
    const uint32_t h = __byte_perm(w, 0x64646464u, sel_int8);
    if constexpr (kOffset) return h;
    __half2 v = *reinterpret_cast<const __half2*>(&h);
    v = __hsub2(v, __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    const uint32_t pair = __byte_perm(w, 0u, sel_fp8) & 0xffffu;
    const __half2_raw r =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// What both math layouts need to know about a cache type's tiles and fragments.
template <typename C, int D>
struct CacheFrag {
  static constexpr bool kEight = C::kBytes == 1;
  static constexpr int kRowBytes = D * C::kBytes + 16;  // 16 B pad: conflict-free ldmatrix
  // int8 V keeps its +1152 offset in the products; the sum of the P actually multiplied removes
  // it at the end.
  static constexpr bool kVOffset = std::is_same_v<C, Int8Cache>;

  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (kEight)
      ptx::MmaF16(c, a, b0, b1);
    else
      ptx::MmaBf16(c, a, b0, b1);
  }
  __device__ static uint32_t Pack(float lo, float hi) {
    if constexpr (kEight)
      return ptx::PackF16(lo, hi);
    else
      return ptx::PackBf16(lo, hi);
  }
  // Physical d of the q pair a thread loads for k-step kk, fragment register j (0..3; j & 2
  // selects the upper k half). 8-bit: the d permutation ldmatrix gives the K bytes.
  __device__ static int QCol(int kk, int t, int j) {
    if constexpr (kEight)
      return kk * 16 + 4 * t + ((j & 2) ? 2 : 0);
    else
      return kk * 16 + 2 * t + ((j & 2) ? 8 : 0);
  }
  // Fragments of one 16-token x 16-d block of a K or V tile held by lane (g, t), in the form both
  // math layouts take them. K: x[i][j] holds token 8i + g at the j-th d pair of the block (d as
  // QCol); the row layout's B operand for tokens 8i.. is (x[i][0], x[i][1]). V: x[i][j] holds
  // tokens 8j + 2t, 8j + 2t + 1 at the block's d half i; the row layout's B operand for that
  // half is (x[i][0], x[i][1]). The column layout's A operand is the same block read column-wise
  // (ColA).
  struct Block {
    uint32_t x[2][2];
  };
  __device__ static void ColA(const Block& b, uint32_t (&a)[4]) {
    a[0] = b.x[0][0];
    a[1] = b.x[1][0];
    a[2] = b.x[0][1];
    a[3] = b.x[1][1];
  }
  static constexpr int kBlocksPerLoad = kEight ? 2 : 1;  // 16-d blocks per ldmatrix.x4
  static constexpr int kLoads = D / 16 / kBlocksPerLoad;

  // K blocks c * kBlocksPerLoad .. of tile rows [n0, n0 + 16). kOffsetK: int8 K keeps its +1152.
  template <bool kOffsetK>
  __device__ static void LoadK(Block (&b)[kBlocksPerLoad], const uint8_t* k_tile, int n0, int c,
                               int lane) {
    const int mi = lane / 8, rr = lane % 8;
    uint32_t r[4];
    if constexpr (kEight) {
      ptx::LdMatrixX4(r, k_tile + (n0 + rr + (mi & 1) * 8) * kRowBytes + c * 32 + (mi >> 1) * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // r[2h]: tokens 0-7, r[2h + 1]: tokens 8-15
          b[h].x[i][0] = Bytes2ToF16x2<C, kOffsetK>(r[2 * h + i], 0x4140, 0x0010);
          b[h].x[i][1] = Bytes2ToF16x2<C, kOffsetK>(r[2 * h + i], 0x4342, 0x0032);
        }
      }
    } else {
      ptx::LdMatrixX4(
          r, k_tile + (n0 + rr + (mi >= 2 ? 8 : 0)) * kRowBytes + (c * 16 + (mi & 1) * 8) * 2);
      b[0] = {{{r[0], r[1]}, {r[2], r[3]}}};
    }
  }
  // V blocks c * kBlocksPerLoad .. of tile rows [n0, n0 + 16) (int8 keeps its +1152: kVOffset).
  __device__ static void LoadV(Block (&b)[kBlocksPerLoad], const uint8_t* v_tile, int n0, int c,
                               int lane) {
    const int mi = lane / 8, rr = lane % 8;
    uint32_t r[4];
    if constexpr (kEight) {
      ptx::LdMatrixX4T(r, v_tile + (n0 + rr + (mi & 1) * 8) * kRowBytes + c * 32 + (mi >> 1) * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // r[2h]: tokens 0-7, r[2h + 1]: tokens 8-15
          b[h].x[0][j] = Bytes2ToF16x2<C, kVOffset>(r[2 * h + j], 0x4240, 0x0020);
          b[h].x[1][j] = Bytes2ToF16x2<C, kVOffset>(r[2 * h + j], 0x4341, 0x0031);
        }
      }
    } else {
      ptx::LdMatrixX4T(
          r, v_tile + (n0 + rr + (mi & 1) * 8) * kRowBytes + (c * 16 + (mi >> 1) * 8) * 2);
      b[0] = {{{r[0], r[1]}, {r[2], r[3]}}};
    }
  }

  // One query's bf16 pair at physical d (q row of the flattened batch, as bf16x2 bits).
  __device__ static uint32_t LoadQPair(const TileArgs& args, const C8WorkItem& item, int kvh,
                                       int group, int row, int d) {
    const int tok = row / group, head = kvh * group + row % group;
    if (tok >= item.q_len) return 0u;  // padding rows: q = 0
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(args.q);
    return *reinterpret_cast<const uint32_t*>(
        q + (static_cast<size_t>(item.q_start + tok) * args.num_q_heads + head) * D + d);
  }
  // bf16x2 bits of q at physical d -> the MMA's input type, with a per-channel K scale folded in.
  __device__ static uint32_t PackQ(const TileArgs& args, int kvh, uint32_t bits, int d) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&bits);
    float x0 = __bfloat162float(v.x), x1 = __bfloat162float(v.y);
    if (args.scale_mode == static_cast<int>(ScaleMode::kPerChannel)) {
      x0 *= args.k_scale[kvh * D + d];
      x1 *= args.k_scale[kvh * D + d + 1];
    }
    return Pack(x0, x1);
  }
};

}  // namespace llm::cuda::detail
