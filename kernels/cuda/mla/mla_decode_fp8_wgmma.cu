// MLA decode on Hopper warpgroup MMA for items of R = 16 or 32 rows over the fp8 cache (sm_90a
// only): 16 or 32 heads of one token, the memory-bound shapes an fp8 cache is for (64 and 128
// heads run as 2 and 4 such items per token: MlaDecode::plan_config). The 64-row wgmma kernel
// (mla_decode_wgmma.cu) would pad such an item to 64 rows, and the portable kernel is bound by
// mma.sync's rate on Hopper (and converts every K and V byte).
//
// Transposed products on e4m3 tensor cores, so the 64 tokens of a tile are wgmma's M and the R
// rows its N, and the cache bytes are MMA inputs as they are (no per-element conversion):
//   S^T [64 tokens x 2R] = K [64 x 576] . [Q_hi; Q_lo]^T   (18 k32 steps, m64n(2R)k32, both
//                                                           operands in shared memory)
//   O^T [512 dims x R] += V^T [512 x 64] . P_hi^T + V^T . P_lo^T   (8 m-tiles x 2 k32 steps x 2,
//                                                                 m64nRk32, V^T from registers)
// q and P go in as two e4m3 terms each (hi + lo, ~8 significant bits like bf16; q scaled per row
// by a power of two into [128, 256), P by 256, both exact and undone in fp32); S = S_hi + S_lo
// column-wise in registers. K is the A operand straight from the TMA tile (K-major, 64-byte
// swizzle). V^T must be K-major too (tokens contiguous), which the tile is not: an 8-bit
// ldmatrix.trans hands a thread 2 dims x 2 tokens per register and one byte permute per register
// regroups them into 4 tokens of one dim, so a thread's fragment holds dims 2g / 2g + 1 of its
// 16-dim block (O^T's m order, un-permuted at the store) and k slot 4t + e of a 16-token group
// holds token 2t + (e & 1) + 8 (e >> 1): P^T is stored in that k order.
//
// One CTA = one work item, one CTA per SM: two consumer warpgroups (warps 0-7) on alternate
// 64-token tiles, and a producer warpgroup of which one warp works (setmaxnreg gives its registers
// to the consumers). The producer streams the tiles into a four-stage ring: 9 tensor copies (TMA,
// 64-byte x 64-row boxes, 64-byte swizzle) per tile issued by one lane, or, for an item's tail
// tile or pages that are not whole 64-token tiles, cp.async row gathers zero-filled past kv_end;
// "full" and "empty" mbarriers hand the stages over. Per tile a consumer warpgroup computes S^T,
// the online softmax per column (a row of S: its 64 tokens span the 4 warps, so the column max
// crosses warps through shared memory), P^T to shared memory, rescales O^T by the column factors
// (held by the same threads: O^T's columns are S^T's), then O^T += V^T P^T. Each warpgroup's
// chain of products, softmax and barriers is latency-bound, so two of them per SM keep the tensor
// cores and the memory busy (one warpgroup per CTA at two CTAs per SM did the same but needed a
// KV split and a merge kernel for 128 items, which cost more than it hid). At the end warpgroup 1
// hands its (O^T, max, sum) to warpgroup 0 through the idle ring, and warpgroup 0 writes the
// output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
using ptx::CpAsync16;
using ptx::LdMatrixX4T;
using ptx::SmemAddr;
using ptx::SplitE4m3x2;

// The ring and thread layout, common to both row counts.
struct FwRing {
  static constexpr int kTile = 64;        // tokens per tile: wgmma M of S^T
  static constexpr int kWGs = 2;          // consumer warpgroups, on alternate tiles
  static constexpr int kConsumers = 128;  // threads per consumer warpgroup
  static constexpr int kThreads = (kWGs + 1) * kConsumers;  // + a producer warpgroup (1 warp works)
  // setmaxnreg only moves registers within the CTA's launch allocation (384 x 168).
  static constexpr int kEntryRegs = 168;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kConsumers * (kProducerRegs + kWGs * kConsumerRegs) <= kThreads * kEntryRegs,
                "register split exceeds the CTA's allocation");
  static constexpr int kStages = 4;               // 4 x 36 KB ring, one CTA per SM
  static constexpr int kPanelBytes = 64 * kTile;  // 64 bytes (dims) x 64 rows
  static constexpr int kStageBytes = kMlaCacheDim / 64 * kPanelBytes;
  static constexpr int kSteps = kMlaCacheDim / 32;    // 18 k32 steps of S
  static constexpr int kMTiles = kMlaLatentDim / 64;  // 8 m-tiles of O^T
  static constexpr float kPScale = 256.f;             // P <= 1 -> <= 256, inside e4m3's 448
};

