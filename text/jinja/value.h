// Value: the dynamic type a template computes with. It models the Python objects that jinja2
// templates see (None, bool, int, float, str, list, tuple, dict, jinja2's Undefined, namespace,
// callables) closely enough that printing, comparing and serializing give Python's bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm::jinja {

class Value;
struct CallArgs;
class Interpreter;

using ValueList = std::vector<Value>;
// Insertion-ordered like a Python dict; keys are Values compared with Python equality.
using ValueDict = std::vector<std::pair<Value, Value>>;
using NativeFunction = std::function<Value(Interpreter&, CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // Undefined
  static Value Undefined(std::string hint = "") {
    Value v;
    v.str_ = std::make_shared<std::string>(std::move(hint));
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b ? 1 : 0;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double d) {
    Value v(Kind::kFloat);
    v.float_ = d;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::make_shared<std::string>(std::move(s));
    return v;
  }
  static Value List(ValueList items, bool tuple = false) {
    Value v(Kind::kList);
    v.list_ = std::make_shared<ValueList>(std::move(items));
    v.tuple_ = tuple;
    return v;
  }
  static Value Dict(ValueDict items = {}) {
    Value v(Kind::kDict);
    v.dict_ = std::make_shared<ValueDict>(std::move(items));
    return v;
  }
  // jinja2's namespace(): a dict whose attributes may be assigned with {% set ns.x = ... %}.
  static Value Namespace(ValueDict items) {
    Value v = Dict(std::move(items));
    v.namespace_ = true;
    return v;
  }
  static Value Callable(std::string name, NativeFunction fn) {
    Value v(Kind::kCallable);
    v.str_ = std::make_shared<std::string>(std::move(name));
    v.fn_ = std::make_shared<NativeFunction>(std::move(fn));
    return v;
  }
  // Input data arrives as JSON; ordered_json keeps the key order Python's dict would have.
  // Throws JinjaError(kLimit) beyond 512 levels of nesting.
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return is_list() && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return is_dict() && namespace_; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_double() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return *str_; }
  const std::string& undefined_hint() const;
  ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const NativeFunction& function() const { return *fn_; }
  const std::string& callable_name() const { return *str_; }

  // Python's bool(x) (Undefined is false).
  bool Truthy() const;
  // Python's ==, as jinja2 sees it (Undefined equals only Undefined; 1 == 1.0 == True).
  bool Equals(const Value& other) const;
  // Dict lookup by key; null when absent.
  const Value* Find(const Value& key) const;
  const Value* Find(const std::string& key) const;
  void Set(const Value& key, Value value) const;
  // Python's type name, used in error messages ("dict object", "str object").
  std::string TypeName() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}
  static Value FromJson(const nlohmann::ordered_json& j, int depth);
  bool Equals(const Value& other, int depth) const;

  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  bool namespace_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<std::string> str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<NativeFunction> fn_;
};

// Positional and keyword arguments of a call, as Python passes them.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`; Undefined when neither was passed.
  Value Get(size_t index, const std::string& name) const;
  bool Has(size_t index, const std::string& name) const;
};

}  // namespace llm::jinja
