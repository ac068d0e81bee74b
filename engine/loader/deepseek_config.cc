#include "engine/loader/deepseek_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/loader/json_fields.h"
#include "engine/loader/rope.h"
#include "engine/loader/rope_parameters.h"

namespace llm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

StatusOr<json> ReadJson(const fs::path& path) {
  return ReadJsonObject(path.string());
}

bool Present(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// Integer field: `min_value` bounds it from below; absent/null keeps *out unless required.
Status Int(const json& j, const char* key, int* out, bool required, const std::string& file,
           int min_value = 1) {
  if (!Present(j, key)) {
    if (required) return InvalidArgument(file + ": missing required field '" + key + "'");
    return Status::Ok();
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < min_value ||
      j[key].get<int64_t>() > (1ll << 30)) {
    return InvalidArgument(file + ": field '" + key +
                           "' must be an integer >= " + std::to_string(min_value));
  }
  *out = j[key].get<int>();
  return Status::Ok();
}

Status Float(const json& j, const char* key, float* out, const std::string& file) {
  if (!Present(j, key)) return Status::Ok();
  if (!j[key].is_number() || !std::isfinite(j[key].get<double>())) {
    return InvalidArgument(file + ": field '" + key + "' must be a finite number");
  }
  *out = j[key].get<float>();
  return Status::Ok();
}

Status Bool(const json& j, const char* key, bool* out, const std::string& file) {
  if (!Present(j, key)) return Status::Ok();
  if (!j[key].is_boolean()) return InvalidArgument(file + ": field '" + key + "' must be a bool");
  *out = j[key].get<bool>();
  return Status::Ok();
}

Status String(const json& j, const char* key, std::string* out, const std::string& file) {
  if (!Present(j, key)) return Status::Ok();
  if (!j[key].is_string()) return InvalidArgument(file + ": field '" + key + "' must be a string");
  *out = j[key].get<std::string>();
  return Status::Ok();
}

}  // namespace

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

float DeepseekConfig::SoftmaxScale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (yarn.enabled() && yarn.mscale_all_dim != 0.0f) {
    const double m = YarnGetMscale(yarn.freq.factor, yarn.mscale_all_dim);
    s *= m * m;
  }
  return static_cast<float>(s);
}

float DeepseekConfig::RopeMscale() const {
  if (!yarn.enabled()) return 1.0f;
  return static_cast<float>(YarnGetMscale(yarn.freq.factor, yarn.mscale) /
                            YarnGetMscale(yarn.freq.factor, yarn.mscale_all_dim));
}

MoeRouting DeepseekConfig::Routing() const {
  MoeRouting r;
  r.num_experts = n_routed_experts;
  r.top_k = num_experts_per_tok;
  r.scoring =
      scoring == Scoring::kSoftmax ? MoeRouting::Scoring::kSoftmax : MoeRouting::Scoring::kSigmoid;
  switch (topk_method) {
    case TopkMethod::kGreedy:
      r.groups = MoeRouting::Groups::kNone;
      break;
    case TopkMethod::kGroupLimitedGreedy:
      r.groups = MoeRouting::Groups::kGroupLimited;
      break;
    case TopkMethod::kNoauxTc:
      r.groups = MoeRouting::Groups::kGroupSumTop2;
      r.weigh_unbiased = true;
      break;
  }
  r.n_group = n_group;
  r.topk_group = topk_group;
  r.normalize = norm_topk_prob && num_experts_per_tok > 1;
  r.norm_eps = 1e-20f;  // HF MoEGate's denominator
  // V3 always scales; DeepSeek-V2's gate scales only when it does not normalize.
  r.scaling = is_v3() || !r.normalize ? routed_scaling_factor : 1.0f;
  return r;
}

std::vector<float> DeepseekConfig::RopeInvFreq() const {
  return llm::RopeInvFreq(qk_rope_head_dim, static_cast<double>(base.rope_theta), yarn.freq);
}

