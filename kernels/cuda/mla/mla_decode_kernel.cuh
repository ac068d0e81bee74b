// The MLA decode kernel (internal; included by one .cu per cache type).
//
// Design (consumer-Blackwell limits, so the same source runs on sm_90 and sm_120): at most 99 KB
// of shared memory per CTA, warp-level mma.sync only (no wgmma, no TMA), no clusters.
//
// One CTA (8 warps) = one work item: ROWS query rows (16, 32 or 64) of one sequence against a KV
// range. Rows are heads first, then tokens (64 heads of one token, 16 heads x 4 tokens, ...), so
// every K/V byte a CTA loads serves all of them. KV tiles of 32 tokens x 576 dims stream through
// a cp.async ring in shared memory; QK (576 wide) and PV (the first 512 columns of the same tile)
// both read that one copy.
//
// Per tile:
//   QK: warp (rg, kg) computes a partial S for rows [16 rg, 16 rg + 16) x 32 tokens over its share
//       of the 36 k16-steps (576 dims). Its q_latent fragments stay in registers for the whole
//       item (the k-split keeps that at 64 per thread for 64 rows, next to the 128 of the
//       512-column O accumulator); q_pe (4 steps) is read from shared memory.
//   Softmax: the k-groups' partials are added through shared memory, masked, and run through the
//       online softmax in the log2 domain, which publishes P (16-bit) and the per-row rescale
//       factor in shared memory. Up to 32 rows four warps per row group share this (each thread
//       2 rows x 2 tokens); with 64 rows the kg == 0 warps do it alone (no room for their
//       partials in shared memory).
//   PV: every warp owns 64 of the 512 output columns for all ROWS rows (S is computed once and
//       shared), rescales its accumulator and adds P V on tensor cores.
//
// Cache types: bf16 feeds bf16 MMAs (m16n8k16) directly. fp8 e4m3 stays 8-bit in shared memory
// (half the bytes per tile, so twice the tokens in flight per stage byte) and is converted in
// registers right after ldmatrix by the hardware e4m3x2 -> f16x2 cvt, which is exact; q and P are
// f16 and the MMAs f16 (m16n8k16, fp32 accumulate). The layer scale folds into the softmax scale
// (K) and the output (V). Fp8MmaCache instead feeds the bytes to fp8 MMAs (m16n8k32 e4m3, sm_89+)
// with q and P split into two e4m3 terms each (~8 significant bits, like bf16): no conversions,
// the same MMA count. It is sm_120's fp8 path; Hopper's fp8 mma.sync is no faster than f16, so
// the split doubles the tensor time and the f16 kernel is chosen there (MlaFp8Math).
// Loading 8-bit data with ldmatrix permutes which dim a thread holds (K) and which output column
// (V); q is loaded with the same permutation and the output is un-permuted at the store.
//
// Shared memory (bytes): stages x 32 x (576 x elem + 16) for KV (bf16: 2 stages = 74,752; fp8:
// 4 stages = 75,776) + the k-split partials (8 or 16 KB) + P (ROWS x 40 x 2) + q_pe (ROWS x 72 x
// 2) + row stats (ROWS x 12): 88.3 to 97.4 KB, under sm_120's 99 KB (static_assert in Config).
// Registers (ptxas, sm_90a / sm_120): 64 rows ~255 (1 CTA/SM), 32 rows ~180-190 (1 CTA/SM), 16 rows
// <= 128 (2 CTAs/SM on sm_90; shared memory allows 1 on sm_120).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common/pdl_launch.cuh"
#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/mla/mla_item.cuh"
#include "kernels/cuda/mla/mla_kernel_args.h"

