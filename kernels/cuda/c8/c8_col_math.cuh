// The C8 tile kernel's decode math (internal): KV tokens as the MMA's M dimension.
//
// A decode tile has few query rows (query tokens x GQA group, at most 16). As the M dimension of
// m16n8k16 they leave most of it empty: a group of 4 fills 4 of 16 rows, and the MMAs were a large
// share of the decode kernel's time (ncu). Here a step's 16 KV tokens are M and
// the query rows are N, 8 per n-tile (NT tiles): S^T = K q^T, then O^T += V^T P^T. With one
// n-tile that is 8 + 8 MMAs per 16 tokens instead of 16 + 16 + 1. K and V come from the same
// ldmatrix loads as in the row layout, their registers now play the A role; movmatrix turns S^T's
// accumulator into P^T's B fragment. A thread holds tokens g and g + 8 of query rows 2t, 2t + 1
// (+ 8 per n-tile), so the softmax reduces across the lanes' g index.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/c8/c8_frag.cuh"
#include "kernels/cuda/c8/c8_softmax.cuh"

namespace llm::cuda::detail {

template <typename C, int D, int NT, bool kPerToken>
struct ColMath {
  using F = CacheFrag<C, D>;
  static constexpr int kKSteps = D / 16;
  static constexpr int kDBlocks = D / 16;
  static constexpr int kWarpRows = 8 * NT;  // query rows (the MMA's N) per warp
  static constexpr int kSlots = 2 * NT;     // rows a thread owns: 2t, 2t + 1 of each n-tile

  uint32_t q[NT][kKSteps][2];  // bf16x2 bits of q after LoadQ, B fragments (q^T) after Init
  float acc[NT][kDBlocks][4];  // O^T: d from AccD x query row SlotRow(2 nt + (e & 1))
  float m_run[kSlots], l_run[kSlots], m_log2[kSlots];
  float psum[kSlots];  // int8: sums of the fp16 P actually multiplied (this thread's tokens)
  int row_pos[kSlots];
  float scale_log2, lazy_raw;

  // Query row of a slot, and physical d of accumulator acc[nt][blk][e].
  __device__ static int SlotRow(int slot, int t) { return (slot >> 1) * 8 + 2 * t + (slot & 1); }
  __device__ static int AccD(int blk, int e, int g) {
    if constexpr (F::kEight)
      return blk * 16 + 2 * g + (e >> 1);
    else
      return blk * 16 + g + 8 * (e >> 1);
  }

