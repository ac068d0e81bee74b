#include "grammar/regex.h"

#include <cstdio>

#include "grammar/grammar.h"
#include "grammar/result.h"

namespace llm::grammar {

uint32_t NextCodepoint(const std::string& s, size_t& i) {
  unsigned char c = s[i];
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) throw CompileError{"malformed UTF-8 in the pattern"};
  uint32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

ExprPtr JsonStringChars(const CodepointRanges& set) {
  CodepointRanges raw;
  std::vector<ExprPtr> alts;
  auto escaped = [&](uint32_t c) -> std::string {
    switch (c) {
      case '"':
        return "\\\"";
      case '\\':
        return "\\\\";
      case '\b':
        return "\\b";
      case '\f':
        return "\\f";
      case '\n':
        return "\\n";
      case '\r':
        return "\\r";
      case '\t':
        return "\\t";
    }
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", c);
    return buf;
  };
  for (auto [lo, hi] : set.Normalized().ranges) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c) {
      if (c < 0x20 || c == '"' || c == '\\') alts.push_back(Lit(escaped(c)));
    }
    // Raw pieces of [lo, hi] that avoid control characters, '"' and '\'.
    uint32_t a = std::max<uint32_t>(lo, 0x20);
    for (uint32_t cut : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (a <= cut && cut <= hi) {
        if (a < cut) raw.Add(a, cut - 1);
        a = cut + 1;
      }
    }
    if (a <= hi) raw.Add(a, hi);
  }
  if (!raw.ranges.empty()) alts.insert(alts.begin(), Utf8(raw));
  return Alt(std::move(alts));
}

namespace {

CodepointRanges Digits() {
  CodepointRanges r;
  r.Add('0', '9');
  return r;
}
CodepointRanges Word() {
  CodepointRanges r;
  r.Add('0', '9');
  r.Add('A', 'Z');
  r.Add('a', 'z');
  r.Add('_');
  return r;
}
CodepointRanges Space() {
  CodepointRanges r;
  r.Add('\t', '\r');  // \t \n \v \f \r
  r.Add(' ');
  return r;
}

class RegexParser {
 public:
  RegexParser(const std::string& p, RegexFlavor f) : p_(p), flavor_(f) {}

  ExprPtr Parse() {
    size_t end = p_.size();
    bool start_anchor = !p_.empty() && p_[0] == '^';
    if (start_anchor) i_ = 1;
    // A trailing '$' is an anchor unless escaped (an odd run of backslashes before it).
    bool end_anchor = false;
    if (end > i_ && p_[end - 1] == '$') {
      size_t bs = 0;
      while (end - 1 - bs > i_ && p_[end - 2 - bs] == '\\') ++bs;
      if (bs % 2 == 0) {
        end_anchor = true;
        --end;
      }
    }
    end_ = end;
    ExprPtr body = ParseAlt();
    if (i_ != end_) throw CompileError{"regex: unexpected ')' at offset " + std::to_string(i_)};
    if (flavor_ == RegexFlavor::kWholeOutput) return body;
    CodepointRanges all;
    all.Add(0, 0x10FFFF);
    ExprPtr any = Star(Chars(all));
    std::vector<ExprPtr> seq;
    if (!start_anchor) seq.push_back(any);
    seq.push_back(body);
    if (!end_anchor) seq.push_back(any);
    return Seq(std::move(seq));
  }

 private:
  bool AtEnd() const { return i_ >= end_; }
  char Peek() const { return p_[i_]; }

  ExprPtr Chars(const CodepointRanges& set) {
    return flavor_ == RegexFlavor::kJsonStringPattern ? JsonStringChars(set) : Utf8(set);
  }

  ExprPtr ParseAlt() {
    std::vector<ExprPtr> alts{ParseSeq()};
    while (!AtEnd() && Peek() == '|') {
      ++i_;
      alts.push_back(ParseSeq());
    }
    return Alt(std::move(alts));
  }

  ExprPtr ParseSeq() {
    std::vector<ExprPtr> seq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') seq.push_back(ParseQuantified());
    if (seq.empty()) return Empty();
    return Seq(std::move(seq));
  }

