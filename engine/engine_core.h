// The single-threaded heart of the engine: owns the model, scheduler, KV cache and per-request
// state, and advances everything by one step at a time. Not thread-safe: `Engine` runs it on its
// own thread; tools and tests may drive it directly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/worker_pool.h"
#include "engine/engine_config.h"
#include "engine/grammar_cache.h"
#include "engine/metrics.h"
#include "engine/request.h"
#include "engine/runtime/model.h"
#include "engine/speculative/adaptive_draft_length.h"
#include "engine/speculative/draft_model_proposer.h"
#include "engine/speculative/mtp_proposer.h"
#include "engine/speculative/ngram_proposer.h"
#include "engine/speculative/rejection_sampler.h"
#include "engine/step_batch.h"
#include "engine/stop_matcher.h"
#include "grammar/matcher.h"
#include "scheduler/scheduler.h"
#include "text/tokenizer/tokenizer.h"

namespace llm {

// What one step did, for logs, tests and tools.
struct StepRecord {
  struct Entry {
    int64_t seq_id;
    std::string request_id;
    int num_tokens;
    bool is_prefill;    // computed tokens were prompt (or recomputed) tokens
    bool prefill_done;  // this step completed the prefill and sampled
  };
  std::vector<Entry> entries;
  int num_preempted = 0;
  // Wall time of the step's phases (seconds): schedule, batch preparation, forward, sampling
  // plus streaming.
  double schedule_s = 0, prepare_s = 0, forward_s = 0, sample_s = 0;
  // Speculative decoding: proposing drafts (before scheduling) and verifying them on the host
  // (acceptance, streaming the accepted tokens); sequences that verified drafts, their draft
  // tokens and how many were accepted.
  double draft_s = 0, verify_s = 0;
  int num_drafts = 0, num_draft_tokens = 0, num_accepted_tokens = 0;
  double mask_s = -1;  // filling token masks (within forward_s); -1: the step had none
};

class EngineCore {
 public:
  static StatusOr<std::unique_ptr<EngineCore>> Create(const EngineConfig& config);
  // With a model made by the caller (tests: a model that wraps another) instead of LoadModel;
  // the tokenizer still comes from config.model.model_dir.
  static StatusOr<std::unique_ptr<EngineCore>> Create(const EngineConfig& config,
                                                      std::unique_ptr<Model> model);
  // And, for --speculative-method draft, the draft model made by the caller (loaded with
  // ModelLoadOptions::defer_kv_cache; null: loaded from the config's draft model directory).
  static StatusOr<std::unique_ptr<EngineCore>> Create(const EngineConfig& config,
                                                      std::unique_ptr<Model> model,
                                                      std::unique_ptr<Model> draft);
  ~EngineCore();  // waits for a step still on the device

  // Checks a request against the model and limits; fills defaults (max_tokens). Thread-safe:
  // reads only immutable state.
  Status Validate(GenerationRequest* request) const;

  // Takes a validated request. The sink gets its outputs (every choice's, when n > 1).
  void Add(GenerationRequest request, std::shared_ptr<ResultSink> sink);
  // Ends a request (every choice of it) with the given reason (kAborted) or error status. False
  // if unknown.
  bool Abort(const std::string& request_id, const Status& error);
  // Ends every request whose deadline has passed with DEADLINE_EXCEEDED.
  void ExpireDeadlines(std::chrono::steady_clock::time_point now);
  bool HasWork() const { return !requests_.empty() || inflight_.has_value(); }
  // Runs one schedule + forward + sample step. An error here fails the step's requests.
  StepRecord Step();
  // Refreshes gauges and counters derived from scheduler state (Step does this itself).
  void UpdateGauges();

