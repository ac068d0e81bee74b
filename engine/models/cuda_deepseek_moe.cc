#include "engine/models/cuda_deepseek_moe.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/deepseek_ops.h"
#include "kernels/cuda/llama_ops.h"

namespace llm {

Status CudaGatedMlp::Load(Bf16WeightLoader& loader, const CudaLinearOps& ops, WeightQuant quant,
                          const std::string& p, int hidden, int inter_size) {
  inter = inter_size;
  const int64_t h = hidden, i = inter_size;
  const float wstd = 0.02f;
  LLM_RETURN_IF_ERROR(loader.Load({p + "gate_proj.weight", p + "up_proj.weight"}, {{i, h}, {i, h}},
                                  0, wstd, gate_up.bf16_target()));
  LLM_RETURN_IF_ERROR(loader.Load({p + "down_proj.weight"}, {{h, i}}, 0, wstd, down.bf16_target()));
  LLM_RETURN_IF_ERROR(gate_up.Quantize(ops, quant, 2 * inter, hidden, 1, p + "gate_up_proj"));
  return down.Quantize(ops, quant, hidden, inter, 1, p + "down_proj");
}

Status CudaGatedMlp::Run(const CudaLinearOps& ops, const void* x, int rows, void* out,
                         void* gate_up_buf, void* act_buf, const cuda::Fp8Rows& fp8_scratch) const {
  LLM_RETURN_IF_ERROR(gate_up.Apply(ops, x, rows, gate_up_buf, fp8_scratch));
  cuda::LaunchSiluMul(gate_up_buf, rows, inter, act_buf, ops.stream);
  return down.Apply(ops, act_buf, rows, out, fp8_scratch);
}

CudaDeepseekMoe::~CudaDeepseekMoe() {
  if (pinned_) cudaFreeHost(pinned_);
}

Status CudaDeepseekMoe::Pinned(cudaStream_t stream, size_t bytes) {
  if (bytes <= pinned_bytes_) return Status::Ok();
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // no copy may still use the old one
  if (pinned_) GPU_RETURN_IF_ERROR(cudaFreeHost(pinned_));
  pinned_ = nullptr;
  GPU_RETURN_IF_ERROR(cudaMallocHost(&pinned_, bytes));
  pinned_bytes_ = bytes;
  return Status::Ok();
}

Status CudaDeepseekMoe::LoadLayer(Bf16WeightLoader& loader, const WeightStore* w,
                                  const CudaLinearOps& ops, WeightQuant quant, const std::string& p,
                                  Layer* L) const {
  const int64_t h = d_.base.hidden_size, E = d_.n_routed_experts, I = d_.moe_intermediate_size;
  const float wstd = 0.02f;
  LLM_RETURN_IF_ERROR(loader.Load({p + "gate.weight"}, {{E, h}}, 0, wstd, L->router.bf16_target()));
  LLM_RETURN_IF_ERROR(L->router.Quantize(ops, WeightQuant::kBf16, static_cast<int>(E),
                                         static_cast<int>(h), 1, p + "gate"));
  if (d_.topk_method == DeepseekConfig::TopkMethod::kNoauxTc) {
    std::vector<float> bias(E, 0.0f);  // dummy weights: no correction
    if (!loader.dummy())
      LLM_RETURN_IF_ERROR(w->ReadF32(p + "gate.e_score_correction_bias", {E}, &bias));
    LLM_RETURN_IF_ERROR(L->router_bias.Alloc(E * 4));
    GPU_RETURN_IF_ERROR(cudaMemcpy(L->router_bias.ptr, bias.data(), E * 4, cudaMemcpyHostToDevice));
  }
  std::vector<std::string> gu_names, down_names;
  std::vector<std::vector<int64_t>> gu_shapes, down_shapes;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    gu_names.insert(gu_names.end(), {ep + "gate_proj.weight", ep + "up_proj.weight"});
    gu_shapes.insert(gu_shapes.end(), {{I, h}, {I, h}});
    down_names.push_back(ep + "down_proj.weight");
    down_shapes.push_back({h, I});
  }
  LLM_RETURN_IF_ERROR(loader.Load(gu_names, gu_shapes, 0, wstd, L->gate_up.bf16_target()));
  LLM_RETURN_IF_ERROR(loader.Load(down_names, down_shapes, 0, wstd, L->down.bf16_target()));
  LLM_RETURN_IF_ERROR(L->gate_up.Quantize(ops, quant, static_cast<int>(2 * I), static_cast<int>(h),
                                          static_cast<int>(E), p + "experts.gate_up_proj"));
  LLM_RETURN_IF_ERROR(L->down.Quantize(ops, quant, static_cast<int>(h), static_cast<int>(I),
                                       static_cast<int>(E), p + "experts.down_proj"));
  if (d_.n_shared_experts > 0) {
    LLM_RETURN_IF_ERROR(L->shared.Load(loader, ops, quant, p + "shared_experts.",
                                       static_cast<int>(h),
                                       static_cast<int>(I * d_.n_shared_experts)));
  }
  return Status::Ok();
}

