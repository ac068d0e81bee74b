#include "text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/python_format.h"
#include "text/jinja/string_methods.h"

namespace llm::jinja {

namespace {

Value Str(std::string s) {
  return Value::String(std::move(s));
}

const std::string& RequireString(const Value& v, const char* what) {
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_string()) ThrowRender(std::string(what) + " expects a string, got " + v.TypeName());
  return v.as_string();
}

int64_t RequireInt(const Value& v, const char* what) {
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_int() && !v.is_bool()) {
    ThrowRender(std::string("'") + v.TypeName() + "' object cannot be interpreted as an integer (" +
                what + ")");
  }
  return v.as_int();
}

int64_t Length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(Utf8Length(v.as_string()));
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict() && !v.is_namespace()) return static_cast<int64_t>(v.dict().size());
  if (v.is_undefined()) return 0;
  ThrowRender("object of type '" + v.TypeName() + "' has no len()");
}

// Attribute lookup with jinja2's dotted form ("user.name") for selectattr/map/sort/...
Value Attr(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? GetItem(cur, Value::Int(std::stoll(part))) : GetItem(cur, Str(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Python's sort key comparison with jinja2's case_sensitive=False folding of strings.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Str(PyLower(v.as_string()));
  return v;
}
bool PyLess(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < a.list().size() && i < b.list().size(); ++i) {
      if (!a.list()[i].Equals(b.list()[i])) return PyLess(a.list()[i], b.list()[i]);
    }
    return a.list().size() < b.list().size();
  }
  ThrowRender("'<' not supported between instances of '" + a.TypeName() + "' and '" + b.TypeName() +
              "'");
}

// jinja2's min / max: the first item that no later one beats (Python's min/max keep the first of
// equal items); undefined for an empty sequence.
Value MinOrMax(const Value& seq, CallArgs& args, bool max) {
  ValueList items = Iterate(seq);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const bool cs = args.Get(0, "case_sensitive").Truthy();
  Value best = items[0];
  for (const Value& x : items) {
    const Value kx = SortKey(x, cs), kbest = SortKey(best, cs);
    if (max ? PyLess(kbest, kx) : PyLess(kx, kbest)) best = x;
  }
  return best;
}

// select/reject/selectattr/rejectattr: args after the sequence (and attribute) name a test.
Value SelectOrReject(Interpreter& in, const Value& seq, CallArgs& args, bool by_attr, bool select) {
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    attr = RequireString(args.Get(0, "attr"), "selectattr");
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    test = RequireString(args.positional[next], "select test name");
    test_args.positional.assign(args.positional.begin() + next + 1, args.positional.end());
  }
  ValueList out;
  for (const Value& item : Iterate(seq)) {
    Value v = by_attr ? Attr(item, attr) : item;
    CallArgs a = test_args;
    bool ok = test.empty() ? v.Truthy() : ApplyTest(in, test, v, a);
    if (ok == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

std::string IndentFilter(const std::string& s, const Value& width, bool first, bool blank) {
  std::string ind = width.is_string() ? width.as_string()
                                      : std::string(width.is_undefined() ? 4 : width.as_int(), ' ');
  std::vector<std::string> lines = PySplitLines(s + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n" + (lines[i].empty() ? lines[i] : ind + lines[i]);
    }
  }
  if (first) rv = ind + rv;
  return rv;
}

Value ToJson(const Value& x, CallArgs& args) {
  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
  JsonDumpOptions o;
  Value ensure_ascii = args.Get(0, "ensure_ascii");
  Value indent = args.Get(1, "indent");
  Value seps = args.Get(2, "separators");
  Value sort_keys = args.Get(3, "sort_keys");
  // Positional arguments bind as in Python: x|tojson(4) sets ensure_ascii, not indent.
  o.ensure_ascii = ensure_ascii.Truthy();
  if (!indent.is_undefined() && !indent.is_none()) {
    if (indent.is_string()) ThrowRender("tojson: a string indent is not supported");
    o.indent = static_cast<int>(std::max<int64_t>(0, RequireInt(indent, "indent")));
    o.item_separator = ",";
  }
  if (!seps.is_undefined() && !seps.is_none()) {
    if (!seps.is_list() || seps.list().size() != 2)
      ThrowRender("tojson: separators must be a pair");
    o.item_separator = RequireString(seps.list()[0], "separators");
    o.key_separator = RequireString(seps.list()[1], "separators");
  }
  o.sort_keys = sort_keys.Truthy();
  return Str(PyJsonDumps(x, o));
}

Value Round(const Value& v, CallArgs& args) {
  int64_t precision = args.Has(0, "precision") ? RequireInt(args.Get(0, "precision"), "round") : 0;
  Value method = args.Get(1, "method");
  std::string m = method.is_undefined() ? "common" : RequireString(method, "round method");
  if (!v.is_number()) ThrowRender("round: expected a number, got " + v.TypeName());
  if (m == "common") {
    if (!v.is_float()) return Value::Int(v.as_int());
    // Python's round() rounds the exact binary value half-to-even, as printf does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f",
                  static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), v.as_double());
    return Value::Float(std::strtod(buf, nullptr));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  if (m == "ceil") return Value::Float(std::ceil(x) / scale);
  if (m == "floor") return Value::Float(std::floor(x) / scale);
  ThrowRender("method must be 'common', 'ceil' or 'floor'");
}

