// Interpreter: walks a parsed template with a variable context and writes the output. It holds
// jinja2's scoping (a fresh scope per loop iteration and macro call, `if` shares its parent's),
// Python's operator semantics and the bounds that keep hostile input from running away.
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace llm::jinja {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;
  int64_t max_loop_iterations = 1'000'000;  // summed over all loops of one render
  int max_call_depth = 64;                  // macro recursion
  int max_range = 100'000;                  // jinja2's sandbox MAX_RANGE
};

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, std::time_t now);
  // Macros hold the global scope they are stored in (a reference cycle): emptying every scope
  // here frees them, also after a render that stopped on an error.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Variables visible to the template (messages, tools, bos_token, ...); set before Render.
  void SetGlobal(const std::string& name, Value value);
  std::string Render(const Body& body);

  Value Eval(const Expr& e);
  // Calls a callable value (macro, builtin, bound method) with evaluated arguments.
  Value Call(const Value& callee, CallArgs& args);
  std::time_t now() const { return now_; }
  const RenderLimits& limits() const { return limits_; }
  void CountIterations(int64_t n);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::map<std::string, Value>;

  Flow Exec(const Body& body, std::string& out);
  Flow ExecStmt(const Stmt& s, std::string& out);
  Flow ExecFor(const Stmt& s, std::string& out);
  Value MakeMacro(const Stmt& s, std::shared_ptr<Scope> defining_root);
  void Append(std::string& out, const std::string& text);

  Value Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value value);
  Value EvalBinary(const Expr& e);
  Value EvalFilter(const Expr& e, Value input);

  RenderLimits limits_;
  std::time_t now_;
  std::vector<std::shared_ptr<Scope>> scopes_;  // [0]: globals + template top level
  int call_depth_ = 0;
  int eval_depth_ = 0;
  int64_t iterations_ = 0;
  size_t output_bytes_ = 0;
};

}  // namespace llm::jinja
