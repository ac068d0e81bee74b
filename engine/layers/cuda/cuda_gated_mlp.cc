#include "engine/layers/cuda/cuda_gated_mlp.h"

#include <vector>

#include "kernels/cuda/ops/elementwise_ops.h"

namespace llm {

Status CudaGatedMlp::Load(Bf16WeightLoader& loader, const CudaLinearOps& ops, WeightQuant quant,
                          const std::string& p, int hidden, int inter_size,
                          const WeightStore* fp8_checkpoint) {
  inter = inter_size;
  const int64_t h = hidden, i = inter_size;
  const float wstd = 0.02f;
  const std::vector<std::string> gu_names = {p + "gate_proj.weight", p + "up_proj.weight"},
                                 down_names = {p + "down_proj.weight"};
  if (fp8_checkpoint != nullptr) {
    LLM_RETURN_IF_ERROR(gate_up.LoadCheckpoint(ops, *fp8_checkpoint, loader, gu_names,
                                               {{i, h}, {i, h}}, p + "gate_up_proj", quant));
    return down.LoadCheckpoint(ops, *fp8_checkpoint, loader, down_names, {{h, i}}, p + "down_proj",
                               quant);
  }
  LLM_RETURN_IF_ERROR(loader.Load(gu_names, {{i, h}, {i, h}}, 0, wstd, gate_up.bf16_target()));
  LLM_RETURN_IF_ERROR(loader.Load(down_names, {{h, i}}, 0, wstd, down.bf16_target()));
  LLM_RETURN_IF_ERROR(gate_up.Quantize(ops, quant, 2 * inter, hidden, 1, p + "gate_up_proj"));
  return down.Quantize(ops, quant, hidden, inter, 1, p + "down_proj");
}

Status CudaGatedMlp::Run(const CudaLinearOps& ops, const void* x, int rows, void* out,
                         void* gate_up_buf, void* act_buf, const cuda::Fp8Rows& fp8_scratch) const {
  LLM_RETURN_IF_ERROR(gate_up.Apply(ops, x, rows, gate_up_buf, fp8_scratch));
  cuda::LaunchSiluMul(gate_up_buf, rows, inter, act_buf, ops.stream);
  return down.Apply(ops, act_buf, rows, out, fp8_scratch);
}

}  // namespace llm