Value Format(const std::string& fmt, const Value& arg) {
  ValueList vals = arg.is_tuple() ? arg.list() : ValueList{arg};
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) ThrowRender("incomplete format");
    char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (k >= vals.size()) ThrowRender("not enough arguments for format string");
    const Value& v = vals[k++];
    if (c == 's') {
      out += PyStr(v);
    } else if (c == 'r') {
      out += PyRepr(v);
    } else if (c == 'd' || c == 'i') {
      if (!v.is_number()) ThrowRender("%d format: a real number is required, not " + v.TypeName());
      out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
    } else {
      ThrowRender(std::string("unsupported format character '") + c + "'");
    }
  }
  if (k < vals.size()) ThrowRender("not all arguments converted during string formatting");
  return Str(out);
}

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

const std::map<std::string, FilterFn>& Filters() {
  static const std::map<std::string, FilterFn> kFilters = {
      {"abs",
       [](Interpreter&, const Value& v, CallArgs&) {
         if (!v.is_number()) ThrowRender("bad operand type for abs(): '" + v.TypeName() + "'");
         return v.is_float() ? Value::Float(std::fabs(v.as_double()))
                             : Value::Int(std::llabs(v.as_int()));
       }},
      {"attr",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return GetAttribute(v, RequireString(a.Get(0, "name"), "attr"));
       }},
      {"batch",
       [](Interpreter&, const Value& v, CallArgs& a) {
         int64_t n = RequireInt(a.Get(0, "linecount"), "batch");
         if (n <= 0) ThrowRender("batch: linecount must be positive");
         Value fill = a.Get(1, "fill_with");
         ValueList out, cur;
         for (const Value& x : Iterate(v)) {
           cur.push_back(x);
           if (static_cast<int64_t>(cur.size()) == n) {
             out.push_back(Value::List(cur));
             cur.clear();
           }
         }
         if (!cur.empty()) {
           if (!fill.is_undefined() && !fill.is_none()) {
             while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
           }
           out.push_back(Value::List(cur));
         }
         return Value::List(out);
       }},
      {"capitalize",
       [](Interpreter&, const Value& v, CallArgs&) { return Str(PyCapitalize(PyStr(v))); }},
      {"center",
       [](Interpreter&, const Value& v, CallArgs& a) {
         std::string s = PyStr(v);
         int64_t w = a.Has(0, "width") ? RequireInt(a.Get(0, "width"), "center") : 80;
         int64_t len = static_cast<int64_t>(Utf8Length(s));
         if (w <= len) return Str(s);
         int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
         return Str(std::string(left, ' ') + s + std::string(pad - left, ' '));
       }},
      {"count", [](Interpreter&, const Value& v, CallArgs&) { return Value::Int(Length(v)); }},
      {"default",
       [](Interpreter&, const Value& v, CallArgs& a) {
         Value d = a.Has(0, "default_value") ? a.Get(0, "default_value") : Str("");
         bool boolean = a.Get(1, "boolean").Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy())) return d;
         return v;
       }},
      {"dictsort",
       [](Interpreter&, const Value& v, CallArgs& a) {
         if (!v.is_dict()) ThrowRender("dictsort: expected a dict, got " + v.TypeName());
         bool cs = a.Get(0, "case_sensitive").Truthy();
         Value by = a.Get(1, "by");
         bool by_value = !by.is_undefined() && RequireString(by, "dictsort") == "value";
         bool reverse = a.Get(2, "reverse").Truthy();
         ValueList items;
         for (const auto& [k, x] : v.dict()) items.push_back(Value::List({k, x}, true));
         std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
           const Value& x = p.list()[by_value ? 1 : 0];
           const Value& y = q.list()[by_value ? 1 : 0];
           return reverse ? PyLess(SortKey(y, cs), SortKey(x, cs))
                          : PyLess(SortKey(x, cs), SortKey(y, cs));
         });
         return Value::List(items);
       }},
      {"escape", [](Interpreter&, const Value& v, CallArgs&) { return Str(HtmlEscape(PyStr(v))); }},
      {"first",
       [](Interpreter&, const Value& v, CallArgs&) {
         ValueList items = Iterate(v);
         return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items[0];
       }},
      {"float",
       [](Interpreter&, const Value& v, CallArgs& a) {
         Value d = a.Has(0, "default") ? a.Get(0, "default") : Value::Float(0.0);
         if (v.is_number()) return Value::Float(v.as_double());
         if (v.is_string()) {
           auto f = PyParseFloat(v.as_string());
           if (f) return Value::Float(*f);
         }
         return d;
       }},
      {"format",
       [](Interpreter&, const Value& v, CallArgs& a) {
         if (!a.keyword.empty()) ThrowRender("format: keyword arguments are not supported");
         Value arg = a.positional.size() == 1 && !a.positional[0].is_tuple()
                         ? a.positional[0]
                         : Value::List(a.positional, true);
         if (a.positional.size() == 1) arg = a.positional[0];
         return Format(RequireString(v, "format"), arg);
       }},
      {"int",
       [](Interpreter&, const Value& v, CallArgs& a) {
         Value d = a.Has(0, "default") ? a.Get(0, "default") : Value::Int(0);
         int64_t base = a.Has(1, "base") ? RequireInt(a.Get(1, "base"), "int") : 10;
         if (v.is_float()) return Value::Int(static_cast<int64_t>(v.as_double()));
         if (v.is_number()) return Value::Int(v.as_int());
         if (v.is_string()) {
           auto i = PyParseInt(v.as_string(), base);
           if (i) return Value::Int(*i);
           auto f = PyParseFloat(v.as_string());
           if (f) return Value::Int(static_cast<int64_t>(*f));
         }
         return d;
       }},
      {"items",
       [](Interpreter&, const Value& v, CallArgs&) {
         if (v.is_undefined()) return Value::List({});
         if (!v.is_dict()) ThrowRender("Can only get item pairs from a mapping.");
         ValueList out;
         for (const auto& [k, x] : v.dict()) out.push_back(Value::List({k, x}, true));
         return Value::List(out);
       }},
      {"indent",
       [](Interpreter&, const Value& v, CallArgs& a) {
         return Str(IndentFilter(PyStr(v), a.Get(0, "width"), a.Get(1, "first").Truthy(),
                                 a.Get(2, "blank").Truthy()));
       }},
      {"join",
       [](Interpreter&, const Value& v, CallArgs& a) {
         Value d = a.Get(0, "d");
         std::string sep = d.is_undefined() ? "" : PyStr(d);
         Value attr = a.Get(1, "attribute");
         std::string out;
         bool first = true;
         for (const Value& x : Iterate(v)) {
           if (!first) out += sep;
           first = false;
           out += PyStr(attr.is_undefined() ? x : Attr(x, PyStr(attr)));
         }
         return Str(out);
       }},
      {"last",
       [](Interpreter&, const Value& v, CallArgs&) {
         ValueList items = Iterate(v);
         return items.empty() ? Value::Undefined("No last item, sequence was empty.")
                              : items.back();
       }},
      {"length", [](Interpreter&, const Value& v, CallArgs&) { return Value::Int(Length(v)); }},
      {"list",
       [](Interpreter&, const Value& v, CallArgs&) {
         if (!v.is_list() && !v.is_string() && !v.is_dict() && !v.is_undefined())
           ThrowRender("'" + v.TypeName() + "' object is not iterable");
         return Value::List(Iterate(v));
       }},
      {"lower", [](Interpreter&, const Value& v, CallArgs&) { return Str(PyLower(PyStr(v))); }},
      {"map",
       [](Interpreter& in, const Value& v, CallArgs& a) {
         ValueList out;
         Value attr;
         for (const auto& [k, x] : a.keyword) {
           if (k == "attribute") attr = x;
         }
         Value dflt;
         for (const auto& [k, x] : a.keyword) {
           if (k == "default") dflt = x;
         }
         for (const Value& x : Iterate(v)) {
           if (!attr.is_undefined()) {
             Value r = Attr(x, PyStr(attr));
             out.push_back(r.is_undefined() && !dflt.is_undefined() ? dflt : r);
           } else {
             if (a.positional.empty()) ThrowRender("map requires a filter argument");
             CallArgs fa;
             fa.positional.assign(a.positional.begin() + 1, a.positional.end());
             out.push_back(ApplyFilter(in, RequireString(a.positional[0], "map"), x, fa));
           }
         }
         return Value::List(out);
       }},
      {"max", [](Interpreter&, const Value& v, CallArgs& a) { return MinOrMax(v, a, true); }},
      {"min", [](Interpreter&, const Value& v, CallArgs& a) { return MinOrMax(v, a, false); }},
      {"reject", [](Interpreter& in, const Value& v,
                    CallArgs& a) { return SelectOrReject(in, v, a, false, false); }},
      {"rejectattr", [](Interpreter& in, const Value& v,
                        CallArgs& a) { return SelectOrReject(in, v, a, true, false); }},
      {"replace",
       [](Interpreter&, const Value& v, CallArgs& a) {
         int64_t count = a.Has(2, "count") && !a.Get(2, "count").is_none()
                             ? RequireInt(a.Get(2, "count"), "replace")
                             : -1;
         return Str(PyReplace(PyStr(v), PyStr(a.Get(0, "old")), PyStr(a.Get(1, "new")), count));
       }},
      {"reverse",
       [](Interpreter&, const Value& v, CallArgs&) {
         if (v.is_string()) {
           auto chars = Utf8Chars(v.as_string());
           std::string out;
           for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
           return Str(out);
         }
         ValueList items = Iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::List(items);
       }},
      {"round", [](Interpreter&, const Value& v, CallArgs& a) { return Round(v, a); }},
      {"safe", [](Interpreter&, const Value& v, CallArgs&) { return Str(PyStr(v)); }},
      {"select", [](Interpreter& in, const Value& v,
                    CallArgs& a) { return SelectOrReject(in, v, a, false, true); }},
      {"selectattr", [](Interpreter& in, const Value& v,
                        CallArgs& a) { return SelectOrReject(in, v, a, true, true); }},
      {"sort",
       [](Interpreter&, const Value& v, CallArgs& a) {
         bool reverse = a.Get(0, "reverse").Truthy();
         bool cs = a.Get(1, "case_sensitive").Truthy();
         Value attr = a.Get(2, "attribute");
         ValueList items = Iterate(v);
         auto key = [&](const Value& x) {
           return SortKey(attr.is_undefined() ? x : Attr(x, PyStr(attr)), cs);
         };
         std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
           return reverse ? PyLess(key(y), key(x)) : PyLess(key(x), key(y));
         });
         return Value::List(items);
       }},
      {"string", [](Interpreter&, const Value& v, CallArgs&) { return Str(PyStr(v)); }},
      {"sum",
       [](Interpreter&, const Value& v, CallArgs& a) {
         Value attr = a.Get(0, "attribute");
         Value total = a.Has(1, "start") ? a.Get(1, "start") : Value::Int(0);
         for (const Value& x : Iterate(v)) {
           Value y = attr.is_undefined() ? x : Attr(x, PyStr(attr));
           if (!y.is_number() || !total.is_number()) ThrowRender("sum: non-numeric item");
           total = (y.is_float() || total.is_float())
                       ? Value::Float(total.as_double() + y.as_double())
                       : Value::Int(total.as_int() + y.as_int());
         }
         return total;
       }},
      {"title", [](Interpreter&, const Value& v, CallArgs&) { return Str(JinjaTitle(PyStr(v))); }},
      {"tojson", [](Interpreter&, const Value& v, CallArgs& a) { return ToJson(v, a); }},
      {"trim",
       [](Interpreter&, const Value& v, CallArgs& a) {
         Value chars = a.Get(0, "chars");
         return Str(PyStrip(PyStr(v),
                            chars.is_undefined() || chars.is_none() ? nullptr : &chars.as_string(),
                            true, true));
       }},
      {"unique",
       [](Interpreter&, const Value& v, CallArgs& a) {
         bool cs = a.Get(0, "case_sensitive").Truthy();
         Value attr = a.Get(1, "attribute");
         ValueList out, seen;
         for (const Value& x : Iterate(v)) {
           Value k = SortKey(attr.is_undefined() ? x : Attr(x, PyStr(attr)), cs);
           bool dup = false;
           for (const Value& s : seen) dup = dup || s.Equals(k);
           if (!dup) {
             seen.push_back(k);
             out.push_back(x);
           }
         }
         return Value::List(out);
       }},
      {"upper", [](Interpreter&, const Value& v, CallArgs&) { return Str(PyUpper(PyStr(v))); }},
      {"wordcount",
       [](Interpreter&, const Value& v, CallArgs&) { return Value::Int(WordCount(PyStr(v))); }},
  };
  return kFilters;
}