  // Issues the loads of q^T for query rows [row0, row0 + kWarpRows): lane (g, t) holds row
  // row0 + nt * 8 + g at the d pairs its K fragments pair with.
  __device__ void LoadQ(const TileArgs& args, const C8WorkItem& item, int kvh, int group, int row0,
                        int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          q[nt][kk][j] =
              F::LoadQPair(args, item, kvh, group, row0 + nt * 8 + g, F::QCol(kk, t, 2 * j));
        }
      }
    }
  }

  __device__ void Init(const TileArgs& args, const C8WorkItem& item, int kvh, int group, int row0,
                       int lane, float scale) {
    const int t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
          q[nt][kk][j] = F::PackQ(args, kvh, q[nt][kk][j], F::QCol(kk, t, 2 * j));
      }
    }
    scale_log2 = scale;
    lazy_raw = kLazyLog2 / scale;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int b = 0; b < kDBlocks; ++b)
        acc[nt][b][0] = acc[nt][b][1] = acc[nt][b][2] = acc[nt][b][3] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      m_run[i] = -INFINITY;
      l_run[i] = 0.f;
      psum[i] = 0.f;
      row_pos[i] = item.q_pos0 + (row0 + SlotRow(i, t)) / group;
    }
  }

  // One 16-token step at tile row n0 (KV position col0); ks / vs: the tile's per-token scales.
  // kMask: keys at or past kv_end, right of a row's position or left of its window
  // (TileArgs::window) are masked.
  template <bool kMask>
  __device__ void Step(const uint8_t* k_tile, const uint8_t* v_tile, const float* ks,
                       const float* vs, int n0, int col0, int kv_end, int window, int lane) {
    const int g = lane / 4;
    // The +1152 int8 offset shifts a query's scores by a constant, unless per-token scales
    // multiply the tokens.
    float s[NT][4];
    QK<!kPerToken>(s, k_tile, n0, lane);
    if constexpr (kPerToken) {
      const float k0 = ks[n0 + g], k1 = ks[n0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[nt][0] *= k0;
        s[nt][1] *= k0;
        s[nt][2] *= k1;
        s[nt][3] *= k1;
      }
    }
    uint32_t pb[NT][2];
    Softmax<kMask>(s, pb, col0, kv_end, window, g, vs + n0);
    PV(pb, v_tile, n0, lane);
  }

  // After the last step: completes l (and the int8 offset sums) over the warp's tokens, removes
  // the int8 V offset, and sets the log2-domain max.
  __device__ void Finish() {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
#pragma unroll
      for (int x = 4; x < 32; x <<= 1) {
        l_run[i] += __shfl_xor_sync(0xffffffff, l_run[i], x);
        if constexpr (F::kVOffset) psum[i] += __shfl_xor_sync(0xffffffff, psum[i], x);
      }
      m_log2[i] = m_run[i] == -INFINITY ? -INFINITY : m_run[i] * scale_log2;
    }
    if constexpr (F::kVOffset) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int b = 0; b < kDBlocks; ++b) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][b][e] -= 1152.f * psum[2 * nt + (e & 1)];
        }
      }
    }
  }

  // fn(query row within the warp, physical d, unnormalized value, slot of the row's m / l).
  template <typename Fn>
  __device__ void ForEachOut(int lane, Fn fn) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int b = 0; b < kDBlocks; ++b) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int slot = 2 * nt + (e & 1);
          fn(SlotRow(slot, t), AccD(b, e, g), acc[nt][b][e], slot);
        }
      }
    }
  }
  // fn(query row within the warp, slot), once per row.
  template <typename Fn>
  __device__ void ForEachRowStat(int lane, Fn fn) const {
    if (lane / 4 != 0) return;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) fn(SlotRow(i, lane % 4), i);
  }

 private:
  // S^T[16 tokens starting at n0 x query rows] = K . q^T. The K registers of the row layout's
  // B fragments form the A fragment here: rows (tokens) g and g + 8, d pairs as QCol. With one
  // n-tile, even and odd k-steps accumulate apart: two MMA chains of D / 32 instead of one of
  // D / 16 (a CTA of a small split grid waits on this chain every step).
  template <bool kOffsetK>
  __device__ void QK(float (&s)[NT][4], const uint8_t* k_tile, int n0, int lane) const {
    constexpr int kChains = NT == 1 ? 2 : 1;
    float s2[kChains][NT][4];
#pragma unroll
    for (int h = 0; h < kChains; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        s2[h][nt][0] = s2[h][nt][1] = s2[h][nt][2] = s2[h][nt][3] = 0.f;
    }
#pragma unroll
    for (int c = 0; c < F::kLoads; ++c) {
      typename F::Block k[F::kBlocksPerLoad];
      F::template LoadK<kOffsetK>(k, k_tile, n0, c, lane);
#pragma unroll
      for (int h = 0; h < F::kBlocksPerLoad; ++h) {
        const int kk = c * F::kBlocksPerLoad + h;
        uint32_t a[4];
        F::ColA(k[h], a);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) F::Mma(s2[kk % kChains][nt], a, q[nt][kk][0], q[nt][kk][1]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[nt][e] = s2[0][nt][e] + (kChains > 1 ? s2[kChains - 1][nt][e] : 0.f);
    }
  }

  // O^T[d x query rows] += V^T[d x 16 tokens starting at n0] . P^T. The transposed V loads give
  // a lane two tokens at one d, which is the A fragment's pairing.
  __device__ void PV(const uint32_t (&pb)[NT][2], const uint8_t* v_tile, int n0, int lane) {
#pragma unroll
    for (int c = 0; c < F::kLoads; ++c) {
      typename F::Block v[F::kBlocksPerLoad];
      F::LoadV(v, v_tile, n0, c, lane);
#pragma unroll
      for (int h = 0; h < F::kBlocksPerLoad; ++h) {
        uint32_t a[4];
        F::ColA(v[h], a);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          F::Mma(acc[nt][c * F::kBlocksPerLoad + h], a, pb[nt][0], pb[nt][1]);
        }
      }
    }
  }

  // Online softmax over one step. s[nt][e]: raw scores of token col0 + g + 8 (e >> 1), query row
  // SlotRow(2 nt + (e & 1)). vs: the step's per-token V scales (kPerToken), folded into P after
  // l is summed. Returns P^T as mma B fragments.
  template <bool kMask>
  __device__ void Softmax(float (&s)[NT][4], uint32_t (&pb)[NT][2], int col0, int kv_end,
                          int window, int g, const float* vs) {
    if constexpr (kMask) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = col0 + g + 8 * (e >> 1);
          if (j >= kv_end || !C8KeyVisible(row_pos[2 * nt + (e & 1)], j, window)) {
            s[nt][e] = -INFINITY;
          }
        }
      }
    }
    float mx[kSlots];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) mx[2 * nt + i] = fmaxf(s[nt][i], s[nt][i + 2]);
    }
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
#pragma unroll
      for (int x = 4; x < 32; x <<= 1) mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffff, mx[i], x));
    }
    float alpha[kSlots];
    if (LazyMaxUpdate<kSlots>(mx, m_run, l_run, alpha, scale_log2, lazy_raw)) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int b = 0; b < kDBlocks; ++b) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][b][e] *= alpha[2 * nt + (e & 1)];
        }
      }
#pragma unroll
      for (int i = 0; i < kSlots; ++i) psum[i] *= alpha[i];
    }
    float neg_m[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) neg_m[i] = NegMaxLog2(m_run[i], scale_log2);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[e] = ptx::Exp2Ftz(fmaf(s[nt][e], scale_log2, neg_m[2 * nt + (e & 1)]));
        l_run[2 * nt + (e & 1)] += p[e];
        if constexpr (kPerToken) p[e] *= vs[g + 8 * (e >> 1)];
      }
      // Lane (g, t) holds P^T's (token g / g + 8, rows 2t, 2t + 1): the accumulator layout of two
      // 8 x 8 matrices (tokens x rows). Transposed, it holds (tokens 2t, 2t + 1, row g): B.
      const uint32_t x0 = F::Pack(p[0], p[1]), x1 = F::Pack(p[2], p[3]);
      if constexpr (F::kVOffset) {
        const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&x0));
        const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&x1));
        psum[2 * nt] += f0.x + f1.x;
        psum[2 * nt + 1] += f0.y + f1.y;
      }
      pb[nt][0] = ptx::MovMatrixT(x0);
      pb[nt][1] = ptx::MovMatrixT(x1);
    }
  }
};

}  // namespace llm::cuda::detail
