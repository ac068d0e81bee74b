#include "text/jinja/interpreter.h"

#include <cmath>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/python_format.h"

namespace llm::jinja {

namespace {

constexpr int kMaxEvalDepth = 400;

struct DepthCounter {
  DepthCounter(int& d, int max, const char* what) : d(d) {
    if (++d > max) {
      --d;
      throw JinjaError(ErrorKind::kLimit, std::string(what) + " nested too deeply");
    }
  }
  ~DepthCounter() { --d; }
  int& d;
};

[[noreturn]] void OperandError(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  ThrowRender("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" +
              b.TypeName() + "'");
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value Repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (seq.as_string().size() * n > (64u << 20))
      throw JinjaError(ErrorKind::kLimit, "string too long");
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::String(out);
  }
  if (seq.list().size() * n > 10'000'000) throw JinjaError(ErrorKind::kLimit, "list too long");
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::List(out, seq.is_tuple());
}

// Python's <, for the types templates compare.
bool Less(const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].Equals(y[i])) return Less(x[i], y[i], op);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  ThrowRender(std::string("'") + op + "' not supported between instances of '" + a.TypeName() +
              "' and '" + b.TypeName() + "'");
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      if (item.is_undefined()) FailUndefined(item);
      ThrowRender("'in <string>' requires string as left operand, not " + item.TypeName());
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (v.Equals(item)) return true;
    }
    return false;
  }
  if (container.is_dict() && !container.is_namespace()) return container.Find(item) != nullptr;
  if (container.is_undefined()) return false;
  ThrowRender("argument of type '" + container.TypeName() + "' is not iterable");
}

}  // namespace

Interpreter::Interpreter(const RenderLimits& limits, std::time_t now) : limits_(limits), now_(now) {
  scopes_.push_back(std::make_shared<Scope>());
  for (const char* f : {"range", "namespace", "dict", "raise_exception", "strftime_now"}) {
    (*scopes_[0])[f] = GlobalFunction(f);
  }
}

Interpreter::~Interpreter() {
  for (const std::shared_ptr<Scope>& scope : scopes_) scope->clear();
}

void Interpreter::SetGlobal(const std::string& name, Value value) {
  (*scopes_[0])[name] = std::move(value);
}

void Interpreter::CountIterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations) {
    throw JinjaError(
        ErrorKind::kLimit,
        "template exceeded " + std::to_string(limits_.max_loop_iterations) + " loop iterations");
  }
}

void Interpreter::Append(std::string& out, const std::string& text) {
  output_bytes_ += text.size();
  if (output_bytes_ > limits_.max_output_bytes) {
    throw JinjaError(ErrorKind::kLimit, "template output exceeded " +
                                            std::to_string(limits_.max_output_bytes) + " bytes");
  }
  out += text;
}

std::string Interpreter::Render(const Body& body) {
  std::string out;
  Flow f = Exec(body, out);
  if (f != Flow::kNormal) ThrowRender("'break' or 'continue' outside of a loop");
  return out;
}

Value Interpreter::Lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = (*it)->find(name);
    if (f != (*it)->end()) return f->second;
  }
  return Value::Undefined("'" + name + "' is undefined");
}

void Interpreter::Assign(const std::string& name, Value value) {
  (*scopes_.back())[name] = std::move(value);
}

