// Scheduler tests of speculative drafts: computed with their decode, cut to the budget and to
// max_tokens, trimmed when rejected, dropped rather than preempting, cached only once accepted (and
// once the draft model is past them), and carried behind a pending (overlapped) token.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <vector>

#include "scheduler/scheduler.h"
#include "tests/unit/scheduler_test_util.h"

namespace llm {
namespace {

using scheduler_test::Config;
using scheduler_test::FindIn;
using scheduler_test::MakeSeq;
using scheduler_test::Step;

// N-gram drafts proposed behind an overlapped step ride on its pending token: the step computes
// the placeholder's position (fed on the device) and the drafts after it, within the sequence's
// max_total_tokens; CommitDrafts then counts the accepted ones once the placeholder is a token.
TEST_CASE("Scheduler computes drafts behind a pending token", "[scheduler][speculative]") {
  Scheduler sched(Config(4, 8, 64), 64);
  sched.Add(MakeSeq(1, 5, 0, -1, /*max_new=*/4));
  SchedulerOutput out = sched.Schedule();  // the prefill samples
  sched.OnStepDone(out);
  Sequence* seq = sched.Find(1);
  seq->output_ids.push_back(-1);  // in flight
  seq->draft_ids = {8, 9, 10, 11};
  out = sched.Schedule();
  REQUIRE(FindIn(out, 1) != nullptr);
  const ScheduledSeq& s = *FindIn(out, 1);
  // Room for 4 new tokens: the pending one, 2 drafts and the token after them.
  CHECK(s.num_draft == 2);
  CHECK(s.num_tokens == 3);
  CHECK(s.start == 5);
  CHECK(seq->token_at(5) == -1);
  CHECK(seq->token_at(6) == 8);
  CHECK(seq->token_at(7) == 9);
  sched.OnStepDone(out);
  CHECK(seq->num_computed_tokens == 6);  // the pending position; drafts wait for verification
  seq->output_ids.back() = 7;            // the pending token arrives
  seq->output_ids.insert(seq->output_ids.end(), {8, 12});  // one draft accepted, then the target's
  sched.CommitDrafts(seq, 1);
  CHECK(seq->num_computed_tokens == 7);
  CHECK(seq->draft_ids.empty());
}

// One step of a fake engine that verifies drafts: `accept` drafts of each drafted sequence are
// accepted and token 99 follows them.
SchedulerOutput SpecStep(Scheduler& sched, int accept) {
  SchedulerOutput out = sched.Schedule();
  sched.OnStepDone(out);
  for (const ScheduledSeq& s : out.seqs) {
    if (!s.samples) continue;
    if (s.num_draft == 0) {
      s.seq->output_ids.push_back(7);
      continue;
    }
    const int a = std::min(accept, s.num_draft);
    for (int i = 0; i < a; ++i) s.seq->output_ids.push_back(s.seq->draft_ids[i]);
    s.seq->output_ids.push_back(99);
    sched.CommitDrafts(s.seq, a);
  }
  return out;
}

TEST_CASE("Scheduler computes a decode's drafts with it and trims rejected blocks",
          "[scheduler][speculative]") {
  Scheduler sched(Config(4, 4, 64), 16);
  sched.Add(MakeSeq(1, 6));
  SpecStep(sched, 0);  // the prefill samples one token: 7 tokens, 6 computed
  Sequence* s = sched.Find(1);
  REQUIRE(s->num_tokens() == 7);
  REQUIRE(s->num_computed_tokens == 6);
  REQUIRE(sched.allocator().num_used() == 2);

  s->draft_ids = {50, 51, 52, 53};
  SchedulerOutput out = sched.Schedule();
  REQUIRE(out.seqs.size() == 1);
  const ScheduledSeq& d = out.seqs[0];
  CHECK(d.start == 6);
  CHECK(d.num_tokens == 5);  // the last sampled token and 4 drafts
  CHECK(d.num_draft == 4);
  CHECK(d.samples);
  CHECK(out.num_tokens == 5);
  CHECK(s->token_at(6) == 7);
  CHECK(s->token_at(7) == 50);
  CHECK(s->token_at(10) == 53);
  CHECK(s->block_table.size() == 3);  // positions 0..10
  sched.OnStepDone(out);
  CHECK(s->num_computed_tokens == 7);  // drafts wait for CommitDrafts
  s->output_ids.push_back(99);         // none accepted: the target's token follows
  sched.CommitDrafts(s, 0);
  CHECK(s->num_computed_tokens == 7);
  CHECK(s->num_tokens() == 8);
  CHECK(s->draft_ids.empty());
  CHECK(s->block_table.size() == 2);  // the block of positions 8..10 held only rejected drafts
  CHECK(sched.allocator().num_used() == 2);

  s->draft_ids = {60, 61, 62, 63};
  SpecStep(sched, 4);  // all accepted, then the bonus token
  CHECK(s->num_computed_tokens == 12);
  CHECK(s->num_tokens() == 13);
  CHECK(s->output_ids == std::vector<int32_t>{7, 99, 60, 61, 62, 63, 99});
  CHECK(s->block_table.size() == 3);
  CHECK(sched.allocator().num_used() == 3);

  REQUIRE(sched.Remove(1) != nullptr);
  CHECK(sched.allocator().num_free() == 16);
}

TEST_CASE("Scheduler cuts drafts to the token budget and to max_tokens",
          "[scheduler][speculative]") {
  Scheduler sched(Config(4, 4, 3), 16);
  sched.Add(MakeSeq(1, 2, 0, -1, /*max_new=*/4));
  SpecStep(sched, 0);  // prefill + first token
  Sequence* s = sched.Find(1);
  s->draft_ids = {50, 51, 52, 53};
  SchedulerOutput out = sched.Schedule();
  REQUIRE(out.seqs.size() == 1);
  CHECK(out.seqs[0].num_draft == 2);  // a budget of 3 tokens: the last token and 2 drafts
  CHECK(s->draft_ids == std::vector<int32_t>{50, 51});
  sched.OnStepDone(out);
  s->output_ids.insert(s->output_ids.end(), {50, 51, 99});
  sched.CommitDrafts(s, 2);
  CHECK(s->num_tokens() == 6);  // prompt 2 + 4 generated: max_tokens reached
  CHECK(s->num_tokens() == s->max_total_tokens);

  // One token left under max_tokens: no room for a draft and the token after it.
  sched.Add(MakeSeq(2, 2, 0, -1, /*max_new=*/2));
  sched.Remove(1);
  SpecStep(sched, 0);
  Sequence* t = sched.Find(2);
  REQUIRE(t->num_tokens() == 3);
  t->draft_ids = {50, 51};
  out = sched.Schedule();
  REQUIRE(out.seqs.size() == 1);
  CHECK(out.seqs[0].num_draft == 0);
  CHECK(out.seqs[0].num_tokens == 1);
  CHECK(t->draft_ids.empty());
  sched.OnStepDone(out);
  sched.Remove(2);
  CHECK(sched.allocator().num_free() == 16);
}

TEST_CASE("Scheduler caches only blocks made wholly of accepted tokens",
          "[scheduler][speculative]") {
  SchedulerConfig cfg = Config(4, 4, 64);
  cfg.enable_prefix_caching = true;
  Scheduler sched(cfg, 16);
  auto a = MakeSeq(1, 4);
  const std::vector<int32_t> prompt = a->prompt_ids;
  sched.Add(std::move(a));
  SpecStep(sched, 0);  // prefill 4: block 0 cached; output [7]
  Sequence* s = sched.Find(1);
  s->draft_ids = {50, 51, 52, 53};
  SpecStep(sched, 2);  // positions 4..8 computed; 50, 51 accepted, then 99
  REQUIRE(s->output_ids == std::vector<int32_t>{7, 50, 51, 99});
  REQUIRE(s->num_computed_tokens == 7);

  // Block 1 (positions 4..7) holds 7, 50, 51 and the rejected 52: not cached.
  auto b = MakeSeq(2, 9);
  b->prompt_ids = prompt;
  b->prompt_ids.insert(b->prompt_ids.end(), {7, 50, 51, 52, 1});
  sched.Add(std::move(b));
  SchedulerOutput out = sched.Schedule();
  const ScheduledSeq* sb = FindIn(out, 2);
  REQUIRE(sb != nullptr);
  CHECK(sb->start == 4);  // only block 0 matched
  sched.OnStepDone(out);
  for (const ScheduledSeq& x : out.seqs) x.seq->output_ids.push_back(7);

  // Once 99 is computed at position 7, block 1 is [7, 50, 51, 99]: cached.
  auto c = MakeSeq(3, 9);
  c->prompt_ids = prompt;
  c->prompt_ids.insert(c->prompt_ids.end(), {7, 50, 51, 99, 1});
  sched.Add(std::move(c));
  out = sched.Schedule();
  const ScheduledSeq* sc = FindIn(out, 3);
  REQUIRE(sc != nullptr);
  CHECK(sc->start == 8);
  sched.OnStepDone(out);
  for (int64_t id : {1, 2, 3}) REQUIRE(sched.Remove(id) != nullptr);
  CHECK(sched.allocator().num_free() == 16);
}

TEST_CASE("Scheduler drops drafts rather than preempt for them", "[scheduler][speculative]") {
  Scheduler sched(Config(4, 4, 64), 3);  // 12 token slots
  sched.Add(MakeSeq(1, 3));
  sched.Add(MakeSeq(2, 3));
  SpecStep(sched, 0);  // both prefilled: one block each (positions 0..3), 3 computed; 1 free
  sched.Find(1)->draft_ids = {50, 51, 52, 53};  // positions 3..7: takes the free block
  sched.Find(2)->draft_ids = {60};              // positions 3..4: no block left for position 4
  SchedulerOutput out = sched.Schedule();
  CHECK(out.preempted.empty());  // without the drop, sequence 2 would preempt itself
  REQUIRE(out.seqs.size() == 2);
  CHECK(out.seqs[0].num_draft == 4);
  CHECK(out.seqs[1].num_draft == 0);  // dropped: its last token fits its own block
  CHECK(out.seqs[1].num_tokens == 1);
  CHECK(sched.Find(2)->draft_ids.empty());
  sched.OnStepDone(out);
  sched.Find(1)->output_ids.insert(sched.Find(1)->output_ids.end(), {50, 99});
  sched.CommitDrafts(sched.Find(1), 1);
  CHECK(sched.Find(1)->num_computed_tokens == 5);
  sched.Find(2)->output_ids.push_back(7);
  for (int64_t id : {1, 2}) REQUIRE(sched.Remove(id) != nullptr);
  CHECK(sched.allocator().num_free() == 3);
}

TEST_CASE("Scheduler forgets the drafts of a preempted sequence", "[scheduler][speculative]") {
  Scheduler sched(Config(4, 4, 64), 2);  // 8 token slots
  sched.Add(MakeSeq(1, 4));
  sched.Add(MakeSeq(2, 4));
  SpecStep(sched, 0);  // both prefilled: one full block each
  SpecStep(sched, 0);  // sequence 1 needs a second block for position 4: sequence 2 goes
  Sequence* preempted = sched.Find(2);
  REQUIRE(preempted->state == SequenceState::kWaiting);
  preempted->draft_ids = {60};  // drafts on a waiting sequence are never scheduled
  SchedulerOutput out = sched.Schedule();
  CHECK(preempted->draft_ids.empty());
  for (const ScheduledSeq& s : out.seqs) CHECK(s.num_draft == 0);
  sched.OnStepDone(out);
  for (int64_t id : {1, 2}) REQUIRE(sched.Remove(id) != nullptr);
  CHECK(sched.allocator().num_free() == 2);
}

// A draft model's K/V in the same blocks (SchedulerConfig::draft_model_kv): a full block enters
// the prefix cache only once both models are past it; a prefix hit gives the draft model the
// matched length, a preemption takes it back to 0.
TEST_CASE("Scheduler caches a block only once the draft model is past it too",
          "[scheduler][speculative]") {
  SchedulerConfig cfg = Config(4, 4, 64);
  cfg.enable_prefix_caching = true;
  cfg.draft_model_kv = true;
  Scheduler sched(cfg, 16);
  auto a = MakeSeq(1, 9);
  const std::vector<int32_t> prompt = a->prompt_ids;
  sched.Add(std::move(a));
  Sequence* s = sched.Find(1);
  SchedulerOutput out = sched.Schedule();  // the whole prompt: blocks 0 and 1 full
  REQUIRE(out.seqs.size() == 1);
  s->draft_kv_len = 4;  // the draft model has only block 0
  sched.OnStepDone(out);
  CHECK(s->block_keys.size() == 1);
  s->output_ids.push_back(7);

  auto b = MakeSeq(2, 9);
  b->prompt_ids = prompt;
  sched.Add(std::move(b));
  out = sched.Schedule();  // b matches block 0 only; s decodes
  const ScheduledSeq* sb = FindIn(out, 2);
  REQUIRE(sb != nullptr);
  CHECK(sb->start == 4);
  CHECK(sched.Find(2)->draft_kv_len == 4);  // the cached block holds the draft's K/V
  s->draft_kv_len = 10;                     // the draft model caught up
  sched.OnStepDone(out);
  CHECK(s->block_keys.size() == 2);

  for (int64_t id : {1, 2}) REQUIRE(sched.Remove(id) != nullptr);
  CHECK(sched.allocator().num_free() == 16);

  // Preempted: the draft model's K/V went with the blocks.
  SchedulerConfig small = Config(4, 4, 64);
  small.draft_model_kv = true;
  Scheduler tight(small, 2);  // 8 token slots
  tight.Add(MakeSeq(1, 4));
  tight.Add(MakeSeq(2, 4));
  Step(tight);  // both prefilled: one full block each
  Sequence* victim = tight.Find(2);
  victim->draft_kv_len = 4;
  victim->draft_kv_ahead = {5, 6};
  Step(tight);  // sequence 1 needs a second block for position 4: sequence 2 goes
  REQUIRE(victim->state == SequenceState::kWaiting);
  CHECK(victim->draft_kv_len == 0);
  CHECK(victim->draft_kv_ahead.empty());
  for (int64_t id : {1, 2}) REQUIRE(tight.Remove(id) != nullptr);
  CHECK(tight.allocator().num_free() == 2);
}

}  // namespace
}  // namespace llm
