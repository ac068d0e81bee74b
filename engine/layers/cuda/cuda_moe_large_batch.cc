// The large-batch path of the MoE layer (engine/layers/cuda/cuda_moe_layer.h: prefill chunks,
// outside CUDA graphs): the experts' row counts come back to the host once per layer, the rows are
// gathered by expert, and each expert's GEMMs run as cuBLAS GEMMs (bf16: one grouped call or one
// per expert; fp8 with fp8 activations: one cuBLASLt fp8 GEMM per expert on rows quantized per
// token, or per token and 128-wide block beside 128x128 block scales), with the gate, the row
// scales and the biases as element-wise kernels (kernels/cuda/moe/moe_large_batch.cu).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/layers/cuda/cuda_fp8_gemm.h"
#include "engine/layers/cuda/cuda_moe_layer.h"
#include "engine/layers/cuda/cuda_weights.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/ops/fp8_quant.h"

namespace llm {
namespace {

// The rows of one expert's fp8 GEMM (cuda::MoeFp8ExpertRows): the rows past the count read the
// next experts' rows (or the scratch's slack) and write rows that those experts' GEMMs overwrite
// later in stream order (or slack): CudaMoeLayer::kLargeFp8SlackRows.
static_assert(CudaMoeLayer::kLargeFp8SlackRows >= 127, "MoeFp8ExpertRows' largest overshoot");

bool Fp8Scaled(const CudaLinear& lin) {
  return lin.quant() == WeightQuant::kFp8PerTensor || lin.quant() == WeightQuant::kFp8PerChannel ||
         lin.quant() == WeightQuant::kFp8Block;
}

}  // namespace

bool CudaMoeLayer::LargeBatchFp8Serves(const CudaMoeWeights& w) {
  return w.w8a8 && !w.mxfp4 && Fp8Scaled(w.gate_up) && Fp8Scaled(w.down) &&
         (w.shared.inter == 0 || (Fp8Scaled(w.shared.gate_up) && Fp8Scaled(w.shared.down)));
}

bool CudaMoeLayer::TakesLargeBatchPath(int T, const CudaMoeWeights& w) const {
  const bool bf16 = !w.mxfp4 && !w.gate_up.fp8() && !w.down.fp8();
  return (bf16 || (LargeBatchFp8Serves(w) && UsesW8a8(T, w))) &&
         static_cast<int64_t>(T) * r_.top_k >=
             static_cast<int64_t>(large_batch_slots_) * r_.num_experts;
}

Status CudaMoeLayer::GroupedGemm(const CudaLinearOps& ops, const std::vector<int32_t>& off,
                                 const void* a, const void* w, int n, int k, void* c,
                                 void* ptrs) const {
  const int E = r_.num_experts;
  auto* wb = const_cast<uint16_t*>(static_cast<const uint16_t*>(w));
  auto* ab = const_cast<uint16_t*>(static_cast<const uint16_t*>(a));
  auto* cb = static_cast<uint16_t*>(c);
  std::vector<int> experts, m_rows;  // the experts with rows, and their row counts
  for (int e = 0; e < E; ++e) {
    if (off[e + 1] == off[e]) continue;
    experts.push_back(e);
    m_rows.push_back(off[e + 1] - off[e]);
  }
  const int P = static_cast<int>(experts.size());
  if (P == 0) return Status::Ok();
  const bool per_expert =
      large_batch_gemm_ == LargeBatchGemm::kPerExpert ||
      (large_batch_gemm_ == LargeBatchGemm::kAuto && off[E] >= kPerExpertGemmRows * P);
  if (per_expert) {
    for (int i = 0; i < P; ++i) {
      const int e = experts[i];
      LLM_RETURN_IF_ERROR(GemmBf16(ops.blas, ab + off[e] * size_t(k), wb + size_t(e) * n * k,
                                   m_rows[i], n, k, cb + off[e] * size_t(n), CUDA_R_16BF));
    }
    return Status::Ok();
  }
  std::vector<void*> p(3 * P);  // A (weights), B (rows), C per problem, as cuBLAS reads them
  for (int i = 0; i < P; ++i) {
    const int e = experts[i];
    p[i] = wb + size_t(e) * n * k;
    p[P + i] = ab + off[e] * size_t(k);
    p[2 * P + i] = cb + off[e] * size_t(n);
  }
  // Column-major view of the row-major product: C^T [n, rows] = W_e [n, k] (transposed from its
  // row-major [n, k] storage) times A^T [k, rows].
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(ptrs, p.data(), p.size() * sizeof(void*),
                                      cudaMemcpyHostToDevice, ops.stream));
  void** d = static_cast<void**>(ptrs);
  const std::vector<cublasOperation_t> ta(P, CUBLAS_OP_T), tb(P, CUBLAS_OP_N);
  const std::vector<int> nn(P, n), kk(P, k), one_each(P, 1);
  const std::vector<float> alpha(P, 1.0f), beta(P, 0.0f);
  BLAS_RETURN_IF_ERROR(cublasGemmGroupedBatchedEx(
      ops.blas, ta.data(), tb.data(), nn.data(), m_rows.data(), kk.data(), alpha.data(), d,
      CUDA_R_16BF, kk.data(), d + P, CUDA_R_16BF, kk.data(), beta.data(), d + 2 * P, CUDA_R_16BF,
      nn.data(), P, one_each.data(), CUBLAS_COMPUTE_32F));
  return Status::Ok();
}

