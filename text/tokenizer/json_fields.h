// Small readers for tokenizer.json components. Wrong JSON types throw nlohmann exceptions, which
// Tokenizer::FromJson turns into an InvalidArgument status.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace llm::tokenizer_internal {

inline std::string TypeOf(const nlohmann::json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"];
  return "<missing>";
}

inline bool IsNullOrMissing(const nlohmann::json& j, const char* key) {
  return !j.is_object() || !j.contains(key) || j[key].is_null();
}

// A string field; `fallback` when absent or null.
inline std::string StringOr(const nlohmann::json& j, const char* key, std::string fallback) {
  return IsNullOrMissing(j, key) ? fallback : j[key].get<std::string>();
}

inline bool BoolOr(const nlohmann::json& j, const char* key, bool fallback) {
  return IsNullOrMissing(j, key) ? fallback : j[key].get<bool>();
}

}  // namespace llm::tokenizer_internal
