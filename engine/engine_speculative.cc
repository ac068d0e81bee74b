// EngineCore's speculative-decoding steps (issue 52): drafts before the schedule (the draft
// model's right after it, once their blocks are reserved), verification after the forward. The
// acceptance rule is engine/speculative/rejection_sampler.h; the scheduler computes the drafts with
// the sequence's last token (ScheduledSeq::num_draft) and trims the rejected positions' blocks
// (Scheduler::CommitDrafts).
#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <vector>

#include <spdlog/spdlog.h>

#include "base/check.h"
#include "engine/engine_core.h"
#include "engine/sampling/token_mask.h"
#include "engine/speculative/rejection_sampler.h"

namespace llm {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

bool EngineCore::Speculates(const RequestState& st) const {
  return (proposer_.has_value() || draft_model_ != nullptr || mtp_ != nullptr) &&
         !speculation_paused_ && st.request.speculative_decoding;
}

void EngineCore::ProposeDrafts(StepRecord* record) {
  if (!proposer_ && !draft_model_ && !mtp_) return;
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
    // The draft model's proposals the target accepted are K/V it already has.
    if (draft_model_) AdvanceDraftKv(seq);
    if (!Speculates(st)) continue;
    // Only a decoding sequence drafts: one whose last token is the only one to compute.
    if (seq->state != SequenceState::kRunning ||
        seq->num_tokens() - seq->num_computed_tokens != 1) {
      continue;
    }
    // A pending token (the last step overlapped) is still on the device: the draft model and the
    // MTP layer read tokens the host holds, and wait for it (Overlappable keeps them apart).
    if (seq->has_pending_token() && !proposer_) continue;
    const int k =
        st.draft_length ? st.draft_length->Next() : config_.speculative.num_speculative_tokens;
    if (proposer_ && seq->has_pending_token()) {
      // A late proposal, so that a step without drafts may overlap the next one: reading the
      // pending token first would put a host round trip before every launch. The lookup runs on
      // the context up to the last known token; its continuation's first token stands for the
      // pending one, and the tokens after it are the drafts behind the pending row (which the
      // device feeds). A wrong guess costs only acceptance: the target's rows decide every token.
      const std::vector<int32_t> all = seq->AllTokens();
      const std::vector<int32_t> next =
          proposer_->Propose(std::span<const int32_t>(all).first(all.size() - 1), k + 1);
      if (next.size() > 1) seq->draft_ids.assign(next.begin() + 1, next.end());
    } else if (proposer_) {
      seq->draft_ids = proposer_->Propose(seq->AllTokens());
      if (static_cast<int>(seq->draft_ids.size()) > k) seq->draft_ids.resize(k);
    } else if (mtp_) {
      // The MTP layer proposes once it can read the target's hidden states up to the position
      // before the last token (its row there reads the last token): placeholders as for a draft
      // model, written by RunProposerNetwork.
      if (seq->draft_kv_len < seq->num_computed_tokens &&
          mtp_->KeptEnd(*seq) >= seq->num_computed_tokens) {
        seq->draft_ids.assign(k, 0);
      }
    } else if (seq->num_tokens() - seq->draft_kv_len <= scheduler_->config().max_batched_tokens) {
      // Placeholders (any valid id) for Schedule to count: RunProposerNetwork writes the proposals
      // once their blocks are reserved. A draft model far behind (speculation paused for long)
      // catches up in budget-sized chunks first, proposing nothing meanwhile.
      seq->draft_ids.assign(k, 0);
    }
  }
  record->draft_s = SecondsSince(t0);
}

