// The expression tree every front end (GBNF, regex, JSON Schema, choices) builds; grammar_builder
// lowers it to the flat rules the pushdown automaton runs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llm::grammar {

// A set of bytes: the automaton's only terminal.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool operator==(const ByteSet&) const = default;
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum Kind { kBytes, kSet, kSeq, kAlt, kRef, kRepeat };
  Kind kind;
  std::string bytes;          // kBytes
  ByteSet set;                // kSet
  std::vector<ExprPtr> kids;  // kSeq, kAlt (no kids: matches nothing), kRepeat (one kid)
  int rule = -1;              // kRef
  int min = 0, max = 0;       // kRepeat; max < 0: unbounded
};

constexpr int kUnbounded = -1;

ExprPtr Lit(std::string bytes);
ExprPtr Set(const ByteSet& set);
ExprPtr Seq(std::vector<ExprPtr> kids);
ExprPtr Alt(std::vector<ExprPtr> kids);
ExprPtr Ref(int rule);
ExprPtr Repeat(ExprPtr kid, int min, int max);
inline ExprPtr Empty() {
  return Lit("");
}
inline ExprPtr Nothing() {
  return Alt({});
}
inline ExprPtr Optional(ExprPtr e) {
  return Repeat(std::move(e), 0, 1);
}
inline ExprPtr Star(ExprPtr e) {
  return Repeat(std::move(e), 0, kUnbounded);
}

// Code point ranges [lo, hi], inclusive; Utf8 compiles them to byte sequences.
struct CodepointRanges {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  void Add(uint32_t lo, uint32_t hi) { ranges.emplace_back(lo, hi); }
  void Add(uint32_t c) { ranges.emplace_back(c, c); }
  CodepointRanges Normalized() const;  // sorted, merged, surrogates removed
  CodepointRanges Complement() const;  // against U+0000..U+10FFFF
  bool Contains(uint32_t c) const;
};

// The UTF-8 encodings of every code point in the set, as an alternation of byte-set sequences.
ExprPtr Utf8(const CodepointRanges& set);
std::string EncodeUtf8(uint32_t c);

// A rule set under construction: rules are named so errors and the README can refer to them.
class GrammarBuilder {
 public:
  int AddRule(const std::string& name);  // a fresh rule (the name is made unique)
  int FindOrAddRule(const std::string& name);
  void Define(int rule, ExprPtr body);
  bool IsDefined(int rule) const { return bodies_[rule] != nullptr; }
  const std::string& Name(int rule) const { return names_[rule]; }
  int size() const { return static_cast<int>(names_.size()); }
  const ExprPtr& Body(int rule) const { return bodies_[rule]; }

 private:
  std::vector<std::string> names_;
  std::vector<ExprPtr> bodies_;
};

}  // namespace llm::grammar
