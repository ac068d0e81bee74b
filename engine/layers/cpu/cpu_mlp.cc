#include "engine/layers/cpu/cpu_mlp.h"

#include "engine/layers/cpu/cpu_ops.h"
#include "engine/layers/cpu/cpu_weights.h"

namespace llm {

void CpuMlp::Forward(const float* x, int rows, float* out) const {
  const int I = intermediate;
  std::vector<float> gu(static_cast<size_t>(rows) * 2 * I), act(static_cast<size_t>(rows) * I);
  cpu::Linear(x, w_gate_up.data(), b_gate_up.empty() ? nullptr : b_gate_up.data(), rows, 2 * I,
              hidden, gu.data());
  switch (gate.activation) {
    case Activation::kSilu:
      cpu::SiluMul(gu.data(), rows, I, act.data());
      break;
    case Activation::kGeluTanh:
      cpu::GeluTanhMul(gu.data(), rows, I, act.data());
      break;
    case Activation::kClampedSwiGlu:
      cpu::ClampedSwiGlu(gu.data(), rows, I, gate.swiglu_alpha, gate.swiglu_limit, act.data());
      break;
  }
  cpu::Linear(act.data(), w_down.data(), b_down.empty() ? nullptr : b_down.data(), rows, hidden, I,
              out);
}

Status ReadCpuMlp(const WeightStore& w, const std::string& prefix, const MlpTensorNames& names,
                  int hidden, int intermediate, bool bias, CpuMlp* out, const CpuMlp::Gate& gate) {
  out->hidden = hidden;
  out->gate = gate;
  out->intermediate = intermediate;
  const int64_t h = hidden, inter = intermediate;
  const StackedPart gate_up[] = {{names.gate, inter}, {names.up, inter}};
  LLM_RETURN_IF_ERROR(
      ReadStacked(w, prefix, gate_up, h, bias, &out->w_gate_up, bias ? &out->b_gate_up : nullptr));
  LLM_RETURN_IF_ERROR(w.ReadF32(prefix + names.down + ".weight", {h, inter}, &out->w_down));
  if (bias) LLM_RETURN_IF_ERROR(w.ReadF32(prefix + names.down + ".bias", {h}, &out->b_down));
  return Status::Ok();
}

}  // namespace llm
