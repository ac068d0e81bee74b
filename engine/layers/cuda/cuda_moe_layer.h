// The one routed mixture-of-experts layer on CUDA, for every MoE architecture (DeepSeek-V2/V3,
// Mixtral, Qwen3-MoE, gpt-oss: they differ in MoeRouting, MoeTensorNames and the gate). It never
// waits for the host: the router (fp32 input, fp32 weight, fp32 GEMM), the routing
// (kernels/cuda/moe/moe_ops.h), the permutation by expert, the grouped expert GEMMs and the combine
// read every routing-dependent size from device memory, so a decode step that runs it can be
// captured in a CUDA graph (graph_safe). The CPU oracle is CpuMoe (cpu_moe.h).
//
//   logits [T, E]      = x_f32 @ router^T                      (cuBLAS, fp32 pedantic)
//   ids, w [T, k]      = MoeRouter's rule                       (one warp per token)
//   slots by expert    = stable counting sort, tiles of kMoeTileRows rows per expert (MXFP4: 16-64)
//                        (up to kMoeRouteFusedMaxTokens tokens: these three in one launch,
//                        LaunchMoeRouteFused, its own fp32 GEMM over the router's rows)
//   act [S, I]         = silu(x[tok] Wg_e^T) * (x[tok] Wu_e^T)  (grouped GEMM, fused epilogue)
//                        gpt-oss: (+ expert biases) clamped SwiGLU, CpuMlp::Gate
//   y [S, hidden]      = act Wd_e^T (+ expert bias)             (grouped GEMM)
//   out [T, hidden]    = shared(x) + sum_k w[t, k] y[slot(t, k)] (fixed order, no atomics;
//                        up to kMoeFusedCombineMaxTokens tokens: done by the down GEMM's last
//                        tile of each column block)
// The shared experts are one more group of both grouped GEMMs (every token, weight 1): no
// launches of their own, and with fp8 weights their activations stay bf16 as the experts'.
// With fp8 activations (set_activation_dtype, UsesW8a8), x, act and the shared experts' act are
// quantized to e4m3 before each GEMM (kernels/cuda/ops/fp8_quant.h) and the W8A8 grouped GEMMs run
// on the e4m3 tensor cores, with tiles of cuda::MoeMxfp4TileRows rows as the MXFP4 experts'.
// Batch-1 decode steps (set_gemv_max_tokens; cuda::MoeGemvBatchOk) of bf16, fp8 or MXFP4
// experts with bf16 activations run both grouped GEMMs as GEMVs over the same tiles
// (cuda::LaunchMoeGemv: small CTAs that stream each expert's weights once at the copy rate;
// UsesGemv, set_gemv_max_tokens).
//
// Large batches (prefill chunks: at least large_batch_slots_per_expert slots per expert on
// average, bf16 experts or fp8 ones with fp8 activations, not capturing) take a second path: the
// 16-row tiles above stream every expert's weights once per 16 rows, which at thousands of rows is
// L2-bandwidth-bound, so there the layer reads the experts' row counts back (one wait per layer),
// gathers the rows by expert and runs cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, one
// problem per expert; per-expert GEMMs once experts have hundreds of rows) for gate_up and for
// down, with the gated activation and the biases as separate element-wise kernels
// (moe_large_batch.cu) and the shared experts as two plain GEMMs. fp8 experts with fp8 activations
// quantize each GEMM's rows per token (per token and 128-wide block beside 128x128 block-scaled
// weights) and run one cuBLASLt fp8 GEMM per expert (LargeBatchFp8Serves). Built only with the
// CUDA backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/layers/cpu/cpu_moe.h"
#include "engine/layers/cuda/cuda_gated_mlp.h"
#include "engine/layers/cuda/cuda_linear.h"
#include "engine/layers/moe_router.h"
#include "kernels/cuda/moe/moe_ops.h"

