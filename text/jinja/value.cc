#include "text/jinja/value.h"

#include <cmath>

#include "text/jinja/error.h"

namespace llm::jinja {

namespace {

constexpr int kMaxDepth = 512;

[[noreturn]] void TooDeep(const char* what) {
  throw JinjaError(ErrorKind::kLimit, std::string(what) + " nested deeper than 512");
}

}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& j) {
  return FromJson(j, 0);
}

Value Value::FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxDepth) TooDeep("input JSON");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      // Python ints are unbounded; beyond int64 the nearest float is the closest we have.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e, depth + 1));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        items.emplace_back(String(it.key()), FromJson(it.value(), depth + 1));
      }
      return Dict(std::move(items));
    }
    default:
      return None();
  }
}

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  return str_ ? *str_ : kEmpty;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !str_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return namespace_ || !dict_->empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

bool Value::Equals(const Value& o) const {
  return Equals(o, 0);
}

bool Value::Equals(const Value& o, int depth) const {
  if (depth > kMaxDepth) TooDeep("compared value");
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_double() == o.as_double();
    return int_ == o.int_;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return *str_ == *o.str_;
    case Kind::kList: {
      // A tuple never equals a list in Python.
      if (tuple_ != o.tuple_ || list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*o.list_)[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (namespace_ || o.namespace_) return dict_ == o.dict_;
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* ov = o.Find(k);
        if (ov == nullptr || !v.Equals(*ov, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kCallable:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

const Value* Value::Find(const Value& key) const {
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k.Equals(key)) return &v;
  }
  return nullptr;
}

const Value* Value::Find(const std::string& key) const {
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void Value::Set(const Value& key, Value value) const {
  for (auto& [k, v] : *dict_) {
    if (k.Equals(key)) {
      v = std::move(value);
      return;
    }
  }
  dict_->emplace_back(key, std::move(value));
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return namespace_ ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

Value CallArgs::Get(size_t index, const std::string& name) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return v;
  }
  return Value();
}

bool CallArgs::Has(size_t index, const std::string& name) const {
  if (index < positional.size()) return true;
  for (const auto& [k, v] : keyword) {
    if (k == name) return true;
  }
  return false;
}

}  // namespace llm::jinja