  int ParseInt() {
    size_t start = i_;
    long v = 0;
    while (!AtEnd() && isdigit(static_cast<unsigned char>(Peek()))) {
      v = v * 10 + (Peek() - '0');
      if (v > 100000) throw CompileError{"regex: repetition count too large"};
      ++i_;
    }
    return i_ == start ? -1 : static_cast<int>(v);
  }

  ExprPtr ParseQuantified() {
    ExprPtr atom = ParseAtom();
    while (!AtEnd()) {
      char c = Peek();
      int lo, hi;
      if (c == '*') {
        lo = 0, hi = kUnbounded, ++i_;
      } else if (c == '+') {
        lo = 1, hi = kUnbounded, ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (c == '{') {
        size_t save = i_++;
        lo = ParseInt();
        hi = lo;
        if (!AtEnd() && Peek() == ',') {
          ++i_;
          hi = ParseInt();
          if (hi < 0) hi = kUnbounded;
        }
        if (lo < 0 || AtEnd() || Peek() != '}') {  // not a quantifier: a literal '{'
          i_ = save;
          return atom;
        }
        ++i_;
        if (hi != kUnbounded && hi < lo) throw CompileError{"regex: {m,n} with n < m"};
      } else {
        return atom;
      }
      if (!AtEnd() && Peek() == '?')
        ++i_;  // lazy: same language
      else if (!AtEnd() && Peek() == '+')
        throw CompileError{"regex: possessive quantifiers are not supported"};
      atom = Repeat(atom, lo, hi);
    }
    return atom;
  }

  ExprPtr ParseAtom() {
    char c = Peek();
    if (c == '(') {
      ++i_;
      if (p_.compare(i_, 2, "?:") == 0) {
        i_ += 2;
      } else if (p_.compare(i_, 2, "?=") == 0 || p_.compare(i_, 2, "?!") == 0 ||
                 p_.compare(i_, 3, "?<=") == 0 || p_.compare(i_, 3, "?<!") == 0) {
        throw CompileError{"regex: lookaround is not supported"};
      } else if (p_.compare(i_, 2, "?<") == 0 || p_.compare(i_, 3, "?P<") == 0) {
        i_ = p_.find('>', i_);
        if (i_ == std::string::npos) throw CompileError{"regex: unterminated group name"};
        ++i_;
      } else if (!AtEnd() && Peek() == '?') {
        throw CompileError{"regex: group flags (?...) are not supported"};
      }
      ExprPtr inner = ParseAlt();
      if (AtEnd() || Peek() != ')') throw CompileError{"regex: missing ')'"};
      ++i_;
      return inner;
    }
    if (c == '[') return Chars(ParseClass());
    if (c == '.') {
      ++i_;
      CodepointRanges nl;
      nl.Add('\n');
      return Chars(nl.Complement());
    }
    if (c == '^' || c == '$')
      throw CompileError{std::string("regex: anchor '") + c +
                         "' is only supported at the start/end of the pattern"};
    if (c == '*' || c == '+' || c == '?') throw CompileError{"regex: nothing to repeat"};
    CodepointRanges set;
    if (c == '\\') {
      ParseEscape(set, /*in_class=*/false);
    } else {
      set.Add(NextCodepoint(p_, i_));
    }
    return Chars(set);
  }

  // Adds the escape at i_ (pointing at '\') to `set`.
  void ParseEscape(CodepointRanges& set, bool in_class) {
    ++i_;
    if (AtEnd()) throw CompileError{"regex: trailing backslash"};
    char e = p_[i_++];
    auto add_all = [&](const CodepointRanges& r) {
      for (auto x : r.ranges) set.ranges.push_back(x);
    };
    switch (e) {
      case 'd':
        return add_all(Digits());
      case 'D':
        return add_all(Digits().Complement());
      case 'w':
        return add_all(Word());
      case 'W':
        return add_all(Word().Complement());
      case 's':
        return add_all(Space());
      case 'S':
        return add_all(Space().Complement());
      case 'n':
        return set.Add('\n');
      case 'r':
        return set.Add('\r');
      case 't':
        return set.Add('\t');
      case 'f':
        return set.Add('\f');
      case 'v':
        return set.Add('\v');
      case '0':
        return set.Add(0);
      case 'b':
        if (in_class) return set.Add('\b');
        throw CompileError{"regex: word boundary \\b is not supported"};
      case 'B':
        throw CompileError{"regex: \\B is not supported"};
      case 'x':
        return set.Add(Hex(2));
      case 'u':
        if (!AtEnd() && Peek() == '{') {
          ++i_;
          size_t close = p_.find('}', i_);
          if (close == std::string::npos) throw CompileError{"regex: bad \\u{...}"};
          uint32_t v = static_cast<uint32_t>(std::stoul(p_.substr(i_, close - i_), nullptr, 16));
          i_ = close + 1;
          return set.Add(v);
        }
        return set.Add(Hex(4));
      case 'p':
      case 'P':
        throw CompileError{"regex: Unicode property escapes are not supported"};
      case 'k':
        throw CompileError{"regex: backreferences are not supported"};
      case 'c':
        throw CompileError{"regex: control escapes \\cX are not supported"};
      default:
        if (e >= '1' && e <= '9') throw CompileError{"regex: backreferences are not supported"};
        if (isalnum(static_cast<unsigned char>(e)))
          throw CompileError{std::string("regex: unknown escape \\") + e};
        --i_;
        return set.Add(NextCodepoint(p_, i_));
    }
  }

  uint32_t Hex(int n) {
    if (i_ + n > end_) throw CompileError{"regex: short hex escape"};
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      char h = p_[i_++];
      if (!isxdigit(static_cast<unsigned char>(h))) throw CompileError{"regex: bad hex escape"};
      v = v * 16 + (isdigit(static_cast<unsigned char>(h)) ? h - '0' : (tolower(h) - 'a' + 10));
    }
    return v;
  }

