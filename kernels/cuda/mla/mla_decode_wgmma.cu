// MLA decode on Hopper warpgroup MMA (sm_90a only): work items of up to 64 rows over a bf16
// latent cache. The portable kernel (mla_decode_kernel.cuh) keeps to sm_120's limits; this one
// uses what sm_90a has (wgmma from shared memory, setmaxnreg, TMA, 227 KB of shared memory).
// MlaDecode gives it every bf16 work item on sm_90 (16- and 32-row items padded to 64
// rows: still memory-bound at 16 and 32 heads).
//
// One CTA = one MlaWorkItem (heads x tokens rows) against a KV range; 384 threads:
//   - warpgroup 0, the producer (40 registers): copies the item's query rows (q_latent | q_pe,
//     576 dims) once with cp.async, then streams 64-token KV tiles into a two-slot ring: 9
//     tensor copies (TMA, one 64 x 64 box per 64-dim panel, 128-byte swizzle) per tile, issued by
//     one thread, completing a "full" mbarrier by bytes. The tail tile of an item, and every tile
//     when pages are not whole 64-token tiles, is gathered row by row with cp.async and zero-filled
//     past kv_end.
//   - warpgroups 1 and 2, the consumers (232 registers): consumer c owns output columns
//     256c .. 256c + 255 (O is 64 x 512 fp32: 128 registers per thread for a half) and the tiles
//     of parity c (tile i sits in slot i % 2). For its own tile the consumer computes S_i =
//     Q K_i^T (64 x 64 over 576 dims, shared x shared), the online softmax with the running max
//     m_{i-1} it got from the other consumer (moved lazily: kLazyRescaleLog2), and O_c += P_i V_i
//     (P from registers); it publishes P_i (bf16), m_i and the rescale factor in shared memory
//     and signals a named barrier. The other consumer waits on that barrier, rescales its half,
//     adds P_i V_i from shared memory and issues S_{i+1} (its own tile) right behind it. So the
//     two softmaxes alternate (FlashMLA's "seesaw") while the tensor cores have the other
//     consumer's products.
//   - A slot is handed back to the producer ("empty" mbarrier, 256 arrivals) once both
//     consumers' products that read it have completed.
// Current numbers: docs/BENCHMARKS.md.
//
// Shared memory: Q 72 KB + 2 KV slots x 72 KB + P 8 KB + row statistics + 5 mbarriers = 225.6 KB
// (+1 KB to align the swizzled tiles), inside sm_90's 227 KB: one CTA per SM.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/common/ptx_ops.cuh"
#include "kernels/cuda/common/wgmma.cuh"
#include "kernels/cuda/mla/mla_item.cuh"
#include "kernels/cuda/mla/mla_kernel_args.h"
#include "kernels/cuda/mla/mla_sm90_launch.cuh"
#include "kernels/cuda/mla/mla_tensor_map.h"
#include "kernels/gpu_port.h"