Status CudaMoeLayer::RunLargeBatch(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x,
                                   int T, CudaMoeScratch* s) const {
  cudaStream_t stream = ops.stream;
  const int E = r_.num_experts;
  std::vector<int32_t> off(E + 1);
  GPU_RETURN_IF_ERROR(
      cudaMemcpyAsync(off.data(), s->offsets.ptr, (E + 1) * 4, cudaMemcpyDeviceToHost, stream));
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (w.w8a8) return RunLargeBatchFp8(ops, w, x, T, off, s);  // TakesLargeBatchPath: UsesW8a8
  const int rows = off[E];
  const float limit =
      gate_.activation == CpuMlp::Activation::kClampedSwiGlu ? gate_.swiglu_limit : 0.0f;
  const float alpha = gate_.swiglu_alpha;
  const auto* offsets = s->offsets.as<int32_t>();
  // The gathered rows live in y until the down GEMM overwrites it (stream order).
  cuda::LaunchMoeGather(x, s->sorted_token.as<int32_t>(), rows, hidden_, s->y.ptr, stream);
  LLM_RETURN_IF_ERROR(GroupedGemm(ops, off, s->y.ptr, w.gate_up.data(), 2 * inter_, hidden_,
                                  s->gu.ptr, s->ptrs.ptr));
  cuda::LaunchMoeGateAct(s->gu.ptr, rows, inter_,
                         w.gate_up_bias.ptr ? w.gate_up_bias.as<float>() : nullptr, offsets, E,
                         limit, alpha, s->act.ptr, stream);
  const bool shared = w.shared.inter > 0;
  if (shared) {  // gate_up [T, 2 SI] into gu, free again once the routed activation read it
    LLM_RETURN_IF_ERROR(GemmBf16(ops.blas, x, w.shared.gate_up.data(), T, 2 * shared_inter_,
                                 hidden_, s->gu.ptr, CUDA_R_16BF));
    cuda::LaunchMoeGateAct(s->gu.ptr, T, shared_inter_, nullptr, nullptr, 0, limit, alpha,
                           s->shared_act.ptr, stream);
  }
  // The same pointer arrays again: their copy runs after the first grouped GEMM (stream order).
  LLM_RETURN_IF_ERROR(
      GroupedGemm(ops, off, s->act.ptr, w.down.data(), hidden_, inter_, s->y.ptr, s->ptrs.ptr));
  if (w.down_bias.ptr) {
    cuda::LaunchMoeRowBias(s->y.ptr, rows, hidden_, w.down_bias.as<float>(), offsets, E, stream);
  }
  if (shared) {
    LLM_RETURN_IF_ERROR(GemmBf16(ops.blas, s->shared_act.ptr, w.shared.down.data(), T, hidden_,
                                 shared_inter_, s->shared_out.ptr, CUDA_R_16BF));
  }
  return Status::Ok();
}

Status CudaMoeLayer::Fp8ExpertGemms(const CudaLinearOps& ops, const std::vector<int32_t>& off,
                                    const CudaLinear& lin, int n, int k, const void* a,
                                    const float* a_scale, void* c) const {
  if (ops.fp8 == nullptr) return Internal("CUDA MoE layer: fp8 experts without the fp8 GEMM");
  const bool per_channel = lin.quant() == WeightQuant::kFp8PerChannel;
  const auto* wb = static_cast<const uint8_t*>(lin.data());
  const auto* ab = static_cast<const uint8_t*>(a);
  auto* cb = static_cast<uint16_t*>(c);
  size_t block_rows = 0;  // block scales: the rows of the experts' GEMMs so far
  for (int e = 0; e < r_.num_experts; ++e) {
    const int count = off[e + 1] - off[e];
    if (count == 0) continue;
    if (lin.quant() == WeightQuant::kFp8Block) {
      // Both scales applied by the GEMM: the expert's 128x128 weight blocks (whole blocks of rows
      // per expert, as MoeGemmScalesOf strides them) and its rows' 1x128 blocks, a matrix of
      // their own (cuda::LaunchMoeQuantizeBlocks128ByExpert).
      const int m = cuda::MoeFp8ExpertRows(count);
      const float* w_scale = lin.scales() + static_cast<size_t>(e) * (n / 128) * Fp8BlockLd(k);
      LLM_RETURN_IF_ERROR(ops.fp8->Run(ab + static_cast<size_t>(off[e]) * k,
                                       a_scale + block_rows * ((k + 127) / 128),
                                       wb + static_cast<size_t>(e) * n * k, w_scale, m, n, k,
                                       cb + static_cast<size_t>(off[e]) * n, Fp8Scaling::kBlock));
      block_rows += m;
      continue;
    }
    // Per channel: the expert's [n] scales beside a vector of ones for the rows (kOuter: a row
    // scale vector at row off[e] need not be aligned as cuBLASLt reads it); per tensor: one per
    // expert where Quantize gave each its own ([E][kScaleSlot]), else one for all.
    const float* w_scale = per_channel
                               ? lin.scales() + static_cast<size_t>(e) * n
                               : lin.scales() + (lin.groups() > 1 ? e * CudaLinear::kScaleSlot : 0);
    LLM_RETURN_IF_ERROR(
        ops.fp8->Run(ab + static_cast<size_t>(off[e]) * k, per_channel ? a_scale : ops.unit_scale,
                     wb + static_cast<size_t>(e) * n * k, w_scale, cuda::MoeFp8ExpertRows(count), n,
                     k, cb + static_cast<size_t>(off[e]) * n,
                     per_channel ? Fp8Scaling::kOuter : Fp8Scaling::kTensor));
  }
  return Status::Ok();
}