namespace llm::cuda::mla {

using ptx::CpAsync16;
using ptx::CpAsyncCommit;
using ptx::CpAsyncWait;
using ptx::Fp8x2ToF16x2;
using ptx::LdMatrixX4;
using ptx::LdMatrixX4T;
using ptx::MmaBf16;
using ptx::MmaF16;
using ptx::SmemAddr;
using ptx::SplitE4m3x2;

// Cache-type traits: element bytes, ring depth, MMA input type and the fragment permutations.
// Every trait provides: kK (dims per MMA k-step), QFrag (one k-step of q in registers), LoadQ /
// StoreQpe / LoadQpe (q_latent fragments, q_pe in shared memory), QK, StoreP, PV and Pair (which
// accumulator entries are adjacent output dims), plus kScaledQ / kPScale (fp8 MMA: q is scaled
// per row and P by kPScale into e4m3 range; both are undone in the softmax and at the output).
constexpr int kQpeRowBytes = 144;  // q_pe row in shared memory: 64 x 16-bit + 16 pad
constexpr int kPRowBytes = 80;     // P row: 32 tokens x 16-bit (or 2 x 32 e4m3) + 16 pad

// The f16/bf16-MMA traits share their q and P handling; D supplies QCol (which dim a fragment
// register holds) and Pack.
template <typename D>
struct Mma16Traits {
  static constexpr int kK = 16;
  static constexpr bool kScaledQ = false;
  static constexpr float kPScale = 1.f;
  struct QFrag {
    uint32_t r[4];
  };
  // Fragment of k16-step kk for rows g (q0) and g + 8 (q1), bf16 rows of the latent q.
  __device__ static void LoadQ(QFrag& f, const uint16_t* q0, const uint16_t* q1, int kk, int t,
                               float, float) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 v =
          *reinterpret_cast<const __nv_bfloat162*>(((j & 1) ? q1 : q0) + D::QCol(kk, t, j));
      f.r[j] = D::Pack(__bfloat162float(v.x), __bfloat162float(v.y));
    }
  }
  // q_pe [rows][64] bf16 -> [rows][kQpeRowBytes], permuted within 16-dim blocks so that a plain
  // A-fragment ldmatrix yields what QCol describes.
  __device__ static void StoreQpe(uint8_t* qpe_s, const uint16_t* qpe_stage, const float*, int rows,
                                  int tid, int threads) {
    for (int i = tid; i < rows * kMlaRopeDim / 2; i += threads) {
      const int r = i / (kMlaRopeDim / 2), k = 2 * (i % (kMlaRopeDim / 2));  // logical k, even
      // Logical k of step kk holds dim QCol(kk, t, j) + e with t = (k % 8) / 2, j = k / 8 * 2.
      const int kk = k / 16, kin = k % 16;
      const int col = D::QCol(kk, (kin % 8) / 2, (kin / 8) * 2);
      const __nv_bfloat162 v =
          *reinterpret_cast<const __nv_bfloat162*>(qpe_stage + r * kMlaRopeDim + col);
      *reinterpret_cast<uint32_t*>(qpe_s + r * kQpeRowBytes + k * 2) =
          D::Pack(__bfloat162float(v.x), __bfloat162float(v.y));
    }
  }
  // Rope k-step i of the 16 rows from row_base.
  __device__ static void LoadQpe(QFrag& f, const uint8_t* qpe_s, int row_base, int i, int lane) {
    LdMatrixX4(f.r, qpe_s + (row_base + lane % 16) * kQpeRowBytes + (i * 16 + (lane / 16) * 8) * 2);
  }
  // P of tokens tok, tok + 1 into row p_row.
  __device__ static void StoreP(uint8_t* p_row, int tok, float a, float b) {
    *reinterpret_cast<uint32_t*>(p_row + tok * 2) = D::Pack(a, b);
  }
  __device__ static void LoadP(uint32_t (&pa)[4], const uint8_t* p, int mt, int ks, int lane) {
    LdMatrixX4(pa, p + (mt * 16 + lane % 16) * kPRowBytes + (ks * 16 + (lane / 16) * 8) * 2);
  }
};

struct Bf16Cache : Mma16Traits<Bf16Cache> {
  static constexpr int kBytes = 2;
  static constexpr int kStages = 2;
  static constexpr int kLoadThreadsPerRow = 8;  // 72 16-byte chunks per row: 9 each

  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    MmaBf16(c, a, b0, b1);
  }
  __device__ static uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  // Dim of the q pair a thread loads for A-fragment register j of k16-step kk.
  __device__ static int QCol(int kk, int t, int j) { return kk * 16 + 2 * t + ((j & 2) ? 8 : 0); }
  // s[n] += q . K^T for 32 tokens (n-tile n = tokens 8n..8n+7) at k16-step kk.
  __device__ static void QK(float (&s)[4][4], const QFrag& q, const uint8_t* k_tile, int row_bytes,
                            int kk, int lane) {
    const int mi = lane / 8, rr = lane % 8;
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t b[4];
      LdMatrixX4(b, k_tile + (np * 16 + rr + (mi >= 2 ? 8 : 0)) * row_bytes +
                        (kk * 16 + (mi & 1) * 8) * 2);
      Mma(s[2 * np], q.r, b[0], b[1]);
      Mma(s[2 * np + 1], q.r, b[2], b[3]);
    }
  }
  // acc[mt][n] += P[mt] V for 16 tokens (k16-step ks) and this warp's 64 columns from col0.
  // Up to 2 m-tiles all P fragments stay live and V is loaded per 16 columns; with 4 the V
  // fragments stay live instead (fewer registers either way).
  template <int MT>
  __device__ static void PV(float (&acc)[MT][8][4], const uint8_t* v_tile, int row_bytes,
                            const uint8_t* p, int ks, int col0, int lane) {
    const int mi = lane / 8, rr = lane % 8;
    const uint8_t* v_base = v_tile + (ks * 16 + rr + (mi & 1) * 8) * row_bytes;
    auto load_v = [&](uint32_t(&vb)[4], int np) {
      LdMatrixX4T(vb, v_base + (col0 + np * 16 + (mi >> 1) * 8) * 2);
    };
    auto load_p = [&](uint32_t(&pa)[4], int mt) { LoadP(pa, p, mt, ks, lane); };
    if constexpr (MT <= 2) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_p(pa[mt], mt);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t vb[4];
        load_v(vb, np);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma(acc[mt][2 * np], pa[mt], vb[0], vb[1]);
          Mma(acc[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
        }
      }
    } else {
      uint32_t vb[4][4];
#pragma unroll
      for (int np = 0; np < 4; ++np) load_v(vb[np], np);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t pa[4];
        load_p(pa, mt);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          Mma(acc[mt][2 * np], pa, vb[np][0], vb[np][1]);
          Mma(acc[mt][2 * np + 1], pa, vb[np][2], vb[np][3]);
        }
      }
    }
  }
  // Output pair i (0..7) of row half h (rows g / g + 8): entries (acc[n0][e0], acc[n1][e1]) are
  // the adjacent dims d, d + 1 (relative to the warp's col0).
  static constexpr int kPairs = 8;
  __device__ static void Pair(int i, int h, int t, int* n0, int* e0, int* n1, int* e1, int* d) {
    *n0 = *n1 = i;
    *e0 = 2 * h;
    *e1 = 2 * h + 1;
    *d = i * 8 + 2 * t;
  }
};

