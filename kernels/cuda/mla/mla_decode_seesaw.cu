// MLA decode on Hopper warpgroup MMA with the "seesaw" schedule (sm_90a only): 64-row work items
// over a bf16 latent cache whose pages are whole 64-token tiles (block_size % 64 == 0; the
// planner's chunks start on multiples of 64). The schedule is FlashMLA's (its 2025-04 deep dive);
// the code is this project's, on the primitives of wgmma.cuh.
//
// Why not the ring kernel (mla_decode_wgmma.cu): there the next tile's S = Q K^T is queued behind
// the other warpgroup's P V, which waits for the current softmax, so the tensor cores idle for the
// whole softmax of every tile (ncu shows the tensor pipe idle for a third of the time).
// Here each warpgroup's softmax runs while the other warpgroup's S is on the tensor cores.
//
// One CTA = one MlaWorkItem, 256 threads = two warpgroups and no producer. Warpgroup c owns output
// columns 256c .. 256c + 255 (O_c: 128 fp32 registers per thread) and the tiles of parity c; tile i
// sits in slot i % 2. Per pair of tiles (a = 2k in slot 0, b = a + 1 in slot 1), m being the
// running max shared in shared memory (lazily moved: kLazyRescaleLog2):
//   WG0: softmax of S_a: m0 = max(m, max S_a), f0 = 2^(m - m0), P_a; O_0 = O_0 f0 + P_a V_a0
//        (P_a from registers).
//   WG1: softmax of S_b against m0: m1, f1, P_b; O_1 = O_1 f0 f1 + P_b V_b1 (registers) + (P_a f1)
//        V_a1 (P_a f1 published by WG0 in shared memory).
//   WG0: O_0 = O_0 f1 + P_b V_b0 (P_b published by WG1), then S_{a+2}.
//   WG1: S_{b+2}, which runs while WG0's next softmax does.
// A tile's halves are refilled separately by the warpgroup whose product read them last, as soon
// as that product completes (one TMA per 64-dim panel, an mbarrier per panel, so S can start on
// the first panels while the last are in flight):
//   slot 0: panels 0-3 by WG0 after P_a V_a0; panels 4-8 by WG1 after (P_a f1) V_a1.
//   slot 1: panels 0-3 and 8 by WG0 after P_b V_b0; panels 4-7 by WG1 after P_b V_b1.
// A published P lives in the rope panel (8) of its tile's slot, free once that tile's S is done;
// so shared memory holds Q and two tiles only.
//
// Shared memory: Q 72 KB + 2 slots x 72 KB + row statistics + 18 mbarriers + 1 KB alignment =
// 218.6 KB: one CTA per SM.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

struct SeeCfg {
  static constexpr int kTile = 64;  // tokens per KV tile
  static constexpr int kPanels = kMlaCacheDim / 64;
  static constexpr int kRopePanel = kPanels - 1;  // holds the tile's published P after its S
  static constexpr int kPanelBytes = 64 * 128;    // 64 rows x 64 bf16 dims
  static constexpr int kTileBytes = kPanels * kPanelBytes;
  static constexpr int kThreads = 256;
  static constexpr int kQOff = 0;
  static constexpr int kKvOff = kTileBytes;
  static constexpr int kStatOff = kKvOff + 2 * kTileBytes;  // m[64], f0[64], f1[64], l[2][64]
  static constexpr int kBarOff = kStatOff + 5 * 64 * 4;
  static constexpr int kNumBars = 2 * kPanels;  // full[slot][panel]
  static constexpr int kSmemBytes = kBarOff + kNumBars * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM on sm_90");
  static_assert(kMlaLatentDim == 512 && kPanels == 9, "panel mapping");
};

// As in the ring kernel: the offset moves only when a tile's max passes it by more than 2^8.
constexpr float kLazyRescaleLog2 = 8.f;

// Named barriers (0 is __syncthreads): the hand-offs of one pair, and a per-warpgroup barrier
// (5, 6) for the zero fill of a tail tile.
enum Bar : int { kScale0 = 1, kScale1 = 2, kP0 = 3, kPv0Issued = 4, kWgLocal = 5 };

__device__ __forceinline__ void BarSync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void BarArrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

