#include "engine/model_config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/config/json_fields.h"
#include "engine/config/rope_parameters.h"

namespace llm {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// HF's get_mscale (modeling_rope_utils): 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double GetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// eos_token_id: an int, a list of ints, or null (null leaves *out as it is).
Status ReadIds(const json& v, const std::string& name, std::vector<int32_t>* out) {
  if (v.is_null()) return Status::Ok();
  std::vector<int32_t> ids;
  auto one = [&](const json& x) -> Status {
    if (!x.is_number_integer()) {
      return InvalidArgument(name + " must be an integer or a list of integers, got " + x.dump());
    }
    ids.push_back(x.get<int32_t>());
    return Status::Ok();
  };
  if (v.is_array()) {
    for (const json& x : v) LLM_RETURN_IF_ERROR(one(x));
  } else {
    LLM_RETURN_IF_ERROR(one(v));
  }
  *out = std::move(ids);
  return Status::Ok();
}

Status ReadBos(const JsonScope& s, ModelConfig* c) {
  if (!s.Has("bos_token_id")) return Status::Ok();
  int id = 0;
  LLM_RETURN_IF_ERROR(s.Int("bos_token_id", &id, false, 0));
  c->bos_token_id = id;
  return Status::Ok();
}

// generation_config.json keys. Sampling defaults as vLLM reads them (generation_config="auto");
// token ids are read above; the rest are bookkeeping or do not change sampling here.
Status ReadGenerationDefaults(const JsonScope& g, GenerationDefaults* d) {
  static const std::set<std::string> kBookkeeping = {
      "bos_token_id",         "eos_token_id",         "pad_token_id",
      "transformers_version", "_from_model_config",   "use_cache",
      "output_attentions",    "output_hidden_states", "return_dict_in_generate",
      "output_scores",        "output_logits",        "cache_implementation"};
  auto opt_float = [&](const char* key, std::optional<float>* out) -> Status {
    if (!g.Has(key)) return Status::Ok();
    float v = 0;
    LLM_RETURN_IF_ERROR(g.Float(key, &v));
    *out = v;
    return Status::Ok();
  };
  LLM_RETURN_IF_ERROR(opt_float("temperature", &d->temperature));
  LLM_RETURN_IF_ERROR(opt_float("top_p", &d->top_p));
  LLM_RETURN_IF_ERROR(opt_float("min_p", &d->min_p));
  LLM_RETURN_IF_ERROR(opt_float("repetition_penalty", &d->repetition_penalty));
  if (d->temperature && *d->temperature < 0) {
    return InvalidArgument(g.Name("temperature") + " must be >= 0");
  }
  if (d->top_p && (*d->top_p <= 0 || *d->top_p > 1)) {
    return InvalidArgument(g.Name("top_p") + " must be in (0, 1]");
  }
  if (d->min_p && (*d->min_p < 0 || *d->min_p > 1)) {
    return InvalidArgument(g.Name("min_p") + " must be in [0, 1]");
  }
  if (d->repetition_penalty && *d->repetition_penalty <= 0) {
    return InvalidArgument(g.Name("repetition_penalty") + " must be > 0");
  }
  if (g.Has("top_k")) {
    int k = 0;
    LLM_RETURN_IF_ERROR(g.Int("top_k", &k, false, 0));
    d->top_k = k;
  }
  if (g.Has("max_new_tokens")) {
    int n = 0;
    LLM_RETURN_IF_ERROR(g.Int("max_new_tokens", &n));
    d->max_new_tokens = n;
  }
  for (const auto& [k, v] : g.j.items()) {
    if (kBookkeeping.count(k) || k == "temperature" || k == "top_p" || k == "top_k" ||
        k == "min_p" || k == "repetition_penalty" || k == "max_new_tokens") {
      continue;
    }
    d->not_applied.push_back(k);
  }
  return Status::Ok();
}

// Sliding window as Hugging Face applies it. Mistral: every layer when sliding_window is
// non-null. Qwen2: only with use_sliding_window, and then the layers named "sliding_attention" in
// layer_types or, without that list, layers l >= max_window_layers (default 28, as in
// Qwen2Config; Mistral ignores layer_types, as HF does). Llama has no sliding window.
Status ReadSlidingWindow(const JsonScope& s, ModelConfig* c) {
  const json& j = s.j;
  const bool qwen =
      c->architecture == Architecture::kQwen2 || c->architecture == Architecture::kQwen3;
  if (c->architecture != Architecture::kMistral && !qwen) return Status::Ok();
  bool use = true;
  if (qwen) {
    use = false;
    LLM_RETURN_IF_ERROR(s.Bool("use_sliding_window", &use));
    if (!use) return Status::Ok();
  }
  // An explicit null disables the window; an absent key means the HF config default, 4096.
  if (s.Contains("sliding_window") && j["sliding_window"].is_null()) return Status::Ok();
  int window = 4096;
  LLM_RETURN_IF_ERROR(s.Int("sliding_window", &window));
  c->sliding_window = window;
  if (!qwen) return Status::Ok();

  c->window_layers.assign(c->num_layers, false);
  if (s.Has("layer_types")) {
    const json& types = j["layer_types"];
    if (!types.is_array() || static_cast<int>(types.size()) != c->num_layers) {
      return InvalidArgument(s.Name("layer_types") + " must list one type per layer (" +
                             std::to_string(c->num_layers) + ")");
    }
    for (int l = 0; l < c->num_layers; ++l) {
      const json& t = types[l];
      if (t == "sliding_attention") {
        c->window_layers[l] = true;
      } else if (t != "full_attention") {
        return InvalidArgument(s.Name("layer_types") + "[" + std::to_string(l) + "] is " +
                               t.dump() + "; expected \"full_attention\" or \"sliding_attention\"");
      }
    }
    return Status::Ok();
  }
  int max_window_layers = 28;
  LLM_RETURN_IF_ERROR(s.Int("max_window_layers", &max_window_layers, false, 0));
  for (int l = max_window_layers; l < c->num_layers; ++l) c->window_layers[l] = true;
  return Status::Ok();
}

// Maps HF rope settings onto what the Llama-family code applies; the rest is refused by name.
Status SetRope(const RopeParameters& p, const std::string& file, ModelConfig* c) {
  c->rope_theta = static_cast<float>(p.theta);
  RopeScaling& rs = c->rope_scaling;
  rs.factor = p.factor;
  switch (p.type) {
    case RopeParameters::Type::kDefault:
      rs.type = RopeScaling::Type::kNone;
      rs.factor = 1.0f;
      return Status::Ok();
    case RopeParameters::Type::kLinear:
      rs.type = RopeScaling::Type::kLinear;
      return Status::Ok();
    case RopeParameters::Type::kLlama3:
      rs.type = RopeScaling::Type::kLlama3;
      rs.low_freq_factor = p.low_freq_factor;
      rs.high_freq_factor = p.high_freq_factor;
      rs.original_max_position_embeddings = *p.original_max_position_embeddings;
      return Status::Ok();
    case RopeParameters::Type::kYarn: {
      rs.type = RopeScaling::Type::kYarn;
      rs.original_max_position_embeddings =
          p.original_max_position_embeddings.value_or(c->max_position_embeddings);
      rs.beta_fast = p.beta_fast;
      rs.beta_slow = p.beta_slow;
      rs.truncate = p.truncate;
      const float mscale = p.mscale.value_or(0.0f), all = p.mscale_all_dim.value_or(0.0f);
      if (p.attention_factor) {
        rs.attention_factor = *p.attention_factor;
      } else if (mscale != 0.0f && all != 0.0f) {
        rs.attention_factor =
            static_cast<float>(GetMscale(p.factor, mscale) / GetMscale(p.factor, all));
      } else {
        rs.attention_factor = static_cast<float>(GetMscale(p.factor, 1.0));
      }
      return Status::Ok();
    }
    case RopeParameters::Type::kDynamic:
    case RopeParameters::Type::kLongrope:
      break;
  }
  return Unimplemented(file + ": rope type '" + p.type_name + "' is not implemented for " +
                       c->architecture_name + " (implemented: default, linear, llama3, yarn)");
}

StatusOr<ModelConfig> LoadModelConfigImpl(const std::string& model_dir) {
  const fs::path dir(model_dir);
  const std::string file = (dir / "config.json").string();
  LLM_ASSIGN_OR_RETURN(json j, ReadJsonObject(file));
  const JsonScope s{j, file};
  ModelConfig c;
  c.name = fs::path(model_dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = fs::path(model_dir).lexically_normal().parent_path().filename();

  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string()) {
    return InvalidArgument(file + ": missing 'architectures'");
  }
  c.architecture_name = j["architectures"][0].get<std::string>();
  if (s.Has("text_config")) {
    return Unimplemented(file + ": nested 'text_config' (multimodal wrapper '" +
                         c.architecture_name +
                         "') is not supported; serve the text model's own checkpoint");
  }
  if (c.architecture_name == "LlamaForCausalLM") {
    c.architecture = Architecture::kLlama;
  } else if (c.architecture_name == "MistralForCausalLM") {
    c.architecture = Architecture::kMistral;
  } else if (c.architecture_name == "Qwen2ForCausalLM") {
    c.architecture = Architecture::kQwen2;
  } else if (c.architecture_name == "Qwen3ForCausalLM") {
    c.architecture = Architecture::kQwen3;
    c.qk_norm = true;
  } else {
    return Unimplemented(file + ": unsupported architecture '" + c.architecture_name +
                         "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                         "Qwen3ForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
  }
  LLM_RETURN_IF_ERROR(s.Int("hidden_size", &c.hidden_size, true));
  LLM_RETURN_IF_ERROR(s.Int("intermediate_size", &c.intermediate_size, true));
  LLM_RETURN_IF_ERROR(s.Int("num_hidden_layers", &c.num_layers, true));
  LLM_RETURN_IF_ERROR(s.Int("num_attention_heads", &c.num_q_heads, true));
  c.num_kv_heads = c.num_q_heads;
  LLM_RETURN_IF_ERROR(s.Int("num_key_value_heads", &c.num_kv_heads));
  LLM_RETURN_IF_ERROR(s.Int("vocab_size", &c.vocab_size, true));
  LLM_RETURN_IF_ERROR(s.Int("max_position_embeddings", &c.max_position_embeddings));
  if (c.hidden_size % c.num_q_heads != 0 && !s.Has("head_dim")) {
    return InvalidArgument(file + ": hidden_size is not a multiple of num_attention_heads");
  }
  c.head_dim = c.hidden_size / c.num_q_heads;
  LLM_RETURN_IF_ERROR(s.Int("head_dim", &c.head_dim));  // null: hidden / heads, as HF
  if (c.num_q_heads % c.num_kv_heads != 0) {
    return InvalidArgument(file + ": num_attention_heads (" + std::to_string(c.num_q_heads) +
                           ") is not a multiple of num_key_value_heads (" +
                           std::to_string(c.num_kv_heads) + ")");
  }
  if (c.head_dim % 2 != 0) return InvalidArgument(file + ": head_dim must be even for rotary");
  LLM_RETURN_IF_ERROR(s.Float("rms_norm_eps", &c.rms_norm_eps));
  if (c.rms_norm_eps <= 0.0f) return InvalidArgument(s.Name("rms_norm_eps") + " must be > 0");
  LLM_RETURN_IF_ERROR(s.Bool("tie_word_embeddings", &c.tie_word_embeddings));

  std::string act = "silu";
  LLM_RETURN_IF_ERROR(s.String("hidden_act", &act));
  if (act != "silu") {
    return Unimplemented(s.Name("hidden_act") + " is '" + act + "'; only silu is implemented");
  }
  // Biases. Llama: attention_bias covers q/k/v/o and mlp_bias gate/up/down. Qwen2 always has
  // q/k/v biases and no o/mlp bias (its config class has neither key). Mistral has none.
  if (c.architecture == Architecture::kQwen2) c.qkv_bias = true;
  bool attention_bias = false, mlp_bias = false;
  LLM_RETURN_IF_ERROR(s.Bool("attention_bias", &attention_bias));
  LLM_RETURN_IF_ERROR(s.Bool("mlp_bias", &mlp_bias));
  if (c.architecture == Architecture::kLlama || c.architecture == Architecture::kQwen3) {
    c.qkv_bias = c.o_bias = attention_bias;  // Qwen3: q/k/v/o alike, as Llama
    c.mlp_bias = mlp_bias;
  } else if (attention_bias || mlp_bias) {
    return Unimplemented(s.Name(attention_bias ? "attention_bias" : "mlp_bias") +
                         " = true is not part of " + c.architecture_name);
  }

  LLM_ASSIGN_OR_RETURN(RopeParameters rope, ReadRopeParameters(j, file, 10000.0));
  float partial = rope.partial_rotary_factor.value_or(1.0f);
  LLM_RETURN_IF_ERROR(s.Float("partial_rotary_factor", &partial));
  if (partial != 1.0f) {
    return Unimplemented(s.Name("partial_rotary_factor") + " = " + std::to_string(partial) +
                         " is not implemented for " + c.architecture_name + " (only 1.0)");
  }
  LLM_RETURN_IF_ERROR(SetRope(rope, file, &c));
  LLM_RETURN_IF_ERROR(ReadSlidingWindow(s, &c));
  // transformers 5 writes "dtype", 4.x "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    std::string name;
    LLM_RETURN_IF_ERROR(s.String(key, &name));
    DType t;
    if (!name.empty() && ParseDType(name, &t)) c.dtype = t;
  }
  LLM_RETURN_IF_ERROR(ReadQuantizationConfig(j, file, &c.quantization));
  LLM_RETURN_IF_ERROR(ReadSpecialTokenIds(model_dir, j, &c));
  return c;
}

}  // namespace