Status CudaDeepseekMoe::Run(const CudaLinearOps& ops, const Layer& L, int layer, const void* xn,
                            int T, const std::vector<int32_t>& positions, void* out) {
  using Method = DeepseekConfig::TopkMethod;
  cudaStream_t stream = ops.stream;
  const int Hd = d_.base.hidden_size, E = d_.n_routed_experts, K = d_.num_experts_per_tok;
  const int I = d_.moe_intermediate_size, S = T * K;  // S: (token, expert) slots
  // fp8 expert GEMMs run whole 16-row groups from each expert's first slot: room past S.
  const size_t rows = static_cast<size_t>(Fp8Rows16(std::max(S, T))) + 16;
  const int SI = L.shared.inter;
  LLM_RETURN_IF_ERROR(router_logits_.Alloc(static_cast<size_t>(T) * E * 4));
  LLM_RETURN_IF_ERROR(topk_ids_.Alloc(static_cast<size_t>(S) * 4));
  LLM_RETURN_IF_ERROR(topk_w_.Alloc(static_cast<size_t>(S) * 4));
  LLM_RETURN_IF_ERROR(moe_ints_.Alloc(static_cast<size_t>(S) * 2 * 4));
  LLM_RETURN_IF_ERROR(xg_.Alloc(rows * Hd * 2));
  LLM_RETURN_IF_ERROR(ge_.Alloc(rows * 2 * I * 2));
  LLM_RETURN_IF_ERROR(ae_.Alloc(rows * I * 2));
  LLM_RETURN_IF_ERROR(ye_.Alloc(rows * Hd * 2));
  LLM_RETURN_IF_ERROR(xq_.Alloc(rows * std::max({Hd, I, SI})));
  LLM_RETURN_IF_ERROR(row_scales_.Alloc(rows * 4));
  LLM_RETURN_IF_ERROR(Pinned(stream, static_cast<size_t>(S) * 3 * 4));
  const cuda::Fp8Rows fp8_scratch{xq_.ptr, row_scales_.as<float>()};

  // Router logits in fp32 (the routing decisions are the sensitive part), then top-k on device.
  LLM_RETURN_IF_ERROR(L.router.RunBf16(ops, xn, T, router_logits_.ptr, CUDA_R_32F));
  cuda::MoeRoutingArgs ra;
  ra.logits = router_logits_.as<float>();
  ra.bias = L.router_bias.ptr ? L.router_bias.as<float>() : nullptr;
  ra.num_tokens = T;
  ra.num_experts = E;
  ra.top_k = K;
  ra.sigmoid = d_.scoring == DeepseekConfig::Scoring::kSigmoid;
  ra.method = d_.topk_method == Method::kGreedy               ? 0
              : d_.topk_method == Method::kGroupLimitedGreedy ? 1
                                                              : 2;
  ra.n_group = d_.n_group;
  ra.topk_group = d_.topk_group;
  ra.normalize = K > 1 && d_.norm_topk_prob;
  ra.scale_after_norm = d_.is_v3();
  ra.routed_scaling_factor = d_.routed_scaling_factor;
  ra.topk_ids = topk_ids_.as<int32_t>();
  ra.topk_w = topk_w_.as<float>();
  cuda::LaunchMoeRouting(ra, stream);

  // Grouping by expert on the host: cuBLAS takes each expert's row count from the host, so one
  // S-int copy back is needed anyway; a device prefix sum would only move that sync (a grouped
  // GEMM with device-side sizes is the follow-up). One sync per MoE layer.
  auto* h_ids = static_cast<int32_t*>(pinned_);
  GPU_RETURN_IF_ERROR(cudaMemcpyAsync(h_ids, topk_ids_.ptr, S * 4, cudaMemcpyDeviceToHost, stream));
  GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<int32_t> offsets(E + 1, 0);
  for (int i = 0; i < S; ++i) {
    if (h_ids[i] < 0 || h_ids[i] >= E) return Internal("MoE routing produced an invalid expert");
    ++offsets[h_ids[i] + 1];
  }
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  if (routing_trace_ != nullptr) {  // h_ids holds each token's K experts, best first
    for (int r = 0; r < T; ++r) {
      MoeRoutingDecision& rec = routing_trace_->emplace_back();
      rec.row = r;
      rec.position = positions[r];
      rec.layer = layer;
      rec.experts.assign(h_ids + static_cast<size_t>(r) * K,
                         h_ids + static_cast<size_t>(r + 1) * K);
      std::sort(rec.experts.begin(), rec.experts.end());
    }
  }
  int32_t* h_rows = h_ids + S;   // [S] token of each expert-ordered slot
  int32_t* h_slot = h_rows + S;  // [S] slot of each (token, k)
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  for (int i = 0; i < S; ++i) {  // token order within an expert, as the CPU model
    const int s = fill[h_ids[i]]++;
    h_rows[s] = i / K;
    h_slot[i] = s;
  }
  GPU_RETURN_IF_ERROR(
      cudaMemcpyAsync(moe_ints_.ptr, h_rows, 2 * S * 4, cudaMemcpyHostToDevice, stream));
  const int32_t* d_rows = moe_ints_.as<int32_t>();
  const int32_t* d_slot = d_rows + S;
  cuda::LaunchGatherRows(xn, d_rows, S, Hd, xg_.ptr, stream);
  // Experts in ascending order: an fp8 GEMM's padding rows land in the next expert's rows, which
  // its own GEMM then overwrites (and past S, in the spare rows).
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    LLM_RETURN_IF_ERROR(L.gate_up.Apply(
        ops, xg_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * Hd, n,
        ge_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * 2 * I, fp8_scratch, e));
  }
  cuda::LaunchSiluMul(ge_.ptr, S, I, ae_.ptr, stream);
  for (int e = 0; e < E; ++e) {
    const int n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    LLM_RETURN_IF_ERROR(L.down.Apply(ops, ae_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * I,
                                     n, ye_.as<uint16_t>() + static_cast<size_t>(offsets[e]) * Hd,
                                     fp8_scratch, e));
  }
  const void* shared = nullptr;
  if (SI > 0) {
    LLM_RETURN_IF_ERROR(shared_out_.Alloc(rows * Hd * 2));
    LLM_RETURN_IF_ERROR(shared_gu_.Alloc(rows * 2 * SI * 2));
    LLM_RETURN_IF_ERROR(shared_act_.Alloc(rows * SI * 2));
    LLM_RETURN_IF_ERROR(
        L.shared.Run(ops, xn, T, shared_out_.ptr, shared_gu_.ptr, shared_act_.ptr, fp8_scratch));
    shared = shared_out_.ptr;
  }
  cuda::LaunchMoeCombine(ye_.ptr, d_slot, topk_w_.as<float>(), shared, T, K, Hd, out, stream);
  return Status::Ok();
}

}  // namespace llm