struct Smem {
  uint32_t base;
  __device__ uint32_t q() const { return base + SeeCfg::kQOff; }
  __device__ uint32_t kv(int slot) const {
    return base + SeeCfg::kKvOff + slot * SeeCfg::kTileBytes;
  }
  __device__ uint32_t panel(int slot, int pn) const { return kv(slot) + pn * SeeCfg::kPanelBytes; }
  __device__ uint32_t full(int slot, int pn) const {
    return base + SeeCfg::kBarOff + 8 * (slot * SeeCfg::kPanels + pn);
  }
};

// Per-row maxima of a 64 x 64 S fragment, reduced over the quad that shares a row.
__device__ __forceinline__ void RowMax(const float (&s)[32], float (&mx)[2]) {
  wg::RowMax64(s, mx);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
}

// Everything a warpgroup's steps share: the item, this thread's place, and its registers.
struct Ctx {
  const AttendArgs* a;
  const CUtensorMap* map;
  MlaWorkItem item;
  int n_tiles;
  int c;     // warpgroup: 0 or 1
  int wtid;  // thread in the warpgroup
  int t;     // lane % 4
  int r0;    // this thread's rows: r0 and r0 + 8
  int row_pos[2];
  int pos0;
  Smem sm;
  float* m_s;   // [64] running max (log2 units)
  float* f0_s;  // [64] WG0's rescale factor of the pair
  float* f1_s;  // [64] WG1's
  float* l_s;   // [2][64] row sums at the end
  uint64_t q_desc, kv_desc0, v_desc0;
  float o[128];
  float s[32];
  uint32_t p[4][4];  // P as the A operand, k16-slice kt = tokens 16kt ..
  float l[2];

