// Checked accessors for Hugging Face JSON config files. Every wrong type, null where a value is
// required, or out-of-range number is an error naming the file and the key; nothing here throws.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace llm {

// The JSON object in `path`; NotFound when it cannot be opened, DataLoss when it does not parse.
StatusOr<nlohmann::json> ReadJsonObject(const std::string& path);

// Names a key inside a file for error messages ("config.json: rope_parameters.factor").
struct JsonScope {
  const nlohmann::json& j;
  std::string where;  // "path/config.json" or "path/config.json: rope_parameters"

  bool Has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  bool Contains(const char* key) const { return j.contains(key); }
  std::string Name(const char* key) const;

  // Absent or null keeps *out unless `required`.
  Status Int(const char* key, int* out, bool required = false, int min_value = 1,
             int max_value = 1 << 30) const;
  Status Float(const char* key, float* out, bool required = false) const;
  Status Bool(const char* key, bool* out) const;
  Status String(const char* key, std::string* out, bool required = false) const;
  // Optional object: null or absent gives nullptr.
  StatusOr<const nlohmann::json*> Object(const char* key) const;
  JsonScope Sub(const nlohmann::json& child, const char* key) const;
};

}  // namespace llm