std::string FilterAlias(const std::string& name) {
  if (name == "d") return "default";
  if (name == "e") return "escape";
  return name;
}

bool IsIterable(const Value& v) {
  return v.is_list() || v.is_string() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
}

}  // namespace

[[noreturn]] void FailUndefined(const Value& v) {
  std::string hint = v.undefined_hint();
  ThrowRender(hint.empty() ? "value is undefined" : hint);
}

ValueList Iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_dict() && !v.is_namespace()) {
    ValueList keys;
    for (const auto& kv : v.dict()) keys.push_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    ValueList out;
    for (auto& c : Utf8Chars(v.as_string())) out.push_back(Str(c));
    return out;
  }
  if (v.is_undefined()) return {};
  ThrowRender("'" + v.TypeName() + "' object is not iterable");
}

bool HasFilter(const std::string& name) {
  return Filters().count(FilterAlias(name)) > 0;
}

Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  auto it = Filters().find(FilterAlias(name));
  if (it == Filters().end()) ThrowRender("No filter named '" + name + "'.");
  return it->second(in, input, args);
}

bool HasTest(const std::string& name) {
  static const std::set<std::string> kTests = {
      "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
      "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
      "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
      "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
      "string",  "test",     "true",     "undefined",   "upper",    "==",      "!=",
      "<",       "<=",       ">",        ">="};
  return kTests.count(name) > 0;
}

