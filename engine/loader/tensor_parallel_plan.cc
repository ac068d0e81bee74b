#include "engine/loader/tensor_parallel_plan.h"

#include <algorithm>

namespace llm {
namespace {

std::string Prefix(const TensorParallelOptions& o) {
  return "tensor_parallel_size " + std::to_string(o.size) + ": ";
}

// The checks every family shares: the size, the rank, the option refused, the checkpoint format.
Status CheckOptions(const ModelConfig& c, const TensorParallelOptions& o) {
  if (std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), o.size) ==
      std::end(kTensorParallelSizes)) {
    return InvalidArgument("tensor_parallel_size must be 1, 2, 4 or 8, got " +
                           std::to_string(o.size));
  }
  if (o.rank < 0 || o.rank >= o.size) {
    return InvalidArgument(Prefix(o) + "rank " + std::to_string(o.rank) + " is outside [0, " +
                           std::to_string(o.size) + ")");
  }
  if (o.expert_parallel) {
    return Unimplemented(Prefix(o) +
                         "expert parallelism is not implemented; the MoE layers split every "
                         "expert's intermediate dimension across the ranks");
  }
  // gpt-oss's MXFP4 experts are cut as stored (whole 32-value blocks); fp8 weights would need
  // their scales cut with them.
  if (c.quantization.quantized() && c.quantization.method != WeightQuantization::Method::kMxfp4) {
    return Unimplemented(Prefix(o) + "the pre-quantized checkpoint (quantization_config " +
                         c.quantization.quant_method +
                         ") is not split; tensor parallelism reads float checkpoints and "
                         "gpt-oss's MXFP4 experts only");
  }
  return Status::Ok();
}

Status CheckDivides(const TensorParallelOptions& o, const std::string& key, int value) {
  if (value % o.size == 0) return Status::Ok();
  return InvalidArgument(Prefix(o) + key + " " + std::to_string(value) + " is not divisible by it");
}

// The fields every family splits the same way: query heads, `kv` KV heads, vocabulary.
Status SplitHeadsAndVocab(const TensorParallelOptions& o, int kv, TensorParallelPlan* plan) {
  const ModelConfig& c = plan->model;
  ModelConfig& local = plan->local;
  LLM_RETURN_IF_ERROR(CheckDivides(o, "num_attention_heads", c.num_q_heads));
  if (kv >= o.size ? kv % o.size != 0 : o.size % kv != 0) {
    return InvalidArgument(Prefix(o) + "num_key_value_heads " + std::to_string(kv) +
                           " is neither a multiple nor a divisor of it");
  }
  local.num_q_heads = c.num_q_heads / o.size;
  local.num_kv_heads = std::max(kv / o.size, 1);
  plan->first_q_head = o.rank * local.num_q_heads;
  // Fewer KV heads than ranks: the rank's query heads all lie in one KV head's group.
  plan->first_kv_head =
      kv >= o.size ? o.rank * local.num_kv_heads : plan->first_q_head / (c.num_q_heads / kv);
  const int64_t rows = (c.vocab_size + o.size - 1) / o.size;
  local.vocab_size = static_cast<int>(rows);
  plan->vocab_begin = std::min<int64_t>(o.rank * rows, c.vocab_size);
  plan->vocab_rows = std::min<int64_t>(rows, c.vocab_size - plan->vocab_begin);
  return Status::Ok();
}

bool ArchitectureCovered(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
    case Architecture::kMixtral:
    case Architecture::kQwen3Moe:
    case Architecture::kGemma2:
    case Architecture::kGemma3:
    case Architecture::kGptOss:
      return true;
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      break;  // the DeepseekConfig plan
  }
  return false;
}

// "model.layers.12.mlp.down_proj.weight" -> 12; -1 outside the layers.
int LayerOf(const std::string& name) {
  static const std::string kLayers = "model.layers.";
  if (name.rfind(kLayers, 0) != 0) return -1;
  int layer = 0;
  size_t i = kLayers.size();
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i)
    layer = layer * 10 + name[i] - '0';
  return layer;
}

// The last two dotted components: "model.layers.0.self_attn.o_proj.weight" -> "o_proj.weight".
std::string RuleKey(const std::string& name) {
  const size_t last = name.rfind('.');
  if (last == std::string::npos || last == 0) return name;
  const size_t before = name.rfind('.', last - 1);
  return before == std::string::npos ? name : name.substr(before + 1);
}

}  // namespace

