// EngineCore's speculative-decoding steps (issue 52): drafts before the schedule, verification
// after the forward. The acceptance rule is engine/speculative/rejection_sampler.h; the scheduler
// computes the drafts with the sequence's last token (ScheduledSeq::num_draft) and trims the
// rejected positions' blocks (Scheduler::CommitDrafts).
#include <chrono>
#include <optional>

#include <spdlog/spdlog.h>

#include "engine/engine_core.h"
#include "engine/sampling/token_mask.h"
#include "engine/speculative/rejection_sampler.h"

namespace llm {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool HasPenalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

// Counts one more generated `token` in a row's penalty entries (as Sampler::UpdatePenalties
// would after the token were appended).
void CountGenerated(std::vector<PenaltyEntry>* entries, int32_t token) {
  for (PenaltyEntry& e : *entries) {
    if (e.token != token) continue;
    e.generated_count = e.generated_count < 0 ? 1 : e.generated_count + 1;
    return;
  }
  entries->push_back({token, 1, 0.0f});
}

}  // namespace

bool EngineCore::Speculates(const RequestState& st) const {
  return proposer_.has_value() && !speculation_paused_ && st.request.speculative_decoding;
}

void EngineCore::ProposeDrafts(StepRecord* record) {
  if (!proposer_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int limit = config_.speculative.disable_by_batch_size;
  const int load = scheduler_->num_running() + scheduler_->num_waiting();
  const bool paused = limit > 0 && load > limit;
  if (paused != speculation_paused_) {
    spdlog::info("speculative decoding {}: {} requests running or waiting, limit {}",
                 paused ? "paused" : "resumed", load, limit);
    speculation_paused_ = paused;
  }
  for (auto& [id, st] : requests_) {
    if (st.held) continue;
    Sequence* seq = scheduler_->Find(st.seq_id);
    if (seq == nullptr) continue;
    seq->draft_ids.clear();
    if (!Speculates(st)) continue;
    // Only a decoding sequence whose tokens the host has all read drafts.
    if (seq->state != SequenceState::kRunning || seq->has_pending_token() ||
        seq->num_tokens() - seq->num_computed_tokens != 1) {
      continue;
    }
    seq->draft_ids = proposer_->Propose(seq->AllTokens());
  }
  record->draft_s = SecondsSince(t0);
}

void EngineCore::EmitDrafted(const StepBatch& in, const StepStates& states, StepRecord* record) {
  if (in.drafted.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int vocab = model_->config().vocab_size;
  for (const StepBatch::DraftRows& d : in.drafted) {
    Sequence* seq = scheduler_->Find(d.seq);
    if (seq == nullptr) continue;  // ended while earlier rows were streamed
    RequestState& rs = *states[d.step];
    const std::vector<int32_t> draft(seq->draft_ids.begin(), seq->draft_ids.begin() + d.num_draft);
    const SamplingParams& params = rs.request.sampling;
    // Position j's row: the distribution after the context and draft[0..j). Its penalties count
    // the drafts before it as generated; each row is processed once, in place (the logprobs read
    // the processed logits, as the sampler reports them).
    std::vector<PenaltyEntry> penalties;
    const SamplingJob job = rs.sampler->DeviceJob(seq->prompt_ids, seq->output_ids, &penalties);
    std::vector<std::optional<KeptDistribution>> rows(draft.size() + 1);
    // A grammar masks each row with its state after the drafts before it: the matcher takes the
    // drafts tentatively as rows are asked for (a row is asked for only when the draft before it
    // was accepted, so the mask allowed it), and gives them back before the tokens are emitted.
    int tentative = 0;
    auto row_logits = [&](int j) {
      return std::span<float>(logits_scratch_.data() + static_cast<size_t>(d.first_row + j) * vocab,
                              vocab);
    };
    auto target = [&](int j) -> const KeptDistribution& {
      if (!rows[j]) {
        std::vector<PenaltyEntry> entries = penalties;
        if (HasPenalties(params)) {
          for (int i = 0; i < j; ++i) CountGenerated(&entries, draft[i]);
        }
        const std::span<float> l = row_logits(j);
        if (rs.matcher) {
          bool in_grammar = true;
          while (in_grammar && tentative < j) {
            in_grammar = rs.matcher->AcceptToken(draft[tentative]);
            tentative += in_grammar ? 1 : 0;
          }
          // Once the grammar has ended (an accepted EOS), the request ends at that token and
          // later rows are never emitted: they stay unmasked. A draft the grammar refuses could
          // only be accepted from a row the mask emptied; emitting it fails the request below.
          if (in_grammar && !rs.matcher->IsTerminated()) {
            rs.matcher->FillNextTokenBitmask(rs.mask.data());
            ApplyTokenMask(l, rs.mask.data(), rs.matcher->compiled().vocab().size());
          }
        }
        if (logits_observer_) logits_observer_(rs.request.request_id, l);
        rows[j] = SamplingDistribution(l, job, entries);
      }
      return *rows[j];
    };
    const VerifyResult v = params.greedy()
                               ? VerifyGreedy(draft, [&](int j) { return target(j).ids[0]; })
                               : VerifySampled(
                                     draft, [&](int j) { return ToTokenProbs(target(j)); }, nullptr,
                                     [&] { return rs.sampler->NextUniform(); });
    if (rs.matcher) rs.matcher->Rollback(tentative);
    record->num_drafts++;
    record->num_draft_tokens += d.num_draft;
    record->num_accepted_tokens += v.num_accepted;
    // The accepted drafts and the token after them go through the one per-token path.
    bool ended = false;
    for (size_t j = 0; j < v.tokens.size(); ++j) {
      SampledToken tok;
      tok.token = v.tokens[j];
      if (params.logprobs > 0) {
        ComputeLogprobs(row_logits(static_cast<int>(j)), tok.token, params.logprobs, &tok);
      }
      if (rs.matcher && !rs.matcher->AcceptToken(tok.token)) {
        Fail(rs.request.request_id, GrammarRefused(tok.token));
        ended = true;
        break;
      }
      seq->output_ids.push_back(tok.token);
      OnToken(rs, *seq, tok);  // may finish the request: rs and seq die with it
      if (scheduler_->Find(d.seq) == nullptr) {
        ended = true;
        break;
      }
    }
    if (!ended) scheduler_->CommitDrafts(seq, v.num_accepted);
  }
  record->verify_s = SecondsSince(t0);
}

}  // namespace llm