namespace llm {

struct CudaMoeWeights {
  DeviceBuffer router;       // fp32 [E, hidden] (the checkpoint's values, widened)
  DeviceBuffer router_bias;  // fp32 [E] selection bias, or empty
  DeviceBuffer logit_bias;   // fp32 [E] the router's own bias (MoeTensorNames::router_bias)
  // fp32 expert biases (MoeTensorNames::expert_bias): [E][2 I] (gate, then up), [E][hidden].
  DeviceBuffer gate_up_bias, down_bias;
  CudaLinear gate_up;   // E stacked [2 I, hidden] (gate rows, then up rows)
  CudaLinear down;      // E stacked [hidden, I]
  CudaGatedMlp shared;  // inter 0 without shared experts
  // MXFP4 experts kept as stored (CudaMoeLayer::set_mxfp4): e2m1 values and e8m0 scales in the
  // MXFP4 grouped GEMMs' layout (cuda::PackMoeMxfp4, gate rows then up rows); gate_up and down
  // stay empty then.
  DeviceBuffer mx_gate_up, mx_gate_up_scales, mx_down, mx_down_scales;
  bool mxfp4 = false;
  // fp8 experts may run with fp8 activations (CudaMoeLayer::set_activation_dtype): the W8A8
  // grouped GEMMs (cuda::LaunchMoeGemmW8a8) instead of the bf16-activation ones, for the batches
  // CudaMoeLayer::UsesW8a8 names.
  bool w8a8 = false;
};

// One set of activations for up to `cap` tokens. A captured graph holds these pointers: reserve
// a graph set once before the first capture and never grow it after.
struct CudaMoeScratch {
  DeviceBuffer x_f32;  // fp32 [cap, hidden]: the router's input (the caller's norm writes it)
  DeviceBuffer logits, topk_ids, topk_w, sorted_token, slot_of, tiles, num_tiles, act, y;
  // The fused small-batch routing's partial logits and its ticket, the down GEMM's combine
  // tickets (MoeGemmArgs::combine); the tickets are zero between launches.
  DeviceBuffer route_partials, route_ticket, combine_tickets;
  DeviceBuffer shared_act, shared_out;  // the shared experts' [cap, shared I], [cap, hidden]
  int cap = 0;
  // The large-batch path's (CudaMoeLayer::Run): gate_up outputs [rows, 2 I] bf16, the experts'
  // row offsets [E + 1], the grouped GEMMs' pointer arrays. Reserved only where `cap` rows reach
  // the path; large_cap is then cap.
  DeviceBuffer gu, offsets, ptrs;
  int large_cap = 0;
  // The large-batch path's e4m3 rows (fp8 activations): every GEMM's input in turn, [rows +
  // CudaMoeLayer::kLargeFp8SlackRows, max(hidden, I, shared I)], their scales (per row, or per
  // row and 128-wide block by expert), and as many floats of 1 (the row scales per-channel GEMMs
  // multiply by before the rows' own).
  DeviceBuffer large_q, large_q_scale, large_ones;
  // The W8A8 path's e4m3 inputs and their fp32 scales (per token, or per token and 128-wide k
  // group: sized for the latter): x [cap, hidden], act [cap top_k, I], shared_act [cap, shared
  // I]; the shared experts' own x where either side quantizes x with a static input scale.
  // Reserved only where the layer may run fp8 activations.
  DeviceBuffer xq, xq_scale, actq, actq_scale, shared_xq, shared_xq_scale, shared_actq,
      shared_actq_scale;
};

// The routing kernel's arguments for `routing` (pointers and the token count left to the caller).
cuda::MoeRouteArgs MoeRouteArgsOf(const MoeRouting& routing);
// The grouped GEMMs' view of the fp8 scales of `lin`: experts of rows_per_expert rows and k
// columns stacked (or one matrix: the shared experts).
cuda::MoeGemmScales MoeGemmScalesOf(const CudaLinear& lin, int rows_per_expert, int k);
// x (bf16 [rows, cols]) into e4m3 rows q with one scale per row: the checkpoint's static
// input_scale where `lin` has one, else per row (the W8A8 paths' per-token form).
void QuantizeFp8RowsFor(const CudaLinear& lin, const void* x, int rows, int cols,
                        const cuda::Fp8Rows& q, cudaStream_t stream);

class CudaMoeLayer {
 public:
  // InvalidArgument naming what does not fit: more than 512 experts or 32 groups, top-k over 32,
  // shapes the grouped GEMMs do not tile (hidden, I and the shared experts' I multiples of 64),
  // groups that do not divide the experts, a gate other than SiLU or the clamped SwiGLU.
  // mxfp4_experts (stacked experts stored as MXFP4 that Load may keep): I a multiple of 32 is
  // enough, as the MXFP4 GEMMs need (gpt-oss's 2880 split 2 ways: 1440); Load refuses it by the
  // bf16 GEMMs' rule where it dequantizes them instead.
  static Status Check(const MoeRouting& routing, int hidden, int inter, int shared_inter,
                      const CpuMlp::Gate& gate = {}, bool mxfp4_experts = false);
  CudaMoeLayer(const MoeRouting& routing, int hidden, int inter, int shared_inter,
               const CpuMlp::Gate& gate = {})
      : r_(routing), hidden_(hidden), inter_(inter), shared_inter_(shared_inter), gate_(gate) {}

