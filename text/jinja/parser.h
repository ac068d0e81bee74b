// Parser: tokens -> statement tree, following jinja2's grammar and operator precedence.
// Constructs outside what this engine implements fail here, naming the construct.
#pragma once

#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace llm::jinja {

// Throws JinjaError (kSyntax or kUnsupported) with the line of the offending token.
Body Parse(const std::vector<Token>& tokens);

}  // namespace llm::jinja