  // Test hook: sees each sampled sequence's logits before sampling.
  using LogitsObserver = std::function<void(const std::string& request_id, std::span<const float>)>;
  void set_logits_observer(LogitsObserver f) { logits_observer_ = std::move(f); }
  // Test hook: each proposal of a draft model or MTP layer, with the position of its first draft
  // (the sequence's token count) and the drafts.
  using ProposalObserver = std::function<void(const std::string& request_id, int position,
                                              std::span<const int32_t> drafts)>;
  void set_proposal_observer(ProposalObserver f) { proposal_observer_ = std::move(f); }
  // Test hook: every MoE routing decision of every forward (Model::set_routing_trace), with the
  // request whose token it routed; MoeRoutingDecision::position keys it within the request (a
  // position recomputed after a preemption is reported again). Steps do not overlap while it is
  // set. FailedPrecondition when the model records no routing; null turns it off.
  using RoutingObserver =
      std::function<void(const std::string& request_id, const MoeRoutingDecision& decision)>;
  Status set_routing_observer(RoutingObserver f);
  // Called once per request when it leaves the queue: first scheduled, or ended before that.
  void set_dequeue_observer(std::function<void()> f) { dequeue_observer_ = std::move(f); }

  const ModelConfig& model_config() const { return model_->config(); }
  const Model& model() const { return *model_; }
  // The draft model of --speculative-method draft, else null.
  const Model* draft_model() const { return draft_model_ ? &draft_model_->model() : nullptr; }
  // The MTP layer of --speculative-method mtp, else null.
  const Model* mtp_model() const { return mtp_ ? &mtp_->model() : nullptr; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const EngineConfig& config() const { return config_; }
  // Null when structured outputs are unavailable for this model.
  const GrammarCache* grammar_cache() const { return grammar_cache_.get(); }
  int max_model_len() const { return max_model_len_; }
  int num_running() const { return scheduler_->num_running(); }
  int num_waiting() const { return scheduler_->num_waiting(); }
  int num_free_blocks() const { return scheduler_->allocator().num_free(); }
  // Steps queued on the device before the previous step's tokens were read (Model::Launch).
  int64_t num_overlapped_steps() const {
    return static_cast<int64_t>(metrics_->overlapped_steps.value());
  }
  int num_blocks() const { return scheduler_->allocator().num_blocks(); }
  // Thread-safe; rendered by the metrics endpoint.
  const std::shared_ptr<EngineMetrics>& metrics() const { return metrics_; }

 private:
  struct RequestState {
    GenerationRequest request;
    std::shared_ptr<ResultSink> sink;
    int64_t seq_id = 0;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<IncrementalDecoder> decoder;
    std::unique_ptr<StopMatcher> stop_matcher;
    // Structured outputs: the grammar's state and its token mask. The engine thread fills the
    // mask before the step: it rides with the row's device sampling job, or masks the row's
    // logits on the host (logprobs, a logits observer, a model that samples on the host).
    std::unique_ptr<grammar::Matcher> matcher;
    std::vector<uint32_t> mask;  // the matcher's words, reused
    bool scheduled = false;      // queue time recorded
    // n > 1: the request this is a choice of, and the choice's index; with a prefix cache,
    // choices 1..n-1 hold their sequence here until choice 0's prefill is done
    // (ReleaseHeldChoices).
    std::string group;
    int choice = 0;
    std::unique_ptr<Sequence> held;
    std::chrono::steady_clock::time_point last_token_time;
    // Draft-model speculation of a sampled request: the distribution each of this step's drafts
    // was drawn from (the verification's q); empty for greedy and n-gram drafts (one-hot).
    std::vector<TokenProbs> draft_q;
    // --speculative-adaptive-k: this request's draft length from its acceptance so far.
    std::optional<AdaptiveDraftLength> draft_length;
  };

  EngineCore() = default;
  // One request (or one choice of one): its state, and its sequence to the scheduler unless held.
  void AddOne(GenerationRequest request, std::shared_ptr<ResultSink> sink, const std::string& group,
              int choice);
  // Admits the held choices of every request whose choice 0 completed its prefill this step
  // (its full prompt blocks are now in the prefix cache).
  void ReleaseHeldChoices(const StepRecord& record);
  // Builds the grammar cache over the tokenizer's vocabulary, or notes why there is none.
  void InitGrammars(const std::string& tokenizer_path);
  // Size limit and compilation (through the cache) of the request's constraint.
  Status ValidateConstraint(GenerationRequest* r) const;
  // A step launched on the device whose tokens the host has not read yet (overlapped steps).
  struct InFlight {
    std::vector<int64_t> row_seq;  // the sequence of each logit row
  };

  // Streams the sequence's newest token (already in output_ids) and finishes the request when a
  // stop condition holds.
  void OnToken(RequestState& st, Sequence& seq, const SampledToken& token);
  // Whether a request's rows may be sampled in an overlapped step: its sampling needs nothing
  // the host has not seen (no logits back, no penalties over the generated tokens).
  bool Overlappable(const RequestState& st) const;
  // An in-flight step read back: its rows, their tokens, and how the read went.
  struct Collected {
    InFlight step;
    std::vector<int32_t> tokens;
    Status status;
    std::vector<uint8_t> refused;  // per row: the request's grammar refused the token
  };
  // Takes the in-flight step (if any), waits for its tokens, writes them over their placeholders
  // and advances the grammars of constrained rows by them (sequences that ended meanwhile are
  // skipped), so the next masks can be computed. Nothing is streamed yet: the caller does its
  // scheduler bookkeeping first.
  std::optional<Collected> CollectInflight();
  // Streams a collected step's tokens, or fails its requests when reading it back failed.
  void StreamCollected(const Collected& c);
  void FailRows(const std::vector<int64_t>& seq_ids, const Status& error);
  // The error of a request whose grammar refused its sampled token: only when the mask left
  // nothing to choose from (EmitTokens, CollectInflight's rows, EmitDrafted).
  static Status GrammarRefused(int32_t token);
  void Finish(RequestState& st, FinishReason reason, GenerationOutput out);
  void Fail(const std::string& request_id, const Status& error);
  StepRecord StepInner();
  // The step's phases after Schedule (StepInner reads as their sequence).
  // The request of each scheduled sequence, parallel to sched.seqs: looked up once a step. An
  // entry stays valid while its sequence is in the scheduler (Finish removes both at once).
  using StepStates = std::vector<RequestState*>;
  StepStates GatherStates(const SchedulerOutput& sched);
  // Records queue times of first-scheduled requests and the step's entries.
  void NoteScheduled(const SchedulerOutput& sched, const StepStates& states, StepRecord* record);
  StepBatch BuildInputs(const SchedulerOutput& sched, const StepStates& states);
  // Fills the token masks of the batch's constrained device-sampled rows (in.mask_rows) from
  // their grammars, on mask_pool_; returns the seconds it took. The grammars must have seen every
  // earlier token.
  double FillMasks(StepBatch& in, const StepStates& states);
  // The mask of a request's next token into `dst` (mask_words words). A row with no allowed token
  // (its grammar terminated: the request ends with the previous token) allows every token, so the
  // device never samples from an empty set; the token is then discarded or refused.
  void FillRowMask(RequestState& rs, uint32_t* dst, int mask_words);
  // Whether this step may run on while the host streams the previous one (Model::Launch).
  bool CanOverlap(const StepBatch& in, const StepStates& states) const;
  // After an overlapped launch: each row's token is a placeholder until Collect.
  void HoldPlaceholders(std::vector<int64_t> row_seq);
  // After a synchronous forward: samples (or takes the device's token for) each row and streams.
  void EmitTokens(const StepBatch& in, const StepStates& states,
                  const std::vector<int32_t>& device_tokens);
  // Row r's token: drawn on the device, drawn on the host with the device job's draw (its logits
  // came back), or drawn by the request's sampler (logprobs, an observer).
  SampledToken SampleRow(const ForwardBatch& batch, size_t r, RequestState& rs, const Sequence& seq,
                         const std::vector<int32_t>& device_tokens);
  // Speculative decoding (engine_speculative.cc). Whether the request's sequences get drafts: a
  // method is on and the request did not opt out. A grammar's mask is applied per draft position
  // (the matcher takes the drafts tentatively and rolls them back).
  bool Speculates(const RequestState& st) const;
  // Before Schedule: the drafts of every decoding sequence that speculates (Sequence::draft_ids):
  // the n-gram proposer's, or, for a proposer network (the draft model, the MTP layer), K
  // placeholders that RunProposerNetwork fills once Schedule has reserved their blocks (and kept
  // those that fit).
  void ProposeDrafts(StepRecord* record);
  // After Schedule, before the target's inputs are built: the proposer network's step. The draft
  // model (DraftModelProposer) consumes the tokens it has not seen of every scheduled prompt chunk
  // and speculating sequence, the MTP layer (MtpProposer) the kept hidden states (MtpWork); both
  // propose the drafts Schedule kept, processed and drawn as the request samples.
  void RunProposerNetwork(const SchedulerOutput& sched, const StepStates& states,
                          StepRecord* record);
  // The MTP layer's work of this step (MtpProposer::Run): the rows its K/V lacks of every
  // scheduled sequence with kept hidden states, and the proposals of those Schedule kept drafts
  // for.
  std::vector<DraftWork> MtpWork(const SchedulerOutput& sched, const StepStates& states) const;
  // MTP: the target returns the hidden states of every row of the requests that may speculate
  // (ForwardBatch::hidden_rows); after the step's tokens are emitted, those of the positions the
  // target now holds are kept for the next step's MTP run.
  void RequestHiddenRows(const StepStates& states, StepBatch* in) const;
  void KeepHiddenStates(const SchedulerOutput& sched, const StepBatch& in);
  // After a synchronous forward: verifies each drafted sequence's rows (in.drafted) on the host,
  // streams the accepted tokens and the target's next one through OnToken, one at a time (a
  // finish drops the rest), and tells the scheduler how many were accepted.
  void EmitDrafted(const StepBatch& in, const StepStates& states,
                   const std::vector<int32_t>& device_tokens, StepRecord* record);
  // Hands the forward's routing_trace_ to the observer; `entries` are the batch's sequences.
  void ReportRouting(const AttentionBatch& batch, const std::vector<StepRecord::Entry>& entries);

  EngineConfig config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Scheduler> scheduler_;
  // Compiled grammars over the tokenizer's vocabulary; null when the model has no usable
  // tokenizer.json (grammar_unavailable_ says why) or no EOS id.
  std::unique_ptr<GrammarCache> grammar_cache_;
  std::unique_ptr<WorkerPool> mask_pool_;  // EngineConfig::structured_output_threads
  std::string grammar_unavailable_;
  int max_model_len_ = 0;
  int64_t next_seq_id_ = 1;
  std::map<std::string, RequestState> requests_;  // by request id
  std::map<int64_t, std::string> seq_to_request_;
  std::map<std::string, std::vector<std::string>> groups_;  // n > 1: request id -> choice ids
  LogitsObserver logits_observer_;
  ProposalObserver proposal_observer_;
  RoutingObserver routing_observer_;
  std::vector<MoeRoutingDecision> routing_trace_;  // the model appends while the observer is set
  std::function<void()> dequeue_observer_;
  std::shared_ptr<EngineMetrics> metrics_ = std::make_shared<EngineMetrics>();
  std::vector<float> logits_scratch_;
  std::optional<NgramProposer> proposer_;            // set when EngineConfig::speculative is ngram
  std::unique_ptr<DraftModelProposer> draft_model_;  // set when it is draft
  std::unique_ptr<MtpProposer> mtp_;                 // set when it is mtp
  // SpeculativeConfig::disable_by_batch_size exceeded at the last step's start: nobody drafts.
  bool speculation_paused_ = false;
  std::optional<InFlight> inflight_;
  PrefixCacheStats last_prefix_stats_;
  int64_t last_preemptions_ = 0;
  int64_t last_graph_steps_ = 0;  // Model::graph_steps() at the last metrics update
};

}  // namespace llm