  __device__ int tok0(int i) const { return item.kv_start + i * SeeCfg::kTile; }
  // Cache row of token j (inside a page: pages are whole tiles).
  __device__ int cache_row(int j) const {
    const int32_t* pages = a->pages + a->page_indptr[item.seq];
    return pages[j / a->block_size] * a->block_size + j % a->block_size;
  }
  // One thread of the warpgroup: tile i's panels [b, e) (and `extra`, if >= 0) into its slot.
  __device__ void Load(int i, int b, int e, int extra) const {
    if (wtid != 0) return;
    const int slot = i & 1, y = cache_row(tok0(i));
    auto one = [&](int pn) {
      wg::MbarArriveExpectTx(sm.full(slot, pn), SeeCfg::kPanelBytes);
      wg::TmaLoad2d(sm.panel(slot, pn), map, pn * 64, y, sm.full(slot, pn), wg::EvictFirstPolicy());
    };
    for (int pn = b; pn < e; ++pn) one(pn);
    if (extra >= 0) one(extra);
  }
  // S_i over panels [kB, kE) of its slot, each panel once its copy has landed. kFirst: the chain's
  // first product sets S (scale-d 0).
  template <int kB, int kE, bool kFirst>
  __device__ void IssueS(int i) {
    const int slot = i & 1;
    const uint32_t parity = (i >> 1) & 1;
    const uint64_t kv_desc = wg::DescAdd(kv_desc0, slot * SeeCfg::kTileBytes);
#pragma unroll
    for (int pn = kB; pn < kE; ++pn) {
      wg::MbarWait(sm.full(slot, pn), parity);
      wg::Fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = pn * SeeCfg::kPanelBytes + kk * 32;
        wg::MmaSS64<true>(s, wg::DescAdd(q_desc, off), wg::DescAdd(kv_desc, off),
                          (kFirst && pn == kB && kk == 0) ? 0 : 1);
      }
    }
  }
  // V_i's columns 256c .., k16-slice kt: MN-major, 4 panels apart.
  __device__ uint64_t VDesc(int slot, int kt) const {
    return wg::DescAdd(v_desc0, slot * SeeCfg::kTileBytes + kt * 16 * 128);
  }
  // The published P of slot `slot` (its rope panel), k16-slice kt: K-major.
  __device__ uint32_t PAddr(int slot) const {
    return sm.panel(slot, SeeCfg::kRopePanel);
  }
  __device__ uint64_t PDesc(int slot, int kt) const {
    return wg::DescAdd(wg::Desc(PAddr(slot), 16, 1024), kt * 32);
  }
  __device__ bool NeedMask(int i) const {
    const int t0 = tok0(i);
    return t0 + SeeCfg::kTile > item.kv_end || t0 + SeeCfg::kTile - 1 > pos0;
  }
  __device__ void Mask(int i) {
    const int t0 = tok0(i);
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      const int j = t0 + 8 * (x >> 2) + 2 * t + (x & 1);
      if (j >= item.kv_end || j > row_pos[(x >> 1) & 1]) s[x] = -INFINITY;
    }
  }
  // Softmax of S_i against the running max m_in, in two parts so the row statistics can be
  // published before the exponentials. Max: the new max (lazily moved), the factor that takes
  // the old offset to the new one, and the offset P is taken against. Exp: P in s (fp32).
  __device__ void SoftmaxMax(int i, const float (&m_in)[2], float (&m_new)[2], float (&f)[2],
                             float (&m_use)[2]) {
    if (NeedMask(i)) Mask(i);
    float mx[2];
    RowMax(s, mx);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] *= a->scale_log2;
      m_new[h] = mx[h] > m_in[h] + kLazyRescaleLog2 ? mx[h] : m_in[h];
      m_use[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];  // fully masked so far: no NaN
      f[h] = m_new[h] == m_in[h] ? 1.f : gpu::Exp2(m_in[h] - m_use[h]);
    }
  }
  __device__ void SoftmaxExp(const float (&m_use)[2]) {
#pragma unroll
    for (int x = 0; x < 32; ++x) s[x] = gpu::Exp2(fmaf(s[x], a->scale_log2, -m_use[(x >> 1) & 1]));
  }
  __device__ void PackP(float f0, float f1) {
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int x = 8 * kt + 2 * r;
        const float f = ((x >> 1) & 1) ? f1 : f0;
        const __nv_bfloat162 v = __floats2bfloat162_rn(s[x] * f, s[x + 1] * f);
        p[kt][r] = *reinterpret_cast<const uint32_t*>(&v);
      }
    }
  }
  __device__ void RowSums(float (&sum)[2]) const {
    sum[0] = sum[1] = 0.f;
#pragma unroll
    for (int x = 0; x < 32; ++x) sum[(x >> 1) & 1] += s[x];
  }
  // P into the rope panel of `slot` (A operand, K-major, swizzled): n-block j of row r0 (+8)
  // holds tokens 8j + 2t, +1. Then visible to the async proxy (the other warpgroup's wgmma).
  __device__ void PublishP(int slot) const {
    const uint32_t base = PAddr(slot);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t at = base + (r0 + 8 * h) * 128 + ((j ^ (r0 & 7)) << 4) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(p[j / 2][(j & 1) * 2 + h])
                     : "memory");
      }
    }
    wg::ProxyFence();
  }
  __device__ void Rescale(float f0, float f1) {
    if (__all_sync(0xffffffffu, f0 == 1.f && f1 == 1.f)) return;  // no row max moved
#pragma unroll
    for (int x = 0; x < 128; ++x) o[x] *= ((x >> 1) & 1) ? f1 : f0;
  }
  // A tail tile's rows past kv_end hold whatever the page held (NaN in the tests): zero this
  // warpgroup's V half of them before its P V reads them (P is 0 there, but 0 * NaN is not).
  // The caller has waited for the panels' copies.
  __device__ void ZeroTail(int i) const {
    const int valid = item.kv_end - tok0(i);
    if (valid >= SeeCfg::kTile) return;
    const int slot = i & 1;
    // 4 panels x (64 - valid) rows x 8 chunks of 16 bytes.
    const int rows = SeeCfg::kTile - valid;
    for (int k = wtid; k < 4 * rows * 8; k += 128) {
      const int pn = 4 * c + k / (rows * 8), rr = valid + (k / 8) % rows, ch = k % 8;
      const uint32_t at = sm.panel(slot, pn) + rr * 128 + ch * 16;
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
    }
    wg::ProxyFence();
    BarSync(kWgLocal + c, 128);
  }
  __device__ bool IsTail(int i) const {
    return item.kv_end - tok0(i) < SeeCfg::kTile;
  }
  __device__ void WaitPanels(int i, int b, int e) const {
    for (int pn = b; pn < e; ++pn) wg::MbarWait(sm.full(i & 1, pn), (i >> 1) & 1);
  }
};