// R rows (16 or 32): wgmma N of O^T; S^T has 2R columns (the hi and lo terms of q).
template <int R>
struct FwCfg : FwRing {
  static constexpr int kRows = R;
  static constexpr int kCols = R / 4;                  // columns (rows of S) per thread
  static constexpr int kQPanelBytes = 2 * kRows * 64;  // [q_hi; q_lo] 2R rows x 64 dims
  static constexpr int kPBytes = 2 * kRows * 64;       // P^T: [P_hi; P_lo] x 64 tokens
  static constexpr int kRedBytes = 4 * kRows * 4;      // [4 warps][R] col max / sum
  // Offsets from the 1024-byte aligned base.
  static constexpr int kQOff = 0;                                  // Q: 9 panels
  static constexpr int kPOff = kQOff + kSteps / 2 * kQPanelBytes;  // per warpgroup
  static constexpr int kRedOff = kPOff + kWGs * kPBytes;           // per warpgroup
  static constexpr int kRowMaxOff = kRedOff + kWGs * kRedBytes;    // [R] max |q|
  // Per column: scale_log2 / q scale, and the causal limit (read per tile: registers are short).
  static constexpr int kColScaleOff = kRowMaxOff + kRows * 4;  // [R] float
  static constexpr int kColPosOff = kColScaleOff + kRows * 4;  // [R] int
  static constexpr int kBarOff = kColPosOff + kRows * 4;       // full[kStages], empty[...]
  static constexpr int kKvOff = (kBarOff + 16 * kStages + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kKvOff + kStages * kStageBytes + 1024;  // + alignment
  // The warpgroups' partials meet in the idle ring at the end: float4 k of thread t at [k][t].
  static constexpr int kXchgF4 = kMTiles * kRows / 8 + 2 * kCols / 4;  // O^T, max, sum
  static_assert(kConsumers * kXchgF4 * 16 <= kStages * kStageBytes, "merge scratch");
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM on sm_90");
};

// Byte offset of (row, 16-byte chunk c of a 64-byte panel row) under the 64-byte swizzle.
__device__ __forceinline__ int Swizzled64(int row, int c) {
  return row * 64 + ((c ^ ((row >> 1) & 3)) << 4);
}

// Barrier 1 + wgi: one consumer warpgroup; barrier 3: both (the producer runs ahead).
__device__ __forceinline__ void ConsumerSync(int wgi) {
  if (wgi == 0) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  }
}
__device__ __forceinline__ void ConsumersSync() {
  asm volatile("bar.sync 3, 256;\n" ::: "memory");
}

