// Continuous-batching scheduler as a step function (vLLM v1 style): Schedule() decides how many
// tokens each sequence computes this step under a token budget; the engine runs them, then calls
// OnStepDone(). Running sequences (decodes and unfinished prefills) go first, so decodes are never
// starved; waiting sequences are admitted FCFS (by priority) while blocks and budget allow, their
// prompts chunked to fit. When blocks run out, the newest running sequence is preempted by
// recompute and requeued at the front.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "kvcache/block_allocator.h"
#include "kvcache/prefix_cache.h"
#include "scheduler/sequence.h"

namespace llm {

struct SchedulerConfig {
  int block_size = 64;
  int max_num_seqs = 64;         // running sequences per step
  int max_batched_tokens = 512;  // token budget per step: small chunks keep decode latency low
  bool enable_prefix_caching = true;
  // A sequence preempted this many times is protected: others are preempted first.
  int protect_after_preemptions = 2;
  // > 0 when every layer attends only to the last `sliding_window` positions (Mistral): blocks
  // wholly before the next query's window go back to the pool as a sequence advances.
  int sliding_window = 0;
  // A draft model keeps its K/V in the same blocks (Sequence::draft_kv_len): a block enters the
  // prefix cache, or slides out of the window, only once both models are past it, so a cached
  // block holds both models' K/V and the draft model never loses a block it still needs.
  bool draft_model_kv = false;
  // The proposer reads the target's hidden states (an MTP layer): a prefix-cache hit gives back
  // its last matched block, whose tokens the target computes again (as vLLM does for EAGLE and
  // MTP). The proposer's K/V at a block's last position depends on the token after the block,
  // which only the blocks before the last matched one are sure to share, and the recomputed
  // positions give the hidden states the proposer reads next.
  bool recompute_last_cached_block = false;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int start = 0;       // first position computed this step (== num_computed_tokens before)
  int num_tokens = 0;  // tokens computed this step
  // True when this step brings the sequence up to date, so its last row yields a new token.
  bool samples = false;
  // Speculative decoding: the last num_draft of the num_tokens are drafts (seq->draft_ids, cut
  // to this length); the step's rows at start .. start + num_draft each yield a token to verify.
  int num_draft = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  int num_tokens = 0;
  std::vector<int64_t> preempted;  // sequence ids preempted in this step
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, int num_blocks);

  // Takes ownership; the sequence waits until admitted.
  void Add(std::unique_ptr<Sequence> seq);
  SchedulerOutput Schedule();
  // Marks the step's tokens computed (call after the forward pass, before appending samples).
  // A sequence's drafts stay uncounted until CommitDrafts.
  void OnStepDone(const SchedulerOutput& out);
  // After a step that verified `seq`'s drafts and appended the accepted ones and the token that
  // followed them to output_ids: counts the accepted drafts' K/V as computed, forgets the drafts,
  // and gives back the blocks that held only rejected positions. Only blocks made wholly of
  // accepted tokens enter the prefix cache.
  void CommitDrafts(Sequence* seq, int num_accepted);
  // Frees the sequence's blocks and forgets it. Valid for waiting and running sequences.
  std::unique_ptr<Sequence> Remove(int64_t seq_id);

  Sequence* Find(int64_t seq_id);
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  const BlockAllocator& allocator() const { return allocator_; }
  // Null when prefix caching is off.
  const PrefixCache* prefix_cache() const { return prefix_cache_.get(); }
  int64_t num_preemptions_total() const { return num_preemptions_total_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  // Ensures blocks for `num_tokens` tokens. False when the pool is short.
  bool Reserve(Sequence* seq, int num_tokens);
  void Preempt(Sequence* seq);
  // Picks whom to preempt among running_[first..]: the newest unprotected one, else the newest.
  Sequence* PickVictim(size_t first) const;
  // Takes cached blocks for a sequence that has nothing computed yet.
  void MatchPrefix(Sequence* seq);
  void ReleaseBlocks(Sequence* seq);
  // Returns the blocks past the first `keep` (newest first).
  void TrimBlocks(Sequence* seq, int keep);
  // The drafts a running sequence computes this step: those that fit the budget (after its one
  // pending token, which may be an overlapped step's still on the device) and its
  // max_total_tokens; none unless it decodes that one token.
  int DraftsToSchedule(Sequence* seq, int pending, int budget) const;
  void PublishFullBlocks(Sequence* seq);
  // Tokens whose K/V every model sharing the blocks has computed.
  int KvComplete(const Sequence& seq) const;
  // Sliding window: returns the blocks that slid out of every future query's window.
  void ReleaseOutOfWindow(Sequence* seq);

  SchedulerConfig config_;
  BlockAllocator allocator_;
  std::unique_ptr<PrefixCache> prefix_cache_;
  int64_t num_preemptions_total_ = 0;
  std::map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   // front is next to admit
  std::vector<Sequence*> running_;  // admission order: back is newest
};

}  // namespace llm
