#include "grammar/json_pieces.h"

#include <map>
#include <tuple>

#include "grammar/regex.h"
#include "grammar/result.h"

namespace llm::grammar {

namespace {

ByteSet DigitSet(char lo = '0', char hi = '9') {
  ByteSet s;
  s.AddRange(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
  return s;
}

// Digit strings of x's length between x and y (same length, x <= y).
ExprPtr SameLength(const std::string& x, const std::string& y) {
  size_t n = x.size();
  if (n == 0) return Empty();
  std::string xr = x.substr(1), yr = y.substr(1);
  if (x[0] == y[0]) return Seq({Lit(std::string(1, x[0])), SameLength(xr, yr)});
  bool x_low = xr.find_first_not_of('0') == std::string::npos;
  bool y_high = yr.find_first_not_of('9') == std::string::npos;
  if (x_low && y_high)
    return Seq({Set(DigitSet(x[0], y[0])), Repeat(Set(DigitSet()), n - 1, n - 1)});
  std::vector<ExprPtr> alts;
  alts.push_back(Seq({Lit(std::string(1, x[0])), SameLength(xr, std::string(n - 1, '9'))}));
  if (y[0] - x[0] >= 2)
    alts.push_back(Seq({Set(DigitSet(x[0] + 1, y[0] - 1)), Repeat(Set(DigitSet()), n - 1, n - 1)}));
  alts.push_back(Seq({Lit(std::string(1, y[0])), SameLength(std::string(n - 1, '0'), yr)}));
  return Alt(std::move(alts));
}

int64_t Pow10(size_t k) {
  int64_t p = 1;
  while (k--) p *= 10;
  return p;
}

// Non-negative integers in [a, b] (b open when absent).
ExprPtr NonNegativeRange(int64_t a, std::optional<int64_t> b) {
  if (b && *b < a) return Nothing();
  std::vector<ExprPtr> alts;
  size_t la = std::to_string(a).size();
  size_t lb = b ? std::to_string(*b).size() : la;
  for (size_t len = la; len <= lb; ++len) {
    int64_t lo = std::max(a, len == 1 ? int64_t{0} : Pow10(len - 1));
    int64_t hi = len >= 19 ? INT64_MAX : Pow10(len) - 1;
    if (b) hi = std::min(hi, *b);
    if (lo <= hi) alts.push_back(SameLength(std::to_string(lo), std::to_string(hi)));
  }
  if (!b)  // every number with more digits than a
    alts.push_back(Seq({Set(DigitSet('1', '9')), Repeat(Set(DigitSet()), la, kUnbounded)}));
  return Alt(std::move(alts));
}

ExprPtr Digits1() {
  return Repeat(Set(DigitSet()), 1, kUnbounded);
}

}  // namespace

ExprPtr IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  const int64_t kLimit = 1'000'000'000'000'000'000;
  if ((lo && (*lo > kLimit || *lo < -kLimit)) || (hi && (*hi > kLimit || *hi < -kLimit)))
    throw CompileError{"integer bound beyond 1e18"};
  std::vector<ExprPtr> alts;
  if (!hi || *hi >= 0) alts.push_back(NonNegativeRange(lo ? std::max<int64_t>(*lo, 0) : 0, hi));
  if (!lo || *lo < 0) {
    int64_t a = hi ? std::max<int64_t>(1, -*hi) : 1;
    std::optional<int64_t> b;
    if (lo) b = -*lo;
    if (!b || a <= *b) alts.push_back(Seq({Lit("-"), NonNegativeRange(a, b)}));
  }
  return Alt(std::move(alts));
}

Decimal ParseDecimal(const std::string& text) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string digits;
  long point = -1;
  for (; i < text.size() && (isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i) {
    if (text[i] == '.')
      point = static_cast<long>(digits.size());
    else
      digits += text[i];
  }
  if (point < 0) point = static_cast<long>(digits.size());
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) point += std::stol(text.substr(i + 1));
  if (point > 18) throw CompileError{"number bound beyond 1e18"};
  if (point < -40) point = -40;  // far below any digit the bounds test
  while (point < 0) digits.insert(digits.begin(), '0'), ++point;
  while (static_cast<long>(digits.size()) < point) digits += '0';
  d.int_digits = digits.substr(0, point);
  d.frac_digits = digits.substr(point);
  d.int_digits.erase(0, std::min(d.int_digits.find_first_not_of('0'), d.int_digits.size()));
  if (d.int_digits.empty()) d.int_digits = "0";
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  if (d.int_digits == "0" && d.frac_digits.empty()) d.negative = false;
  return d;
}