Status CudaMoeLayer::RunLargeBatchFp8(const CudaLinearOps& ops, const CudaMoeWeights& w,
                                      const void* x, int T, const std::vector<int32_t>& off,
                                      CudaMoeScratch* s) const {
  cudaStream_t stream = ops.stream;
  const int E = r_.num_experts, rows = off[E];
  if (s->large_q.ptr == nullptr) {
    return Internal("CUDA MoE layer: fp8 large batches without their scratch (Reserve)");
  }
  const float limit =
      gate_.activation == CpuMlp::Activation::kClampedSwiGlu ? gate_.swiglu_limit : 0.0f;
  const float alpha = gate_.swiglu_alpha;
  const auto* offsets = s->offsets.as<int32_t>();
  // One set of e4m3 rows, each GEMM's input in turn (stream order): x gathered by expert, the
  // shared experts' x, the routed activations, the shared activations.
  const cuda::Fp8Rows q{s->large_q.ptr, s->large_q_scale.as<float>()};
  // Per-row or per-tensor weights: the rows quantized per token, whose scales the GEMMs leave to
  // the kernels after them (kOuter multiplies by ones on the rows' side); 128x128 blocks: per token
  // and 128-wide block, both scales inside the GEMM.
  const float* ones = s->large_ones.as<float>();
  auto quantize = [&](const CudaLinear& lin, const void* in, int cols) -> const float* {
    if (lin.quant() == WeightQuant::kFp8Block) {
      cuda::LaunchMoeQuantizeBlocks128ByExpert(in, rows, cols, offsets, E, q.q, q.scale, stream);
      return q.scale;
    }
    QuantizeFp8RowsFor(lin, in, rows, cols, q, stream);
    return ones;
  };
  auto row_scales = [&](const CudaLinear& lin) {
    return lin.quant() == WeightQuant::kFp8Block ? nullptr : q.scale;
  };
  cuda::LaunchMoeGather(x, s->sorted_token.as<int32_t>(), rows, hidden_, s->y.ptr, stream);
  const float* a_scale = quantize(w.gate_up, s->y.ptr, hidden_);
  LLM_RETURN_IF_ERROR(
      Fp8ExpertGemms(ops, off, w.gate_up, 2 * inter_, hidden_, q.q, a_scale, s->gu.ptr));
  cuda::LaunchMoeGateAct(s->gu.ptr, rows, inter_,
                         w.gate_up_bias.ptr ? w.gate_up_bias.as<float>() : nullptr, offsets, E,
                         limit, alpha, s->act.ptr, stream, row_scales(w.gate_up));
  const bool shared = w.shared.inter > 0;
  if (shared) {  // the shared experts' fp8 GEMMs as a projection's (their own quantization)
    LLM_RETURN_IF_ERROR(w.shared.gate_up.Apply(ops, x, T, s->gu.ptr, q));
    cuda::LaunchMoeGateAct(s->gu.ptr, T, shared_inter_, nullptr, nullptr, 0, limit, alpha,
                           s->shared_act.ptr, stream);
  }
  a_scale = quantize(w.down, s->act.ptr, inter_);
  LLM_RETURN_IF_ERROR(Fp8ExpertGemms(ops, off, w.down, hidden_, inter_, q.q, a_scale, s->y.ptr));
  if (row_scales(w.down) != nullptr) {
    cuda::LaunchScaleRowsBf16(s->y.ptr, q.scale, rows, hidden_, stream);
  }
  if (w.down_bias.ptr) {
    cuda::LaunchMoeRowBias(s->y.ptr, rows, hidden_, w.down_bias.as<float>(), offsets, E, stream);
  }
  if (shared)
    LLM_RETURN_IF_ERROR(w.shared.down.Apply(ops, s->shared_act.ptr, T, s->shared_out.ptr, q));
  return Status::Ok();
}

}  // namespace llm
