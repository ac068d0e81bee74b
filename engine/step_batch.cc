#include "engine/step_batch.h"

#include "base/check.h"

namespace llm {

StepBatch BuildStepBatch(const SchedulerOutput& sched, const BlockAllocator& allocator,
                         int block_size, bool device_sampling, const DeviceJobFn& device_job) {
  StepBatch out;
  ForwardBatch& batch = out.forward;
  AttentionBatch& attn = batch.attn;
  attn.q_indptr.push_back(0);
  attn.page_indptr.push_back(0);
  if (device_sampling) batch.penalty_indptr.push_back(0);
  std::vector<int32_t> draft_rows;  // batch rows of the drafted sequences' logit rows
  for (size_t k = 0; k < sched.seqs.size(); ++k) {
    const ScheduledSeq& s = sched.seqs[k];
    const Sequence& seq = *s.seq;
    out.step_seq.push_back(seq.id);
    for (int i = s.start; i < s.start + s.num_tokens; ++i) {
      const int32_t block = seq.block_table[i / block_size];
      // A shared (prefix-cached) block is immutable: writing it would corrupt other sequences.
      LLM_CHECK_EQ(allocator.ref_count(block), 1) << "write into shared block";
      batch.token_ids.push_back(seq.token_at(i));
      batch.positions.push_back(i);
      attn.slot_mapping.push_back(block * block_size + i % block_size);
    }
    const int kv_len = s.start + s.num_tokens;
    attn.kv_lens.push_back(kv_len);
    attn.q_indptr.push_back(static_cast<int32_t>(batch.token_ids.size()));
    const int pages = BlocksForTokens(kv_len, block_size);
    attn.page_indices.insert(attn.page_indices.end(), seq.block_table.begin(),
                             seq.block_table.begin() + pages);
    attn.page_indptr.push_back(static_cast<int32_t>(attn.page_indices.size()));
    if (!s.samples) continue;
    if (s.num_draft > 0) {
      out.drafted.push_back(
          {k, seq.id, static_cast<int32_t>(draft_rows.size()), s.num_draft, false});
      const int32_t end = static_cast<int32_t>(batch.token_ids.size());
      for (int32_t r = end - 1 - s.num_draft; r < end; ++r) draft_rows.push_back(r);
      continue;
    }
    out.row_seq.push_back(seq.id);
    out.row_step.push_back(k);
    batch.logit_rows.push_back(static_cast<int32_t>(batch.token_ids.size()) - 1);
    if (device_sampling) {
      SamplingJob job{};
      const bool on_device = device_job(k, seq, -1, &job, &batch);
      batch.device_sampled.push_back(on_device ? 1 : 0);
      batch.sampling_jobs.push_back(on_device ? job : SamplingJob{});
      batch.penalty_indptr.push_back(static_cast<int32_t>(batch.penalties.size()));
    }
  }
  const int32_t plain_rows = static_cast<int32_t>(batch.logit_rows.size());
  for (StepBatch::DraftRows& d : out.drafted) {
    d.first_row += plain_rows;
    const Sequence& seq = *sched.seqs[d.step].seq;
    for (int j = 0; j <= d.num_draft; ++j) {
      batch.logit_rows.push_back(draft_rows[d.first_row - plain_rows + j]);
      if (!device_sampling) continue;
      SamplingJob job{};
      if (j == 0)
        d.on_device = device_job(d.step, seq, 0, &job, &batch);
      else if (d.on_device)
        LLM_CHECK(device_job(d.step, seq, j, &job, &batch)) << "draft row " << j;
      batch.device_sampled.push_back(d.on_device ? 1 : 0);  // else logits back to the host
      batch.sampling_jobs.push_back(d.on_device ? job : SamplingJob{});
      batch.penalty_indptr.push_back(static_cast<int32_t>(batch.penalties.size()));
    }
  }
  attn.num_seqs = static_cast<int>(sched.seqs.size());
  attn.num_tokens = static_cast<int>(batch.token_ids.size());
  return out;
}

}  // namespace llm