const std::vector<TensorRule>& TensorParallelRules() {
  using S = TensorSplit;
  static const std::vector<TensorRule> kRules = {
      // Embedding and LM head (tied or not).
      {"embed_tokens.weight", S::kVocab, 0},
      {"lm_head.weight", S::kVocab, 0},
      // Norms: the final one, the per-layer ones (Gemma's four), per-head q/k norms, MLA's.
      {"norm.weight", S::kReplicated, 0},
      {"input_layernorm.weight", S::kReplicated, 0},
      {"post_attention_layernorm.weight", S::kReplicated, 0},
      {"pre_feedforward_layernorm.weight", S::kReplicated, 0},
      {"post_feedforward_layernorm.weight", S::kReplicated, 0},
      {"q_norm.weight", S::kReplicated, 0},
      {"k_norm.weight", S::kReplicated, 0},
      {"q_a_layernorm.weight", S::kReplicated, 0},
      {"kv_a_layernorm.weight", S::kReplicated, 0},
      // Per-head K/V attention.
      {"q_proj.weight", S::kColumn, 0},
      {"q_proj.bias", S::kColumn, 0},
      {"k_proj.weight", S::kKvHeads, 0},
      {"k_proj.bias", S::kKvHeads, 0},
      {"v_proj.weight", S::kKvHeads, 0},
      {"v_proj.bias", S::kKvHeads, 0},
      // A static 8-bit KV cache's scales (kv_cache_quant.h's names): [kv heads] per head,
      // [kv heads * head_dim] or [kv heads, head_dim] per channel; each rank caches its KV heads.
      {"self_attn.k_scale", S::kKvHeads, 0},
      {"self_attn.v_scale", S::kKvHeads, 0},
      {"attn.k_scale", S::kKvHeads, 0},
      {"attn.v_scale", S::kKvHeads, 0},
      {"self_attn.cache_k_scale", S::kKvHeads, 0},
      {"self_attn.cache_v_scale", S::kKvHeads, 0},
      {"attn.cache_k_scale", S::kKvHeads, 0},
      {"attn.cache_v_scale", S::kKvHeads, 0},
      {"k_proj.output_scale", S::kKvHeads, 0},
      {"v_proj.output_scale", S::kKvHeads, 0},
      {"o_proj.weight", S::kRow, 1},
      {"o_proj.bias", S::kFirstRank, 0},
      {"self_attn.sinks", S::kColumn, 0},
      // DeepSeek's latent attention (q_proj and o_proj above): the down-projections replicated,
      // the per-head up-projections by head.
      {"q_a_proj.weight", S::kReplicated, 0},
      {"kv_a_proj_with_mqa.weight", S::kReplicated, 0},
      {"q_b_proj.weight", S::kColumn, 0},
      {"kv_b_proj.weight", S::kColumn, 0},
      {"self_attn.kv_scale", S::kReplicated, 0},  // the fp8 latent cache's scale (every rank's)
      // Gated MLPs: dense, every expert, shared experts (Llama names; Mixtral's w1 / w3 / w2).
      {"gate_proj.weight", S::kColumn, 0},
      {"gate_proj.bias", S::kColumn, 0},
      {"up_proj.weight", S::kColumn, 0},
      {"up_proj.bias", S::kColumn, 0},
      {"down_proj.weight", S::kRow, 1},
      {"down_proj.bias", S::kFirstRank, 0},
      {"w1.weight", S::kColumn, 0},
      {"w3.weight", S::kColumn, 0},
      {"w2.weight", S::kRow, 1},
      // Routers.
      {"gate.weight", S::kReplicated, 0},
      {"gate.e_score_correction_bias", S::kReplicated, 0},
      {"router.weight", S::kReplicated, 0},
      {"router.bias", S::kReplicated, 0},
      // gpt-oss's stacked experts: gate_up_proj [E, hidden, 2I], down_proj [E, I, hidden].
      {"experts.gate_up_proj", S::kColumn, 2},
      {"experts.gate_up_proj_bias", S::kColumn, 1},
      {"experts.down_proj", S::kRow, 1},
      {"experts.down_proj_bias", S::kFirstRank, 0},
      // ... stored as MXFP4: gate_up_proj_blocks [E, 2I, hidden / 32, 16] and _scales
      // [E, 2I, hidden / 32] by their (interleaved) output rows, down_proj_blocks
      // [E, hidden, I / 32, 16] and _scales [E, hidden, I / 32] by whole 32-value blocks of k.
      {"experts.gate_up_proj_blocks", S::kColumn, 1},
      {"experts.gate_up_proj_scales", S::kColumn, 1},
      {"experts.down_proj_blocks", S::kRow, 2},
      {"experts.down_proj_scales", S::kRow, 2},
  };
  return kRules;
}

