// The model inputs of one engine step, built from the scheduler's plan: token ids, positions,
// the attention batch (KV slots, block tables, lengths) and the logit rows, with each row's
// device-sampling job when the model samples on the device. Pure construction: no request state
// changes here (EngineCore records queue times and streams tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/runtime/model.h"
#include "kvcache/block_allocator.h"
#include "scheduler/scheduler.h"

namespace llm {

struct StepBatch {
  ForwardBatch forward;
  std::vector<int64_t> step_seq;  // every scheduled sequence, in batch order
  std::vector<int64_t> row_seq;   // the sequence of each logit row without drafts
  std::vector<size_t> row_step;   // each such row's index in step_seq (and in sched.seqs)
  // Speculative decoding: a sequence that computes drafts (ScheduledSeq::num_draft > 0) has
  // 1 + num_draft consecutive logit rows, the distributions after its last token and after each
  // draft. They come after every row of row_seq and are not in row_seq. Either all of them are
  // device-sampled (each row drawn from the target's distribution after the drafts before it:
  // the host compares the tokens with the drafts) or none (their logits come back and the host
  // verifies the drafts against them).
  struct DraftRows {
    size_t step = 0;  // index in step_seq
    int64_t seq = 0;
    int32_t first_row = 0;  // logit row of the position before the first draft
    int num_draft = 0;
    bool on_device = false;
  };
  std::vector<DraftRows> drafted;
  // Constrained device-sampled rows: their masks (rows of forward.token_masks) are filled once
  // the previous step's tokens are known (EngineCore::FillMasks).
  struct MaskRow {
    size_t row;        // logit row
    int32_t mask_row;  // SamplingJob::mask_row
  };
  std::vector<MaskRow> mask_rows;
  // MTP (EngineCore::RequestHiddenRows): per step_seq entry, its first row in
  // forward.hidden_rows (its rows in batch order), or -1 when its hidden states are not wanted.
  std::vector<int32_t> hidden_first_row;
};

// The device-sampling job of a sequence's logit row (`step_index`: the sequence's index in
// sched.seqs): appends the row's penalty entries to batch->penalties and returns true with *job
// filled when the row is drawn on the device; false when its logits must come back to the host
// (logprobs, a logits observer). A constrained row appends room for its token mask to the batch
// (ForwardBatch::token_masks, mask_words words) and points job->mask_row at it. `draft_row`: -1
// for a sequence's one logit row; for a drafted sequence, j in [0, num_draft] for its row after
// the first j drafts (asked in order; the sequence's rows go to the device only if row 0 does, and
// then every later row must too).
using DeviceJobFn = std::function<bool(size_t step_index, const Sequence& seq, int draft_row,
                                       SamplingJob* job, ForwardBatch* batch)>;

// Builds the step's inputs. With `device_sampling` false, no jobs are built and device_job is not
// called. Every written slot must be in a block this sequence owns alone (CHECKed: a shared,
// prefix-cached block is immutable).
StepBatch BuildStepBatch(const SchedulerOutput& sched, const BlockAllocator& allocator,
                         int block_size, bool device_sampling, const DeviceJobFn& device_job);

}  // namespace llm
