// The C8 tile kernel's prefill math (internal): query rows as the MMA's M dimension.
//
// A warp owns 16 query rows (query tokens x GQA group) and multiplies them against 16 KV tokens
// per step: S = q K^T (rows x tokens), online softmax along the tokens, O += P V. With 8 warps
// a 128-row prefill tile keeps every MMA row busy.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/c8/c8_frag.cuh"
#include "kernels/cuda/c8/c8_softmax.cuh"

namespace llm::cuda::detail {

template <typename C, int D, bool kPerToken>
struct RowMath {
  using F = CacheFrag<C, D>;
  static constexpr int kKSteps = D / 16;
  static constexpr int kNTiles = D / 8;
  static constexpr int kWarpRows = 16;  // query rows per warp
  static constexpr int kSlots = 2;      // rows a thread owns: g and g + 8

  uint32_t q[kKSteps][4];  // bf16x2 bits of q after LoadQ, A fragments after Init
  float acc[kNTiles][4];   // O: row g (e < 2) or g + 8, d from AccD
  float m_run[kSlots], l_run[kSlots], m_log2[kSlots];
  float psum[4];  // int8: per-row sums of the fp16 P actually multiplied (RowSums)
  int row_pos[kSlots];
  float scale_log2, lazy_raw;

  // Physical d of accumulator acc[n][e].
  __device__ static int AccD(int n, int e, int t) {
    if constexpr (F::kEight)
      return (n >> 1) * 16 + 4 * t + 2 * (e & 1) + (n & 1);
    else
      return n * 8 + 2 * t + (e & 1);
  }

  // Issues the loads of this warp's q rows [row0, row0 + 16); Init packs them once the ring's
  // first copies are in flight.
  __device__ void LoadQ(const TileArgs& args, const C8WorkItem& item, int kvh, int group, int row0,
                        int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        q[kk][j] =
            F::LoadQPair(args, item, kvh, group, row0 + g + ((j & 1) ? 8 : 0), F::QCol(kk, t, j));
      }
    }
  }

  __device__ void Init(const TileArgs& args, const C8WorkItem& item, int kvh, int group, int row0,
                       int lane, float scale) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) q[kk][j] = F::PackQ(args, kvh, q[kk][j], F::QCol(kk, t, j));
    }
    scale_log2 = scale;
    lazy_raw = kLazyLog2 / scale;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      m_run[i] = -INFINITY;
      l_run[i] = 0.f;
      row_pos[i] = item.q_pos0 + (row0 + g + 8 * i) / group;
    }
    psum[0] = psum[1] = psum[2] = psum[3] = 0.f;
  }

  // One 16-token step at tile row n0 (KV position col0); ks / vs: the tile's per-token scales.
  // kMask: keys at or past kv_end, right of a row's position or left of its window
  // (TileArgs::window) are masked.
  template <bool kMask>
  __device__ void Step(const uint8_t* k_tile, const uint8_t* v_tile, const float* ks,
                       const float* vs, int n0, int col0, int kv_end, int window, int lane) {
    const int t = lane % 4;
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    // The +1152 int8 offset shifts a row's scores by a constant, unless per-token scales
    // multiply the columns.
    QK<!kPerToken>(s, k_tile, n0, lane);
    if constexpr (kPerToken) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= ks[n0 + n * 8 + 2 * t + (e & 1)];
      }
    }
    uint32_t pa[4];
    Softmax<kMask>(s, pa, col0, kv_end, window, t, vs + n0);
    PV(pa, v_tile, n0, lane);
    if constexpr (F::kVOffset) ptx::MmaF16(psum, pa, 0x3c003c00u, 0x3c003c00u);  // B = ones
  }

  // After the last step: removes the int8 V offset and completes l and the log2-domain max.
  __device__ void Finish() {
    if constexpr (F::kVOffset) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] -= 1152.f * psum[e & 2];
      }
    }