// The producer warp: the stage of tile i is refilled once tile i - kStages was released.
__device__ void Produce(const AttendArgs& a, const CUtensorMap* map, const MlaWorkItem& item,
                        int num_tiles, uint8_t* kv_s, uint32_t bar, int lane) {
  const int32_t* pages = a.pages + a.page_indptr[item.seq];
  const auto* cache = static_cast<const uint8_t*>(a.cache);
  const bool whole_tiles = a.block_size % FwRing::kTile == 0 && item.kv_start % FwRing::kTile == 0;
  for (int i = 0; i < num_tiles; ++i) {
    const int st = i % FwRing::kStages;
    const uint32_t full = bar + 8 * st, empty = bar + 8 * (FwRing::kStages + st);
    uint8_t* stage = kv_s + st * FwRing::kStageBytes;
    if (i >= FwRing::kStages) wg::MbarWait(empty, (i / FwRing::kStages - 1) & 1);
    const int tok0 = item.kv_start + i * FwRing::kTile;
    if (whole_tiles && tok0 + FwRing::kTile <= item.kv_end) {
      if (lane == 0) {
        const int y = pages[tok0 / a.block_size] * a.block_size + tok0 % a.block_size;
        wg::MbarArriveExpectTx(full, FwRing::kStageBytes);
        // Evict-first in L2: a tile is read once per item (as in mla_decode_wgmma.cu).
#pragma unroll
        for (int pn = 0; pn < kMlaCacheDim / 64; ++pn) {
          wg::TmaLoad2d(SmemAddr(stage + pn * FwRing::kPanelBytes), map, pn * 64, y, full,
                        wg::EvictFirstPolicy());
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
        CpAsync16(stage + (c / 4) * FwRing::kPanelBytes + Swizzled64(row, c % 4), src + c * 16,
                  valid);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncwarp();
    if (lane == 0) wg::MbarArrive(full);
  }
}

// S^T products, both operands from shared memory (K-major, 64-byte swizzle), e4m3:
// D[64 x 2R] = (kAcc: D +) A[64 x 32] * B[32 x 2R]. The first k-step (kAcc false) only writes
// D: its registers are not live between tiles (32 rows need them for the softmax).
#define LLM_FW_OUT16(C)                                                                     \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), \
      C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15])
#define LLM_FW_OUT32(C)                                                                            \
  LLM_FW_OUT16(C), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
      C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
#define LLM_FW_ACC16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17"
#define LLM_FW_ACC32                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33"
#define LLM_FW_W "=f"
#define LLM_FW_RW "+f"
template <int R, bool kAcc>
__device__ __forceinline__ void MmaS(float (&d)[R], uint64_t a, uint64_t b) {
  if constexpr (R == 16 && kAcc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " LLM_FW_ACC16 ", 1, 1, 1;\n"
                 : LLM_FW_OUT16(LLM_FW_RW)
                 : "l"(a), "l"(b));
  } else if constexpr (R == 16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " LLM_FW_ACC16 ", 0, 1, 1;\n"
                 : LLM_FW_OUT16(LLM_FW_W)
                 : "l"(a), "l"(b));
  } else if constexpr (kAcc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " LLM_FW_ACC32 ", 1, 1, 1;\n"
                 : LLM_FW_OUT32(LLM_FW_RW)
                 : "l"(a), "l"(b));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " LLM_FW_ACC32 ", 0, 1, 1;\n"
                 : LLM_FW_OUT32(LLM_FW_W)
                 : "l"(a), "l"(b));
  }
}
#undef LLM_FW_RW
#undef LLM_FW_W
#undef LLM_FW_ACC32
#undef LLM_FW_ACC16
#undef LLM_FW_OUT32
#undef LLM_FW_OUT16

