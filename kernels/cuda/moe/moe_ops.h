// The device-only MoE layer's kernels (engine/layers/cuda/cuda_moe_layer.h): routing, permutation
// of the (token, k) slots by expert, the grouped expert GEMMs and the weighted combine. Plain C++
// launcher header: pointers are device pointers, `stream` is a cudaStream_t. Activations are bf16
// unless noted. Nothing here reads device data on the host: every size a kernel needs that
// depends on the routing is read by the kernel from device memory, so a step that runs these can
// be captured in a CUDA graph.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define LLM_MOE_HD __host__ __device__ __forceinline__
#else
#define LLM_MOE_HD inline
#endif

namespace llm::cuda {

// Routing of every token (one warp per token), exactly the rule of MoeRouter
// (engine/layers/moe_router.h) up to the float rounding of expf and of the softmax sum: scores
// softmax or sigmoid; choice = score + bias; groups (group max, or sum of the top two) keep
// topk_group groups, the others' experts are never chosen (-inf); top-k with ties to the lower
// index; weights from the scores (weigh_unbiased) or the masked choices, normalized (+ norm_eps),
// times scaling. logit_bias (gpt-oss's router bias) is added to the logits first. softmax_of_topk
// (gpt-oss): the scores are the logits themselves, and the weights the softmax of the selected
// ones.
struct MoeRouteArgs {
  const float* logits = nullptr;      // fp32 [T, E]
  const float* bias = nullptr;        // [E] selection bias or null
  const float* logit_bias = nullptr;  // [E] added to the logits first (a router bias) or null
  int num_tokens = 0, num_experts = 0, top_k = 0;
  bool sigmoid = false;
  bool softmax_of_topk = false;
  int groups = 0;  // 0 none, 1 group max (group_limited_greedy), 2 sum of top two (noaux_tc)
  int n_group = 1, topk_group = 1;
  bool weigh_unbiased = false;
  bool normalize = false;
  float norm_eps = 0.0f;
  float scaling = 1.0f;
  int32_t* topk_ids = nullptr;  // [T, top_k], best first
  float* topk_w = nullptr;      // [T, top_k]
};
constexpr int kMoeRouteMaxExperts = 512;
constexpr int kMoeRouteMaxGroups = 32;
constexpr int kMoeRouteMaxTopK = 32;
void LaunchMoeRoute(const MoeRouteArgs& a, void* stream);

// Rows of one M tile of the grouped GEMMs: an expert's slots are cut into tiles of this many rows
// (LaunchMoeGemm's; the MXFP4 GEMMs also take 32 and 64: MoeMxfp4TileRows).
constexpr int kMoeTileRows = 16;
// Upper bound on the tiles of `slots` slots over `experts` experts plus `dense_rows` rows of the
// dense group (shared experts) cut into tiles of tile_rows rows (the grid the GEMMs launch; tiles
// past the real count exit at once). Largest at the smallest tile_rows.
inline int MoeMaxTiles(int slots, int experts, int dense_rows, int tile_rows = kMoeTileRows) {
  return slots / tile_rows + (slots < experts ? slots : experts) +
         (dense_rows + tile_rows - 1) / tile_rows;
}

// Counting sort of the S = T * top_k slots by expert (one CTA), stable: within an expert, slots in
// (token, k) order, as CpuMoe. Writes
//   sorted_token [S]  token of each expert-ordered slot
//   slot_of      [S]  expert-ordered position of slot (t, k)
//   tiles        [MoeMaxTiles(S, E, D, tile_rows)][3]  each M tile's expert, first row, and its
//                expert's row end; then the dense group's tiles (expert -1, rows of [0, D))
//   num_tiles    [1]
// An id outside [0, E) is counted for no expert (its slot gets position S, the combine skips it).
struct MoePermuteArgs {
  const int32_t* topk_ids = nullptr;  // [S]
  int num_slots = 0, num_experts = 0, top_k = 0;
  int dense_rows = 0;  // D: rows of the dense group (the shared experts: every token), or 0
  int tile_rows = kMoeTileRows;  // rows per M tile: 16 (LaunchMoeGemm), or MoeMxfp4TileRows
  int32_t* sorted_token = nullptr;
  int32_t* slot_of = nullptr;
  int32_t* tiles = nullptr;  // [max_tiles][3]: expert, row begin, row end (exclusive)
  int32_t* num_tiles = nullptr;
  int32_t* expert_offsets = nullptr;  // [E + 1] first row of each expert, then S' (or null)
};
void LaunchMoePermute(const MoePermuteArgs& a, void* stream);

// The router GEMM, LaunchMoeRoute and LaunchMoePermute as one launch, for decode steps of at most
// kMoeRouteFusedMaxTokens tokens (moe_route_fused.cu has the design): logits[t, e] =
// x[t] . router[e] in fp32 (fixed summation order: the same bits on every run), written to
// `logits`, then route.* and permute.* exactly as those two launchers write them (route.logits and
// permute.topk_ids are taken from `logits` and route.topk_ids). `ticket` is one device word,
// zero before the first launch; every launch leaves it zero again, so the kernel may be captured
// in a CUDA graph and replayed. `partials` holds MoeRouteFusedPartials(T, E, hidden) floats.
// False (nothing launched) where MoeRouteFusedOk(T, hidden) does not hold.
constexpr int kMoeRouteFusedMaxTokens = 16;
constexpr int kMoeRouteFusedCols = 256;  // router columns (k) per CTA
inline int MoeRouteFusedSplits(int hidden) {
  return (hidden + kMoeRouteFusedCols - 1) / kMoeRouteFusedCols;
}
inline int64_t MoeRouteFusedPartials(int tokens, int experts, int hidden) {
  return int64_t{MoeRouteFusedSplits(hidden)} * tokens * experts;
}
// Whether the fused kernel serves T tokens of `hidden` (float4 loads of the rows).
inline bool MoeRouteFusedOk(int tokens, int hidden) {
  return tokens >= 1 && tokens <= kMoeRouteFusedMaxTokens && hidden > 0 && hidden % 4 == 0;
}
struct MoeRouteFusedArgs {
  const float* x = nullptr;       // fp32 [T, hidden] (T = route.num_tokens)
  const float* router = nullptr;  // fp32 [E, hidden]
  int hidden = 0;
  float* logits = nullptr;    // fp32 [T, E], out
  float* partials = nullptr;  // fp32 [MoeRouteFusedSplits(hidden), T, E], scratch
  uint32_t* ticket = nullptr;
  MoeRouteArgs route;      // num_tokens, the rule, bias, logit_bias, topk_ids, topk_w
  MoePermuteArgs permute;  // num_slots = T * top_k, the rest as LaunchMoePermute's
};
[[nodiscard]] bool LaunchMoeRouteFused(const MoeRouteFusedArgs& a, void* stream);

// One grouped GEMM over the tiles of LaunchMoePermute, weights bf16 or fp8 e4m3, streamed from
// global memory once per tile. fp8 scales (MoeGemmScales, device fp32): per expert, per weight row
// (a checkpoint's per-channel or differing per-tensor scales), or per 128x128 block (DeepSeek-V3's
// weight_scale_inv), applied in fp32 to the products of bf16 activations and the exact e4m3
// weights (per block: to each 128-wide k slice's partial sum). The dense group's
// tiles (expert -1) use the dense_* operands instead (shared experts: their own weight, rows of
// dense_x, no gather, out to dense_out):
//   gate_up (silu_mul): act[s, j] = bf16(silu(g) * u), g = s_e x[tok(s)] . Wg_e[j],
//                       u = s_e x[tok(s)] . Wu_e[j]; W_e = [2 I, K] (gate rows, then up rows)
//   down:               y[s, n] = bf16(s_e act[s] . Wd_e[n]); W_e = [N, K]
// With `bias` (routed experts only), b_e is added to g / u (gate_up: [E][2 I], gate then up) or
// to y (down: [E][N]) before the activation / the store. swiglu_limit > 0: gpt-oss's clamped
// SwiGLU instead of silu(g) * u: g' = min(g, limit), u' = clamp(u, -limit, limit),
// act = (u' + 1) * g' * sigmoid(swiglu_alpha * g').
// x rows come from `x` (gather: row sorted_token[s], else row s). n_out (I or N) must be a
// multiple of kMoeGemmN, k of kMoeGemmK (MoeGemmShapeOk).
// Where the scale of weight row r (within one expert's [(2) n_out, k] matrix) and k index c sits:
// scale[expert * expert_stride + r * row_stride] without blocks (row_stride 0: one per expert;
// expert_stride 0 too: one for all), else scale[expert * expert_stride + (r / 128) * block_ld +
// c / 128].
struct MoeGemmScales {
  const float* scale = nullptr;
  int expert_stride = 0, row_stride = 0;
  int block_ld = 0;  // > 0: 128x128 blocks
};
struct MoeGemmArgs {
  const void* x = nullptr;                // bf16 [rows, k]
  const int32_t* sorted_token = nullptr;  // gather rows of x, or null: row = slot
  const void* w = nullptr;                // bf16 or e4m3 [E, (silu_mul ? 2 : 1) * n_out, k]
  MoeGemmScales w_scale;                  // fp8 only
  bool fp8 = false;
  bool silu_mul = false;
  const float* bias = nullptr;  // fp32 [E][(silu_mul ? 2 : 1) * n_out] or null
  float swiglu_limit = 0.0f;    // > 0: clamped SwiGLU (silu_mul only)
  float swiglu_alpha = 1.702f;
  int n_out = 0, k = 0;
  // MXFP4 weights (LaunchMoeGemmMxfp4 only): w holds e2m1 values [E, (2) n_out, mx_k_pad / 2] and
  // mx_scales the e8m0 bytes [E, (2) n_out, mx_k_pad / 32] (PackMoeMxfp4); tile_rows is the
  // permutation's (MoePermuteArgs::tile_rows: 16, 32 or 64).
  const uint8_t* mx_scales = nullptr;
  int mx_k_pad = 0;
  int tile_rows = kMoeTileRows;
  const int32_t* tiles = nullptr;  // LaunchMoePermute's
  const int32_t* num_tiles = nullptr;
  int max_tiles = 0;
  void* out = nullptr;  // bf16 [S, n_out]
  // The dense group (tiles with expert -1), same dtype and silu_mul: W [(2) dense_n_out, dense_k].
  const void* dense_x = nullptr;  // bf16 [D, dense_k]
  const void* dense_w = nullptr;
  MoeGemmScales dense_w_scale;  // fp8 only (expert_stride unused); blocks iff w_scale has them
  int dense_n_out = 0, dense_k = 0;
  void* dense_out = nullptr;  // bf16 [D, dense_n_out]
  // The down GEMM (silu_mul false) may finish LaunchMoeCombine itself, for small batches: with
  // combine.out set, the CTAs of each column block draw a ticket (combine.tickets, one per
  // block, zero before the launch and left zero) after their stores, and the last of the block's
  // tiles writes out[t, its columns] for every token from `out` (y) and combine.shared with
  // LaunchMoeCombine's arithmetic (the same bits). One launch fewer; the sum stays in k order.
  struct Combine {
    const int32_t* slot_of = nullptr;  // [T * top_k]
    const float* topk_w = nullptr;     // [T * top_k]
    const void* shared = nullptr;      // bf16 [T, n_out] (the dense group's dense_out) or null
    int num_tokens = 0, top_k = 0;
    uint32_t* tickets = nullptr;  // [MoeCombineTickets(n_out)]
    void* out = nullptr;          // bf16 [T, n_out]; null: no combine here
  } combine;
  // fp8 activations (LaunchMoeGemmW8a8 only): x and dense_x are e4m3 and these their fp32
  // scales (x ~ q * scale): one per row of x ([rows]) with x_scale_ld 0, or one per row and
  // 128-wide k group ([k / 128][x_scale_ld], LaunchQuantizeBlocks128Fp8's layout) with
  // x_scale_ld > 0. Rows are x's (the gather picks row sorted_token[s] of both).
  const float* x_scale = nullptr;
  int x_scale_ld = 0;
  const float* dense_x_scale = nullptr;
  int dense_x_scale_ld = 0;
  // LaunchMoeGemv only: no tile holds more rows than this (the batch's tokens: an expert holds a
  // token at most once), or 0 (unknown). Sizes the GEMV's rows per pass; any tile stays correct.
  int gemv_max_rows = 0;
  // LaunchMoeGemv only: the tile list was complete before the kernel ahead of this one in the
  // stream started (the down GEMM, launched right after gate_up, which waited for the routing),
  // so each CTA reads its tile and issues its first weight loads before the PDL wait, under that
  // kernel's tail. Never set where the kernel just before writes the tiles.
  bool tiles_before_wait = false;
  // LaunchMoeGemv's MXFP4 form only: warps of a CTA that split k (1, 2 or 4), or 0 for
  // MoeGemvMxfp4DefaultSplitK(gemv_max_rows). Benchmarks set it; the layer keeps the default.
  int gemv_split_k = 0;
};
// The MXFP4 GEMVs' k split by default: at one or two tokens the grid is a few warps per SM, and
// four warps per column share the weight stream; from four tokens on there are warps enough
// and the split's reduction costs more than it gains ("[.bench][moe_small]").
inline int MoeGemvMxfp4DefaultSplitK(int gemv_max_rows) {
  return gemv_max_rows >= 1 && gemv_max_rows <= 2 ? 4 : 1;
}
// Column blocks of the down GEMMs (LaunchMoeGemm's 64 columns, the MXFP4 GEMMs' 32 or more):
// the tickets MoeGemmArgs::combine needs for n_out outputs.
inline int MoeCombineTickets(int n_out) {
  return (n_out + 31) / 32;
}
// Batches of at most this many tokens have the down GEMM combine (MoeGemmArgs::combine): one CTA
// per column block sums every token's top-k rows of those columns.
constexpr int kMoeFusedCombineMaxTokens = 16;
constexpr int kMoeGemmK = 64;
constexpr int kMoeGemmN = 64;  // outputs per CTA (silu_mul: 32 outputs from 64 weight rows)
inline bool MoeGemmShapeOk(bool silu_mul, int n_out, int k) {
  return n_out % (silu_mul ? kMoeGemmN / 2 : kMoeGemmN) == 0 && k % kMoeGemmK == 0 && k > 0;
}
void LaunchMoeGemm(const MoeGemmArgs& a, void* stream);

// The grouped GEMMs of LaunchMoeGemm on MXFP4 expert weights as gpt-oss checkpoints store them
// (base/mxfp4.h): e2m1 values and one e8m0 scale per 32 values along k, widened to bf16 in
// registers (exact), so a step reads a quarter of the bf16 weight bytes. Routed experts only (no
// dense group), same gather, biases, gates and output as LaunchMoeGemm; the tiles of 16, 32 or 64
// rows (a.tile_rows, the permutation's: MoeMxfp4TileRows), each expert's weights streamed once
// per tile and widened once per tile whatever its rows. The device layout (PackMoeMxfp4): each
// weight row's k extent padded to a multiple of kMoeMxfp4KPad with zero values (scale 127), rows
// in the grouped GEMM's order. Shapes: n_out a multiple of kMoeGemmN (gate_up: kMoeGemmN / 2), k
// a multiple of 32; every scale byte within MoeMxfp4ScaleOk. False (nothing launched) for a
// tile_rows it has no kernel for.
constexpr int kMoeMxfp4KPad = 128;
inline bool MoeMxfp4ShapeOk(bool silu_mul, int n_out, int k) {
  return n_out % (silu_mul ? kMoeGemmN / 2 : kMoeGemmN) == 0 && k % 32 == 0 && k > 0;
}
// The scales the kernel widens exactly: 2^(s - 127) times every e2m1 value stays a normal bf16.
inline bool MoeMxfp4ScaleOk(uint8_t s) {
  return s >= 2 && s <= 252;
}
inline int MoeMxfp4KPad(int k) {
  return (k + kMoeMxfp4KPad - 1) / kMoeMxfp4KPad * kMoeMxfp4KPad;
}
// Checkpoint blocks [E, rows, k / 32, 16] and scales [E, rows, k / 32] -> the kernel's values
// [E, rows, MoeMxfp4KPad(k) / 2] and scales [E, rows, MoeMxfp4KPad(k) / 32]. split_interleaved:
// rows 2 i (gate) and 2 i + 1 (up) of each expert become rows i and rows / 2 + i (gpt-oss's
// gate_up_proj into the gate-then-up order of the silu_mul GEMM).
inline void PackMoeMxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t experts,
                         int64_t rows, int64_t k, bool split_interleaved,
                         std::vector<uint8_t>* values_out, std::vector<uint8_t>* scales_out) {
  const int64_t groups = k / 32, kp = MoeMxfp4KPad(static_cast<int>(k));
  values_out->assign(static_cast<size_t>(experts * rows * kp / 2), 0);
  scales_out->assign(static_cast<size_t>(experts * rows * kp / 32), 127);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t dst = split_interleaved ? (r % 2 == 0 ? r / 2 : rows / 2 + r / 2) : r;
      const int64_t src_row = e * rows + r, dst_row = e * rows + dst;
      std::copy_n(blocks + src_row * groups * 16, groups * 16,
                  values_out->begin() + dst_row * kp / 2);
      std::copy_n(scales + src_row * groups, groups, scales_out->begin() + dst_row * kp / 32);
    }
  }
}
// The tile rows the MXFP4 and W8A8 GEMMs run (and the permutation cuts) for `tokens` tokens routed
// top_k over `experts` experts, decided on the host before a capture: 16 while no expert can hold
// more than 16 rows or they average at most 12 (decode: one n8 block of tokens, or two, per widened
// weight fragment), else 32 or 64 so that an expert's weights are streamed and widened once for
// (nearly) all its rows. More rows per tile cost only shared memory and idle n8 blocks (skipped).
inline int MoeMxfp4TileRows(int64_t tokens, int top_k, int experts) {
  const int64_t avg = tokens * top_k / (experts > 0 ? experts : 1);
  if (tokens <= 16 || avg <= 12) return 16;
  return avg <= 24 ? 32 : 64;
}
inline bool MoeMxfp4TileRowsOk(int tile_rows) {
  return tile_rows == 16 || tile_rows == 32 || tile_rows == 64;
}
[[nodiscard]] bool LaunchMoeGemmMxfp4(const MoeGemmArgs& a, void* stream);

