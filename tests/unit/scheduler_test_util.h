// The fake engine loop the scheduler tests drive (tests/unit/test_scheduler.cc,
// tests/unit/test_scheduler_drafts.cc): sequences, a policy without prefix caching, one step.
#pragma once

#include <memory>
#include <vector>

#include "scheduler/scheduler.h"

namespace llm::scheduler_test {

// Prompt tokens are unique to the sequence, so no two sequences share a prefix.
inline std::unique_ptr<Sequence> MakeSeq(int64_t id, int prompt_len, int priority = 0,
                                         int64_t arrival = -1, int max_new = 1000) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->priority = priority;
  s->arrival = arrival < 0 ? id : arrival;
  for (int i = 0; i < prompt_len; ++i) {
    s->prompt_ids.push_back(static_cast<int32_t>(id * 100003 + i));
  }
  s->max_total_tokens = prompt_len + max_new;
  return s;
}

// The scheduling policy under test, without prefix caching (which changes where a resumed or
// newly admitted sequence starts).
inline SchedulerConfig Config(int block_size, int max_num_seqs, int max_batched_tokens) {
  SchedulerConfig cfg;
  cfg.block_size = block_size;
  cfg.max_num_seqs = max_num_seqs;
  cfg.max_batched_tokens = max_batched_tokens;
  cfg.enable_prefix_caching = false;
  return cfg;
}

// One engine step: schedule, mark computed, append a fake token where the step samples.
inline SchedulerOutput Step(Scheduler& sched) {
  SchedulerOutput out = sched.Schedule();
  sched.OnStepDone(out);
  for (const ScheduledSeq& s : out.seqs) {
    if (s.samples) s.seq->output_ids.push_back(7);
  }
  return out;
}

inline const ScheduledSeq* FindIn(const SchedulerOutput& out, int64_t id) {
  for (const ScheduledSeq& s : out.seqs) {
    if (s.seq->id == id) return &s;
  }
  return nullptr;
}

inline int TotalTableBlocks(Scheduler& sched, const std::vector<int64_t>& ids) {
  int n = 0;
  for (int64_t id : ids) {
    if (Sequence* s = sched.Find(id)) n += static_cast<int>(s->block_table.size());
  }
  return n;
}

}  // namespace llm::scheduler_test