struct Fp8Cache : Mma16Traits<Fp8Cache> {
  static constexpr int kBytes = 1;
  static constexpr int kStages = 4;
  static constexpr int kLoadThreadsPerRow = 4;  // 36 16-byte chunks per row: 9 each

  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    MmaF16(c, a, b0, b1);
  }
  __device__ static uint32_t Pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  // ldmatrix on 8-bit rows hands thread t the 4 bytes (dims 16 kk + 4t .. + 3) of a token: the
  // B fragment's k = 2t, 2t+1 are dims 4t, 4t+1 and k = 2t+8, 2t+9 are dims 4t+2, 4t+3.
  __device__ static int QCol(int kk, int t, int j) { return kk * 16 + 4 * t + ((j & 2) ? 2 : 0); }
  __device__ static void QK(float (&s)[4][4], const QFrag& q, const uint8_t* k_tile, int row_bytes,
                            int kk, int lane) {
    uint32_t r[4];  // r[n]: token 8n + g, dims 16 kk + 4t .. + 3
    LdMatrixX4(r, k_tile + lane * row_bytes + kk * 16);
#pragma unroll
    for (int n = 0; n < 4; ++n) Mma(s[n], q.r, Fp8x2ToF16x2(r[n]), Fp8x2ToF16x2(r[n] >> 16));
  }
  // V through ldmatrix.trans on 8-bit rows: a register holds (token 2t: dims 2g, 2g+1) and
  // (token 2t+1: dims 2g, 2g+1) of a 16-dim block, so n-tile 2 blk holds even dims (16 blk + 2
  // col) and n-tile 2 blk + 1 the odd ones.
  template <int MT>
  __device__ static void PV(float (&acc)[MT][8][4], const uint8_t* v_tile, int row_bytes,
                            const uint8_t* p, int ks, int col0, int lane) {
    const int mi = lane / 8, rr = lane % 8;
    const uint8_t* v_base = v_tile + (ks * 16 + rr + (mi & 1) * 8) * row_bytes + col0;
    // vb[h]: [b0 even, b1 even, b0 odd, b1 odd] of 16-dim block 2 jj + h.
    auto load_v = [&](uint32_t(&vb)[2][4], int jj) {
      uint32_t r[4];
      LdMatrixX4T(r, v_base + jj * 32 + (mi >> 1) * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t lo = r[2 * h], hi = r[2 * h + 1];  // tokens 0-7 and 8-15
        vb[h][0] = Fp8x2ToF16x2(__byte_perm(lo, 0u, 0x0020));
        vb[h][1] = Fp8x2ToF16x2(__byte_perm(hi, 0u, 0x0020));
        vb[h][2] = Fp8x2ToF16x2(__byte_perm(lo, 0u, 0x0031));
        vb[h][3] = Fp8x2ToF16x2(__byte_perm(hi, 0u, 0x0031));
      }
    };
    auto load_p = [&](uint32_t(&pa)[4], int mt) { LoadP(pa, p, mt, ks, lane); };
    if constexpr (MT <= 2) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) load_p(pa[mt], mt);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint32_t vb[2][4];
        load_v(vb, jj);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            Mma(acc[mt][2 * (2 * jj + h)], pa[mt], vb[h][0], vb[h][1]);
            Mma(acc[mt][2 * (2 * jj + h) + 1], pa[mt], vb[h][2], vb[h][3]);
          }
        }
      }
    } else {
      uint32_t vb[2][2][4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) load_v(vb[jj], jj);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t pa[4];
        load_p(pa, mt);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            Mma(acc[mt][2 * (2 * jj + h)], pa, vb[jj][h][0], vb[jj][h][1]);
            Mma(acc[mt][2 * (2 * jj + h) + 1], pa, vb[jj][h][2], vb[jj][h][3]);
          }
        }
      }
    }
  }
  // acc[2 blk][e] and acc[2 blk + 1][e] are the adjacent dims 16 blk + 4t + 2 (e & 1), + 1.
  static constexpr int kPairs = 8;
  __device__ static void Pair(int i, int h, int t, int* n0, int* e0, int* n1, int* e1, int* d) {
    const int blk = i / 2, c = i % 2;
    *n0 = 2 * blk;
    *n1 = 2 * blk + 1;
    *e0 = *e1 = 2 * h + c;
    *d = blk * 16 + 4 * t + 2 * c;
  }
};

