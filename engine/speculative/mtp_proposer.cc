#include "engine/speculative/mtp_proposer.h"

#include <algorithm>

#include "base/check.h"

namespace llm {

MtpProposer::MtpProposer(std::unique_ptr<Model> mtp, int block_size)
    : mtp_(std::move(mtp)), block_size_(block_size) {
  LLM_CHECK(mtp_->num_kv_blocks() > 0) << "the MTP layer has no KV cache";
  LLM_CHECK(mtp_->returns_hidden_states()) << "the MTP layer returns no hidden states";
}

void MtpProposer::KeepHidden(const Sequence& seq, int begin, std::span<const float> rows) {
  if (rows.empty()) return;
  auto it = kept_.find(seq.id);
  if (it == kept_.end() || begin < it->second.begin || begin > kept_end(it->second)) {
    kept_[seq.id] = Kept{begin, std::vector<float>(rows.begin(), rows.end())};
    return;
  }
  Kept& k = it->second;
  k.rows.resize(static_cast<size_t>(begin - k.begin) * hidden_size());  // recomputed positions
  k.rows.insert(k.rows.end(), rows.begin(), rows.end());
}

void MtpProposer::ForgetIf(const std::function<bool(int64_t seq_id)>& gone) {
  std::erase_if(kept_, [&](const auto& e) { return gone(e.first); });
}

int MtpProposer::KeptEnd(const Sequence& seq) const {
  auto it = kept_.find(seq.id);
  if (it == kept_.end()) return seq.draft_kv_len;
  const Kept& k = it->second;
  const int end = kept_end(k);
  return k.begin <= seq.draft_kv_len && seq.draft_kv_len <= end ? end : seq.draft_kv_len;
}

Status MtpProposer::Run(std::span<const DraftWork> work, const BlockAllocator& allocator,
                        const ProposerDeviceJob& device_job, const ProposerChoose& choose) {
  if (work.empty()) return Status::Ok();
  const int vocab = mtp_->config().vocab_size;
  const int H = hidden_size();
  const bool on_device = mtp_->samples_on_device();
  std::vector<std::vector<int32_t>> proposals(work.size());
  std::vector<std::vector<float>> chained(work.size());  // the last proposing row's output
  // Forwards `b`, whose logit rows (and hidden rows) are one per item of `items`, and picks each
  // item's next draft (its j-th); keeps each row's output before the final norm for the next link.
  auto forward_and_pick = [&](const std::vector<size_t>& items, int j, ForwardBatch* b) -> Status {
    AppendProposerJobs(items, j, on_device, device_job, b);
    b->attn.num_tokens = static_cast<int>(b->token_ids.size());
    b->hidden_rows = b->logit_rows;
    b->hidden_before_final_norm = true;
    LLM_RETURN_IF_ERROR(mtp_->ForwardSampled(*b, &logits_, &tokens_));
    const std::span<const float> out = mtp_->hidden_states();
    for (size_t r = 0; r < items.size(); ++r) {
      chained[items[r]].assign(out.begin() + r * H, out.begin() + (r + 1) * H);
    }
    PickProposals(items, tokens_, logits_, vocab, choose, &proposals);
    return Status::Ok();
  };

  // The rows each sequence's MTP K/V lacks: position p reads t_{p+1} and the target's h_p.
  ForwardBatch b = EmptyProposerBatch();
  std::vector<size_t> rows_of;
  for (size_t i = 0; i < work.size(); ++i) {
    const DraftWork& w = work[i];
    const Sequence& seq = *w.seq;
    const int from = seq.draft_kv_len;
    LLM_CHECK(from < w.end && w.end < seq.num_tokens() && KeptEnd(seq) >= w.end)
        << "MTP work [" << from << ", " << w.end << ") of sequence " << seq.id << " with "
        << seq.num_tokens() << " tokens, hidden states to " << KeptEnd(seq);
    LLM_CHECK(w.num_propose == 0 || w.end == seq.num_tokens() - 1)
        << "sequence " << seq.id << " proposes before its last token";
    std::vector<int32_t> tokens;
    for (int p = from; p < w.end; ++p) tokens.push_back(seq.token_at(p + 1));
    AppendProposerRows(seq, from, w.end, tokens, block_size_, allocator, &b);
    const Kept& k = kept_.at(seq.id);
    const auto first = k.rows.begin() + static_cast<size_t>(from - k.begin) * H;
    b.input_hidden.insert(b.input_hidden.end(), first,
                          first + static_cast<size_t>(w.end - from) * H);
    if (w.num_propose > 0) {
      b.logit_rows.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
      rows_of.push_back(i);
    }
  }
  LLM_RETURN_IF_ERROR(forward_and_pick(rows_of, 0, &b));

  // The chain: the row after the last one reads the previous draft and that row's output (its
  // K/V lands in a block Schedule reserved for the drafts, past draft_kv_len: never kept).
  for (int j = 1;; ++j) {
    ForwardBatch s = EmptyProposerBatch();
    std::vector<size_t> items;
    for (size_t i = 0; i < work.size(); ++i) {
      const DraftWork& w = work[i];
      if (w.num_propose <= j) continue;
      const int p = w.end - 1 + j;
      const int32_t token = proposals[i][j - 1];
      AppendProposerRows(*w.seq, p, p + 1, std::span<const int32_t>(&token, 1), block_size_,
                         allocator, &s);
      s.input_hidden.insert(s.input_hidden.end(), chained[i].begin(), chained[i].end());
      s.logit_rows.push_back(static_cast<int32_t>(s.token_ids.size()) - 1);
      items.push_back(i);
    }
    if (items.empty()) break;
    LLM_RETURN_IF_ERROR(forward_and_pick(items, j, &s));
  }

  for (size_t i = 0; i < work.size(); ++i) {
    const DraftWork& w = work[i];
    Sequence& seq = *w.seq;
    seq.draft_kv_len = w.end;
    seq.draft_kv_ahead.clear();
    Kept& k = kept_.at(seq.id);
    k.rows.erase(k.rows.begin(), k.rows.begin() + static_cast<size_t>(w.end - k.begin) * H);
    k.begin = w.end;
    if (w.num_propose == 0) continue;
    LLM_CHECK(static_cast<int>(seq.draft_ids.size()) >= w.num_propose)
        << "sequence " << seq.id << " has room for " << seq.draft_ids.size() << " drafts, not "
        << w.num_propose;
    std::copy(proposals[i].begin(), proposals[i].end(), seq.draft_ids.begin());
  }
  return Status::Ok();
}

}  // namespace llm
