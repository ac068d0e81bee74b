// Errors inside the engine travel as a C++ exception and become a Status at the public API
// (Template::Parse / Template::Render); nothing thrown here leaves the engine.
#pragma once

#include <stdexcept>
#include <string>

namespace llm::jinja {

enum class ErrorKind {
  kSyntax,       // the template does not parse
  kUnsupported,  // valid jinja2 this engine does not implement
  kRender,       // a runtime error jinja2 would raise too (UndefinedError, TypeError, ...)
  kRaised,       // the template called raise_exception()
  kLimit,        // a bound on output size, loop iterations or nesting was hit
};

class JinjaError : public std::runtime_error {
 public:
  JinjaError(ErrorKind kind, const std::string& message, int line = 0)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  ErrorKind kind() const { return kind_; }
  int line() const { return line_; }

 private:
  ErrorKind kind_;
  int line_;
};

[[noreturn]] inline void ThrowRender(const std::string& message) {
  throw JinjaError(ErrorKind::kRender, message);
}

}  // namespace llm::jinja
