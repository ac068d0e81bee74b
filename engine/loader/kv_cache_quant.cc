#include "engine/loader/kv_cache_quant.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/quant.h"

namespace llm {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "llm-kv-scales-v1";

const char* kHowToCalibrate =
    "produce them with `llm-calibrate-kv --model DIR --prompts PROMPTS.txt --out scales.json "
    "[--granularity per_head|per_channel]` and pass `--kv-scales-file scales.json` "
    "(config key kv_scales_file), or use kv_cache_dtype fp8_e4m3_dynamic, which needs no scales";

float QuantMax(DType dtype) {
  return dtype == DType::kI8 ? kInt8Max : kFp8E4M3Max;
}

std::string LayerName(int layer) {
  return "layer " + std::to_string(layer);
}

// Per-head <-> per-channel conversion of one layer's values (absmax or scales alike).
std::vector<float> ToGranularity(const std::vector<float>& x, bool from_per_channel,
                                 bool to_per_channel, int heads, int head_dim) {
  if (from_per_channel == to_per_channel) return x;
  std::vector<float> y;
  if (to_per_channel) {  // repeat each head's value over its channels
    for (int h = 0; h < heads; ++h) y.insert(y.end(), head_dim, x[h]);
  } else {  // each head's maximum
    for (int h = 0; h < heads; ++h) {
      y.push_back(*std::max_element(x.begin() + static_cast<long>(h) * head_dim,
                                    x.begin() + static_cast<long>(h + 1) * head_dim));
    }
  }
  return y;
}

// Checkpoint tensor names tried for layer `layer`, K (`which` = 'k') or V.
std::vector<std::string> CheckpointNames(int layer, char which) {
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const std::string w(1, which);
  return {p + w + "_scale", p + "attn." + w + "_scale", p + "cache_" + w + "_scale",
          p + "attn.cache_" + w + "_scale", p + w + "_proj.output_scale"};
}

// Reads one checkpoint scale tensor as fp32; *per_channel tells its granularity.
Status ReadCheckpointScale(const WeightStore& w, const std::string& name, const ModelConfig& c,
                           std::vector<float>* out, bool* per_channel) {
  LLM_ASSIGN_OR_RETURN(const TensorView* t, w.Get(name));
  const int64_t heads = c.num_kv_heads, d = c.head_dim;
  const std::vector<int64_t>& s = t->shape;
  const bool scalar = s.empty() || (t->numel() == 1 && heads > 1);
  if (scalar) {
    return InvalidArgument(
        "KV cache scale '" + name + "' has shape " + t->ShapeString() +
        ": a per-tensor scale, which this server does not offer (one scale for all heads loses "
        "too much precision in an 8-bit cache). Scales must be per KV head [" +
        std::to_string(heads) + "] or per channel [" + std::to_string(heads) + ", " +
        std::to_string(d) + "]; " + kHowToCalibrate);
  }
  if (s == std::vector<int64_t>{heads}) {
    *per_channel = false;
  } else if (s == std::vector<int64_t>{heads * d} || s == std::vector<int64_t>{heads, d}) {
    *per_channel = true;
  } else {
    return InvalidArgument("KV cache scale '" + name + "' has shape " + t->ShapeString() +
                           "; expected [" + std::to_string(heads) + "] (per head), [" +
                           std::to_string(heads * d) + "] or [" + std::to_string(heads) + ", " +
                           std::to_string(d) + "] (per channel)");
  }
  if (t->dtype != DType::kF32 && t->dtype != DType::kF16 && t->dtype != DType::kBF16) {
    return InvalidArgument("KV cache scale '" + name + "' has dtype " + DTypeName(t->dtype) +
                           "; expected float32, float16 or bfloat16");
  }
  out->resize(static_cast<size_t>(t->numel()));
  ConvertToF32(t->dtype, t->data, out->data(), out->size());
  for (float x : *out) {
    if (!(x > 0.0f) || !std::isfinite(x)) {
      return InvalidArgument("KV cache scale '" + name + "' holds " + std::to_string(x) +
                             "; scales must be positive and finite");
    }
  }
  return Status::Ok();
}

StatusOr<KvCacheScales> ScalesFromFile(const ModelConfig& c, const KvCacheType& type,
                                       const std::string& path) {
  LLM_ASSIGN_OR_RETURN(KvAbsmax a, ReadKvAbsmaxFile(path, c));
  const bool want_channel = type.quant == KvQuant::kStaticPerChannel;
  const float qmax = QuantMax(type.dtype);
  KvCacheScales s;
  s.source = path + " (" + (a.per_channel ? "per_channel" : "per_head") + " absmax)";
  for (int l = 0; l < c.num_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<float> x = ToGranularity(kv == 0 ? a.k[l] : a.v[l], a.per_channel, want_channel,
                                           c.num_kv_heads, c.head_dim);
      for (float& e : x) {
        const float scale = e / qmax;
        e = scale > 0.0f ? scale : 1.0f;  // absmax 0 (or underflow): scale 1
      }
      (kv == 0 ? s.k : s.v).push_back(std::move(x));
    }
  }
  return s;
}