  // Router, selection bias, experts and shared experts of the block at `block_prefix`
  // (layer prefix + names.block), quantized to `quant` (routed experts: one fp8 scale each).
  // fp8_checkpoint: per-expert tensors stored in e4m3 keep their bytes and scales
  // (CudaLinear::LoadCheckpoint over all experts stacked: per-expert, per-row or 128x128 block
  // scales, which the grouped GEMMs apply); their activations stay bf16, so a static input_scale
  // is not used (logged), or, with fp8 activations, are quantized with the static input_scale
  // where the checkpoint has one (per-tensor / per-row weights: the largest of the stacked
  // experts', as CudaLinear::LoadCheckpoint keeps it), else per token or 128-wide group.
  // Stacked experts (gpt-oss) are read on the host through ReadExpertMatrix
  // (bf16 / fp32 or MXFP4, dequantized), their interleaved gate / up rows split into the GEMM's
  // gate-then-up layout; dummy weights fill that layout directly (biases 0).
  Status Load(Bf16WeightLoader& loader, const WeightStore* weights, const CudaLinearOps& ops,
              WeightQuant quant, const std::string& block_prefix, const MoeTensorNames& names,
              CudaMoeWeights* w, bool fp8_checkpoint = false) const;
  Status Reserve(int rows, CudaMoeScratch* s) const;

  // Stacked experts stored as MXFP4 (gpt-oss, ModelLoadOptions::moe_weight_dtype), set before
  // Load: kAuto keeps them for the MXFP4 grouped GEMMs where those serve the shapes and scales
  // (else dequantizes, logged), kKeep keeps them or fails the load by name, kDequantize reads them
  // as bf16. MXFP4 experts take the tiled path at every batch size (no large-batch path), with
  // tiles of cuda::MoeMxfp4TileRows(T, top_k, E) rows.
  enum class Mxfp4 { kAuto, kKeep, kDequantize };
  void set_mxfp4(Mxfp4 v) { mxfp4_ = v; }

  // The activations of fp8 experts (ModelLoadOptions::moe_activation_dtype), set before Load and
  // Reserve: kFp8 quantizes them to e4m3 for the W8A8 grouped GEMMs (per token and 128-wide k
  // group beside 128x128 block-scaled weights, per token beside per-row or per-tensor scales) or
  // fails the load naming what those do not serve (experts not fp8, shapes, a device without
  // e4m3 tensor cores); kAuto does so where they serve the layer (else bf16 activations, logged);
  // kBf16 keeps the W8A16 GEMMs (each weight widened to bf16). kAuto also picks per batch: the
  // W8A8 GEMMs pay where a batch's products are many (prompt chunks: the large-batch path, and the
  // tiles from kAutoW8a8MinTokens tokens), while decode-sized batches are bound by the weights'
  // bytes, which both forms read once, and there the per-token quantize passes and the W8A8 tiles'
  // lack of a fused combine and of GEMVs make W8A16 the faster form (docs/BENCHMARKS.md).
  enum class ActivationDtype { kBf16, kFp8, kAuto };
  static constexpr int kAutoW8a8MinTokens = 512;
  void set_activation_dtype(ActivationDtype v) {
    activation_dtype_ = v;
    w8a8_min_tokens_ = v == ActivationDtype::kAuto ? kAutoW8a8MinTokens : 0;
  }
  // The batch size from which experts with w8a8 take fp8 activations (set_activation_dtype sets
  // it; tests and benchmarks move it after).
  void set_w8a8_min_tokens(int v) { w8a8_min_tokens_ = v; }
  // Whether a batch of T tokens runs the experts `w` on fp8 activations: w.w8a8 and at least
  // the minimum above (decided from T alone, so a captured graph replays the same choice).
  bool UsesW8a8(int T, const CudaMoeWeights& w) const { return w.w8a8 && T >= w8a8_min_tokens_; }
  // Sets w->w8a8 for the loaded experts `w` under the activation dtype (Load's last step; tests
  // that fill CudaMoeWeights themselves call it): the InvalidArgument of kFp8 names `where` and
  // what the W8A8 GEMMs do not serve.
  Status ChooseActivations(const std::string& where, CudaMoeWeights* w) const;

