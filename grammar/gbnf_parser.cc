// llama.cpp's GBNF syntax: `name ::= body` rules (a body runs until the next `name ::=`), string
// literals with C-style and \xHH \uHHHH \UHHHHHHHH escapes, [...] / [^...] code point classes,
// `.` (any character), ( ) groups, | alternation, postfix * + ? {m} {m,} {m,n}, and # comments.
// The start rule is `root`.
#include <cctype>

#include "grammar/grammar.h"
#include "grammar/regex.h"

namespace llm::grammar {

namespace {

class GbnfParser {
 public:
  explicit GbnfParser(const std::string& text) : s_(text) {}

  std::shared_ptr<const Grammar> Parse() {
    SkipSpace();
    while (i_ < s_.size()) {
      size_t at = i_;
      std::string name = Name();
      if (name.empty()) Fail("expected a rule name");
      SkipSpace();
      if (s_.compare(i_, 3, "::=") != 0) Fail("expected '::=' after '" + name + "'");
      i_ += 3;
      int rule = b_.FindOrAddRule(name);
      if (b_.IsDefined(rule)) {
        i_ = at;
        Fail("rule '" + name + "' is defined twice");
      }
      b_.Define(rule, ParseAlt());
      if (i_ < s_.size() && s_[i_] == ')') Fail("unbalanced ')'");
    }
    for (int r = 0; r < b_.size(); ++r)
      if (!b_.IsDefined(r)) throw CompileError{"gbnf: rule '" + b_.Name(r) + "' is not defined"};
    int root = -1;
    for (int r = 0; r < b_.size(); ++r)
      if (b_.Name(r) == "root") root = r;
    if (root < 0) throw CompileError{"gbnf: no 'root' rule"};
    auto g = Grammar::Build(b_, root);
    if (!g.ok()) throw CompileError{"gbnf: " + g.error()};
    return g.value();
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    int line = 1;
    for (size_t k = 0; k < i_ && k < s_.size(); ++k) line += s_[k] == '\n';
    throw CompileError{"gbnf: " + what + " (line " + std::to_string(line) + ")"};
  }

  static bool NameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  }

  void SkipSpace() {
    while (i_ < s_.size()) {
      if (std::isspace(static_cast<unsigned char>(s_[i_]))) {
        ++i_;
      } else if (s_[i_] == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    size_t start = i_;
    while (i_ < s_.size() && NameChar(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }

  // True when a `name ::=` starts at i_: the current rule's body has ended.
  bool AtRuleStart() {
    size_t k = i_;
    while (k < s_.size() && NameChar(s_[k])) ++k;
    if (k == i_) return false;
    while (k < s_.size() && std::isspace(static_cast<unsigned char>(s_[k]))) ++k;
    return s_.compare(k, 3, "::=") == 0;
  }

  ExprPtr ParseAlt() {
    std::vector<ExprPtr> alts{ParseSeq()};
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alts.push_back(ParseSeq());
    }
    return Alt(std::move(alts));
  }

  ExprPtr ParseSeq() {
    std::vector<ExprPtr> seq;
    while (true) {
      SkipSpace();
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')' || AtRuleStart()) break;
      seq.push_back(ParsePostfix(ParsePrimary()));
    }
    return seq.empty() ? Empty() : Seq(std::move(seq));
  }

  ExprPtr ParsePrimary() {
    char c = s_[i_];
    if (c == '"') {
      ++i_;
      std::string bytes;
      while (i_ < s_.size() && s_[i_] != '"') {
        if (s_[i_] == '\n') Fail("newline inside a string literal");
        bytes += EncodeUtf8(Char());
      }
      if (i_ >= s_.size()) Fail("unterminated string literal");
      ++i_;
      return Lit(bytes);
    }
    if (c == '[') {
      ++i_;
      bool negate = i_ < s_.size() && s_[i_] == '^';
      if (negate) ++i_;
      CodepointRanges set;
      while (i_ < s_.size() && s_[i_] != ']') {
        uint32_t lo = Char(), hi = lo;
        if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
          ++i_;
          hi = Char();
          if (hi < lo) Fail("character range out of order");
        }
        set.Add(lo, hi);
      }
      if (i_ >= s_.size()) Fail("unterminated character class");
      ++i_;
      return Utf8(negate ? set.Complement() : set);
    }
    if (c == '.') {
      ++i_;
      CodepointRanges all;
      all.Add(0, 0x10FFFF);
      return Utf8(all);
    }
    if (c == '(') {
      ++i_;
      ExprPtr inner = ParseAlt();
      SkipSpace();
      if (i_ >= s_.size() || s_[i_] != ')') Fail("missing ')'");
      ++i_;
      return inner;
    }
    if (NameChar(c)) return Ref(b_.FindOrAddRule(Name()));
    Fail(std::string("unexpected '") + c + "'");
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == '*') {
        e = Star(e), ++i_;
      } else if (c == '+') {
        e = Repeat(e, 1, kUnbounded), ++i_;
      } else if (c == '?') {
        e = Optional(e), ++i_;
      } else if (c == '{') {
        ++i_;
        SkipSpace();
        int lo = Int(), hi = lo;
        SkipSpace();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          SkipSpace();
          hi = i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_])) ? Int()
                                                                                  : kUnbounded;
          SkipSpace();
        }
        if (i_ >= s_.size() || s_[i_] != '}') Fail("expected '}'");
        ++i_;
        if (hi != kUnbounded && hi < lo) Fail("{m,n} with n < m");
        e = Repeat(e, lo, hi);
      } else {
        break;
      }
    }
    return e;
  }

  int Int() {
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_])))
      Fail("expected a number");
    long v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v = v * 10 + (s_[i_++] - '0');
      if (v > 100000) Fail("repetition count too large");
    }
    return static_cast<int>(v);
  }

  // One character of a literal or class, escapes decoded.
  uint32_t Char() {
    if (s_[i_] != '\\') {
      try {
        return NextCodepoint(s_, i_);
      } catch (const CompileError&) {
        Fail("malformed UTF-8");
      }
    }
    ++i_;
    if (i_ >= s_.size()) Fail("trailing backslash");
    char e = s_[i_++];
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '0':
        return 0;
      case 'x':
        return Hex(2);
      case 'u':
        return Hex(4);
      case 'U':
        return Hex(8);
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
        return static_cast<uint8_t>(e);
    }
    Fail(std::string("unknown escape \\") + e);
  }

  uint32_t Hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_])))
        Fail("bad hex escape");
      char h = s_[i_++];
      v = v * 16 +
          (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
  GrammarBuilder b_;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> ParseGbnf(const std::string& text) {
  try {
    return GbnfParser(text).Parse();
  } catch (const CompileError& e) {
    return Result<std::shared_ptr<const Grammar>>::Error(e.message);
  }
}

}  // namespace llm::grammar