bool ApplyTest(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  const Value arg = args.Get(0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") return IsIterable(v);
  if (name == "sequence") return IsIterable(v);
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && PyLower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && PyUpper(v.as_string()) == v.as_string();
  if (name == "filter") return HasFilter(RequireString(v, "filter test"));
  if (name == "test") return HasTest(RequireString(v, "test test"));
  if (name == "odd" || name == "even" || name == "divisibleby") {
    int64_t x = RequireInt(v, name.c_str());
    int64_t d = name == "divisibleby" ? RequireInt(arg, "divisibleby") : 2;
    if (d == 0) ThrowRender("integer modulo by zero");
    int64_t m = ((x % d) + d) % d;
    return name == "odd" ? m == 1 : m == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v.Equals(arg);
  if (name == "ne" || name == "!=") return !v.Equals(arg);
  if (name == "sameas") {
    if (v.is_none() || v.is_bool() || v.is_undefined())
      return v.Equals(arg) && v.kind() == arg.kind();
    // Strings and ints: CPython shares equal small values; equality is the closest model.
    if (v.is_string() || v.is_int()) return v.kind() == arg.kind() && v.Equals(arg);
    if (v.is_list()) return arg.is_list() && &v.list() == &arg.list();
    if (v.is_dict()) return arg.is_dict() && &v.dict() == &arg.dict();
    return false;
  }
  if (name == "in") {
    CallArgs none;
    (void)none;
    if (arg.is_string())
      return v.is_string() && arg.as_string().find(v.as_string()) != std::string::npos;
    for (const Value& x : Iterate(arg)) {
      if (x.Equals(v)) return true;
    }
    return false;
  }
  auto cmp = [&](const char* op) {
    if (!(v.is_number() && arg.is_number()) && !(v.is_string() && arg.is_string())) {
      if (v.is_undefined()) FailUndefined(v);
      if (arg.is_undefined()) FailUndefined(arg);
      ThrowRender(std::string("'") + op + "' not supported between instances of '" + v.TypeName() +
                  "' and '" + arg.TypeName() + "'");
    }
    return PyLess(v, arg) ? -1 : PyLess(arg, v) ? 1 : 0;
  };
  if (name == "lt" || name == "lessthan" || name == "<") return cmp("<") < 0;
  if (name == "le" || name == "<=") return cmp("<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return cmp(">") > 0;
  if (name == "ge" || name == ">=") return cmp(">=") >= 0;
  (void)in;
  ThrowRender("No test named '" + name + "'.");
}

}  // namespace llm::jinja