// The grouped GEMMs of LaunchMoeGemm / LaunchMoeGemmMxfp4 as GEMVs for decode batches: bf16 or
// fp8 e4m3 weights with MoeGemmScales (routed experts and the dense group; moe_gemv.cu), or MXFP4
// weights (routed experts only, PackMoeMxfp4's layout, widened exactly as mxfp4_widen.h does;
// moe_gemv_mxfp4.cu); bf16 activations; the same tiles, gather, biases, gates (clamped SwiGLU
// included), bf16 outputs and fused combine (MoeGemmArgs::combine, the same bits as
// LaunchMoeCombine). A warp per output column of a tile (bf16 / fp8: fp32 FMAs and a warp
// reduction) or per 8 columns (MXFP4: products on the tensor cores) streams its weight rows
// straight from global memory in 16-byte loads and loops over the tile's rows inside, so each
// weight is read once per step however many rows its expert holds, and small CTAs fill every SM
// where the tiled kernels' 64-row CTAs leave a ragged wave. Shapes (MoeGemvShapeOk, for the dense
// group too): n_out a multiple of kMoeGemvColumnBlock (the combine's column blocks), k a multiple
// of one 16-byte load's values (bf16 8, e4m3 16) or of 32 (MXFP4: one scale group per load).
// False (nothing launched) for fp8 activations, shapes outside MoeGemvShapeOk, an MXFP4 dense
// group, fp8 weights without scales, or a combine whose dense group is not n_out wide.
constexpr int kMoeGemvColumnBlock = 32;  // columns per combine ticket (MoeCombineTickets)
enum class MoeGemvWeights { kBf16, kFp8, kMxfp4 };
inline bool MoeGemvShapeOk(MoeGemvWeights w, int n_out, int k) {
  const int k_unit = w == MoeGemvWeights::kBf16 ? 8 : w == MoeGemvWeights::kFp8 ? 16 : 32;
  return n_out > 0 && n_out % kMoeGemvColumnBlock == 0 && k > 0 && k % k_unit == 0;
}
// Whether a batch of `tokens` tokens routed top_k over `experts` experts takes the GEMVs, decided
// on the host before a capture: at most kMoeGemvMaxTokens tokens (no expert holds more rows than
// one 16-row tile) averaging at most kMoeGemvMaxRowsPerExpert rows per expert. The bf16 / fp8
// GEMV does one fp32 FMA (and an activation widening) per weight and row on the CUDA cores,
// the tiled kernels one mma per 16 rows: past a few rows per expert the GEMV stops being bound by
// the weight stream and the tiled kernels' tensor cores win.
constexpr int kMoeGemvMaxTokens = kMoeTileRows;
constexpr int kMoeGemvMaxRowsPerExpert = 4;
inline bool MoeGemvBatchOk(int64_t tokens, int top_k, int experts) {
  return tokens >= 1 && tokens <= kMoeGemvMaxTokens && experts > 0 &&
         tokens * top_k <= int64_t{kMoeGemvMaxRowsPerExpert} * experts;
}
[[nodiscard]] bool LaunchMoeGemv(const MoeGemmArgs& a, void* stream);