StatusOr<KvCacheScales> ScalesFromCheckpoint(const ModelConfig& c, const WeightStore& w,
                                             const KvCacheType& type) {
  const bool want_channel = type.quant == KvQuant::kStaticPerChannel;
  KvCacheScales s;
  s.source = "checkpoint";
  for (int l = 0; l < c.num_layers; ++l) {
    for (char which : {'k', 'v'}) {
      const std::vector<std::string> names = CheckpointNames(l, which);
      const std::string* found = nullptr;
      for (const std::string& n : names) {
        if (w.Has(n)) {
          found = &n;
          break;
        }
      }
      if (found == nullptr) {
        std::string tried;
        for (const std::string& n : names) tried += (tried.empty() ? "" : ", ") + n;
        return FailedPrecondition(std::string("kv_cache_dtype ") + DTypeName(type.dtype) + " (" +
                                  KvQuantName(type.quant) + ") needs " +
                                  (which == 'k' ? "K" : "V") + " cache scales, but " +
                                  LayerName(l) +
                                  " has none: no kv_scales_file was given and "
                                  "the checkpoint has none of " +
                                  tried + "; " + kHowToCalibrate);
      }
      std::vector<float> x;
      bool per_channel = false;
      LLM_RETURN_IF_ERROR(ReadCheckpointScale(w, *found, c, &x, &per_channel));
      x = ToGranularity(x, per_channel, want_channel, c.num_kv_heads, c.head_dim);
      if (type.dtype == DType::kI8) {  // checkpoint scales are fp8 scales: same absmax
        for (float& e : x) e = e * kFp8E4M3Max / kInt8Max;
      }
      (which == 'k' ? s.k : s.v).push_back(std::move(x));
    }
  }
  return s;
}

