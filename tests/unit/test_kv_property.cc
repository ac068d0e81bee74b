// Randomized property test of allocator + prefix cache + scheduler, driven like the engine:
// random arrivals (many sharing prefixes), steps, token appends, aborts and finishes over a small
// pool that forces preemption. Invariants: a block is never written while shared; cached content
// served to a sequence equals its tokens; refcounts equal table membership; nothing leaks.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "scheduler/scheduler.h"

namespace llm {
namespace {

struct Shadow {
  // What each cache slot holds: the token id whose K/V was written there (-1 = never written).
  std::vector<int32_t> slot_token;
};

void CheckRefcounts(const Scheduler& s, const std::map<int64_t, Sequence*>& live, int num_blocks) {
  std::vector<int> expected(num_blocks, 0);
  for (const auto& [id, seq] : live) {
    std::set<int32_t> own(seq->block_table.begin(), seq->block_table.end());
    REQUIRE(own.size() == seq->block_table.size());  // no block twice in one table
    for (int32_t b : seq->block_table) expected[b]++;
  }
  int used = 0;
  for (int b = 0; b < num_blocks; ++b) {
    REQUIRE(s.allocator().ref_count(b) == expected[b]);
    used += expected[b] > 0;
  }
  REQUIRE(s.allocator().num_used() == used);
}

void RunProperty(uint64_t seed, bool prefix_caching, int total_ops) {
  constexpr int kBlockSize = 4;
  constexpr int kNumBlocks = 28;
  SchedulerConfig cfg;
  cfg.block_size = kBlockSize;
  cfg.max_num_seqs = 6;
  cfg.max_batched_tokens = 24;
  cfg.enable_prefix_caching = prefix_caching;
  Scheduler sched(cfg, kNumBlocks);
  std::mt19937_64 rng(seed);
  Shadow shadow{std::vector<int32_t>(kNumBlocks * kBlockSize, -1)};
  std::map<int64_t, Sequence*> live;
  std::map<int64_t, int> max_len;
  // A few shared prefixes make prefix-cache hits frequent.
  std::vector<std::vector<int32_t>> prefixes(4);
  for (auto& p : prefixes) {
    p.resize(8 + rng() % 9);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 50);
  }
  int64_t next_id = 1;
  int64_t hits_checked = 0, preemptions = 0;

  for (int op = 0; op < total_ops; ++op) {
    const int r = static_cast<int>(rng() % 100);
    if (r < 20 && live.size() < 12) {
      auto seq = std::make_unique<Sequence>();
      seq->id = next_id++;
      seq->arrival = seq->id;
      seq->priority = static_cast<int>(rng() % 2);
      seq->prompt_ids = prefixes[rng() % prefixes.size()];
      const int extra = static_cast<int>(rng() % 10);
      for (int i = 0; i < extra; ++i) seq->prompt_ids.push_back(static_cast<int32_t>(rng() % 50));
      max_len[seq->id] =
          static_cast<int>(seq->prompt_ids.size()) + 1 + static_cast<int>(rng() % 20);
      live[seq->id] = seq.get();
      sched.Add(std::move(seq));
    } else if (r < 25 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const int64_t id = it->first;
      REQUIRE(sched.Remove(id) != nullptr);  // abort, waiting or running
      live.erase(id);
    } else {
      // Record which sequences hold cached blocks on admission, before the step writes.
      std::map<int64_t, int> computed_before;
      for (const auto& [id, seq] : live) computed_before[id] = seq->num_computed_tokens;
      SchedulerOutput out = sched.Schedule();
      preemptions += static_cast<int64_t>(out.preempted.size());
      REQUIRE(out.num_tokens <= cfg.max_batched_tokens);
      REQUIRE(static_cast<int>(out.seqs.size()) <= cfg.max_num_seqs);
      for (const ScheduledSeq& s : out.seqs) {
        Sequence& seq = *s.seq;
        // Tokens served from the cache: slots must hold exactly this sequence's tokens.
        for (int i = 0; i < s.start; ++i) {
          const int32_t b = seq.block_table[i / kBlockSize];
          REQUIRE(shadow.slot_token[b * kBlockSize + i % kBlockSize] == seq.token_at(i));
          ++hits_checked;
        }
        // Writes go only to blocks this sequence owns alone.
        for (int i = s.start; i < s.start + s.num_tokens; ++i) {
          const int32_t b = seq.block_table[i / kBlockSize];
          REQUIRE(sched.allocator().ref_count(b) == 1);
          shadow.slot_token[b * kBlockSize + i % kBlockSize] = seq.token_at(i);
        }
      }
      sched.OnStepDone(out);
      for (const ScheduledSeq& s : out.seqs) {
        if (!s.samples) continue;
        Sequence& seq = *s.seq;
        seq.output_ids.push_back(static_cast<int32_t>(rng() % 50));
        if (seq.num_tokens() >= max_len[seq.id]) {
          const int64_t id = seq.id;
          REQUIRE(sched.Remove(id) != nullptr);
          live.erase(id);
        }
      }
    }
    if (op % 97 == 0) CheckRefcounts(sched, live, kNumBlocks);
  }
  CheckRefcounts(sched, live, kNumBlocks);
  for (const auto& [id, seq] : std::map<int64_t, Sequence*>(live)) {
    REQUIRE(sched.Remove(id) != nullptr);
  }
  live.clear();
  CHECK(sched.allocator().num_free() == kNumBlocks);
  CHECK(sched.num_running() == 0);
  CHECK(sched.num_waiting() == 0);
  CHECK(preemptions > 0);  // the pool is small enough that preemption paths ran
  if (prefix_caching) {
    CHECK(sched.prefix_cache()->stats().hits > 0);
    CHECK(hits_checked > 0);
  }
}

TEST_CASE("allocator + prefix cache + scheduler keep their invariants over 100k random ops",
          "[property]") {
  RunProperty(/*seed=*/1, /*prefix_caching=*/true, 100000);
  RunProperty(/*seed=*/2, /*prefix_caching=*/false, 20000);
}

}  // namespace
}  // namespace llm