// The grouped GEMMs of LaunchMoeGemm on fp8 e4m3 weights and fp8 e4m3 activations (W8A8)
// through the e4m3 tensor cores (sm_89 on): the same tiles (routed experts and the dense group),
// gather, biases, gates and bf16 output, with the weights' scales (MoeGemmScales) and the
// activations' (MoeGemmArgs::x_scale) applied in fp32: with 128x128 weight blocks the
// activations carry one scale per token and 128-wide k group (DeepSeek-V3's recipe) and each
// 128-wide k slice's fp32 sum is scaled by both; with per-row or per-tensor weight scales one
// scale per token, applied to the whole sum. Tiles of 16, 32 or 64 rows (a.tile_rows, the
// permutation's: MoeMxfp4TileRows chooses for both kernels). Shapes: MoeW8a8ShapeOk for both
// groups. False (nothing launched) where the device's binary has no e4m3 mma
// (MoeW8a8Available), for a tile_rows it has no kernel for, for shapes outside MoeW8a8ShapeOk,
// or for activation scales whose form does not match the weights' (block weights:
// x_scale_ld > 0; else 0).
constexpr int kMoeW8a8K = 128;
inline bool MoeW8a8ShapeOk(bool silu_mul, int n_out, int k) {
  return n_out % (silu_mul ? kMoeGemmN / 2 : kMoeGemmN) == 0 && k % kMoeW8a8K == 0 && k > 0;
}
bool MoeW8a8Available();
[[nodiscard]] bool LaunchMoeGemmW8a8(const MoeGemmArgs& a, void* stream);