// Warpgroup 0's part of the pair (a, a + 1). On entry S_a has completed; on exit S_{a+2} has.
// kHasB: tile a + 1 exists; kNextA / kNextB: tiles a + 2 / a + 3 exist.
template <bool kHasB, bool kNextA, bool kNextB>
__device__ __forceinline__ void Wg0Pair(Ctx& x, int i) {
  const int b = i + 1;
  float m_in[2], m_new[2], f0[2], m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) m_in[h] = x.m_s[x.r0 + 8 * h];
  x.SoftmaxMax(i, m_in, m_new, f0, m_use);
  x.SoftmaxExp(m_use);
  __syncwarp();  // the quad has read m before its first lane writes it
  if (x.t == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      x.m_s[x.r0 + 8 * h] = m_new[h];
      x.f0_s[x.r0 + 8 * h] = f0[h];
    }
  }
  BarArrive(kScale0);
  float sum[2];
  x.RowSums(sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) x.l[h] = x.l[h] * f0[h] + sum[h];
  x.PackP(1.f, 1.f);
  x.Rescale(f0[0], f0[1]);
  if (x.IsTail(i)) x.ZeroTail(i);
  wg::Fence();
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) wg::MmaRS256Bf16(x.o, x.p[kt], x.VDesc(0, kt));
  wg::Commit();
  wg::Wait<0>();
  wg::Pin(x.o);
  BarSync(kScale1, 256);  // WG1's softmax of S_b is done: f1
  if constexpr (kNextA) x.Load(i + 2, 0, 4, -1);
  float f1[2] = {1.f, 1.f};
  if constexpr (kHasB) {
#pragma unroll
    for (int h = 0; h < 2; ++h) f1[h] = x.f1_s[x.r0 + 8 * h];
    if (!__all_sync(0xffffffffu, f1[0] == 1.f && f1[1] == 1.f)) x.PackP(f1[0], f1[1]);
  }
  x.PublishP(0);
  BarArrive(kP0);
  if constexpr (kHasB) {
    if (x.IsTail(b)) {
      x.WaitPanels(b, 0, 4);
      x.ZeroTail(b);
    }
    BarSync(kPv0Issued, 256);  // WG1's P_b is published and its products are queued first
    x.Rescale(f1[0], f1[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) x.l[h] *= f1[h];
    wg::Fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) wg::MmaSS256TBf16(x.o, x.PDesc(1, kt), x.VDesc(1, kt));
    wg::Commit();
  }
  if constexpr (kNextA) {
    wg::Fence();
    x.IssueS<0, 4, true>(i + 2);
    wg::Commit();
  }
  if constexpr (kNextB) {
    wg::Wait<1>();  // P_b V_b0 has completed: slot 1's panels 0-3 and its P are free
    x.Load(b + 2, 0, 4, SeeCfg::kRopePanel);
  }
  if constexpr (kNextA) {
    x.IssueS<4, SeeCfg::kPanels, false>(i + 2);
    wg::Commit();
  }
  wg::Wait<0>();
  wg::Pin(x.o);
  wg::Pin(x.s);
}

// Warpgroup 1's part of the pair (a, a + 1). On entry S_b has completed (if b exists); on exit
// S_{b+2} has.
template <bool kHasB, bool kNextA, bool kNextB>
__device__ __forceinline__ void Wg1Pair(Ctx& x, int i) {
  const int b = i + 1;
  BarSync(kScale0, 256);  // WG0's softmax of S_a: m0 and f0
  float m_in[2], f0[2], f1[2] = {1.f, 1.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_in[h] = x.m_s[x.r0 + 8 * h];
    f0[h] = x.f0_s[x.r0 + 8 * h];
  }
  float m_use[2];
  if constexpr (kHasB) {
    float m_new[2];
    x.SoftmaxMax(b, m_in, m_new, f1, m_use);
    x.SoftmaxExp(m_use);
    __syncwarp();
    if (x.t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        x.m_s[x.r0 + 8 * h] = m_new[h];
        x.f1_s[x.r0 + 8 * h] = f1[h];
      }
    }
  } else if (x.t == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) x.f1_s[x.r0 + 8 * h] = 1.f;
  }
  BarArrive(kScale1);
  float sum[2] = {0.f, 0.f};
  if constexpr (kHasB) x.RowSums(sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) x.l[h] = x.l[h] * f0[h] * f1[h] + sum[h];
  x.Rescale(f0[0] * f1[0], f0[1] * f1[1]);
  if constexpr (kHasB) {
    x.PackP(1.f, 1.f);
    x.PublishP(1);
    if (x.IsTail(b)) x.ZeroTail(b);
    wg::Fence();
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) wg::MmaRS256Bf16(x.o, x.p[kt], x.VDesc(1, kt));
    wg::Commit();
  }
  BarSync(kP0, 256);  // WG0's P_a f1 is published
  if (x.IsTail(i)) {
    x.WaitPanels(i, 4, 8);
    x.ZeroTail(i);
  }
  wg::Fence();