#pragma unroll
    for (int ri = 0; ri < kSlots; ++ri) {  // each thread summed only its own columns
      l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], 1);
      l_run[ri] += __shfl_xor_sync(0xffffffff, l_run[ri], 2);
      // m_run is in raw-score units; the log2-domain max is m * scale_log2.
      m_log2[ri] = m_run[ri] == -INFINITY ? -INFINITY : m_run[ri] * scale_log2;
    }
  }

  // fn(row within the warp, physical d, unnormalized value, slot of the row's m / l).
  template <typename Fn>
  __device__ void ForEachOut(int lane, Fn fn) const {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) fn(g + 8 * (e >> 1), AccD(n, e, t), acc[n][e], e >> 1);
    }
  }
  // fn(row within the warp, slot), once per row.
  template <typename Fn>
  __device__ void ForEachRowStat(int lane, Fn fn) const {
    if (lane % 4 != 0) return;
#pragma unroll
    for (int ri = 0; ri < kSlots; ++ri) fn(lane / 4 + 8 * ri, ri);
  }

 private:
  // S[16 x 16 tokens starting at n0] += q . K^T
  // kOffsetK: int8 K may carry the +1152 offset (only when scores are not scaled per token).
  template <bool kOffsetK>
  __device__ void QK(float (&s)[2][4], const uint8_t* k_tile, int n0, int lane) const {
#pragma unroll
    for (int c = 0; c < F::kLoads; ++c) {
      typename F::Block k[F::kBlocksPerLoad];
      F::template LoadK<kOffsetK>(k, k_tile, n0, c, lane);
#pragma unroll
      for (int h = 0; h < F::kBlocksPerLoad; ++h) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          F::Mma(s[nt], q[c * F::kBlocksPerLoad + h], k[h].x[nt][0], k[h].x[nt][1]);
        }
      }
    }
  }

  // acc += P[16 x 16 tokens starting at n0] . V
  __device__ void PV(const uint32_t (&pa)[4], const uint8_t* v_tile, int n0, int lane) {
#pragma unroll
    for (int c = 0; c < F::kLoads; ++c) {
      typename F::Block v[F::kBlocksPerLoad];
      F::LoadV(v, v_tile, n0, c, lane);
#pragma unroll
      for (int h = 0; h < F::kBlocksPerLoad; ++h) {
        const int blk = c * F::kBlocksPerLoad + h;  // 16-d block
#pragma unroll
        for (int i = 0; i < 2; ++i) F::Mma(acc[2 * blk + i], pa, v[h].x[i][0], v[h].x[i][1]);
      }
    }
  }

  // Online softmax over one step. s[n][e]: raw scores of row g (e < 2) or g + 8, token
  // col0 + n * 8 + 2t + (e & 1). vs: the step's per-token V scales (kPerToken), folded into P
  // after l is summed. Returns P as an mma A fragment.
  template <bool kMask>
  __device__ void Softmax(float (&s)[2][4], uint32_t (&pa)[4], int col0, int kv_end, int window,
                          int t, const float* vs) {
    if constexpr (kMask) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = col0 + n * 8 + 2 * t + (e & 1);
          if (j >= kv_end || !C8KeyVisible(row_pos[e >> 1], j, window)) s[n][e] = -INFINITY;
        }
      }
    }
    float mx[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      mx[ri] = fmaxf(fmaxf(s[0][2 * ri], s[0][2 * ri + 1]), fmaxf(s[1][2 * ri], s[1][2 * ri + 1]));
      mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], 1));
      mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffff, mx[ri], 2));
    }
    float alpha[2];
    if (LazyMaxUpdate<2>(mx, m_run, l_run, alpha, scale_log2, lazy_raw)) {
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
      }
      psum[0] *= alpha[0];
      psum[1] *= alpha[0];
      psum[2] *= alpha[1];
      psum[3] *= alpha[1];
    }
    float neg_m[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) neg_m[ri] = NegMaxLog2(m_run[ri], scale_log2);
    float p[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        p[n][e] = ptx::Exp2Ftz(fmaf(s[n][e], scale_log2, neg_m[e >> 1]));
        l_run[e >> 1] += p[n][e];
        if constexpr (kPerToken) p[n][e] *= vs[n * 8 + 2 * t + (e & 1)];
      }
    }
    pa[0] = F::Pack(p[0][0], p[0][1]);
    pa[1] = F::Pack(p[0][2], p[0][3]);
    pa[2] = F::Pack(p[1][0], p[1][1]);
    pa[3] = F::Pack(p[1][2], p[1][3]);
  }
};

}  // namespace llm::cuda::detail
