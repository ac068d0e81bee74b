#include "engine/speculative/draft_model_proposer.h"

#include <algorithm>
#include <deque>
#include <string>

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
  o.max_step_rows = target.max_step_rows;  // its catch-up steps bring the target's prompts
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

namespace {

// The draft model's forwards of one Run, in order. A forward whose every row is drawn on the
// device, on a model that overlaps steps, is launched and collected only once the next one is
// queued behind it (which may read its tokens as fed-back ids), so the device never waits for the
// host between them; any other forward runs synchronously. Each forward's drafts are picked in
// issue order, so `choose` sees an item's drafts in order.
class ProposalChain {
 public:
  ProposalChain(Model& model, const ProposerChoose& choose,
                std::vector<std::vector<int32_t>>* proposals, std::vector<float>* logits,
                std::vector<int32_t>* tokens)
      : model_(model),
        vocab_(model.config().vocab_size),
        choose_(choose),
        proposals_(proposals),
        logits_(logits),
        tokens_(tokens) {}

  // Whether a launched forward is not collected yet (its drafts not picked).
  bool launched() const { return !launched_.empty(); }

  // Issues `b`, whose logit rows are one per item of `items`; its token ids may feed back the
  // previous forward's rows only if that one was launched and `b` is drawn on the device.
  Status Issue(const std::vector<size_t>& items, ForwardBatch* b) {
    b->attn.num_tokens = static_cast<int>(b->token_ids.size());
    if (model_.supports_overlap() && AllRowsDrawn(*b)) {
      LLM_RETURN_IF_ERROR(model_.Launch(*b));
      launched_.push_back(items);
      // The previous forward, collected while this one runs.
      return launched_.size() > 1 ? CollectOldest() : Status::Ok();
    }
    LLM_RETURN_IF_ERROR(CollectAll());
    LLM_RETURN_IF_ERROR(model_.ForwardSampled(*b, logits_, tokens_));
    PickProposals(items, *tokens_, *logits_, vocab_, choose_, proposals_);
    return Status::Ok();
  }

  // Collects every launched forward and picks its drafts.
  Status CollectAll() {
    while (!launched_.empty()) LLM_RETURN_IF_ERROR(CollectOldest());
    return Status::Ok();
  }

  // After a failure: collects what is still launched, its tokens unused, so that nothing of this
  // Run still runs on the device when the next forward is issued.
  void Abandon() {
    std::vector<int32_t> unused;
    for (; !launched_.empty(); launched_.pop_front()) (void)model_.Collect(&unused);
  }

 private:
  Status CollectOldest() {
    const std::vector<size_t> items = std::move(launched_.front());
    launched_.pop_front();  // collected or failed: no longer on the device
    LLM_RETURN_IF_ERROR(model_.Collect(tokens_));
    if (tokens_->size() != items.size() ||
        std::any_of(tokens_->begin(), tokens_->end(), [](int32_t t) { return t < 0; })) {
      return Internal("a launched draft forward returned " + std::to_string(tokens_->size()) +
                      " tokens for " + std::to_string(items.size()) + " device-drawn rows");
    }
    PickProposals(items, *tokens_, {}, vocab_, choose_, proposals_);
    return Status::Ok();
  }

  Model& model_;
  const int vocab_;
  const ProposerChoose& choose_;
  std::vector<std::vector<int32_t>>* proposals_;
  std::vector<float>* logits_;
  std::vector<int32_t>* tokens_;
  std::deque<std::vector<size_t>> launched_;  // the items of each launched forward, oldest first
};

}  // namespace

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> draft, int block_size)
    : draft_(std::move(draft)), block_size_(block_size) {
  LLM_CHECK(draft_->num_kv_blocks() > 0) << "the draft model has no KV cache";
}

Status DraftModelProposer::Run(std::span<const DraftWork> work, const BlockAllocator& allocator,
                               const DeviceJob& device_job, const JobsIndependent& independent,
                               const Choose& choose) {
  if (work.empty()) return Status::Ok();
  const bool on_device = draft_->samples_on_device();
  std::vector<std::vector<int32_t>> proposals(work.size());
  ProposalChain chain(*draft_, choose, &proposals, &logits_, &tokens_);
  const Status st = [&]() -> Status {
    // The tokens each sequence's draft K/V lacks, in one prefill-like forward; the last row of a
    // proposing sequence gives its first draft.
    ForwardBatch b = EmptyProposerBatch();
    std::vector<size_t> items;  // the item of each logit row of the last forward issued
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
        items.push_back(i);
      }
    }
    AppendProposerJobs(items, 0, on_device, device_job, &b);
    LLM_RETURN_IF_ERROR(chain.Issue(items, &b));

    // The other drafts: one token per proposing sequence and forward, the previous draft at the
    // position after it (its K/V lands in a block Schedule reserved for the drafts).
    for (int j = 1;; ++j) {
      std::vector<size_t> next;  // a subset of `items`, also in work order
      for (size_t i : items) {
        if (work[i].num_propose > j) next.push_back(i);
      }
      if (next.empty()) break;
      // Forward j is queued behind a launched forward j - 1, whose drafts it reads on the device,
      // when its jobs are known without them and it is drawn on the device; otherwise the host
      // collects forward j - 1 first (before the jobs, where they count its drafts).
      if (!std::all_of(next.begin(), next.end(), [&](size_t i) { return independent(i); })) {
        LLM_RETURN_IF_ERROR(chain.CollectAll());
      }
      ForwardBatch s = EmptyProposerBatch();
      AppendProposerJobs(next, j, on_device, device_job, &s);
      for (size_t i : next) {
        const DraftWork& w = work[i];
        const int p = w.end + j - 1;
        const int32_t unknown = 0;  // the previous draft, set below
        AppendProposerRows(*w.seq, p, p + 1, std::span<const int32_t>(&unknown, 1), block_size_,
                           allocator, &s);
        s.logit_rows.push_back(static_cast<int32_t>(s.token_ids.size()) - 1);
      }
      const bool fed_back = chain.launched() && AllRowsDrawn(s);
      if (!fed_back) LLM_RETURN_IF_ERROR(chain.CollectAll());
      // Row k (item next[k]) reads the previous draft: on the device, the token forward j - 1
      // drew at the item's logit row r there; else the host's.
      for (size_t k = 0, r = 0; k < next.size(); ++k) {
        const size_t i = next[k];
        while (items[r] != i) ++r;
        s.token_ids[k] = fed_back ? -static_cast<int32_t>(r + 1) : proposals[i][j - 1];
      }
      LLM_RETURN_IF_ERROR(chain.Issue(next, &s));
      items = std::move(next);
    }
    return chain.CollectAll();
  }();
  if (!st.ok()) {
    chain.Abandon();
    return st;
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