// out[t, :] = bf16(shared[t, :] + sum_k topk_w[t, k] * y[slot_of[t, k], :]) with fp32 sums in k
// order (deterministic, no atomics). shared may be null; a slot at position >= num_slots
// contributes nothing.
void LaunchMoeCombine(const void* y, const int32_t* slot_of, const float* topk_w,
                      const void* shared, int num_tokens, int top_k, int hidden, void* out,
                      void* stream);

// The large-batch path of the MoE layer (CudaMoeLayer: prefill chunks), where the expert GEMMs
// are cuBLAS's (grouped, or per expert) over the expert-sorted rows and these kernels do the rest.
// Rows are expert-ordered slots [0, rows); expert_offsets [E + 1] (device, LaunchMoePermute's) give
// each row's expert where a bias needs it.
//   gather:   xg[s, :] = x[sorted_token[s], :]                            (bf16 [rows, hidden])
//   gate act: act[s, j] = bf16(gate(g[s, j], u[s, n + j])) from gu [rows, 2 n] (gate, then up,
//             as the GEMM's weight rows), g and u first times row_scale[s] when row_scale is
//             non-null (an fp8 GEMM's rows without their activation scales), + bias_e [2 n]
//             (gate, then up) when bias is non-null; silu(g) * u, or gpt-oss's clamped SwiGLU
//             when swiglu_limit > 0 (MoeGemmArgs)
//   row bias: y[s, :] = bf16(y[s, :] + bias_e)                           (bias [E][n])
void LaunchMoeGather(const void* x, const int32_t* sorted_token, int rows, int hidden, void* xg,
                     void* stream);
