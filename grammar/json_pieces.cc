#include "grammar/json_pieces.h"

#include <cstdio>

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

ExprPtr NumberRange(std::optional<int64_t> lo, bool lo_exclusive, std::optional<int64_t> hi,
                    bool hi_exclusive) {
  // Integer values, written with or without a zero fraction.
  std::optional<int64_t> ilo = lo, ihi = hi;
  if (lo && lo_exclusive) ilo = *lo + 1;
  if (hi && hi_exclusive) ihi = *hi - 1;
  ExprPtr zeros = Optional(Seq({Lit("."), Repeat(Lit("0"), 1, kUnbounded)}));
  std::vector<ExprPtr> alts;
  if (!ilo || !ihi || *ilo <= *ihi) alts.push_back(Seq({IntegerRange(ilo, ihi), zeros}));
  // Non-integer values v: lo <= v <= hi exactly when lo <= floor(v) <= hi - 1 (for integer
  // bounds, exclusive or not). Positive v = I.F has floor I; negative v = -I.F has floor -I-1.
  ExprPtr frac =
      Seq({Lit("."), Star(Set(DigitSet())), Set(DigitSet('1', '9')), Star(Set(DigitSet()))});
  std::optional<int64_t> fhi;
  if (hi) fhi = *hi - 1;
  if (!fhi || *fhi >= 0) {
    int64_t a = lo ? std::max<int64_t>(*lo, 0) : 0;
    if (!fhi || a <= *fhi) alts.push_back(Seq({NonNegativeRange(a, fhi), frac}));
  }
  // Negative: I in [-hi, -lo - 1], I >= 0.
  if (!lo || *lo < 0) {
    int64_t a = hi ? std::max<int64_t>(0, -*hi) : 0;
    std::optional<int64_t> b;
    if (lo) b = -*lo - 1;
    if (!b || a <= *b) alts.push_back(Seq({Lit("-"), NonNegativeRange(a, b), frac}));
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
  CodepointRanges raw;
  raw.Add(0x20, 0x10FFFF);
  CodepointRanges excluded = except;
  excluded.Add('"');
  excluded.Add('\\');
  CodepointRanges keep;
  for (auto [lo, hi] : raw.ranges) keep.Add(lo, hi);
  // keep minus excluded
  CodepointRanges allowed;
  auto ex = excluded.Normalized();
  uint32_t next = 0x20;
  for (auto [lo, hi] : ex.ranges) {
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

std::string JsonQuote(const std::string& utf8) {
  std::string out = "\"";
  for (unsigned char c : utf8) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace llm::grammar
