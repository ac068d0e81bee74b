// Multi-token-prediction speculation (--speculative-method mtp, issue 52): DeepSeek-V3's MTP layer
// (engine/architectures/cpu_deepseek_mtp.h), a Model of its own, proposes each step's drafts from
// the target's last hidden states, as vLLM's EAGLE/MTP proposer does.
//
// Its K/V lives in the target's blocks like a draft model's (ModelLoadOptions::defer_kv_cache,
// extra_kv_bytes_per_block, Model::AllocateKvCache, SchedulerConfig::draft_model_kv), with one
// difference: its row at position i reads the token after i and the target's hidden state at i,
// so Sequence::draft_kv_len (positions [0, draft_kv_len) hold those rows) trails the target by
// one token, and a proposal's row (which reads the MTP layer's own output, not the target's) is
// never kept: draft_kv_ahead stays empty. A prefix-cache hit gives back its last matched block
// (SchedulerConfig::recompute_last_cached_block).
//
// The hidden states: every target forward returns those of the rows of requests that may
// speculate (ForwardBatch::hidden_rows); after verification the engine keeps the rows of the
// positions the target now holds (KeepHidden), and the next step's Run consumes them, for every
// such sequence scheduled, speculating or not (the layer is one decoder layer, and hidden states
// not consumed then are gone): one forward over the rows each sequence's MTP K/V lacks, whose
// last row (the position before the last token, reading the last token) gives a proposing
// sequence its first draft, then K - 1 one-row forwards, each reading the previous draft and the
// layer's own output before its final norm (ForwardBatch::hidden_before_final_norm).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/runtime/model.h"
#include "engine/speculative/draft_model_proposer.h"
#include "engine/speculative/proposer_batch.h"
#include "kvcache/block_allocator.h"
#include "scheduler/sequence.h"

namespace llm {

class MtpProposer {
 public:
  // `mtp` reads input_hidden, returns hidden states and has its KV cache in blocks of
  // `block_size` tokens.
  MtpProposer(std::unique_ptr<Model> mtp, int block_size);

  // The target's hidden states of `seq`'s positions [begin, begin + rows / hidden), after its
  // final norm. Continues the rows kept for the sequence when they reach `begin`, else replaces
  // them (a preempted or prefix-matched sequence starts again).
  void KeepHidden(const Sequence& seq, int begin, std::span<const float> rows);
  // Forgets the rows of sequences `gone` says have ended.
  void ForgetIf(const std::function<bool(int64_t seq_id)>& gone);
  // The end of the kept rows that continue seq.draft_kv_len (draft_kv_len when none do).
  int KeptEnd(const Sequence& seq) const;

  // Runs `work` (each sequence at most once): item i's MTP rows are positions
  // [seq->draft_kv_len, end), each reading the token after it and the kept hidden state there
  // (KeptEnd(seq) >= end, end < num_tokens); num_propose > 0 needs end == num_tokens - 1 (the
  // row reading the last token gives the first draft). On success each sequence has
  // draft_kv_len = end, its rows before end forgotten, and draft_ids[0..num_propose) = its
  // proposals; on an error, nothing is changed.
  Status Run(std::span<const DraftWork> work, const BlockAllocator& allocator,
             const ProposerDeviceJob& device_job, const ProposerChoose& choose);

  const Model& model() const { return *mtp_; }

 private:
  struct Kept {
    int begin = 0;
    std::vector<float> rows;  // [positions, hidden]
  };
  int hidden_size() const { return mtp_->config().hidden_size; }
  int kept_end(const Kept& k) const {
    return k.begin + static_cast<int>(k.rows.size()) / hidden_size();
  }

  std::unique_ptr<Model> mtp_;
  int block_size_;
  std::map<int64_t, Kept> kept_;  // by sequence id
  std::vector<float> logits_;
  std::vector<int32_t> tokens_;
};

}  // namespace llm