// fp8 cache on fp8 tensor cores (m16n8k32 e4m3, sm_89+): the 8-bit K and V bytes feed the MMA as
// they are, with no per-element conversion (the conversions, not bandwidth, limited Fp8Cache at
// 16 heads). q and P go in as two e4m3 terms each (hi + lo, ~8 significant bits like bf16), so
// every product is two MMAs: the same MMA count as the f16 path. q is scaled per row by a power
// of two into [128, 256) and P by kPScale, both exact and undone in fp32.
// Layouts: K through ldmatrix on 8-bit rows lands as the B fragment (k = 4t..4t+3 of token g)
// directly. V through ldmatrix.trans (token pairs x dim pairs) plus one byte permute per
// register gives B fragments whose k-slots 4t + j hold tokens {2t, 2t + 1, 2t + 8, 2t + 9}[j]
// (+16 for the second register) of the even or odd dims; StoreP writes P in that k-slot order so
// a plain ldmatrix gives the matching A fragment. Output dims come out as in Fp8Cache (Pair).
struct Fp8MmaCache {
  static constexpr int kBytes = 1;
  static constexpr int kStages = 4;
  static constexpr int kLoadThreadsPerRow = 4;
  static constexpr int kK = 32;
  static constexpr bool kScaledQ = true;
  static constexpr float kPScale = 256.f;  // P <= 1 -> <= 256, inside e4m3's 448
  struct QFrag {
    uint32_t hi[4], lo[4];
  };
  // a0/a2: row g, dims 32 kk + 4t .. + 3 and + 16; a1/a3: row g + 8. s0/s1: the rows' q scales.
  __device__ static void LoadQ(QFrag& f, const uint16_t* q0, const uint16_t* q1, int kk, int t,
                               float s0, float s1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float sc = (j & 1) ? s1 : s0;
      float v[4];
      ptx::LoadBf16x4(((j & 1) ? q1 : q0) + kk * 32 + ((j & 2) ? 16 : 0) + 4 * t, v);
      uint32_t h01, l01, h23, l23;
      SplitE4m3x2(v[0] * sc, v[1] * sc, &h01, &l01);
      SplitE4m3x2(v[2] * sc, v[3] * sc, &h23, &l23);
      f.hi[j] = h01 | h23 << 16;
      f.lo[j] = l01 | l23 << 16;
    }
  }
  // q_pe row r: hi bytes at [0, 64), lo bytes at [64, 128), natural dim order.
  __device__ static void StoreQpe(uint8_t* qpe_s, const uint16_t* qpe_stage, const float* qscale,
                                  int rows, int tid, int threads) {
    for (int i = tid; i < rows * kMlaRopeDim / 4; i += threads) {
      const int r = i / (kMlaRopeDim / 4), d = 4 * (i % (kMlaRopeDim / 4));
      float v[4];
      ptx::LoadBf16x4(qpe_stage + r * kMlaRopeDim + d, v);
      uint32_t h01, l01, h23, l23;
      SplitE4m3x2(v[0] * qscale[r], v[1] * qscale[r], &h01, &l01);
      SplitE4m3x2(v[2] * qscale[r], v[3] * qscale[r], &h23, &l23);
      *reinterpret_cast<uint32_t*>(qpe_s + r * kQpeRowBytes + d) = h01 | h23 << 16;
      *reinterpret_cast<uint32_t*>(qpe_s + r * kQpeRowBytes + kMlaRopeDim + d) = l01 | l23 << 16;
    }
  }
  // 8x16-byte matrices: (rows 0-7, bytes 0-15) -> a0, (rows 8-15) -> a1, (bytes 16-31) -> a2/a3.
  __device__ static const uint8_t* FragRow(const uint8_t* base, int row_bytes, int lane) {
    const int mi = lane / 8;
    return base + ((mi & 1) * 8 + lane % 8) * row_bytes + (mi >> 1) * 16;
  }
  __device__ static void LoadQpe(QFrag& f, const uint8_t* qpe_s, int row_base, int i, int lane) {
    const uint8_t* p = FragRow(qpe_s + row_base * kQpeRowBytes + i * 32, kQpeRowBytes, lane);
    LdMatrixX4(f.hi, p);
    LdMatrixX4(f.lo, p + kMlaRopeDim);
  }
  __device__ static void QK(float (&s)[4][4], const QFrag& q, const uint8_t* k_tile, int row_bytes,
                            int kk, int lane) {
    uint32_t b0[4], b1[4];  // [n]: token 8n + g, dims 32 kk + 4t .. + 3 (b0) and + 16 (b1)
    LdMatrixX4(b0, k_tile + lane * row_bytes + kk * 32);
    LdMatrixX4(b1, k_tile + lane * row_bytes + kk * 32 + 16);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      ptx::MmaE4m3(s[n], q.hi, b0[n], b1[n]);
      ptx::MmaE4m3(s[n], q.lo, b0[n], b1[n]);
    }
  }
  // Token tok (even) and tok + 1 of the 32-token tile sit at k-slots 16 h + 4 t' + 2 q (+1),
  // with h = tok / 16, q = tok / 8 % 2, t' = tok % 8 / 2. hi plane at byte 0, lo plane at 32.
  __device__ static void StoreP(uint8_t* p_row, int tok, float a, float b) {
    const int slot = (tok & 16) + 4 * ((tok & 7) >> 1) + ((tok & 8) >> 2);
    uint32_t hi, lo;
    SplitE4m3x2(a * kPScale, b * kPScale, &hi, &lo);
    *reinterpret_cast<uint16_t*>(p_row + slot) = static_cast<uint16_t>(hi);
    *reinterpret_cast<uint16_t*>(p_row + 32 + slot) = static_cast<uint16_t>(lo);
  }
  // acc[mt][2 blk] (even dims of 16-dim block blk) and [2 blk + 1] (odd dims) += P V over the
  // 32-token tile (one k32 step: ks == 0).
  template <int MT>
  __device__ static void PV(float (&acc)[MT][8][4], const uint8_t* v_tile, int row_bytes,
                            const uint8_t* p, int ks, int col0, int lane) {
    // Matrix mi of the x4.trans load: tokens 8 mi + 0..7 of the 16 dims of block blk; a register
    // holds (token 2t: dims 2g, 2g + 1) and (token 2t + 1: dims 2g, 2g + 1).
    const uint8_t* v_base = v_tile + (ks * 32 + lane) * row_bytes + col0;
    auto load_v = [&](uint32_t(&vb)[4], int blk) {  // b0/b1 of the even dims, then the odd
      uint32_t r[4];
      LdMatrixX4T(r, v_base + blk * 16);
      vb[0] = __byte_perm(r[0], r[1], 0x6420);
      vb[1] = __byte_perm(r[2], r[3], 0x6420);
      vb[2] = __byte_perm(r[0], r[1], 0x7531);
      vb[3] = __byte_perm(r[2], r[3], 0x7531);
    };
    auto mma = [&](float(&c)[8][4], const uint32_t(&ph)[4], const uint32_t(&pl)[4],
                   const uint32_t(&vb)[4], int blk) {
      ptx::MmaE4m3(c[2 * blk], ph, vb[0], vb[1]);
      ptx::MmaE4m3(c[2 * blk], pl, vb[0], vb[1]);
      ptx::MmaE4m3(c[2 * blk + 1], ph, vb[2], vb[3]);
      ptx::MmaE4m3(c[2 * blk + 1], pl, vb[2], vb[3]);
    };
    if constexpr (MT <= 2) {
      uint32_t ph[MT][4], pl[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        LdMatrixX4(ph[mt], FragRow(p + mt * 16 * kPRowBytes, kPRowBytes, lane));
        LdMatrixX4(pl[mt], FragRow(p + mt * 16 * kPRowBytes + 32, kPRowBytes, lane));
      }
#pragma unroll
      for (int blk = 0; blk < 4; ++blk) {
        uint32_t vb[4];
        load_v(vb, blk);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma(acc[mt], ph[mt], pl[mt], vb, blk);
      }
    } else {
      uint32_t vb[4][4];
#pragma unroll
      for (int blk = 0; blk < 4; ++blk) load_v(vb[blk], blk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t ph[4], pl[4];
        LdMatrixX4(ph, FragRow(p + mt * 16 * kPRowBytes, kPRowBytes, lane));
        LdMatrixX4(pl, FragRow(p + mt * 16 * kPRowBytes + 32, kPRowBytes, lane));
#pragma unroll
        for (int blk = 0; blk < 4; ++blk) mma(acc[mt], ph, pl, vb[blk], blk);
      }
    }
  }
  static constexpr int kPairs = Fp8Cache::kPairs;
  __device__ static void Pair(int i, int h, int t, int* n0, int* e0, int* n1, int* e1, int* d) {
    Fp8Cache::Pair(i, h, t, n0, e0, n1, e1, d);
  }
};

