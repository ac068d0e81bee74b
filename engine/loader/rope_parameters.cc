#include "engine/loader/rope_parameters.h"

#include "engine/loader/json_fields.h"

namespace llm {
namespace {

using json = nlohmann::json;
using Type = RopeParameters::Type;

// Keys each rope type may carry (HF's RopeParameters); anything else would be silently ignored.
bool KnownKey(Type t, const std::string& k) {
  if (k == "rope_type" || k == "type" || k == "rope_theta" || k == "partial_rotary_factor") {
    return true;
  }
  switch (t) {
    case Type::kDefault:
      return false;
    case Type::kLinear:
    case Type::kDynamic:
      return k == "factor" || (t == Type::kDynamic && k == "original_max_position_embeddings");
    case Type::kLlama3:
      return k == "factor" || k == "low_freq_factor" || k == "high_freq_factor" ||
             k == "original_max_position_embeddings";
    case Type::kYarn:
      return k == "factor" || k == "original_max_position_embeddings" || k == "beta_fast" ||
             k == "beta_slow" || k == "mscale" || k == "mscale_all_dim" ||
             k == "attention_factor" || k == "truncate";
    case Type::kLongrope:
      return k == "factor" || k == "original_max_position_embeddings" || k == "short_factor" ||
             k == "long_factor" || k == "attention_factor";
  }
  return false;
}

StatusOr<Type> ParseType(const std::string& name, const std::string& where) {
  if (name == "default" || name.empty()) return Type::kDefault;
  if (name == "linear") return Type::kLinear;
  if (name == "dynamic") return Type::kDynamic;
  if (name == "yarn") return Type::kYarn;
  if (name == "llama3") return Type::kLlama3;
  if (name == "longrope") return Type::kLongrope;
  return Unimplemented(where + ": unknown rope type '" + name +
                       "' (known: default, linear, dynamic, yarn, llama3, longrope)");
}

// One rope settings object (rope_scaling of v4, or rope_parameters / one of its per-layer-type
// entries of v5). Theta comes from `theta` unless the object carries rope_theta.
StatusOr<RopeParameters> ReadOne(const JsonScope& s, double theta) {
  RopeParameters p;
  p.theta = theta;
  std::string name;
  // "type" is the pre-4.45 spelling; rope_type wins when both are present.
  LLM_RETURN_IF_ERROR(s.String("type", &name));
  LLM_RETURN_IF_ERROR(s.String("rope_type", &name));
  LLM_ASSIGN_OR_RETURN(p.type, ParseType(name, s.where));
  p.type_name = name.empty() ? "default" : name;
  if (s.Has("rope_theta")) {
    float t = 0;
    LLM_RETURN_IF_ERROR(s.Float("rope_theta", &t));
    p.theta = s.j["rope_theta"].get<double>();
  }
  if (p.theta <= 1.0) return InvalidArgument(s.Name("rope_theta") + " must be > 1");
  if (s.Has("partial_rotary_factor")) {
    float f = 0;
    LLM_RETURN_IF_ERROR(s.Float("partial_rotary_factor", &f));
    p.partial_rotary_factor = f;
  }
  for (const auto& [k, v] : s.j.items()) {
    if (!KnownKey(p.type, k)) {
      return Unimplemented(s.where + ": key '" + k + "' is not implemented for rope type '" +
                           p.type_name + "'");
    }
  }
  const bool needs_factor = p.type != Type::kDefault;
  LLM_RETURN_IF_ERROR(s.Float("factor", &p.factor, needs_factor));
  if (needs_factor && p.factor <= 0.0f) return InvalidArgument(s.Name("factor") + " must be > 0");
  if (p.type == Type::kLlama3) {
    LLM_RETURN_IF_ERROR(s.Float("low_freq_factor", &p.low_freq_factor, true));
    LLM_RETURN_IF_ERROR(s.Float("high_freq_factor", &p.high_freq_factor, true));
    if (p.high_freq_factor <= p.low_freq_factor) {
      return InvalidArgument(s.where + ": llama3 rope needs high_freq_factor > low_freq_factor");
    }
  }
  if (s.Has("original_max_position_embeddings")) {
    int v = 0;
    LLM_RETURN_IF_ERROR(s.Int("original_max_position_embeddings", &v));
    p.original_max_position_embeddings = v;
  } else if (p.type == Type::kLlama3) {
    return InvalidArgument(s.Name("original_max_position_embeddings") +
                           " is required for llama3 rope");
  }
  if (p.type == Type::kYarn) {
    LLM_RETURN_IF_ERROR(s.Float("beta_fast", &p.beta_fast));
    LLM_RETURN_IF_ERROR(s.Float("beta_slow", &p.beta_slow));
    if (p.beta_fast <= 0.0f || p.beta_slow <= 0.0f) {
      return InvalidArgument(s.where + ": yarn beta_fast and beta_slow must be > 0");
    }
    for (auto [key, out] :
         {std::pair{"mscale", &p.mscale}, std::pair{"mscale_all_dim", &p.mscale_all_dim},
          std::pair{"attention_factor", &p.attention_factor}}) {
      if (!s.Has(key)) continue;
      float v = 0;
      LLM_RETURN_IF_ERROR(s.Float(key, &v));
      *out = v;
    }
    LLM_RETURN_IF_ERROR(s.Bool("truncate", &p.truncate));
  }
  return p;
}

bool Same(const RopeParameters& a, const RopeParameters& b) {
  return a.type == b.type && a.theta == b.theta && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
         a.mscale_all_dim == b.mscale_all_dim && a.attention_factor == b.attention_factor &&
         a.truncate == b.truncate && a.partial_rotary_factor == b.partial_rotary_factor;
}

// rope_parameters is a dict of settings objects keyed by layer type (transformers 5).
bool IsPerLayerType(const json& v5) {
  if (v5.empty()) return false;
  for (const auto& [k, v] : v5.items()) {
    if (!v.is_object()) return false;
  }
  return true;
}

double TopTheta(const JsonScope& top, double default_theta, Status* st) {
  if (!top.Has("rope_theta")) return default_theta;
  float t = 0;
  *st = top.Float("rope_theta", &t);
  return st->ok() ? top.j["rope_theta"].get<double>() : default_theta;
}

}  // namespace

const char* RopeTypeName(Type t) {
  switch (t) {
    case Type::kDefault:
      return "default";
    case Type::kLinear:
      return "linear";
    case Type::kDynamic:
      return "dynamic";
    case Type::kYarn:
      return "yarn";
    case Type::kLlama3:
      return "llama3";
    case Type::kLongrope:
      return "longrope";
  }
  return "?";
}

StatusOr<RopeParameters> ReadRopeParameters(const json& j, const std::string& file,
                                            double default_theta) {
  const JsonScope top{j, file};
  Status st = Status::Ok();
  const double theta = TopTheta(top, default_theta, &st);
  LLM_RETURN_IF_ERROR(st);
  LLM_ASSIGN_OR_RETURN(const json* v5, top.Object("rope_parameters"));
  LLM_ASSIGN_OR_RETURN(const json* v4, top.Object("rope_scaling"));
  if (v5 == nullptr) {
    if (v4 == nullptr) {
      RopeParameters p;
      p.theta = theta;
      if (p.theta <= 1.0) return InvalidArgument(top.Name("rope_theta") + " must be > 1");
      return p;
    }
    return ReadOne(top.Sub(*v4, "rope_scaling"), theta);
  }
  // transformers 5 may still write rope_scaling as an alias of rope_parameters; they must agree.
  const JsonScope s = top.Sub(*v5, "rope_parameters");
  const bool per_layer_type = IsPerLayerType(*v5);
  RopeParameters result;
  if (!per_layer_type) {
    LLM_ASSIGN_OR_RETURN(result, ReadOne(s, theta));
  } else {
    std::optional<RopeParameters> first;
    std::string first_key;
    for (const auto& [k, v] : v5->items()) {
      LLM_ASSIGN_OR_RETURN(RopeParameters p, ReadOne(s.Sub(v, k.c_str()), theta));
      if (first && !Same(*first, p)) {
        return Unimplemented(s.where + ": layer types '" + first_key + "' and '" + k +
                             "' use different rope settings; one rotary table per model is "
                             "implemented");
      }
      if (!first) first_key = k;
      first = p;
    }
    result = *first;
  }
  if (v4 != nullptr) {
    LLM_ASSIGN_OR_RETURN(RopeParameters old, ReadOne(top.Sub(*v4, "rope_scaling"), theta));
    if (!Same(old, result)) {
      return InvalidArgument(file + ": 'rope_scaling' and 'rope_parameters' disagree");
    }
  }
  return result;
}

StatusOr<std::map<std::string, RopeParameters>> ReadRopeParametersPerLayerType(
    const json& j, const std::string& file, double default_theta) {
  const JsonScope top{j, file};
  Status st = Status::Ok();
  const double theta = TopTheta(top, default_theta, &st);
  LLM_RETURN_IF_ERROR(st);
  LLM_ASSIGN_OR_RETURN(const json* v5, top.Object("rope_parameters"));
  std::map<std::string, RopeParameters> out;
  if (v5 == nullptr || !IsPerLayerType(*v5)) return out;
  const JsonScope s = top.Sub(*v5, "rope_parameters");
  for (const auto& [k, v] : v5->items()) {
    LLM_ASSIGN_OR_RETURN(RopeParameters p, ReadOne(s.Sub(v, k.c_str()), theta));
    out.emplace(k, p);
  }
  return out;
}

}  // namespace llm