namespace {

// Compares non-negative magnitudes.
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  if (a.int_digits.size() != b.int_digits.size())
    return a.int_digits.size() < b.int_digits.size() ? -1 : 1;
  if (int c = a.int_digits.compare(b.int_digits)) return c < 0 ? -1 : 1;
  if (int c = a.frac_digits.compare(b.frac_digits)) return c < 0 ? -1 : 1;
  return 0;
}

// The digits after a number's '.', compared with the fractions of the bounds whose integer part
// the number shares ("tight" sides). R(k, lo_tight, hi_tight) is the language of the remaining
// digits; beyond both bounds' lengths the bound digits are zeros, so states repeat and loop.
class FractionAutomaton {
 public:
  FractionAutomaton(GrammarBuilder& b, const std::string* x, bool x_strict, const std::string* y,
                    bool y_strict)
      : b_(b), x_(x), y_(y), x_strict_(x_strict), y_strict_(y_strict) {
    len_ = std::max(x ? x->size() : 0, y ? y->size() : 0);
  }

  // "" (when the value without a fraction qualifies) | "." digits.
  ExprPtr Fraction() {
    std::vector<ExprPtr> alts;
    if (EndOk(0, x_ != nullptr, y_ != nullptr)) alts.push_back(Empty());
    ExprPtr t = Transitions(0, x_ != nullptr, y_ != nullptr);
    alts.push_back(Seq({Lit("."), t}));
    return Alt(std::move(alts));
  }

 private:
  int Digit(const std::string* s, size_t k) const { return k < s->size() ? (*s)[k] - '0' : 0; }

  bool EndOk(size_t k, bool lt, bool ht) const {
    bool lo_ok = !lt || (k >= x_->size() && !x_strict_);
    bool hi_ok = !ht || k < y_->size() || !y_strict_;
    return lo_ok && hi_ok;
  }

  // One or more digits from position k.
  ExprPtr Transitions(size_t k, bool lt, bool ht) {
    std::map<std::pair<bool, bool>, ByteSet> groups;
    for (int d = 0; d <= 9; ++d) {
      if (lt && d < Digit(x_, k)) continue;
      if (ht && d > Digit(y_, k)) continue;
      groups[{lt && d == Digit(x_, k), ht && d == Digit(y_, k)}].Add(static_cast<uint8_t>('0' + d));
    }
    std::vector<ExprPtr> alts;
    for (auto& [flags, set] : groups)
      alts.push_back(Seq({Set(set), Rest(k + 1, flags.first, flags.second)}));
    return Alt(std::move(alts));
  }

  // Zero or more digits from position k.
  ExprPtr Rest(size_t k, bool lt, bool ht) {
    ByteSet digit;
    digit.AddRange('0', '9');
    if (!lt && !ht) return Star(Set(digit));
    auto key = std::make_tuple(std::min(k, len_), lt, ht);
    if (auto it = rules_.find(key); it != rules_.end()) return Ref(it->second);
    int r = b_.AddRule("fraction");
    rules_[key] = r;
    std::vector<ExprPtr> alts;
    if (EndOk(k, lt, ht)) alts.push_back(Empty());
    alts.push_back(Transitions(std::min(k, len_), lt, ht));
    b_.Define(r, Alt(std::move(alts)));
    return Ref(r);
  }

  GrammarBuilder& b_;
  const std::string *x_, *y_;
  bool x_strict_, y_strict_;
  size_t len_;
  std::map<std::tuple<size_t, bool, bool>, int> rules_;
};

int64_t ToInt(const std::string& digits) {
  return std::stoll(digits);
}