// D[64 x 32] (+)= A[64 x 32] (registers) * B[32 x 32] (shared memory), as below.
__device__ __forceinline__ void MmaRS32E4m3(float (&d)[16], const uint32_t (&a)[4], uint64_t b,
                                            int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
// D[64 x 16] (+)= A[64 x 32] (registers, e4m3: the mma.sync m16n8k32 A layout per warp) *
// B[32 x 16] (shared memory, K-major, e4m3).
__device__ __forceinline__ void MmaRS16E4m3(float (&d)[8], const uint32_t (&a)[4], uint64_t b,
                                            int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

// The O^T product by row count (R columns).
template <int R>
__device__ __forceinline__ void MmaO(float (&d)[R / 2], const uint32_t (&a)[4], uint64_t b,
                                     int scale_d) {
  if constexpr (R == 16) {
    MmaRS16E4m3(d, a, b, scale_d);
  } else {
    MmaRS32E4m3(d, a, b, scale_d);
  }
}

// Accumulator layout shared by S^T and O^T (wgmma D, per thread): entry x is token row
// 16w + g + 8 ((x >> 1) & 1) and column 8 (x >> 2) + 2t + (x & 1). A thread holds R / 4 columns;
// ColSlot(x) numbers them c = 0 .. R/4 - 1, and Col(c, t) is slot c's column.
__device__ __forceinline__ int ColSlot(int x) {
  return (x & 1) | ((x >> 2) << 1);
}
__device__ __forceinline__ int Col(int c, int t) {
  return 8 * (c >> 1) + 2 * t + (c & 1);
}

// Byte of P^T for column n (0..R-1; + R: the lo term) and tile token tok: 32-token k-step
// tok / 32, and within it the slot whose V^T fragment holds that token (see the file comment).
__device__ __forceinline__ int PSlot(int n, int tok) {
  const int tau = tok & 31;
  const int slot = (tok & 32) + (tau & 16) + 4 * ((tau & 7) >> 1) + ((tau & 8) >> 2) + (tau & 1);
  return Swizzled64(n, slot >> 4) + (slot & 15);
}

template <int R>
__global__ void __launch_bounds__(FwRing::kThreads, 1)
    MlaFp8WgmmaKernel(const AttendArgs a, const __grid_constant__ CUtensorMap cache_map) {
  if (SurplusCta(a)) return;
  using C = FwCfg<R>;
  constexpr int kCols = C::kCols;
  extern __shared__ uint8_t smem_raw[];
  // Offset (not a cast through an integer) so the compiler still knows these are shared-memory
  // pointers: shared loads and stores instead of generic ones.
  uint8_t* base = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  uint8_t* q_s = base + C::kQOff;
  uint8_t* kv_s = base + C::kKvOff;
  const uint32_t bar = SmemAddr(base + C::kBarOff);

  const MlaWorkItem item = a.items[blockIdx.x];
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
  // Warpgroup wgi (2: the producer), its warp w and thread ctid.
  const int wgi = tid / C::kConsumers, w = tid / 32 % 4, ctid = tid % C::kConsumers;
  uint8_t* p_s = base + C::kPOff + wgi * C::kPBytes;
  float* red = reinterpret_cast<float*>(base + C::kRedOff + wgi * C::kRedBytes);
  const ItemGeometry geo(a, item);
  const int item_rows = geo.item_rows;
  auto q_row = [&](int r) { return QRow(a, item, r); };
  const int num_tiles = NumTiles(item, C::kTile);
  ptx::GridDependencyWait();  // launched early: q, the cache and the partials are the stream's
  if (tid == 0) {
    for (int st = 0; st < C::kStages; ++st) {
      wg::MbarInit(bar + 8 * st, 1);  // the TMA issuer's arrival (+ bytes), or the gather's
      wg::MbarInit(bar + 8 * (C::kStages + st), C::kConsumers);  // the consumer's threads
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (wgi == C::kWGs) {
    wg::RegDealloc<C::kProducerRegs>();
    if (w == 0) Produce(a, &cache_map, item, num_tiles, kv_s, bar, lane);
    return;
  }
  wg::RegAlloc<C::kConsumerRegs>();

  // Q: rows 0-15 the hi terms, 16-31 the lo terms of the scaled q, e4m3, natural dim order, in
  // the K tile's layout (9 panels of 64 dims, 64-byte swizzle). Every thread's 16-byte loads
  // (8 dims each) are in flight together; the row maxima meet in shared memory.
  int* row_max = reinterpret_cast<int*>(base + C::kRowMaxOff);  // [R] max |q| as float bits
  float* col_scale = reinterpret_cast<float*>(base + C::kColScaleOff);
  int* col_pos = reinterpret_cast<int*>(base + C::kColPosOff);
  // 9 chunks of 8 dims per thread: warpgroup 0 for 16 rows, both for 32.
  constexpr int kQThreads = R * (kMlaCacheDim / 8) / 9;
  auto q_sync = [] {
    if constexpr (kQThreads == C::kConsumers) {
      ConsumerSync(0);
    } else {
      ConsumersSync();
    }
  };
  if (tid < kQThreads) {
    const auto* ql = static_cast<const uint8_t*>(a.q_latent);
    const auto* qp = static_cast<const uint8_t*>(a.q_pe);
    constexpr int kChunks = kMlaCacheDim / 8;  // per row
    constexpr int kPerThread = 9;
    static_assert(kQThreads * kPerThread == C::kRows * kChunks && kQThreads % 128 == 0, "q");
    if (tid < C::kRows) row_max[tid] = 0;  // (>= 0: int order is float order)
    uint4 v[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = tid + i * kQThreads, r = idx / kChunks, c = idx % kChunks;
      v[i] = make_uint4(0, 0, 0, 0);
      if (r < item_rows) {
        v[i] = c < kMlaLatentDim / 8
                   ? *reinterpret_cast<const uint4*>(ql + (q_row(r) * kMlaLatentDim + 8 * c) * 2)
                   : *reinterpret_cast<const uint4*>(
                         qp + (q_row(r) * kMlaRopeDim + 8 * c - kMlaLatentDim) * 2);
      }
    }
    q_sync();  // row_max is zeroed
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int r = (tid + i * kQThreads) / kChunks;
      const uint32_t w4[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
      float mx = 0.f;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w4[p]));
        mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
      atomicMax(&row_max[r], __float_as_int(mx));
    }
    q_sync();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int idx = tid + i * kQThreads, r = idx / kChunks, c = idx % kChunks;
      const float sc = QScaleE4m3(__int_as_float(row_max[r]));
      const uint32_t w4[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w4[p]));
        SplitE4m3x2(f.x * sc, f.y * sc, &hi[p], &lo[p]);
      }
      const int k = 8 * c;  // dims k .. k + 7: half of a 16-byte chunk
      uint8_t* panel = q_s + (k / 64) * C::kQPanelBytes + (k % 16);
      *reinterpret_cast<uint2*>(panel + Swizzled64(r, k % 64 / 16)) =
          make_uint2(hi[0] | hi[1] << 16, hi[2] | hi[3] << 16);
      *reinterpret_cast<uint2*>(panel + Swizzled64(r + C::kRows, k % 64 / 16)) =
          make_uint2(lo[0] | lo[1] << 16, lo[2] | lo[3] << 16);
    }
    if (tid < R) {
      col_scale[tid] = a.scale_log2 / QScaleE4m3(__int_as_float(row_max[tid]));
      col_pos[tid] = geo.RowPos(item, tid);
    }
    wg::ProxyFence();  // Q is read by the tensor cores
  }
  ConsumersSync();

  // This thread's columns (rows of S): slot c is column Col(c, t).
  float m_run[kCols], l_run[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    m_run[c] = -INFINITY;
    l_run[c] = 0.f;
  }
  // O^T: set by the first tile's first product (scale-d 0), for the same reason as S^T below.
  float o[C::kMTiles][R / 2];
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int x = 0; x < R / 2; ++x) asm volatile("" : "=f"(o[mt][x]));
  }
  const uint32_t q_addr = SmemAddr(q_s), p_addr = SmemAddr(p_s);
  // Descriptors: a base per operand; an offset (bytes / 16) adds into the address field, which
  // holds every shared address without a carry.
  auto desc = [](uint32_t addr) { return wg::Desc(addr, 16, 512, wg::kSwizzle64B); };
  const uint64_t q_desc = desc(q_addr), p_desc = desc(p_addr);

  for (int tile = wgi; tile < num_tiles; tile += C::kWGs) {
    const int st = tile % C::kStages;
    wg::MbarWait(bar + 8 * st, (tile / C::kStages) & 1);  // the tile landed
    ConsumerSync(wgi);  // every consumer is done with the previous tile's P^T and column maxima
    const uint8_t* kv = kv_s + st * C::kStageBytes;
    const uint64_t kv_desc = desc(SmemAddr(kv));

    // V^T fragments, raw: matrices of one x4.trans load are tokens 32h + 8 mi + 0..7 x the 16 dims
    // 64 mt + 16 w .. + 15; register mi holds (token 2t: dims 2g, 2g + 1), (token 2t + 1: same).
    constexpr int kOG = R == 16 ? 2 : 1, kPvGroups = C::kMTiles / kOG;  // (32 rows: registers)
    uint32_t v_raw[kOG][2][4];
    auto load_v = [&](int gi) {
#pragma unroll
      for (int i = 0; i < kOG; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // k32 step h: tokens 32h .. 32h + 31
          LdMatrixX4T(v_raw[i][h],
                      kv + (gi * kOG + i) * C::kPanelBytes + Swizzled64(32 * h + lane, w));
        }
      }
    };

    // S^T = K [Q_hi; Q_lo]^T: k32 step ks is 32 bytes into panel ks / 2 of both operands.
    // Hopper's fp8 wgmma keeps only ~14 bits of its accumulator (DeepSeek-V3 report, section
    // 3.3.2), so the 576-dim sum runs as chunks of kChunk steps whose results are added in fp32:
    // one chain over all 18 steps put logits off by ~0.3% (elements out of tolerance in the
    // sharply peaked `[mla]` case, which runs at logit spreads of ~12).
    float s[R / 2];
    constexpr int kChunk = 6;
    static_assert(C::kSteps % kChunk == 0, "S chunks");