template <typename C, int ROWS>
struct Config {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kTile = 32;  // KV tokens per stage
  static constexpr int kStages = C::kStages;
  static constexpr int kRowBytes = kMlaCacheDim * C::kBytes + 16;  // pad: conflict-free ldmatrix
  static constexpr int kStageBytes = kTile * kRowBytes;
  static constexpr int kRG = ROWS / 16;     // QK row groups (16 rows each)
  static constexpr int kKG = kWarps / kRG;  // warps of a row group split the 576 dims
  // q's latent k-steps (32 of 16 dims, or 16 of 32) split evenly over the k-groups and stay in
  // registers; its rope steps sit in shared memory (rope step i belongs to k-group i % kKG).
  static constexpr int kLatSteps = kMlaLatentDim / C::kK / kKG;
  static constexpr int kRopeSteps = kMlaRopeDim / C::kK;
  static constexpr int kMT = ROWS / 16;                 // PV m-tiles
  static constexpr int kCols = kMlaLatentDim / kWarps;  // output columns per warp
  // Softmax layout. Up to 32 rows it is spread over 4 warps per row group ("distributed"): every
  // warp publishes its partial S. With 64 rows the kg == 0 warps ("leaders") keep theirs in
  // registers and do the softmax alone, since shared memory has no room for another 8 KB.
  static constexpr bool kDist = kRG <= 2;
  static constexpr int kRedOff = kStages * kStageBytes;
  static constexpr int kRedBytes = (kDist ? kKG : kKG - 1) * kRG * 32 * 16 * 4;  // 16 per lane
  static constexpr int kPOff = kRedOff + kRedBytes;
  static constexpr int kPBytes = ROWS * kPRowBytes;
  static constexpr int kQpeOff = kPOff + kPBytes;
  static constexpr int kQpeBytes = ROWS * kQpeRowBytes;
  static constexpr int kStatOff = kQpeOff + kQpeBytes;
  static constexpr int kSmemBytes = kStatOff + 4 * ROWS * 4;  // alpha, m, l, q scale per row
  static_assert(kCols == 64 && ROWS % 16 == 0 && kWarps % kRG == 0, "warp layout");
  static_assert(kLatSteps * kKG * C::kK == kMlaLatentDim && kTile % C::kK == 0, "k-steps");
  static_assert(kSmemBytes <= 99 * 1024, "sm_120 allows 99 KB of shared memory per block");
};

