#include "engine/loader/model_config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "engine/loader/json_fields.h"
#include "engine/loader/rope_parameters.h"

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

// layer_types ("sliding_attention" / "full_attention" per layer) into window_layers.
Status ReadLayerTypes(const JsonScope& s, ModelConfig* c) {
  const json& types = s.j["layer_types"];
  if (!types.is_array() || static_cast<int>(types.size()) != c->num_layers) {
    return InvalidArgument(s.Name("layer_types") + " must list one type per layer (" +
                           std::to_string(c->num_layers) + ")");
  }
  c->window_layers.assign(c->num_layers, false);
  for (int l = 0; l < c->num_layers; ++l) {
    const json& t = types[l];
    if (t == "sliding_attention") {
      c->window_layers[l] = true;
    } else if (t != "full_attention") {
      return InvalidArgument(s.Name("layer_types") + "[" + std::to_string(l) + "] is " + t.dump() +
                             "; expected \"full_attention\" or \"sliding_attention\"");
    }
  }
  return Status::Ok();
}

// Gemma 2/3 and gpt-oss: every layer type from layer_types, or without it the config class's
// rule: a layer is full every `pattern`-th layer (l + 1) % pattern == 0 and sliding otherwise
// (Gemma 2 and gpt-oss alternate, pattern 2; Gemma 3 sliding_window_pattern, default 6). The
// window is required.
Status ReadInterleavedWindow(const JsonScope& s, ModelConfig* c) {
  int window = 0;
  LLM_RETURN_IF_ERROR(s.Int("sliding_window", &window, true));
  c->sliding_window = window;
  if (s.Has("layer_types")) return ReadLayerTypes(s, c);
  int pattern = 2;
  if (c->architecture == Architecture::kGemma3) {
    pattern = 6;
    LLM_RETURN_IF_ERROR(s.Int("_sliding_window_pattern", &pattern));
    LLM_RETURN_IF_ERROR(s.Int("sliding_window_pattern", &pattern));
  }
  c->window_layers.assign(c->num_layers, false);
  for (int l = 0; l < c->num_layers; ++l) c->window_layers[l] = (l + 1) % pattern != 0;
  return Status::Ok();
}

// Sliding window as Hugging Face applies it. Mistral and Mixtral: every layer when
// sliding_window is non-null. Qwen2: only with use_sliding_window, and then the layers named
// "sliding_attention" in layer_types or, without that list, layers l >= max_window_layers
// (default 28, as in Qwen2Config; Mistral ignores layer_types, as HF does). Qwen3-MoE: refused
// when enabled (use_sliding_window; without it Qwen3MoeConfig drops the window). Gemma, gpt-oss:
// ReadInterleavedWindow.
// Llama has no sliding window.
Status ReadSlidingWindow(const JsonScope& s, ModelConfig* c) {
  const json& j = s.j;
  switch (c->architecture) {
    case Architecture::kGemma2:
    case Architecture::kGemma3:
    case Architecture::kGptOss:
      return ReadInterleavedWindow(s, c);
    case Architecture::kQwen3Moe: {  // Qwen3MoeConfig drops the window without the flag
      bool use = false;
      LLM_RETURN_IF_ERROR(s.Bool("use_sliding_window", &use));
      if (use && !(s.Contains("sliding_window") && j["sliding_window"].is_null())) {
        return Unimplemented(s.Name("use_sliding_window") +
                             " = true: a sliding window is not implemented for " +
                             c->architecture_name);
      }
      return Status::Ok();
    }
    case Architecture::kMixtral:  // default null (MixtralConfig)
      if (!s.Has("sliding_window")) return Status::Ok();
      break;
    default:
      break;
  }
  const bool qwen =
      c->architecture == Architecture::kQwen2 || c->architecture == Architecture::kQwen3;
  const bool mistral =
      c->architecture == Architecture::kMistral || c->architecture == Architecture::kMixtral;
  if (!mistral && !qwen) return Status::Ok();
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

  if (s.Has("layer_types")) return ReadLayerTypes(s, c);
  c->window_layers.assign(c->num_layers, false);
  int max_window_layers = 28;
  LLM_RETURN_IF_ERROR(s.Int("max_window_layers", &max_window_layers, false, 0));
  for (int l = max_window_layers; l < c->num_layers; ++l) c->window_layers[l] = true;
  return Status::Ok();
}

