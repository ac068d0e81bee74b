// MLA decode on Hopper warpgroup MMA for 16-row items over the fp8 cache (sm_90a only): 16 heads
// of one token, the memory-bound shape an fp8 cache is for. The 64-row wgmma kernel
// (mla_decode_wgmma.cu) would pad such an item to 64 rows, four times the tensor work, and the
// portable kernel is bound by mma.sync's rate on Hopper (and converts every K and V byte).
//
// Transposed products, so the 64 tokens of a tile are wgmma's M and the 16 rows its N:
//   S^T [64 tokens x 16 rows] = K [64 x 576] . Q^T        (36 k16 steps, m64n16k16)
//   O^T [512 dims x 16 rows] += V^T [512 x 64] . P^T       (8 m-tiles x 4 k16 steps)
// K and V are the A operands, from registers: ldmatrix on the 8-bit tile, e4m3x2 -> f16x2 cvt
// (exact). Q^T and P^T are the B operands, f16 in shared memory (128-byte swizzle, K-major).
// An 8-bit ldmatrix hands a thread 4 consecutive dims of one token (K) or 2 dims x 2 tokens (V,
// .trans), so the k order of S and the m order of O^T are permuted within 16-dim blocks: Q is
// stored with the same k permutation (dim 4t + e at k 2t + e, dim 4t + 2 + e at k 8 + 2t + e),
// and the output un-permutes m (row g of a warp's 16 is dim 2g, row g + 8 dim 2g + 1).
//
// One CTA = one work item: a consumer warpgroup (warps 0-3) and a producer warp (warp 4). The
// producer streams 64-token tiles into a two-stage ring: 9 tensor copies (TMA, 64-byte x 64-row
// boxes, 64-byte swizzle) per tile issued by one lane, or, for an item's tail tile or pages that
// are not whole 64-token tiles, cp.async row gathers zero-filled past kv_end; "full" and "empty"
// mbarriers hand the stages over. Per tile the consumer computes S^T, the online softmax per
// column (a row of S: its 64 tokens span the 4 warps, so the column max crosses warps through
// shared memory), P^T to shared memory, rescales O^T by the column factors (held by the same
// threads: O^T's columns are S^T's), then O^T += V^T P^T. Two CTAs per SM overlap one another's
// conversions and products.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/mla_item.cuh"
#include "kernels/cuda/mla_kernel_args.h"
#include "kernels/cuda/mla_tensor_map.h"
#include "kernels/cuda/ptx_ops.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/gpu_port.h"