template <typename C, int ROWS>
__global__ void __launch_bounds__(256, ROWS == 16 ? 2 : 1) MlaDecodeKernel(const AttendArgs args) {
  if (SurplusCta(args)) return;
  using K = Config<C, ROWS>;
  constexpr int kTile = K::kTile, kStages = K::kStages;
  extern __shared__ __align__(16) uint8_t smem[];

  const MlaWorkItem item = args.items[blockIdx.x];
  ptx::GridDependencyWait();  // launched early: q, the cache and the partials are the stream's
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int rg = warp % K::kRG, kg = warp / K::kRG;
  const bool leader = kg == 0;
  // Softmax role: this thread owns rows sm_row0 and sm_row0 + 8 and, for kNV n-blocks n, the
  // tokens sm_tok + 8n, + 1 of the tile. Leader layout: the MMA fragment of the leader warp
  // (4 n-blocks; a row's threads are lanes xor 1, 2). Distributed layout: warp w takes rows
  // 16 (w / 4) + 2 (w % 4) + bit 2 of the lane, one n-block (lane bits 3-4) and token pair (lane
  // bits 0-1) of the fragment layout, so a quarter-warp reads 8 consecutive float4 partials
  // (conflict-free) and a row's threads are lanes xor 1, 2, 8, 16.
  constexpr bool kDist = K::kDist;
  constexpr int kNV = kDist ? 1 : 4;
  constexpr uint32_t kRowLanes = kDist ? 0x1b : 0x3;  // lane bits that vary within a row
  const bool sm_thread = kDist ? warp < 4 * K::kRG : leader;
  const int sm_rg = kDist ? warp / 4 : rg;
  const int sm_row0 = kDist ? sm_rg * 16 + 2 * (warp % 4) + ((lane >> 2) & 1) : rg * 16 + g;
  const int sm_n = kDist ? lane >> 3 : 0;
  const int sm_tok = kDist ? 8 * sm_n + 2 * t : 2 * t;
  const int sm_lane = kDist ? (sm_row0 % 8) * 4 + t : lane;  // fragment lane of (row, tok)
  const int step_begin = kg * K::kLatSteps;

  const int seq = item.seq;
  const int32_t* pages = args.pages + args.page_indptr[seq];
  const ItemGeometry geo(args, item);
  const int item_rows = geo.item_rows, pos0 = geo.pos0;

  auto q_row = [&](int r) { return QRow(args, item, r); };
  // KV loads: each loader thread owns one token row of a tile and 9 of its 16-byte chunks; the
  // page of its row in the next tile to issue is fetched one iteration early, off the critical
  // path.
  constexpr int kRowChunks = kMlaCacheDim * C::kBytes / 16;
  constexpr int kTpr = C::kLoadThreadsPerRow;
  constexpr int kChunksPerThread = kRowChunks / kTpr;
  static_assert(kRowChunks % kTpr == 0 && kTile * kTpr <= K::kThreads, "load mapping");
  const int load_row = tid / kTpr, load_sub = tid % kTpr;
  const bool loader = tid < kTile * kTpr;
  const int num_tiles = NumTiles(item, kTile);
  const auto* cache = static_cast<const uint8_t*>(args.cache);
  constexpr size_t kCacheRowBytes = kMlaCacheDim * C::kBytes;
  // Cache row (page * block_size + offset) of this thread's row in `tile`, or -1.
  auto fetch = [&](int tile) {
    const int j = item.kv_start + tile * kTile + load_row;
    if (loader && tile < num_tiles && j < item.kv_end) {
      return pages[j / args.block_size] * args.block_size + j % args.block_size;
    }
    return -1;
  };
  auto issue = [&](int tile, int row) {
    if (!loader || tile >= num_tiles) return;
    const bool valid = row >= 0;
    const uint8_t* src = cache + (valid ? static_cast<size_t>(row) * kCacheRowBytes : 0);
    uint8_t* dst = smem + (tile % kStages) * K::kStageBytes + load_row * K::kRowBytes;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int c = load_sub + i * kTpr;  // a row's kTpr threads cover 16 * kTpr contiguous bytes
      CpAsync16(dst + c * 16, src + c * 16, valid);
    }
  };
  // q: the item's rows are staged in the (still unused) KV ring with cp.async, all copies in
  // flight at once, then turned into register fragments (q_latent) and the permuted q_pe tile.
  // Staging: q_latent [ROWS][kQStride] then q_pe [ROWS][64], bf16; padding rows zero-filled.
  constexpr int kQStride = kMlaLatentDim + 8;  // elements; pad: fewer bank conflicts below
  static_assert(ROWS * (kQStride + kMlaRopeDim) * 2 <= kStages * K::kStageBytes, "q staging");
  uint16_t* q_stage = reinterpret_cast<uint16_t*>(smem);
  uint16_t* qpe_stage = q_stage + ROWS * kQStride;
  {
    const auto* ql = static_cast<const uint8_t*>(args.q_latent);
    const auto* qp = static_cast<const uint8_t*>(args.q_pe);
    constexpr int kLatChunks = kMlaLatentDim * 2 / 16, kPeChunks = kMlaRopeDim * 2 / 16;
    for (int i = tid; i < ROWS * (kLatChunks + kPeChunks); i += K::kThreads) {
      const bool pe = i >= ROWS * kLatChunks;
      const int k = pe ? i - ROWS * kLatChunks : i;
      const int r = pe ? k / kPeChunks : k / kLatChunks, c = pe ? k % kPeChunks : k % kLatChunks;
      const bool valid = r < item_rows;
      const uint8_t* src =
          valid
              ? (pe ? qp + q_row(r) * kMlaRopeDim * 2 : ql + q_row(r) * kMlaLatentDim * 2) + c * 16
              : ql;
      uint16_t* dst = pe ? qpe_stage + r * kMlaRopeDim : q_stage + r * kQStride;
      CpAsync16(dst + c * 8, src, valid);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();
  }
  float* alpha_s = reinterpret_cast<float*>(smem + K::kStatOff);  // [ROWS] per-tile rescale
  float* m_s = alpha_s + ROWS;                                    // [ROWS] final max (log2)
  float* l_s = m_s + ROWS;                                        // [ROWS] final sum
  float* qscale_s = l_s + ROWS;                                   // [ROWS] q scale (fp8 MMA)
  if constexpr (C::kScaledQ) {
    // A power of two per row that puts max |q| (latent and rope) in [128, 256): exact, and
    // inside e4m3's range with its full precision. One warp per row.
    for (int r = warp; r < ROWS; r += K::kWarps) {
      float mx = 0.f;
      for (int d = lane; d < kMlaLatentDim; d += 32) {
        mx = fmaxf(mx, fabsf(__bfloat162float(
                           reinterpret_cast<const __nv_bfloat16*>(q_stage)[r * kQStride + d])));
      }
      for (int d = lane; d < kMlaRopeDim; d += 32) {
        mx = fmaxf(mx, fabsf(__bfloat162float(reinterpret_cast<const __nv_bfloat16*>(
                           qpe_stage)[r * kMlaRopeDim + d])));
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, m));
      if (lane == 0) qscale_s[r] = QScaleE4m3(mx);
    }
    __syncthreads();
  }
  // q_latent fragments of this warp's 16 rows and k-steps, for the whole item.
  typename C::QFrag qa[K::kLatSteps];
  {
    const int r0 = rg * 16 + g;
    const float s0 = C::kScaledQ ? qscale_s[r0] : 1.f, s1 = C::kScaledQ ? qscale_s[r0 + 8] : 1.f;
#pragma unroll
    for (int st = 0; st < K::kLatSteps; ++st) {
      C::LoadQ(qa[st], q_stage + r0 * kQStride, q_stage + (r0 + 8) * kQStride, step_begin + st, t,
               s0, s1);
    }
  }
  uint8_t* qpe_s = smem + K::kQpeOff;  // [ROWS][kQpeRowBytes]
  C::StoreQpe(qpe_s, qpe_stage, qscale_s, ROWS, tid, K::kThreads);
  __syncthreads();  // the ring is free for KV tiles
  // The page rows of the first kStages tiles, all in flight at once.
  int first_rows[kStages];
