#include "engine/speculative/proposer_batch.h"

#include "base/check.h"

namespace llm {

ForwardBatch EmptyProposerBatch() {
  ForwardBatch b;
  b.attn.q_indptr.push_back(0);
  b.attn.page_indptr.push_back(0);
  return b;
}

void AppendProposerRows(const Sequence& seq, int from, int to, std::span<const int32_t> tokens,
                        int block_size, const BlockAllocator& allocator, ForwardBatch* b) {
  AttentionBatch& a = b->attn;
  for (int p = from; p < to; ++p) {
    const int32_t block = seq.block_table[p / block_size];
    LLM_CHECK(block >= 0 && allocator.ref_count(block) == 1)
        << "proposer write into block " << block << " of sequence " << seq.id;
    b->token_ids.push_back(tokens[p - from]);
    b->positions.push_back(p);
    a.slot_mapping.push_back(block * block_size + p % block_size);
  }
  a.kv_lens.push_back(to);
  a.q_indptr.push_back(static_cast<int32_t>(b->token_ids.size()));
  const int pages = BlocksForTokens(to, block_size);
  a.page_indices.insert(a.page_indices.end(), seq.block_table.begin(),
                        seq.block_table.begin() + pages);
  a.page_indptr.push_back(static_cast<int32_t>(a.page_indices.size()));
  ++a.num_seqs;
}

void AppendProposerJobs(const std::vector<size_t>& items, int j, bool on_device,
                        const ProposerDeviceJob& device_job, ForwardBatch* b) {
  if (!on_device) return;
  b->penalty_indptr.push_back(0);
  for (size_t i : items) {
    SamplingJob job{};
    const bool drawn = device_job(i, j, &job, &b->penalties);
    b->device_sampled.push_back(drawn ? 1 : 0);
    b->sampling_jobs.push_back(drawn ? job : SamplingJob{});
    b->penalty_indptr.push_back(static_cast<int32_t>(b->penalties.size()));
  }
}

bool AllRowsDrawn(const ForwardBatch& b) {
  if (b.logit_rows.empty() || b.device_sampled.size() != b.logit_rows.size()) return false;
  for (uint8_t d : b.device_sampled) {
    if (!d) return false;
  }
  return true;
}

void PickProposals(const std::vector<size_t>& items, std::span<const int32_t> tokens,
                   std::span<float> logits, int vocab, const ProposerChoose& choose,
                   std::vector<std::vector<int32_t>>* proposals) {
  for (size_t r = 0; r < items.size(); ++r) {
    const size_t i = items[r];
    const int32_t drawn = r < tokens.size() ? tokens[r] : -1;
    const std::span<float> row =
        drawn >= 0 ? std::span<float>() : logits.subspan(r * static_cast<size_t>(vocab), vocab);
    (*proposals)[i].push_back(choose(i, static_cast<int>((*proposals)[i].size()), drawn, row));
  }
}

}  // namespace llm