namespace llm::cuda::mla {
namespace {

namespace wg = llm::cuda::wgmma;
using ptx::CpAsync16;
using ptx::Fp8x2ToF16x2;
using ptx::LdMatrixX4;
using ptx::LdMatrixX4T;
using ptx::SmemAddr;

struct W16 {
  static constexpr int kRows = 16;      // wgmma N
  static constexpr int kTile = 64;      // tokens per tile: wgmma M
  static constexpr int kThreads = 160;  // a consumer warpgroup + a producer warp
  static constexpr int kConsumers = 128;
  static constexpr int kStages = 2;               // 2 x 36 KB: two CTAs per SM
  static constexpr int kPanelBytes = 64 * kTile;  // 64 bytes (dims) x 64 rows
  static constexpr int kStageBytes = kMlaCacheDim / 64 * kPanelBytes;
  static constexpr int kSteps = kMlaCacheDim / 16;    // 36 k16 steps of S
  static constexpr int kMTiles = kMlaLatentDim / 64;  // 8 m-tiles of O^T
  static constexpr int kQPanelBytes = kRows * 128;    // 16 rows x 64 f16 dims
  // Offsets from the 1024-byte aligned base.
  static constexpr int kQOff = 0;                                  // Q^T: 9 panels
  static constexpr int kPOff = kQOff + kSteps / 4 * kQPanelBytes;  // P^T: one 64-token panel
  static constexpr int kRedOff = kPOff + kRows * 128;              // [4 warps][16] col max / sum
  static constexpr int kBarOff = kRedOff + 4 * kRows * 4;          // full[2], empty[2]
  static constexpr int kKvOff = (kBarOff + 32 + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kKvOff + kStages * kStageBytes + 1024;  // + alignment
};

// Byte offset of (row, 16-byte chunk c of a 64-byte panel row) under the 64-byte swizzle.
__device__ __forceinline__ int Swizzled64(int row, int c) {
  return row * 64 + ((c ^ ((row >> 1) & 3)) << 4);
}

// Barrier 1: the consumer warpgroup only (the producer warp runs ahead).
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, 128;\n" ::: "memory");
}

// The producer warp: stage s of tile i is refilled once the consumer released tile i - 2.
__device__ void Produce(const AttendArgs& a, const CUtensorMap* map, const MlaWorkItem& item,
                        int num_tiles, uint8_t* kv_s, uint32_t bar, int lane) {
  const int32_t* pages = a.pages + a.page_indptr[item.seq];
  const auto* cache = static_cast<const uint8_t*>(a.cache);
  const bool whole_tiles = a.block_size % W16::kTile == 0 && item.kv_start % W16::kTile == 0;
  for (int i = 0; i < num_tiles; ++i) {
    const int st = i % W16::kStages;
    const uint32_t full = bar + 8 * st, empty = bar + 16 + 8 * st;
    uint8_t* stage = kv_s + st * W16::kStageBytes;
    if (i >= W16::kStages) wg::MbarWait(empty, (i / W16::kStages - 1) & 1);
    const int tok0 = item.kv_start + i * W16::kTile;
    if (whole_tiles && tok0 + W16::kTile <= item.kv_end) {
      if (lane == 0) {
        const int y = pages[tok0 / a.block_size] * a.block_size + tok0 % a.block_size;
        wg::MbarArriveExpectTx(full, W16::kStageBytes);
#pragma unroll
        for (int pn = 0; pn < kMlaCacheDim / 64; ++pn) {
          wg::TmaLoad2d(SmemAddr(stage + pn * W16::kPanelBytes), map, pn * 64, y, full);
        }
      }
      continue;
    }
    // Rows lane and lane + 32, in the TMA layout, zero past kv_end.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = lane + 32 * h, j = tok0 + row;
      const bool valid = j < item.kv_end;
      const size_t crow =
          valid ? static_cast<size_t>(pages[j / a.block_size]) * a.block_size + j % a.block_size
                : 0;
      const uint8_t* src = cache + crow * kMlaCacheDim;
#pragma unroll 4
      for (int c = 0; c < kMlaCacheDim / 16; ++c) {
        CpAsync16(stage + (c / 4) * W16::kPanelBytes + Swizzled64(row, c % 4), src + c * 16, valid);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) wg::MbarArrive(full);
  }
}

// D[64 x 16] (+)= A[64 x 16] (registers, f16) * B[16 x 16] (shared memory, K-major, f16).
__device__ __forceinline__ void MmaRS16(float (&d)[8], const uint32_t (&a)[4], uint64_t b,
                                        int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

// Registers: ptxas gives 196 (two CTAs of 160 threads fit in 64K); a bound of 2 CTAs makes it
// cap at 168 and serialize the wgmmas (C7512).
__global__ void __launch_bounds__(W16::kThreads, 1)
    MlaWgmma16Kernel(const AttendArgs a, const __grid_constant__ CUtensorMap cache_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* q_s = base + W16::kQOff;
  uint8_t* p_s = base + W16::kPOff;
  float* red = reinterpret_cast<float*>(base + W16::kRedOff);
  uint8_t* kv_s = base + W16::kKvOff;
  const uint32_t bar = SmemAddr(base + W16::kBarOff);

  const MlaWorkItem item = a.items[blockIdx.x];
  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const ItemGeometry geo(a, item);
  const int item_rows = geo.item_rows;
  auto q_row = [&](int r) { return QRow(a, item, r); };
  using wg::SwizzledOffset;
  const int num_tiles = NumTiles(item, W16::kTile);
  if (tid == 0) {
    for (int st = 0; st < W16::kStages; ++st) {
      wg::MbarInit(bar + 8 * st, 1);         // the TMA issuer's arrival (+ bytes), or the gather's
      wg::MbarInit(bar + 16 + 8 * st, 128);  // one per consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (w == 4) {
    Produce(a, &cache_map, item, num_tiles, kv_s, bar, lane);
    return;
  }

  // Q^T: f16, k-permuted within 16-dim blocks, zero past the item's rows.
  // Every thread's 16-byte loads (8 dims each) are in flight together; dim pair (2p, 2p + 1) of
  // a 16-dim block goes to k 2 (p / 2) + 8 (p % 2): the inverse of dim = 4t + 2 j + e.
  {
    const auto* ql = static_cast<const uint8_t*>(a.q_latent);
    const auto* qp = static_cast<const uint8_t*>(a.q_pe);
    constexpr int kChunks = kMlaCacheDim / 8;  // per row
    constexpr int kPerThread = W16::kRows * kChunks / W16::kConsumers;
    static_assert(W16::kRows * kChunks % W16::kConsumers == 0, "q chunks");
    uint4 v[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = tid + i * W16::kConsumers, r = idx / kChunks, c = idx % kChunks;
      v[i] = make_uint4(0, 0, 0, 0);
      if (r < item_rows) {
        v[i] = c < kMlaLatentDim / 8
                   ? *reinterpret_cast<const uint4*>(ql + (q_row(r) * kMlaLatentDim + 8 * c) * 2)
                   : *reinterpret_cast<const uint4*>(
                         qp + (q_row(r) * kMlaRopeDim + 8 * c - kMlaLatentDim) * 2);
      }
    }
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = tid + i * W16::kConsumers, r = idx / kChunks, c = idx % kChunks;
      const uint32_t w4[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
      for (int p = 0; p < 4; ++p) {       // dims 8c + 2p, + 1
        const int pin = 4 * (c & 1) + p;  // pair index within the 16-dim block
        const int k = 16 * (c / 2) + 2 * (pin / 2) + 8 * (pin % 2);
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w4[p]));
        *reinterpret_cast<__half2*>(q_s + (k / 64) * W16::kQPanelBytes +
                                    SwizzledOffset(r, k % 64)) = __floats2half2_rn(f.x, f.y);
      }
    }
    wg::ProxyFence();  // Q^T is read by the tensor cores
    ConsumerSync();
  }

  // This thread's 4 columns (rows of S): c -> n = 8 (c >> 1) + 2t + (c & 1).
  int col_pos[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int n = 8 * (c >> 1) + 2 * t + (c & 1);
    col_pos[c] = geo.RowPos(item, n);
  }
  float m_run[4], l_run[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    m_run[c] = -INFINITY;
    l_run[c] = 0.f;
  }
  float o[W16::kMTiles][8];
#pragma unroll
  for (int mt = 0; mt < W16::kMTiles; ++mt) {
#pragma unroll
    for (int x = 0; x < 8; ++x) o[mt][x] = 0.f;
  }
  const uint32_t q_addr = SmemAddr(q_s), p_addr = SmemAddr(p_s);
  const int mi = lane / 8, rr = lane % 8;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int st = tile % W16::kStages;
    wg::MbarWait(bar + 8 * st, (tile / W16::kStages) & 1);  // the tile landed
    ConsumerSync();  // every consumer is done with the previous tile's P^T and column maxima
    const uint8_t* kv = kv_s + st * W16::kStageBytes;

    // S^T = K Q^T. Matrices of one x4 load: tokens 16w + 0..7 / 8..15 x bytes 32 kk2 + 0..15
    // (step 2 kk2) and + 16..31 (step 2 kk2 + 1).
    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    // The A fragments go in groups of kSG steps through two register buffers: a group's
    // conversions overlap the previous group's products (and the registers stay under 255).
    // Two accumulators (even and odd groups) halve the dependent chain of products.
    {
      float s1[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      constexpr int kSG = 6, kGroups = W16::kSteps / kSG;
      uint32_t ka[2][kSG][4];
      // Panel kk2 / 2, 16-byte chunk 2 (kk2 % 2) + (mi >> 1) of this lane's token row.
      const int k_row = 16 * w + (mi & 1) * 8 + rr;
      auto k_addr = [&](int kk2) {
        return kv + (kk2 >> 1) * W16::kPanelBytes + Swizzled64(k_row, ((kk2 & 1) << 1) | (mi >> 1));
      };
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) {
        uint32_t(&buf)[kSG][4] = ka[gi & 1];
        if (gi >= 2) wg::Wait<1>();  // group gi - 2, the buffer's last reader, is done
#pragma unroll
        for (int kk2 = 0; kk2 < kSG / 2; ++kk2) {
          uint32_t r[4];
          LdMatrixX4(r, k_addr(gi * kSG / 2 + kk2));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t(&f)[4] = buf[2 * kk2 + h];
            f[0] = Fp8x2ToF16x2(r[2 * h]);
            f[1] = Fp8x2ToF16x2(r[2 * h + 1]);
            f[2] = Fp8x2ToF16x2(r[2 * h] >> 16);
            f[3] = Fp8x2ToF16x2(r[2 * h + 1] >> 16);
          }
        }
        wg::Fence();
#pragma unroll
        for (int i = 0; i < kSG; ++i) {
          const int st = gi * kSG + i;
          MmaRS16((gi & 1) ? s1 : s, buf[i],
                  wg::Desc(q_addr + (st / 4) * W16::kQPanelBytes + (st % 4) * 32, 16, 1024),
                  st >= 2 * kSG || i > 0);
        }
        wg::Commit();
      }
      wg::Wait<0>();
      wg::Pin(s);
      wg::Pin(s1);
#pragma unroll
      for (int x = 0; x < 8; ++x) s[x] += s1[x];
    }