// Maps HF rope settings onto what the Llama-family code applies (into *theta, *rs); the rest is
// refused by name.
Status SetRope(const RopeParameters& p, const std::string& file, const ModelConfig* c, float* theta,
               RopeScaling* scaling) {
  *theta = static_cast<float>(p.theta);
  RopeScaling& rs = *scaling;
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

bool IsGemma(Architecture a) {
  return a == Architecture::kGemma2 || a == Architecture::kGemma3;
}

// The gated MLP's activation: hidden_act (Llama family, Mixtral, Qwen), hidden_activation
// (Gemma; transformers' Gemma 2/3 read only that key). gpt-oss's experts do not read hidden_act.
Status ReadActivation(const JsonScope& s, ModelConfig* c) {
  if (c->architecture == Architecture::kGptOss) return Status::Ok();
  const bool gemma = IsGemma(c->architecture);
  const char* key = gemma ? "hidden_activation" : "hidden_act";
  std::string act = gemma ? "gelu_pytorch_tanh" : "silu";
  LLM_RETURN_IF_ERROR(s.String(key, &act));
  if (act == "silu") {
    c->hidden_act = HiddenAct::kSilu;
  } else if (act == "gelu_pytorch_tanh") {
    c->hidden_act = HiddenAct::kGeluTanh;
  } else {
    return Unimplemented(s.Name(key) + " is '" + act + "'; implemented: silu, gelu_pytorch_tanh");
  }
  return Status::Ok();
}

// Biases. Llama and Qwen3(-MoE): attention_bias covers q/k/v/o and mlp_bias gate/up/down. Qwen2
// always has q/k/v biases and no o/mlp bias (its config class has neither key). gpt-oss:
// attention_bias for q/k/v/o (its experts always have biases). Gemma: attention_bias for q/k/v/o
// as Llama, no mlp_bias. Mistral and Mixtral have none.
Status ReadBiases(const JsonScope& s, ModelConfig* c) {
  const Architecture a = c->architecture;
  if (a == Architecture::kQwen2) c->qkv_bias = true;
  bool attention_bias = false, mlp_bias = false;
  LLM_RETURN_IF_ERROR(s.Bool("attention_bias", &attention_bias));
  LLM_RETURN_IF_ERROR(s.Bool("mlp_bias", &mlp_bias));
  const bool attn_ok = a == Architecture::kLlama || a == Architecture::kQwen3 ||
                       a == Architecture::kQwen3Moe || a == Architecture::kGptOss || IsGemma(a);
  const bool mlp_ok = a == Architecture::kLlama || a == Architecture::kQwen3;
  if ((attention_bias && !attn_ok) || (mlp_bias && !mlp_ok)) {
    return Unimplemented(s.Name(attention_bias && !attn_ok ? "attention_bias" : "mlp_bias") +
                         " = true is not part of " + c->architecture_name);
  }
  if (attn_ok) c->qkv_bias = c->o_bias = attention_bias;
  c->mlp_bias = mlp_bias;
  return Status::Ok();
}

// Routed MoE layers. Mixtral: num_local_experts experts of intermediate_size on every layer,
// softmax top-k renormalized (router_jitter_noise only perturbs training). Qwen3-MoE: experts of
// moe_intermediate_size on layer l iff l is not in mlp_only_layers and (l + 1) %
// decoder_sparse_step == 0, a dense MLP of intermediate_size elsewhere; norm_topk_prob.
// gpt-oss: num_local_experts of intermediate_size on every layer, swiglu_limit.
Status ReadMoe(const JsonScope& s, ModelConfig* c) {
  const Architecture a = c->architecture;
  if (a != Architecture::kMixtral && a != Architecture::kQwen3Moe && a != Architecture::kGptOss) {
    return Status::Ok();
  }
  MoeSettings& m = c->moe;
  // transformers 5 writes Qwen3-MoE's num_experts as num_local_experts; 4.x num_experts.
  int experts = 0, alias = 0;
  LLM_RETURN_IF_ERROR(s.Int("num_local_experts", &experts));
  if (a == Architecture::kQwen3Moe) {
    LLM_RETURN_IF_ERROR(s.Int("num_experts", &alias));
    if (experts != 0 && alias != 0 && experts != alias) {
      return InvalidArgument(s.Name("num_experts") + " and num_local_experts disagree");
    }
    if (experts == 0) experts = alias;
  }
  if (experts == 0) {
    return InvalidArgument(
        s.Name(a == Architecture::kQwen3Moe ? "num_experts" : "num_local_experts") +
        " is required");
  }
  m.num_experts = experts;
  LLM_RETURN_IF_ERROR(s.Int("num_experts_per_tok", &m.top_k, true, 1, experts));
  m.intermediate = c->intermediate_size;
  m.layers.assign(c->num_layers, true);
  m.normalize = a != Architecture::kQwen3Moe;
  if (a == Architecture::kMixtral) {
    float jitter = 0.0f;
    LLM_RETURN_IF_ERROR(s.Float("router_jitter_noise", &jitter));  // training only
  } else if (a == Architecture::kQwen3Moe) {
    LLM_RETURN_IF_ERROR(s.Int("moe_intermediate_size", &m.intermediate, true));
    m.normalize = false;
    LLM_RETURN_IF_ERROR(s.Bool("norm_topk_prob", &m.normalize));
    int step = 1;
    LLM_RETURN_IF_ERROR(s.Int("decoder_sparse_step", &step));
    for (int l = 0; l < c->num_layers; ++l) m.layers[l] = (l + 1) % step == 0;
    if (s.Has("mlp_only_layers")) {
      const json& only = s.j["mlp_only_layers"];
      if (!only.is_array()) return InvalidArgument(s.Name("mlp_only_layers") + " must be a list");
      for (const json& l : only) {
        if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c->num_layers) {
          return InvalidArgument(s.Name("mlp_only_layers") + " holds " + l.dump() +
                                 ", not a layer index");
        }
        m.layers[l.get<int>()] = false;
      }
    }
  } else {
    LLM_RETURN_IF_ERROR(s.Float("swiglu_limit", &m.swiglu_limit));
    if (m.swiglu_limit <= 0.0f) return InvalidArgument(s.Name("swiglu_limit") + " must be > 0");
  }
  return Status::Ok();
}

