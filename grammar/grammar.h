// A grammar lowered to flat rules: each rule is a list of alternatives, each alternative a run of
// positions ending in kEnd. A position consumes one byte of a set (kByte), any number of bytes of
// a set (kByteStar), or a whole rule (kRef). The pushdown automaton (stack.h) walks positions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/expr.h"
#include "grammar/result.h"

namespace llm::grammar {

struct Position {
  enum Kind : uint8_t { kByte, kByteStar, kRef, kEnd };
  Kind kind = kEnd;
  bool tail = false;  // kRef followed by kEnd: the callee returns straight to our caller
  uint32_t arg = 0;   // kByte/kByteStar: index into sets; kRef: rule
};

class Grammar {
 public:
  // Lowers the builder's rules; fails on an undefined rule or left recursion, naming the rule.
  // `special_tokens`: the vocabulary's special tokens may match where their text fits (a model's
  // own markup, such as gpt-oss's <|channel|>); otherwise they never do.
  static Result<std::shared_ptr<const Grammar>> Build(const GrammarBuilder& builder, int root,
                                                      bool special_tokens = false);

  const std::vector<ByteSet>& sets() const { return sets_; }
  const std::vector<Position>& positions() const { return positions_; }
  const std::vector<uint32_t>& RuleStarts(uint32_t rule) const { return rule_starts_[rule]; }
  uint32_t RuleOf(uint32_t pos) const { return rule_of_[pos]; }
  const std::string& RuleName(uint32_t rule) const { return rule_names_[rule]; }
  int root() const { return root_; }
  bool special_tokens() const { return special_tokens_; }
  size_t num_rules() const { return rule_names_.size(); }
  std::string ToString() const;  // one line per alternative, for debugging and tests

 private:
  friend class Lowerer;
  std::vector<ByteSet> sets_;
  std::vector<Position> positions_;
  std::vector<uint32_t> rule_of_;
  std::vector<std::vector<uint32_t>> rule_starts_;
  std::vector<std::string> rule_names_;
  int root_ = 0;
  bool special_tokens_ = false;
};

// Front ends. Each returns the grammar or an error that names what is wrong.
// GBNF: llama.cpp's grammar syntax (see README.md); the start rule is "root".
Result<std::shared_ptr<const Grammar>> ParseGbnf(const std::string& text);
// A regular expression that must match the whole output (see regex_parser.cc for the subset).
Result<std::shared_ptr<const Grammar>> ParseRegex(const std::string& pattern);
// Exactly one of the given strings.
Result<std::shared_ptr<const Grammar>> MakeChoices(const std::vector<std::string>& choices);

struct JsonSchemaOptions {
  // Whitespace allowed at each place JSON allows it: at most this many of ' ', '\n', '\t', '\r'.
  int max_whitespace = 16;
  // Longest string length (minLength/maxLength) or array size the compiler expands exactly.
  int max_expanded_repeat = 1000;
};
Result<std::shared_ptr<const Grammar>> CompileJsonSchema(const std::string& schema_json,
                                                         const JsonSchemaOptions& options = {});
// JSON values between fixed texts (a model's tool-call syntax around a function's parameters):
// {"prefix", "items": [{"begin", "schema", "end"}, ...], "separator", "max_items", "suffix"}
// matches prefix, then 1 to max_items (default 1) items separated by separator, then suffix; an
// item is its begin, a value of its schema, its end. Missing texts are empty. The fixed texts may
// be written with the vocabulary's special tokens (a model's call markup often is one).
Result<std::shared_ptr<const Grammar>> CompileTaggedJsonSchemas(
    const std::string& spec_json, const JsonSchemaOptions& options = {});

}  // namespace llm::grammar
