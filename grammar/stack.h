// The pushdown automaton's stacks. A stack frame is (position, parent frame); frames are interned,
// so a stack is one node id, equal stacks share one id, and an old state stays valid forever
// (rollback is just going back to an earlier set of ids). A state is the sorted set of stack tops
// after closure: every top waits on a byte (kByte/kByteStar) or is kDone (the root returned).
#pragma once

#include <cstdint>
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
  size_t size() const { return nodes_.size(); }

  // The root rule's alternatives with nothing below them.
  State Initial();
  // One frame at `pos` whose return is reported as kDone: the context-free view of a stack top.
  State Isolated(uint32_t pos);
  // The state after consuming `byte`; empty when no stack accepts it.
  void Advance(const State& in, uint8_t byte, State& out);

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
};

}  // namespace llm::grammar
