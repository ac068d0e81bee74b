// Paged-KV flash attention forward for Hopper (sm_90a): the FMHA family's prefill kernel on
// warpgroup MMA. Same parameters, semantics, work split, tile list and split-KV partials as the
// portable kernel (fmha_kernel.cuh, whose helpers it uses); what differs is the math engine:
//
//   - CTA = 128 packed rows (query token x GQA head, as in the portable kernel) of one (sequence,
//     KV head), 2 warpgroups x 64 rows; KV tiles of 128 keys.
//   - Q, K and V live in shared memory in the 128-byte swizzle (wgmma.cuh). S = Q K^T is a
//     shared x shared wgmma (m64n128k16, 8 k-steps over d = 128); O += P V takes P from registers
//     (the S accumulators rounded to 16 bits) and V through an MN-major descriptor.
//   - Software pipeline inside each warpgroup (FlashAttention-3's intra-warpgroup overlap):
//     iteration i issues S_i = Q K_i and O += P_{i-1} V_{i-1} back to back, waits for S_i only,
//     and runs the softmax of S_i while the tensor cores still work on P_{i-1} V_{i-1}; then it
//     waits for O, rescales it, and P_i takes P_{i-1}'s place.
//   - K and V have separate two-slot rings, filled by cp.async from every thread (the paged gather
//     goes through the block table row by row, which the tensor-copy engine cannot do for block
//     sizes under the tile). Iteration i loads K_{i+1} and V_i, one iteration ahead of their use.
//   - One CTA per SM (161 KB of shared memory at d = 128, up to 255 registers per thread).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fmha/fmha_kernel.cuh"
#include "kernels/fmha/wgmma.cuh"

namespace llm::fmha {

template <typename T, int D>
struct WgmmaCfg {
  using Elem = T;
  static constexpr int kHeadDim = D;
  static constexpr int kRows = kPrefillRows;  // 2 warpgroups x 64
  static constexpr int kN = 128;              // keys per KV tile
  static constexpr int kThreads = 256;
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kN * D * 2;
  // Block ids of three tiles (a 128-key tile touches at most 128 / 16 + 1 blocks).
  static constexpr int kIdSlots = 16;
  static constexpr int kIdBytes = 3 * kIdSlots * 4;
  // + a scratch word (wgmma::KeepAbove) + 1024-byte alignment
  static constexpr int kSmemBytes = kQBytes + 4 * kTileBytes + kIdBytes + 16 + 1024;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row
  // Copies: two threads per row (of a 128-row Q, K or V tile), kChunks / 2 chunks each, so the
  // row's address (block-table lookup, visibility) is computed once per thread and tile.
  static constexpr int kThreadChunks = kChunks / 2;
  static_assert(kThreads == 2 * kN && kN == kRows, "copy mapping: two threads per row");
  static constexpr int kSAcc = kN / 2;  // S accumulators per thread (64 rows x kN / 128 threads)
  static constexpr int kOAcc = D / 2;   // O accumulators per thread
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kRows == 128, "two warpgroups of 64 rows");
};

