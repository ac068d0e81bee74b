// Paged-KV flash attention forward for Hopper (sm_90a): the FMHA family's prefill kernel on
// warpgroup MMA. Same parameters, semantics, work split, tile list and split-KV partials as the
// portable kernel (fmha_kernel.cuh, whose helpers it uses); what differs is the math engine:
//
//   - CTA = 128 packed rows (query token x GQA head, as in the portable kernel) of one (sequence,
//     KV head); KV tiles of 128 keys. Three warpgroups with their own roles (FlashAttention-3's
//     warp specialization): warpgroup 0 copies, warpgroups 1 and 2 compute 64 rows each.
//   - The producer gathers Q once and the K and V tiles (through the block table, row by row,
//     which the tensor-copy engine cannot do for blocks smaller than the tile) with cp.async into
//     two-slot K and V rings in the 128-byte swizzle (wgmma.cuh). mbarriers hand slots over: a
//     "full" barrier completes when the producer's copies of a slot have landed, an "empty"
//     barrier when both consumers are done reading it. The producer keeps 56 registers, the
//     consumers take 224 (setmaxnreg).
//   - Consumers: S = Q K^T is a shared x shared wgmma (m64n128k16); O += P V takes P from
//     registers (the S accumulators rounded to 16 bits) and V through an MN-major descriptor.
//     Iteration i issues S_i and P_{i-1} V_{i-1} back to back, waits for S_i only, and runs the
//     softmax of S_i while the tensor cores still work on P_{i-1} V_{i-1}. The two consumers are
//     not kept in step: while one runs its softmax, the other's products keep the tensor cores
//     busy.
//   - One CTA per SM (161 KB of shared memory at d = 128).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/fmha/fmha_kernel.cuh"

namespace llm::fmha {

namespace wgmma = llm::cuda::wgmma;

template <typename T, int D>
struct WgmmaCfg {
  using Elem = T;
  static constexpr int kHeadDim = D;
  static constexpr int kRows = kPrefillRows;  // 2 consumer warpgroups x 64
  static constexpr int kN = 128;              // keys per KV tile
  static constexpr int kThreads = 384;        // producer + 2 consumer warpgroups
  // setmaxnreg moves registers within what the CTA got at launch: 384 threads x 168 (the cap
  // __launch_bounds__(384, 1) implies). Asking for more makes setmaxnreg.inc wait forever (a hang,
  // seen with 64 + 2 x 224).
  static constexpr int kEntryRegs = 168;
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kEntryRegs,
                "register split exceeds the CTA's allocation");
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kN * D * 2;
  // Barriers: full_k[2], full_v[2], empty_k[2], empty_v[2]; then a scratch word.
  static constexpr int kBarBytes = 8 * 8 + 16;
  static constexpr int kSmemBytes = kQBytes + 4 * kTileBytes + kBarBytes + 1024;  // + alignment
  static constexpr int kChunks = D / 8;              // 16-byte chunks per row
  static constexpr int kThreadChunks = kChunks / 2;  // a producer thread pair shares a row
  static constexpr int kSAcc = kN / 2;  // S accumulators per thread (64 rows x kN / 128 threads)
  static constexpr int kOAcc = D / 2;   // O accumulators per thread
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kRows == 128 && kN == 128 && kQBytes == kTileBytes, "copy mapping");
};

// Byte offset of 16-byte chunk c (of D / 8) of row r in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t SwizzledChunk(int r, int c, int rows) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Shared-memory map (addresses in the shared window): Q, the K ring, the V ring (each [2 slots]
// [kN][D] swizzled), 8 mbarriers, a scratch word.
template <class C>
struct WgmmaSmem {
  uint32_t q, k, v, bar;
  __device__ explicit WgmmaSmem(uint32_t q_addr)
      : q(q_addr), k(q_addr + C::kQBytes), v(k + 2 * C::kTileBytes), bar(v + 2 * C::kTileBytes) {}
  __device__ uint32_t full_k(int slot) const { return bar + 8 * slot; }
  __device__ uint32_t full_v(int slot) const { return bar + 16 + 8 * slot; }
  __device__ uint32_t empty_k(int slot) const { return bar + 32 + 8 * slot; }
  __device__ uint32_t empty_v(int slot) const { return bar + 48 + 8 * slot; }
  __device__ uint32_t scratch() const { return bar + 64; }
};

