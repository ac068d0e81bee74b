// DeepSeekMoE on CUDA for the DeepSeek definition (cuda_deepseek_decoder.cc): the router (bf16
// weights, fp32 logits), the routing kernel, the routed experts (CudaLinear, one fp8 scale per
// expert with fp8 weights) and the shared experts, combined deterministically. Built only with
// the CUDA backend.
//
// Grouping is on the host: the top-k ids come back (one small D2H copy and a stream sync per MoE
// layer), the host orders the (token, expert) slots by expert, and cuBLAS runs one GEMM per expert
// with its row count. That sync keeps DeepSeek's decode steps out of CUDA graphs
// (CudaDecoder::graph_safe); a device-only MoE layer replaces Run as a whole. The host copy of the
// top-k ids also feeds the opt-in routing trace (Model::set_routing_trace).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/models/cuda_linear.h"
#include "engine/models/deepseek_config.h"
#include "engine/models/model.h"

namespace llm {

// silu(x W_gate^T) * (x W_up^T) W_down^T: DeepSeek's dense MLP and its shared experts.
struct CudaGatedMlp {
  int inter = 0;       // 0: absent
  CudaLinear gate_up;  // [2 * inter, hidden] (gate, up stacked)
  CudaLinear down;     // [hidden, inter]
  // Loads p + {gate,up,down}_proj.weight and converts them to `quant`.
  Status Load(Bf16WeightLoader& loader, const CudaLinearOps& ops, WeightQuant quant,
              const std::string& p, int hidden, int inter);
  // out [rows, hidden] (bf16); gate_up: [rows16, 2 inter] and act: [rows16, inter] scratch.
  Status Run(const CudaLinearOps& ops, const void* x, int rows, void* out, void* gate_up_buf,
             void* act_buf, const cuda::Fp8Rows& fp8_scratch) const;
};

class CudaDeepseekMoe {
 public:
  struct Layer {
    CudaLinear router;         // bf16 [E, hidden]: fp32 logits, whatever the experts' dtype
    DeviceBuffer router_bias;  // fp32 [E] (noaux_tc) or empty
    CudaLinear gate_up;        // E stacked [2 * I, hidden]
    CudaLinear down;           // E stacked [hidden, I]
    CudaGatedMlp shared;       // inter 0 without shared experts
  };

  explicit CudaDeepseekMoe(const DeepseekConfig& config) : d_(config) {}
  ~CudaDeepseekMoe();
  CudaDeepseekMoe(const CudaDeepseekMoe&) = delete;
  CudaDeepseekMoe& operator=(const CudaDeepseekMoe&) = delete;

  // Layer `layer`'s router, experts and shared experts (prefix "model.layers.<l>.mlp.").
  Status LoadLayer(Bf16WeightLoader& loader, const WeightStore* weights, const CudaLinearOps& ops,
                   WeightQuant quant, const std::string& p, Layer* L) const;
  // out [T, hidden] = MoE(xn [T, hidden]) for layer `layer`; positions (host, [T]) for the trace.
  Status Run(const CudaLinearOps& ops, const Layer& L, int layer, const void* xn, int T,
             const std::vector<int32_t>& positions, void* out);
  void set_routing_trace(std::vector<MoeRoutingDecision>* trace) { routing_trace_ = trace; }

 private:
  Status Pinned(cudaStream_t stream, size_t bytes);

  DeepseekConfig d_;
  DeviceBuffer router_logits_, topk_ids_, topk_w_, moe_ints_, xg_, ge_, ae_, ye_, shared_out_,
      shared_gu_, shared_act_, xq_, row_scales_;
  std::vector<MoeRoutingDecision>* routing_trace_ = nullptr;  // set_routing_trace; not owned
  void* pinned_ = nullptr;                                    // routing copies
  size_t pinned_bytes_ = 0;
};

}  // namespace llm
