#include "engine/speculative/draft_model_proposer.h"

#include <algorithm>

#include "base/check.h"
#include "engine/speculative/proposer_batch.h"

namespace llm {

ModelLoadOptions DraftModelLoadOptions(const ModelLoadOptions& target, const std::string& dir) {
  ModelLoadOptions o;  // the defaults: automatic kernels, the 16-bit (cpu: fp32) cache, no scales
  o.model_dir = dir;
  o.device = target.device;
  o.block_size = target.block_size;
  o.dummy_weights = target.dummy_weights;
  o.cuda_graph_max_batch = target.cuda_graph_max_batch;
  o.cuda_graph_warmup = target.cuda_graph_warmup;
  // Its one-token proposal steps replay decode graphs; its catch-up steps consume one token per
  // sequence (a draft rejected) or two (every draft accepted: the last draft, whose K/V it never
  // wrote, and the target's token), so with speculation they replay graphs of up to two rows.
  o.cuda_graph_max_query_rows = std::min(target.cuda_graph_max_query_rows, 2);
  o.weight_dtype = target.weight_dtype;
  o.fp8_fast_accumulation = target.fp8_fast_accumulation;
  o.defer_kv_cache = true;
  return o;
}

Status CheckDraftVocabulary(const ModelConfig& target, const ModelConfig& draft,
                            const std::string& draft_dir) {
  if (draft.vocab_size == target.vocab_size) return Status::Ok();
  return InvalidArgument("the draft model " + draft_dir + " has vocab_size " +
                         std::to_string(draft.vocab_size) + ", the target " +
                         std::to_string(target.vocab_size) +
                         "; a draft model must share the target's vocabulary");
}

Status CheckDraftTokenizer(const Tokenizer* target_tokenizer, const Tokenizer* draft_tokenizer,
                           const std::string& draft_dir) {
  const std::string which = "the draft model " + draft_dir;
  if ((target_tokenizer == nullptr) != (draft_tokenizer == nullptr)) {
    return InvalidArgument(which +
                           (draft_tokenizer ? " has a tokenizer.json and the target has none"
                                            : " has no tokenizer.json to compare with "
                                              "the target's") +
                           "; a draft model must share the target's tokenizer");
  }
  if (target_tokenizer == nullptr) return Status::Ok();
  if (draft_tokenizer->vocab_size() != target_tokenizer->vocab_size()) {
    return InvalidArgument(
        which + "'s tokenizer has " + std::to_string(draft_tokenizer->vocab_size()) +
        " tokens, the target's " + std::to_string(target_tokenizer->vocab_size()) +
        "; a draft model must share the target's tokenizer");
  }
  for (int32_t id = 0; id < target_tokenizer->vocab_size(); ++id) {
    const std::string* a = target_tokenizer->TokenString(id);
    const std::string* b = draft_tokenizer->TokenString(id);
    if ((a == nullptr) != (b == nullptr) || (a != nullptr && *a != *b)) {
      return InvalidArgument(which + "'s tokenizer has token " + std::to_string(id) + " '" +
                             (b ? *b : "") + "' where the target's has '" + (a ? *a : "") +
                             "'; a draft model must share the target's tokenizer");
    }
  }
  return Status::Ok();
}

void AdvanceDraftKv(Sequence* seq) {
  const int limit = std::min(seq->num_computed_tokens, seq->num_tokens());
  for (int32_t t : seq->draft_kv_ahead) {
    const int p = seq->draft_kv_len;
    if (p >= limit || seq->token_at(p) != t) break;
    ++seq->draft_kv_len;
  }
  seq->draft_kv_ahead.clear();
}

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> draft, int block_size)
    : draft_(std::move(draft)), block_size_(block_size) {
  LLM_CHECK(draft_->num_kv_blocks() > 0) << "the draft model has no KV cache";
}

Status DraftModelProposer::Run(std::span<const DraftWork> work, const BlockAllocator& allocator,
                               const DeviceJob& device_job, const Choose& choose) {
  if (work.empty()) return Status::Ok();
  const int vocab = draft_->config().vocab_size;
  const bool on_device = draft_->samples_on_device();
  std::vector<std::vector<int32_t>> proposals(work.size());
  // A forward whose logit rows are one per item of `items`, in order: each item's next draft.
  auto forward_and_pick = [&](const std::vector<size_t>& items, ForwardBatch* b) -> Status {
    AppendProposerJobs(items, proposals, on_device, device_job, b);
    b->attn.num_tokens = static_cast<int>(b->token_ids.size());
    LLM_RETURN_IF_ERROR(draft_->ForwardSampled(*b, &logits_, &tokens_));
    PickProposals(items, tokens_, logits_, vocab, choose, &proposals);
    return Status::Ok();
  };

  // The tokens each sequence's draft K/V lacks, in one prefill-like forward; the last row of a
  // proposing sequence gives its first draft.
  ForwardBatch b = EmptyProposerBatch();
  std::vector<size_t> rows_of;  // the item of each logit row
  for (size_t i = 0; i < work.size(); ++i) {
    const DraftWork& w = work[i];
    const Sequence& seq = *w.seq;
    const int from = seq.draft_kv_len;
    LLM_CHECK(from < w.end && w.end <= seq.num_tokens())
        << "draft work [" << from << ", " << w.end << ") of sequence " << seq.id;
    LLM_CHECK(w.num_propose == 0 || w.end == seq.num_tokens())
        << "sequence " << seq.id << " proposes before its last token";
    std::vector<int32_t> tokens;
    for (int p = from; p < w.end; ++p) tokens.push_back(seq.token_at(p));
    AppendProposerRows(seq, from, w.end, tokens, block_size_, allocator, &b);
    if (w.num_propose > 0) {
      b.logit_rows.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
      rows_of.push_back(i);
    }
  }
  LLM_RETURN_IF_ERROR(forward_and_pick(rows_of, &b));

  // The other drafts: one token per proposing sequence and forward, the previous draft at the
  // position after it (its K/V lands in a block Schedule reserved for the drafts).
  for (int j = 1;; ++j) {
    ForwardBatch s = EmptyProposerBatch();
    std::vector<size_t> items;
    for (size_t i = 0; i < work.size(); ++i) {
      const DraftWork& w = work[i];
      if (w.num_propose <= j) continue;
      const int p = w.end + j - 1;
      const int32_t token = proposals[i][j - 1];
      AppendProposerRows(*w.seq, p, p + 1, std::span<const int32_t>(&token, 1), block_size_,
                         allocator, &s);
      s.logit_rows.push_back(static_cast<int32_t>(s.token_ids.size()) - 1);
      items.push_back(i);
    }
    if (items.empty()) break;
    LLM_RETURN_IF_ERROR(forward_and_pick(items, &s));
  }

  for (size_t i = 0; i < work.size(); ++i) {
    const DraftWork& w = work[i];
    Sequence& seq = *w.seq;
    seq.draft_kv_len = w.end;
    seq.draft_kv_ahead.clear();
    if (w.num_propose == 0) continue;
    LLM_CHECK(static_cast<int>(seq.draft_ids.size()) >= w.num_propose)
        << "sequence " << seq.id << " has room for " << seq.draft_ids.size() << " drafts, not "
        << w.num_propose;
    std::copy(proposals[i].begin(), proposals[i].end(), seq.draft_ids.begin());
    seq.draft_kv_ahead.assign(proposals[i].begin(), proposals[i].end() - 1);
  }
  return Status::Ok();
}

}  // namespace llm