#pragma unroll
    for (int ch = 0; ch < C::kSteps / kChunk; ++ch) {
      // Only wgmmas define S^T's and O^T's registers inside the loop: with the previous tile's
      // products still running, any other definition would make ptxas serialize every wgmma
      // (C7515).
      float s2[R];
      wg::Fence();
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int ks = ch * kChunk + k;
        const uint32_t off = (ks & 1) * 32;
        const uint64_t da = wg::DescAdd(kv_desc, (ks >> 1) * C::kPanelBytes + off);
        const uint64_t db = wg::DescAdd(q_desc, (ks >> 1) * C::kQPanelBytes + off);
        if (k == 0) {
          MmaS<R, false>(s2, da, db);
        } else {
          MmaS<R, true>(s2, da, db);
        }
      }
      wg::Commit();
      if (ch == 0) load_v(0);
      wg::Wait<0>();  // (the first also waits for the previous tile's O^T products)
      wg::Pin(s2);
      if (ch == 0) {
#pragma unroll
        for (int mt = 0; mt < C::kMTiles; ++mt) wg::Pin(o[mt]);
      }
      // s2[x + R / 2] is column n + R of s2[x]: the lo term of the same row of S.
#pragma unroll
      for (int x = 0; x < R / 2; ++x) {
        const float v = s2[x] + s2[x + R / 2];
        s[x] = ch == 0 ? v : s[x] + v;
      }
    }

    // Online softmax per column. s[4j + e]: token 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
    const int tile_base = item.kv_start + tile * C::kTile;
    float mx[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) mx[c] = -INFINITY;
