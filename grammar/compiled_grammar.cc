#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <system_error>
#include <thread>

namespace llm::grammar {

std::shared_ptr<const CompiledGrammar> CompiledGrammar::Create(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab) {
  return Create(std::move(grammar), std::move(vocab), kPrecomputeTokenBudget);
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::Create(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab,
    uint64_t precompute_budget) {
  auto g = std::make_shared<CompiledGrammar>();
  g->grammar_ = std::move(grammar);
  g->vocab_ = vocab ? std::move(vocab) : Vocabulary::Create({}, {});
  const auto& pos = g->grammar_->positions();
  g->precomputed_.resize(pos.size());
  if (g->vocab_->sorted().empty() || precompute_budget == 0) return g;  // raw bytes only: no masks
  // Stack-top positions (those that consume a byte) in breadth-first order from the root's
  // starts: only reachable ones (a front end may define rules it never uses), nearest first, so
  // that a grammar past the budget has computed the ones a generation meets first.
  const Grammar& gr = *g->grammar_;
  std::vector<char> used(gr.num_rules(), 0);  // rules reachable from the root
  std::vector<uint32_t> todo{static_cast<uint32_t>(gr.root())};
  used[gr.root()] = 1;
  while (!todo.empty()) {
    uint32_t r = todo.back();
    todo.pop_back();
    for (uint32_t start : gr.RuleStarts(r)) {
      for (uint32_t p = start; pos[p].kind != Position::kEnd; ++p) {
        if (pos[p].kind == Position::kRef && !used[pos[p].arg]) {
          used[pos[p].arg] = 1;
          todo.push_back(pos[p].arg);
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> callers(gr.num_rules());  // reachable calls of each rule
  for (uint32_t p = 0; p < pos.size(); ++p)
    if (pos[p].kind == Position::kRef && used[gr.RuleOf(p)]) callers[pos[p].arg].push_back(p);
  std::vector<char> seen(pos.size(), 0);
  std::vector<uint32_t> order;
  auto visit = [&](uint32_t p) {
    if (!seen[p]) {
      seen[p] = 1;
      order.push_back(p);
    }
  };
  for (uint32_t start : gr.RuleStarts(gr.root())) visit(start);
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t p = order[i];
    switch (pos[p].kind) {
      case Position::kByte:
      case Position::kByteStar:
        visit(p + 1);
        break;
      case Position::kRef:
        for (uint32_t start : gr.RuleStarts(pos[p].arg)) visit(start);
        visit(p + 1);
        break;
      case Position::kEnd:
        for (uint32_t q : callers[gr.RuleOf(p)]) visit(q + 1);
        break;
    }
  }
  std::vector<uint32_t> tops;
  for (uint32_t p : order)
    if (pos[p].kind == Position::kByte || pos[p].kind == Position::kByteStar) tops.push_back(p);
  // Entries are independent: a few threads, each with its own builder, share the positions and
  // the budget. Neighbouring positions share automaton states, so each takes runs of them.
  constexpr size_t kRun = 16;
  const size_t threads =
      std::clamp<size_t>(std::min<size_t>(std::thread::hardware_concurrency(), kMaxCompileThreads),
                         1, (tops.size() + 4 * kRun - 1) / (4 * kRun));
  auto work = [&](size_t t) {
    TokenCacheBuilder builder(gr, *g->vocab_);
    for (size_t i = t * kRun; i < tops.size(); i += threads * kRun) {
      for (size_t j = i; j < std::min(tops.size(), i + kRun); ++j) {
        if (builder.tokens_walked() >= precompute_budget / threads) return;
        g->precomputed_[tops[j]] = builder.Build(tops[j]);
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work, t);
    } catch (const std::system_error&) {  // no thread to be had: this one does that share
      work(t);
    }
  }
  work(0);
  for (auto& th : pool) th.join();
  return g;
}

const TokenCacheEntry& CompiledGrammar::CacheFor(uint32_t pos) const {
  if (const TokenCacheEntry* e = precomputed_[pos].get()) return *e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lazy_.find(pos);
    if (it != lazy_.end()) return *it->second;
  }
  // Computed outside the lock: two threads may both compute an entry; the first one stored wins.
  auto entry = TokenCacheBuilder(*grammar_, *vocab_).Build(pos);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = lazy_.try_emplace(pos, std::move(entry));
  return *it->second;
}

size_t CompiledGrammar::cached_positions() const {
  size_t n = 0;
  for (const auto& e : precomputed_) n += e != nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return n + lazy_.size();
}

}  // namespace llm::grammar