    // Online softmax per column. s[4j + e]: token 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
    const int tile_base = item.kv_start + tile * W16::kTile;
    float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      const int c = (x & 1) | ((x >> 2) << 1);
      const int j = tile_base + 16 * w + g + 8 * ((x >> 1) & 1);
      float v = s[x] * a.scale_log2;
      if (j >= item.kv_end || j > col_pos[c]) v = -INFINITY;
      s[x] = v;
      mx[c] = fmaxf(mx[c], v);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], m));
    }
    if (g == 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c) red[w * W16::kRows + 8 * (c >> 1) + 2 * t + (c & 1)] = mx[c];
    }
    ConsumerSync();
    float alpha[4], m_use[4];
    bool moved = false;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int n = 8 * (c >> 1) + 2 * t + (c & 1);
      float tmax = red[n];
#pragma unroll
      for (int ww = 1; ww < 4; ++ww) tmax = fmaxf(tmax, red[ww * W16::kRows + n]);
      const float m_new = fmaxf(m_run[c], tmax);
      m_use[c] = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
      alpha[c] = gpu::Exp2(m_run[c] - m_use[c]);
      moved |= alpha[c] != 1.f;
      m_run[c] = m_new;
      l_run[c] *= alpha[c];
    }
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      const int c = (x & 1) | ((x >> 2) << 1);
      const float p = gpu::Exp2(s[x] - m_use[c]);
      l_run[c] += p;
      const int n = 8 * (x >> 2) + 2 * t + (x & 1);
      *reinterpret_cast<__half*>(p_s + SwizzledOffset(n, 16 * w + g + 8 * ((x >> 1) & 1))) =
          __float2half_rn(p);
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < W16::kMTiles; ++mt) {
#pragma unroll
        for (int x = 0; x < 8; ++x) o[mt][x] *= alpha[(x & 1) | ((x >> 2) << 1)];
      }
    }
    wg::ProxyFence();
    ConsumerSync();  // P^T complete; every thread has read the column maxima

    // O^T += V^T P^T. Matrices of one x4.trans load: tokens 32h + 8 mi + 0..7 x the 16 dims
    // 64 mt + 16 w .. + 15; a register holds (token 2t: dims 2g, 2g + 1), (token 2t + 1: same).
    // Groups of kOG m-tiles through two register buffers, as for S.
    {
      constexpr int kOG = 2, kGroups = W16::kMTiles / kOG;
      uint32_t va[2][kOG][4][4];
      // Panel mt, chunk w of token row 32h + lane.
#pragma unroll
      for (int gi = 0; gi < kGroups; ++gi) {
        uint32_t(&buf)[kOG][4][4] = va[gi & 1];
        if (gi >= 2) wg::Wait<1>();
#pragma unroll
        for (int i = 0; i < kOG; ++i) {
          const int mt = gi * kOG + i;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t r[4];
            LdMatrixX4T(r, kv + mt * W16::kPanelBytes + Swizzled64(32 * h + lane, w));
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {  // tokens 32h + 16hh .. + 15: k-step 2h + hh
              uint32_t(&f)[4] = buf[i][2 * h + hh];
              const uint32_t lo = r[2 * hh], hi = r[2 * hh + 1];
              f[0] = Fp8x2ToF16x2(__byte_perm(lo, 0u, 0x0020));  // dim 2g, tokens 2t, 2t + 1
              f[1] = Fp8x2ToF16x2(__byte_perm(lo, 0u, 0x0031));  // dim 2g + 1
              f[2] = Fp8x2ToF16x2(__byte_perm(hi, 0u, 0x0020));  // dim 2g, tokens 8 + 2t, + 1
              f[3] = Fp8x2ToF16x2(__byte_perm(hi, 0u, 0x0031));
            }
          }
        }
        wg::Fence();
#pragma unroll
        for (int i = 0; i < kOG; ++i) {
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            MmaRS16(o[gi * kOG + i], buf[i][ks], wg::Desc(p_addr + ks * 32, 16, 1024), 1);
          }
        }
        wg::Commit();
      }
      wg::MbarArrive(bar + 16 + 8 * st);  // this thread read its last byte of the stage
      wg::Wait<0>();