// Byte offset of 16-byte chunk c (of D / 8) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t SwizzledChunk(int r, int c, int rows) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1) FmhaWgmmaKernel(const KernelArgs a) {
  using T = typename C::Elem;
  constexpr int D = C::kHeadDim;
  constexpr int kN = C::kN;
  constexpr bool kBf16 = T::kIsBf16;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned for the swizzle; offset from the __shared__ array itself, so the compiler
  // keeps knowing these are shared-memory addresses (ld.shared, not generic loads).
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t k_addr = q_addr + C::kQBytes;         // [2 slots][kN][D] swizzled
  const uint32_t v_addr = k_addr + 2 * C::kTileBytes;  // [2 slots][kN][D] swizzled

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) % 4;  // within the warpgroup
  const int g = (tid % 32) / 4, t4 = tid % 4;
  const int kvh = blockIdx.x / a.num_splits;
  const int split = blockIdx.x % a.num_splits;
  const int tile = a.row_tiles - 1 - blockIdx.y;  // heaviest (causal) tiles first
  const int b = blockIdx.z;

  const int q_begin = a.seqstart_q ? a.seqstart_q[b] : b * a.seqlen_q;
  const int sq = a.seqstart_q ? a.seqstart_q[b + 1] - q_begin : a.seqlen_q;
  const int sk = a.seqlen_k[b];
  const int row0 = tile * C::kRows;
  if (row0 >= sq * a.group) return;
  const int tok_first = row0 / a.group;
  const int tok_last = min(row0 + C::kRows - 1, sq * a.group - 1) / a.group;
  const TileList tl = MakeTileList(a, tok_first, tok_last, sq, sk, kN, split);
  const int n_tiles = tl.v_end - tl.v_begin;

  // ---- Copies. Thread tid moves the chunks of parity tid % 2 of row tid / 2 of each tile: a
  // thread pair reads 32 contiguous bytes (a full sector) per instruction.
  const int my_row = tid / 2, parity = tid % 2;
  auto copy_row = [&](uint32_t tile_offset, const uint16_t* src, bool valid) {
#pragma unroll
    for (int c = 0; c < C::kThreadChunks; ++c) {
      const int chunk = 2 * c + parity;
      gpu::CopyAsync16(smem + tile_offset + SwizzledChunk(my_row, chunk, kN),
                       valid ? src + chunk * 8 : src, valid);
    }
  };
  {
    const int rr = row0 + my_row;
    const int tok = rr / a.group;
    const bool valid = tok < sq;
    const size_t src =
        valid
            ? (static_cast<size_t>(q_begin + tok) * a.num_q_heads + kvh * a.group + rr % a.group) *
                  D
            : 0;
    copy_row(0, a.q + src, valid);
  }
  const int32_t* bt =
      a.block_table ? a.block_table + static_cast<size_t>(b) * a.max_blocks_per_seq : nullptr;
  const int cache_row = a.cache_batch_idx ? a.cache_batch_idx[b] : b;
  // Paged KV: the block ids of list position v + 2 are copied into a shared-memory ring slot
  // ((v + 2) % 3) during iteration v, with that iteration's KV copies, so the row computation of
  // the next iteration reads them from shared memory instead of waiting on global loads.
  int32_t* ids = reinterpret_cast<int32_t*>(smem + C::kQBytes + 4 * C::kTileBytes);  // [3][16]
  const uint32_t ids_addr = q_addr + C::kQBytes + 4 * C::kTileBytes;
  auto copy_ids = [&](int v) {
    if (!bt || tid >= C::kIdSlots || v >= tl.v_end) return;
    const int bi = tl.TileOf(v) * kN / a.block_size + tid;
    const bool valid = bi * a.block_size <= tl.max_hi;
    gpu::CopyAsync4(ids + (v % 3) * C::kIdSlots + tid, bt + (valid ? bi : 0), valid);
  };
  // KV row of this thread's key in list position v (-1: not needed, zero-filled); the block id
  // from the ring (from_ring) or straight from the block table.
  auto row_of = [&](int v, bool from_ring) -> int32_t {
    const int t0 = tl.TileOf(v) * kN;
    const int j = t0 + my_row;
    if (!(v < tl.v_end && tl.Needed(j))) return -1;
    if (!bt) return (cache_row * a.cache_seqlen + j) * a.num_kv_heads + kvh;
    const int bi = a.block_shift >= 0 ? j >> a.block_shift : j / a.block_size;
    int blk;
    if (from_ring) {
      const int b0 = a.block_shift >= 0 ? t0 >> a.block_shift : t0 / a.block_size;
      blk = ids[(v % 3) * C::kIdSlots + bi - b0];
    } else {
      blk = bt[bi];
    }
    return (blk * a.num_kv_heads + kvh) * a.block_size + (j - bi * a.block_size);
  };
  auto issue = [&](const uint16_t* src, uint32_t tile_offset, int32_t row) {
    copy_row(tile_offset, src + (row >= 0 ? static_cast<size_t>(row) * D : 0), row >= 0);
  };
  const uint32_t k_off = C::kQBytes, v_off = C::kQBytes + 2 * C::kTileBytes;
  static_assert(C::kQBytes == C::kTileBytes, "Q uses the K/V copy mapping");

  // ---- Per-thread state: rows g and g + 8 (slot sl) of this warp's 16 rows of the warpgroup's
  // 64; CTA row = wg * 64 + warp * 16 + g + 8 * sl.
  const int row_base = wg * 64 + warp * 16 + g;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[C::kOAcc];
