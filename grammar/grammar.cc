#include "grammar/grammar.h"

#include <functional>
#include <map>
#include <tuple>

namespace llm::grammar {

namespace {
constexpr size_t kMaxPositions = 4'000'000;

std::vector<ExprPtr> TopAlternatives(const ExprPtr& e) {
  if (e->kind == Expr::kAlt) return e->kids;
  return {e};
}
}  // namespace

// Lowers expression trees to positions, adding helper rules for nested alternations and
// repetitions. Repetition helpers splice the repeated alternatives into the loop rule itself, so a
// loop like a JSON string body stays inside one rule frame (which keeps the token cache useful).
class Lowerer {
 public:
  explicit Lowerer(const GrammarBuilder& b) {
    for (int r = 0; r < b.size(); ++r) {
      names_.push_back(b.Name(r));
      bodies_.push_back(b.Body(r));
    }
  }

  std::shared_ptr<Grammar> Run(int root) {
    g_ = std::make_shared<Grammar>();
    g_->root_ = root;
    for (size_t r = 0; r < bodies_.size(); ++r) {
      if (!bodies_[r]) throw CompileError{"rule '" + names_[r] + "' is used but never defined"};
    }
    for (size_t r = 0; r < bodies_.size(); ++r) LowerRule(static_cast<int>(r));
    g_->rule_names_ = names_;
    for (size_t i = 0; i + 1 < g_->positions_.size(); ++i) {
      auto& p = g_->positions_[i];
      if (p.kind == Position::kRef) p.tail = g_->positions_[i + 1].kind == Position::kEnd;
    }
    CheckLeftRecursion();
    return g_;
  }

 private:
  int Helper(const std::string& base, ExprPtr body) {
    names_.push_back(base);
    bodies_.push_back(std::move(body));
    return static_cast<int>(names_.size() - 1);
  }

  uint32_t SetIndex(const ByteSet& s) {
    auto key = std::make_tuple(s.bits[0], s.bits[1], s.bits[2], s.bits[3]);
    auto it = set_index_.find(key);
    if (it != set_index_.end()) return it->second;
    g_->sets_.push_back(s);
    return set_index_[key] = static_cast<uint32_t>(g_->sets_.size() - 1);
  }

  void LowerRule(int r) {
    if (static_cast<int>(g_->rule_starts_.size()) <= r) g_->rule_starts_.resize(r + 1);
    for (const ExprPtr& alt : TopAlternatives(bodies_[r])) {
      std::vector<Position> elems;
      LowerSeq(alt, r, elems);
      g_->rule_starts_[r].push_back(static_cast<uint32_t>(g_->positions_.size()));
      elems.push_back(Position{Position::kEnd});
      for (auto& p : elems) {
        g_->positions_.push_back(p);
        g_->rule_of_.push_back(static_cast<uint32_t>(r));
      }
      if (g_->positions_.size() > kMaxPositions)
        throw CompileError{"grammar too large (over " + std::to_string(kMaxPositions) +
                           " positions)"};
    }
  }

  void LowerSeq(const ExprPtr& e, int r, std::vector<Position>& out) {
    switch (e->kind) {
      case Expr::kBytes:
        for (unsigned char c : e->bytes) {
          ByteSet s;
          s.Add(c);
          out.push_back(Position{Position::kByte, false, SetIndex(s)});
        }
        return;
      case Expr::kSet:
        out.push_back(Position{Position::kByte, false, SetIndex(e->set)});
        return;
      case Expr::kSeq:
        for (const auto& k : e->kids) LowerSeq(k, r, out);
        return;
      case Expr::kAlt: {
        auto key = std::make_pair(e.get(), -1);
        auto it = helpers_.find(key);
        int h = it != helpers_.end() ? it->second : (helpers_[key] = Helper(names_[r] + "_alt", e));
        out.push_back(Position{Position::kRef, false, static_cast<uint32_t>(h)});
        return;
      }
      case Expr::kRef:
        if (e->rule < 0 || e->rule >= static_cast<int>(bodies_.size()))
          throw CompileError{"reference to an unknown rule"};
        out.push_back(Position{Position::kRef, false, static_cast<uint32_t>(e->rule)});
        return;
      case Expr::kRepeat: {
        const ExprPtr& x = e->kids[0];
        for (int i = 0; i < e->min; ++i) LowerSeq(x, r, out);
        if (e->max == kUnbounded) {
          if (x->kind == Expr::kSet) {
            out.push_back(Position{Position::kByteStar, false, SetIndex(x->set)});
            return;
          }
          out.push_back(Position{Position::kRef, false, static_cast<uint32_t>(Loop(x, r))});
          return;
        }
        if (e->max < e->min) throw CompileError{"repetition with max below min"};
        if (e->max > e->min) {
          out.push_back(Position{Position::kRef, false,
                                 static_cast<uint32_t>(Optionals(x, e->max - e->min, r))});
        }
        return;
      }
    }
  }

