// Rotary-embedding settings as Hugging Face writes them, in either key layout:
//   transformers 4: top-level "rope_theta" and "rope_scaling": {"rope_type" | "type": ..., ...}
//   transformers 5: "rope_parameters": {"rope_type": ..., "rope_theta": ..., ...}, or a dict of
//                   such objects keyed by layer type ({"full_attention": {...}, ...}).
// Both layouts give the same RopeParameters. Types that the model code cannot apply are refused
// by name by the architecture's loader (see RopeTypeName).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace llm {

struct RopeParameters {
  enum class Type { kDefault, kLinear, kDynamic, kYarn, kLlama3, kLongrope };
  Type type = Type::kDefault;
  std::string type_name = "default";  // as written
  double theta = 10000.0;
  float factor = 1.0f;
  // llama3.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // llama3, yarn, longrope; absent: the architecture's default (max_position_embeddings).
  std::optional<int> original_max_position_embeddings;
  // yarn.
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  std::optional<float> mscale;
  std::optional<float> mscale_all_dim;
  std::optional<float> attention_factor;
  bool truncate = true;
  // transformers 5 may carry it here instead of at the top level.
  std::optional<float> partial_rotary_factor;
};

const char* RopeTypeName(RopeParameters::Type t);

// Reads the rope settings of config object `j` (file names it in errors). `layer_types`, when the
// config has it, names the layer types a per-layer-type rope_parameters dict must cover; every
// type must then carry identical settings (the models here have one rotary table). `default_theta`
// is the architecture's default rope_theta. Unknown rope types are Unimplemented naming them.
StatusOr<RopeParameters> ReadRopeParameters(const nlohmann::json& j, const std::string& file,
                                            double default_theta);

// transformers 5's per-layer-type form only ("rope_parameters": {"full_attention": {...},
// "sliding_attention": {...}}), for models whose layer types rotate differently (Gemma 3): each
// type's settings, keyed by type. An empty map when the config has no such dict (the 4.x layout,
// or one rope_parameters object); the caller then reads ReadRopeParameters and its own keys.
StatusOr<std::map<std::string, RopeParameters>> ReadRopeParametersPerLayerType(
    const nlohmann::json& j, const std::string& file, double default_theta);

}  // namespace llm
