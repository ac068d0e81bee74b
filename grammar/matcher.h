// One request's position in a grammar. Every accepted token pushes a state (a set of interned
// stacks), so Rollback(k) just drops the last k; nothing is recomputed.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/stack.h"

namespace llm::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Writes vocab().mask_words() words: bit (id & 31) of word (id >> 5) set when token id may come
  // next. EOS ids are set only where the grammar is complete; nothing is set once terminated.
  void FillNextTokenBitmask(uint32_t* mask);
  // Advances by a token; false (and no change) when the grammar does not allow it.
  bool AcceptToken(int32_t id);
  // Advances by raw bytes as one step (tests, forced prefixes); false and no change if refused.
  bool AcceptString(std::string_view bytes);
  // Undoes the last k accepted steps (tokens or strings); k larger than the history resets.
  void Rollback(int k);
  void Reset() { Rollback(num_steps()); }

  bool IsTerminated() const { return history_.back().terminated; }
  // The grammar's root is complete here, so EOS is allowed.
  bool CanTerminate() const;
  int num_steps() const { return static_cast<int>(history_.size()) - 1; }
  const CompiledGrammar& compiled() const { return *grammar_; }
  // Masks filled, and how many of them were copies of a recent state's mask.
  struct Stats {
    uint64_t masks = 0, memo_hits = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Step {
    uint32_t state;  // an interned state id of arena_
    bool terminated = false;
  };
  std::shared_ptr<const CompiledGrammar> grammar_;
  StackArena arena_;
  std::vector<Step> history_;
  // Masks of recently seen states: loops (string bodies, digits, whitespace) revisit the same
  // interned stacks, so their masks are copies. Bounded; cleared when full.
  std::unordered_map<uint32_t, std::vector<uint32_t>> memo_;
  std::vector<int32_t> walk_;  // scratch: uncertain tokens a fill walks
  Stats stats_;
};

}  // namespace llm::grammar
