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

}  // namespace llm
