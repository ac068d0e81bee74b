// The global functions: jinja2's range/namespace/dict and transformers' raise_exception and
// strftime_now.
#include <ctime>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/python_format.h"

namespace llm::jinja {

Value GlobalFunction(const std::string& name) {
  if (name == "range") {
    return Value::Callable(name, [](Interpreter& in, CallArgs& a) {
      if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3)
        ThrowRender("range expected 1 to 3 integer arguments");
      for (const Value& v : a.positional) {
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_int() && !v.is_bool())
          ThrowRender("'" + v.TypeName() + "' object cannot be interpreted as an integer");
      }
      int64_t start = 0, stop, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() == 3) step = a.positional[2].as_int();
      }
      if (step == 0) ThrowRender("range() arg 3 must not be zero");
      int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                           : (start > stop ? (start - stop - step - 1) / -step : 0);
      if (n > in.limits().max_range) {
        ThrowRender("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                    std::to_string(in.limits().max_range) + ").");
      }
      ValueList out;
      for (int64_t i = 0; i < n; ++i) out.push_back(Value::Int(start + i * step));
      return Value::List(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    bool ns = name == "namespace";
    return Value::Callable(name, [ns](Interpreter&, CallArgs& a) {
      Value d = Value::Dict();
      if (a.positional.size() > 1) ThrowRender("expected at most 1 positional argument");
      if (!a.positional.empty()) {
        if (!a.positional[0].is_dict()) ThrowRender("positional argument must be a mapping");
        for (const auto& [k, v] : a.positional[0].dict()) d.Set(k, v);
      }
      for (const auto& [k, v] : a.keyword) d.Set(Value::String(k), v);
      return ns ? Value::Namespace(d.dict()) : d;
    });
  }
  if (name == "raise_exception") {
    return Value::Callable(name, [](Interpreter&, CallArgs& a) -> Value {
      throw JinjaError(ErrorKind::kRaised, PyStr(a.Get(0, "message")));
    });
  }
  if (name == "strftime_now") {
    return Value::Callable(name, [](Interpreter& in, CallArgs& a) {
      Value fmt = a.Get(0, "format");
      if (!fmt.is_string()) ThrowRender("strftime_now expects a format string");
      std::time_t t = in.now();
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[512];
      size_t n = std::strftime(buf, sizeof(buf), fmt.as_string().c_str(), &tm);
      return Value::String(std::string(buf, n));
    });
  }
  ThrowRender("unknown global '" + name + "'");
}

}  // namespace llm::jinja