#pragma unroll
  for (int kt = 0; kt < 4; ++kt) wg::MmaSS256TBf16(x.o, x.PDesc(0, kt), x.VDesc(0, kt));
  wg::Commit();
  if constexpr (kHasB) BarArrive(kPv0Issued);
  if constexpr (kNextB) {
    wg::Wait<1>();  // P_b V_b1 has completed: slot 1's panels 4-7 are free
    x.Load(b + 2, 4, 8, -1);
  }
  if constexpr (kNextA) {
    wg::Wait<0>();  // (P_a f1) V_a1 has completed: slot 0's panels 4-8 are free
    x.Load(i + 2, 4, SeeCfg::kPanels, -1);
  }
  if constexpr (kNextB) {
    // Panels 0-3 and 8 were refilled last (by WG0): start on 4-7.
    wg::Fence();
    x.IssueS<4, 8, true>(b + 2);
    x.IssueS<8, 9, false>(b + 2);
    x.IssueS<0, 4, false>(b + 2);
    wg::Commit();
  }
  wg::Wait<0>();
  wg::Pin(x.o);
  wg::Pin(x.s);
}

template <bool kWg0>
__device__ __forceinline__ void RunPairs(Ctx& x) {
  const int n = x.n_tiles;
  int i = 0;
#pragma unroll 1
  for (; i + 3 < n; i += 2) {
    if constexpr (kWg0) {
      Wg0Pair<true, true, true>(x, i);
    } else {
      Wg1Pair<true, true, true>(x, i);
    }
  }
  const int left = n - i;
  if (left == 3) {
    if constexpr (kWg0) {
      Wg0Pair<true, true, false>(x, i);
      Wg0Pair<false, false, false>(x, i + 2);
    } else {
      Wg1Pair<true, true, false>(x, i);
      Wg1Pair<false, false, false>(x, i + 2);
    }
  } else if (left == 2) {
    if constexpr (kWg0) {
      Wg0Pair<true, false, false>(x, i);
    } else {
      Wg1Pair<true, false, false>(x, i);
    }
  } else if (left == 1) {
    if constexpr (kWg0) {
      Wg0Pair<false, false, false>(x, i);
    } else {
      Wg1Pair<false, false, false>(x, i);
    }
  }
}