void EngineCore::RunProposerNetwork(const SchedulerOutput& sched, const StepStates& states,
                                    StepRecord* record) {
  if (!draft_model_ && !mtp_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int cap = scheduler_->config().max_batched_tokens;
  std::vector<DraftWork> work;
  std::vector<RequestState*> work_state;
  if (mtp_) {
    mtp_->ForgetIf([this](int64_t id) { return scheduler_->Find(id) == nullptr; });
    work = MtpWork(sched, states);
    for (const DraftWork& w : work) {
      const auto at = std::find_if(sched.seqs.begin(), sched.seqs.end(),
                                   [&](const ScheduledSeq& s) { return s.seq == w.seq; });
      work_state.push_back(states[at - sched.seqs.begin()]);
    }
  }
  for (size_t k = 0; k < sched.seqs.size() && draft_model_; ++k) {
    const ScheduledSeq& s = sched.seqs[k];
    Sequence* seq = s.seq;
    RequestState& rs = *states[k];
    const int computed = s.start + s.num_tokens - s.num_draft;  // the target's, after this step
    const bool chunk = s.start < static_cast<int>(seq->prompt_ids.size()) || computed - s.start > 1;
    // Prompt (and recomputed) chunks are mirrored for every request, so their blocks can enter
    // the prefix cache with both models' K/V; a plain decode of a request that does not
    // speculate (opted out, or speculation paused) is left for the draft model to catch up on
    // when the request speculates again. A pending token (overlapped steps) is not known yet.
    if (s.num_draft == 0 && !chunk && !Speculates(rs)) continue;
    int end = std::min(computed, seq->num_tokens() - (seq->has_pending_token() ? 1 : 0));
    if (s.num_draft == 0) end = std::min(end, seq->draft_kv_len + cap);
    if (seq->draft_kv_len >= end) continue;
    work.push_back({seq, end, s.num_draft});
    work_state.push_back(&rs);
  }
  // Each proposing sequence's drafts are drawn from the draft model's distribution processed as
  // the request's sampling processes the target's (bias, penalties with the earlier drafts
  // counted, temperature, top-k/p, min-p): greedy takes its top token; sampled draws from the
  // request's own stream and keeps the distribution as the verification's q.
  struct Proposing {
    SamplingJob job;
    std::vector<PenaltyEntry> entries;
    std::vector<int32_t> drafts;
  };
  std::vector<Proposing> proposing(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    work_state[i]->draft_q.clear();
    if (work[i].num_propose == 0) continue;
    const Sequence& seq = *work[i].seq;
    // DeviceJob gives the job and its penalty entries (its draw, if any, goes unused).
    proposing[i].job =
        work_state[i]->sampler->DeviceJob(seq.prompt_ids, seq.output_ids, &proposing[i].entries);
  }
  // The entries of item i's j-th draft: the request's, with the earlier drafts generated.
  auto entries_of = [&](size_t i, int j) {
    Proposing& p = proposing[i];
    std::vector<PenaltyEntry> entries = p.entries;
    if (HasPenalties(work_state[i]->request.sampling)) {
      for (int d = 0; d < j; ++d) CountGenerated(&entries, p.drafts[d]);
    }
    return entries;
  };
  // A greedy draft on a model that samples on the device is its argmax there: only the token
  // crosses PCIe. A sampled one needs its distribution (q) on the host, a constrained one its
  // grammar's mask.
  const DraftModelProposer::DeviceJob device_job = [&](size_t i, int j, SamplingJob* job,
                                                       std::vector<PenaltyEntry>* penalties) {
    if (!work_state[i]->request.sampling.greedy() || work_state[i]->matcher) return false;
    *job = proposing[i].job;
    const std::vector<PenaltyEntry> entries = entries_of(i, j);
    penalties->insert(penalties->end(), entries.begin(), entries.end());
    return true;
  };
  // Without penalties a job does not read the earlier drafts, so the draft model may ask for it
  // while it still draws them on the device.
  const DraftModelProposer::JobsIndependent independent = [&](size_t i) {
    return !HasPenalties(work_state[i]->request.sampling);
  };
  // A grammar masks each draft's row with its state after the drafts before it, as the
  // verification masks the target's rows: the matcher takes the drafts tentatively and gives
  // them back once the drafting is done. Once it ends (or refuses a draft), later rows stay
  // unmasked; the verification rejects what the grammar does not allow.
  std::vector<int> tentative(work.size(), 0);
  std::vector<uint8_t> in_grammar(work.size(), 1);
  const DraftModelProposer::Choose choose = [&](size_t i, int j, int32_t device_token,
                                                std::span<float> logits) {
    Proposing& p = proposing[i];
    RequestState& rs = *work_state[i];
    if (device_token >= 0) {
      p.drafts.push_back(device_token);
      return device_token;
    }
    if (rs.matcher) {
      while (in_grammar[i] && tentative[i] < j) {
        in_grammar[i] = rs.matcher->AcceptToken(p.drafts[tentative[i]]) ? 1 : 0;
        tentative[i] += in_grammar[i];
      }
      if (in_grammar[i] && !rs.matcher->IsTerminated()) {
        rs.matcher->FillNextTokenBitmask(rs.mask.data());
        ApplyTokenMask(logits, rs.mask.data(), rs.matcher->compiled().vocab().size());
      }
    }
    const KeptDistribution dist = SamplingDistribution(logits, p.job, entries_of(i, j));
    int32_t token = dist.ids[0];  // temperature 0: the argmax alone
    if (!rs.request.sampling.greedy()) {
      TokenProbs q = ToTokenProbs(dist);
      token = SampleFrom(q, rs.sampler->NextUniform());
      rs.draft_q.push_back(std::move(q));
    }
    p.drafts.push_back(token);
    return token;
  };
  const Status st =
      mtp_ ? mtp_->Run(work, scheduler_->allocator(), device_job, choose)
           : draft_model_->Run(work, scheduler_->allocator(), device_job, independent, choose);
  for (size_t i = 0; i < work.size(); ++i) {
    if (tentative[i] > 0) work_state[i]->matcher->Rollback(tentative[i]);
  }
  if (!st.ok()) {
    // Nothing advanced: the scheduled drafts stay the placeholders, each a one-hot proposal that
    // the verification handles exactly; the draft model retries its catch-up next step.
    spdlog::error("{} forward failed: {}", mtp_ ? "MTP layer" : "draft model", st.ToString());
    for (RequestState* rs : work_state) rs->draft_q.clear();
  } else if (proposal_observer_) {
    for (size_t i = 0; i < work.size(); ++i) {
      if (work[i].num_propose == 0) continue;
      const Sequence& seq = *work[i].seq;
      proposal_observer_(work_state[i]->request.request_id, seq.num_tokens(),
                         std::span<const int32_t>(seq.draft_ids.data(), work[i].num_propose));
    }
  }
  record->draft_s += SecondsSince(t0);
}

std::vector<DraftWork> EngineCore::MtpWork(const SchedulerOutput& sched,
                                           const StepStates& states) const {
  std::vector<DraftWork> work;
  for (size_t k = 0; k < sched.seqs.size(); ++k) {
    const ScheduledSeq& s = sched.seqs[k];
    Sequence* seq = s.seq;
    if (!states[k]->request.speculative_decoding) continue;  // keeps no hidden states
    // A row reads the token after its position, so the known tokens end the rows too.
    const int known = seq->num_tokens() - (seq->has_pending_token() ? 1 : 0);
    const int end = std::min(mtp_->KeptEnd(*seq), known - 1);
    if (end <= seq->draft_kv_len) continue;
    // ProposeDrafts set the drafts only where the rows reach the last token; otherwise they stay
    // placeholders, one-hot drafts the verification handles exactly.
    const int propose = end == seq->num_tokens() - 1 ? s.num_draft : 0;
    work.push_back({seq, end, propose});
  }
  return work;
}

void EngineCore::RequestHiddenRows(const StepStates& states, StepBatch* in) const {
  if (!mtp_) return;
  ForwardBatch& b = in->forward;
  in->hidden_first_row.assign(in->step_seq.size(), -1);
  for (size_t k = 0; k < in->step_seq.size(); ++k) {
    if (!states[k]->request.speculative_decoding) continue;
    in->hidden_first_row[k] = static_cast<int32_t>(b.hidden_rows.size());
    for (int32_t r = b.attn.q_indptr[k]; r < b.attn.q_indptr[k + 1]; ++r)
      b.hidden_rows.push_back(r);
  }
}

void EngineCore::KeepHiddenStates(const SchedulerOutput& sched, const StepBatch& in) {
  if (!mtp_) return;  // a request that ended in the emission is gone: only ids are read
  const int H = model_->config().hidden_size;
  const std::span<const float> hidden = model_->hidden_states();
  for (size_t k = 0; k < in.step_seq.size(); ++k) {
    if (in.hidden_first_row[k] < 0) continue;
    const Sequence* seq = scheduler_->Find(in.step_seq[k]);
    if (seq == nullptr) continue;
    // The positions the target now holds: rejected drafts' rows are not the sequence's.
    const int begin = sched.seqs[k].start;
    const int end = std::min(begin + sched.seqs[k].num_tokens, seq->num_computed_tokens);
    if (end <= begin) continue;
    const size_t first = static_cast<size_t>(in.hidden_first_row[k]) * H;
    mtp_->KeepHidden(*seq, begin, hidden.subspan(first, static_cast<size_t>(end - begin) * H));
  }
}

void EngineCore::EmitDrafted(const StepBatch& in, const StepStates& states,
                             const std::vector<int32_t>& device_tokens, StepRecord* record) {
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
    // The draft model's sampled drafts come with the distribution each was drawn from; n-gram
    // and greedy drafts are one-hot (an empty function).
    std::function<TokenProbs(int)> draft_probs;
    if (!rs.draft_q.empty()) {
      LLM_CHECK_EQ(rs.draft_q.size(), draft.size());
      draft_probs = [&](int j) { return rs.draft_q[j]; };
    }
    const auto device_token = [&](int j) {
      const int32_t t = device_tokens.at(static_cast<size_t>(d.first_row + j));
      LLM_CHECK(t >= 0) << "no device token for draft row " << j;
      return t;
    };
    const VerifyResult v = d.on_device ? VerifyByTargetDraws(draft, device_token)
                           : params.greedy()
                               ? VerifyGreedy(draft, [&](int j) { return target(j).ids[0]; })
                               : VerifySampled(
                                     draft, [&](int j) { return ToTokenProbs(target(j)); },
                                     draft_probs, [&] { return rs.sampler->NextUniform(); });
    rs.draft_q.clear();
    if (rs.matcher) rs.matcher->Rollback(tentative);
    if (rs.draft_length) rs.draft_length->Observe(d.num_draft, v.num_accepted);
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
