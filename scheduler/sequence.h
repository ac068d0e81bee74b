// Scheduling state of one request. Owned by the Scheduler; touched only on the engine thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

enum class SequenceState { kWaiting, kRunning, kFinished };

struct Sequence {
  int64_t id = 0;       // engine-assigned, unique for the process lifetime
  int priority = 0;     // lower runs first
  int64_t arrival = 0;  // admission order, for FCFS
  std::vector<int32_t> prompt_ids;
  // Generated tokens. With overlapped steps the last one may still be on its way: a placeholder
  // -(r + 1) for "the token that logit row r of the in-flight step samples", which is also the id
  // the model reads on the device when the next step feeds it back (Model::Launch).
  std::vector<int32_t> output_ids;
  int max_total_tokens = 0;  // prompt + max_tokens, capped by the context length
  // Speculative decoding: tokens proposed to follow output_ids, set by the engine before
  // Schedule. A decoding sequence computes its last token and these in one step (Schedule keeps
  // what fits, ScheduledSeq::num_draft); Scheduler::CommitDrafts ends their life.
  std::vector<int32_t> draft_ids;
  // Draft-model speculation (SchedulerConfig::draft_model_kv): a second model keeps its own K/V
  // in this sequence's blocks. Positions [0, draft_kv_len) of its cache hold this sequence's
  // tokens; draft_kv_ahead are the proposals it also wrote at the positions right after them,
  // valid where the sequence's tokens turn out to be the same (accepted drafts). The engine
  // advances both; the scheduler resets them where blocks are freed or taken from the cache.
  int draft_kv_len = 0;
  std::vector<int32_t> draft_kv_ahead;

  SequenceState state = SequenceState::kWaiting;
  // Tokens whose K/V are in the cache. After a preemption it drops to 0 and prompt + output are
  // recomputed as one prefill.
  int num_computed_tokens = 0;
  std::vector<int32_t> block_table;  // KV block ids, in token order
  // Sliding-window models: the leading blocks no future query can see have been returned to the
  // allocator; their block_table entries are -1 (kernels never read them).
  int num_released_blocks = 0;
  std::vector<uint64_t> block_keys;  // prefix-cache keys of the leading full, computed blocks
  int num_cached_tokens = 0;         // prompt tokens served from the prefix cache at admission
  int num_preemptions = 0;

  int num_tokens() const { return static_cast<int>(prompt_ids.size() + output_ids.size()); }
  bool has_pending_token() const { return !output_ids.empty() && output_ids.back() < 0; }
  int num_known_outputs() const {
    return static_cast<int>(output_ids.size()) - (has_pending_token() ? 1 : 0);
  }
  std::vector<int32_t> AllTokens() const {
    std::vector<int32_t> t = prompt_ids;
    t.insert(t.end(), output_ids.begin(), output_ids.end());
    return t;
  }
  // Positions past output_ids are the drafts'.
  int32_t token_at(int i) const {
    const int p = static_cast<int>(prompt_ids.size());
    if (i < p) return prompt_ids[i];
    const int o = i - p;
    return o < static_cast<int>(output_ids.size()) ? output_ids[o]
                                                   : draft_ids[o - output_ids.size()];
  }
};

}  // namespace llm
