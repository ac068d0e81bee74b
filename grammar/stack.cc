#include "grammar/stack.h"

#include <algorithm>

namespace llm::grammar {

namespace {
constexpr uint64_t kEmpty = UINT64_MAX;  // no real key: kDone's position is never interned
// The product's high half depends on every bit of the key (the position is its high half); folded
// onto the low bits, which the mask keeps.
inline size_t Slot(uint64_t key, size_t mask) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(h ^ (h >> 32)) & mask;
}
}  // namespace

StackArena::StackArena(const Grammar* g) : g_(g) {
  nodes_.push_back(Frame{UINT32_MAX, 0});  // kDone
  stamp_.push_back(0);
  keys_.assign(1024, kEmpty);
  values_.assign(1024, 0);
  InternState(State{});  // kDead
}

namespace {
constexpr uint32_t kUnknown = UINT32_MAX;
}

uint32_t StackArena::InternState(const State& s) {
  auto [it, inserted] = state_index_.try_emplace(s, static_cast<uint32_t>(states_.size()));
  if (inserted) {
    states_.push_back(s);
    done_.push_back(!s.empty() && s.front() == kDone);
    next_.resize(next_.size() + 256, kUnknown);
  }
  return it->second;
}

uint32_t StackArena::Step(uint32_t id, uint8_t byte) {
  uint32_t& slot = next_[size_t{id} * 256 + byte];
  if (slot != kUnknown) return slot;
  if (id == kDead) return slot = kDead;
  Advance(states_[id], byte, scratch_);
  uint32_t to = InternState(scratch_);
  next_[size_t{id} * 256 + byte] = to;  // `slot` may dangle: InternState grew next_
  return to;
}

void StackArena::Grow() {
  std::vector<uint64_t> keys(keys_.size() * 2, kEmpty);
  std::vector<uint32_t> values(keys.size(), 0);
  size_t mask = keys.size() - 1;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == kEmpty) continue;
    size_t s = Slot(keys_[i], mask);
    while (keys[s] != kEmpty) s = (s + 1) & mask;
    keys[s] = keys_[i];
    values[s] = values_[i];
  }
  keys_.swap(keys);
  values_.swap(values);
}

uint32_t StackArena::Node(uint32_t pos, uint32_t parent) {
  uint64_t key = (uint64_t{pos} << 32) | parent;
  size_t mask = keys_.size() - 1;
  for (size_t s = Slot(key, mask);; s = (s + 1) & mask) {
    if (keys_[s] == key) return values_[s];
    if (keys_[s] == kEmpty) {
      uint32_t id = static_cast<uint32_t>(nodes_.size());
      keys_[s] = key;
      values_[s] = id;
      nodes_.push_back(Frame{pos, parent});
      stamp_.push_back(0);
      if (++used_ * 2 > keys_.size()) Grow();
      return id;
    }
  }
}

bool StackArena::Visit(uint32_t node) {
  if (stamp_[node] == epoch_) return false;
  stamp_[node] = epoch_;
  return true;
}

void StackArena::Close(uint32_t start, State& out) {
  const auto& pos = g_->positions();
  work_.push_back(start);
  while (!work_.empty()) {
    uint32_t x = work_.back();
    work_.pop_back();
    if (!Visit(x)) continue;
    if (x == kDone) {
      out.push_back(x);
      continue;
    }
    Frame f = nodes_[x];
    const Position& p = pos[f.pos];
    switch (p.kind) {
      case Position::kByte:
        out.push_back(x);
        break;
      case Position::kByteStar:
        out.push_back(x);
        work_.push_back(Node(f.pos + 1, f.parent));
        break;
      case Position::kEnd:
        if (f.parent == kDone) {
          work_.push_back(kDone);
        } else {
          Frame up = nodes_[f.parent];
          work_.push_back(Node(up.pos + 1, up.parent));
        }
        break;
      case Position::kRef: {
        uint32_t caller = p.tail ? f.parent : x;
        for (uint32_t s : g_->RuleStarts(p.arg)) work_.push_back(Node(s, caller));
        break;
      }
    }
  }
}

State StackArena::Initial() {
  State out;
  ++epoch_;
  for (uint32_t s : g_->RuleStarts(g_->root())) Close(Node(s, kDone), out);
  std::sort(out.begin(), out.end());
  return out;
}

State StackArena::Isolated(uint32_t pos) {
  State out;
  ++epoch_;
  Close(Node(pos, kDone), out);
  std::sort(out.begin(), out.end());
  return out;
}

void StackArena::Advance(const State& in, uint8_t byte, State& out) {
  out.clear();
  ++epoch_;
  const auto& pos = g_->positions();
  const auto& sets = g_->sets();
  for (uint32_t x : in) {
    if (x == kDone) continue;
    Frame f = nodes_[x];
    const Position& p = pos[f.pos];
    if (!sets[p.arg].Has(byte)) continue;
    Close(p.kind == Position::kByte ? Node(f.pos + 1, f.parent) : x, out);
  }
  std::sort(out.begin(), out.end());
}

}  // namespace llm::grammar
