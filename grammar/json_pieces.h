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
// An exact decimal (a bound of a number range): digits without leading zeros (or "0") and
// a fraction without trailing zeros; zero is never negative.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0", frac_digits;
};
// Parses a JSON number's text, exponent included; throws CompileError beyond 1e18.
Decimal ParseDecimal(const std::string& text);
// Numbers (fraction allowed, no exponent) between decimal bounds, each side inclusive, exclusive
// or open; exact. Fraction comparisons become small digit automata (rules added to `b`).
ExprPtr NumberRange(GrammarBuilder& b, const std::optional<Decimal>& lo, bool lo_exclusive,
                    const std::optional<Decimal>& hi, bool hi_exclusive);
// Any JSON number (with exponent).
ExprPtr AnyNumber();
// One character inside a JSON string, any escape allowed; `except` removes raw code points.
ExprPtr JsonStringChar(const CodepointRanges& except = {});
// A string format's content (between the quotes); nullptr for an unknown format.
ExprPtr FormatContent(const std::string& format);

}  // namespace llm::grammar
