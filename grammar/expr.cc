#include "grammar/expr.h"

#include <algorithm>

namespace llm::grammar {

namespace {
ExprPtr Make(Expr e) {
  return std::make_shared<const Expr>(std::move(e));
}
}  // namespace

ExprPtr Lit(std::string bytes) {
  return Make(Expr{.kind = Expr::kBytes, .bytes = std::move(bytes)});
}
ExprPtr Set(const ByteSet& set) {
  return Make(Expr{.kind = Expr::kSet, .set = set});
}
ExprPtr Seq(std::vector<ExprPtr> kids) {
  if (kids.size() == 1) return kids[0];
  return Make(Expr{.kind = Expr::kSeq, .kids = std::move(kids)});
}
ExprPtr Alt(std::vector<ExprPtr> kids) {
  // Nested alternations are spliced: a loop over them then stays one rule (see grammar.cc).
  bool nested = false;
  for (const auto& k : kids) nested |= k->kind == Expr::kAlt;
  if (nested) {
    std::vector<ExprPtr> flat;
    for (auto& k : kids) {
      if (k->kind == Expr::kAlt)
        flat.insert(flat.end(), k->kids.begin(), k->kids.end());
      else
        flat.push_back(std::move(k));
    }
    kids = std::move(flat);
  }
  if (kids.size() == 1) return kids[0];
  return Make(Expr{.kind = Expr::kAlt, .kids = std::move(kids)});
}
ExprPtr Ref(int rule) {
  return Make(Expr{.kind = Expr::kRef, .rule = rule});
}
ExprPtr Repeat(ExprPtr kid, int min, int max) {
  if (min == 1 && max == 1) return kid;
  return Make(Expr{.kind = Expr::kRepeat, .kids = {std::move(kid)}, .min = min, .max = max});
}

CodepointRanges CodepointRanges::Normalized() const {
  std::vector<std::pair<uint32_t, uint32_t>> in;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    // Surrogates have no UTF-8 encoding.
    if (lo < 0xD800 && hi >= 0xD800) {
      in.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) in.emplace_back(0xE000, hi);
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) in.emplace_back(0xE000, hi);
    } else {
      in.emplace_back(lo, hi);
    }
  }
  std::sort(in.begin(), in.end());
  CodepointRanges out;
  for (auto r : in) {
    if (!out.ranges.empty() && r.first <= out.ranges.back().second + 1) {
      out.ranges.back().second = std::max(out.ranges.back().second, r.second);
    } else {
      out.ranges.push_back(r);
    }
  }
  return out;
}

CodepointRanges CodepointRanges::Complement() const {
  CodepointRanges n = Normalized(), out;
  uint32_t next = 0;
  for (auto [lo, hi] : n.ranges) {
    if (lo > next) out.Add(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.Add(next, 0x10FFFF);
  return out.Normalized();
}

bool CodepointRanges::Contains(uint32_t c) const {
  for (auto [lo, hi] : ranges)
    if (c >= lo && c <= hi) return true;
  return false;
}

std::string EncodeUtf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

namespace {

// Splits [lo, hi] (all of one encoded length) until every byte position ranges independently,
// then emits one byte-set sequence per piece.
void EmitSameLength(uint32_t lo, uint32_t hi, int len, std::vector<ExprPtr>& out) {
  for (int i = 1; i < len; ++i) {
    uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        EmitSameLength(lo, lo | m, len, out);
        EmitSameLength((lo | m) + 1, hi, len, out);
        return;
      }
      if ((hi & m) != m) {
        EmitSameLength(lo, (hi & ~m) - 1, len, out);
        EmitSameLength(hi & ~m, hi, len, out);
        return;
      }
    }
  }
  std::string a = EncodeUtf8(lo), b = EncodeUtf8(hi);
  std::vector<ExprPtr> seq;
  for (size_t k = 0; k < a.size(); ++k) {
    ByteSet s;
    s.AddRange(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
    seq.push_back(Set(s));
  }
  out.push_back(Seq(std::move(seq)));
}

}  // namespace

ExprPtr Utf8(const CodepointRanges& set) {
  static constexpr uint32_t kLimits[4][2] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
  std::vector<ExprPtr> alts;
  ByteSet ascii;
  bool any_ascii = false;
  for (auto [lo, hi] : set.Normalized().ranges) {
    for (int len = 1; len <= 4; ++len) {
      uint32_t a = std::max(lo, kLimits[len - 1][0]), b = std::min(hi, kLimits[len - 1][1]);
      if (a > b) continue;
      if (len == 1) {
        ascii.AddRange(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
        any_ascii = true;
      } else {
        EmitSameLength(a, b, len, alts);
      }
    }
  }
  // One set for all of ASCII keeps the common case a single automaton position.
  if (any_ascii) alts.insert(alts.begin(), Set(ascii));
  return Alt(std::move(alts));
}

int GrammarBuilder::AddRule(const std::string& name) {
  std::string unique = name;
  for (int k = 1; std::find(names_.begin(), names_.end(), unique) != names_.end(); ++k)
    unique = name + "_" + std::to_string(k);
  names_.push_back(unique);
  bodies_.push_back(nullptr);
  return size() - 1;
}

int GrammarBuilder::FindOrAddRule(const std::string& name) {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it != names_.end()) return static_cast<int>(it - names_.begin());
  return AddRule(name);
}

void GrammarBuilder::Define(int rule, ExprPtr body) {
  bodies_[rule] = std::move(body);
}

}  // namespace llm::grammar
