// Regular expressions to expressions, shared by the regex front end and JSON Schema "pattern".
#pragma once

#include <string>

#include "grammar/expr.h"

namespace llm::grammar {

enum class RegexFlavor {
  kWholeOutput,        // guided_regex: the output is exactly one match
  kJsonStringPattern,  // JSON Schema "pattern": an unanchored search inside a JSON string body
};

// Throws CompileError naming what is refused (lookaround, backreferences, \b, inner anchors...).
ExprPtr RegexToExpr(const std::string& pattern, RegexFlavor flavor);

// How the characters of `set` may appear between the quotes of a JSON string, in the form
// Python's json.dumps(ensure_ascii=False) writes them: raw, or escaped where JSON requires it.
ExprPtr JsonStringChars(const CodepointRanges& set);

// Decodes one UTF-8 code point at s[i], advancing i; throws CompileError on malformed input.
uint32_t NextCodepoint(const std::string& s, size_t& i);

}  // namespace llm::grammar
