#include "scheduler/scheduler.h"

#include <algorithm>

namespace llm {

Scheduler::Scheduler(const SchedulerConfig& config, int num_blocks)
    : config_(config), allocator_(num_blocks) {
  LLM_CHECK(config.block_size > 0 && config.max_num_seqs > 0 && config.max_batched_tokens > 0);
  if (config.enable_prefix_caching) {
    prefix_cache_ = std::make_unique<PrefixCache>(&allocator_, config.block_size);
  }
}

void Scheduler::ReleaseBlocks(Sequence* seq) {
  // Tail first, so the LRU free list evicts a sequence's tail before its shared prefix. Blocks
  // that slid out of the window were released already.
  std::vector<int32_t> reversed(seq->block_table.rbegin(),
                                seq->block_table.rend() - seq->num_released_blocks);
  allocator_.Release(reversed);
  seq->block_table.clear();
  seq->block_keys.clear();
  seq->num_released_blocks = 0;
}

void Scheduler::TrimBlocks(Sequence* seq, int keep) {
  std::vector<int32_t> tail;
  for (int b = static_cast<int>(seq->block_table.size()); b-- > keep;) {
    LLM_CHECK(b >= seq->num_released_blocks) << "trimming a block that slid out of the window";
    tail.push_back(seq->block_table[b]);
  }
  seq->block_table.resize(std::min<size_t>(seq->block_table.size(), keep));
  allocator_.Release(tail);
}

int Scheduler::DraftsToSchedule(Sequence* seq, int pending, int budget) const {
  // A pending token (an overlapped step's) may carry drafts: its row is fed on the device.
  if (pending != 1) return 0;
  // Each accepted draft is a generated token: k drafts and the token after them must fit.
  const int room = seq->max_total_tokens - seq->num_tokens() - 1;
  return std::max(0, std::min({static_cast<int>(seq->draft_ids.size()), budget - 1, room}));
}

void Scheduler::ReleaseOutOfWindow(Sequence* seq) {
  if (config_.sliding_window <= 0) return;
  // The next query sits at position p = num_computed_tokens (a draft model's at draft_kv_len:
  // the lower one counts) and sees [p - W + 1, p]; later ones see less of the past, so every
  // block ending at or before p - W + 1 is dead for good.
  const int first_needed = KvComplete(*seq) - (config_.sliding_window - 1);
  const int dead = std::min(std::max(first_needed, 0) / config_.block_size,
                            static_cast<int>(seq->block_table.size()));
  if (dead <= seq->num_released_blocks) return;
  std::vector<int32_t> released;
  for (int b = dead - 1; b >= seq->num_released_blocks; --b) {  // newest first, as above
    released.push_back(seq->block_table[b]);
    seq->block_table[b] = -1;
  }
  allocator_.Release(released);
  seq->num_released_blocks = dead;
}

void Scheduler::MatchPrefix(Sequence* seq) {
  if (!prefix_cache_ || seq->num_computed_tokens != 0 || !seq->block_table.empty()) return;
  const std::vector<int32_t> tokens = seq->AllTokens();
  // At least one token must be computed to produce logits.
  int matched =
      prefix_cache_->Match(tokens, seq->num_tokens() - 1, &seq->block_table, &seq->block_keys);
  if (config_.recompute_last_cached_block && matched > 0) {
    allocator_.Release({seq->block_table.back()});
    seq->block_table.pop_back();
    seq->block_keys.pop_back();
    matched -= config_.block_size;
  }
  seq->num_computed_tokens = matched;
  // Cached blocks hold the draft model's K/V too (PublishFullBlocks waits for both models).
  seq->draft_kv_len = matched;
  seq->draft_kv_ahead.clear();
  if (seq->num_preemptions == 0) seq->num_cached_tokens = matched;
}

int Scheduler::KvComplete(const Sequence& seq) const {
  return config_.draft_model_kv ? std::min(seq.num_computed_tokens, seq.draft_kv_len)
                                : seq.num_computed_tokens;
}

void Scheduler::PublishFullBlocks(Sequence* seq) {
  if (!prefix_cache_) return;
  const int bs = config_.block_size;
  const int full = KvComplete(*seq) / bs;
  if (static_cast<int>(seq->block_keys.size()) >= full) return;
  const std::vector<int32_t> tokens = seq->AllTokens();
  while (static_cast<int>(seq->block_keys.size()) < full) {
    const size_t i = seq->block_keys.size();
    const uint64_t parent = i == 0 ? 0 : seq->block_keys[i - 1];
    const std::span<const int32_t> bt(tokens.data() + i * bs, bs);
    const uint64_t key = PrefixCache::HashBlock(parent, bt);
    prefix_cache_->Insert(key, seq->block_table[i], bt);
    seq->block_keys.push_back(key);
  }
}

Sequence* Scheduler::PickVictim(size_t first) const {
  for (size_t j = running_.size(); j-- > first;) {
    if (running_[j]->num_preemptions < config_.protect_after_preemptions) return running_[j];
  }
  return running_.back();
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
  const int need =
      BlocksForTokens(num_tokens, config_.block_size) - static_cast<int>(seq->block_table.size());
  if (need <= 0) return true;
  return allocator_.Allocate(need, &seq->block_table).ok();
}

void Scheduler::Preempt(Sequence* seq) {
  ReleaseBlocks(seq);
  seq->draft_ids.clear();
  seq->num_computed_tokens = 0;
  seq->draft_kv_len = 0;
  seq->draft_kv_ahead.clear();
  seq->num_preemptions++;
  num_preemptions_total_++;
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
    const int pending = seq->num_tokens() - seq->num_computed_tokens;
    int drafts = DraftsToSchedule(seq, pending, budget);
    seq->draft_ids.resize(drafts);
    int n = std::min(pending, budget) + drafts;
    // A sequence whose pending token is its last allowed one (overlapped steps) computes nothing
    // more: it finishes when that token arrives.
    if (n <= 0 || (seq->has_pending_token() && seq->num_tokens() >= seq->max_total_tokens)) {
      ++i;
      continue;
    }
    bool ok = Reserve(seq, seq->num_computed_tokens + n);
    if (!ok && drafts > 0) {
      // Drafts are a bet, not a need: they never cost another sequence its blocks.
      n -= drafts;
      drafts = 0;
      seq->draft_ids.clear();
      ok = Reserve(seq, seq->num_computed_tokens + n);
    }
    while (!ok) {
      // Only sequences not yet scheduled this step (index >= i) may be preempted.
      Sequence* victim = PickVictim(i);
      out.preempted.push_back(victim->id);
      Preempt(victim);
      if (victim == seq) break;
      ok = Reserve(seq, seq->num_computed_tokens + n);
    }
    if (!ok) continue;  // seq itself was preempted; running_[i] is now the next one
    out.seqs.push_back({seq, seq->num_computed_tokens, n,
                        seq->num_computed_tokens + n - drafts == seq->num_tokens(), drafts});
    budget -= n;
    ++i;
  }

