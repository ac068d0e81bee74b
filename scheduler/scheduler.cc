#include "scheduler/scheduler.h"

#include <algorithm>

namespace llm {

Scheduler::Scheduler(const SchedulerConfig& config, int num_blocks)
    : config_(config), allocator_(num_blocks) {
  LLM_CHECK(config.block_size > 0 && config.max_num_seqs > 0 && config.max_batched_tokens > 0);
}

void Scheduler::Add(std::unique_ptr<Sequence> seq) {
  Sequence* s = seq.get();
  s->state = SequenceState::kWaiting;
  LLM_CHECK(seqs_.emplace(s->id, std::move(seq)).second) << "duplicate sequence id " << s->id;
  // Keep waiting_ ordered by (priority, arrival); preempted sequences are reinserted at the front.
  auto pos = std::upper_bound(waiting_.begin(), waiting_.end(), s, [](Sequence* a, Sequence* b) {
    return a->priority < b->priority || (a->priority == b->priority && a->arrival < b->arrival);
  });
  waiting_.insert(pos, s);
}

Sequence* Scheduler::Find(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

bool Scheduler::Reserve(Sequence* seq, int num_tokens) {
  const int need = BlocksForTokens(num_tokens, config_.block_size) -
                   static_cast<int>(seq->block_table.size());
  if (need <= 0) return true;
  return allocator_.Allocate(need, &seq->block_table).ok();
}

void Scheduler::Preempt(Sequence* seq) {
  allocator_.Release(seq->block_table);
  seq->block_table.clear();
  seq->num_computed_tokens = 0;
  seq->num_preemptions++;
  seq->state = SequenceState::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);  // resumes ahead of new work
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int budget = config_.max_batched_tokens;

  // 1. Running sequences, oldest first. Each needs blocks for its new tokens; when the pool is
  //    short, the newest running sequence is preempted (possibly the one being scheduled).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int n = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool ok = Reserve(seq, seq->num_computed_tokens + n);
    while (!ok) {
      Sequence* victim = running_.back();
      // A victim scheduled earlier in this step would leave a dangling entry; only unscheduled
      // sequences (index >= i) are eligible, which the loop guarantees since back() >= i.
      out.preempted.push_back(victim->id);
      Preempt(victim);
      if (victim == seq) break;
      ok = Reserve(seq, seq->num_computed_tokens + n);
    }
    if (!ok) continue;  // seq itself was preempted; running_[i] is now the next one
    out.seqs.push_back({seq, seq->num_computed_tokens, n,
                        seq->num_computed_tokens + n == seq->num_tokens()});
    budget -= n;
    ++i;
  }

  // 2. Admit waiting sequences while budget, sequence slots and blocks allow. Skip admission in a
  //    step that had to preempt: memory is tight and admitting would only preempt again.
  while (out.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    const int n = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    if (!Reserve(seq, seq->num_computed_tokens + n)) break;  // FCFS: no overtaking
    waiting_.pop_front();
    seq->state = SequenceState::kRunning;
    running_.push_back(seq);
    out.seqs.push_back({seq, seq->num_computed_tokens, n,
                        seq->num_computed_tokens + n == seq->num_tokens()});
    budget -= n;
  }
  out.num_tokens = config_.max_batched_tokens - budget;
  return out;
}

void Scheduler::OnStepDone(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.seqs) s.seq->num_computed_tokens += s.num_tokens;
}

std::unique_ptr<Sequence> Scheduler::Remove(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return nullptr;
  std::unique_ptr<Sequence> seq = std::move(it->second);
  seqs_.erase(it);
  allocator_.Release(seq->block_table);
  seq->block_table.clear();
  if (seq->state == SequenceState::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq.get()));
  } else if (seq->state == SequenceState::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq.get()));
  }
  seq->state = SequenceState::kFinished;
  return seq;
}

}  // namespace llm
