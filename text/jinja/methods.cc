// Attribute and item access, and the Python methods of str, dict and list that templates call.
#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/python_format.h"
#include "text/jinja/string_methods.h"

namespace llm::jinja {

namespace {

Value Str(std::string s) {
  return Value::String(std::move(s));
}

const std::string* OptString(const Value& v) {
  if (v.is_undefined() || v.is_none()) return nullptr;
  if (!v.is_string()) ThrowRender("expected a string argument, got " + v.TypeName());
  return &v.as_string();
}

int64_t OptInt(const Value& v, int64_t dflt) {
  if (v.is_undefined() || v.is_none()) return dflt;
  if (!v.is_int()) ThrowRender("expected an integer argument, got " + v.TypeName());
  return v.as_int();
}

Value StringList(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.push_back(Str(p));
  return Value::List(std::move(out));
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return one(affix.as_string());
  if (affix.is_tuple()) {
    for (const Value& a : affix.list()) {
      if (a.is_string() && one(a.as_string())) return true;
    }
    return false;
  }
  ThrowRender(std::string(prefix ? "startswith" : "endswith") +
              " first arg must be str or a tuple of str, not " + affix.TypeName());
}

Value StringMethod(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "startswith" || name == "endswith") {
    if (a.positional.size() != 1) ThrowRender(name + "() takes exactly one argument here");
    return Value::Bool(AffixMatch(s, a.positional[0], name == "startswith"));
  }
  if (name == "strip") return Str(PyStrip(s, OptString(a.Get(0, "chars")), true, true));
  if (name == "lstrip") return Str(PyStrip(s, OptString(a.Get(0, "chars")), true, false));
  if (name == "rstrip") return Str(PyStrip(s, OptString(a.Get(0, "chars")), false, true));
  if (name == "split" || name == "rsplit") {
    return StringList(
        PySplit(s, OptString(a.Get(0, "sep")), OptInt(a.Get(1, "maxsplit"), -1), name == "rsplit"));
  }
  if (name == "splitlines") return StringList(PySplitLines(s));
  if (name == "upper") return Str(PyUpper(s));
  if (name == "lower") return Str(PyLower(s));
  if (name == "title") return Str(PyTitle(s));
  if (name == "capitalize") return Str(PyCapitalize(s));
  if (name == "replace") {
    const std::string* old = OptString(a.Get(0, "old"));
    const std::string* repl = OptString(a.Get(1, "new"));
    if (!old || !repl) ThrowRender("replace() needs two string arguments");
    return Str(PyReplace(s, *old, *repl, OptInt(a.Get(2, "count"), -1)));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    const std::string* sub = OptString(a.Get(0, "sub"));
    if (!sub) ThrowRender(name + "() needs a string argument");
    if (name == "count") {
      if (sub->empty()) return Value::Int(static_cast<int64_t>(Utf8Length(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(*sub); p != std::string::npos; p = s.find(*sub, p + sub->size())) ++n;
      return Value::Int(n);
    }
    size_t p = name == "rfind" ? s.rfind(*sub) : s.find(*sub);
    if (p == std::string::npos) {
      if (name == "index") ThrowRender("substring not found");
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(Utf8Length(s.substr(0, p))));
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& v : Iterate(a.Get(0, "iterable"))) {
      if (!v.is_string())
        ThrowRender("sequence item: expected str instance, " + v.TypeName() + " found");
      if (!first) out += s;
      first = false;
      out += v.as_string();
    }
    return Str(out);
  }
  auto all = [&](auto pred) {
    if (s.empty()) return Value::Bool(false);
    return Value::Bool(std::all_of(s.begin(), s.end(),
                                   [&](char c) { return pred(static_cast<unsigned char>(c)); }));
  };
  if (name == "isdigit") return all([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return Value::Bool(!s.empty() && PyStrip(s, nullptr, true, true).empty());
  if (name == "islower") return Value::Bool(PyLower(s) == s && PyUpper(s) != s);
  if (name == "isupper") return Value::Bool(PyUpper(s) == s && PyLower(s) != s);
  ThrowRender("'str object' has no attribute '" + name + "'");
}

bool IsStringMethod(const std::string& n) {
  static const char* kNames[] = {"startswith", "endswith",   "strip",      "lstrip",  "rstrip",
                                 "split",      "rsplit",     "splitlines", "upper",   "lower",
                                 "title",      "capitalize", "replace",    "find",    "rfind",
                                 "count",      "index",      "join",       "isdigit", "isalpha",
                                 "isalnum",    "isspace",    "islower",    "isupper"};
  for (const char* k : kNames) {
    if (n == k) return true;
  }
  return false;
}

Value DictMethod(const Value& d, const std::string& name, CallArgs& a) {
  if (name == "get") {
    const Value* v = d.Find(a.Get(0, "key"));
    if (v) return *v;
    return a.Has(1, "default") ? a.Get(1, "default") : Value::None();
  }
  ValueList out;
  for (const auto& [k, v] : d.dict()) {
    if (name == "keys") out.push_back(k);
    if (name == "values") out.push_back(v);
    if (name == "items") out.push_back(Value::List({k, v}, true));
  }
  return Value::List(std::move(out));
}

bool IsMutatingMethod(const Value& obj, const std::string& n) {
  static const char* kList[] = {"append", "extend", "insert", "pop",
                                "remove", "clear",  "sort",   "reverse"};
  static const char* kDict[] = {"pop", "popitem", "setdefault", "update", "clear"};
  if (obj.is_list()) {
    for (const char* k : kList) {
      if (n == k) return true;
    }
  }
  if (obj.is_dict() && !obj.is_namespace()) {
    for (const char* k : kDict) {
      if (n == k) return true;
    }
  }
  return false;
}

// Python slice index normalization (PySlice_AdjustIndices).
void AdjustIndices(int64_t len, int64_t step, int64_t& start, int64_t& stop, bool has_start,
                   bool has_stop) {
  if (!has_start) {
    start = step < 0 ? len - 1 : 0;
  } else if (start < 0) {
    start += len;
    if (start < 0) start = step < 0 ? -1 : 0;
  } else if (start >= len) {
    start = step < 0 ? len - 1 : len;
  }
  if (!has_stop) {
    stop = step < 0 ? -1 : len;
  } else if (stop < 0) {
    stop += len;
    if (stop < 0) stop = step < 0 ? -1 : 0;
  } else if (stop >= len) {
    stop = step < 0 ? len - 1 : len;
  }
}

}  // namespace

Value GetAttribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_namespace()) {
    const Value* v = obj.Find(name);
    return v ? *v
             : Value::Undefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
  }
  if (IsMutatingMethod(obj, name)) {
    std::string type = obj.TypeName();
    return Value::Callable(name, [name, type](Interpreter&, CallArgs&) -> Value {
      throw JinjaError(ErrorKind::kRender,
                       "access to attribute '" + name + "' of '" + type + "' object is unsafe.");
    });
  }
  if (obj.is_dict()) {
    if (name == "get" || name == "keys" || name == "values" || name == "items") {
      Value d = obj;
      return Value::Callable(
          "dict." + name, [d, name](Interpreter&, CallArgs& a) { return DictMethod(d, name, a); });
    }
    const Value* v = obj.Find(name);
    if (v) return *v;
  } else if (obj.is_string() && IsStringMethod(name)) {
    std::string s = obj.as_string();
    return Value::Callable(
        "str." + name, [s, name](Interpreter&, CallArgs& a) { return StringMethod(s, name, a); });
  } else if (obj.is_list() && (name == "index" || name == "count")) {
    Value l = obj;
    return Value::Callable("list." + name, [l, name](Interpreter&, CallArgs& a) {
      Value x = a.Get(0, "value");
      int64_t n = 0;
      for (size_t i = 0; i < l.list().size(); ++i) {
        if (!l.list()[i].Equals(x)) continue;
        if (name == "index") return Value::Int(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") ThrowRender(PyRepr(x) + " is not in list");
      return Value::Int(n);
    });
  }
  if (obj.is_none()) return Value::Undefined("'None' has no attribute '" + name + "'");
  return Value::Undefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_dict() && !obj.is_namespace()) {
    const Value* v = obj.Find(key);
    if (v) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list()[i];
    } else {
      std::vector<std::string> cs = Utf8Chars(obj.as_string());
      int64_t n = static_cast<int64_t>(cs.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Str(cs[i]);
    }
    return Value::Undefined("'" + obj.TypeName() + " object' has no element " + PyStr(key));
  }
  if (key.is_string()) {
    Value attr = GetAttribute(obj, key.as_string());
    if (!attr.is_undefined() && !obj.is_dict()) return attr;
    if (!attr.is_undefined() && obj.is_dict() && attr.is_callable()) return attr;
  }
  if (obj.is_none()) return Value::Undefined("'None' has no attribute '" + PyStr(key) + "'");
  return Value::Undefined("'" + obj.TypeName() + " object' has no attribute '" + PyStr(key) + "'");
}

Value Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (!obj.is_list() && !obj.is_string())
    ThrowRender("'" + obj.TypeName() + "' object is not subscriptable");
  int64_t step = OptInt(step_v, 1);
  if (step == 0) ThrowRender("slice step cannot be zero");
  std::vector<std::string> cs;
  int64_t len;
  if (obj.is_string()) {
    cs = Utf8Chars(obj.as_string());
    len = static_cast<int64_t>(cs.size());
  } else {
    len = static_cast<int64_t>(obj.list().size());
  }
  int64_t start = OptInt(start_v, 0), stop = OptInt(stop_v, 0);
  AdjustIndices(len, step, start, stop, !start_v.is_none(), !stop_v.is_none());
  std::string s;
  ValueList items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_string()) {
      s += cs[i];
    } else {
      items.push_back(obj.list()[i]);
    }
  }
  if (obj.is_string()) return Str(s);
  return Value::List(std::move(items), obj.is_tuple());
}

}  // namespace llm::jinja