#pragma unroll
    for (int x = 0; x < R / 2; ++x) {
      const int c = ColSlot(x);
      const int j = tile_base + 16 * w + g + 8 * ((x >> 1) & 1);
      const int n = Col(c, t);
      float v = s[x] * col_scale[n];
      if (j >= item.kv_end || j > col_pos[n]) v = -INFINITY;
      s[x] = v;
      mx[c] = fmaxf(mx[c], v);
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int m = 4; m < 32; m <<= 1) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], m));
    }
    if (g == 0) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) red[w * C::kRows + Col(c, t)] = mx[c];
    }
    ConsumerSync(wgi);
    // mx becomes the max the exponents use (fewer live registers at 32 rows).
    float alpha[kCols];
    bool moved = false;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int n = Col(c, t);
      float tmax = red[n];
#pragma unroll
      for (int ww = 1; ww < 4; ++ww) tmax = fmaxf(tmax, red[ww * C::kRows + n]);
      const float m_new = fmaxf(m_run[c], tmax);
      mx[c] = m_new == -INFINITY ? 0.f : m_new;  // fully masked so far: no NaN
      alpha[c] = gpu::Exp2(m_run[c] - mx[c]);
      moved |= alpha[c] != 1.f;
      m_run[c] = m_new;
      l_run[c] *= alpha[c];
    }
    // P^T bytes: column c's tokens g and g + 8 (x0, x0 + 2) sit 2 slots apart.
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int x0 = 4 * (c >> 1) + (c & 1), n = Col(c, t);
      const float p0 = gpu::Exp2(s[x0] - mx[c]), p1 = gpu::Exp2(s[x0 + 2] - mx[c]);
      l_run[c] += p0 + p1;
      uint32_t hi, lo;
      SplitE4m3x2(p0 * C::kPScale, p1 * C::kPScale, &hi, &lo);
      const int tok = 16 * w + g, at_hi = PSlot(n, tok), at_lo = PSlot(n + C::kRows, tok);
      p_s[at_hi] = static_cast<uint8_t>(hi);
      p_s[at_hi + 2] = static_cast<uint8_t>(hi >> 8);
      p_s[at_lo] = static_cast<uint8_t>(lo);
      p_s[at_lo + 2] = static_cast<uint8_t>(lo >> 8);
    }
    if (tile != wgi && __any_sync(0xffffffffu, moved)) {  // (first tile: O^T is not set yet)
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
        for (int x = 0; x < R / 2; ++x) o[mt][x] *= alpha[ColSlot(x)];
      }
    }
    wg::ProxyFence();
    ConsumerSync(wgi);  // P^T complete; every thread has read the column maxima

    // O^T += V^T P_hi^T + V^T P_lo^T (see above for the V^T fragments). Groups of kOG m-tiles
    // through two register buffers; a group's ldmatrix results are loaded one group ahead (the
    // first during the QK products), so their latency hides behind the previous group's issue.
    {
      uint32_t va[2][kOG][2][4];
#pragma unroll
      for (int gi = 0; gi < kPvGroups; ++gi) {
        uint32_t(&buf)[kOG][2][4] = va[gi & 1];
        if (gi >= 2) wg::Wait<1>();  // group gi - 2, the buffer's last reader, is done
#pragma unroll
        for (int i = 0; i < kOG; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t(&r)[4] = v_raw[i][h];
            uint32_t(&f)[4] = buf[i][h];
            f[0] = __byte_perm(r[0], r[1], 0x6420);  // dim 2g: tokens 2t, 2t + 1, 8 + 2t, 9 + 2t
            f[1] = __byte_perm(r[0], r[1], 0x7531);  // dim 2g + 1
            f[2] = __byte_perm(r[2], r[3], 0x6420);  // dim 2g: the same + 16
            f[3] = __byte_perm(r[2], r[3], 0x7531);
            wg::Pin(f);  // computed before the fence (the compiler would sink them past it)
          }
        }
        if (gi + 1 < kPvGroups) load_v(gi + 1);
        wg::Fence();
#pragma unroll
        for (int i = 0; i < kOG; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            MmaO<R>(o[gi * kOG + i], buf[i][h], p_desc + h * 2, tile != wgi || h > 0);
            MmaO<R>(o[gi * kOG + i], buf[i][h], p_desc + (C::kRows * 64 + h * 32) / 16, 1);
          }
        }
        wg::Commit();
      }
      // This thread read its last byte of the stage. The products run on into the next tile's
      // S^T (whose wait covers them): P^T and O^T are not touched before it.
      wg::MbarArrive(bar + 8 * (C::kStages + st));
    }
  }
  wg::Wait<0>();
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
    wg::Pin(o[mt]);