// Gemma's attention scale and soft-caps; bidirectional attention (an encoder use) is refused.
Status ReadGemmaKeys(const JsonScope& s, ModelConfig* c) {
  if (!IsGemma(c->architecture)) return Status::Ok();
  // Required: the config classes default it to 256 whatever head_dim is.
  float scalar = 0.0f;
  LLM_RETURN_IF_ERROR(s.Float("query_pre_attn_scalar", &scalar, true));
  if (scalar <= 0.0f) return InvalidArgument(s.Name("query_pre_attn_scalar") + " must be > 0");
  c->query_pre_attn_scalar = scalar;
  // Gemma 2's defaults are 50 and 30; Gemma 3's null. A null key is no cap.
  const bool g2 = c->architecture == Architecture::kGemma2;
  for (auto [key, out, def] :
       {std::tuple{"attn_logit_softcapping", &c->attn_logit_softcap, 50.0f},
        std::tuple{"final_logit_softcapping", &c->final_logit_softcap, 30.0f}}) {
    *out = g2 && !s.Contains(key) ? def : 0.0f;
    LLM_RETURN_IF_ERROR(s.Float(key, out));
    if (*out < 0.0f) return InvalidArgument(s.Name(key) + " must be >= 0");
  }
  bool bidirectional = false;
  LLM_RETURN_IF_ERROR(s.Bool("use_bidirectional_attention", &bidirectional));
  if (bidirectional) {
    return Unimplemented(s.Name("use_bidirectional_attention") +
                         " = true (bidirectional attention) is not implemented");
  }
  return Status::Ok();
}