#pragma unroll
  for (int i = 0; i < C::kOAcc; ++i) o[i] = 0.f;
  float s[C::kSAcc];
  uint32_t p[kN / 16][4];  // P of the previous tile: the A operand of O += P V

  const bool has_alibi = a.alibi_slopes != nullptr;
  const bool fold_scale = !a.has_softcap && !has_alibi && a.scale_log2 > 0.f;
  const float exp_mul = fold_scale ? a.scale_log2 : 1.f;

  // S = Q K^T over the K tile in slot `slot` (issued, not waited).
  auto issue_s = [&](int slot) {
    const uint32_t qa = q_addr + wg * 64 * 128;
    const uint32_t kb = k_addr + slot * C::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t col = (kk % 4) * 32;  // the k-slice's byte offset within a panel row
      const uint64_t da = wgmma::Desc(qa + (kk / 4) * C::kRows * 128 + col, 16, 1024);
      const uint64_t db = wgmma::Desc(kb + (kk / 4) * kN * 128 + col, 16, 1024);
      wgmma::MmaSS128<kBf16>(s, da, db, kk > 0 ? 1 : 0);
    }
  };
  // O += P V over the V tile in slot `slot` (issued, not waited).
  auto issue_pv = [&](int slot) {
    const uint32_t vb = v_addr + slot * C::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint64_t db = wgmma::Desc(vb + kk * 16 * 128, kN * 128, 1024);
      if constexpr (D == 128) {
        wgmma::MmaRS128<kBf16>(o, p[kk], db);
      } else {
        wgmma::MmaRS64<kBf16>(o, p[kk], db);
      }
    }
  };
  // Scores of list position v, in place: s becomes 2^(score - running max) (fp32); updates the
  // running max and sum; alpha = the factor O needs. Runs between the wait for S and the wait for
  // the P V product, like FlashAttention-3: writing S there is fine for ptxas, whereas writing
  // the registers P V reads (P itself) would serialize every wgmma (C7513), so P is packed from s
  // only after O is complete (ToP).
  auto softmax = [&](int v, float(&alpha)[2]) {
    const int key0 = tl.TileOf(v) * kN;
    if (a.has_softcap) {
#pragma unroll
      for (int i = 0; i < C::kSAcc; ++i) s[i] = a.softcap_out * Tanh(s[i] * a.softcap_in);
    } else if (!fold_scale) {
#pragma unroll
      for (int i = 0; i < C::kSAcc; ++i) s[i] *= a.scale_log2;
    }
    if (has_alibi) {
#pragma unroll
      for (int sl = 0; sl < 2; ++sl) {
        const int rr = row0 + row_base + 8 * sl;
        const float slope = a.alibi_slopes[kvh * a.group + rr % a.group] * kLog2e;
        const int diag = DiagonalKey(a, rr / a.group, sq, sk);
#pragma unroll
        for (int i = 0; i < C::kSAcc; ++i) {
          if (((i >> 1) & 1) != sl) continue;
          s[i] += slope * static_cast<float>(key0 + 8 * (i >> 2) + 2 * t4 + (i & 1) - diag);
        }
      }
    }
    if (tl.NeedsMask(key0, kN, a.sink_tokens)) {
#pragma unroll
      for (int sl = 0; sl < 2; ++sl) {
        const RowWindow w = MakeWindow(a, (row0 + row_base + 8 * sl) / a.group, sq, sk);
#pragma unroll
        for (int i = 0; i < C::kSAcc; ++i) {
          if (((i >> 1) & 1) != sl) continue;
          const int j = key0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
          if (!(j <= w.hi && (j >= w.lo || j < a.sink_tokens))) s[i] = -INFINITY;
        }
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < C::kSAcc; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float m_use[2];
#pragma unroll
    for (int sl = 0; sl < 2; ++sl) {
      const float m_new = fmaxf(m_run[sl], gpu::RowMax(mx[sl]) * exp_mul);
      m_use[sl] = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
      alpha[sl] = gpu::Exp2(m_run[sl] - m_use[sl]);
      m_run[sl] = m_new;
      l_run[sl] *= alpha[sl];
    }
#pragma unroll
    for (int i = 0; i < C::kSAcc; ++i) {
      s[i] = gpu::Exp2(fmaf(s[i], exp_mul, -m_use[(i >> 1) & 1]));
      l_run[(i >> 1) & 1] += s[i];
    }
  };
  // P (16-bit, the A operand of O += P V) from the exponentials in s.
  auto to_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) p[kk][r] = T::Pack(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
    }
  };

  if (n_tiles > 0) {
    // Prologue: group A = Q + K_0, group B = V_0 + K_1 + the block ids of tile 2.
    int32_t row_v = row_of(tl.v_begin, false), row_k = -1;
    issue(a.k, k_off, row_v);
    gpu::AsyncCommit();
    issue(a.v, v_off, row_v);
    if (n_tiles > 1) {
      row_k = row_of(tl.v_begin + 1, false);
      issue(a.k, k_off + C::kTileBytes, row_k);
    }
    copy_ids(tl.v_begin + 2);
    gpu::AsyncCommit();
    gpu::AsyncWait<1>();
    wgmma::ProxyFence();
    __syncthreads();
    wgmma::Fence();
    issue_s(0);
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::Pin(s);
    float alpha[2];
    softmax(tl.v_begin, alpha);  // O is still zero: nothing to rescale
    to_p();

    for (int i = 1; i < n_tiles; ++i) {
      const int v = tl.v_begin + i;
      gpu::AsyncWait<0>();  // K_i and V_{i-1}
      wgmma::ProxyFence();
      __syncthreads();  // ... from every thread; and everyone is done with iteration i - 1
      wgmma::Fence();
      issue_s(i & 1);
      wgmma::Commit();
      issue_pv((i - 1) & 1);
      wgmma::Commit();
      // Copies for iteration i + 1: V_i (rows computed for K_i) and K_{i+1}, into the slots that
      // iteration i - 1 read.
      row_v = row_k;
      issue(a.v, v_off + (i & 1) * C::kTileBytes, row_v);
      if (i + 1 < n_tiles) {
        row_k = row_of(v + 1, true);
        issue(a.k, k_off + ((i + 1) & 1) * C::kTileBytes, row_k);
      }
      copy_ids(v + 2);  // into the slot of tile v - 1, which every thread read last iteration
      gpu::AsyncCommit();
      wgmma::Wait<1>();  // S_i
      wgmma::Pin(s);
      softmax(v, alpha);
      // The softmax must stay above this wait, or it does not overlap P_{i-1} V_{i-1}.
      wgmma::KeepAbove(l_run[0] + l_run[1], ids_addr + C::kIdBytes);
      wgmma::Wait<0>();  // O += P_{i-1} V_{i-1}
      wgmma::Pin(o);
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) wgmma::Pin(p[kk]);
#pragma unroll
      for (int x = 0; x < C::kOAcc; ++x) o[x] *= alpha[(x >> 1) & 1];
      to_p();
    }
    gpu::AsyncWait<0>();  // V of the last tile
    wgmma::ProxyFence();
    __syncthreads();
    wgmma::Fence();
    issue_pv((n_tiles - 1) & 1);
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::Pin(o);
  } else {
    gpu::AsyncCommit();
    gpu::AsyncWait<0>();  // the Q copies (unused) finish before the CTA exits
  }

  // ---- Epilogue: each lane summed only its own columns.
  const OutputWriter<T, D, C::kRows> writer(a, b, kvh, tile, split, row0, q_begin, sq);