#pragma unroll
    for (int x = 0; x < R / 2; ++x) o[mt][x] = wgi < num_tiles ? o[mt][x] : 0.f;  // (never set)
  }

  // Column sums: this thread's tokens, then the g lanes, then the warpgroup's 4 warps.
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int m = 4; m < 32; m <<= 1) l_run[c] += __shfl_xor_sync(0xffffffffu, l_run[c], m);
  }
  ConsumerSync(wgi);  // the last tile's column maxima are read
  if (g == 0) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) red[w * C::kRows + Col(c, t)] = l_run[c];
  }
  ConsumerSync(wgi);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int n = Col(c, t);
    l_run[c] = red[n] + red[C::kRows + n] + red[2 * C::kRows + n] + red[3 * C::kRows + n];
  }
  // Warpgroup 1 hands (O^T, m, l) to the thread of warpgroup 0 with the same fragment, through
  // the ring (idle: every tile landed and was read). Floats 4k .. 4k + 3 of thread ctid are the
  // float4 at [k][ctid]: O^T's m-tiles, then the maxima, then the sums.
  {
    auto* xchg = reinterpret_cast<float4*>(kv_s);
    constexpr int kO4 = R / 8;  // float4s per m-tile
    constexpr int kM4 = C::kMTiles * kO4, kL4 = kM4 + kCols / 4;
    auto slot = [&](int k) -> float4& { return xchg[k * C::kConsumers + ctid]; };
    ConsumersSync();
    if (wgi == 1) {
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
        for (int k = 0; k < kO4; ++k) {
          slot(mt * kO4 + k) =
              make_float4(o[mt][4 * k], o[mt][4 * k + 1], o[mt][4 * k + 2], o[mt][4 * k + 3]);
        }
      }
#pragma unroll
      for (int k = 0; k < kCols / 4; ++k) {
        slot(kM4 + k) =
            make_float4(m_run[4 * k], m_run[4 * k + 1], m_run[4 * k + 2], m_run[4 * k + 3]);
        slot(kL4 + k) =
            make_float4(l_run[4 * k], l_run[4 * k + 1], l_run[4 * k + 2], l_run[4 * k + 3]);
      }
    }
    ConsumersSync();
    if (wgi == 1) return;
    float f_self[kCols], f_other[kCols];