  // Slots per expert (T * top_k / E) from which a batch takes the large-batch path; set before
  // Reserve (tests and benchmarks force either path: 0 always, INT_MAX never).
  static constexpr int kLargeBatchSlotsPerExpert = 64;
  void set_large_batch_slots_per_expert(int v) { large_batch_slots_ = v; }
  // The large-batch path's expert GEMMs: one grouped call, or one cublasGemmEx per expert. With
  // hundreds of rows per expert, one cuBLAS call per expert is large enough to win; with fewer,
  // the grouped call's single launch over every expert wins ("[.bench][moe_prefill]" measures the
  // crossover; docs/log/PERFORMANCE_NOTEBOOK.md). kAuto: per expert from kPerExpertGemmRows
  // rows per expert on average.
  enum class LargeBatchGemm { kAuto, kGrouped, kPerExpert };
  static constexpr int kPerExpertGemmRows = 640;
  void set_large_batch_gemm(LargeBatchGemm v) { large_batch_gemm_ = v; }
  // Whether Run takes the large-batch path for T rows of weights `w` (outside a capture): bf16
  // experts, or fp8 experts with fp8 activations at T (LargeBatchFp8Serves, UsesW8a8).
  bool TakesLargeBatchPath(int T, const CudaMoeWeights& w) const;
  // fp8 experts (per-tensor, per-channel or 128x128 block scales, the shared experts' too) with
  // fp8 activations (w.w8a8): their large batches run one cuBLASLt fp8 GEMM per expert
  // (CudaFp8Gemm) on rows quantized per token (beside blocks: per token and 128-wide block).
  static bool LargeBatchFp8Serves(const CudaMoeWeights& w);
  // Rows past the end of the large-batch fp8 GEMMs' operands that they may read and write: an
  // expert's GEMM runs on its row count rounded up (cuda::MoeFp8ExpertRows).
  static constexpr int kLargeFp8SlackRows = 128;
  // Batches of at most this many tokens route through cuda::LaunchMoeRouteFused (the router GEMM,
  // routing and permutation in one launch; at most kMoeRouteFusedMaxTokens), larger ones through
  // cuBLAS's GEMM, LaunchMoeRoute and LaunchMoePermute; set before a capture (tests and benchmarks
  // force either: 0 never fuses).
  void set_fused_route_max_tokens(int v) { fused_route_max_tokens_ = v; }
  bool UsesFusedRoute(int T) const;
  // Batches of at most this many tokens on the tiled path (not the large-batch one) have the down
  // GEMM do the weighted combine (cuda::MoeGemmArgs::combine: the same bits as LaunchMoeCombine,
  // one launch fewer; at most kMoeFusedCombineMaxTokens); set before a capture (0: never).
  void set_fused_combine_max_tokens(int v) { fused_combine_max_tokens_ = v; }
  bool UsesFusedCombine(int T) const;
  // Batches of at most this many tokens on the tiled path run the expert GEMMs as GEMVs
  // (cuda::LaunchMoeGemv: bf16, fp8 and MXFP4 experts, the shared experts' dense group included)
  // where cuda::MoeGemvBatchOk and the shapes allow; fp8 activations (W8A8) keep the tiled GEMMs.
  // Set before a capture (tests and benchmarks compare both: 0 never). The GEMVs serve up to
  // cuda::kMoeGemvMaxTokens tokens, but against the tiled GEMMs they win only at one token
  // (docs/BENCHMARKS.md, the small-batch MoE layer rows): from two tokens on, the CUDA cores' FMA
  // per weight and row costs more than the tiles lose to their ragged last wave.
  static constexpr int kDefaultGemvMaxTokens = 1;
  void set_gemv_max_tokens(int v) { gemv_max_tokens_ = v; }
  bool UsesGemv(int T, const CudaMoeWeights& w) const;

  struct Trace {
    std::vector<MoeRoutingDecision>* out = nullptr;  // null: no trace
    int layer = 0;
    const int32_t* positions = nullptr;  // host [T]
  };
  // out [T, hidden] (bf16) = the layer applied to x (bf16 [T, hidden]) with the router reading
  // s->x_f32 (the same rows in fp32). With a trace, copies the decisions back and waits for them
  // (never inside a graph: graph_safe is false while a trace is set).
  Status Run(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x, int T,
             CudaMoeScratch* s, void* out, const Trace& trace) const;

  // Run never waits for the host (only a trace does, and Run refuses a trace while the stream
  // is capturing).
  bool graph_safe() const { return true; }
  const MoeRouting& routing() const { return r_; }