namespace llm::cuda::mla {
namespace {

namespace wg = llm::cuda::wgmma;

struct WgCfg {
  static constexpr int kRows = kMlaMaxRows;  // 64: one wgmma M
  static constexpr int kTile = 64;           // tokens per KV tile (one ring slot)
  static constexpr int kPanels = kMlaCacheDim / 64;
  static constexpr int kLatentPanels = kMlaLatentDim / 64;
  static constexpr int kPanelBytes = 64 * 128;  // 64 rows x 64 bf16 dims
  static constexpr int kTileBytes = kPanels * kPanelBytes;
  static constexpr int kThreads = 384;
  // setmaxnreg only moves registers within the CTA's launch allocation (384 x 168).
  static constexpr int kEntryRegs = 168;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kEntryRegs,
                "register split exceeds the CTA's allocation");
  // Offsets from the 1024-byte aligned base.
  static constexpr int kQOff = 0;
  static constexpr int kKvOff = kTileBytes;
  static constexpr int kPOff = kKvOff + 2 * kTileBytes;
  static constexpr int kStatOff = kPOff + kPanelBytes;  // float scale[2][64], m[2][64], l[2][64]
  static constexpr int kBarOff = kStatOff + 6 * kRows * 4 + 16;  // + a flag per consumer
  static constexpr int kNumBars = 5;                             // full[2], empty[2], q
  static constexpr int kSmemBytes = kBarOff + kNumBars * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM on sm_90");
  static_assert(kMlaCacheDim % 64 == 0 && kMlaLatentDim == 512, "panel mapping");
};

// Lazy rescaling (FlashAttention-4's rule): a row's softmax offset moves only when the tile's max
// passes it by more than this (log2 units). P = 2^(s - offset) <= 256 then: exact in bf16 and in
// the fp32 sums, and the rescale of O (128 multiplies per thread, on both consumers' critical
// path) is skipped on most tiles (with the tree maximum below).
constexpr float kLazyRescaleLog2 = 8.f;

// Named barriers 1 and 2 hand P_i over (by tile parity); 3 joins the consumers at the end.
__device__ __forceinline__ void BarSync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void BarArrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

struct Smem {
  uint32_t base;  // shared-window address of the aligned base
  __device__ uint32_t q() const { return base + WgCfg::kQOff; }
  __device__ uint32_t kv(int slot) const { return base + WgCfg::kKvOff + slot * WgCfg::kTileBytes; }
  __device__ uint32_t p() const { return base + WgCfg::kPOff; }
  __device__ uint32_t full(int slot) const { return base + WgCfg::kBarOff + 8 * slot; }
  __device__ uint32_t empty(int slot) const { return base + WgCfg::kBarOff + 16 + 8 * slot; }
  __device__ uint32_t q_full() const { return base + WgCfg::kBarOff + 32; }
};

// The producer warpgroup. Q (64 scattered rows, once per item) goes through cp.async. A KV tile
// of 64 whole cache rows inside one page is 9 tensor copies (TMA) issued by one thread; the tail
// tile of an item, and every tile when pages are not made of whole 64-row tiles, is gathered
// row by row with cp.async (zero-filled past kv_end, so P = 0 never meets garbage).
__device__ __forceinline__ void Produce(const AttendArgs& a, const CUtensorMap* map,
                                        const MlaWorkItem& item, const ItemGeometry& geo,
                                        const Smem& sm, int tid) {
  const int n_tiles = NumTiles(item, WgCfg::kTile);
  wg::RegDealloc<WgCfg::kProducerRegs>();
  // Thread pair (2r, 2r + 1) copies row r, chunks of its parity: 32 contiguous bytes per pair and
  // instruction.
  const int row = tid >> 1, par = tid & 1;
  const uint32_t sw = row & 7;
  auto copy_panel = [&](uint32_t panel, const uint8_t* src_row, int chunk0, bool valid) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c = 2 * k + par;
      const uint32_t at = panel + row * 128 + ((c ^ sw) << 4);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at),
                   "l"(src_row + (chunk0 + c) * 16), "r"(valid ? 16 : 0)
                   : "memory");
    }
  };
  {
    const bool valid = row < geo.item_rows;
    const size_t qr = valid ? QRow(a, item, row) : 0;
    const auto* ql = static_cast<const uint8_t*>(a.q_latent) + qr * kMlaLatentDim * 2;
    const auto* qp = static_cast<const uint8_t*>(a.q_pe) + qr * kMlaRopeDim * 2;
#pragma unroll
    for (int pn = 0; pn < WgCfg::kLatentPanels; ++pn) {
      copy_panel(sm.q() + pn * WgCfg::kPanelBytes, ql, pn * 8, valid);
    }
    copy_panel(sm.q() + WgCfg::kLatentPanels * WgCfg::kPanelBytes, qp, 0, valid);
    wg::MbarArriveOnCopies(sm.q_full());
  }
  const int32_t* pages = a.pages + a.page_indptr[item.seq];
  const auto* cache = static_cast<const uint8_t*>(a.cache);
  const bool whole_tiles = a.block_size % WgCfg::kTile == 0 && item.kv_start % WgCfg::kTile == 0;
  for (int i = 0; i < n_tiles; ++i) {
    const int slot = i & 1;
    const int tok0 = item.kv_start + i * WgCfg::kTile;
    if (i >= 2) wg::MbarWait(sm.empty(slot), ((i >> 1) - 1) & 1);
    if (whole_tiles && tok0 + WgCfg::kTile <= item.kv_end) {
      if (tid == 0) {
        const int y = pages[tok0 / a.block_size] * a.block_size + tok0 % a.block_size;
        wg::MbarArriveExpectTx(sm.full(slot), WgCfg::kTileBytes);
        // Evict-first in L2: a tile is read once per item, and the items that share it (the
        // head halves of one token) read it at about the same time: nothing reads it later.
#pragma unroll
        for (int pn = 0; pn < WgCfg::kPanels; ++pn) {
          wg::TmaLoad2d(sm.kv(slot) + pn * WgCfg::kPanelBytes, map, pn * 64, y, sm.full(slot),
                        wg::EvictFirstPolicy());
        }
      }
      continue;
    }
    const int j = tok0 + row;
    const bool valid = j < item.kv_end;
    const size_t crow =
        valid ? static_cast<size_t>(pages[j / a.block_size]) * a.block_size + j % a.block_size : 0;
    const uint8_t* src = cache + crow * kMlaCacheDim * 2;
#pragma unroll 1
    for (int pn = 0; pn < WgCfg::kPanels; ++pn) {
      copy_panel(sm.kv(slot) + pn * WgCfg::kPanelBytes, src, pn * 8, valid);
    }
    // Landed and made visible to the tensor cores' async proxy, then one arrival for all.
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    wg::ProxyFence();
    asm volatile("bar.sync 4, 128;\n" ::: "memory");
    if (tid == 0) wg::MbarArrive(sm.full(slot));
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // nothing in flight when the thread exits
}