#pragma unroll
  for (int st = 0; st < kStages; ++st) first_rows[st] = fetch(st);
  // Causal limit of the softmax rows (padding rows see everything) and their logit scale.
  int row_pos[2];
  float row_scale[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = sm_row0 + 8 * ri;
    row_pos[ri] = geo.RowPos(item, r);
    // (Threads without a softmax role may name rows past ROWS: no shared-memory read for them.)
    row_scale[ri] = args.scale_log2 / (C::kScaledQ && r < ROWS ? qscale_s[r] : 1.f);
  }

  // Partial S per (k-group, row group): [slot][4 n-blocks][32 lanes] float4 (fragment layout).
  float* red = reinterpret_cast<float*>(smem + K::kRedOff);
  uint8_t* pbuf = smem + K::kPOff;  // [ROWS][kPRowBytes] P

  float acc[K::kMT][8][4];
#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  }
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  const int col0 = warp * K::kCols;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    issue(st, first_rows[st]);
    CpAsyncCommit();
  }
  int next_row = first_rows[kStages - 1];  // of the next tile to issue

  for (int tile = 0; tile < num_tiles; ++tile) {
    CpAsyncWait<kStages - 2>();
    // The tile has landed for every thread; every warp is done with the previous tile's P and
    // with the stage the next issue overwrites.
    __syncthreads();
    issue(tile + kStages - 1, next_row);
    CpAsyncCommit();
    next_row = fetch(tile + kStages);
    const uint8_t* kv_tile = smem + (tile % kStages) * K::kStageBytes;

    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int st = 0; st < K::kLatSteps; ++st) {
      C::QK(s, qa[st], kv_tile, K::kRowBytes, step_begin + st, lane);
    }
#pragma unroll
    for (int i = 0; i < K::kRopeSteps; ++i) {
      if (i % K::kKG != kg) continue;
      typename C::QFrag qr;
      C::LoadQpe(qr, qpe_s, rg * 16, i, lane);
      C::QK(s, qr, kv_tile, K::kRowBytes, kMlaLatentDim / C::kK + i, lane);
    }
    if (kDist || !leader) {
      const int slot = kDist ? kg * K::kRG + rg : (kg - 1) * K::kRG + rg;
      float4* dst = reinterpret_cast<float4*>(red) + slot * 4 * 32;
#pragma unroll
      for (int n = 0; n < 4; ++n)
        dst[n * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
    }
    __syncthreads();

    if (sm_thread) {
      // x[n][e]: row sm_row0 + 8 (e >> 1), token tile_base + sm_tok + 8n + (e & 1).
      float x[kNV][4];
      const float4* red4 = reinterpret_cast<const float4*>(red);
      if constexpr (kDist) {
        x[0][0] = x[0][1] = x[0][2] = x[0][3] = 0.f;
#pragma unroll
        for (int k2 = 0; k2 < K::kKG; ++k2) {
          const float4 v = red4[((k2 * K::kRG + sm_rg) * 4 + sm_n) * 32 + sm_lane];
          x[0][0] += v.x;
          x[0][1] += v.y;
          x[0][2] += v.z;
          x[0][3] += v.w;
        }
      } else {
#pragma unroll
        for (int n = 0; n < kNV; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) x[n][e] = s[n][e];
        }
#pragma unroll
        for (int k2 = 1; k2 < K::kKG; ++k2) {
#pragma unroll
          for (int n = 0; n < kNV; ++n) {
            const float4 v = red4[(((k2 - 1) * K::kRG + rg) * 4 + n) * 32 + lane];
            x[n][0] += v.x;
            x[n][1] += v.y;
            x[n][2] += v.z;
            x[n][3] += v.w;
          }
        }
      }
      const int tile_base = item.kv_start + tile * kTile;
      const bool need_mask = tile_base + kTile > item.kv_end || tile_base + kTile - 1 > pos0;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kNV; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = tile_base + sm_tok + 8 * n + (e & 1);
          float v = x[n][e] * row_scale[e >> 1];
          if (need_mask && (j >= item.kv_end || j > row_pos[e >> 1])) v = -INFINITY;
          x[n][e] = v;
          mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
      }
      float alpha[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
#pragma unroll
        for (int m = 1; m < 32; m <<= 1) {
          if (kRowLanes & m) mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], m));
        }
        const float m_new = fmaxf(m_run[ri], mx[ri]);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
        alpha[ri] = exp2f(m_run[ri] - m_use);
        m_run[ri] = m_new;
        l_run[ri] *= alpha[ri];
        mx[ri] = m_use;
      }
      uint8_t* p0 = pbuf + sm_row0 * kPRowBytes;
      uint8_t* p1 = p0 + 8 * kPRowBytes;