 private:
  // The stacked experts' weights and biases (MoeTensorNames::stacked_experts).
  Status LoadStacked(Bf16WeightLoader& loader, const WeightStore* weights,
                     const std::string& block_prefix, const MoeTensorNames& names,
                     WeightQuant quant, CudaMoeWeights* w) const;
  // The stacked experts' MXFP4 blocks and scales kept as stored (w->mxfp4), or, where the MXFP4
  // GEMMs do not serve them under kAuto, nothing (*kept false: the caller dequantizes).
  Status LoadMxfp4(const WeightStore* weights, const std::string& gate_up, const std::string& down,
                   bool dummy, WeightQuant quant, CudaMoeWeights* w, bool* kept) const;

  // The routed experts' gate_up GEMM over the permutation's tiles (weights, scales, biases, the
  // gate, tiles, output), shared by RunTiled and RunTiledW8a8; the caller sets x and the dtype.
  cuda::MoeGemmArgs GateUpArgs(const CudaMoeWeights& w, CudaMoeScratch* s, int max_tiles) const;
  // Why the W8A8 GEMMs do not serve the loaded experts `w`, or "" where they do.
  std::string W8a8Unserved(const CudaMoeWeights& w) const;
  // The tiled path's expert GEMMs on fp8 activations (w.w8a8): quantizes x, the routed and the
  // shared activations, and runs the W8A8 GEMMs (the combine stays a launch of its own).
  Status RunTiledW8a8(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x, int T,
                      CudaMoeScratch* s, int max_tiles, int tile_rows) const;
  // The expert GEMMs of the tiled (graph-safe) path, after the permutation; with combine_out,
  // the down GEMM also writes the combined output there.
  // With gemv, through cuda::LaunchMoeGemv (UsesGemv) instead of the tiled GEMMs.
  Status RunTiled(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x, int T,
                  CudaMoeScratch* s, int max_tiles, int tile_rows, void* combine_out,
                  bool gemv) const;
  // The expert GEMMs, activation and biases of the large-batch path, after the permutation
  // (engine/layers/cuda/cuda_moe_large_batch.cc).
  Status RunLargeBatch(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x, int T,
                       CudaMoeScratch* s) const;
  // Its fp8 form (LargeBatchFp8Serves), once the experts' row offsets `off` are on the host.
  Status RunLargeBatchFp8(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x, int T,
                          const std::vector<int32_t>& off, CudaMoeScratch* s) const;
  // C rows [off[e], off[e + 1]) = e4m3 rows A [off[e], ...) times expert e of `lin` (E stacked
  // [n, k]), one cuBLASLt GEMM per expert with rows. Per-row and per-tensor weights: with the
  // weights' scales but not the rows' (the caller applies those); a_scale is then at least the
  // rows plus kLargeFp8SlackRows floats of 1. 128x128 blocks: with both, a_scale the rows' as
  // cuda::LaunchMoeQuantizeBlocks128ByExpert writes them.
  Status Fp8ExpertGemms(const CudaLinearOps& ops, const std::vector<int32_t>& off,
                        const CudaLinear& lin, int n, int k, const void* a, const float* a_scale,
                        void* c) const;
  // C rows [off[e], off[e + 1]) = A rows [off[e], ...) W_e^T for every expert with rows; W_e is
  // [n, k] at w + e * n * k; A [rows, k], C [rows, n], bf16. `ptrs` holds 3 E device pointers.
  Status GroupedGemm(const CudaLinearOps& ops, const std::vector<int32_t>& off, const void* a,
                     const void* w, int n, int k, void* c, void* ptrs) const;

  MoeRouting r_;
  int hidden_, inter_, shared_inter_;
  CpuMlp::Gate gate_;
  int large_batch_slots_ = kLargeBatchSlotsPerExpert;
  LargeBatchGemm large_batch_gemm_ = LargeBatchGemm::kAuto;
  int fused_route_max_tokens_ = cuda::kMoeRouteFusedMaxTokens;
  int fused_combine_max_tokens_ = cuda::kMoeFusedCombineMaxTokens;
  int gemv_max_tokens_ = kDefaultGemvMaxTokens;
  Mxfp4 mxfp4_ = Mxfp4::kAuto;
  ActivationDtype activation_dtype_ = ActivationDtype::kBf16;
  int w8a8_min_tokens_ = 0;
};

// "bf16", "fp8" or "auto" (ModelLoadOptions::moe_activation_dtype, checked at load) as the
// layer's ActivationDtype.
inline CudaMoeLayer::ActivationDtype MoeActivationDtypeOf(const std::string& v) {
  return v == "fp8"    ? CudaMoeLayer::ActivationDtype::kFp8
         : v == "auto" ? CudaMoeLayer::ActivationDtype::kAuto
                       : CudaMoeLayer::ActivationDtype::kBf16;
}

}  // namespace llm