#pragma unroll
    for (int k = 0; k < kCols / 4; ++k) {
      const float4 m4 = slot(kM4 + k), l4 = slot(kL4 + k);
      const float m_o[4] = {m4.x, m4.y, m4.z, m4.w}, l_o[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 4 * k + e;
        const float m = fmaxf(m_run[c], m_o[e]);
        const float mu = m == -INFINITY ? 0.f : m;
        f_self[c] = gpu::Exp2(m_run[c] - mu);
        f_other[c] = gpu::Exp2(m_o[e] - mu);
        l_run[c] = l_run[c] * f_self[c] + l_o[e] * f_other[c];
        m_run[c] = m;
      }
    }
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
      for (int k = 0; k < kO4; ++k) {
        const float4 v = slot(mt * kO4 + k);
        const float other[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = 4 * k + e, c = ColSlot(x);
          o[mt][x] = o[mt][x] * f_self[c] + other[e] * f_other[c];
        }
      }
    }
  }
  float inv[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int n = Col(c, t);
    const float l = l_run[c];
    inv[c] = l > 0.f ? a.out_scale / (l * C::kPScale) : 0.f;
    if (item.partial >= 0 && w == 0 && g == 0 && n < item_rows) {
      a.partial_lse[static_cast<size_t>(item.partial) * kMlaMaxRows + n] =
          l > 0.f ? m_run[c] + log2f(l) : -INFINITY;
    }
  }
  // o[mt][4j + e]: dim 64 mt + 16 w + 2g + (e >> 1), column 8j + 2t + (e & 1).
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int n = Col(c, t);
    if (n >= item_rows) continue;
    const int x0 = 4 * (c >> 1) + (c & 1);  // e = c & 1 (dim 2g) and x0 + 2 (dim 2g + 1)
    const size_t qrow = q_row(n);
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) {
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

template <int R>
using Fp8Launch = Sm90MlaLaunch<MlaFp8WgmmaKernel<R>, FwRing::kThreads, FwCfg<R>::kSmemBytes>;

}  // namespace

bool LaunchAttendFp8Wgmma(const AttendArgs& a, int rows, void* stream) {
  if (a.num_items == 0) return true;
  CUtensorMap map;
  if (!EncodeMlaCacheMap(a.cache, /*fp8=*/true, &map)) return false;
  if (rows == 16) {
    Fp8Launch<16>::Launch(a, map, stream);
  } else {
    Fp8Launch<32>::Launch(a, map, stream);
  }
  return true;
}

int AttendCtasPerSmFp8Wgmma(int rows) {
  return rows == 16 ? Fp8Launch<16>::CtasPerSm() : Fp8Launch<32>::CtasPerSm();
}

}  // namespace llm::cuda::mla