#pragma unroll
  for (int sl = 0; sl < 2; ++sl) {
    const float l = gpu::RowSum(l_run[sl]);
    float factor, lse;
    writer.Finalize(row_base + 8 * sl, m_run[sl], l, &factor, &lse);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      writer.Emit(row_base + 8 * sl, 8 * j + 2 * t4, o[4 * j + 2 * sl] * factor,
                  o[4 * j + 2 * sl + 1] * factor, lse, j == 0 && t4 == 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

template <class C>
const char* PrepareWgmmaKernel() {
  static const cudaError_t err = cudaFuncSetAttribute(
      FmhaWgmmaKernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, int D>
const char* LaunchWgmmaHeadDim(const Run& run, void* stream) {
  using C = WgmmaCfg<T, D>;
  if (const char* e = PrepareWgmmaKernel<C>()) return e;
  const KernelArgs a = MakeKernelArgs(run);
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(a.num_kv_heads * a.num_splits, a.row_tiles, run.p.batch);
  FmhaWgmmaKernel<C><<<grid, C::kThreads, C::kSmemBytes, s>>>(a);
  LLM_GPU_TRY(cudaGetLastError());
  if (a.num_splits > 1) {
    FmhaMergeKernel<D, C::kRows, T>
        <<<dim3(a.row_tiles, a.num_kv_heads, run.p.batch), 256, 0, s>>>(a);
    LLM_GPU_TRY(cudaGetLastError());
  }
  return nullptr;
}

template <typename T>
const char* LaunchWgmmaElem(const Run& run, void* stream) {
  if (run.p.head_dim == 64) return LaunchWgmmaHeadDim<T, 64>(run, stream);
  return LaunchWgmmaHeadDim<T, 128>(run, stream);
}

template <typename T, int D>
const char* ResidentCtasWgmmaHeadDim(int* n) {
  using C = WgmmaCfg<T, D>;
  static int cached = 0;
  if (cached == 0) {
    if (const char* e = PrepareWgmmaKernel<C>()) return e;
    LLM_GPU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached, FmhaWgmmaKernel<C>,
                                                              C::kThreads, C::kSmemBytes));
  }
  *n = cached;
  return nullptr;
}

template <typename T>
const char* ResidentCtasWgmmaElem(const Run& run, int* n) {
  if (run.p.head_dim == 64) return ResidentCtasWgmmaHeadDim<T, 64>(n);
  return ResidentCtasWgmmaHeadDim<T, 128>(n);
}

}  // namespace llm::fmha
