#include "engine/models/cpu_moe.h"

#include <algorithm>

#include "engine/models/cpu_ops.h"

namespace llm {

void CpuMoe::Forward(const float* x, int rows, const Trace& trace, float* out) const {
  const int E = routing.num_experts, K = routing.top_k;
  const int H = experts.empty() ? 0 : experts[0].hidden;
  std::vector<float> logits(static_cast<size_t>(rows) * E);
  cpu::Linear(x, router.data(), nullptr, rows, E, H, logits.data());

  std::vector<std::vector<std::pair<int, float>>> assigned(E);  // expert -> (row, weight)
  MoeRouter gate(routing);
  const float* bias = selection_bias.empty() ? nullptr : selection_bias.data();
  std::vector<int32_t> ids(K);
  std::vector<float> w(K);
  for (int r = 0; r < rows; ++r) {
    float margin = 0.0f;
    gate.Route(logits.data() + static_cast<size_t>(r) * E, bias, ids.data(), w.data(),
               trace.out != nullptr ? &margin : nullptr);
    for (int i = 0; i < K; ++i) assigned[ids[i]].emplace_back(r, w[i]);
    if (trace.out != nullptr) {
      MoeRoutingDecision& rec = trace.out->emplace_back();
      rec.row = r;
      rec.position = trace.positions[r];
      rec.layer = trace.layer;
      rec.experts = ids;
      std::sort(rec.experts.begin(), rec.experts.end());
      rec.margin = margin;
    }
  }

  // Experts in index order, each over its rows; a row sums its experts' weighted outputs in that
  // order.
  std::fill(out, out + static_cast<size_t>(rows) * H, 0.0f);
  std::vector<float> xe, ye;
  for (int e = 0; e < E; ++e) {
    const auto& list = assigned[e];
    if (list.empty()) continue;
    const int n = static_cast<int>(list.size());
    xe.resize(static_cast<size_t>(n) * H);
    ye.resize(static_cast<size_t>(n) * H);
    for (int i = 0; i < n; ++i) {
      std::copy_n(x + static_cast<size_t>(list[i].first) * H, H,
                  xe.data() + static_cast<size_t>(i) * H);
    }
    experts[e].Forward(xe.data(), n, ye.data());
    for (int i = 0; i < n; ++i) {
      float* o = out + static_cast<size_t>(list[i].first) * H;
      const float* y = ye.data() + static_cast<size_t>(i) * H;
      const float wt = list[i].second;
      for (int j = 0; j < H; ++j) o[j] += wt * y[j];
    }
  }
  if (shared.present()) {
    std::vector<float> s(static_cast<size_t>(rows) * H);
    shared.Forward(x, rows, s.data());
    for (size_t i = 0; i < s.size(); ++i) out[i] += s[i];
  }
}

Status ReadCpuMoe(const WeightStore& w, const std::string& layer_prefix,
                  const MoeTensorNames& names, const MoeRouting& routing, int hidden,
                  int intermediate, int shared_intermediate, CpuMoe* out) {
  const std::string p = layer_prefix + names.block;
  const int64_t E = routing.num_experts;
  out->routing = routing;
  LLM_RETURN_IF_ERROR(w.ReadF32(p + names.router + ".weight", {E, hidden}, &out->router));
  out->selection_bias.clear();
  if (!names.selection_bias.empty()) {
    LLM_RETURN_IF_ERROR(
        w.ReadF32(p + names.router + "." + names.selection_bias, {E}, &out->selection_bias));
  }
  out->experts.assign(E, CpuMlp());
  for (int64_t e = 0; e < E; ++e) {
    LLM_RETURN_IF_ERROR(ReadCpuMlp(w, p + names.experts + "." + std::to_string(e) + ".",
                                   names.expert, hidden, intermediate, false, &out->experts[e]));
  }
  out->shared = CpuMlp();
  if (shared_intermediate > 0) {
    LLM_RETURN_IF_ERROR(ReadCpuMlp(w, p + names.shared + ".", names.expert, hidden,
                                   shared_intermediate, false, &out->shared));
  }
  return Status::Ok();
}

}  // namespace llm
