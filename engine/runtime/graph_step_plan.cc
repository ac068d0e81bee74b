#include "engine/runtime/graph_step_plan.h"

#include <algorithm>

namespace llm {

int GraphSeqBucket(int n, int max_seqs) {
  const int bucket = n <= 4 ? (n <= 1 ? 1 : n <= 2 ? 2 : 4) : (n + 7) / 8 * 8;
  return std::min(bucket, std::max(max_seqs, n));
}

GraphStepPlan PlanGraphStep(const AttentionBatch& a, const GraphLimits& limits) {
  GraphStepPlan plan;
  if (limits.max_seqs <= 0 || a.num_seqs <= 0 || a.num_seqs > limits.max_seqs) return plan;
  int q = 0, q_min = a.num_tokens;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int rows = a.q_indptr[s + 1] - a.q_indptr[s];
    if (rows < 1 || rows > limits.max_q) return plan;
    if (a.page_indptr[s + 1] - a.page_indptr[s] > limits.max_pages_per_seq) return plan;
    q = std::max(q, rows);
    q_min = std::min(q_min, rows);
  }
  if (q_min < q) {
    for (int s = 0; s < a.num_seqs; ++s) {
      if (a.q_indptr[s + 1] - a.q_indptr[s] == q) continue;
      if (a.kv_lens[s] < q) return plan;
      for (int p = a.page_indptr[s]; p < a.page_indptr[s + 1]; ++p) {
        if (a.page_indices[p] < 0) return plan;
      }
    }
    plan.padded = true;
  }
  plan.shape = GraphShape{GraphSeqBucket(a.num_seqs, limits.max_seqs), q};
  return plan;
}

ForwardBatch PadQueryRows(const ForwardBatch& batch, int q) {
  const AttentionBatch& a = batch.attn;
  ForwardBatch out;
  AttentionBatch& o = out.attn;
  o.num_seqs = a.num_seqs;
  o.num_tokens = a.num_seqs * q;
  o.kv_lens = a.kv_lens;
  o.page_indptr = a.page_indptr;
  o.page_indices = a.page_indices;
  o.q_indptr.reserve(a.num_seqs + 1);
  out.token_ids.reserve(o.num_tokens);
  out.positions.reserve(o.num_tokens);
  o.slot_mapping.reserve(o.num_tokens);
  // Where each original row lands: behind its sequence's pad rows.
  std::vector<int32_t> moved(a.num_tokens);
  o.q_indptr.push_back(0);
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q0 = a.q_indptr[s], rows = a.q_indptr[s + 1] - q0, pad = q - rows;
    for (int i = 0; i < pad; ++i) {
      out.token_ids.push_back(0);
      out.positions.push_back(batch.positions[q0] - pad + i);
      o.slot_mapping.push_back(-1);
    }
    for (int r = q0; r < q0 + rows; ++r) {
      moved[r] = static_cast<int32_t>(out.token_ids.size());
      out.token_ids.push_back(batch.token_ids[r]);
      out.positions.push_back(batch.positions[r]);
      o.slot_mapping.push_back(a.slot_mapping[r]);
    }
    o.q_indptr.push_back((s + 1) * q);
  }
  out.logit_rows.reserve(batch.logit_rows.size());
  for (int32_t r : batch.logit_rows) out.logit_rows.push_back(moved[r]);
  out.device_sampled = batch.device_sampled;
  out.sampling_jobs = batch.sampling_jobs;
  out.penalty_indptr = batch.penalty_indptr;
  out.penalties = batch.penalties;
  out.token_masks = batch.token_masks;
  out.mask_words = batch.mask_words;
  out.masks_deferred = batch.masks_deferred;
  return out;
}

}  // namespace llm