// Non-negative numbers between `lo` (a magnitude) and `hi` (absent: open), as "I" or "I.F".
ExprPtr NonNegativeDecimals(GrammarBuilder& b, const Decimal& lo, bool lo_strict,
                            const std::optional<Decimal>& hi, bool hi_strict) {
  if (hi) {
    int c = CompareMagnitude(lo, *hi);
    if (c > 0 || (c == 0 && (lo_strict || hi_strict))) return Nothing();
  }
  ByteSet digit;
  digit.AddRange('0', '9');
  ExprPtr any_fraction = Optional(Seq({Lit("."), Repeat(Set(digit), 1, kUnbounded)}));
  int64_t il = ToInt(lo.int_digits);
  if (hi && hi->int_digits == lo.int_digits) {
    FractionAutomaton f(b, &lo.frac_digits, lo_strict, &hi->frac_digits, hi_strict);
    return Seq({Lit(lo.int_digits), f.Fraction()});
  }
  std::vector<ExprPtr> alts;
  FractionAutomaton low(b, &lo.frac_digits, lo_strict, nullptr, false);
  alts.push_back(Seq({Lit(lo.int_digits), low.Fraction()}));
  std::optional<int64_t> mid_hi;
  if (hi) mid_hi = ToInt(hi->int_digits) - 1;
  if (!mid_hi || il + 1 <= *mid_hi)
    alts.push_back(Seq({IntegerRange(il + 1, mid_hi), any_fraction}));
  if (hi) {
    FractionAutomaton high(b, nullptr, false, &hi->frac_digits, hi_strict);
    alts.push_back(Seq({Lit(hi->int_digits), high.Fraction()}));
  }
  return Alt(std::move(alts));
}

}  // namespace

ExprPtr NumberRange(GrammarBuilder& b, const std::optional<Decimal>& lo, bool lo_exclusive,
                    const std::optional<Decimal>& hi, bool hi_exclusive) {
  std::vector<ExprPtr> alts;
  Decimal zero;
  // v >= 0: magnitudes from max(lo, 0) to hi.
  if (!hi || !hi->negative) {
    bool from_lo = lo && !lo->negative;
    alts.push_back(
        NonNegativeDecimals(b, from_lo ? *lo : zero, from_lo && lo_exclusive, hi, hi_exclusive));
  }
  // v < 0, written "-" and its magnitude: from |hi| (or just above 0) to |lo|.
  if (!lo || lo->negative) {
    Decimal mlo = zero;
    bool mlo_strict = true;  // no "-0"
    if (hi && hi->negative) {
      mlo = *hi;
      mlo.negative = false;
      mlo_strict = hi_exclusive;
    }
    std::optional<Decimal> mhi;
    if (lo) {
      mhi = *lo;
      mhi->negative = false;
    }
    alts.push_back(Seq({Lit("-"), NonNegativeDecimals(b, mlo, mlo_strict, mhi, lo_exclusive)}));
  }
  return Alt(std::move(alts));
}

ExprPtr AnyNumber() {
  ByteSet sign, e;
  sign.Add('+');
  sign.Add('-');
  e.Add('e');
  e.Add('E');
  return Seq({Optional(Lit("-")),
              Alt({Lit("0"), Seq({Set(DigitSet('1', '9')), Star(Set(DigitSet()))})}),
              Optional(Seq({Lit("."), Digits1()})),
              Optional(Seq({Set(e), Optional(Set(sign)), Digits1()}))});
}

ExprPtr JsonStringChar(const CodepointRanges& except) {
  // Raw characters: U+0020 and up, minus '"', '\\' and `except`.
  CodepointRanges excluded = except;
  excluded.Add('"');
  excluded.Add('\\');
  CodepointRanges allowed;
  uint32_t next = 0x20;
  for (auto [lo, hi] : excluded.Normalized().ranges) {
    if (hi < next) continue;
    if (lo > next) allowed.Add(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= 0x10FFFF) allowed.Add(next, 0x10FFFF);
  ByteSet simple, hex;
  for (char c : std::string("\"\\/bfnrt")) simple.Add(static_cast<uint8_t>(c));
  hex.AddRange('0', '9');
  hex.AddRange('a', 'f');
  hex.AddRange('A', 'F');
  return Alt(
      {Utf8(allowed), Seq({Lit("\\"), Set(simple)}), Seq({Lit("\\u"), Repeat(Set(hex), 4, 4)})});
}

ExprPtr FormatContent(const std::string& format) {
  static const std::string kDate = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
  static const std::string kTime =
      R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))";
  std::string re;
  if (format == "date") {
    re = kDate;
  } else if (format == "time") {
    re = kTime;
  } else if (format == "date-time") {
    re = kDate + "[Tt]" + kTime;
  } else if (format == "uuid") {
    re = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  } else if (format == "email") {
    re = R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*)"
         R"(@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+)";
  } else if (format == "ipv4") {
    std::string octet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]\d|\d))";
    re = octet + R"(\.)" + octet + R"(\.)" + octet + R"(\.)" + octet;
  } else {
    return nullptr;
  }
  return RegexToExpr("^" + re + "$", RegexFlavor::kJsonStringPattern);
}

}  // namespace llm::grammar
