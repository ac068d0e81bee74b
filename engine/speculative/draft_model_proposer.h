// Draft-model speculation (vLLM's draft-model method, issue 52): a second, smaller Model on the
// same device proposes each step's drafts. It has no block table of its own: its KV cache
// (allocated with the target's block count, Model::AllocateKvCache) is indexed by the target
// sequence's block ids, so a block the scheduler frees, trims or preempts is gone for both models
// at once, and the KV budget counts both models' bytes per block
// (ModelLoadOptions::extra_kv_bytes_per_block). What the draft model has computed of a sequence
// is Sequence::draft_kv_len (and draft_kv_ahead, the proposals it wrote past it); the scheduler
// publishes blocks to the prefix cache and releases sliding-window blocks only behind both models
// (SchedulerConfig::draft_model_kv).
//
// One engine step runs the draft model after Schedule has reserved the drafts' blocks: one
// forward over every sequence's tokens the draft has not seen (prompt chunks mirrored as the
// target prefills them, the accepted drafts and the target's token after them), whose last row
// gives each proposing sequence its first draft, then one-token forwards, batched over the
// proposing sequences, for the rest. Rejected drafts leave stale K/V past draft_kv_len, which is
// never read and is overwritten when those positions are computed again.
//
// On a draft model that overlaps steps (Model::supports_overlap, the CUDA runner) a forward whose
// every row is drawn on the device is launched, and the next one-token forward is queued behind
// it with the drafts it draws as fed-back ids (read on the device): the host picks forward j's
// drafts while forward j + 1 runs, so the device runs the proposal steps back to back. The
// decision is per forward, for its whole batch: a forward is queued so only when every item's
// job for that draft is known without the earlier drafts' values (ProposerJobsIndependent: no
// penalties counting them) and every row is drawn on the device (greedy, unconstrained drafts);
// otherwise the host collects the previous forward first and passes its tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/runtime/model.h"
#include "engine/speculative/proposer_batch.h"
#include "kvcache/block_allocator.h"
#include "scheduler/sequence.h"
#include "text/tokenizer/tokenizer.h"

namespace llm {

// The load options of a draft model beside a target loaded with `target`: the same device, block
// size, CUDA graph settings (graphs of up to two query rows per sequence where the target's
// verify steps have more), weight dtype and dummy weights; the automatic kernel choice and the
// 16-bit KV cache (fp32 on the cpu), no scales; its KV cache deferred (allocated with the
// target's block count).
ModelLoadOptions DraftModelLoadOptions(const ModelLoadOptions& target, const std::string& dir);

// InvalidArgument unless the draft model's tokenizer is the target's: both without
// tokenizer.json (null), or the same token string at every id. Checked before either model loads.
Status CheckDraftTokenizer(const Tokenizer* target_tokenizer, const Tokenizer* draft_tokenizer,
                           const std::string& draft_dir);
// InvalidArgument unless the draft model's vocab_size is the target's (its logit rows propose the
// target's token ids).
Status CheckDraftVocabulary(const ModelConfig& target, const ModelConfig& draft,
                            const std::string& draft_dir);

// One sequence's draft-model work in a step.
struct DraftWork {
  Sequence* seq = nullptr;
  // The draft model consumes the tokens at positions [seq->draft_kv_len, end) (known tokens, in
  // blocks the sequence owns alone), then proposes num_propose drafts after them (> 0 only with
  // end == seq->num_tokens(); Schedule has reserved the blocks of positions end .. end +
  // num_propose - 2, where it writes the proposals' K/V).
  int end = 0;
  int num_propose = 0;
};

// Extends seq->draft_kv_len over seq->draft_kv_ahead as far as the sequence's tokens equal them
// (the drafts the target accepted), never past num_computed_tokens (its blocks may have been
// trimmed beyond), and forgets the rest.
void AdvanceDraftKv(Sequence* seq);

class DraftModelProposer {
 public:
  // `draft` has its KV cache (num_kv_blocks() > 0) in blocks of `block_size` tokens.
  DraftModelProposer(std::unique_ptr<Model> draft, int block_size);

  using DeviceJob = ProposerDeviceJob;  // proposer_batch.h
  using JobsIndependent = ProposerJobsIndependent;
  using Choose = ProposerChoose;

  // Runs `work` (each sequence at most once). `choose` is called for each item's drafts in order
  // (draft j after draft j - 1), `device_job` for draft j after `choose` for draft j - 1 unless
  // `independent` says the item's jobs do not read its drafts. On success, each item's sequence
  // has draft_kv_len = end, draft_kv_ahead = its first num_propose - 1 proposals, and
  // draft_ids[0..num_propose) = its proposals. On an error, no sequence is changed and no
  // launched forward is left uncollected.
  Status Run(std::span<const DraftWork> work, const BlockAllocator& allocator,
             const DeviceJob& device_job, const JobsIndependent& independent, const Choose& choose);

  const Model& model() const { return *draft_; }

 private:
  std::unique_ptr<Model> draft_;
  int block_size_;
  std::vector<float> logits_;
  std::vector<int32_t> tokens_;
};

}  // namespace llm