void LaunchMoeGateAct(const void* gu, int rows, int n, const float* bias,
                      const int32_t* expert_offsets, int num_experts, float swiglu_limit,
                      float swiglu_alpha, void* act, void* stream,
                      const float* row_scale = nullptr);
void LaunchMoeRowBias(void* y, int rows, int n, const float* bias, const int32_t* expert_offsets,
                      int num_experts, void* stream);

// The rows of one expert's fp8 GEMM in the large-batch path (the host's GEMM calls and the
// kernel below alike): its row count rounded up to 16 (the fp8 GEMMs' row multiple) and past 256
// rows to 128, so that prefills meet a few dozen shapes, each chosen and cached once, rather than
// one per count.
LLM_MOE_HD int MoeFp8ExpertRows(int count) {
  return count <= 256 ? (count + 15) / 16 * 16 : (count + 127) / 128 * 128;
}
// x (bf16 [rows, cols], expert-ordered rows) into e4m3 q [rows, cols] with one scale per row and
// 128-wide column block (the activation side of 128x128 block-scaled weights, as
// LaunchQuantizeBlocks128Fp8), each expert's scales a matrix of its own as its GEMM reads them
// (cuBLASLt's VEC128_32F: [blocks][MoeFp8ExpertRows(count)], rows fastest), the experts' matrices
// back to back in expert order: expert e's at scales + blocks * sum over e' < e of
// MoeFp8ExpertRows(count e'). The rounded-up rows past an expert's count get no scale (their
// GEMM rows are overwritten or slack). scales holds blocks * (rows + 127 * experts) floats.
void LaunchMoeQuantizeBlocks128ByExpert(const void* x, int rows, int cols,
                                        const int32_t* expert_offsets, int num_experts, void* q,
                                        float* scales, void* stream);

}  // namespace llm::cuda
