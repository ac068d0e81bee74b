// Python's text forms of values: str(), repr(), json.dumps() and UTF-8 code point helpers (Python
// strings index, slice and measure by code point).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace llm::jinja {

std::string PyStr(const Value& v);
std::string PyRepr(const Value& v);
std::string PyFloatRepr(double d);
std::string PyStringRepr(const std::string& s);

struct JsonDumpOptions {
  std::optional<int> indent;          // json.dumps(indent=...); a string indent is refused
  std::string item_separator = ", ";  // default becomes "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...). Throws JinjaError for values json cannot serialize (Undefined, callables).
std::string PyJsonDumps(const Value& v, const JsonDumpOptions& options);

// UTF-8 code points (invalid bytes decode as U+FFFD-free single units so lengths stay defined).
std::vector<std::string> Utf8Chars(const std::string& s);
size_t Utf8Length(const std::string& s);

}  // namespace llm::jinja