#pragma unroll
      for (int mt = 0; mt < W16::kMTiles; ++mt) wg::Pin(o[mt]);
    }
  }

  // Column sums: this thread's tokens, then the g lanes, then the 4 warps.
#pragma unroll
  for (int c = 0; c < 4; ++c) {
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) l_run[c] += __shfl_xor_sync(0xffffffffu, l_run[c], m);
  }
  ConsumerSync();  // the last tile's column maxima are read
  if (g == 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) red[w * W16::kRows + 8 * (c >> 1) + 2 * t + (c & 1)] = l_run[c];
  }
  ConsumerSync();
  float inv[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int n = 8 * (c >> 1) + 2 * t + (c & 1);
    const float l =
        red[n] + red[W16::kRows + n] + red[2 * W16::kRows + n] + red[3 * W16::kRows + n];
    inv[c] = l > 0.f ? a.out_scale / l : 0.f;
    if (item.partial >= 0 && w == 0 && g == 0 && n < item_rows) {
      a.partial_lse[static_cast<size_t>(item.partial) * kMlaMaxRows + n] =
          l > 0.f ? m_run[c] + log2f(l) : -INFINITY;
    }
  }
  // o[mt][4j + e]: dim 64 mt + 16 w + 2g + (e >> 1), column 8j + 2t + (e & 1).
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int n = 8 * (c >> 1) + 2 * t + (c & 1);
    if (n >= item_rows) continue;
    const int x0 = 4 * (c >> 1) + (c & 1);  // e = c & 1 (dim 2g) and x0 + 2 (dim 2g + 1)
    const size_t qrow = q_row(n);