#pragma unroll
      for (int n = 0; n < kNV; ++n) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = exp2f(x[n][e] - mx[e >> 1]);
          l_run[e >> 1] += p[e];
        }
        C::StoreP(p0, sm_tok + 8 * n, p[0], p[1]);
        C::StoreP(p1, sm_tok + 8 * n, p[2], p[3]);
      }
      if ((lane & kRowLanes) == 0) {
        alpha_s[sm_row0] = alpha[0];
        alpha_s[sm_row0 + 8] = alpha[1];
      }
    }
    __syncthreads();

    // Rescaling is 4 x ROWS / 2 multiplies; skip it (warp-uniformly) when no row's running max
    // moved, the common case once a decode has seen a few tiles.
    {
      float al[K::kMT][2];
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < K::kMT; ++mt) {
        al[mt][0] = alpha_s[mt * 16 + g];
        al[mt][1] = alpha_s[mt * 16 + g + 8];
        moved |= al[mt][0] != 1.f || al[mt][1] != 1.f;
      }
      if (__any_sync(0xffffffff, moved)) {
#pragma unroll
        for (int mt = 0; mt < K::kMT; ++mt) {
#pragma unroll
          for (int n = 0; n < 8; ++n) {
            acc[mt][n][0] *= al[mt][0];
            acc[mt][n][1] *= al[mt][0];
            acc[mt][n][2] *= al[mt][1];
            acc[mt][n][3] *= al[mt][1];
          }
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kTile / C::kK; ++ks) {
      C::template PV<K::kMT>(acc, kv_tile, K::kRowBytes, pbuf, ks, col0, lane);
    }
  }
  CpAsyncWait<0>();  // no copy may land after the CTA exits

  if (sm_thread) {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {  // each thread summed only its own tokens
#pragma unroll
      for (int m = 1; m < 32; m <<= 1) {
        if (kRowLanes & m) l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], m);
      }
      const int r = sm_row0 + 8 * ri;
      const bool writer = (lane & kRowLanes) == 0;
      if (writer) {
        m_s[r] = m_run[ri];
        l_s[r] = l_run[ri];
      }
      if (writer && item.partial >= 0 && r < item_rows) {
        args.partial_lse[static_cast<size_t>(item.partial) * kMlaMaxRows + r] =
            l_run[ri] > 0.f ? m_run[ri] + log2f(l_run[ri]) : -INFINITY;
      }
    }
  }
  __syncthreads();

#pragma unroll
  for (int mt = 0; mt < K::kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + 8 * h;
      if (r >= item_rows) continue;
      const float l = l_s[r];
      const float inv = l > 0.f ? args.out_scale / (l * C::kPScale) : 0.f;
      const size_t qrow = q_row(r);
#pragma unroll
      for (int i = 0; i < C::kPairs; ++i) {
        int n0, e0, n1, e1, d;
        C::Pair(i, h, t, &n0, &e0, &n1, &e1, &d);
        const float v0 = acc[mt][n0][e0] * inv, v1 = acc[mt][n1][e1] * inv;
        d += col0;
        if (item.partial < 0) {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(args.out) +
                                             qrow * kMlaLatentDim + d) =
              __floats2bfloat162_rn(v0, v1);
        } else {
          *reinterpret_cast<float2*>(
              args.partial_o +
              (static_cast<size_t>(item.partial) * kMlaMaxRows + r) * kMlaLatentDim + d) =
              make_float2(v0, v1);
        }
      }
    }
  }
}

// Raising the dynamic shared-memory limit is a host call: once per instantiation.
template <typename C, int ROWS>
void EnsureSmemLimit() {
  static const bool done = [] {
    cudaFuncSetAttribute(MlaDecodeKernel<C, ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         Config<C, ROWS>::kSmemBytes);
    return true;
  }();
  (void)done;
}

template <typename C, int ROWS>
void LaunchImpl(const AttendArgs& a, void* stream) {
  if (a.num_items == 0) return;
  EnsureSmemLimit<C, ROWS>();
  using K = Config<C, ROWS>;
  (void)LaunchPdl(MlaDecodeKernel<C, ROWS>, dim3(a.num_items), dim3(K::kThreads), K::kSmemBytes,
                  static_cast<cudaStream_t>(stream), a);
}

template <typename C>
void LaunchForCache(const AttendArgs& a, int rows, void* stream) {
  if (rows == 16) {
    LaunchImpl<C, 16>(a, stream);
  } else if (rows == 32) {
    LaunchImpl<C, 32>(a, stream);
  } else {
    LaunchImpl<C, 64>(a, stream);
  }
}

template <typename C, int ROWS>
int CtasPerSmImpl() {
  EnsureSmemLimit<C, ROWS>();
  using K = Config<C, ROWS>;
  int n = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, MlaDecodeKernel<C, ROWS>, K::kThreads,
                                                K::kSmemBytes);
  return n > 0 ? n : 1;
}

template <typename C>
int CtasPerSm(int rows) {
  return rows == 16   ? CtasPerSmImpl<C, 16>()
         : rows == 32 ? CtasPerSmImpl<C, 32>()
                      : CtasPerSmImpl<C, 64>();
}

}  // namespace llm::cuda::mla
