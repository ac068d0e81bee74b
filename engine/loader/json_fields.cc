#include "engine/loader/json_fields.h"

#include <cmath>
#include <fstream>

namespace llm {

using json = nlohmann::json;

StatusOr<json> ReadJsonObject(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open " + path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(path + " is not valid JSON");
  if (!j.is_object()) return DataLoss(path + " is not a JSON object");
  return j;
}

std::string JsonScope::Name(const char* key) const {
  return where + ": field '" + key + "'";
}

Status JsonScope::Int(const char* key, int* out, bool required, int min_value,
                      int max_value) const {
  if (!Has(key)) {
    if (required) return InvalidArgument(Name(key) + " is required (missing or null)");
    return Status::Ok();
  }
  const json& v = j[key];
  if (!v.is_number_integer()) {
    return InvalidArgument(Name(key) + " must be an integer, got " + v.dump());
  }
  const int64_t x =
      v.is_number_unsigned() && v.get<uint64_t>() > (1ull << 62) ? (1ll << 62) : v.get<int64_t>();
  if (x < min_value || x > max_value) {
    return InvalidArgument(Name(key) + " must be in [" + std::to_string(min_value) + ", " +
                           std::to_string(max_value) + "], got " + v.dump());
  }
  *out = static_cast<int>(x);
  return Status::Ok();
}

Status JsonScope::Float(const char* key, float* out, bool required) const {
  if (!Has(key)) {
    if (required) return InvalidArgument(Name(key) + " is required (missing or null)");
    return Status::Ok();
  }
  const json& v = j[key];
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    return InvalidArgument(Name(key) + " must be a finite number, got " + v.dump());
  }
  *out = v.get<float>();
  return Status::Ok();
}

Status JsonScope::Bool(const char* key, bool* out) const {
  if (!Has(key)) return Status::Ok();
  if (!j[key].is_boolean()) {
    return InvalidArgument(Name(key) + " must be true or false, got " + j[key].dump());
  }
  *out = j[key].get<bool>();
  return Status::Ok();
}

Status JsonScope::String(const char* key, std::string* out, bool required) const {
  if (!Has(key)) {
    if (required) return InvalidArgument(Name(key) + " is required (missing or null)");
    return Status::Ok();
  }
  if (!j[key].is_string()) {
    return InvalidArgument(Name(key) + " must be a string, got " + j[key].dump());
  }
  *out = j[key].get<std::string>();
  return Status::Ok();
}

StatusOr<const json*> JsonScope::Object(const char* key) const {
  if (!Has(key)) return static_cast<const json*>(nullptr);
  if (!j[key].is_object()) {
    return InvalidArgument(Name(key) + " must be an object or null, got " + j[key].dump());
  }
  return &j[key];
}

JsonScope JsonScope::Sub(const json& child, const char* key) const {
  const bool top = where.find(": ") == std::string::npos;
  return JsonScope{child, top ? where + ": " + key : where + "." + key};
}

}  // namespace llm