// Rope settings: one table for every layer, or (Gemma 3) one for the full-attention layers
// (rope_theta / rope_scaling; rope_parameters.full_attention) and one for the sliding layers
// (rope_local_base_freq, default rope; rope_parameters.sliding_attention).
Status ReadRope(const json& j, const std::string& file, ModelConfig* c) {
  const JsonScope s{j, file};
  LLM_ASSIGN_OR_RETURN(auto per_type, ReadRopeParametersPerLayerType(j, file, 10000.0));
  const bool gemma3 = c->architecture == Architecture::kGemma3;
  RopeParameters full, sliding;
  sliding.theta = 10000.0;
  if (gemma3 && s.Has("rope_local_base_freq")) {
    float t = 0;
    LLM_RETURN_IF_ERROR(s.Float("rope_local_base_freq", &t));
    sliding.theta = j["rope_local_base_freq"].get<double>();
  }
  if (gemma3 && !per_type.empty()) {
    for (const auto& [type, p] : per_type) {
      if (type != "full_attention" && type != "sliding_attention") {
        return InvalidArgument(s.Name("rope_parameters") + " has layer type '" + type +
                               "'; expected full_attention and sliding_attention");
      }
    }
    if (!per_type.count("full_attention") || !per_type.count("sliding_attention")) {
      return InvalidArgument(s.Name("rope_parameters") +
                             " needs both full_attention and sliding_attention");
    }
    full = per_type["full_attention"];
    if (s.Has("rope_local_base_freq") && sliding.theta != per_type["sliding_attention"].theta) {
      return InvalidArgument(file +
                             ": rope_local_base_freq and rope_parameters.sliding_attention "
                             "disagree");
    }
    sliding = per_type["sliding_attention"];
  } else {
    LLM_ASSIGN_OR_RETURN(full, ReadRopeParameters(j, file, 10000.0));
  }
  for (const RopeParameters* p : {&full, &sliding}) {
    float partial = p->partial_rotary_factor.value_or(1.0f);
    LLM_RETURN_IF_ERROR(s.Float("partial_rotary_factor", &partial));
    if (partial != 1.0f) {
      return Unimplemented(s.Name("partial_rotary_factor") + " = " + std::to_string(partial) +
                           " is not implemented for " + c->architecture_name + " (only 1.0)");
    }
  }
  LLM_RETURN_IF_ERROR(SetRope(full, file, c, &c->rope_theta, &c->rope_scaling));
  if (gemma3) {
    c->sliding_layers_own_rope = true;
    LLM_RETURN_IF_ERROR(
        SetRope(sliding, file, c, &c->sliding_rope_theta, &c->sliding_rope_scaling));
  }
  return Status::Ok();
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
  static const std::pair<const char*, Architecture> kNames[] = {
      {"LlamaForCausalLM", Architecture::kLlama},
      {"MistralForCausalLM", Architecture::kMistral},
      {"Qwen2ForCausalLM", Architecture::kQwen2},
      {"Qwen3ForCausalLM", Architecture::kQwen3},
      {"MixtralForCausalLM", Architecture::kMixtral},
      {"Qwen3MoeForCausalLM", Architecture::kQwen3Moe},
      {"Gemma2ForCausalLM", Architecture::kGemma2},
      {"Gemma3ForCausalLM", Architecture::kGemma3},
      {"GptOssForCausalLM", Architecture::kGptOss}};
  bool known = false;
  for (const auto& [name, arch] : kNames) {
    if (c.architecture_name == name) {
      c.architecture = arch;
      known = true;
    }
  }
  if (!known) {
    std::string list;
    for (const auto& [name, arch] : kNames) list += std::string(name) + ", ";
    return Unimplemented(file + ": unsupported architecture '" + c.architecture_name +
                         "' (supported: " + list + "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
  }
  c.qk_norm = c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe ||
              c.architecture == Architecture::kGemma3;
  c.attention_sinks = c.architecture == Architecture::kGptOss;
  LLM_RETURN_IF_ERROR(s.Int("hidden_size", &c.hidden_size, true));
  LLM_RETURN_IF_ERROR(s.Int("intermediate_size", &c.intermediate_size, true));
  LLM_RETURN_IF_ERROR(s.Int("num_hidden_layers", &c.num_layers, true));
  LLM_RETURN_IF_ERROR(s.Int("num_attention_heads", &c.num_q_heads, true));
  c.num_kv_heads = c.num_q_heads;
  LLM_RETURN_IF_ERROR(s.Int("num_key_value_heads", &c.num_kv_heads));
  LLM_RETURN_IF_ERROR(s.Int("vocab_size", &c.vocab_size, true));
  LLM_RETURN_IF_ERROR(s.Int("max_position_embeddings", &c.max_position_embeddings));
  // Gemma's and gpt-oss's config classes default head_dim to 256 / 64, not hidden / heads:
  // required there rather than guessed.
  const bool head_dim_required = IsGemma(c.architecture) || c.architecture == Architecture::kGptOss;
  if (head_dim_required && !s.Has("head_dim")) {
    return InvalidArgument(s.Name("head_dim") + " is required for " + c.architecture_name);
  }
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

  LLM_RETURN_IF_ERROR(ReadActivation(s, &c));
  LLM_RETURN_IF_ERROR(ReadBiases(s, &c));
  LLM_RETURN_IF_ERROR(ReadMoe(s, &c));
  LLM_RETURN_IF_ERROR(ReadGemmaKeys(s, &c));
  LLM_RETURN_IF_ERROR(ReadSlidingWindow(s, &c));
  LLM_RETURN_IF_ERROR(ReadRope(j, file, &c));
  // transformers 5 writes "dtype", 4.x "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    std::string name;
    LLM_RETURN_IF_ERROR(s.String(key, &name));
    DType t;
    if (!name.empty() && ParseDType(name, &t)) c.dtype = t;
  }
  LLM_RETURN_IF_ERROR(
      ReadQuantizationConfig(j, file, &c.quantization, c.architecture == Architecture::kGptOss));
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
  const float d = query_pre_attn_scalar.value_or(static_cast<float>(head_dim));
  return a * a / std::sqrt(d);
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
    case Architecture::kMixtral:
      return "MixtralForCausalLM";
    case Architecture::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
    case Architecture::kGemma2:
      return "Gemma2ForCausalLM";
    case Architecture::kGemma3:
      return "Gemma3ForCausalLM";
    case Architecture::kGptOss:
      return "GptOssForCausalLM";
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

Status ReadQuantizationConfig(const json& j, const std::string& file, WeightQuantization* out,
                              bool allow_mxfp4) {
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
  if (method == "mxfp4" && allow_mxfp4) {  // which modules stay unquantized the tensors say
    out->method = M::kMxfp4;
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
                       "; supported: fp8, fbgemm_fp8, modelopt FP8, compressed-tensors fp8, "
                       "mxfp4 for GptOssForCausalLM)");
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  try {
    return LoadModelConfigImpl(model_dir);
  } catch (const std::exception& e) {  // the checked accessors should leave nothing to catch
    return InvalidArgument(model_dir + "/config.json: " + e.what());
  }
}

}  // namespace llm
