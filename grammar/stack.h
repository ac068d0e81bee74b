// The pushdown automaton's stacks. A stack frame is (position, parent frame); frames are interned,
// so a stack is one node id, equal stacks share one id, and an old state stays valid forever
// (rollback is just going back to an earlier set of ids). A state is the sorted set of stack tops
// after closure: every top waits on a byte (kByte/kByteStar) or is kDone (the root returned).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace llm::grammar {

using State = std::vector<uint32_t>;

class StackArena {
 public:
  static constexpr uint32_t kDone = 0;

  explicit StackArena(const Grammar* g);

  uint32_t Node(uint32_t pos, uint32_t parent);
  uint32_t PosOf(uint32_t node) const { return nodes_[node].pos; }
  uint32_t ParentOf(uint32_t node) const { return nodes_[node].parent; }
  size_t size() const { return nodes_.size(); }

  // The root rule's alternatives with nothing below them.
  State Initial();
  // One frame at `pos` whose return is reported as kDone: the context-free view of a stack top.
  State Isolated(uint32_t pos);
  // The state after consuming `byte`; empty when no stack accepts it.
  void Advance(const State& in, uint8_t byte, State& out);

  // States interned as ids, with their byte transitions memoized: a walk over the vocabulary
  // revisits the same states constantly (every character of a string body leads back to the
  // same state), so most steps are one table lookup. Id 0 is the dead (empty) state.
  static constexpr uint32_t kDead = 0;
  uint32_t InternState(const State& s);
  const State& StateOf(uint32_t id) const { return states_[id]; }
  size_t num_states() const { return states_.size(); }
  uint32_t Step(uint32_t id, uint8_t byte);
  // The root (or the isolated frame) has returned in this state.
  bool IsDone(uint32_t id) const { return done_[id]; }

 private:
  struct Frame {
    uint32_t pos, parent;
  };
  void Close(uint32_t node, State& out);
  bool Visit(uint32_t node);

  const Grammar* g_;
  std::vector<Frame> nodes_;
  // Open addressing (linear probing) from (pos, parent) to node id: interning is the hot path.
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> values_;
  size_t used_ = 0;
  void Grow();
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
  std::vector<uint32_t> work_;

  struct StateHash {
    size_t operator()(const State& s) const {
      uint64_t h = 1469598103934665603ull;
      for (uint32_t x : s) h = (h ^ x) * 1099511628211ull;
      return static_cast<size_t>(h);
    }
  };
  std::unordered_map<State, uint32_t, StateHash> state_index_;
  std::vector<State> states_;
  std::vector<char> done_;
  std::vector<uint32_t> next_;  // 256 per state; kUnknown until computed
  State scratch_;
};

}  // namespace llm::grammar