  // loop ::= alt_1 loop | ... | alt_n loop | ""
  int Loop(const ExprPtr& x, int r) {
    auto key = std::make_pair(x.get(), 0);
    if (auto it = helpers_.find(key); it != helpers_.end()) return it->second;
    int h = Helper(names_[r] + "_star", nullptr);
    helpers_[key] = h;
    std::vector<ExprPtr> alts;
    for (const auto& a : TopAlternatives(x)) alts.push_back(Seq({a, Ref(h)}));
    alts.push_back(Empty());
    bodies_[h] = Alt(std::move(alts));
    return h;
  }

  // opt_k ::= alt_1 opt_(k-1) | ... | "": up to k more copies of x.
  int Optionals(const ExprPtr& x, int k, int r) {
    auto key = std::make_pair(x.get(), k);
    if (auto it = helpers_.find(key); it != helpers_.end()) return it->second;
    int inner = k > 1 ? Optionals(x, k - 1, r) : -1;
    std::vector<ExprPtr> alts;
    for (const auto& a : TopAlternatives(x)) alts.push_back(inner >= 0 ? Seq({a, Ref(inner)}) : a);
    alts.push_back(Empty());
    int h = Helper(names_[r] + "_opt", Alt(std::move(alts)));
    helpers_[key] = h;
    return h;
  }

  // A rule that can reach itself at its left edge through a non-tail call would make the stack
  // grow without consuming input; tail calls reuse the caller's frame and are safe.
  void CheckLeftRecursion() {
    const auto& pos = g_->positions_;
    size_t n = names_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t p : g_->rule_starts_[r]) {
          bool all = true;
          for (uint32_t i = p; pos[i].kind != Position::kEnd && all; ++i) {
            all = pos[i].kind == Position::kByteStar ||
                  (pos[i].kind == Position::kRef && nullable[pos[i].arg]);
          }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // Left edges: rule -> (callee, is_tail).
    std::vector<std::vector<std::pair<uint32_t, bool>>> edges(n);
    for (size_t r = 0; r < n; ++r) {
      for (uint32_t p : g_->rule_starts_[r]) {
        for (uint32_t i = p; pos[i].kind != Position::kEnd; ++i) {
          if (pos[i].kind == Position::kByte) break;
          if (pos[i].kind == Position::kRef) {
            edges[r].emplace_back(pos[i].arg, pos[i].tail);
            if (!nullable[pos[i].arg]) break;
          }
        }
      }
    }
    // reach[s] from each rule r: is r reachable back with a non-tail edge on the way?
    for (size_t r = 0; r < n; ++r) {
      std::vector<int> seen(n, 0);  // bit 1: reached by tail-only path, bit 2: with a non-tail edge
      std::vector<std::pair<uint32_t, int>> stack;
      for (auto [c, t] : edges[r]) stack.emplace_back(c, t ? 1 : 2);
      while (!stack.empty()) {
        auto [s, how] = stack.back();
        stack.pop_back();
        if (seen[s] & how) continue;
        seen[s] |= how;
        if (s == r && how == 2) throw CompileError{"rule '" + names_[r] + "' is left-recursive"};
        for (auto [c, t] : edges[s]) stack.emplace_back(c, t ? how : 2);
      }
    }
  }

  std::shared_ptr<Grammar> g_;
  std::vector<std::string> names_;
  std::vector<ExprPtr> bodies_;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>, uint32_t> set_index_;
  std::map<std::pair<const Expr*, int>, int> helpers_;
};

Result<std::shared_ptr<const Grammar>> Grammar::Build(const GrammarBuilder& builder, int root,
                                                      bool special_tokens) {
  try {
    if (root < 0 || root >= builder.size()) throw CompileError{"no root rule"};
    std::shared_ptr<Grammar> g = Lowerer(builder).Run(root);
    g->special_tokens_ = special_tokens;
    return std::shared_ptr<const Grammar>(std::move(g));
  } catch (const CompileError& e) {
    return Result<std::shared_ptr<const Grammar>>::Error(e.message);
  }
}

namespace {
std::string SetToString(const ByteSet& s) {
  std::string out = "[";
  for (int b = 0; b < 256; ++b) {
    if (!s.Has(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && s.Has(static_cast<uint8_t>(e + 1))) ++e;
    auto hex = [](int v) {
      const char* d = "0123456789abcdef";
      return std::string("\\x") + d[v >> 4] + d[v & 15];
    };
    out += hex(b);
    if (e > b) out += "-" + hex(e);
    b = e;
  }
  return out + "]";
}
}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (size_t r = 0; r < rule_starts_.size(); ++r) {
    for (uint32_t p : rule_starts_[r]) {
      out += rule_names_[r] + " ::=";
      for (uint32_t i = p; positions_[i].kind != Position::kEnd; ++i) {
        const auto& q = positions_[i];
        if (q.kind == Position::kRef)
          out += " " + rule_names_[q.arg];
        else
          out += " " + SetToString(sets_[q.arg]) + (q.kind == Position::kByteStar ? "*" : "");
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace llm::grammar
