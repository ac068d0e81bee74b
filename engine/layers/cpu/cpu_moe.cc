#include "engine/layers/cpu/cpu_moe.h"

#include <algorithm>

#include "base/mxfp4.h"
#include "engine/layers/cpu/cpu_ops.h"

namespace llm {

void CpuMoe::Forward(const float* x, int rows, const Trace& trace, float* out) const {
  const int E = routing.num_experts, K = routing.top_k;
  const int H = experts.empty() ? 0 : experts[0].hidden;
  std::vector<float> logits(static_cast<size_t>(rows) * E);
  cpu::Linear(x, router.data(), router_bias.empty() ? nullptr : router_bias.data(), rows, E, H,
              logits.data());

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

namespace {

Status ReadMxfp4Experts(const WeightStore& w, const std::string& name, int64_t E, int64_t rows,
                        int64_t cols, std::vector<float>* out) {
  if (w.quantization().method != WeightQuantization::Method::kMxfp4) {
    return InvalidArgument("tensor '" + name +
                           "_blocks' is MXFP4 but config.json's quantization_config is not mxfp4");
  }
  if (cols % 32 != 0) {
    return InvalidArgument("MXFP4 tensor '" + name + "_blocks': input dimension " +
                           std::to_string(cols) + " is not a multiple of 32");
  }
  const int64_t groups = cols / 32;
  LLM_ASSIGN_OR_RETURN(const TensorView* b,
                       w.GetWithShape(name + "_blocks", {E, rows, groups, 16}));
  LLM_ASSIGN_OR_RETURN(const TensorView* s, w.GetWithShape(name + "_scales", {E, rows, groups}));
  for (const TensorView* v : {b, s}) {
    if (v->dtype != DType::kU8) {
      return InvalidArgument("MXFP4 tensor '" + v->name + "' has dtype " + DTypeName(v->dtype) +
                             "; expected uint8");
    }
  }
  out->resize(static_cast<size_t>(E * rows * cols));
  DequantizeMxfp4(reinterpret_cast<const uint8_t*>(b->data),
                  reinterpret_cast<const uint8_t*>(s->data), static_cast<size_t>(E * rows * groups),
                  out->data());
  return Status::Ok();
}

// src [E, a, b] -> expert e's [b, a] (the Linear layout of a stored x @ W matrix).
void TransposeExpert(const std::vector<float>& src, int64_t e, int64_t a, int64_t b,
                     std::vector<float>* dst) {
  dst->resize(static_cast<size_t>(a * b));
  const float* s = src.data() + e * a * b;
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = 0; j < b; ++j) (*dst)[j * a + i] = s[i * b + j];
  }
}

// The stacked expert tensors of gpt-oss (the MoeTensorNames comment).
Status ReadStackedExperts(const WeightStore& w, const std::string& p, const MoeTensorNames& names,
                          int64_t E, int64_t H, int64_t I, CpuMoe* out) {
  const std::string gu = p + names.expert.gate, down = p + names.expert.down;
  std::vector<float> gu_w, gu_b, down_w, down_b;
  LLM_RETURN_IF_ERROR(ReadExpertMatrix(w, gu, E, H, 2 * I, &gu_w));
  LLM_RETURN_IF_ERROR(ReadExpertMatrix(w, down, E, I, H, &down_w));
  if (names.expert_bias) {
    LLM_RETURN_IF_ERROR(w.ReadF32(gu + "_bias", {E, 2 * I}, &gu_b));
    LLM_RETURN_IF_ERROR(w.ReadF32(down + "_bias", {E, H}, &down_b));
  }
  for (int64_t e = 0; e < E; ++e) {
    CpuMlp& m = out->experts[e];
    m.hidden = static_cast<int>(H);
    m.intermediate = static_cast<int>(I);
    // ReadExpertMatrix gives [E, out, in]: the Linear layout already.
    m.w_gate_up.assign(gu_w.begin() + e * 2 * I * H, gu_w.begin() + (e + 1) * 2 * I * H);
    m.w_down.assign(down_w.begin() + e * H * I, down_w.begin() + (e + 1) * H * I);
    if (names.expert_bias) {
      m.b_gate_up.assign(gu_b.begin() + e * 2 * I, gu_b.begin() + (e + 1) * 2 * I);
      m.b_down.assign(down_b.begin() + e * H, down_b.begin() + (e + 1) * H);
    }
  }
  return Status::Ok();
}

}  // namespace

Status ReadExpertMatrix(const WeightStore& w, const std::string& name, int64_t E, int64_t in,
                        int64_t out_dim, std::vector<float>* out) {
  if (w.Has(name + "_blocks")) return ReadMxfp4Experts(w, name, E, out_dim, in, out);
  std::vector<float> stored;
  LLM_RETURN_IF_ERROR(w.ReadF32(name, {E, in, out_dim}, &stored));
  out->resize(static_cast<size_t>(E * in * out_dim));
  std::vector<float> one;
  for (int64_t e = 0; e < E; ++e) {
    TransposeExpert(stored, e, in, out_dim, &one);
    std::copy(one.begin(), one.end(), out->begin() + e * in * out_dim);
  }
  return Status::Ok();
}

Status ReadCpuMoe(const WeightStore& w, const std::string& layer_prefix,
                  const MoeTensorNames& names, const MoeRouting& routing, int hidden,
                  int intermediate, int shared_intermediate, CpuMoe* out,
                  const CpuMlp::Gate& gate) {
  const std::string p = layer_prefix + names.block;
  const int64_t E = routing.num_experts;
  out->routing = routing;
  LLM_RETURN_IF_ERROR(w.ReadF32(p + names.router + ".weight", {E, hidden}, &out->router));
  out->router_bias.clear();
  if (names.router_bias) {
    LLM_RETURN_IF_ERROR(w.ReadF32(p + names.router + ".bias", {E}, &out->router_bias));
  }
  out->selection_bias.clear();
  if (!names.selection_bias.empty()) {
    LLM_RETURN_IF_ERROR(
        w.ReadF32(p + names.router + "." + names.selection_bias, {E}, &out->selection_bias));
  }
  out->experts.assign(E, CpuMlp());
  if (names.stacked_experts) {
    LLM_RETURN_IF_ERROR(
        ReadStackedExperts(w, p + names.experts + ".", names, E, hidden, intermediate, out));
    for (CpuMlp& m : out->experts) m.gate = gate;
  } else {
    for (int64_t e = 0; e < E; ++e) {
      LLM_RETURN_IF_ERROR(ReadCpuMlp(w, p + names.experts + "." + std::to_string(e) + ".",
                                     names.expert, hidden, intermediate, names.expert_bias,
                                     &out->experts[e], gate));
    }
  }
  out->shared = CpuMlp();
  if (shared_intermediate > 0) {
    LLM_RETURN_IF_ERROR(ReadCpuMlp(w, p + names.shared + ".", names.expert, hidden,
                                   shared_intermediate, false, &out->shared));
  }
  return Status::Ok();
}

}  // namespace llm