std::string GenerationDefaults::Describe() const {
  std::string out;
  auto add = [&](const char* name, const std::string& v) {
    out += (out.empty() ? "" : ", ") + std::string(name) + " " + v;
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", v);
    return std::string(buf);
  };
  if (temperature) add("temperature", num(*temperature));
  if (top_p) add("top_p", num(*top_p));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (min_p) add("min_p", num(*min_p));
  if (repetition_penalty) add("repetition_penalty", num(*repetition_penalty));
  if (max_new_tokens) add("max_new_tokens", std::to_string(*max_new_tokens));
  if (out.empty()) out = "none";
  if (!not_applied.empty()) {
    out += " (not applied:";
    for (const std::string& k : not_applied) out += " " + k;
    out += ")";
  }
  return out;
}

float ModelConfig::SoftmaxScale() const {
  const float a =
      rope_scaling.type == RopeScaling::Type::kYarn ? rope_scaling.attention_factor : 1.0f;
  return a * a / std::sqrt(static_cast<float>(head_dim));
}

const char* ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kDeepseekV2:
      return "DeepseekV2ForCausalLM";
    case Architecture::kDeepseekV3:
      return "DeepseekV3ForCausalLM";
  }
  return "?";
}

Status ReadSpecialTokenIds(const std::string& model_dir, const json& j, ModelConfig* c) {
  const std::string file = (fs::path(model_dir) / "config.json").string();
  const JsonScope s{j, file};
  LLM_RETURN_IF_ERROR(ReadBos(s, c));
  if (s.Contains("eos_token_id")) {
    LLM_RETURN_IF_ERROR(ReadIds(j["eos_token_id"], s.Name("eos_token_id"), &c->eos_token_ids));
  }
  const fs::path gen = fs::path(model_dir) / "generation_config.json";
  if (fs::exists(gen)) {
    LLM_ASSIGN_OR_RETURN(json g, ReadJsonObject(gen.string()));
    const JsonScope gs{g, gen.string()};
    // null or absent keeps config.json's ids (HF merges the two the same way).
    if (gs.Contains("eos_token_id")) {
      LLM_RETURN_IF_ERROR(ReadIds(g["eos_token_id"], gs.Name("eos_token_id"), &c->eos_token_ids));
    }
    LLM_RETURN_IF_ERROR(ReadBos(gs, c));
    LLM_RETURN_IF_ERROR(ReadGenerationDefaults(gs, &c->generation));
  }
  for (int32_t id : c->eos_token_ids) {
    if (id < 0 || id >= c->vocab_size) {
      return InvalidArgument(file + ": eos_token_id " + std::to_string(id) +
                             " is outside the vocabulary");
    }
  }
  return Status::Ok();
}

