#include "text/jinja/template.h"

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"

namespace llm::jinja {

struct Template::Parsed {
  Body body;
};

namespace {

std::string WithLine(const JinjaError& e) {
  if (e.line() <= 0) return e.what();
  return std::string(e.what()) + " (template line " + std::to_string(e.line()) + ")";
}

// Unknown filters and tests are compile-time errors in jinja2 too; report them at load.
void CheckNames(const Expr* e) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::kFilter && !HasFilter(e->name)) {
    throw JinjaError(ErrorKind::kUnsupported, "unsupported construct: filter '" + e->name + "'",
                     e->line);
  }
  if (e->kind == Expr::Kind::kTest && !HasTest(e->name)) {
    throw JinjaError(ErrorKind::kUnsupported, "unsupported construct: test '" + e->name + "'",
                     e->line);
  }
  CheckNames(e->target.get());
  for (const auto& a : e->args) CheckNames(a.get());
  for (const auto& [k, a] : e->kwargs) CheckNames(a.get());
}

void CheckNames(const Body& body) {
  for (const StmtPtr& s : body) {
    CheckNames(s->expr.get());
    CheckNames(s->condition.get());
    for (const auto& c : s->conditions) CheckNames(c.get());
    for (const auto& b : s->bodies) CheckNames(b);
    CheckNames(s->body);
    CheckNames(s->else_body);
    for (const auto& p : s->params) CheckNames(p.default_value.get());
  }
}

}  // namespace

StatusOr<Template> Template::Parse(const std::string& source) {
  try {
    auto parsed = std::make_shared<Parsed>();
    parsed->body = jinja::Parse(Tokenize(source));
    CheckNames(parsed->body);
    return Template(std::move(parsed));
  } catch (const JinjaError& e) {
    if (e.kind() == ErrorKind::kUnsupported) return Unimplemented(WithLine(e));
    return InvalidArgument("template syntax error: " + WithLine(e));
  } catch (const std::exception& e) {
    return Internal(std::string("template parse failed: ") + e.what());
  }
}

StatusOr<std::string> Template::Render(const nlohmann::ordered_json& variables,
                                       const RenderOptions& options) const {
  if (!variables.is_object()) return InvalidArgument("template variables must be a JSON object");
  try {
    Interpreter in(options.limits, options.now ? *options.now : std::time(nullptr));
    for (auto it = variables.begin(); it != variables.end(); ++it) {
      in.SetGlobal(it.key(), Value::FromJson(it.value()));
    }
    return in.Render(parsed_->body);
  } catch (const JinjaError& e) {
    switch (e.kind()) {
      case ErrorKind::kRaised:
        return FailedPrecondition(e.what());
      case ErrorKind::kLimit:
        return ResourceExhausted("template render: " + WithLine(e));
      default:
        return InvalidArgument("template render error: " + WithLine(e));
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("template render ran out of memory");
  } catch (const std::exception& e) {
    return Internal(std::string("template render failed: ") + e.what());
  }
}

}  // namespace llm::jinja