__device__ __forceinline__ void Consume(const AttendArgs& a, const MlaWorkItem& item,
                                        const ItemGeometry& geo, const Smem& sm, float* stats,
                                        int tid) {
  wg::RegAlloc<WgCfg::kConsumerRegs>();
  const int n_tiles = NumTiles(item, WgCfg::kTile);
  const int c = tid / 128 - 1;  // consumer: output columns 256c.., tiles of parity c
  const int w = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * w + g;    // this thread's rows: r0 (slot 0) and r0 + 8 (slot 1)
  float* scale_s = stats;       // [2][64]: rescale factor of tile i, by parity
  float* m_s = stats + 2 * 64;  // [2][64]: running max after tile i, by parity
  float* l_s = stats + 4 * 64;  // [2][64]: each consumer's row sums, at the end
  int* early_s = reinterpret_cast<int*>(stats + 6 * 64);  // [2]: see other_step
  int row_pos[2];  // causal limit; padding rows see everything
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    row_pos[h] = geo.RowPos(item, r);
  }
  float o[128];
#pragma unroll
  for (int x = 0; x < 128; ++x) o[x] = 0.f;
  float s[32];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // S_i = Q K_i^T (issued, not waited). Waiting for the whole tile first and fencing once is
  // faster than starting on each panel as it lands: a fence between wgmmas drains them.
  auto wait_tile = [&](int slot, uint32_t parity) { wg::MbarWait(sm.full(slot), parity); };
  const uint64_t q_desc = wg::Desc(sm.q(), 16, 1024);
  const uint64_t p_desc = wg::Desc(sm.p(), 16, 1024);
  const uint64_t kv_desc0 = wg::Desc(sm.kv(0), 16, 1024);
  auto issue_s = [&](int i) {
    const int slot = i & 1;
    const uint64_t kv_desc = wg::DescAdd(kv_desc0, slot * WgCfg::kTileBytes);
    wait_tile(slot, (i >> 1) & 1);
    wg::Fence();
#pragma unroll
    for (int pn = 0; pn < WgCfg::kPanels; ++pn) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = pn * WgCfg::kPanelBytes + kk * 32;
        const uint64_t da = wg::DescAdd(q_desc, off), db = wg::DescAdd(kv_desc, off);
        wg::MmaSS64<true>(s, da, db, (pn | kk) ? 1 : 0);
      }
    }
    wg::Commit();
  };
  // V_i's columns 256c .. 256c + 255, k16-slice kt (tokens 16kt ..): MN-major, 4 panels apart.
  const uint64_t v_base0 =
      wg::Desc(sm.kv(0) + 4 * c * WgCfg::kPanelBytes, WgCfg::kPanelBytes, 1024);
  const uint64_t v_base1 = wg::DescAdd(v_base0, WgCfg::kTileBytes);
  auto v_desc = [&](int slot, int kt) {
    return wg::DescAdd(slot ? v_base1 : v_base0, kt * 16 * 128);
  };
  auto rescale = [&](const float(&f)[2]) {
    if (__all_sync(0xffffffffu, f[0] == 1.f && f[1] == 1.f)) return;  // no row max moved
#pragma unroll
    for (int x = 0; x < 128; ++x) o[x] *= f[(x >> 1) & 1];
  };

  // Own tile i: softmax of S_i, publish P_i, O_c += P_i V_i.
  auto own_step = [&](int i) {
    const int slot = i & 1, par = i & 1;
    float f[2];
    wg::Wait<0>();
    wg::Pin(s);
    const int tok0 = item.kv_start + i * WgCfg::kTile;
    const bool need_mask = tok0 + WgCfg::kTile > item.kv_end || tok0 + WgCfg::kTile - 1 > geo.pos0;
    // Raw scores are masked and maximized; the scale (> 0) folds into the exponent's FMA.
    if (need_mask) {
#pragma unroll
      for (int x = 0; x < 32; ++x) {
        const int j = tok0 + 8 * (x >> 2) + 2 * t + (x & 1);
        if (j >= item.kv_end || j > row_pos[(x >> 1) & 1]) s[x] = -INFINITY;
      }
    }
    float mx[2];
    wg::RowMax64(s, mx);
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2)) * a.scale_log2;
      const float m_new = mx[h] > m_run[h] + kLazyRescaleLog2 ? mx[h] : m_run[h];
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
      f[h] = m_new == m_run[h] ? 1.f : gpu::Exp2(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= f[h];
    }
    uint32_t p[4][4];  // P_i as the A operand, k16-slice kt = tokens 16kt ..
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      s[x] = gpu::Exp2(fmaf(s[x], a.scale_log2, -m_use[(x >> 1) & 1]));
      l_run[(x >> 1) & 1] += s[x];
    }
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(s[8 * kt + 2 * r], s[8 * kt + 2 * r + 1]);
        p[kt][r] = *reinterpret_cast<const uint32_t*>(&v);
      }
    }
    // P_i into shared memory (A operand, K-major, swizzled): n-block j of row r0 (+8) holds
    // tokens 8j + 2t, +1. The other consumer's last read of it completed at its Wait<0>.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t at = sm.p() + (r0 + 8 * h) * 128 + ((j ^ (r0 & 7)) << 4) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(p[j / 2][(j & 1) * 2 + h])
                     : "memory");
      }
    }
    if (t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        scale_s[par * 64 + r0 + 8 * h] = f[h];
        m_s[par * 64 + r0 + 8 * h] = m_run[h];
      }
    }
    wg::ProxyFence();  // the other consumer's wgmma reads P through the async proxy
    BarArrive(1 + par);
    rescale(f);
    wg::Fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) wg::MmaRS256Bf16(o, p[kt], v_desc(slot, kt));
    wg::Commit();
    wg::Wait<0>();
    wg::Pin(o);
    wg::MbarArrive(sm.empty(slot));
  };
  // The other consumer's tile i: add P_i V_i, then issue S_{i+1} (own tile) right behind it so
  // the tensor cores go from one to the other without a gap, and hand slot i back as soon as
  // P_i V_i has completed (wgmma groups complete in order: waiting for all but the newest
  // group). That needs tile i+1 to have landed; when it has not, slot i goes back first and
  // S_{i+1} waits for its copy, because with two slots that release is what starts the copy of
  // tile i+2. The choice must be uniform over the warpgroup (wgmma is warpgroup-collective): one
  // thread tests the barrier and the warpgroup syncs on a named barrier to read its answer.
  auto other_step = [&](int i) {
    const int slot = i & 1, par = i & 1;
    const bool has_next = i + 1 < n_tiles;
    float f[2];
    BarSync(1 + par);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f[h] = scale_s[par * 64 + r0 + 8 * h];
      m_run[h] = m_s[par * 64 + r0 + 8 * h];
      l_run[h] *= f[h];
    }
    rescale(f);
    wait_tile(slot, (i >> 1) & 1);
    wg::Fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
      wg::MmaSS256TBf16(o, wg::DescAdd(p_desc, kt * 32), v_desc(slot, kt));
    }
    wg::Commit();
    if (w == 0 && lane == 0) {
      early_s[c] = has_next && wg::MbarTest(sm.full(slot ^ 1), ((i + 1) >> 1) & 1);
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(5 + c) : "memory");
    const bool early = early_s[c] != 0;
    if (early) {
      issue_s(i + 1);
      wg::Wait<1>();
    } else {
      wg::Wait<0>();
    }
    wg::Pin(o);
    wg::MbarArrive(sm.empty(slot));
    if (has_next && !early) issue_s(i + 1);
  };

  // Consumer 0 owns tiles 0, 2, ...; consumer 1 issues S_1 in its step for tile 0. One loop with
  // the role chosen per tile: ptxas serializes every wgmma (C7518) when consumer 1 runs a
  // separate prologue step instead.
  wg::MbarWait(sm.q_full(), 0);
  wg::ProxyFence();  // Q came through cp.async (the generic proxy); wgmma reads it async
  if (c == 0 && n_tiles > 0) issue_s(0);
  for (int i = 0; i < n_tiles; ++i) {
    if ((i & 1) == c) {
      own_step(i);
    } else {
      other_step(i);
    }
  }
  // Every product has completed here; saying so (uniformly, outside any branch) keeps ptxas from
  // inserting its own wait in the divergent epilogue, which would serialize every wgmma.
  wg::Wait<0>();
  wg::Pin(o);

  // ---- Epilogue: row sums of both consumers (each summed its own tiles, under the same
  // rescaling), then the normalized half rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    if (t == 0) l_s[c * 64 + r0 + 8 * h] = l_run[h];
  }
  BarSync(3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    if (r >= geo.item_rows) continue;
    const float l = l_s[r] + l_s[64 + r];
    const float inv = l > 0.f ? a.out_scale / l : 0.f;
    if (item.partial >= 0 && c == 0 && t == 0) {
      a.partial_lse[static_cast<size_t>(item.partial) * kMlaMaxRows + r] =
          l > 0.f ? m_run[h] + log2f(l) : -INFINITY;
    }
    const size_t qr = QRow(a, item, r);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int d = 256 * c + 8 * j + 2 * t;
      const float v0 = o[4 * j + 2 * h] * inv, v1 = o[4 * j + 2 * h + 1] * inv;
      if (item.partial < 0) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(a.out) + qr * kMlaLatentDim +
                                           d) = __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(
            a.partial_o + (static_cast<size_t>(item.partial) * kMlaMaxRows + r) * kMlaLatentDim +
            d) = make_float2(v0, v1);
      }
    }
  }
}

