// The forward batch of a proposer network whose K/V lives in the target's blocks (the draft
// model, an MTP layer): rows of a sequence at consecutive positions, written and attended through
// the sequence's own block table.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/runtime/model.h"
#include "kvcache/block_allocator.h"
#include "scheduler/sequence.h"

namespace llm {

// How the engine turns a proposer network's rows into drafts. On a network that samples on the
// device: whether item `item`'s j-th draft is drawn there (only its token comes back), with *job
// and its penalty entries (appended to *penalties); false: its logits come back.
using ProposerDeviceJob =
    std::function<bool(size_t item, int j, SamplingJob* job, std::vector<PenaltyEntry>* penalties)>;
// Item `item`'s j-th draft: `device_token` when the device drew it (>= 0, `logits` empty), else
// chosen from the network's logits of that row (processed in place).
using ProposerChoose =
    std::function<int32_t(size_t item, int j, int32_t device_token, std::span<float> logits)>;
// Whether item `item`'s device jobs never read its earlier drafts' values (no penalty entries
// count them): its j-th job may then be asked for before drafts 0..j-1 are chosen, while the
// forward that draws draft j - 1 still runs.
using ProposerJobsIndependent = std::function<bool(size_t item)>;

// An empty batch (q_indptr and page_indptr start at 0).
ForwardBatch EmptyProposerBatch();

// Appends one sequence's rows at positions [from, to) with their tokens (tokens[p - from]) as one
// attention sequence of kv length `to`. Every written slot must be in a block the sequence owns
// alone (CHECKed: a prefix-cached block is immutable, and the scheduler publishes blocks only
// behind Sequence::draft_kv_len).
void AppendProposerRows(const Sequence& seq, int from, int to, std::span<const int32_t> tokens,
                        int block_size, const BlockAllocator& allocator, ForwardBatch* b);

// The device sampling jobs of a forward whose logit rows are one per item of `items`, in order:
// each item's j-th draft. Nothing on a network that samples on the host (on_device false).
void AppendProposerJobs(const std::vector<size_t>& items, int j, bool on_device,
                        const ProposerDeviceJob& device_job, ForwardBatch* b);

// Whether a forward's every logit row is drawn on the device (false without logit rows): the
// rows a launched forward may have (Model::Launch) and the next forward may feed back.
bool AllRowsDrawn(const ForwardBatch& b);

// After that forward: each item's next draft (the device's token where it drew one, `tokens[r]`
// >= 0, else `choose` over logit row r of `vocab` values), appended to (*proposals)[item].
void PickProposals(const std::vector<size_t>& items, std::span<const int32_t> tokens,
                   std::span<float> logits, int vocab, const ProposerChoose& choose,
                   std::vector<std::vector<int32_t>>* proposals);

}  // namespace llm
