// Building blocks of the JSON Schema compiler: exact integer and number ranges, strings, formats
// and literal values, all in the text form Python's json.dumps(ensure_ascii=False) writes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grammar/expr.h"

namespace llm::grammar {

// Integers in [lo, hi] (either side open), no leading zeros, no "-0".
ExprPtr IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi);
// Numbers (fraction allowed, no exponent) in [lo, hi] with integer bounds, each side inclusive
// or exclusive or open.
ExprPtr NumberRange(std::optional<int64_t> lo, bool lo_exclusive, std::optional<int64_t> hi,
                    bool hi_exclusive);
// Any JSON number (with exponent).
ExprPtr AnyNumber();
// One character inside a JSON string, any escape allowed; `except` removes raw code points.
ExprPtr JsonStringChar(const CodepointRanges& except = {});
// A string format's content (between the quotes); nullptr for an unknown format.
ExprPtr FormatContent(const std::string& format);
// The canonical text of a JSON string literal (quotes included).
std::string JsonQuote(const std::string& utf8);

}  // namespace llm::grammar
