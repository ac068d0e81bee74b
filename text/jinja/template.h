// Template: the engine's public face. Parse once (errors name the construct and line), render
// many times, from any thread, with JSON variables. Renders as jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols) does with
// transformers' tojson, raise_exception and strftime_now; autoescape off.
#pragma once

#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "text/jinja/interpreter.h"

namespace llm::jinja {

struct RenderOptions {
  RenderLimits limits;
  // The clock strftime_now reads; unset means the current time (tests pin it).
  std::optional<std::time_t> now;
};

class Template {
 public:
  // InvalidArgument for a syntax error, Unimplemented for a construct this engine lacks.
  static StatusOr<Template> Parse(const std::string& source);

  // `variables` is a JSON object; ordered_json keeps key order as Python's dicts do. Errors:
  // FailedPrecondition for raise_exception() (message verbatim), ResourceExhausted for a limit,
  // InvalidArgument for any other render error.
  StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                               const RenderOptions& options = {}) const;

 private:
  struct Parsed;
  explicit Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace llm::jinja