// Parses one absmax list of a layer; the error names the file, layer and key.
Status ReadAbsmaxList(const json& layer, const char* key, size_t want, const std::string& where,
                      std::vector<float>* out) {
  if (!layer.contains(key) || !layer[key].is_array()) {
    return InvalidArgument(where + ": missing list '" + key + "'");
  }
  const json& a = layer[key];
  if (a.size() != want) {
    return InvalidArgument(where + ": '" + key + "' has " + std::to_string(a.size()) +
                           " values, expected " + std::to_string(want));
  }
  out->clear();
  for (const json& e : a) {
    if (!e.is_number()) return InvalidArgument(where + ": '" + key + "' holds a non-number");
    const double x = e.get<double>();
    if (!(x >= 0.0) || !std::isfinite(x)) {
      return InvalidArgument(where + ": '" + key + "' holds " + e.dump() +
                             "; absmax values must be finite and >= 0");
    }
    out->push_back(static_cast<float>(x));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<KvCacheType> ParseKvCacheType(const std::string& dtype, const std::string& granularity) {
  KvCacheType t;
  bool per_channel = false;
  if (granularity == "per_channel") {
    per_channel = true;
  } else if (granularity != "per_head") {
    return InvalidArgument("kv_scale_granularity must be per_head or per_channel, got '" +
                           granularity + "' (per-tensor scales are not offered)");
  }
  const KvQuant static_quant = per_channel ? KvQuant::kStaticPerChannel : KvQuant::kStaticPerHead;
  if (dtype == "auto" || dtype.empty()) {
    t = {DType::kF32, KvQuant::kNone};
  } else if (dtype == "int8") {
    t = {DType::kI8, static_quant};
  } else if (dtype == "fp8_e4m3") {
    t = {DType::kFp8E4M3, static_quant};
  } else if (dtype == "fp8_e4m3_dynamic") {
    t = {DType::kFp8E4M3, KvQuant::kDynamicPerToken};
  } else {
    return InvalidArgument(
        "kv_cache_dtype must be auto, int8, fp8_e4m3 or fp8_e4m3_dynamic, got '" + dtype + "'");
  }
  return t;
}

StatusOr<KvCacheScales> LoadKvCacheScales(const ModelConfig& config, const WeightStore& weights,
                                          const KvCacheType& type, const std::string& scales_file) {
  if (!type.is_static()) return InvalidArgument("KV cache scales requested for a non-static cache");
  if (!scales_file.empty()) return ScalesFromFile(config, type, scales_file);
  return ScalesFromCheckpoint(config, weights, type);
}

StatusOr<KvCacheScales> KvCacheScalesOfHeads(const KvCacheScales& whole, int first_kv_head,
                                             int num_kv_heads, int per_head) {
  const size_t begin = static_cast<size_t>(first_kv_head) * per_head;
  const size_t count = static_cast<size_t>(num_kv_heads) * per_head;
  KvCacheScales part;
  part.source = whole.source + ", KV heads " + std::to_string(first_kv_head) + ".." +
                std::to_string(first_kv_head + num_kv_heads - 1);
  for (const auto* list : {&whole.k, &whole.v}) {
    auto& out = list == &whole.k ? part.k : part.v;
    for (size_t l = 0; l < list->size(); ++l) {
      const std::vector<float>& x = (*list)[l];
      if (first_kv_head < 0 || num_kv_heads <= 0 || per_head <= 0 || begin + count > x.size()) {
        return InvalidArgument(
            "KV cache scales of layer " + std::to_string(l) + " hold " + std::to_string(x.size()) +
            " floats, not KV heads [" + std::to_string(first_kv_head) + ", " +
            std::to_string(first_kv_head + num_kv_heads) + ") of " + std::to_string(per_head));
      }
      out.emplace_back(x.begin() + begin, x.begin() + begin + count);
    }
  }
  return part;
}

Status WriteKvAbsmaxFile(const std::string& path, const KvAbsmax& a) {
  json layers = json::array();
  for (size_t l = 0; l < a.k.size(); ++l) {
    layers.push_back({{"k_absmax", a.k[l]}, {"v_absmax", a.v[l]}});
  }
  const json j = {{"format", kFormat},
                  {"granularity", a.per_channel ? "per_channel" : "per_head"},
                  {"num_kv_heads", a.num_kv_heads},
                  {"head_dim", a.head_dim},
                  {"layers", layers}};
  std::ofstream out(path, std::ios::trunc);
  if (!out) return NotFound("cannot write " + path);
  out << j.dump(1) << "\n";
  if (!out) return Internal("write to " + path + " failed");
  return Status::Ok();
}

StatusOr<KvAbsmax> ReadKvAbsmaxFile(const std::string& path, const ModelConfig& c) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open KV scales file " + path);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + " is not a JSON object");
  if (j.value("format", std::string()) != kFormat) {
    return InvalidArgument(path + ": \"format\" must be \"" + std::string(kFormat) +
                           "\" (a file written by llm-calibrate-kv)");
  }
  KvAbsmax a;
  const std::string g = j.value("granularity", std::string());
  if (g == "per_channel") {
    a.per_channel = true;
  } else if (g != "per_head") {
    return InvalidArgument(path + ": \"granularity\" must be per_head or per_channel, got '" + g +
                           "' (per-tensor scales are not offered)");
  }
  a.num_kv_heads = j.value("num_kv_heads", c.num_kv_heads);
  a.head_dim = j.value("head_dim", c.head_dim);
  if (a.num_kv_heads != c.num_kv_heads || a.head_dim != c.head_dim) {
    return InvalidArgument(path + ": written for num_kv_heads " + std::to_string(a.num_kv_heads) +
                           ", head_dim " + std::to_string(a.head_dim) + " but the model has " +
                           std::to_string(c.num_kv_heads) + ", " + std::to_string(c.head_dim));
  }
  if (!j.contains("layers") || !j["layers"].is_array() ||
      j["layers"].size() != static_cast<size_t>(c.num_layers)) {
    return InvalidArgument(path + ": \"layers\" must list " + std::to_string(c.num_layers) +
                           " layers (one per model layer)");
  }
  const size_t want = static_cast<size_t>(c.num_kv_heads) * (a.per_channel ? c.head_dim : 1);
  a.k.resize(c.num_layers);
  a.v.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string where = path + " " + LayerName(l);
    LLM_RETURN_IF_ERROR(ReadAbsmaxList(j["layers"][l], "k_absmax", want, where, &a.k[l]));
    LLM_RETURN_IF_ERROR(ReadAbsmaxList(j["layers"][l], "v_absmax", want, where, &a.v[l]));
  }
  return a;
}

}  // namespace llm