bool IsDeepseekModelDir(const std::string& model_dir) {
  auto j = ReadJson(fs::path(model_dir) / "config.json");
  if (!j.ok()) return false;
  const json& a = j.value()["architectures"];
  if (!a.is_array() || a.empty() || !a[0].is_string()) return false;
  const std::string name = a[0].get<std::string>();
  return name == "DeepseekV2ForCausalLM" || name == "DeepseekV3ForCausalLM";
}

StatusOr<DeepseekConfig> LoadDeepseekConfigImpl(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const std::string file = (dir / "config.json").string();
  LLM_ASSIGN_OR_RETURN(json j, ReadJson(file));
  DeepseekConfig d;
  ModelConfig& c = d.base;
  c.name = dir.lexically_normal().filename().string();
  if (c.name.empty()) c.name = dir.lexically_normal().parent_path().filename();
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string()) {
    return InvalidArgument(file + ": missing 'architectures'");
  }
  c.architecture_name = j["architectures"][0].get<std::string>();
  if (c.architecture_name == "DeepseekV2ForCausalLM") {
    c.architecture = Architecture::kDeepseekV2;
  } else if (c.architecture_name == "DeepseekV3ForCausalLM") {
    c.architecture = Architecture::kDeepseekV3;
  } else {
    return Unimplemented(file + ": '" + c.architecture_name + "' is not a DeepSeek architecture");
  }
  const bool v3 = d.is_v3();

  LLM_RETURN_IF_ERROR(Int(j, "hidden_size", &c.hidden_size, true, file));
  LLM_RETURN_IF_ERROR(Int(j, "intermediate_size", &c.intermediate_size, true, file));
  LLM_RETURN_IF_ERROR(Int(j, "num_hidden_layers", &c.num_layers, true, file));
  LLM_RETURN_IF_ERROR(Int(j, "num_attention_heads", &c.num_q_heads, true, file));
  c.num_kv_heads = c.num_q_heads;  // informational: MLA shares one latent per token
  LLM_RETURN_IF_ERROR(Int(j, "num_key_value_heads", &c.num_kv_heads, false, file));
  LLM_RETURN_IF_ERROR(Int(j, "vocab_size", &c.vocab_size, true, file));
  c.max_position_embeddings = v3 ? 4096 : 2048;
  LLM_RETURN_IF_ERROR(Int(j, "max_position_embeddings", &c.max_position_embeddings, false, file));
  c.rms_norm_eps = 1e-6f;
  LLM_RETURN_IF_ERROR(Float(j, "rms_norm_eps", &c.rms_norm_eps, file));
  LLM_RETURN_IF_ERROR(Bool(j, "tie_word_embeddings", &c.tie_word_embeddings, file));
  bool attention_bias = false;
  LLM_RETURN_IF_ERROR(Bool(j, "attention_bias", &attention_bias, file));
  if (attention_bias) return Unimplemented(file + ": attention_bias = true is not supported");
  std::string act = "silu";
  LLM_RETURN_IF_ERROR(String(j, "hidden_act", &act, file));
  if (act != "silu") return Unimplemented(file + ": hidden_act '" + act + "' (only silu)");
  for (const char* key : {"torch_dtype", "dtype"}) {  // transformers 5 writes "dtype"
    std::string name;
    LLM_RETURN_IF_ERROR(String(j, key, &name, file));
    DType t;
    if (!name.empty() && ParseDType(name, &t)) c.dtype = t;
  }
  // The MLA code rotates interleaved pairs, as DeepSeek's checkpoints (and HF's default) do.
  bool interleave = true;
  LLM_RETURN_IF_ERROR(Bool(j, "rope_interleave", &interleave, file));
  if (!interleave) return Unimplemented(file + ": rope_interleave = false is not implemented");
  if (Present(j, "text_config")) {
    return Unimplemented(file + ": nested 'text_config' is not supported");
  }

  // MLA.
  LLM_RETURN_IF_ERROR(Int(j, "q_lora_rank", &d.q_lora_rank, false, file));  // null: no q LoRA
  LLM_RETURN_IF_ERROR(Int(j, "kv_lora_rank", &d.kv_lora_rank, true, file));
  LLM_RETURN_IF_ERROR(Int(j, "qk_rope_head_dim", &d.qk_rope_head_dim, true, file));
  LLM_RETURN_IF_ERROR(Int(j, "qk_nope_head_dim", &d.qk_nope_head_dim, true, file));
  LLM_RETURN_IF_ERROR(Int(j, "v_head_dim", &d.v_head_dim, true, file));
  if (d.qk_rope_head_dim % 2 != 0 || d.qk_rope_head_dim > kMaxRopeDim) {
    return InvalidArgument(file + ": qk_rope_head_dim must be even and at most " +
                           std::to_string(kMaxRopeDim));
  }
  c.head_dim = d.qk_head_dim();

  LLM_ASSIGN_OR_RETURN(RopeParameters rope, ReadRopeParameters(j, file, 10000.0));
  c.rope_theta = static_cast<float>(rope.theta);
  if (rope.partial_rotary_factor && *rope.partial_rotary_factor != 1.0f) {
    return Unimplemented(file +
                         ": rope_parameters.partial_rotary_factor is not implemented for "
                         "DeepSeek");
  }
  if (rope.type == RopeParameters::Type::kYarn) {
    YarnScaling& y = d.yarn;
    y.freq.type = RopeScaling::Type::kYarn;
    y.freq.factor = rope.factor;
    y.freq.original_max_position_embeddings = rope.original_max_position_embeddings.value_or(4096);
    y.freq.beta_fast = rope.beta_fast;
    y.freq.beta_slow = rope.beta_slow;
    // transformers' _compute_yarn_parameters: truncate = false keeps the correction range's
    // bounds unrounded (DeepSeek's own code always rounds, i.e. the default true).
    y.freq.truncate = rope.truncate;
    y.mscale = rope.mscale.value_or(1.0f);
    y.mscale_all_dim = rope.mscale_all_dim.value_or(0.0f);
    if (rope.attention_factor) {
      return Unimplemented(file +
                           ": yarn 'attention_factor' is not implemented for DeepSeek (the "
                           "cos/sin scale comes from mscale / mscale_all_dim)");
    }
  } else if (rope.type != RopeParameters::Type::kDefault) {
    return Unimplemented(file + ": rope type '" + rope.type_name +
                         "' is not implemented for DeepSeek (implemented: default, yarn)");
  }

  // MoE. Defaults are the Hugging Face config classes' defaults for each architecture.
  LLM_RETURN_IF_ERROR(Int(j, "n_routed_experts", &d.n_routed_experts, false, file, 0));
  LLM_RETURN_IF_ERROR(Int(j, "n_shared_experts", &d.n_shared_experts, false, file, 0));
  LLM_RETURN_IF_ERROR(Int(j, "first_k_dense_replace", &d.first_k_dense_replace, false, file, 0));
  LLM_RETURN_IF_ERROR(Int(j, "moe_layer_freq", &d.moe_layer_freq, false, file));
  LLM_RETURN_IF_ERROR(
      Int(j, "num_nextn_predict_layers", &d.num_nextn_predict_layers, false, file, 0));
  if (d.n_routed_experts > 0 || d.n_shared_experts > 0) {
    LLM_RETURN_IF_ERROR(Int(j, "moe_intermediate_size", &d.moe_intermediate_size, true, file));
  }
  if (d.n_routed_experts > 0) {
    LLM_RETURN_IF_ERROR(Int(j, "num_experts_per_tok", &d.num_experts_per_tok, true, file));
    if (d.num_experts_per_tok > d.n_routed_experts) {
      return InvalidArgument(file + ": num_experts_per_tok exceeds n_routed_experts");
    }
    d.routed_scaling_factor = v3 ? 2.5f : 1.0f;
    LLM_RETURN_IF_ERROR(Float(j, "routed_scaling_factor", &d.routed_scaling_factor, file));
    d.norm_topk_prob = v3;
    LLM_RETURN_IF_ERROR(Bool(j, "norm_topk_prob", &d.norm_topk_prob, file));
    std::string scoring = v3 ? "sigmoid" : "softmax";
    LLM_RETURN_IF_ERROR(String(j, "scoring_func", &scoring, file));
    if (scoring == "softmax") {
      d.scoring = DeepseekConfig::Scoring::kSoftmax;
    } else if (scoring == "sigmoid") {
      d.scoring = DeepseekConfig::Scoring::kSigmoid;
    } else {
      return Unimplemented(file + ": unsupported scoring_func '" + scoring + "'");
    }
    std::string method = v3 ? "noaux_tc" : "greedy";
    LLM_RETURN_IF_ERROR(String(j, "topk_method", &method, file));
    if (method == "greedy" || method == "gready") {  // "gready": the V2 config class default
      d.topk_method = DeepseekConfig::TopkMethod::kGreedy;
    } else if (method == "group_limited_greedy") {
      d.topk_method = DeepseekConfig::TopkMethod::kGroupLimitedGreedy;
    } else if (method == "noaux_tc") {
      d.topk_method = DeepseekConfig::TopkMethod::kNoauxTc;
    } else {
      return Unimplemented(file + ": unsupported topk_method '" + method + "'");
    }
    d.n_group = v3 ? 8 : 1;
    d.topk_group = v3 ? 4 : 1;
    if (d.topk_method != DeepseekConfig::TopkMethod::kGreedy) {
      LLM_RETURN_IF_ERROR(Int(j, "n_group", &d.n_group, false, file));
      LLM_RETURN_IF_ERROR(Int(j, "topk_group", &d.topk_group, false, file));
      if (d.n_routed_experts % d.n_group != 0) {
        return InvalidArgument(file + ": n_routed_experts is not a multiple of n_group");
      }
      if (d.topk_group > d.n_group) return InvalidArgument(file + ": topk_group > n_group");
      if (d.num_experts_per_tok > d.topk_group * (d.n_routed_experts / d.n_group)) {
        return InvalidArgument(file +
                               ": num_experts_per_tok exceeds the experts of topk_group "
                               "groups");
      }
      if (d.topk_method == DeepseekConfig::TopkMethod::kNoauxTc &&
          d.n_routed_experts / d.n_group < 2) {
        return InvalidArgument(file + ": noaux_tc needs at least 2 experts per group");
      }
    }
  }

  // Latent cache extensions.
  if (Present(j, "mla_cache_dtype")) {
    DType t;
    if (!j["mla_cache_dtype"].is_string() ||
        !ParseDType(j["mla_cache_dtype"].get<std::string>(), &t) ||
        (t != DType::kF32 && t != DType::kFp8E4M3)) {
      return InvalidArgument(file + ": mla_cache_dtype must be \"float32\" or \"fp8_e4m3\"");
    }
    d.mla_cache_dtype = t;
  }
  LLM_RETURN_IF_ERROR(Float(j, "mla_cache_scale", &d.mla_cache_scale, file));
  if (d.mla_cache_scale <= 0.0f) return InvalidArgument(file + ": mla_cache_scale must be > 0");

  LLM_RETURN_IF_ERROR(ReadQuantizationConfig(j, file, &c.quantization));
  LLM_RETURN_IF_ERROR(ReadSpecialTokenIds(model_dir, j, &c));
  return d;
}

StatusOr<DeepseekConfig> LoadDeepseekConfig(const std::string& model_dir) {
  try {
    return LoadDeepseekConfigImpl(model_dir);
  } catch (const std::exception& e) {  // the checked accessors should leave nothing to catch
    return InvalidArgument(model_dir + "/config.json: " + e.what());
  }
}

}  // namespace llm
