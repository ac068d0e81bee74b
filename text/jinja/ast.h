// The parsed template: expression and statement nodes. Plain tagged structs, built once by the
// parser at model load and read-only afterwards, so one template may render on many threads.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace llm::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args
    kTuple,     // args
    kDict,      // args: key, value, key, value, ...
    kGetAttr,   // target . name
    kGetItem,   // target [ args[0] ]
    kSlice,     // target [ args[0] : args[1] : args[2] ] (each may be null)
    kCall,      // target ( args, kwargs )
    kFilter,    // target | name ( args, kwargs ); target null inside {% filter %}
    kTest,      // target is [not] name ( args )
    kUnary,     // op target: "not", "-", "+"
    kBinary,    // args[0] op args[1]
    kCondition  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  std::string name;  // name, attribute, filter/test name, or operator
  bool negated = false;
  Value value;
  ExprPtr target;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; else_body
    kFor,          // for targets in expr [if condition]: body; else_body
    kSet,          // set targets (or ns.attr) = expr, or block set capturing body
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body
    kFilterBlock,  // filter expr: body
    kWith,         // with assignments: body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;                  // text; macro name; set attribute
  std::vector<std::string> targets;  // loop / set names
  ExprPtr expr;                      // output, loop iterable, set value, call, filter chain
  ExprPtr condition;                 // loop filter
  std::vector<ExprPtr> conditions;   // if / elif
  std::vector<Body> bodies;          // if / elif bodies
  Body body;
  Body else_body;
  std::vector<MacroParam> params;  // macro / call block; with: name = value
};

}  // namespace llm::jinja