StatusOr<TensorShard> TensorParallelPlan::ShardOf(const std::string& name,
                                                  const std::vector<int64_t>& shape) const {
  const std::string key = RuleKey(name);
  const auto it =
      std::find_if(rules.begin(), rules.end(), [&](const TensorRule& r) { return r.key == key; });
  if (it == rules.end()) {
    return InvalidArgument("tensor '" + name +
                           "' has no tensor-parallel rule (engine/loader/tensor_parallel_plan.h)");
  }
  TensorShard s;
  s.split = it->split;
  s.dim = it->dim;
  switch (it->split) {
    case TensorSplit::kReplicated:
      return s;
    case TensorSplit::kFirstRank:
      s.zeros = rank != 0;
      return s;
    default:
      break;
  }
  if (s.dim >= static_cast<int>(shape.size())) {
    return InvalidArgument("tensor '" + name + "' has no dimension " + std::to_string(s.dim) +
                           " to split");
  }
  const int64_t n = shape[s.dim];
  auto equal_parts = [&]() -> Status {
    if (n % size != 0) {
      return InvalidArgument("tensor '" + name + "': dimension " + std::to_string(s.dim) +
                             " of size " + std::to_string(n) + " does not split into " +
                             std::to_string(size) + " equal parts");
    }
    s.count = s.padded = n / size;
    s.begin = rank * s.count;
    return Status::Ok();
  };
  switch (it->split) {
    case TensorSplit::kColumn:
    case TensorSplit::kRow:
      LLM_RETURN_IF_ERROR(equal_parts());
      return s;
    case TensorSplit::kKvHeads: {
      const int kv = model.num_kv_heads;
      if (kv >= size) {
        LLM_RETURN_IF_ERROR(equal_parts());
        return s;
      }
      if (n % kv != 0) {
        return InvalidArgument("tensor '" + name + "': dimension " + std::to_string(s.dim) +
                               " of size " + std::to_string(n) + " is not " + std::to_string(kv) +
                               " KV heads");
      }
      s.count = s.padded = n / kv;
      s.begin = first_kv_head * s.count;
      return s;
    }
    case TensorSplit::kVocab:
      if (n != model.vocab_size) {
        return InvalidArgument("tensor '" + name + "' has " + std::to_string(n) +
                               " rows, not vocab_size " + std::to_string(model.vocab_size));
      }
      s.begin = vocab_begin;
      s.count = vocab_rows;
      s.padded = local.vocab_size;
      return s;
    default:
      return s;
  }
}

void ReplicateOProjBias(TensorParallelPlan* plan) {
  for (TensorRule& r : plan->rules) {
    if (r.key == "o_proj.bias") r.split = TensorSplit::kReplicated;
  }
}

bool TensorParallelPlan::Dropped(const std::string& name) const {
  const int layer = LayerOf(name);
  return layer >= dropped_layers_begin && layer < dropped_layers_end;
}

StatusOr<TensorParallelPlan> MakeTensorParallelPlan(const ModelConfig& c,
                                                    const TensorParallelOptions& o) {
  LLM_RETURN_IF_ERROR(CheckOptions(c, o));
  if (!ArchitectureCovered(c.architecture)) {
    return Unimplemented(Prefix(o) + "no tensor-parallel plan for " + c.architecture_name);
  }
  TensorParallelPlan plan;
  plan.rank = o.rank;
  plan.size = o.size;
  plan.model = plan.local = c;
  LLM_RETURN_IF_ERROR(SplitHeadsAndVocab(o, c.num_kv_heads, &plan));
  // Every family reads intermediate_size (gpt-oss and Mixtral as their experts' size).
  LLM_RETURN_IF_ERROR(CheckDivides(o, "intermediate_size", c.intermediate_size));
  plan.local.intermediate_size = c.intermediate_size / o.size;
  if (c.moe.num_experts > 0) {
    const char* key =
        c.architecture == Architecture::kQwen3Moe ? "moe_intermediate_size" : "intermediate_size";
    LLM_RETURN_IF_ERROR(CheckDivides(o, key, c.moe.intermediate));
    plan.local.moe.intermediate = c.moe.intermediate / o.size;
    // MXFP4 experts are cut along down_proj's k in whole blocks of 32 values (one scale each).
    if (c.quantization.method == WeightQuantization::Method::kMxfp4 &&
        plan.local.moe.intermediate % 32 != 0) {
      return InvalidArgument(Prefix(o) + "the MXFP4 experts' " + key + " " +
                             std::to_string(c.moe.intermediate) + " splits into slices of " +
                             std::to_string(plan.local.moe.intermediate) +
                             ", not whole 32-value blocks (a multiple of 32 per rank)");
    }
  }
  return plan;
}

StatusOr<TensorParallelPlan> MakeTensorParallelPlan(const DeepseekConfig& d,
                                                    const TensorParallelOptions& o) {
  LLM_RETURN_IF_ERROR(CheckOptions(d.base, o));
  TensorParallelPlan plan;
  plan.rank = o.rank;
  plan.size = o.size;
  plan.model = plan.local = d.base;
  // MLA's one latent is every query head's K and V: each rank caches all of it, and its heads
  // split as a model with as many KV heads as query heads would.
  LLM_RETURN_IF_ERROR(SplitHeadsAndVocab(o, d.base.num_q_heads, &plan));
  LLM_RETURN_IF_ERROR(CheckDivides(o, "intermediate_size", d.base.intermediate_size));
  plan.local.intermediate_size = d.base.intermediate_size / o.size;
  DeepseekConfig local = d;
  if (d.n_routed_experts > 0) {
    // Routed and shared experts alike: n_shared_experts * (moe_intermediate_size / N) each.
    LLM_RETURN_IF_ERROR(CheckDivides(o, "moe_intermediate_size", d.moe_intermediate_size));
    local.moe_intermediate_size = d.moe_intermediate_size / o.size;
  }
  local.base = plan.local;
  plan.deepseek = local;
  plan.dropped_layers_begin = d.base.num_layers;  // the MTP layers
  plan.dropped_layers_end = d.base.num_layers + d.num_nextn_predict_layers;
  return plan;
}

}  // namespace llm