Status ReadQuantizationConfig(const json& j, const std::string& file, WeightQuantization* out) {
  const JsonScope top{j, file};
  LLM_ASSIGN_OR_RETURN(const json* qc, top.Object("quantization_config"));
  *out = WeightQuantization();
  if (qc == nullptr) return Status::Ok();
  const JsonScope q = top.Sub(*qc, "quantization_config");
  std::string method;
  LLM_RETURN_IF_ERROR(q.String("quant_method", &method, true));
  out->quant_method = method;
  using M = WeightQuantization::Method;
  auto refuse = [&](const std::string& why) {
    return Unimplemented(q.where + ": " + method + " checkpoint: " + why + " is not supported");
  };
  if (method == "fp8") {  // DeepSeek-V3 / transformers FineGrainedFP8
    std::string fmt = "e4m3", scheme = "dynamic";
    LLM_RETURN_IF_ERROR(q.String("fmt", &fmt));
    LLM_RETURN_IF_ERROR(q.String("activation_scheme", &scheme));
    if (fmt != "e4m3") return refuse("fmt '" + fmt + "'");
    if (scheme != "dynamic" && scheme != "static") return refuse("activation_scheme " + scheme);
    out->static_input_scales = scheme == "static";
    out->method = M::kFp8PerTensor;
    if (q.Has("weight_block_size")) {
      const json& b = (*qc)["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
          !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0 ||
          b[0].get<int64_t>() > 65536 || b[1].get<int64_t>() > 65536) {
        return InvalidArgument(q.Name("weight_block_size") +
                               " must be two positive integers, got " + b.dump());
      }
      out->method = M::kFp8Block;
      out->block_rows = b[0].get<int>();
      out->block_cols = b[1].get<int>();
    }
    return Status::Ok();
  }
  if (method == "fbgemm_fp8") {  // per-channel weight scales, dynamic per-token activations
    out->method = M::kFp8PerChannel;
    return Status::Ok();
  }
  if (method == "modelopt") {
    std::string algo;
    LLM_RETURN_IF_ERROR(q.String("quant_algo", &algo, true));
    if (algo != "FP8") return refuse("quant_algo '" + algo + "'");
    if (q.Has("kv_cache_quant_algo")) return refuse("kv_cache_quant_algo");
    out->method = M::kFp8PerTensor;
    out->static_input_scales = true;
    return Status::Ok();
  }
  if (method == "compressed-tensors") {
    std::string format;
    LLM_RETURN_IF_ERROR(q.String("format", &format));
    if (format != "float-quantized" && format != "naive-quantized") {
      return refuse("format '" + format + "'");
    }
    if (q.Has("kv_cache_scheme")) return refuse("kv_cache_scheme");
    LLM_ASSIGN_OR_RETURN(const json* groups, q.Object("config_groups"));
    if (groups == nullptr || groups->size() != 1) return refuse("other than one config group");
    // The one group's name and value (items() is a temporary: no structured binding into it).
    const json::const_iterator first = groups->begin();
    const std::string gname = first.key();
    const json& group = first.value();
    if (!group.is_object()) return InvalidArgument(q.where + ": config_groups." + gname);
    const JsonScope g = q.Sub(group, "config_groups");
    LLM_ASSIGN_OR_RETURN(const json* w, g.Object("weights"));
    if (w == nullptr) return refuse("a group without weights");
    const JsonScope ws = g.Sub(*w, "weights");
    int bits = 0;
    std::string type, strategy;
    LLM_RETURN_IF_ERROR(ws.Int("num_bits", &bits, true));
    LLM_RETURN_IF_ERROR(ws.String("type", &type, true));
    LLM_RETURN_IF_ERROR(ws.String("strategy", &strategy, true));
    if (bits != 8 || type != "float") {
      return refuse(std::to_string(bits) + "-bit " + type + " weights");
    }
    if (strategy == "tensor") {
      out->method = M::kFp8PerTensor;
    } else if (strategy == "channel") {
      out->method = M::kFp8PerChannel;
    } else if (strategy == "block") {
      const json& b = w->contains("block_structure") ? (*w)["block_structure"] : json();
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() ||
          !b[1].is_number_integer() || b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0 ||
          b[0].get<int64_t>() > 65536 || b[1].get<int64_t>() > 65536) {
        return InvalidArgument(ws.Name("block_structure") + " must be two positive integers");
      }
      out->method = M::kFp8Block;
      out->block_rows = b[0].get<int>();
      out->block_cols = b[1].get<int>();
    } else {
      return refuse("weight strategy '" + strategy + "'");
    }
    LLM_ASSIGN_OR_RETURN(const json* a, g.Object("input_activations"));
    if (a != nullptr) {
      const JsonScope as = g.Sub(*a, "input_activations");
      bool dynamic = false;
      LLM_RETURN_IF_ERROR(as.Bool("dynamic", &dynamic));
      out->static_input_scales = !dynamic;
    }
    return Status::Ok();
  }
  return Unimplemented("quantization method " + method + " is not supported (" + file +
                       "; supported: fp8, fbgemm_fp8, modelopt FP8, compressed-tensors fp8)");
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  try {
    return LoadModelConfigImpl(model_dir);
  } catch (const std::exception& e) {  // the checked accessors should leave nothing to catch
    return InvalidArgument(model_dir + "/config.json: " + e.what());
  }
}

}  // namespace llm