Interpreter::Flow Interpreter::Exec(const Body& body, std::string& out) {
  for (const StmtPtr& s : body) {
    Flow f = ExecStmt(*s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecStmt(const Stmt& s, std::string& out) {
  try {
    switch (s.kind) {
      case Stmt::Kind::kText:
        Append(out, s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        Append(out, PyStr(Eval(*s.expr)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (Eval(*s.conditions[i]).Truthy()) return Exec(s.bodies[i], out);
        }
        return Exec(s.else_body, out);
      case Stmt::Kind::kFor:
        return ExecFor(s, out);
      case Stmt::Kind::kSet: {
        Value v;
        if (s.expr) {
          v = Eval(*s.expr);
        } else {
          std::string captured;
          scopes_.push_back(std::make_shared<Scope>());
          Flow f = Exec(s.body, captured);
          scopes_.pop_back();
          if (f != Flow::kNormal) return f;
          v = Value::String(captured);
        }
        if (!s.text.empty()) {
          Value ns = Lookup(s.targets[0]);
          if (!ns.is_namespace()) ThrowRender("can't assign attribute on non-namespace object");
          ns.Set(Value::String(s.text), std::move(v));
        } else if (s.targets.size() == 1) {
          Assign(s.targets[0], std::move(v));
        } else {
          ValueList items = Iterate(v);
          if (items.size() != s.targets.size()) {
            ThrowRender("cannot unpack " + std::to_string(items.size()) + " values into " +
                        std::to_string(s.targets.size()) + " names");
          }
          for (size_t i = 0; i < items.size(); ++i) Assign(s.targets[i], items[i]);
        }
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        Assign(s.text, MakeMacro(s, scopes_[0]));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        Value caller = MakeMacro(s, scopes_[0]);
        scopes_.push_back(std::make_shared<Scope>());
        Assign("caller", caller);
        Value result;
        try {
          result = Eval(*s.expr);
        } catch (...) {
          scopes_.pop_back();
          throw;
        }
        scopes_.pop_back();
        Append(out, PyStr(result));
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string captured;
        scopes_.push_back(std::make_shared<Scope>());
        Flow f = Exec(s.body, captured);
        scopes_.pop_back();
        if (f != Flow::kNormal) return f;
        Append(out, PyStr(EvalFilter(*s.expr, Value::String(captured))));
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        auto scope = std::make_shared<Scope>();
        for (const MacroParam& p : s.params) (*scope)[p.name] = Eval(*p.default_value);
        scopes_.push_back(scope);
        Flow f = Exec(s.body, out);
        scopes_.pop_back();
        return f;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
  } catch (JinjaError& e) {
    if (e.line() == 0) throw JinjaError(e.kind(), e.what(), s.line);
    throw;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecFor(const Stmt& s, std::string& out) {
  Value iterable = Eval(*s.expr);
  if (!iterable.is_list() && !iterable.is_string() && !iterable.is_undefined() &&
      !(iterable.is_dict() && !iterable.is_namespace())) {
    ThrowRender("'" + iterable.TypeName() + "' object is not iterable");
  }
  ValueList items = Iterate(iterable);
  auto bind = [&](Scope& scope, const Value& item) {
    if (s.targets.size() == 1) {
      scope[s.targets[0]] = item;
      return;
    }
    ValueList parts = Iterate(item);
    if (!item.is_list() || parts.size() != s.targets.size()) {
      ThrowRender("cannot unpack " + item.TypeName() + " into " + std::to_string(s.targets.size()) +
                  " loop variables");
    }
    for (size_t i = 0; i < parts.size(); ++i) scope[s.targets[i]] = parts[i];
  };
  if (s.condition) {
    // jinja2 filters before iterating, so loop.length and loop.last count kept items only.
    ValueList kept;
    for (const Value& item : items) {
      CountIterations(1);
      auto scope = std::make_shared<Scope>();
      bind(*scope, item);
      scopes_.push_back(scope);
      bool keep;
      try {
        keep = Eval(*s.condition).Truthy();
      } catch (...) {
        scopes_.pop_back();
        throw;
      }
      scopes_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return Exec(s.else_body, out);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    CountIterations(1);
    auto scope = std::make_shared<Scope>();
    bind(*scope, items[i]);
    ValueDict loop = {
        {Value::String("index0"), Value::Int(i)},
        {Value::String("index"), Value::Int(i + 1)},
        {Value::String("revindex0"), Value::Int(n - i - 1)},
        {Value::String("revindex"), Value::Int(n - i)},
        {Value::String("first"), Value::Bool(i == 0)},
        {Value::String("last"), Value::Bool(i == n - 1)},
        {Value::String("length"), Value::Int(n)},
        {Value::String("depth0"), Value::Int(0)},
        {Value::String("depth"), Value::Int(1)},
        {Value::String("previtem"),
         i > 0 ? items[i - 1] : Value::Undefined("there is no previous item")},
        {Value::String("nextitem"),
         i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item")},
        {Value::String("cycle"), Value::Callable("loop.cycle",
                                                 [i](Interpreter&, CallArgs& a) {
                                                   if (a.positional.empty())
                                                     ThrowRender("no items for cycling given");
                                                   return a.positional[i % a.positional.size()];
                                                 })},
    };
    (*scope)["loop"] = Value::Namespace(std::move(loop));
    scopes_.push_back(scope);
    Flow f;
    try {
      f = Exec(s.body, out);
    } catch (...) {
      scopes_.pop_back();
      throw;
    }
    scopes_.pop_back();
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Value Interpreter::MakeMacro(const Stmt& s, std::shared_ptr<Scope> defining_root) {
  const Stmt* stmt = &s;
  std::string name = s.kind == Stmt::Kind::kMacro ? s.text : "caller";
  // A caller() body sees the scope it was written in; a macro sees the template's top level.
  std::vector<std::shared_ptr<Scope>> closure =
      s.kind == Stmt::Kind::kCallBlock ? scopes_ : std::vector<std::shared_ptr<Scope>>{};
  return Value::Callable(
      name, [stmt, name, defining_root, closure](Interpreter& in, CallArgs& args) {
        DepthCounter depth(in.call_depth_, in.limits_.max_call_depth, "macro calls");
        if (args.positional.size() > stmt->params.size()) {
          ThrowRender("macro '" + name + "' takes not more than " +
                      std::to_string(stmt->params.size()) + " argument(s)");
        }
        auto scope = std::make_shared<Scope>();
        // A macro invoked from {% call %} sees that block's body as caller().
        Value caller = in.Lookup("caller");
        if (!caller.is_undefined()) (*scope)["caller"] = caller;
        std::vector<std::shared_ptr<Scope>> saved = std::move(in.scopes_);
        in.scopes_ = closure.empty() ? std::vector<std::shared_ptr<Scope>>{defining_root} : closure;
        in.scopes_.push_back(scope);
        std::string out;
        try {
          for (const auto& [k, v] : args.keyword) {
            bool known = false;
            for (const MacroParam& p : stmt->params) known = known || p.name == k;
            if (!known) ThrowRender("macro '" + name + "' takes no keyword argument '" + k + "'");
          }
          for (size_t i = 0; i < stmt->params.size(); ++i) {
            const MacroParam& p = stmt->params[i];
            if (args.Has(i, p.name)) {
              (*scope)[p.name] = args.Get(i, p.name);
            } else if (p.default_value) {
              (*scope)[p.name] = in.Eval(*p.default_value);
            } else {
              (*scope)[p.name] = Value::Undefined("parameter '" + p.name + "' was not provided");
            }
          }
          if (in.Exec(stmt->body, out) != Flow::kNormal) {
            ThrowRender("'break' or 'continue' outside of a loop");
          }
        } catch (...) {
          in.scopes_ = std::move(saved);
          throw;
        }
        in.scopes_ = std::move(saved);
        return Value::String(out);
      });
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) FailUndefined(callee);
  if (!callee.is_callable()) ThrowRender("'" + callee.TypeName() + "' object is not callable");
  return callee.function()(*this, args);
}

Value Interpreter::EvalFilter(const Expr& e, Value input) {
  Value in = e.target ? Eval(*e.target) : std::move(input);
  CallArgs args;
  for (const ExprPtr& a : e.args) args.positional.push_back(Eval(*a));
  for (const auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, Eval(*a));
  return ApplyFilter(*this, e.name, in, args);
}

Value Interpreter::Eval(const Expr& e) {
  DepthCounter depth(eval_depth_, kMaxEvalDepth, "expressions");
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return Lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const ExprPtr& a : e.args) items.push_back(Eval(*a));
      return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Value d = Value::Dict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2)
        d.Set(Eval(*e.args[i]), Eval(*e.args[i + 1]));
      return d;
    }
    case Expr::Kind::kGetAttr:
      return GetAttribute(Eval(*e.target), e.name);
    case Expr::Kind::kGetItem:
      return GetItem(Eval(*e.target), Eval(*e.args[0]));
    case Expr::Kind::kSlice: {
      Value obj = Eval(*e.target);
      Value parts[3];
      for (int i = 0; i < 3; ++i) parts[i] = e.args[i] ? Eval(*e.args[i]) : Value::None();
      return Slice(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::kCall: {
      Value callee = Eval(*e.target);
      CallArgs args;
      for (const ExprPtr& a : e.args) args.positional.push_back(Eval(*a));
      for (const auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, Eval(*a));
      return Call(callee, args);
    }
    case Expr::Kind::kFilter:
      return EvalFilter(e, Value());
    case Expr::Kind::kTest: {
      Value in = Eval(*e.target);
      CallArgs args;
      for (const ExprPtr& a : e.args) args.positional.push_back(Eval(*a));
      for (const auto& [k, a] : e.kwargs) args.keyword.emplace_back(k, Eval(*a));
      bool r = ApplyTest(*this, e.name, in, args);
      return Value::Bool(e.negated ? !r : r);
    }
    case Expr::Kind::kUnary: {
      Value v = Eval(*e.target);
      if (e.name == "not") return Value::Bool(!v.Truthy());
      if (v.is_undefined()) FailUndefined(v);
      if (!v.is_number()) {
        ThrowRender("bad operand type for unary " + e.name + ": '" + v.TypeName() + "'");
      }
      if (e.name == "+") return v.is_float() ? v : Value::Int(v.as_int());
      return v.is_float() ? Value::Float(-v.as_double()) : Value::Int(-v.as_int());
    }
    case Expr::Kind::kBinary:
      return EvalBinary(e);
    case Expr::Kind::kCondition:
      if (Eval(*e.args[0]).Truthy()) return Eval(*e.args[1]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value::Undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value();
}

Value Interpreter::EvalBinary(const Expr& e) {
  const std::string& op = e.name;
  if (op == "and") {
    Value a = Eval(*e.args[0]);
    return a.Truthy() ? Eval(*e.args[1]) : a;
  }
  if (op == "or") {
    Value a = Eval(*e.args[0]);
    return a.Truthy() ? a : Eval(*e.args[1]);
  }
  Value a = Eval(*e.args[0]);
  Value b = Eval(*e.args[1]);
  if (op == "~") return Value::String(PyStr(a) + PyStr(b));
  if (op == "==") return Value::Bool(a.Equals(b));
  if (op == "!=") return Value::Bool(!a.Equals(b));
  if (op == "<") return Value::Bool(Less(a, b, "<"));
  if (op == ">") return Value::Bool(Less(b, a, ">"));
  if (op == "<=") return Value::Bool(!Less(b, a, "<="));
  if (op == ">=") return Value::Bool(!Less(a, b, ">="));
  if (op == "in") return Value::Bool(Contains(b, a));
  if (op == "not in") return Value::Bool(!Contains(b, a));
  const bool ints = a.is_number() && b.is_number() && !a.is_float() && !b.is_float();
  const bool nums = a.is_number() && b.is_number();
  // Python ints do not overflow; refuse rather than wrap.
  auto checked = [&](bool (*op)(int64_t, int64_t, int64_t*)) {
    int64_t r = 0;
    if (op(a.as_int(), b.as_int(), &r)) ThrowRender("integer result beyond 64 bits");
    return Value::Int(r);
  };
  if (op == "+") {
    if (ints)
      return checked(
          [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); });
    if (nums) return Value::Float(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return Value::String(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      ValueList items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items), a.is_tuple());
    }
    OperandError(op, a, b);
  }
  if (op == "-") {
    if (ints)
      return checked(
          [](int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); });
    if (nums) return Value::Float(a.as_double() - b.as_double());
    OperandError(op, a, b);
  }
  if (op == "*") {
    if (ints)
      return checked(
          [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); });
    if (nums) return Value::Float(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && b.is_int()) return Repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && a.is_int()) return Repeat(b, a.as_int());
    OperandError(op, a, b);
  }
  if (op == "/" || op == "//" || op == "%") {
    if (op == "%" && a.is_string()) {
      CallArgs args;
      args.positional.push_back(b);
      return ApplyFilter(*this, "format", a, args);
    }
    if (!nums) OperandError(op, a, b);
    if (b.as_double() == 0) {
      ThrowRender(op == "%" ? "integer modulo by zero" : "division by zero");
    }
    if (op == "/") return Value::Float(a.as_double() / b.as_double());
    if (ints) {
      if (op == "//") return Value::Int(FloorDiv(a.as_int(), b.as_int()));
      return Value::Int(a.as_int() - FloorDiv(a.as_int(), b.as_int()) * b.as_int());
    }
    double x = a.as_double(), y = b.as_double();
    if (op == "//") return Value::Float(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::Float(m);
  }
  if (op == "**") {
    if (!nums) OperandError(op, a, b);
    if (ints && b.as_int() >= 0) {
      const int64_t base = a.as_int(), exp = b.as_int();
      if (base == 0) return Value::Int(exp == 0 ? 1 : 0);
      if (base == 1) return Value::Int(1);
      if (base == -1) return Value::Int(exp % 2 ? -1 : 1);
      int64_t p = 1;
      for (int64_t i = 0; i < b.as_int(); ++i) {
        if (__builtin_mul_overflow(p, a.as_int(), &p)) ThrowRender("integer result beyond 64 bits");
      }
      return Value::Int(p);
    }
    return Value::Float(std::pow(a.as_double(), b.as_double()));
  }
  ThrowRender("unknown operator " + op);
}

}  // namespace llm::jinja
