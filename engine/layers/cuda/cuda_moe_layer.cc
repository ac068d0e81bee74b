#include "engine/layers/cuda/cuda_moe_layer.h"

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "base/dtype.h"
#include "engine/layers/cuda/cuda_fp8_gemm.h"
#include "engine/layers/cuda/cuda_weights.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/moe/moe_ops.h"
#include "kernels/cuda/ops/fp8_quant.h"

namespace llm {

namespace {

// One grouped-GEMM instance serves a GEMM's routed and shared experts: the same dtype, and block
// scales for both or neither.
bool SameKernelForm(const CudaLinear& routed, const CudaLinear& shared) {
  auto blocks = [](const CudaLinear& l) { return l.quant() == WeightQuant::kFp8Block; };
  return routed.fp8() == shared.fp8() && blocks(routed) == blocks(shared);
}

}  // namespace

cuda::MoeRouteArgs MoeRouteArgsOf(const MoeRouting& r) {
  cuda::MoeRouteArgs a;
  a.num_experts = r.num_experts;
  a.top_k = r.top_k;
  a.sigmoid = r.scoring == MoeRouting::Scoring::kSigmoid;
  a.softmax_of_topk = r.scoring == MoeRouting::Scoring::kSoftmaxOfTopK;
  a.groups = r.groups == MoeRouting::Groups::kNone           ? 0
             : r.groups == MoeRouting::Groups::kGroupLimited ? 1
                                                             : 2;
  a.n_group = r.n_group;
  a.topk_group = r.topk_group;
  a.weigh_unbiased = r.weigh_unbiased;
  a.normalize = r.normalize;
  a.norm_eps = r.norm_eps;
  a.scaling = r.scaling;
  return a;
}

Status CudaMoeLayer::Check(const MoeRouting& r, int hidden, int inter, int shared_inter,
                           const CpuMlp::Gate& gate, bool mxfp4_experts) {
  const std::string what = "CUDA MoE layer: ";
  if (gate.activation != CpuMlp::Activation::kSilu &&
      gate.activation != CpuMlp::Activation::kClampedSwiGlu) {
    return InvalidArgument(what + "the experts' activation (SiLU or the clamped SwiGLU only)");
  }
  if (r.num_experts < 1 || r.num_experts > cuda::kMoeRouteMaxExperts) {
    return InvalidArgument(what + std::to_string(r.num_experts) + " routed experts (1.." +
                           std::to_string(cuda::kMoeRouteMaxExperts) + " supported)");
  }
  if (r.top_k < 1 || r.top_k > std::min(r.num_experts, cuda::kMoeRouteMaxTopK)) {
    return InvalidArgument(what + "num_experts_per_tok " + std::to_string(r.top_k) +
                           " (1..min(experts, " + std::to_string(cuda::kMoeRouteMaxTopK) + "))");
  }
  if (r.groups != MoeRouting::Groups::kNone &&
      (r.n_group < 1 || r.n_group > cuda::kMoeRouteMaxGroups || r.num_experts % r.n_group != 0 ||
       r.topk_group < 1 || r.topk_group > r.n_group)) {
    return InvalidArgument(what + "n_group " + std::to_string(r.n_group) + " / topk_group " +
                           std::to_string(r.topk_group) + " over " + std::to_string(r.num_experts) +
                           " experts (n_group <= " + std::to_string(cuda::kMoeRouteMaxGroups) +
                           ", dividing the experts)");
  }
  const bool mx_ok = mxfp4_experts && shared_inter == 0 &&
                     cuda::MoeMxfp4ShapeOk(true, inter, hidden) &&
                     cuda::MoeMxfp4ShapeOk(false, hidden, inter);
  if (!mx_ok &&
      (!cuda::MoeGemmShapeOk(true, inter, hidden) || !cuda::MoeGemmShapeOk(false, hidden, inter))) {
    return InvalidArgument(what + "hidden " + std::to_string(hidden) + ", moe_intermediate " +
                           std::to_string(inter) +
                           ": the grouped GEMMs need hidden % 64 == 0 and intermediate % 64 == 0");
  }
  if (shared_inter < 0 || shared_inter % cuda::kMoeGemmK != 0) {
    return InvalidArgument(what + "shared experts' intermediate " + std::to_string(shared_inter) +
                           ": the grouped GEMMs need a multiple of 64");
  }
  return Status::Ok();
}

Status CudaMoeLayer::Load(Bf16WeightLoader& loader, const WeightStore* weights,
                          const CudaLinearOps& ops, WeightQuant quant, const std::string& p,
                          const MoeTensorNames& n, CudaMoeWeights* w, bool fp8_checkpoint) const {
  // Stacked experts the MXFP4 GEMMs may keep: LoadStacked checks the bf16 GEMMs' shapes where
  // it dequantizes them instead.
  const bool mxfp4_possible = n.stacked_experts && mxfp4_ != Mxfp4::kDequantize;
  LLM_RETURN_IF_ERROR(Check(r_, hidden_, inter_, shared_inter_, gate_, mxfp4_possible));
  const int64_t h = hidden_, E = r_.num_experts, I = inter_;
  const float wstd = 0.02f;
  // The router in fp32: its bf16 values widened exactly (through the host, once at load).
  {
    DeviceBuffer bf;
    LLM_RETURN_IF_ERROR(loader.Load({p + n.router + ".weight"}, {{E, h}}, 0, wstd, &bf));
    std::vector<uint16_t> hb(E * h);
    GPU_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the loader's stream filled or uploaded it
    GPU_RETURN_IF_ERROR(cudaMemcpy(hb.data(), bf.ptr, hb.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(hb.size());
    for (size_t i = 0; i < hb.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(hb[i]) << 16;
      std::memcpy(&f[i], &bits, 4);
    }
    LLM_RETURN_IF_ERROR(w->router.Alloc(f.size() * 4));
    GPU_RETURN_IF_ERROR(cudaMemcpy(w->router.ptr, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  }
  if (!n.selection_bias.empty()) {
    std::vector<float> bias(E, 0.0f);  // dummy weights: no correction
    if (!loader.dummy()) {
      LLM_RETURN_IF_ERROR(weights->ReadF32(p + n.router + "." + n.selection_bias, {E}, &bias));
    }
    LLM_RETURN_IF_ERROR(w->router_bias.Alloc(E * 4));
    GPU_RETURN_IF_ERROR(cudaMemcpy(w->router_bias.ptr, bias.data(), E * 4, cudaMemcpyHostToDevice));
  }
  if (n.router_bias) {
    std::vector<float> bias(E, 0.0f);
    if (!loader.dummy()) LLM_RETURN_IF_ERROR(weights->ReadF32(p + n.router + ".bias", {E}, &bias));
    LLM_RETURN_IF_ERROR(w->logit_bias.Alloc(E * 4));
    GPU_RETURN_IF_ERROR(cudaMemcpy(w->logit_bias.ptr, bias.data(), E * 4, cudaMemcpyHostToDevice));
  }
  std::vector<std::string> gu_names, down_names;
  std::vector<std::vector<int64_t>> gu_shapes, down_shapes;
  for (int64_t e = 0; e < E && !n.stacked_experts; ++e) {
    const std::string ep = p + n.experts + "." + std::to_string(e) + ".";
    gu_names.insert(gu_names.end(), {ep + n.expert.gate + ".weight", ep + n.expert.up + ".weight"});
    gu_shapes.insert(gu_shapes.end(), {{I, h}, {I, h}});
    down_names.push_back(ep + n.expert.down + ".weight");
    down_shapes.push_back({h, I});
  }
  const std::string gu_name = p + n.experts + ".gate_up_proj",
                    down_name = p + n.experts + ".down_proj";
  const bool keep_fp8 = fp8_checkpoint && !n.stacked_experts && weights != nullptr;
  if (n.expert_bias && !n.stacked_experts) {
    return InvalidArgument("CUDA MoE layer: per-expert tensors with biases");
  }
  if (mxfp4_ == Mxfp4::kKeep && !n.stacked_experts) {
    return InvalidArgument("moe_weight_dtype mxfp4: " + p +
                           " has per-expert tensors, not MXFP4 stacked experts");
  }
  if (keep_fp8) {
    LLM_RETURN_IF_ERROR(w->gate_up.LoadCheckpoint(ops, *weights, loader, gu_names, gu_shapes,
                                                  gu_name, quant, static_cast<int>(E)));
    LLM_RETURN_IF_ERROR(w->down.LoadCheckpoint(ops, *weights, loader, down_names, down_shapes,
                                               down_name, quant, static_cast<int>(E)));
  } else {
    if (n.stacked_experts) {
      LLM_RETURN_IF_ERROR(LoadStacked(loader, weights, p, n, quant, w));
    } else {
      LLM_RETURN_IF_ERROR(loader.Load(gu_names, gu_shapes, 0, wstd, w->gate_up.bf16_target()));
      LLM_RETURN_IF_ERROR(loader.Load(down_names, down_shapes, 0, wstd, w->down.bf16_target()));
    }
    if (!w->mxfp4) {
      LLM_RETURN_IF_ERROR(w->gate_up.Quantize(ops, quant, static_cast<int>(2 * I), hidden_,
                                              static_cast<int>(E), gu_name));
      LLM_RETURN_IF_ERROR(
          w->down.Quantize(ops, quant, hidden_, inter_, static_cast<int>(E), down_name));
    }
  }
  if (shared_inter_ > 0) {
    LLM_RETURN_IF_ERROR(w->shared.Load(loader, ops, quant, p + n.shared + ".", hidden_,
                                       shared_inter_, keep_fp8 ? weights : nullptr));
  }
  const CudaLinear* pairs[2][2] = {{&w->gate_up, &w->shared.gate_up}, {&w->down, &w->shared.down}};
  for (int i = 0; i < 2; ++i) {
    const CudaLinear& routed = *pairs[i][0];
    const CudaLinear& shared = *pairs[i][1];
    if (shared_inter_ > 0 && !SameKernelForm(routed, shared)) {
      return InvalidArgument("CUDA MoE layer, " + p + ": the routed experts' " +
                             (i == 0 ? "gate / up" : "down") + " weights are " +
                             WeightQuantName(routed.quant()) + " and the shared experts' " +
                             WeightQuantName(shared.quant()) + " (the grouped GEMM runs both)");
    }
  }
  LLM_RETURN_IF_ERROR(ChooseActivations(p, w));
  const bool static_input =
      w->gate_up.input() == Fp8Input::kStatic || w->down.input() == Fp8Input::kStatic;
  if (keep_fp8 && !w->w8a8 && static_input) {
    spdlog::info(
        "CUDA MoE layer, {}: the experts' activations stay bf16 (fp8 weights only); the "
        "checkpoint's static input_scale is not applied",
        p);
  } else if (keep_fp8 && w->w8a8 && static_input && w8a8_min_tokens_ > 0) {
    spdlog::info(
        "CUDA MoE layer, {}: batches below {} tokens keep bf16 activations "
        "(moe_activation_dtype auto); the checkpoint's static input_scale applies from there",
        p, w8a8_min_tokens_);
  }
  return Status::Ok();
}

Status CudaMoeLayer::ChooseActivations(const std::string& where, CudaMoeWeights* w) const {
  w->w8a8 = false;
  if (activation_dtype_ != ActivationDtype::kBf16) {
    const std::string why = W8a8Unserved(*w);
    if (why.empty()) {
      w->w8a8 = true;
    } else if (activation_dtype_ == ActivationDtype::kFp8) {
      return InvalidArgument("moe_activation_dtype fp8, " + where + ": " + why);
    } else {
      spdlog::info("CUDA MoE layer, {}: the experts' activations stay bf16 ({})", where, why);
    }
  }
  return Status::Ok();
}

std::string CudaMoeLayer::W8a8Unserved(const CudaMoeWeights& w) const {
  if (w.mxfp4 || !w.gate_up.fp8() || !w.down.fp8()) {
    return "the routed experts' weights are not fp8";
  }
  if (!cuda::MoeW8a8ShapeOk(true, inter_, hidden_) ||
      !cuda::MoeW8a8ShapeOk(false, hidden_, inter_) ||
      (shared_inter_ > 0 && (!cuda::MoeW8a8ShapeOk(true, shared_inter_, hidden_) ||
                             !cuda::MoeW8a8ShapeOk(false, hidden_, shared_inter_)))) {
    return "hidden " + std::to_string(hidden_) + ", intermediate " + std::to_string(inter_) +
           ", shared " + std::to_string(shared_inter_) + ": the W8A8 GEMMs need multiples of 128";
  }
  if (!cuda::MoeW8a8Available()) {
    return "this device runs no e4m3 tensor-core binary of the W8A8 GEMMs (compute capability "
           "8.9 or later, built for it)";
  }
  return "";
}

void QuantizeFp8RowsFor(const CudaLinear& lin, const void* x, int rows, int cols,
                        const cuda::Fp8Rows& q, cudaStream_t stream) {
  if (lin.static_input_scale() != nullptr) {
    cuda::LaunchQuantizeRowsStaticFp8(x, rows, cols, lin.static_input_scale(), q, stream);
  } else {
    cuda::LaunchQuantizeRowsFp8(x, rows, cols, q, stream);
  }
}

cuda::MoeGemmScales MoeGemmScalesOf(const CudaLinear& lin, int rows_per_expert, int k) {
  cuda::MoeGemmScales s;
  s.scale = lin.scales();
  switch (lin.quant()) {
    case WeightQuant::kBf16:
      break;
    case WeightQuant::kFp8PerTensor:  // [groups][kScaleSlot]; one group: one scale for all
      s.expert_stride = lin.groups() > 1 ? CudaLinear::kScaleSlot : 0;
      break;
    case WeightQuant::kFp8PerChannel:  // [E * rows]
      s.expert_stride = rows_per_expert;
      s.row_stride = 1;
      break;
    case WeightQuant::kFp8Block:  // [E * rows / 128][Fp8BlockLd(k)], rows whole blocks
      s.block_ld = Fp8BlockLd(k);
      s.expert_stride = rows_per_expert / 128 * s.block_ld;
      break;
  }
  return s;
}

namespace {

Status UploadF32(const std::vector<float>& v, DeviceBuffer* out) {
  LLM_RETURN_IF_ERROR(out->Alloc(v.size() * 4));
  GPU_RETURN_IF_ERROR(cudaMemcpy(out->ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status UploadBf16(const std::vector<float>& v, DeviceBuffer* out) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = F32ToBf16(v[i]);
  LLM_RETURN_IF_ERROR(out->Alloc(b.size() * 2));
  GPU_RETURN_IF_ERROR(cudaMemcpy(out->ptr, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  return Status::Ok();
}

// rows [E][2 I][cols] with gate row i at 2 i and up row i at 2 i + 1 (the checkpoint's) -> gate
// rows [0, I) then up rows [I, 2 I) per expert (the grouped GEMM's).
std::vector<float> SplitInterleaved(const std::vector<float>& v, int64_t E, int64_t I,
                                    int64_t cols) {
  std::vector<float> out(v.size());
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t dst = (r % 2 == 0 ? r / 2 : I + r / 2);
      std::copy_n(v.begin() + (e * 2 * I + r) * cols, cols, out.begin() + (e * 2 * I + dst) * cols);
    }
  }
  return out;
}

}  // namespace

Status CudaMoeLayer::LoadStacked(Bf16WeightLoader& loader, const WeightStore* weights,
                                 const std::string& p, const MoeTensorNames& n, WeightQuant quant,
                                 CudaMoeWeights* w) const {
  const int64_t h = hidden_, E = r_.num_experts, I = inter_;
  const std::string gu = p + n.experts + "." + n.expert.gate,
                    down = p + n.experts + "." + n.expert.down;
  bool kept = false;
  LLM_RETURN_IF_ERROR(LoadMxfp4(weights, gu, down, loader.dummy(), quant, w, &kept));
  if (kept) {
    if (!n.expert_bias) return Status::Ok();
    if (loader.dummy()) {
      LLM_RETURN_IF_ERROR(UploadF32(std::vector<float>(E * 2 * I, 0.0f), &w->gate_up_bias));
      return UploadF32(std::vector<float>(E * h, 0.0f), &w->down_bias);
    }
    std::vector<float> b;
    LLM_RETURN_IF_ERROR(weights->ReadF32(gu + "_bias", {E, 2 * I}, &b));
    LLM_RETURN_IF_ERROR(UploadF32(SplitInterleaved(b, E, I, 1), &w->gate_up_bias));
    LLM_RETURN_IF_ERROR(weights->ReadF32(down + "_bias", {E, h}, &b));
    return UploadF32(b, &w->down_bias);
  }
  // bf16 experts (dequantized, or stored so): the bf16 grouped GEMMs' shapes.
  LLM_RETURN_IF_ERROR(Check(r_, hidden_, inter_, shared_inter_, gate_));
  if (loader.dummy()) {
    LLM_RETURN_IF_ERROR(loader.Load({gu}, {{E * 2 * I, h}}, 0, 0.02f, w->gate_up.bf16_target()));
    LLM_RETURN_IF_ERROR(loader.Load({down}, {{E * h, I}}, 0, 0.02f, w->down.bf16_target()));
    if (n.expert_bias) {
      LLM_RETURN_IF_ERROR(UploadF32(std::vector<float>(E * 2 * I, 0.0f), &w->gate_up_bias));
      LLM_RETURN_IF_ERROR(UploadF32(std::vector<float>(E * h, 0.0f), &w->down_bias));
    }
    return Status::Ok();
  }
  std::vector<float> m;
  LLM_RETURN_IF_ERROR(ReadExpertMatrix(*weights, gu, E, h, 2 * I, &m));  // [E, 2 I, h]
  LLM_RETURN_IF_ERROR(UploadBf16(SplitInterleaved(m, E, I, h), w->gate_up.bf16_target()));
  LLM_RETURN_IF_ERROR(ReadExpertMatrix(*weights, down, E, I, h, &m));  // [E, h, I]
  LLM_RETURN_IF_ERROR(UploadBf16(m, w->down.bf16_target()));
  if (n.expert_bias) {
    std::vector<float> b;
    LLM_RETURN_IF_ERROR(weights->ReadF32(gu + "_bias", {E, 2 * I}, &b));
    LLM_RETURN_IF_ERROR(UploadF32(SplitInterleaved(b, E, I, 1), &w->gate_up_bias));
    LLM_RETURN_IF_ERROR(weights->ReadF32(down + "_bias", {E, h}, &b));
    LLM_RETURN_IF_ERROR(UploadF32(b, &w->down_bias));
  }
  return Status::Ok();
}

Status CudaMoeLayer::LoadMxfp4(const WeightStore* weights, const std::string& gate_up,
                               const std::string& down, bool dummy, WeightQuant quant,
                               CudaMoeWeights* w, bool* kept) const {
  *kept = false;
  if (mxfp4_ == Mxfp4::kDequantize) return Status::Ok();
  const bool stored = dummy ? mxfp4_ == Mxfp4::kKeep
                            : weights->Has(gate_up + "_blocks") && weights->Has(down + "_blocks");
  const std::string what = "moe_weight_dtype mxfp4: ";
  if (!stored) {
    if (mxfp4_ == Mxfp4::kKeep) {
      return InvalidArgument(what + gate_up + " is not stored as MXFP4 (no _blocks / _scales)");
    }
    return Status::Ok();
  }
  // What the MXFP4 grouped GEMMs do not serve: refused under kKeep, dequantized under kAuto.
  auto unserved = [&](const std::string& why) -> Status {
    if (mxfp4_ == Mxfp4::kKeep) return InvalidArgument(what + why);
    spdlog::info("CUDA MoE layer: MXFP4 experts dequantized to bf16 ({})", why);
    return Status::Ok();
  };
  // weight_dtype fp8 quantizes the experts only where they are not kept as stored: an explicit
  // mxfp4 is the experts' own choice, and fp8 then applies to the other projections.
  if (quant != WeightQuant::kBf16 && mxfp4_ != Mxfp4::kKeep) {
    return unserved("weight_dtype fp8 quantizes the experts (moe_weight_dtype mxfp4 keeps them)");
  }
  if (shared_inter_ > 0) return unserved("shared experts beside MXFP4 experts");
  if (!cuda::MoeMxfp4ShapeOk(true, inter_, hidden_) ||
      !cuda::MoeMxfp4ShapeOk(false, hidden_, inter_)) {
    return unserved("hidden " + std::to_string(hidden_) + ", intermediate " +
                    std::to_string(inter_) +
                    " (the MXFP4 GEMMs need hidden % 64 == 0 and "
                    "intermediate % 32 == 0)");
  }
  const int64_t E = r_.num_experts, H = hidden_, I = inter_;
  struct Part {
    const std::string& name;
    int64_t rows, k;
    bool split;
    DeviceBuffer *values, *scales;
  };
  const Part parts[2] = {{gate_up, 2 * I, H, true, &w->mx_gate_up, &w->mx_gate_up_scales},
                         {down, H, I, false, &w->mx_down, &w->mx_down_scales}};
  std::vector<std::vector<uint8_t>> values(2), scales(2);
  for (int i = 0; i < 2; ++i) {
    const Part& pt = parts[i];
    const int64_t groups = pt.k / 32;
    if (dummy) {  // deterministic bytes; scales 2^-7 (weights of magnitude 0.004..0.05)
      std::vector<uint8_t> b(static_cast<size_t>(E * pt.rows * groups * 16)),
          sc(static_cast<size_t>(E * pt.rows * groups), 120);
      for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<uint8_t>((j * 2654435761u) >> 13);
      cuda::PackMoeMxfp4(b.data(), sc.data(), E, pt.rows, pt.k, pt.split, &values[i], &scales[i]);
      continue;
    }
    LLM_ASSIGN_OR_RETURN(const TensorView* b,
                         weights->GetWithShape(pt.name + "_blocks", {E, pt.rows, groups, 16}));
    LLM_ASSIGN_OR_RETURN(const TensorView* sc,
                         weights->GetWithShape(pt.name + "_scales", {E, pt.rows, groups}));
    for (const TensorView* v : {b, sc}) {
      if (v->dtype != DType::kU8) {
        return InvalidArgument("MXFP4 tensor '" + v->name + "' has dtype " + DTypeName(v->dtype) +
                               "; expected uint8");
      }
    }
    const auto* sb = reinterpret_cast<const uint8_t*>(sc->data);
    const size_t n = static_cast<size_t>(E * pt.rows * groups);
    const auto bad = std::find_if_not(sb, sb + n, cuda::MoeMxfp4ScaleOk);
    if (bad != sb + n) {
      return unserved(pt.name + "_scales holds the exponent " + std::to_string(*bad) +
                      " (the MXFP4 GEMMs widen 2..252 exactly)");
    }
    cuda::PackMoeMxfp4(reinterpret_cast<const uint8_t*>(b->data), sb, E, pt.rows, pt.k, pt.split,
                       &values[i], &scales[i]);
  }
  for (int i = 0; i < 2; ++i) {
    for (auto [v, buf] :
         {std::pair{&values[i], parts[i].values}, std::pair{&scales[i], parts[i].scales}}) {
      LLM_RETURN_IF_ERROR(buf->Alloc(v->size()));
      GPU_RETURN_IF_ERROR(cudaMemcpy(buf->ptr, v->data(), v->size(), cudaMemcpyHostToDevice));
    }
  }
  w->mxfp4 = true;
  *kept = true;
  return Status::Ok();
}

Status CudaMoeLayer::Reserve(int rows, CudaMoeScratch* s) const {
  if (rows <= s->cap) return Status::Ok();
  const size_t T = rows, H = hidden_, E = r_.num_experts, K = r_.top_k, I = inter_;
  const size_t S = T * K, SI = shared_inter_;
  // 16-row tiles: the most tiles any tile size makes (the MXFP4 GEMMs' 32 and 64 make fewer).
  const int max_tiles =
      cuda::MoeMaxTiles(static_cast<int>(S), static_cast<int>(E), SI > 0 ? rows : 0);
  LLM_RETURN_IF_ERROR(s->x_f32.Alloc(T * H * 4));
  LLM_RETURN_IF_ERROR(s->logits.Alloc(T * E * 4));
  LLM_RETURN_IF_ERROR(s->topk_ids.Alloc(S * 4));
  LLM_RETURN_IF_ERROR(s->topk_w.Alloc(S * 4));
  LLM_RETURN_IF_ERROR(s->sorted_token.Alloc(S * 4));
  LLM_RETURN_IF_ERROR(s->slot_of.Alloc(S * 4));
  LLM_RETURN_IF_ERROR(s->tiles.Alloc(static_cast<size_t>(max_tiles) * 3 * 4 + 16));
  LLM_RETURN_IF_ERROR(s->num_tiles.Alloc(16));
  // The fused routing's partial sums and ticket (small batches; the ticket starts at zero and
  // every launch leaves it there).
  const int fused_rows = std::min(rows, cuda::kMoeRouteFusedMaxTokens);
  LLM_RETURN_IF_ERROR(s->route_partials.Alloc(
      static_cast<size_t>(cuda::MoeRouteFusedPartials(fused_rows, r_.num_experts, hidden_)) * 4));
  if (s->route_ticket.ptr == nullptr) {
    LLM_RETURN_IF_ERROR(s->route_ticket.Alloc(16));
    GPU_RETURN_IF_ERROR(cudaMemset(s->route_ticket.ptr, 0, 16));
  }
  if (s->combine_tickets.ptr == nullptr) {  // the down GEMM's combine (small batches)
    const size_t bytes = static_cast<size_t>(cuda::MoeCombineTickets(hidden_)) * 4;
    LLM_RETURN_IF_ERROR(s->combine_tickets.Alloc(bytes));
    GPU_RETURN_IF_ERROR(cudaMemset(s->combine_tickets.ptr, 0, bytes));
  }
  // The large-batch path: with fp8 activations its cuBLASLt GEMMs read and write rows past
  // their operands' ends (kLargeFp8SlackRows).
  const bool large = S >= static_cast<size_t>(large_batch_slots_) * E;
  const size_t slack =
      large && activation_dtype_ != ActivationDtype::kBf16 ? kLargeFp8SlackRows : 0;
  LLM_RETURN_IF_ERROR(s->act.Alloc(S * I * 2));
  LLM_RETURN_IF_ERROR(s->y.Alloc((S + slack) * H * 2));
  if (SI > 0) {
    LLM_RETURN_IF_ERROR(s->shared_act.Alloc(T * SI * 2));
    LLM_RETURN_IF_ERROR(s->shared_out.Alloc((T + slack) * H * 2));
  }
  if (activation_dtype_ != ActivationDtype::kBf16) {
    // Scales per token and 128-wide group (the larger form), at least one per row.
    auto groups = [](size_t k) { return std::max<size_t>(1, (k + 127) / 128); };
    LLM_RETURN_IF_ERROR(s->xq.Alloc(T * H));
    LLM_RETURN_IF_ERROR(s->xq_scale.Alloc(T * groups(H) * 4));
    LLM_RETURN_IF_ERROR(s->actq.Alloc(S * I));
    LLM_RETURN_IF_ERROR(s->actq_scale.Alloc(S * groups(I) * 4));
    if (SI > 0) {
      LLM_RETURN_IF_ERROR(s->shared_xq.Alloc(T * H));
      LLM_RETURN_IF_ERROR(s->shared_xq_scale.Alloc(T * groups(H) * 4));
      LLM_RETURN_IF_ERROR(s->shared_actq.Alloc(T * SI));
      LLM_RETURN_IF_ERROR(s->shared_actq_scale.Alloc(T * groups(SI) * 4));
    }
  }
  s->cap = rows;
  if (large) {
    LLM_RETURN_IF_ERROR(s->gu.Alloc(std::max((S + slack) * 2 * I, (T + slack) * 2 * SI) * 2));
    LLM_RETURN_IF_ERROR(s->offsets.Alloc((E + 1) * 4));
    LLM_RETURN_IF_ERROR(s->ptrs.Alloc(3 * E * sizeof(void*)));
    if (slack > 0) {
      LLM_RETURN_IF_ERROR(s->large_q.Alloc((S + slack) * std::max({H, I, SI})));
      // Room for 128x128 block-scaled experts' scales, one per row and 128-wide block, each
      // expert's rows rounded up (cuda::LaunchMoeQuantizeBlocks128ByExpert); the layer does not
      // know its weights' form here, and per-row scales need a blocks-th of it.
      const size_t blocks = (std::max({H, I, SI}) + 127) / 128;
      LLM_RETURN_IF_ERROR(s->large_q_scale.Alloc((S + slack + 128 * E) * blocks * 4));
      const std::vector<float> ones(S + slack, 1.0f);
      LLM_RETURN_IF_ERROR(s->large_ones.Alloc(ones.size() * 4));
      GPU_RETURN_IF_ERROR(
          cudaMemcpy(s->large_ones.ptr, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    }
    s->large_cap = rows;
  }
  return Status::Ok();
}

bool CudaMoeLayer::UsesFusedCombine(int T) const {
  return T <= std::min(fused_combine_max_tokens_, cuda::kMoeFusedCombineMaxTokens);
}

bool CudaMoeLayer::UsesGemv(int T, const CudaMoeWeights& w) const {
  using cuda::MoeGemvShapeOk;
  using cuda::MoeGemvWeights;
  if (T > gemv_max_tokens_ || !cuda::MoeGemvBatchOk(T, r_.top_k, r_.num_experts)) return false;
  if (UsesW8a8(T, w)) return false;  // fp8 activations: the W8A8 GEMMs
  if (w.mxfp4) {  // routed experts only (LoadMxfp4 keeps none beside shared experts)
    return MoeGemvShapeOk(MoeGemvWeights::kMxfp4, inter_, hidden_) &&
           MoeGemvShapeOk(MoeGemvWeights::kMxfp4, hidden_, inter_);
  }
  // Each GEMM's form (the shared experts have their routed GEMM's: Run checks SameKernelForm).
  const MoeGemvWeights gu = w.gate_up.fp8() ? MoeGemvWeights::kFp8 : MoeGemvWeights::kBf16;
  const MoeGemvWeights dn = w.down.fp8() ? MoeGemvWeights::kFp8 : MoeGemvWeights::kBf16;
  const bool shared_ok = w.shared.inter == 0 || (MoeGemvShapeOk(gu, shared_inter_, hidden_) &&
                                                 MoeGemvShapeOk(dn, hidden_, shared_inter_));
  return shared_ok && MoeGemvShapeOk(gu, inter_, hidden_) && MoeGemvShapeOk(dn, hidden_, inter_);
}

bool CudaMoeLayer::UsesFusedRoute(int T) const {
  return T <= fused_route_max_tokens_ && cuda::MoeRouteFusedOk(T, hidden_);
}

cuda::MoeGemmArgs CudaMoeLayer::GateUpArgs(const CudaMoeWeights& w, CudaMoeScratch* s,
                                           int max_tiles) const {
  cuda::MoeGemmArgs g;
  g.sorted_token = s->sorted_token.as<int32_t>();
  g.w = w.gate_up.data();
  g.w_scale = MoeGemmScalesOf(w.gate_up, 2 * inter_, hidden_);
  g.silu_mul = true;
  g.bias = w.gate_up_bias.ptr ? w.gate_up_bias.as<float>() : nullptr;
  if (gate_.activation == CpuMlp::Activation::kClampedSwiGlu) {
    g.swiglu_limit = gate_.swiglu_limit;
    g.swiglu_alpha = gate_.swiglu_alpha;
  }
  g.n_out = inter_;
  g.k = hidden_;
  g.tiles = s->tiles.as<int32_t>();
  g.num_tiles = s->num_tiles.as<int32_t>();
  g.max_tiles = max_tiles;
  g.out = s->act.ptr;
  return g;
}

Status CudaMoeLayer::RunTiled(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x,
                              int T, CudaMoeScratch* s, int max_tiles, int tile_rows,
                              void* combine_out, bool gemv) const {
  cudaStream_t stream = ops.stream;
  const bool shared = w.shared.inter > 0;
  cuda::MoeGemmArgs g = GateUpArgs(w, s, max_tiles);
  g.x = x;
  g.fp8 = w.gate_up.fp8();
  g.gemv_max_rows = T;  // an expert holds each token at most once; the dense group's T rows
  // The bf16 / fp8 GEMMs (MXFP4 below: its own tiled launcher) as GEMVs or tiles.
  auto launch = [&](const cuda::MoeGemmArgs& a, const char* which) -> Status {
    if (!gemv) {
      cuda::LaunchMoeGemm(a, stream);
      return Status::Ok();
    }
    if (!cuda::LaunchMoeGemv(a, stream)) {
      return Internal(std::string("CUDA MoE layer: the GEMV refused the ") + which + " GEMM");
    }
    return Status::Ok();
  };
  // The down GEMM's combine (combine_out set: a small batch), from the second GEMM on.
  cuda::MoeGemmArgs::Combine combine;
  if (combine_out != nullptr) {
    combine.slot_of = s->slot_of.as<int32_t>();
    combine.topk_w = s->topk_w.as<float>();
    combine.shared = shared ? s->shared_out.ptr : nullptr;
    combine.num_tokens = T;
    combine.top_k = r_.top_k;
    combine.tickets = s->combine_tickets.as<uint32_t>();
    combine.out = combine_out;
  }
  if (w.mxfp4) {  // routed experts only (LoadMxfp4 keeps none beside shared experts)
    g.w = w.mx_gate_up.ptr;
    g.mx_scales = w.mx_gate_up_scales.as<uint8_t>();
    g.mx_k_pad = cuda::MoeMxfp4KPad(hidden_);
    g.tile_rows = tile_rows;
    auto launch_mx = [&](const cuda::MoeGemmArgs& a) -> Status {
      if (gemv ? !cuda::LaunchMoeGemv(a, stream) : !cuda::LaunchMoeGemmMxfp4(a, stream)) {
        return Internal(std::string("CUDA MoE layer: no MXFP4 ") + (gemv ? "GEMV" : "GEMM") +
                        " for tiles of " + std::to_string(tile_rows) + " rows");
      }
      return Status::Ok();
    };
    LLM_RETURN_IF_ERROR(launch_mx(g));
    g.x = s->act.ptr;
    g.sorted_token = nullptr;
    g.w = w.mx_down.ptr;
    g.mx_scales = w.mx_down_scales.as<uint8_t>();
    g.mx_k_pad = cuda::MoeMxfp4KPad(inter_);
    g.silu_mul = false;
    g.bias = w.down_bias.ptr ? w.down_bias.as<float>() : nullptr;
    g.n_out = hidden_;
    g.k = inter_;
    g.out = s->y.ptr;
    g.combine = combine;
    g.tiles_before_wait = gemv;  // the GEMV: right after gate_up, which waited for the routing
    return launch_mx(g);
  }
  if (shared) {
    g.dense_x = x;
    g.dense_w = w.shared.gate_up.data();
    g.dense_w_scale = MoeGemmScalesOf(w.shared.gate_up, 2 * shared_inter_, hidden_);
    g.dense_n_out = shared_inter_;
    g.dense_k = hidden_;
    g.dense_out = s->shared_act.ptr;
  }
  LLM_RETURN_IF_ERROR(launch(g, "gate_up"));
  g.x = s->act.ptr;
  g.sorted_token = nullptr;
  g.w = w.down.data();
  g.w_scale = MoeGemmScalesOf(w.down, hidden_, inter_);
  g.fp8 = w.down.fp8();
  g.silu_mul = false;
  g.bias = w.down_bias.ptr ? w.down_bias.as<float>() : nullptr;
  g.n_out = hidden_;
  g.k = inter_;
  g.out = s->y.ptr;
  if (shared) {
    g.dense_x = s->shared_act.ptr;
    g.dense_w = w.shared.down.data();
    g.dense_w_scale = MoeGemmScalesOf(w.shared.down, hidden_, shared_inter_);
    g.dense_n_out = hidden_;
    g.dense_k = shared_inter_;
    g.dense_out = s->shared_out.ptr;
  }
  g.combine = combine;
  g.tiles_before_wait = gemv;  // the GEMV: right after gate_up, which waited for the routing
  return launch(g, "down");
}

namespace {

// x (bf16 [rows, cols]) into e4m3 q and its scales as the W8A8 GEMM beside `lin` reads them:
// per token and 128-wide group ([cols / 128][rows]) for 128x128 block weights; else with the
// checkpoint's static input_scale where `lin` has one (every row's scale that one), else per
// token. Sets the GEMM's scale operand and its leading dimension.
void QuantizeW8a8Input(const CudaLinear& lin, const void* x, int rows, int cols, void* q,
                       float* scale, const float** scale_out, int* scale_ld, cudaStream_t stream) {
  if (lin.quant() == WeightQuant::kFp8Block) {
    cuda::LaunchQuantizeBlocks128Fp8(x, rows, cols, q, scale, rows, stream);
    *scale_ld = rows;
  } else {
    QuantizeFp8RowsFor(lin, x, rows, cols, cuda::Fp8Rows{q, scale}, stream);
    *scale_ld = 0;
  }
  *scale_out = scale;
}

}  // namespace

Status CudaMoeLayer::RunTiledW8a8(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x,
                                  int T, CudaMoeScratch* s, int max_tiles, int tile_rows) const {
  cudaStream_t stream = ops.stream;
  const bool shared = w.shared.inter > 0;
  const int S = T * r_.top_k;
  cuda::MoeGemmArgs g = GateUpArgs(w, s, max_tiles);
  // x once per token (the GEMM gathers its rows), which the shared experts read too.
  QuantizeW8a8Input(w.gate_up, x, T, hidden_, s->xq.ptr, s->xq_scale.as<float>(), &g.x_scale,
                    &g.x_scale_ld, stream);
  g.x = s->xq.ptr;
  g.fp8 = true;
  g.tile_rows = tile_rows;
  if (shared) {
    // The shared experts' x: the routed experts' unless either has its own static input scale.
    if (w.gate_up.static_input_scale() != nullptr ||
        w.shared.gate_up.static_input_scale() != nullptr) {
      QuantizeW8a8Input(w.shared.gate_up, x, T, hidden_, s->shared_xq.ptr,
                        s->shared_xq_scale.as<float>(), &g.dense_x_scale, &g.dense_x_scale_ld,
                        stream);
      g.dense_x = s->shared_xq.ptr;
    } else {
      g.dense_x = s->xq.ptr;
      g.dense_x_scale = g.x_scale;
      g.dense_x_scale_ld = g.x_scale_ld;
    }
    g.dense_w = w.shared.gate_up.data();
    g.dense_w_scale = MoeGemmScalesOf(w.shared.gate_up, 2 * shared_inter_, hidden_);
    g.dense_n_out = shared_inter_;
    g.dense_k = hidden_;
    g.dense_out = s->shared_act.ptr;
  }
  if (!cuda::LaunchMoeGemmW8a8(g, stream)) {
    return Internal("CUDA MoE layer: the W8A8 gate_up GEMM refused its operands");
  }
  // The activations: one row per slot (S), and the shared experts' (T).
  cuda::MoeGemmArgs d = g;
  QuantizeW8a8Input(w.down, s->act.ptr, S, inter_, s->actq.ptr, s->actq_scale.as<float>(),
                    &d.x_scale, &d.x_scale_ld, stream);
  d.x = s->actq.ptr;
  d.sorted_token = nullptr;
  d.w = w.down.data();
  d.w_scale = MoeGemmScalesOf(w.down, hidden_, inter_);
  d.silu_mul = false;
  d.bias = w.down_bias.ptr ? w.down_bias.as<float>() : nullptr;
  d.swiglu_limit = 0.0f;
  d.n_out = hidden_;
  d.k = inter_;
  d.out = s->y.ptr;
  if (shared) {
    QuantizeW8a8Input(w.shared.down, s->shared_act.ptr, T, shared_inter_, s->shared_actq.ptr,
                      s->shared_actq_scale.as<float>(), &d.dense_x_scale, &d.dense_x_scale_ld,
                      stream);
    d.dense_x = s->shared_actq.ptr;
    d.dense_w = w.shared.down.data();
    d.dense_w_scale = MoeGemmScalesOf(w.shared.down, hidden_, shared_inter_);
    d.dense_n_out = hidden_;
    d.dense_k = shared_inter_;
    d.dense_out = s->shared_out.ptr;
  }
  if (!cuda::LaunchMoeGemmW8a8(d, stream)) {
    return Internal("CUDA MoE layer: the W8A8 down GEMM refused its operands");
  }
  return Status::Ok();
}

Status CudaMoeLayer::Run(const CudaLinearOps& ops, const CudaMoeWeights& w, const void* x, int T,
                         CudaMoeScratch* s, void* out, const Trace& trace) const {
  if (T == 0) return Status::Ok();
  if (T > s->cap) return Internal("CUDA MoE layer: scratch reserved for fewer rows");
  cudaStream_t stream = ops.stream;
  const int E = r_.num_experts, K = r_.top_k, S = T * K;
  const bool shared = w.shared.inter > 0;
  if (shared && (w.shared.inter != shared_inter_ || !SameKernelForm(w.gate_up, w.shared.gate_up) ||
                 !SameKernelForm(w.down, w.shared.down))) {
    return Internal("CUDA MoE layer: shared experts of another size or dtype than the layer's");
  }
  const int dense_rows = shared ? T : 0;  // the shared experts: a dense group of every token
  // MXFP4 and W8A8 experts: tiles as large as the batch's rows per expert call for (decided from
  // T alone, so a captured graph replays the same choice); the bf16 / W8A16 GEMMs take 16-row
  // tiles.
  const bool w8a8 = UsesW8a8(T, w);
  const int tile_rows = w.mxfp4 || w8a8 ? cuda::MoeMxfp4TileRows(T, K, E) : cuda::kMoeTileRows;
  const int max_tiles = cuda::MoeMaxTiles(S, E, dense_rows, tile_rows);
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  GPU_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &cs));
  const bool capturing = cs != cudaStreamCaptureStatusNone;
  if (trace.out != nullptr && capturing) {
    return FailedPrecondition("the MoE routing trace cannot be recorded inside a CUDA graph");
  }
  const bool large = !capturing && T <= s->large_cap && TakesLargeBatchPath(T, w);

  cuda::MoeRouteArgs ra = MoeRouteArgsOf(r_);
  ra.logits = s->logits.as<float>();
  ra.bias = w.router_bias.ptr ? w.router_bias.as<float>() : nullptr;
  ra.logit_bias = w.logit_bias.ptr ? w.logit_bias.as<float>() : nullptr;
  ra.num_tokens = T;
  ra.topk_ids = s->topk_ids.as<int32_t>();
  ra.topk_w = s->topk_w.as<float>();

  cuda::MoePermuteArgs pa;
  pa.topk_ids = ra.topk_ids;
  pa.num_slots = S;
  pa.num_experts = E;
  pa.top_k = K;
  pa.dense_rows = dense_rows;
  pa.tile_rows = tile_rows;
  pa.sorted_token = s->sorted_token.as<int32_t>();
  pa.slot_of = s->slot_of.as<int32_t>();
  pa.tiles = s->tiles.as<int32_t>();
  pa.num_tiles = s->num_tiles.as<int32_t>();
  pa.expert_offsets = large ? s->offsets.as<int32_t>() : nullptr;
  if (UsesFusedRoute(T)) {  // router GEMM, routing and permutation in one launch
    cuda::MoeRouteFusedArgs fa;
    fa.x = s->x_f32.as<float>();
    fa.router = w.router.as<float>();
    fa.hidden = hidden_;
    fa.logits = s->logits.as<float>();
    fa.partials = s->route_partials.as<float>();
    fa.ticket = s->route_ticket.as<uint32_t>();
    fa.route = ra;
    fa.permute = pa;
    if (!cuda::LaunchMoeRouteFused(fa, stream)) {
      return Internal("CUDA MoE layer: no fused routing for " + std::to_string(T) + " tokens");
    }
  } else {
    // Router: fp32 input, fp32 weight, no TF32 (a flipped group-limited choice costs a whole
    // expert set).
    const float one = 1.0f, zero = 0.0f;
    BLAS_RETURN_IF_ERROR(cublasGemmEx(ops.blas, CUBLAS_OP_T, CUBLAS_OP_N, E, T, hidden_, &one,
                                      w.router.ptr, CUDA_R_32F, hidden_, s->x_f32.ptr, CUDA_R_32F,
                                      hidden_, &zero, s->logits.ptr, CUDA_R_32F, E,
                                      CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    cuda::LaunchMoeRoute(ra, stream);
    cuda::LaunchMoePermute(pa, stream);
  }
  // Small batches: the down GEMM's last tile per column block combines (no launch of its own;
  // the W8A8 GEMMs have no combine epilogue).
  const bool combined = !large && !w8a8 && UsesFusedCombine(T);
  if (large) {
    LLM_RETURN_IF_ERROR(RunLargeBatch(ops, w, x, T, s));
  } else if (w8a8) {
    if (s->xq.ptr == nullptr) {
      return Internal("CUDA MoE layer: fp8 activations without their scratch (Reserve)");
    }
    LLM_RETURN_IF_ERROR(RunTiledW8a8(ops, w, x, T, s, max_tiles, tile_rows));
  } else {
    LLM_RETURN_IF_ERROR(
        RunTiled(ops, w, x, T, s, max_tiles, tile_rows, combined ? out : nullptr, UsesGemv(T, w)));
  }
  if (!combined) {
    cuda::LaunchMoeCombine(s->y.ptr, pa.slot_of, ra.topk_w, shared ? s->shared_out.ptr : nullptr, T,
                           K, hidden_, out, stream);
  }

  if (trace.out != nullptr) {
    std::vector<int32_t> ids(S);
    GPU_RETURN_IF_ERROR(
        cudaMemcpyAsync(ids.data(), ra.topk_ids, S * 4, cudaMemcpyDeviceToHost, stream));
    GPU_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    for (int r = 0; r < T; ++r) {
      MoeRoutingDecision& rec = trace.out->emplace_back();
      rec.row = r;
      rec.position = trace.positions[r];
      rec.layer = trace.layer;
      rec.experts.assign(ids.begin() + r * K, ids.begin() + (r + 1) * K);
      std::sort(rec.experts.begin(), rec.experts.end());
    }
  }
  return Status::Ok();
}

}  // namespace llm
