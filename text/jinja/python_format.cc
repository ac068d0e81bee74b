#include "text/jinja/python_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/json_escape.h"
#include "base/utf8.h"
#include "text/jinja/error.h"

namespace llm::jinja {

namespace {

void AppendHex(std::string& out, const char* fmt, unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), fmt, v);
  out += buf;
}

JsonNonAscii NonAscii(const JsonDumpOptions& o) {
  return o.ensure_ascii ? JsonNonAscii::kEscape : JsonNonAscii::kRaw;
}

std::string JsonFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return PyFloatRepr(d);
}

void Dump(const Value& v, const JsonDumpOptions& o, int depth, std::string& out) {
  if (depth > 512) throw JinjaError(ErrorKind::kLimit, "tojson: value nested deeper than 512");
  auto newline = [&](int level) {
    if (!o.indent) return;
    out += '\n';
    out.append(static_cast<size_t>(*o.indent) * level, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += JsonFloat(v.as_double());
      return;
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), NonAscii(o), out);
      return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& e : v.list()) {
        if (!first) out += o.item_separator;
        first = false;
        newline(depth + 1);
        Dump(e, o, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_namespace()) ThrowRender("Object of type Namespace is not JSON serializable");
      if (v.dict().empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict()) items.push_back(&kv);
      if (o.sort_keys) {
        for (const auto* kv : items) {
          if (!kv->first.is_string()) ThrowRender("tojson: sort_keys needs string keys");
        }
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) {
          return a->first.as_string() < b->first.as_string();
        });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += o.item_separator;
        first = false;
        newline(depth + 1);
        const Value& k = kv->first;
        if (k.is_string()) {
          AppendJsonString(k.as_string(), NonAscii(o), out);
        } else if (k.is_bool()) {
          out += k.as_bool() ? "\"true\"" : "\"false\"";
        } else if (k.is_none()) {
          out += "\"null\"";
        } else if (k.is_int()) {
          out += '"' + std::to_string(k.as_int()) + '"';
        } else if (k.is_float()) {
          out += '"' + JsonFloat(k.as_double()) + '"';
        } else {
          ThrowRender("keys must be str, int, float, bool or None, not " + k.TypeName());
        }
        out += o.key_separator;
        Dump(kv->second, o, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      ThrowRender("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

std::vector<std::string> Utf8Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SeqLen(s, i);
    out.emplace_back(s, i, n);
    i += n;
  }
  return out;
}

size_t Utf8Length(const std::string& s) {
  size_t count = 0;
  for (size_t i = 0; i < s.size(); i += Utf8SeqLen(s, i)) ++count;
  return count;
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  int exp10 = std::stoi(sci.substr(e + 1));
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  int decpt = exp10 + 1;
  // CPython's repr switches to exponent form outside 1e-4 <= |x| < 1e16.
  if (decpt <= -4 || decpt > 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return sign + m + ebuf;
  }
  if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
  if (static_cast<size_t>(decpt) >= digits.size()) {
    return sign + digits + std::string(decpt - digits.size(), '0') + ".0";
  }
  return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

std::string PyStringRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SeqLen(s, i);
    uint32_t cp = DecodeUtf8(s, i, n);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
      AppendHex(out, "\\x%02x", cp);
    } else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0x200B && cp <= 0x200F) || cp == 0xFEFF) {
      AppendHex(out, "\\u%04x", cp);
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  out += quote;
  return out;
}

namespace {

std::string Repr(const Value& v, int depth);

}  // namespace

std::string PyRepr(const Value& v) {
  return Repr(v, 0);
}

namespace {

std::string Repr(const Value& v, int depth) {
  if (depth > 512) throw JinjaError(ErrorKind::kLimit, "printed value nested deeper than 512");
  switch (v.kind()) {
    case Value::Kind::kString:
      return PyStringRepr(v.as_string());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += ", ";
        out += Repr(v.list()[i], depth + 1);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, val] : v.dict()) {
        if (!first) out += ", ";
        first = false;
        out += Repr(k, depth + 1) + ": " + Repr(val, depth + 1);
      }
      return out + (v.is_namespace() ? "}>" : "}");
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return PyStr(v);
  }
}

}  // namespace

std::string PyStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return PyFloatRepr(v.as_double());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kCallable:
      return "<function " + v.callable_name() + ">";
    default:
      return PyRepr(v);
  }
}

std::string PyJsonDumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  Dump(v, options, 0, out);
  return out;
}

}  // namespace llm::jinja