#pragma unroll
    for (int mt = 0; mt < W16::kMTiles; ++mt) {
      const int d = 64 * mt + 16 * w + 2 * g;
      const float v0 = o[mt][x0] * inv[c], v1 = o[mt][x0 + 2] * inv[c];
      if (item.partial < 0) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(a.out) +
                                           qrow * kMlaLatentDim + d) =
            __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(
            a.partial_o + (static_cast<size_t>(item.partial) * kMlaMaxRows + n) * kMlaLatentDim +
            d) = make_float2(v0, v1);
      }
    }
  }
}

cudaError_t PrepareKernel() {
  static const cudaError_t err = cudaFuncSetAttribute(
      MlaWgmma16Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, W16::kSmemBytes);
  return err;
}

}  // namespace

bool LaunchAttendFp8Wgmma16(const AttendArgs& a, void* stream) {
  if (a.num_items == 0) return true;
  CUtensorMap map;
  if (!EncodeMlaCacheMap(a.cache, /*fp8=*/true, &map)) return false;
  (void)PrepareKernel();  // a failed attribute call makes the launch fail too
  MlaWgmma16Kernel<<<a.num_items, W16::kThreads, W16::kSmemBytes,
                     static_cast<cudaStream_t>(stream)>>>(a, map);
  return true;
}

int AttendCtasPerSmFp8Wgmma16() {
  if (PrepareKernel() != cudaSuccess) return 1;
  int n = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, MlaWgmma16Kernel, W16::kThreads,
                                                W16::kSmemBytes);
  return n > 0 ? n : 1;
}

}  // namespace llm::cuda::mla
