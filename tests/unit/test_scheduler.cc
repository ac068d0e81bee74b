// Tests for the continuous-batching scheduler, driven by a fake engine loop: Schedule(), then
// OnStepDone(), then one fake token for every sequence whose step samples.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "scheduler/scheduler.h"
#include "tests/unit/scheduler_test_util.h"

namespace llm {
namespace {

using scheduler_test::Config;
using scheduler_test::FindIn;
using scheduler_test::MakeSeq;
using scheduler_test::Step;
using scheduler_test::TotalTableBlocks;

TEST_CASE("Scheduler respects the token budget every step", "[scheduler]") {
  const SchedulerConfig cfg = Config(16, 16, 64);
  Scheduler sched(cfg, 256);
  for (int i = 0; i < 6; ++i) sched.Add(MakeSeq(i, 50));

  int steps_at_full_budget = 0;
  for (int step = 0; step < 40; ++step) {
    std::map<int64_t, int> computed_before;
    for (int i = 0; i < 6; ++i) computed_before[i] = sched.Find(i)->num_computed_tokens;
    SchedulerOutput out = sched.Schedule();
    int sum = 0;
    for (const ScheduledSeq& s : out.seqs) {
      CHECK(s.num_tokens > 0);
      CHECK(s.start == computed_before[s.seq->id]);
      CHECK(s.samples == (s.start + s.num_tokens == s.seq->num_tokens()));
      sum += s.num_tokens;
    }
    CHECK(sum <= cfg.max_batched_tokens);
    CHECK(out.num_tokens == sum);
    if (sum == cfg.max_batched_tokens) ++steps_at_full_budget;
    sched.OnStepDone(out);
    for (const ScheduledSeq& s : out.seqs) {
      if (s.samples) s.seq->output_ids.push_back(1);
    }
  }
  // 300 prompt tokens with a 64-token budget: the first steps are full.
  CHECK(steps_at_full_budget >= 4);
  for (int i = 0; i < 6; ++i) CHECK_FALSE(sched.Find(i)->output_ids.empty());
}

TEST_CASE("Scheduler chunks a long prefill and samples only on the last chunk", "[scheduler]") {
  const SchedulerConfig cfg = Config(16, 64, 32);
  Scheduler sched(cfg, 64);
  sched.Add(MakeSeq(1, 100));

  const int expected_start[] = {0, 32, 64, 96};
  const int expected_n[] = {32, 32, 32, 4};
  for (int step = 0; step < 4; ++step) {
    SchedulerOutput out = Step(sched);
    REQUIRE(out.seqs.size() == 1);
    CHECK(out.seqs[0].seq->id == 1);
    CHECK(out.seqs[0].start == expected_start[step]);
    CHECK(out.seqs[0].num_tokens == expected_n[step]);
    CHECK(out.seqs[0].samples == (step == 3));
    CHECK(out.num_tokens == expected_n[step]);
    // Blocks cover every computed token.
    Sequence* s = sched.Find(1);
    CHECK(static_cast<int>(s->block_table.size()) >=
          BlocksForTokens(s->num_computed_tokens, cfg.block_size));
  }
  Sequence* s = sched.Find(1);
  CHECK(s->num_computed_tokens == 100);
  CHECK(s->output_ids.size() == 1);
  CHECK(s->block_table.size() == 7);

  // Then it decodes one token per step.
  SchedulerOutput out = Step(sched);
  REQUIRE(out.seqs.size() == 1);
  CHECK(out.seqs[0].start == 100);
  CHECK(out.seqs[0].num_tokens == 1);
  CHECK(out.seqs[0].samples);
}

TEST_CASE("Scheduler never starves a running decode during another prefill", "[scheduler]") {
  const SchedulerConfig cfg = Config(16, 64, 32);
  Scheduler sched(cfg, 64);
  sched.Add(MakeSeq(1, 10));
  {
    SchedulerOutput out = Step(sched);
    REQUIRE(out.seqs.size() == 1);
    CHECK(out.seqs[0].samples);
  }
  sched.Add(MakeSeq(2, 100));

  int prefill_tokens = 0;
  int steps = 0;
  bool long_done = false;
  while (!long_done) {
    REQUIRE(steps < 10);
    SchedulerOutput out = Step(sched);
    ++steps;
    const ScheduledSeq* decode = FindIn(out, 1);
    REQUIRE(decode != nullptr);
    CHECK(decode->num_tokens == 1);
    CHECK(decode->samples);
    const ScheduledSeq* prefill = FindIn(out, 2);
    REQUIRE(prefill != nullptr);
    CHECK(out.num_tokens <= cfg.max_batched_tokens);
    prefill_tokens += prefill->num_tokens;
    long_done = prefill->samples;
    CHECK(prefill->samples == (prefill_tokens == 100));
  }
  // 100 tokens at 31 per step (one token goes to the decode): 31 + 31 + 31 + 7.
  CHECK(steps == 4);
  CHECK(sched.Find(1)->output_ids.size() == 5);
  CHECK(sched.Find(2)->output_ids.size() == 1);
}

// Overlapped steps leave the newest output a placeholder (< 0) until the token arrives. A
// sequence whose placeholder is its last allowed token computes nothing more; one with room left
// decodes the placeholder position like any token.
TEST_CASE("Scheduler skips a sequence whose pending token is its last one", "[scheduler]") {
  Scheduler sched(Config(16, 8, 64), 64);
  sched.Add(MakeSeq(1, 5, 0, -1, /*max_new=*/2));
  sched.Add(MakeSeq(2, 5, 0, -1, /*max_new=*/3));
  SchedulerOutput out = sched.Schedule();  // both prefills, both sample
  REQUIRE(out.seqs.size() == 2);
  sched.OnStepDone(out);
  for (const ScheduledSeq& s : out.seqs) s.seq->output_ids.push_back(-1);  // in flight
  out = sched.Schedule();  // both decode their pending position
  REQUIRE(out.seqs.size() == 2);
  sched.OnStepDone(out);
  // The first tokens arrive; the second ones are in flight: sequence 1 has reached prompt + 2.
  for (int64_t id : {1, 2}) {
    Sequence* seq = sched.Find(id);
    seq->output_ids.back() = 7;
    seq->output_ids.push_back(-1);
  }
  REQUIRE(sched.Find(1)->num_tokens() == sched.Find(1)->max_total_tokens);
  out = sched.Schedule();
  CHECK(FindIn(out, 1) == nullptr);  // its pending token ends it: nothing to compute
  REQUIRE(FindIn(out, 2) != nullptr);
  CHECK(FindIn(out, 2)->num_tokens == 1);
  // Without a placeholder, a sequence at its limit would still be scheduled (the engine finishes
  // it first when steps do not overlap).
  sched.Find(1)->output_ids.back() = 7;
  sched.OnStepDone(out);
  out = sched.Schedule();
  CHECK(FindIn(out, 1) != nullptr);
}

TEST_CASE("Scheduler respects max_num_seqs", "[scheduler]") {
  const SchedulerConfig cfg = Config(16, 2, 256);
  Scheduler sched(cfg, 64);
  for (int i = 0; i < 5; ++i) sched.Add(MakeSeq(i, 5));

  for (int step = 0; step < 5; ++step) {
    SchedulerOutput out = Step(sched);
    CHECK(out.seqs.size() == 2);
    CHECK(sched.num_running() == 2);
    CHECK(sched.num_waiting() == 3);
    CHECK(FindIn(out, 0) != nullptr);
    CHECK(FindIn(out, 1) != nullptr);
  }
  CHECK(sched.Find(2)->state == SequenceState::kWaiting);

  // Freeing a slot admits the next in FCFS order.
  sched.Remove(0);
  SchedulerOutput out = Step(sched);
  CHECK(out.seqs.size() == 2);
  CHECK(FindIn(out, 1) != nullptr);
  CHECK(FindIn(out, 2) != nullptr);
  CHECK(sched.num_running() == 2);
  CHECK(sched.num_waiting() == 2);
}

TEST_CASE("Scheduler admits FCFS by (priority, arrival)", "[scheduler]") {
  const SchedulerConfig cfg = Config(16, 1, 256);
  Scheduler sched(cfg, 64);
  // id, priority, arrival; added out of order.
  sched.Add(MakeSeq(10, 4, /*priority=*/1, /*arrival=*/1));
  sched.Add(MakeSeq(11, 4, /*priority=*/0, /*arrival=*/5));
  sched.Add(MakeSeq(12, 4, /*priority=*/2, /*arrival=*/0));
  sched.Add(MakeSeq(13, 4, /*priority=*/0, /*arrival=*/2));
  sched.Add(MakeSeq(14, 4, /*priority=*/1, /*arrival=*/0));
  sched.Add(MakeSeq(15, 4, /*priority=*/0, /*arrival=*/3));

  std::vector<int64_t> order;
  for (int i = 0; i < 6; ++i) {
    SchedulerOutput out = Step(sched);
    REQUIRE(out.seqs.size() == 1);
    order.push_back(out.seqs[0].seq->id);
    sched.Remove(out.seqs[0].seq->id);
  }
  CHECK(order == std::vector<int64_t>{13, 15, 11, 14, 10, 12});
  CHECK(sched.num_waiting() == 0);
  CHECK(sched.num_running() == 0);
}

TEST_CASE("Scheduler does not let a later waiting sequence overtake a blocked one", "[scheduler]") {
  const SchedulerConfig cfg = Config(4, 8, 256);
  Scheduler sched(cfg, 4);
  sched.Add(MakeSeq(1, 12));  // 3 blocks
  Step(sched);
  sched.Add(MakeSeq(2, 8));  // needs 2 blocks, only 1 free
  sched.Add(MakeSeq(3, 2));  // would fit in 1 block, but must not overtake
  SchedulerOutput out = Step(sched);
  CHECK(FindIn(out, 1) != nullptr);
  CHECK(FindIn(out, 2) == nullptr);
  CHECK(FindIn(out, 3) == nullptr);
  CHECK(sched.num_waiting() == 2);
}

TEST_CASE("Scheduler preempts the newest running sequence when blocks run out", "[scheduler]") {
  const SchedulerConfig cfg = Config(4, 2, 256);
  Scheduler sched(cfg, 4);
  sched.Add(MakeSeq(1, 6));  // A
  sched.Add(MakeSeq(2, 6));  // B
  sched.Add(MakeSeq(3, 3));  // C: waits for a slot (max_num_seqs = 2)

  // Steps 1-3: A and B run; each ends with 2 blocks (up to 8 tokens).
  for (int step = 0; step < 3; ++step) {
    SchedulerOutput out = Step(sched);
    CHECK(out.preempted.empty());
    CHECK(out.seqs.size() == 2);
  }
  Sequence* a = sched.Find(1);
  Sequence* b = sched.Find(2);
  CHECK(a->num_tokens() == 9);
  CHECK(b->num_tokens() == 9);
  CHECK(sched.allocator().num_free() == 0);
  CHECK(b->num_computed_tokens == 8);

  // Step 4: A needs a third block; B (newest) is preempted by recompute.
  SchedulerOutput out = Step(sched);
  REQUIRE(out.preempted == std::vector<int64_t>{2});
  REQUIRE(out.seqs.size() == 1);
  CHECK(out.seqs[0].seq == a);
  CHECK(FindIn(out, 2) == nullptr);
  CHECK(b->state == SequenceState::kWaiting);
  CHECK(b->num_computed_tokens == 0);
  CHECK(b->block_table.empty());
  CHECK(b->num_preemptions == 1);
  CHECK(b->output_ids.size() == 3);  // generated tokens are kept for the recompute
  CHECK(a->block_table.size() == 3);
  CHECK(sched.allocator().num_used() == 3);
  CHECK(sched.num_running() == 1);
  CHECK(sched.num_waiting() == 2);
  // A step that preempted admits nothing (C and B stay waiting although a slot is free).
  CHECK(FindIn(out, 3) == nullptr);

  // While A keeps growing inside its blocks, B cannot come back (its 9 tokens need 3 blocks).
  // Finish A: B then resumes ahead of C, recomputing prompt + output as one prefill.
  sched.Remove(1);
  CHECK(sched.allocator().num_free() == 4);
  out = Step(sched);
  REQUIRE(out.seqs.size() == 2);
  CHECK(out.seqs[0].seq->id == 2);  // front of waiting
  CHECK(out.seqs[0].start == 0);
  CHECK(out.seqs[0].num_tokens == 9);
  CHECK(out.seqs[0].samples);
  CHECK(out.seqs[1].seq->id == 3);
  CHECK(b->state == SequenceState::kRunning);
  CHECK(b->num_computed_tokens == 9);
  CHECK(b->output_ids.size() == 4);
  CHECK(b->block_table.size() == 3);
  CHECK(sched.allocator().num_used() == TotalTableBlocks(sched, {1, 2, 3}));
}

TEST_CASE("Scheduler preempts the sequence being scheduled when it is the newest", "[scheduler]") {
  const SchedulerConfig cfg = Config(4, 64, 256);
  Scheduler sched(cfg, 2);
  sched.Add(MakeSeq(1, 8));  // exactly 2 blocks
  SchedulerOutput out = Step(sched);
  REQUIRE(out.seqs.size() == 1);
  CHECK(sched.allocator().num_free() == 0);

  // 9 tokens need 3 blocks: the only running sequence preempts itself.
  out = Step(sched);
  CHECK(out.preempted == std::vector<int64_t>{1});
  CHECK(out.seqs.empty());
  CHECK(out.num_tokens == 0);
  Sequence* s = sched.Find(1);
  CHECK(s->state == SequenceState::kWaiting);
  CHECK(s->block_table.empty());
  CHECK(sched.allocator().num_free() == 2);
  CHECK(sched.num_running() == 0);
  CHECK(sched.num_waiting() == 1);

  // It can never fit again, so it waits without taking blocks.
  out = Step(sched);
  CHECK(out.seqs.empty());
  CHECK(sched.allocator().num_free() == 2);
  CHECK(sched.Remove(1) != nullptr);
}

TEST_CASE("Scheduler Remove frees the blocks of waiting and running sequences", "[scheduler]") {
  const SchedulerConfig cfg = Config(4, 3, 16);
  Scheduler sched(cfg, 32);
  sched.Add(MakeSeq(1, 5));
  sched.Add(MakeSeq(3, 6, 0, /*arrival=*/2));
  sched.Add(MakeSeq(2, 60, 0, /*arrival=*/3));  // still mid-prefill after two steps
  sched.Add(MakeSeq(4, 6));
  sched.Add(MakeSeq(5, 6));
  Step(sched);
  Step(sched);
  REQUIRE(sched.num_running() == 3);
  REQUIRE(sched.num_waiting() == 2);
  REQUIRE(sched.Find(2)->state == SequenceState::kRunning);
  CHECK(sched.Find(2)->num_computed_tokens == 19);
  CHECK(sched.Find(2)->block_table.size() == 5);
  CHECK(sched.allocator().num_used() == TotalTableBlocks(sched, {1, 2, 3, 4, 5}));

  CHECK(sched.Remove(999) == nullptr);

  std::unique_ptr<Sequence> waiting = sched.Remove(5);
  REQUIRE(waiting != nullptr);
  CHECK(waiting->state == SequenceState::kFinished);
  CHECK(sched.Find(5) == nullptr);
  CHECK(sched.num_waiting() == 1);

  const int used_before = sched.allocator().num_used();
  std::unique_ptr<Sequence> running = sched.Remove(2);
  REQUIRE(running != nullptr);
  CHECK(running->state == SequenceState::kFinished);
  CHECK(running->block_table.empty());
  CHECK(sched.num_running() == 2);
  CHECK(sched.allocator().num_used() == used_before - 5);
  CHECK(sched.allocator().num_used() == TotalTableBlocks(sched, {1, 3, 4}));

  sched.Remove(1);
  sched.Remove(3);
  sched.Remove(4);
  CHECK(sched.num_running() == 0);
  CHECK(sched.num_waiting() == 0);
  CHECK(sched.allocator().num_free() == sched.allocator().num_blocks());
  CHECK(Step(sched).empty());
}

TEST_CASE("Scheduler with prefix caching shares full prompt blocks", "[scheduler]") {
  SchedulerConfig cfg = Config(4, 8, 256);
  cfg.enable_prefix_caching = true;
  Scheduler sched(cfg, 16);
  REQUIRE(sched.prefix_cache() != nullptr);
  auto a = MakeSeq(1, 10);
  auto b = MakeSeq(2, 10);
  for (int i = 0; i < 8; ++i) b->prompt_ids[i] = a->prompt_ids[i];  // 2 full blocks in common
  sched.Add(std::move(a));
  SchedulerOutput out = Step(sched);
  REQUIRE(out.seqs.size() == 1);

  sched.Add(std::move(b));
  out = Step(sched);
  const ScheduledSeq* sb = FindIn(out, 2);
  REQUIRE(sb != nullptr);
  CHECK(sb->start == 8);  // the shared blocks are not recomputed
  CHECK(sb->num_tokens == 2);
  CHECK(sb->samples);
  Sequence* sa = sched.Find(1);
  Sequence* sbq = sched.Find(2);
  REQUIRE(sbq->block_table.size() == 3);
  CHECK(sbq->block_table[0] == sa->block_table[0]);
  CHECK(sbq->block_table[1] == sa->block_table[1]);
  CHECK(sbq->block_table[2] != sa->block_table[2]);
  CHECK(sched.allocator().ref_count(sa->block_table[0]) == 2);
  CHECK(sched.allocator().ref_count(sa->block_table[1]) == 2);
  CHECK(sched.allocator().num_used() == 4);

  sched.Remove(1);
  CHECK(sched.allocator().ref_count(sbq->block_table[0]) == 1);
  sched.Remove(2);
  CHECK(sched.allocator().num_free() == sched.allocator().num_blocks());
}

// A proposer that reads the target's hidden states (MTP): a prefix hit gives back its last
// matched block, whose positions the target computes again.
TEST_CASE("Scheduler recomputes the last cached block for a hidden-state proposer", "[scheduler]") {
  SchedulerConfig cfg = Config(4, 8, 256);
  cfg.enable_prefix_caching = true;
  cfg.draft_model_kv = true;
  cfg.recompute_last_cached_block = true;
  Scheduler sched(cfg, 16);
  auto a = MakeSeq(1, 14);
  auto b = MakeSeq(2, 14);
  for (int i = 0; i < 12; ++i) b->prompt_ids[i] = a->prompt_ids[i];  // 3 full blocks in common
  sched.Add(std::move(a));
  Step(sched);
  sched.Find(1)->draft_kv_len = 14;  // the proposer's K/V covers the prompt: blocks publish
  Step(sched);
  sched.Add(std::move(b));
  const SchedulerOutput out = Step(sched);
  const ScheduledSeq* sb = FindIn(out, 2);
  REQUIRE(sb != nullptr);
  CHECK(sb->start == 8);  // two of the three matched blocks
  CHECK(sb->num_tokens == 6);
  Sequence* sa = sched.Find(1);
  Sequence* sbq = sched.Find(2);
  CHECK(sbq->draft_kv_len == 8);
  CHECK(sbq->block_keys.size() == 2);
  CHECK(sbq->block_table[1] == sa->block_table[1]);
  CHECK(sbq->block_table[2] != sa->block_table[2]);  // its own copy of the third block
  CHECK(sched.allocator().ref_count(sa->block_table[2]) == 1);
  sched.Remove(1);
  sched.Remove(2);
  CHECK(sched.allocator().num_free() == sched.allocator().num_blocks());
}

// Drives ~2000 steps of random arrivals, cancellations and completions on a small pool and
// checks the scheduler's invariants after every step. With prefix caching, prompts start with
// one of a few shared "system prompts" so blocks are shared between sequences.
// `window` > 0 simulates a sliding-window model: blocks that left every future query's window
// must go back to the pool (and only those).
// With `drafts`, every decoding sequence carries 0..4 random draft tokens each step, of which a
// random number is accepted (speculative decoding): the rejected positions' blocks must come back
// and the invariants above still hold.
void RunRandomSimulation(bool prefix_caching, uint32_t seed, int window = 0, bool drafts = false) {
  SchedulerConfig cfg = Config(4, 6, 24);
  cfg.enable_prefix_caching = prefix_caching;
  cfg.sliding_window = window;
  constexpr int kBlocks = 24;  // 96 token slots: tight enough to preempt often
  Scheduler sched(cfg, kBlocks);
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> system_prompts(3);
  for (auto& sp : system_prompts) {
    for (int i = 0; i < 12; ++i) sp.push_back(uni(0, 999));
  }

  std::vector<int64_t> live;
  int64_t next_id = 1;
  int finished = 0, removed_early = 0, preemptions = 0, resumed_after_preemption = 0;
  int prefix_hits = 0, window_releases = 0, drafted = 0, accepted = 0;
  std::set<int64_t> ever_preempted;

  for (int step = 0; step < 2000; ++step) {
    // Arrivals.
    if (uni(0, 99) < 35) {
      const int prompt = uni(1, 40);
      const int max_new = uni(1, 30);
      auto seq = MakeSeq(next_id, prompt, uni(0, 2), next_id, max_new);
      if (prefix_caching && uni(0, 1) == 0) {
        const auto& sp = system_prompts[static_cast<size_t>(uni(0, 2))];
        for (int i = 0; i < prompt && i < static_cast<int>(sp.size()); ++i) {
          seq->prompt_ids[static_cast<size_t>(i)] = sp[static_cast<size_t>(i)];
        }
      }
      REQUIRE(seq->max_total_tokens <= kBlocks * cfg.block_size);
      live.push_back(next_id++);
      sched.Add(std::move(seq));
    }
    // Random cancellations of waiting or running sequences.
    if (!live.empty() && uni(0, 99) < 4) {
      const size_t idx = static_cast<size_t>(uni(0, static_cast<int>(live.size()) - 1));
      REQUIRE(sched.Remove(live[idx]) != nullptr);
      live.erase(live.begin() + static_cast<long>(idx));
      ++removed_early;
    }

    if (drafts) {
      for (int64_t id : live) {
        Sequence* s = sched.Find(id);
        s->draft_ids.clear();
        if (s->state != SequenceState::kRunning || s->num_tokens() - s->num_computed_tokens != 1) {
          continue;
        }
        const int k = uni(0, 4);
        for (int i = 0; i < k; ++i) s->draft_ids.push_back(uni(0, 49));
      }
    }
    std::set<int64_t> running_before;
    std::map<int64_t, int> computed_before;
    for (int64_t id : live) {
      Sequence* s = sched.Find(id);
      REQUIRE(s != nullptr);
      computed_before[id] = s->num_computed_tokens;
      if (s->state == SequenceState::kRunning) running_before.insert(id);
    }

    SchedulerOutput out = sched.Schedule();

    // Output invariants.
    int sum = 0;
    std::set<int64_t> scheduled;
    for (const ScheduledSeq& s : out.seqs) {
      const int64_t id = s.seq->id;
      REQUIRE(scheduled.insert(id).second);
      REQUIRE(s.seq->state == SequenceState::kRunning);
      REQUIRE(s.num_tokens > 0);
      if (running_before.count(id) || !prefix_caching) {
        REQUIRE(s.start == computed_before[id]);
      } else {
        // Newly admitted: starts after whole cached blocks, and computes at least one token.
        REQUIRE(s.start % cfg.block_size == 0);
        if (s.start > 0) ++prefix_hits;
      }
      REQUIRE(s.num_draft == static_cast<int>(s.seq->draft_ids.size()));
      REQUIRE(s.start + s.num_tokens - s.num_draft <= s.seq->num_tokens());
      REQUIRE(s.samples == (s.start + s.num_tokens - s.num_draft == s.seq->num_tokens()));
      // Every draft could be accepted, and the token after them, within max_total_tokens.
      REQUIRE(s.seq->num_tokens() + s.num_draft + (s.num_draft > 0 ? 1 : 0) <=
              s.seq->max_total_tokens);
      if (s.num_draft > 0) REQUIRE(s.num_tokens == s.num_draft + 1);
      REQUIRE(static_cast<int>(s.seq->block_table.size()) >=
              BlocksForTokens(s.start + s.num_tokens, cfg.block_size));
      sum += s.num_tokens;
    }
    REQUIRE(sum <= cfg.max_batched_tokens);
    REQUIRE(out.num_tokens == sum);
    REQUIRE(static_cast<int>(out.seqs.size()) <= cfg.max_num_seqs);
    for (int64_t id : out.preempted) {
      Sequence* s = sched.Find(id);
      REQUIRE(s != nullptr);
      REQUIRE(scheduled.count(id) == 0);
      REQUIRE(s->state == SequenceState::kWaiting);
      REQUIRE(s->num_computed_tokens == 0);
      REQUIRE(s->block_table.empty());
      ever_preempted.insert(id);
      ++preemptions;
    }
    // Running sequences that were not preempted all get tokens (max_num_seqs <= budget):
    // decodes are never starved.
    for (int64_t id : running_before) {
      const bool preempted =
          std::find(out.preempted.begin(), out.preempted.end(), id) != out.preempted.end();
      if (!preempted) REQUIRE(scheduled.count(id) == 1);
    }
    for (const ScheduledSeq& s : out.seqs) {
      if (ever_preempted.count(s.seq->id) && !running_before.count(s.seq->id)) {
        ++resumed_after_preemption;
      }
    }

    sched.OnStepDone(out);
    for (const ScheduledSeq& s : out.seqs) {
      if (!s.samples) continue;
      Sequence* seq = s.seq;
      if (s.num_draft > 0) {
        const int a = uni(0, s.num_draft);
        drafted += s.num_draft;
        accepted += a;
        for (int i = 0; i < a; ++i) seq->output_ids.push_back(seq->draft_ids[i]);
        seq->output_ids.push_back(uni(0, 49));
        sched.CommitDrafts(seq, a);
        REQUIRE(seq->draft_ids.empty());
        // Blocks that held only rejected positions went back.
        REQUIRE(static_cast<int>(seq->block_table.size()) ==
                BlocksForTokens(seq->num_computed_tokens, cfg.block_size));
      } else {
        seq->output_ids.push_back(uni(0, 49));
      }
      REQUIRE(seq->num_tokens() <= seq->max_total_tokens);
    }
    // Finished sequences leave.
    for (const ScheduledSeq& s : out.seqs) {
      if (s.samples && s.seq->num_tokens() >= s.seq->max_total_tokens) {
        const int64_t id = s.seq->id;
        REQUIRE(sched.Remove(id) != nullptr);
        live.erase(std::find(live.begin(), live.end(), id));
        ++finished;
      }
    }

    // State invariants.
    std::map<int32_t, std::vector<std::pair<Sequence*, size_t>>> users;  // block -> (seq, index)
    int running = 0, waiting = 0;
    for (int64_t id : live) {
      Sequence* s = sched.Find(id);
      REQUIRE(s != nullptr);
      REQUIRE(s->num_computed_tokens <= s->num_tokens());
      if (s->state == SequenceState::kRunning) {
        ++running;
        REQUIRE(static_cast<int>(s->block_table.size()) >=
                BlocksForTokens(s->num_computed_tokens, cfg.block_size));
      } else {
        REQUIRE(s->state == SequenceState::kWaiting);
        ++waiting;
        REQUIRE(s->block_table.empty());
        REQUIRE(s->num_computed_tokens == 0);
      }
      // Released (out-of-window) blocks: exactly the whole blocks before the next query's window.
      const int first_needed = std::max(s->num_computed_tokens - (window - 1), 0);
      const int dead = window > 0 ? std::min(first_needed / cfg.block_size,
                                             static_cast<int>(s->block_table.size()))
                                  : 0;
      REQUIRE(s->num_released_blocks == dead);
      window_releases += dead;
      for (size_t i = 0; i < s->block_table.size(); ++i) {
        const int32_t b = s->block_table[i];
        if (static_cast<int>(i) < s->num_released_blocks) {
          REQUIRE(b == -1);
          continue;
        }
        REQUIRE(b >= 0);
        REQUIRE(b < kBlocks);
        users[b].emplace_back(s, i);
      }
    }
    for (const auto& [block, list] : users) {
      // Each holder has one reference.
      REQUIRE(sched.allocator().ref_count(block) == static_cast<int>(list.size()));
      if (!prefix_caching) {
        REQUIRE(list.size() == 1);  // no block in two tables (or twice in one)
        continue;
      }
      // A shared block is a full, computed block at the same position with the same tokens.
      const auto& [first, index] = list[0];
      for (const auto& [other, other_index] : list) {
        REQUIRE(other_index == index);
        if (other == first) continue;
        const int lo = static_cast<int>(index) * cfg.block_size, hi = lo + cfg.block_size;
        REQUIRE(first->num_computed_tokens >= hi);
        REQUIRE(other->num_computed_tokens >= hi);
        for (int t = lo; t < hi; ++t) REQUIRE(first->token_at(t) == other->token_at(t));
      }
    }
    REQUIRE(sched.allocator().num_used() == static_cast<int>(users.size()));
    REQUIRE(sched.num_running() == running);
    REQUIRE(sched.num_waiting() == waiting);
    REQUIRE(running <= cfg.max_num_seqs);
  }

  // The run exercised preemption, resumption and completion.
  CHECK(finished > 100);
  CHECK(removed_early > 20);
  if (window > 0) {
    CHECK(window_releases > 100);
  } else {
    CHECK(preemptions > 5);
    CHECK(resumed_after_preemption > 0);
  }
  if (prefix_caching) CHECK(prefix_hits > 10);
  if (drafts) {
    CHECK(drafted > 200);
    CHECK(accepted > 50);
    CHECK(accepted < drafted);
  }

  for (int64_t id : live) REQUIRE(sched.Remove(id) != nullptr);
  CHECK(sched.num_running() == 0);
  CHECK(sched.num_waiting() == 0);
  CHECK(sched.allocator().num_free() == kBlocks);
  CHECK(sched.allocator().num_used() == 0);
}

TEST_CASE("Scheduler randomized simulation keeps its invariants", "[scheduler]") {
  SECTION("without prefix caching") {
    RunRandomSimulation(false, 12345);
  }
  SECTION("with prefix caching and shared prompt prefixes") {
    RunRandomSimulation(true, 777);
  }
  SECTION("sliding window of 6 tokens, without prefix caching") {
    RunRandomSimulation(false, 4242, 6);
  }
  SECTION("sliding window of 9 tokens, with prefix caching") {
    RunRandomSimulation(true, 99, 9);
  }
}

TEST_CASE("Scheduler randomized simulation with speculative drafts keeps its invariants",
          "[scheduler][speculative]") {
  SECTION("without prefix caching") {
    RunRandomSimulation(false, 2024, 0, true);
  }
  SECTION("with prefix caching") {
    RunRandomSimulation(true, 31337, 0, true);
  }
  SECTION("sliding window of 7 tokens, with prefix caching") {
    RunRandomSimulation(true, 5150, 7, true);
  }
}

TEST_CASE("Scheduler returns blocks that slid out of the window, and only those", "[scheduler]") {
  SchedulerConfig cfg = Config(4, 4, 64);
  cfg.sliding_window = 6;
  Scheduler sched(cfg, 8);  // 32 token slots
  sched.Add(MakeSeq(1, 30, 0, -1, 200));
  // A 230-token sequence in a 32-slot pool: only possible because old blocks come back.
  for (int step = 0; step < 400 && sched.Find(1)->num_tokens() < 230; ++step) {
    SchedulerOutput out = Step(sched);
    REQUIRE(out.preempted.empty());
    Sequence* s = sched.Find(1);
    const int live = static_cast<int>(s->block_table.size()) - s->num_released_blocks;
    // The window (6) plus the block being filled never needs more than 3 blocks of 4 tokens.
    CHECK(live <= 3);
    CHECK(sched.allocator().num_used() == live);
    for (int i = 0; i < s->num_released_blocks; ++i) CHECK(s->block_table[i] == -1);
  }
  REQUIRE(sched.Find(1)->num_tokens() >= 230);
  REQUIRE(sched.Remove(1) != nullptr);
  CHECK(sched.allocator().num_free() == 8);
}

}  // namespace
}  // namespace llm