  // 2. Admit waiting sequences while budget, sequence slots and blocks allow. Skip admission in a
  //    step that had to preempt: memory is tight and admitting would only preempt again.
  while (out.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    seq->draft_ids.clear();  // a prefill drafts nothing
    MatchPrefix(seq);
    const int n = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    if (!Reserve(seq, seq->num_computed_tokens + n)) {
      ReleaseBlocks(seq);  // give back the prefix hits too; retried next step
      seq->num_computed_tokens = 0;
      seq->draft_kv_len = 0;
      break;  // FCFS: no overtaking
    }
    waiting_.pop_front();
    seq->state = SequenceState::kRunning;
    running_.push_back(seq);
    out.seqs.push_back(
        {seq, seq->num_computed_tokens, n, seq->num_computed_tokens + n == seq->num_tokens()});
    budget -= n;
  }
  out.num_tokens = config_.max_batched_tokens - budget;
  return out;
}

void Scheduler::OnStepDone(const SchedulerOutput& out) {
  for (const ScheduledSeq& s : out.seqs) {
    s.seq->num_computed_tokens += s.num_tokens - s.num_draft;
    PublishFullBlocks(s.seq);  // before the window release: published blocks stay cached
    ReleaseOutOfWindow(s.seq);
  }
}

void Scheduler::CommitDrafts(Sequence* seq, int num_accepted) {
  LLM_CHECK(num_accepted >= 0 && num_accepted <= static_cast<int>(seq->draft_ids.size()))
      << "sequence " << seq->id << " accepted " << num_accepted << " of " << seq->draft_ids.size()
      << " drafts";
  seq->num_computed_tokens += num_accepted;
  LLM_CHECK_EQ(seq->num_computed_tokens + 1, seq->num_tokens())
      << "the accepted drafts and the token after them must be in output_ids";
  seq->draft_ids.clear();
  // The rejected positions' K/V is garbage past num_computed_tokens (never read: kv_lens stop
  // there, and the next steps overwrite it); blocks holding nothing else go back now.
  TrimBlocks(seq, BlocksForTokens(seq->num_computed_tokens, config_.block_size));
  PublishFullBlocks(seq);
  ReleaseOutOfWindow(seq);
}

std::unique_ptr<Sequence> Scheduler::Remove(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return nullptr;
  std::unique_ptr<Sequence> seq = std::move(it->second);
  seqs_.erase(it);
  ReleaseBlocks(seq.get());
  if (seq->state == SequenceState::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq.get()));
  } else if (seq->state == SequenceState::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq.get()));
  }
  seq->state = SequenceState::kFinished;
  return seq;
}

}  // namespace llm
