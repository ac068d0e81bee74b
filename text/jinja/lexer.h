// Lexer: template source -> tokens, with jinja2's whitespace rules as transformers configures
// them (trim_blocks, lstrip_blocks, "-"/"+" markers, keep_trailing_newline off, newlines
// normalized to "\n").
#pragma once

#include <string>
#include <vector>

namespace llm::jinja {

struct Token {
  enum class Type {
    kText,        // literal template data
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text holds the decoded value
    kInt,
    kFloat,
    kOperator,
    kEof,
  };
  Type type;
  std::string text;
  int line = 1;
};

// Throws JinjaError(kSyntax) on unterminated tags, strings or comments.
std::vector<Token> Tokenize(const std::string& source);

}  // namespace llm::jinja