__global__ void __launch_bounds__(SeeCfg::kThreads, 1)
    MlaSeesawKernel(const __grid_constant__ AttendArgs a,
                    const __grid_constant__ CUtensorMap cache_map) {
  if (SurplusCta(a)) return;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t pad = (1024 - (raw_addr & 1023)) & 1023;  // 1024-byte aligned for the swizzle
  uint8_t* smem = smem_raw + pad;
  const int tid = threadIdx.x;
  Ctx x;
  x.a = &a;
  x.map = &cache_map;
  x.item = a.items[blockIdx.x];
  x.n_tiles = NumTiles(x.item, SeeCfg::kTile);
  x.c = tid / 128;
  x.wtid = tid % 128;
  const int w = x.wtid / 32, lane = tid % 32;
  x.t = lane % 4;
  x.r0 = 16 * w + lane / 4;
  x.sm = Smem{raw_addr + pad};
  auto* stats = reinterpret_cast<float*>(smem + SeeCfg::kStatOff);
  x.m_s = stats;
  x.f0_s = stats + 64;
  x.f1_s = stats + 128;
  x.l_s = stats + 192;
  ptx::GridDependencyWait();  // launched early: q, the cache and the partials are the stream's
  const ItemGeometry geo(a, x.item);
  x.pos0 = geo.pos0;
#pragma unroll
  for (int h = 0; h < 2; ++h) x.row_pos[h] = geo.RowPos(x.item, x.r0 + 8 * h);
  if (tid == 0) {
    for (int k = 0; k < SeeCfg::kNumBars; ++k) wg::MbarInit(x.sm.base + SeeCfg::kBarOff + 8 * k, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (tid < 64) x.m_s[tid] = -INFINITY;
  __syncthreads();
  if (x.c == 0) {  // both first tiles, whole, by one thread
    if (x.n_tiles > 0) x.Load(0, 0, SeeCfg::kPanels, -1);
    if (x.n_tiles > 1) x.Load(1, 0, SeeCfg::kPanels, -1);
  }
  {
    // Q: 64 rows x 72 chunks of 16 bytes (64 latent, 8 rope) by 256 threads; rows past the item
    // are zero-filled.
    const int row = tid / 4, quarter = tid % 4;
    const bool valid = row < geo.item_rows;
    const size_t qr = valid ? QRow(a, x.item, row) : 0;
    const auto* ql = static_cast<const uint8_t*>(a.q_latent) + qr * kMlaLatentDim * 2;
    const auto* qp = static_cast<const uint8_t*>(a.q_pe) + qr * kMlaRopeDim * 2;
#pragma unroll
    for (int k = quarter; k < 72; k += 4) {
      const int pn = k / 8, ch = k % 8;
      const uint32_t at = x.sm.q() + pn * SeeCfg::kPanelBytes + row * 128 + ((ch ^ (row & 7)) << 4);
      const uint8_t* src = k < 64 ? ql + k * 16 : qp + (k - 64) * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src),
                   "r"(valid ? 16 : 0)
                   : "memory");
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    wg::ProxyFence();
  }
  __syncthreads();
  x.q_desc = wg::Desc(x.sm.q(), 16, 1024);
  x.kv_desc0 = wg::Desc(x.sm.kv(0), 16, 1024);
  x.v_desc0 = wg::Desc(x.sm.panel(0, 4 * x.c), SeeCfg::kPanelBytes, 1024);
#pragma unroll
  for (int k = 0; k < 128; ++k) x.o[k] = 0.f;
  x.l[0] = x.l[1] = 0.f;
  if (x.n_tiles > x.c) {  // S of the warpgroup's first tile (tile c)
    wg::Fence();
    x.IssueS<0, SeeCfg::kPanels, true>(x.c);
    wg::Commit();
  }
  wg::Wait<0>();
  wg::Pin(x.s);
  if (x.c == 0) {
    RunPairs<true>(x);
  } else {
    RunPairs<false>(x);
  }
  wg::Wait<0>();
  wg::Pin(x.o);

  // ---- Epilogue: both warpgroups' row sums (each over its own tiles, under the same offsets),
  // then the normalized half rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    x.l[h] += __shfl_xor_sync(0xffffffffu, x.l[h], 1);
    x.l[h] += __shfl_xor_sync(0xffffffffu, x.l[h], 2);
    if (x.t == 0) x.l_s[x.c * 64 + x.r0 + 8 * h] = x.l[h];
  }
  __syncthreads();  // (compute-sanitizer's racecheck does not follow a named barrier here)
  const MlaWorkItem& item = x.item;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = x.r0 + 8 * h;
    if (r >= geo.item_rows) continue;
    const float l = x.l_s[r] + x.l_s[64 + r];
    const float inv = l > 0.f ? a.out_scale / l : 0.f;
    if (item.partial >= 0 && x.c == 0 && x.t == 0) {
      a.partial_lse[static_cast<size_t>(item.partial) * kMlaMaxRows + r] =
          l > 0.f ? x.m_s[r] + log2f(l) : -INFINITY;
    }
    const size_t qr = QRow(a, item, r);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int d = 256 * x.c + 8 * j + 2 * x.t;
      const float v0 = x.o[4 * j + 2 * h] * inv, v1 = x.o[4 * j + 2 * h + 1] * inv;
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

using SeesawLaunch = Sm90MlaLaunch<MlaSeesawKernel, SeeCfg::kThreads, SeeCfg::kSmemBytes>;

}  // namespace

bool LaunchAttendBf16Seesaw(const AttendArgs& a, void* stream) {
  if (a.num_items == 0) return true;
  CUtensorMap map;
  if (!EncodeMlaCacheMap(a.cache, /*fp8=*/false, &map)) return false;
  SeesawLaunch::Launch(a, map, stream);
  return true;
}

int AttendCtasPerSmBf16Seesaw() {
  return SeesawLaunch::CtasPerSm();
}

}  // namespace llm::cuda::mla