  CodepointRanges ParseClass() {
    ++i_;  // '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++i_;
    }
    CodepointRanges set;
    bool first = true;
    while (true) {
      if (AtEnd()) throw CompileError{"regex: missing ']'"};
      if (Peek() == ']' && !first) break;
      first = false;
      uint32_t lo;
      if (Peek() == '\\') {
        CodepointRanges one;
        ParseEscape(one, /*in_class=*/true);
        if (one.ranges.size() != 1 || one.ranges[0].first != one.ranges[0].second) {
          for (auto r : one.ranges) set.ranges.push_back(r);  // \d, \w, ... : not a range end
          continue;
        }
        lo = one.ranges[0].first;
      } else {
        if (p_.compare(i_, 2, "[:") == 0)
          throw CompileError{"regex: POSIX classes are not supported"};
        lo = NextCodepoint(p_, i_);
      }
      uint32_t hi = lo;
      if (i_ + 1 < end_ && Peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (Peek() == '\\') {
          CodepointRanges one;
          ParseEscape(one, true);
          if (one.ranges.size() != 1 || one.ranges[0].first != one.ranges[0].second)
            throw CompileError{"regex: bad range in character class"};
          hi = one.ranges[0].first;
        } else {
          hi = NextCodepoint(p_, i_);
        }
        if (hi < lo) throw CompileError{"regex: character class range out of order"};
      }
      set.Add(lo, hi);
    }
    ++i_;  // ']'
    return negate ? set.Complement() : set.Normalized();
  }

  const std::string& p_;
  RegexFlavor flavor_;
  size_t i_ = 0, end_ = 0;
};

}  // namespace

ExprPtr RegexToExpr(const std::string& pattern, RegexFlavor flavor) {
  return RegexParser(pattern, flavor).Parse();
}

Result<std::shared_ptr<const Grammar>> ParseRegex(const std::string& pattern) {
  try {
    GrammarBuilder b;
    int root = b.AddRule("root");
    b.Define(root, RegexToExpr(pattern, RegexFlavor::kWholeOutput));
    return Grammar::Build(b, root);
  } catch (const CompileError& e) {
    return Result<std::shared_ptr<const Grammar>>::Error(e.message);
  }
}

}  // namespace llm::grammar