// The consumer warpgroups' part of FmhaWgmmaKernel (one branch of its role if/else, as
// setmaxnreg requires).
template <class C>
__device__ __forceinline__ void Consume(const KernelArgs& a, const CtaWork& work, int tid,
                                        uint32_t q_addr) {
  using T = typename C::Elem;
  constexpr int D = C::kHeadDim;
  constexpr int kN = C::kN;
  constexpr bool kBf16 = T::kIsBf16;
  const WgmmaSmem<C> sm(q_addr);
  const int wg = tid / 128;
  const TileList& tl = work.tl;
  const int n_tiles = tl.v_end - tl.v_begin;
  const int kvh = work.kvh, row0 = work.row0, sq = work.sq, sk = work.sk;

  // ---- Consumers: warpgroup cw (0 or 1) owns CTA rows cw * 64 .. cw * 64 + 63; this thread
  // holds rows g and g + 8 (slot sl) of its warp's 16: CTA row = row_base + 8 * sl.
  wgmma::RegAlloc<C::kConsumerRegs>();
  const int cw = wg - 1;
  const int warp = (tid / 32) % 4;
  const int g = (tid % 32) / 4, t4 = tid % 4;
  const int row_base = cw * 64 + warp * 16 + g;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[C::kOAcc];
#pragma unroll
  for (int i = 0; i < C::kOAcc; ++i) o[i] = 0.f;
  float s[C::kSAcc];
  uint32_t p[kN / 16][4];  // P of the previous tile: the A operand of O += P V

  const bool has_alibi = a.alibi_slopes != nullptr;
  const bool fold_scale = !a.has_softcap && !has_alibi && a.scale_log2 > 0.f;
  const float exp_mul = fold_scale ? a.scale_log2 : 1.f;

  // Base descriptors, advanced per wgmma by wgmma::DescAdd (one add instead of a fresh Desc).
  const uint64_t q_desc = wgmma::Desc(sm.q + cw * 64 * 128, 16, 1024);
  const uint64_t k_desc = wgmma::Desc(sm.k, 16, 1024);
  const uint64_t v_desc = wgmma::Desc(sm.v, kN * 128, 1024);
  // S = Q K^T over the K tile in slot `slot` (issued, not waited).
  auto issue_s = [&](int slot) {
    const uint64_t kd = wgmma::DescAdd(k_desc, slot * C::kTileBytes);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t col = (kk % 4) * 32;  // the k-slice's byte offset within a panel row
      const uint64_t da = wgmma::DescAdd(q_desc, (kk / 4) * C::kRows * 128 + col);
      const uint64_t db = wgmma::DescAdd(kd, (kk / 4) * kN * 128 + col);
      wgmma::MmaSS128<kBf16>(s, da, db, kk > 0 ? 1 : 0);
    }
  };
  // O += P V over the V tile in slot `slot` (issued, not waited).
  auto issue_pv = [&](int slot) {
    const uint64_t vd = wgmma::DescAdd(v_desc, slot * C::kTileBytes);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint64_t db = wgmma::DescAdd(vd, kk * 16 * 128);
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
  // only after O is complete (to_p).
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

  // Tile i of this split sits in ring slot i % 2; its full / empty barriers complete once per
  // use of the slot, so use u = i / 2 waits for parity u % 2.
  auto wait_full = [&](uint32_t barrier, int i) {
    wgmma::MbarWait(barrier, (i >> 1) & 1);
    wgmma::ProxyFence();  // cp.async wrote through the generic proxy; wgmma reads async
  };
  if (n_tiles > 0) {
    wait_full(sm.full_k(0), 0);  // Q and K_0
    wgmma::Fence();
    issue_s(0);
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::Pin(s);
    wgmma::MbarArrive(sm.empty_k(0));
    float alpha[2];
    softmax(tl.v_begin, alpha);  // O is still zero: nothing to rescale
    to_p();

    for (int i = 1; i < n_tiles; ++i) {
      wait_full(sm.full_k(i & 1), i);
      wait_full(sm.full_v((i - 1) & 1), i - 1);
      wgmma::Fence();
      issue_s(i & 1);
      wgmma::Commit();
      issue_pv((i - 1) & 1);
      wgmma::Commit();
      wgmma::Wait<1>();  // S_i
      wgmma::Pin(s);
      wgmma::MbarArrive(sm.empty_k(i & 1));
      softmax(tl.v_begin + i, alpha);
      // The softmax must stay above this wait, or it does not overlap P_{i-1} V_{i-1}.
      wgmma::KeepAbove(l_run[0] + l_run[1], sm.scratch());
      wgmma::Wait<0>();  // O += P_{i-1} V_{i-1}
      wgmma::Pin(o);
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) wgmma::Pin(p[kk]);
      wgmma::MbarArrive(sm.empty_v((i - 1) & 1));
      // Rescale O unless no row maximum of the warp moved (common late in long rows).
      if (!gpu::WarpAll(alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
        for (int x = 0; x < C::kOAcc; ++x) o[x] *= alpha[(x >> 1) & 1];
      }
      to_p();
    }
    wait_full(sm.full_v((n_tiles - 1) & 1), n_tiles - 1);
    wgmma::Fence();
    issue_pv((n_tiles - 1) & 1);
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::Pin(o);
  }

  // ---- Epilogue: each lane summed only its own columns.
  const OutputWriter<T, D, C::kRows> writer(a, work.b, kvh, work.tile, work.split, row0,
                                            work.q_begin, sq);
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

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1) FmhaWgmmaKernel(const KernelArgs a) {
  constexpr int D = C::kHeadDim;
  constexpr int kN = C::kN;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned for the swizzle; offset from the __shared__ array itself, so the compiler
  // keeps knowing these are shared-memory addresses.
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_addr & 1023)) & 1023);
  const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const WgmmaSmem<C> sm(q_addr);

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const CtaWork work = MakeCtaWork(a, C::kRows, kN);
  if (work.past_end) return;
  const TileList& tl = work.tl;
  const int n_tiles = tl.v_end - tl.v_begin;

  if (tid == 0) {
    for (int slot = 0; slot < 2; ++slot) {
      wgmma::MbarInit(sm.full_k(slot), 128);  // one arrival per producer thread
      wgmma::MbarInit(sm.full_v(slot), 128);
      wgmma::MbarInit(sm.empty_k(slot), 256);  // one per consumer thread
      wgmma::MbarInit(sm.empty_v(slot), 256);
    }
  }
  __syncthreads();

  if (wg == 0) {
    // ---- Producer. Thread t copies the chunks of parity t % 2 of rows t / 2 and t / 2 + 64 of
    // each tile: a thread pair reads 32 contiguous bytes (a full sector) per instruction.
    wgmma::RegDealloc<C::kProducerRegs>();
    if (n_tiles == 0) return;
    const int parity = tid % 2;
    // Chunks 2c + parity of row r of the tile at shared address `dst` (zeros when !valid). Rows
    // r and r + 64 share r % 8, so the swizzle term of each chunk is fixed per thread.
    const uint32_t r7 = (tid / 2) & 7;
    auto copy_row = [&](uint32_t dst, int r, const uint16_t* src, bool valid) {
      dst += r * 128;
#pragma unroll
      for (int c = 0; c < C::kThreadChunks; ++c) {
        const int chunk = 2 * c + parity;
        const uint32_t at = dst + (chunk >> 3) * kN * 128 + (((chunk & 7) ^ r7) << 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at),
                     "l"(valid ? src + chunk * 8 : src), "r"(valid ? 16 : 0));
      }
    };
    for (int h = 0; h < 2; ++h) {
      const int r = tid / 2 + 64 * h;
      bool valid;
      const size_t src = QueryRowOffset<D>(a, work, work.row0 + r, &valid);
      copy_row(sm.q, r, a.q + src, valid);
    }
    const int32_t* bt = a.block_table
                            ? a.block_table + static_cast<size_t>(work.b) * a.max_blocks_per_seq
                            : nullptr;
    const int key_base = bt ? 0 : static_cast<int>(ContiguousKeyBase(a, work.b));
    // KV row of key j (-1: no row of the CTA sees it; zero-filled instead of read).
    auto row_of = [&](int j) -> int32_t {
      if (!tl.Needed(j)) return -1;
      if (!bt) return (key_base + j) * a.num_kv_heads + work.kvh;
      const int bi = a.block_shift >= 0 ? j >> a.block_shift : j / a.block_size;
      return (bt[bi] * a.num_kv_heads + work.kvh) * a.block_size + (j - bi * a.block_size);
    };
    for (int i = 0; i < n_tiles; ++i) {
      const int slot = i & 1;
      const int t0 = tl.TileOf(tl.v_begin + i) * kN;
      int32_t rows[2];
      for (int h = 0; h < 2; ++h) rows[h] = row_of(t0 + tid / 2 + 64 * h);
      // Slot reuse: wait until both consumers are done with tile i - 2.
      if (i >= 2) wgmma::MbarWait(sm.empty_k(slot), ((i >> 1) - 1) & 1);
      for (int h = 0; h < 2; ++h) {
        copy_row(sm.k + slot * C::kTileBytes, tid / 2 + 64 * h,
                 a.k + (rows[h] >= 0 ? static_cast<size_t>(rows[h]) * D : 0), rows[h] >= 0);
      }
      wgmma::MbarArriveOnCopies(sm.full_k(slot));  // the first phase also covers Q
      if (i >= 2) wgmma::MbarWait(sm.empty_v(slot), ((i >> 1) - 1) & 1);
      for (int h = 0; h < 2; ++h) {
        copy_row(sm.v + slot * C::kTileBytes, tid / 2 + 64 * h,
                 a.v + (rows[h] >= 0 ? static_cast<size_t>(rows[h]) * D : 0), rows[h] >= 0);
      }
      wgmma::MbarArriveOnCopies(sm.full_v(slot));
    }
    gpu::AsyncWait<0>();  // nothing in flight when the thread exits
  } else {
    Consume<C>(a, work, tid, q_addr);
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