__global__ void __launch_bounds__(WgCfg::kThreads, 1)
    MlaWgmmaKernel(const AttendArgs a, const __grid_constant__ CUtensorMap cache_map) {
  if (SurplusCta(a)) return;
  extern __shared__ uint8_t smem_raw[];
  // 1024-byte aligned for the swizzle.
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - (raw_addr & 1023)) & 1023;
  uint8_t* smem = smem_raw + pad;
  const Smem sm{raw_addr + pad};
  const MlaWorkItem item = a.items[blockIdx.x];
  const ItemGeometry geo(a, item);
  const int tid = threadIdx.x;
  ptx::GridDependencyWait();  // launched early: q, the cache and the partials are the stream's
  if (tid == 0) {
    for (int slot = 0; slot < 2; ++slot) {
      wg::MbarInit(sm.full(slot), 1);     // the TMA issuer's arrival (+ bytes), or the gatherers'
      wg::MbarInit(sm.empty(slot), 256);  // one per consumer thread
    }
    wg::MbarInit(sm.q_full(), 128);  // one per producer thread, on its copies
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (tid < 128) {
    Produce(a, &cache_map, item, geo, sm, tid);
  } else {
    Consume(a, item, geo, sm, reinterpret_cast<float*>(smem + WgCfg::kStatOff), tid);
  }
}

using RingLaunch = Sm90MlaLaunch<MlaWgmmaKernel, WgCfg::kThreads, WgCfg::kSmemBytes>;

}  // namespace

bool EncodeMlaCacheMap(const void* cache, bool fp8, CUtensorMap* map) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<Encode>(nullptr);
    }
    return reinterpret_cast<Encode>(fn);
  }();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {kMlaCacheDim, cuuint64_t{1} << 31};
  const cuuint64_t strides[1] = {kMlaCacheDim * (fp8 ? 1u : 2u)};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                const_cast<void*>(cache), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                fp8 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool LaunchAttendBf16Wgmma(const AttendArgs& a, void* stream) {
  if (a.num_items == 0) return true;
  CUtensorMap map;
  if (!EncodeMlaCacheMap(a.cache, /*fp8=*/false, &map)) return false;
  RingLaunch::Launch(a, map, stream);
  return true;
}

int AttendCtasPerSmBf16Wgmma() {
  return RingLaunch::CtasPerSm();
}

}  // namespace llm::cuda::mla
