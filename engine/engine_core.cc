#include "engine/engine_core.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/choice_fan_in.h"
#include "engine/sampling/token_mask.h"

namespace llm {
namespace {

bool Finite(float x) {
  return std::isfinite(x);
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The window when every layer of the model attends to a sliding window, else 0.
int AllLayersWindow(const ModelConfig& mc) {
  if (!mc.sliding_window.has_value()) return 0;
  for (int l = 0; l < mc.num_layers; ++l) {
    if (mc.WindowLeft(l) < 0) return 0;
  }
  return *mc.sliding_window;
}

std::string Outcome(const GenerationOutput& out) {
  if (!out.error.ok()) {
    std::string code = StatusCodeName(out.error.code());
    for (char& c : code) c = static_cast<char>(std::tolower(c));
    return code;
  }
  switch (out.finish_reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kNone:
      break;
  }
  return "unknown";
}

}  // namespace

EngineCore::~EngineCore() {
  if (inflight_) {
    std::vector<int32_t> unused;
    (void)model_->Collect(&unused);  // the device may still write into memory we free
  }
}

StatusOr<std::unique_ptr<EngineCore>> EngineCore::Create(const EngineConfig& config) {
  return Create(config, nullptr);
}

StatusOr<std::unique_ptr<EngineCore>> EngineCore::Create(const EngineConfig& config,
                                                         std::unique_ptr<Model> model) {
  return Create(config, std::move(model), nullptr);
}

StatusOr<std::unique_ptr<EngineCore>> EngineCore::Create(const EngineConfig& config,
                                                         std::unique_ptr<Model> model,
                                                         std::unique_ptr<Model> draft) {
  LLM_RETURN_IF_ERROR(CheckSpeculativeConfig(config.speculative));
  if (draft && config.speculative.method != "draft") {
    return InvalidArgument("a draft model is given but --speculative-method is " +
                           config.speculative.method);
  }
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = config;
  const std::string tok_path = config.model.model_dir + "/tokenizer.json";
  if (std::filesystem::exists(tok_path)) {
    LLM_ASSIGN_OR_RETURN(core->tokenizer_, Tokenizer::FromFile(tok_path));
  } else if (config.require_tokenizer && config.model.model_dir.rfind("synthetic", 0) != 0) {
    return NotFound("no tokenizer.json in " + config.model.model_dir);
  }
  // A draft model loads first, without its KV cache: the target's block count then accounts for
  // both models' bytes per block (on a GPU, for both models' weights too), and the draft's cache
  // takes that count.
  const SpeculativeConfig& spec = config.speculative;
  if (spec.method == "draft") {
    std::unique_ptr<Tokenizer> draft_tokenizer;
    const std::string draft_tok = spec.draft_model_dir + "/tokenizer.json";
    if (std::filesystem::exists(draft_tok)) {
      LLM_ASSIGN_OR_RETURN(draft_tokenizer, Tokenizer::FromFile(draft_tok));
    }
    LLM_RETURN_IF_ERROR(
        CheckDraftTokenizer(core->tokenizer_.get(), draft_tokenizer.get(), spec.draft_model_dir));
  }
  // Verify steps (1 + K query rows per sequence) replay CUDA graphs like one-token decode steps.
  ModelLoadOptions target = config.model;
  target.cuda_graph_max_query_rows = SpeculativeQueryRows(spec);
  target.max_step_rows = config.scheduler.max_batched_tokens;
  if (spec.method == "draft" && !draft) {
    auto loaded = LoadModel(DraftModelLoadOptions(target, spec.draft_model_dir));
    if (!loaded.ok()) {
      return Status(loaded.status().code(),
                    "draft model " + spec.draft_model_dir + ": " + loaded.status().message());
    }
    draft = std::move(loaded).value();
  }
  // The MTP layer is a proposer network like a draft model: loaded first from the target's own
  // checkpoint, its KV cache in the target's blocks.
  std::unique_ptr<Model> mtp;
  if (spec.method == "mtp") {
    if (model) {
      return InvalidArgument("--speculative-method mtp loads the target from its directory");
    }
    ModelLoadOptions base = config.model;  // the MTP layer's graphs are one-row ones
    base.max_step_rows = target.max_step_rows;
    LLM_ASSIGN_OR_RETURN(mtp, LoadMtpModel(DraftModelLoadOptions(base, config.model.model_dir)));
  }
  if (model) {
    core->model_ = std::move(model);
  } else {
    if (draft) target.extra_kv_bytes_per_block = draft->kv_bytes_per_block();
    if (mtp) target.extra_kv_bytes_per_block = mtp->kv_bytes_per_block();
    LLM_ASSIGN_OR_RETURN(core->model_, LoadModel(target));
  }
  const ModelConfig& mc = core->model_->config();
  if (core->tokenizer_ && core->tokenizer_->vocab_size() > mc.vocab_size) {
    return InvalidArgument("tokenizer has " + std::to_string(core->tokenizer_->vocab_size()) +
                           " tokens but the model's vocab_size is " +
                           std::to_string(mc.vocab_size));
  }
  SchedulerConfig sc = config.scheduler;
  sc.block_size = config.model.block_size;
  // Blocks that slid out of the window are freed only when no layer (of either model) attends
  // further back.
  sc.sliding_window = AllLayersWindow(mc);
  const int num_blocks = core->model_->num_kv_blocks();
  if (draft) {
    LLM_RETURN_IF_ERROR(CheckDraftVocabulary(mc, draft->config(), spec.draft_model_dir));
    const int draft_window = AllLayersWindow(draft->config());
    sc.sliding_window =
        sc.sliding_window > 0 && draft_window > 0 ? std::max(sc.sliding_window, draft_window) : 0;
    sc.draft_model_kv = true;
    LLM_RETURN_IF_ERROR(draft->AllocateKvCache(num_blocks));
    spdlog::info("draft model {}: {} layers, KV {} bytes per block beside the target's {}",
                 spec.draft_model_dir, draft->config().num_layers, draft->kv_bytes_per_block(),
                 core->model_->kv_bytes_per_block());
    core->draft_model_ =
        std::make_unique<DraftModelProposer>(std::move(draft), config.model.block_size);
  }
  if (mtp) {
    if (!core->model_->returns_hidden_states()) {
      return InvalidArgument("--speculative-method mtp: the " + config.model.device +
                             " runner does not return the target's hidden states");
    }
    sc.draft_model_kv = true;
    sc.recompute_last_cached_block = true;
    LLM_RETURN_IF_ERROR(mtp->AllocateKvCache(num_blocks));
    spdlog::info("MTP layer: KV {} bytes per block beside the target's {}",
                 mtp->kv_bytes_per_block(), core->model_->kv_bytes_per_block());
    core->mtp_ = std::make_unique<MtpProposer>(std::move(mtp), config.model.block_size);
  }
  core->scheduler_ = std::make_unique<Scheduler>(sc, num_blocks);

  // A sequence must fit in the whole KV pool, or it could never be scheduled.
  int len = config.max_model_len > 0 ? config.max_model_len : mc.max_position_embeddings;
  len = std::min(len, mc.max_position_embeddings);
  len = std::min(len, num_blocks * sc.block_size);
  core->max_model_len_ = len;
  if (spec.method == "ngram") {
    LLM_ASSIGN_OR_RETURN(core->proposer_, NgramProposer::Create({spec.ngram_prompt_lookup_min,
                                                                 spec.ngram_prompt_lookup_max,
                                                                 spec.num_speculative_tokens}));
  }
  core->InitGrammars(tok_path);
  return core;
}

void EngineCore::InitGrammars(const std::string& tokenizer_path) {
  // The grammar sees tokens as the bytes they decode to; building that table once at load keeps
  // it out of every request's path.
  const std::vector<int32_t>& eos = model_->config().eos_token_ids;
  if (!tokenizer_) {
    grammar_unavailable_ = "the model has no tokenizer.json";
    return;
  }
  if (eos.empty()) {
    grammar_unavailable_ =
        "the model config names no eos_token_id, so a constrained output "
        "could never end";
    return;
  }
  std::ifstream f(tokenizer_path, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  auto vocab = grammar::Vocabulary::FromHfTokenizerJson(text.str(), eos);
  if (!vocab.ok()) {
    grammar_unavailable_ = "the tokenizer's vocabulary could not be read: " + vocab.error();
    spdlog::warn("structured outputs unavailable: {}", grammar_unavailable_);
    return;
  }
  grammar_cache_ = std::make_unique<GrammarCache>(
      vocab.value(), static_cast<size_t>(std::max(1, config_.grammar_cache_size)));
  int threads = config_.structured_output_threads;
  if (threads <= 0) {
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  }
  mask_pool_ = std::make_unique<WorkerPool>(threads);
}

Status EngineCore::ValidateConstraint(GenerationRequest* r) const {
  const Constraint& c = r->constraint;
  if (c.kind == Constraint::Kind::kNone) return Status::Ok();
  const std::string name = ConstraintKindName(c.kind);
  size_t bytes = c.text.size();
  for (const std::string& s : c.choices) bytes += s.size();
  if (bytes > static_cast<size_t>(config_.max_constraint_bytes)) {
    return InvalidArgument("the " + name + " constraint is " + std::to_string(bytes) +
                           " bytes; the limit (max_constraint_bytes) is " +
                           std::to_string(config_.max_constraint_bytes));
  }
  if (!grammar_cache_) {
    return FailedPrecondition("structured outputs (" + name +
                              ") are unavailable: " + grammar_unavailable_);
  }
  LLM_ASSIGN_OR_RETURN(r->grammar, grammar_cache_->Get(c));
  return Status::Ok();
}

Status EngineCore::Validate(GenerationRequest* r) const {
  const ModelConfig& mc = model_->config();
  if (r->request_id.size() > 256) return InvalidArgument("request_id is longer than 256 bytes");
  if (r->prompt_ids.empty()) return InvalidArgument("prompt is empty");
  for (size_t i = 0; i < r->prompt_ids.size(); ++i) {
    const int32_t id = r->prompt_ids[i];
    if (id < 0 || id >= mc.vocab_size) {
      return InvalidArgument("prompt token id " + std::to_string(id) + " at position " +
                             std::to_string(i) + " is outside the vocabulary [0, " +
                             std::to_string(mc.vocab_size) + ")");
    }
  }
  const int prompt_len = static_cast<int>(r->prompt_ids.size());
  if (prompt_len >= max_model_len_) {
    return InvalidArgument("prompt has " + std::to_string(prompt_len) +
                           " tokens; the context holds " + std::to_string(max_model_len_) +
                           " including at least one generated token");
  }
  const StoppingParams& st = r->stopping;
  if (st.max_tokens < 1 || st.max_tokens > config_.max_tokens_limit) {
    return InvalidArgument("max_tokens is " + std::to_string(st.max_tokens) + "; must be in [1, " +
                           std::to_string(config_.max_tokens_limit) + "]");
  }
  if (st.min_tokens < 0 || st.min_tokens > st.max_tokens) {
    return InvalidArgument("min_tokens must be in [0, max_tokens]");
  }
  if (static_cast<int>(st.stop.size()) > config_.max_stop_strings) {
    return InvalidArgument("at most " + std::to_string(config_.max_stop_strings) +
                           " stop strings are allowed");
  }
  for (const std::string& s : st.stop) {
    if (s.empty()) return InvalidArgument("stop strings must not be empty");
    if (static_cast<int>(s.size()) > config_.max_stop_string_bytes) {
      return InvalidArgument("a stop string is longer than " +
                             std::to_string(config_.max_stop_string_bytes) + " bytes");
    }
  }
  for (int32_t id : st.stop_token_ids) {
    if (id < 0 || id >= mc.vocab_size) {
      return InvalidArgument("stop token id " + std::to_string(id) + " is outside the vocabulary");
    }
  }
  const SamplingParams& sp = r->sampling;
  if (!Finite(sp.temperature) || sp.temperature < 0) {
    return InvalidArgument("temperature must be a finite number >= 0");
  }
  if (!Finite(sp.top_p) || sp.top_p <= 0 || sp.top_p > 1) {
    return InvalidArgument("top_p must be in (0, 1]");
  }
  if (sp.top_k < 0) return InvalidArgument("top_k must be >= 0 (0 disables it)");
  if (!Finite(sp.min_p) || sp.min_p < 0 || sp.min_p > 1) {
    return InvalidArgument("min_p must be in [0, 1]");
  }
  if (!Finite(sp.repetition_penalty) || sp.repetition_penalty <= 0) {
    return InvalidArgument("repetition_penalty must be a finite number > 0");
  }
  if (!Finite(sp.presence_penalty) || std::fabs(sp.presence_penalty) > 2) {
    return InvalidArgument("presence_penalty must be in [-2, 2]");
  }
  if (!Finite(sp.frequency_penalty) || std::fabs(sp.frequency_penalty) > 2) {
    return InvalidArgument("frequency_penalty must be in [-2, 2]");
  }
  if (sp.logprobs < 0 || sp.logprobs > config_.max_logprobs) {
    return InvalidArgument("logprobs must be in [0, " + std::to_string(config_.max_logprobs) + "]");
  }
  for (const auto& [token, bias] : sp.logit_bias) {
    if (token < 0 || token >= mc.vocab_size) {
      return InvalidArgument("logit_bias token id " + std::to_string(token) +
                             " is outside the vocabulary [0, " + std::to_string(mc.vocab_size) +
                             ")");
    }
    if (!Finite(bias) || bias < -100 || bias > 100) {
      return InvalidArgument("logit_bias for token " + std::to_string(token) +
                             " must be in [-100, 100]");
    }
  }
  if (r->n < 1 || r->n > config_.max_n) {
    return InvalidArgument("n is " + std::to_string(r->n) + "; must be in [1, " +
                           std::to_string(config_.max_n) + "] (--max-n)");
  }
  if (!st.stop.empty() && tokenizer_ == nullptr) {
    return InvalidArgument("stop strings need a tokenizer");
  }
  return ValidateConstraint(r);
}

void EngineCore::Add(GenerationRequest request, std::shared_ptr<ResultSink> sink) {
  const int n = std::max(1, request.n);
  std::vector<std::string> ids;
  if (n > 1) {
    for (int i = 0; i < n; ++i) ids.push_back(request.request_id + "#" + std::to_string(i));
  }
  // Engine::Submit keeps request ids unique; a choice's id may still meet a client's.
  bool taken = requests_.count(request.request_id) || groups_.count(request.request_id);
  for (const std::string& id : ids) taken = taken || requests_.count(id) || groups_.count(id);
  if (taken) {
    if (dequeue_observer_) dequeue_observer_();
    GenerationOutput out;
    out.error = InvalidArgument("request_id '" + request.request_id +
                                "' (or one of its choices' ids) is already in use");
    sink->OnOutput(std::move(out));
    return;
  }
  if (n == 1) {
    AddOne(std::move(request), std::move(sink), "", 0);
    return;
  }
  std::vector<std::shared_ptr<ResultSink>> sinks = FanInChoices(std::move(sink), n);
  groups_[request.request_id] = ids;
  for (int i = 0; i < n; ++i) {
    GenerationRequest child = request;
    child.request_id = ids[i];
    child.n = 1;
    child.sampling.seed = request.sampling.seed + static_cast<uint64_t>(i);
    AddOne(std::move(child), sinks[i], request.request_id, i);
  }
}

void EngineCore::AddOne(GenerationRequest request, std::shared_ptr<ResultSink> sink,
                        const std::string& group, int choice) {
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_id_++;
  seq->arrival = seq->id;
  seq->priority = request.priority;
  seq->prompt_ids = request.prompt_ids;
  seq->max_total_tokens = std::min<int>(
      max_model_len_, static_cast<int>(request.prompt_ids.size()) + request.stopping.max_tokens);
  RequestState st;
  st.seq_id = seq->id;
  st.sampler = std::make_unique<Sampler>(request.sampling);
  if (tokenizer_) {
    st.decoder = std::make_unique<IncrementalDecoder>(*tokenizer_, request.skip_special_tokens);
  }
  st.stop_matcher = std::make_unique<StopMatcher>(request.stopping.stop);
  LLM_CHECK(request.constraint.kind == Constraint::Kind::kNone || request.grammar)
      << "a constrained request must go through Validate before Add";
  if (request.grammar) {
    st.matcher = std::make_unique<grammar::Matcher>(request.grammar);
    st.mask.resize(request.grammar->vocab().mask_words());
  }
  if (config_.speculative.enabled() && config_.speculative.adaptive_draft_length) {
    st.draft_length.emplace(config_.speculative.num_speculative_tokens);
  }
  st.sink = std::move(sink);
  st.group = group;
  st.choice = choice;
  const std::string id = request.request_id;
  st.request = std::move(request);
  seq_to_request_[seq->id] = id;
  // Without a prefix cache there is nothing to wait for: every choice computes its prompt.
  if (choice > 0 && scheduler_->prefix_cache() != nullptr) {
    st.held = std::move(seq);
  } else {
    scheduler_->Add(std::move(seq));
  }
  requests_.emplace(id, std::move(st));
}

void EngineCore::ReleaseHeldChoices(const StepRecord& record) {
  for (const StepRecord::Entry& e : record.entries) {
    if (!e.prefill_done) continue;
    auto it = requests_.find(e.request_id);
    if (it == requests_.end() || it->second.group.empty() || it->second.choice != 0) continue;
    auto g = groups_.find(it->second.group);
    if (g == groups_.end()) continue;
    for (const std::string& id : g->second) {
      auto c = requests_.find(id);
      if (c != requests_.end() && c->second.held) scheduler_->Add(std::move(c->second.held));
    }
  }
}

void EngineCore::Finish(RequestState& st, FinishReason reason, GenerationOutput out) {
  // Ended while still queued (a request's choices count once, as choice 0).
  if (!st.scheduled && st.choice == 0 && dequeue_observer_) dequeue_observer_();
  // Frees KV blocks; a held choice has none yet.
  std::unique_ptr<Sequence> seq = st.held ? std::move(st.held) : scheduler_->Remove(st.seq_id);
  out.finished = true;
  out.finish_reason = reason;
  const double e2e = Seconds(std::chrono::steady_clock::now() - st.request.arrival_time);
  // A request with n choices counts once in the request metrics, as its choice 0.
  if (st.choice == 0) {
    metrics_->e2e.Observe(e2e);
    metrics_->CountOutcome(Outcome(out));
  }
  spdlog::info("[{}] finished: {} prompt={} completion={} cached={} e2e={:.3f}s",
               st.request.request_id, Outcome(out), seq ? seq->prompt_ids.size() : 0,
               seq ? seq->num_known_outputs() : 0, seq ? seq->num_cached_tokens : 0, e2e);
  if (seq) {
    if (st.choice == 0) metrics_->prompt_tokens.Inc(static_cast<double>(seq->prompt_ids.size()));
    out.usage.prompt_tokens = static_cast<int>(seq->prompt_ids.size());
    out.usage.completion_tokens = seq->num_known_outputs();
    out.usage.cached_tokens = seq->num_cached_tokens;
  }
  std::shared_ptr<ResultSink> sink = std::move(st.sink);
  seq_to_request_.erase(st.seq_id);
  const std::string id = st.request.request_id;
  const std::string group = st.group;
  requests_.erase(id);  // st is dangling from here on
  const Status error = out.error;
  sink->OnOutput(std::move(out));
  auto g = groups_.find(group);
  if (group.empty() || g == groups_.end()) return;
  std::erase(g->second, id);
  if (g->second.empty()) {
    groups_.erase(g);
  } else if (!error.ok()) {
    // One choice failed: the request has failed (its sink has the error); end the others.
    const std::vector<std::string> rest = std::move(g->second);
    groups_.erase(g);
    for (const std::string& other : rest) Fail(other, error);
  }
}

void EngineCore::Fail(const std::string& request_id, const Status& error) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  GenerationOutput out;
  out.error = error;
  Finish(it->second, FinishReason::kAborted, std::move(out));
}

bool EngineCore::Abort(const std::string& request_id, const Status& error) {
  if (auto g = groups_.find(request_id); g != groups_.end()) {
    const std::vector<std::string> choices = g->second;
    for (const std::string& id : choices) Abort(id, error);
    return true;
  }
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  if (error.ok()) {
    GenerationOutput out;
    Finish(it->second, FinishReason::kAborted, std::move(out));
  } else {
    Fail(request_id, error);
  }
  return true;
}

void EngineCore::ExpireDeadlines(std::chrono::steady_clock::time_point now) {
  std::vector<std::string> expired;
  for (const auto& [id, st] : requests_) {
    if (st.request.deadline && *st.request.deadline <= now) expired.push_back(id);
  }
  for (const auto& id : expired) {
    Fail(id, Status(StatusCode::kDeadlineExceeded, "deadline exceeded"));
  }
}

void EngineCore::OnToken(RequestState& st, Sequence& seq, const SampledToken& tok) {
  const auto now = std::chrono::steady_clock::now();
  if (seq.output_ids.size() == 1) {
    // A request's first token is its choice 0's (the others start after its prefill).
    if (st.choice == 0) metrics_->ttft.Observe(Seconds(now - st.request.arrival_time));
  } else {
    metrics_->itl.Observe(Seconds(now - st.last_token_time));
  }
  st.last_token_time = now;
  metrics_->generation_tokens.Inc();
  const StoppingParams& stop = st.request.stopping;
  const int n_out = static_cast<int>(seq.output_ids.size());
  GenerationOutput out;
  out.token_ids.push_back(tok.token);
  if (st.request.sampling.logprobs > 0) out.logprobs.push_back(tok);

  FinishReason reason = FinishReason::kNone;
  bool emit_text = true;
  if (st.matcher && st.matcher->IsTerminated()) {
    // The grammar accepted EOS: the output is complete whatever min_tokens or ignore_eos say.
    reason = FinishReason::kStop;
    out.matched_stop = "eos";
    emit_text = false;
  } else if (n_out >= stop.min_tokens) {
    const auto& eos = model_->config().eos_token_ids;
    if (std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), tok.token) !=
        stop.stop_token_ids.end()) {
      reason = FinishReason::kStop;
      out.matched_stop = "token:" + std::to_string(tok.token);
      emit_text = false;
    } else if (!stop.ignore_eos && std::find(eos.begin(), eos.end(), tok.token) != eos.end()) {
      reason = FinishReason::kStop;
      out.matched_stop = "eos";
      emit_text = false;
    }
  }
  if (st.decoder && emit_text) {
    std::string matched;
    out.text = st.stop_matcher->Push(st.decoder->Step(tok.token), &matched);
    if (!matched.empty()) {
      reason = FinishReason::kStop;
      out.matched_stop = matched;
    }
  }
  if (reason == FinishReason::kNone &&
      (n_out >= stop.max_tokens || seq.num_tokens() >= seq.max_total_tokens)) {
    reason = FinishReason::kLength;
  }
  if (reason == FinishReason::kNone) {
    st.sink->OnOutput(std::move(out));
    return;
  }
  if (st.decoder && out.matched_stop.empty()) {
    out.text += st.stop_matcher->Push(st.decoder->Flush(), &out.matched_stop);
    out.text += st.stop_matcher->Flush();
  }
  Finish(st, reason, std::move(out));
}

void EngineCore::UpdateGauges() {
  metrics_->running.Set(scheduler_->num_running());
  metrics_->waiting.Set(scheduler_->num_waiting());
  const BlockAllocator& a = scheduler_->allocator();
  metrics_->kv_usage.Set(static_cast<double>(a.num_used()) / a.num_blocks());
  if (const PrefixCache* pc = scheduler_->prefix_cache()) {
    const PrefixCacheStats& ps = pc->stats();
    metrics_->prefix_queries.Inc(static_cast<double>(ps.queries - last_prefix_stats_.queries));
    metrics_->prefix_hits.Inc(static_cast<double>(ps.hits - last_prefix_stats_.hits));
    last_prefix_stats_ = ps;
  }
  const int64_t pre = scheduler_->num_preemptions_total();
  metrics_->preemptions.Inc(static_cast<double>(pre - last_preemptions_));
  last_preemptions_ = pre;
  const int64_t graphs = model_->graph_steps();
  metrics_->graph_steps.Inc(static_cast<double>(graphs - last_graph_steps_));
  last_graph_steps_ = graphs;
}

StepRecord EngineCore::Step() {
  StepRecord record = StepInner();
  metrics_->steps.Inc();
  if (!record.entries.empty()) {
    metrics_->step_schedule.Observe(record.schedule_s);
    metrics_->step_prepare.Observe(record.prepare_s);
    metrics_->step_forward.Observe(record.forward_s);
    metrics_->step_sample.Observe(record.sample_s);
    if (record.mask_s >= 0) metrics_->step_mask.Observe(record.mask_s);
  }
  if (proposer_ || draft_model_ || mtp_) metrics_->step_draft.Observe(record.draft_s);
  if (record.num_drafts > 0) {
    metrics_->step_verify.Observe(record.verify_s);
    metrics_->spec_drafts.Inc(record.num_drafts);
    metrics_->spec_draft_tokens.Inc(record.num_draft_tokens);
    metrics_->spec_accepted_tokens.Inc(record.num_accepted_tokens);
  }
  UpdateGauges();
  return record;
}

// One step reads as the engine runs it: schedule, build the inputs, launch, collect the previous
// overlapped step, then emit this step's tokens (or hold placeholders while it runs on).
StepRecord EngineCore::StepInner() {
  using Clock = std::chrono::steady_clock;
  StepRecord record;
  ProposeDrafts(&record);
  const auto t0 = Clock::now();
  SchedulerOutput sched = scheduler_->Schedule();
  const auto t1 = Clock::now();
  record.schedule_s = Seconds(t1 - t0);
  record.num_preempted = static_cast<int>(sched.preempted.size());
  for (int64_t id : sched.preempted) {
    spdlog::warn("[{}] preempted (KV cache full); will recompute", seq_to_request_[id]);
  }
  if (sched.empty()) {
    // Nothing new to run: read back and stream the last overlapped step.
    if (auto prev = CollectInflight()) StreamCollected(*prev);
    return record;
  }

  const StepStates states = GatherStates(sched);
  NoteScheduled(sched, states, &record);
  const double proposing_s = record.draft_s;
  RunProposerNetwork(sched, states, &record);
  StepBatch in = BuildInputs(sched, states);
  RequestHiddenRows(states, &in);
  const bool overlap = CanOverlap(in, states);
  const auto t2 = Clock::now();
  record.prepare_s = Seconds(t2 - t1) - (record.draft_s - proposing_s);  // the draft model apart

  // This step goes to the device first; the host then reads the previous step's tokens while
  // this one runs (overlap), or waits for this one too (a step that needs the host's sampling).
  // Token masks follow the previous step's tokens: an overlapped step's sampling waits for them
  // on the device while its forward runs; a synchronous step reads that step back first.
  std::vector<int32_t> device_tokens;
  routing_trace_.clear();
  const bool masks = !in.mask_rows.empty();
  std::optional<Collected> prev;
  Status st;
  if (overlap) {
    in.forward.masks_deferred = masks;
    st = model_->Launch(in.forward);
    prev = CollectInflight();
    if (st.ok() && masks) {
      record.mask_s = FillMasks(in, states);
      st = model_->SupplyMasks(std::move(in.forward.token_masks));
    }
  } else {
    if (masks) {
      prev = CollectInflight();
      record.mask_s = FillMasks(in, states);
    }
    st = model_->ForwardSampled(in.forward, &logits_scratch_, &device_tokens);
    if (!masks) prev = CollectInflight();
  }
  const auto t3 = Clock::now();
  record.forward_s = Seconds(t3 - t2);
  if (!st.ok()) spdlog::error("forward pass failed: {}", st.ToString());
  // Placeholders are resolved: the prefix cache may hash the newly computed blocks.
  scheduler_->OnStepDone(sched);
  ReleaseHeldChoices(record);
  if (prev) StreamCollected(*prev);
  if (!st.ok()) {
    FailRows(in.step_seq, Internal("forward pass failed: " + st.message()));
    return record;
  }
  if (routing_observer_) ReportRouting(in.forward.attn, record.entries);
  if (overlap) {
    HoldPlaceholders(std::move(in.row_seq));
  } else {
    EmitTokens(in, states, device_tokens);
    EmitDrafted(in, states, device_tokens, &record);
    KeepHiddenStates(sched, in);
  }
  record.sample_s = Seconds(Clock::now() - t3);
  return record;
}

EngineCore::StepStates EngineCore::GatherStates(const SchedulerOutput& sched) {
  StepStates states;
  states.reserve(sched.seqs.size());
  for (const ScheduledSeq& s : sched.seqs) {
    states.push_back(&requests_.at(seq_to_request_.at(s.seq->id)));
  }
  return states;
}

void EngineCore::NoteScheduled(const SchedulerOutput& sched, const StepStates& states,
                               StepRecord* record) {
  for (size_t k = 0; k < sched.seqs.size(); ++k) {
    const ScheduledSeq& s = sched.seqs[k];
    const Sequence& seq = *s.seq;
    RequestState& rs = *states[k];
    if (!rs.scheduled) {
      rs.scheduled = true;
      if (rs.choice == 0) {  // a request leaves the queue once, with its first choice
        if (dequeue_observer_) dequeue_observer_();
        metrics_->queue_time.Observe(
            Seconds(std::chrono::steady_clock::now() - rs.request.arrival_time));
      }
    }
    const int prompt_len = static_cast<int>(seq.prompt_ids.size());
    record->entries.push_back({seq.id, rs.request.request_id, s.num_tokens,
                               s.start < prompt_len || s.num_tokens - s.num_draft > 1,
                               s.samples && s.start < prompt_len});
  }
}

StepBatch EngineCore::BuildInputs(const SchedulerOutput& sched, const StepStates& states) {
  // Rows whose logits someone reads (logprobs, an observer) come back; the others are sampled on
  // the device with this step's draw, taken here from the request's stream.
  const int vocab = model_->config().vocab_size;
  std::vector<StepBatch::MaskRow> mask_rows;
  const DeviceJobFn device_job = [this, &states, vocab, &mask_rows](size_t k, const Sequence& seq,
                                                                    int draft_row, SamplingJob* job,
                                                                    ForwardBatch* batch) {
    RequestState& rs = *states[k];
    if (rs.request.sampling.logprobs != 0 || logits_observer_) return false;
    if (draft_row >= 0) {
      // A drafted sequence's rows are drawn on the device where the drafts are one-hot (n-gram,
      // greedy drafts: no q to weigh against) and unconstrained (a grammar masks each row by its
      // state after the drafts before it, on the host): each row is its own draw from the
      // target after the earlier drafts, penalties counting them as generated.
      if (rs.matcher || !rs.draft_q.empty()) return false;
      std::vector<PenaltyEntry> entries;
      *job = rs.sampler->DeviceJob(seq.prompt_ids, seq.output_ids, &entries);
      if (HasPenalties(rs.request.sampling)) {
        for (int d = 0; d < draft_row; ++d) CountGenerated(&entries, seq.draft_ids[d]);
      }
      batch->penalties.insert(batch->penalties.end(), entries.begin(), entries.end());
      return true;
    }
    *job = rs.sampler->DeviceJob(seq.prompt_ids, seq.output_ids, &batch->penalties);
    if (rs.matcher) {  // the mask rides with the job, filled by FillMasks
      batch->mask_words = (vocab + 31) / 32;
      const size_t at = batch->token_masks.size();
      batch->token_masks.resize(at + batch->mask_words, 0u);
      job->mask_row = static_cast<int32_t>(at / batch->mask_words);
      mask_rows.push_back({batch->logit_rows.size() - 1, job->mask_row});
    }
    return true;
  };
  StepBatch in = BuildStepBatch(sched, scheduler_->allocator(), scheduler_->config().block_size,
                                model_->samples_on_device(), device_job);
  in.mask_rows = std::move(mask_rows);
  return in;
}

double EngineCore::FillMasks(StepBatch& in, const StepStates& states) {
  const auto t0 = std::chrono::steady_clock::now();
  ForwardBatch& b = in.forward;
  // Each row is one request's grammar state and its own slice of token_masks; the grammars'
  // shared per-position caches are thread-safe.
  mask_pool_->ParallelFor(in.mask_rows.size(), [&](size_t i) {
    const StepBatch::MaskRow& m = in.mask_rows[i];
    RequestState& rs = *states[in.row_step[m.row]];
    FillRowMask(rs, b.token_masks.data() + static_cast<size_t>(m.mask_row) * b.mask_words,
                b.mask_words);
  });
  return Seconds(std::chrono::steady_clock::now() - t0);
}

void EngineCore::FillRowMask(RequestState& rs, uint32_t* dst, int mask_words) {
  rs.matcher->FillNextTokenBitmask(rs.mask.data());
  const int vocab = model_->config().vocab_size;
  // Bits past the grammar's vocabulary (a model vocabulary padded past the tokenizer's) stay 0.
  const size_t n = std::min<size_t>(rs.mask.size(), mask_words);
  std::copy_n(rs.mask.begin(), n, dst);
  std::fill(dst + n, dst + mask_words, 0u);
  const size_t tokens = rs.matcher->compiled().vocab().size();
  if (tokens < static_cast<size_t>(vocab) && tokens % 32 != 0 && tokens / 32 < n) {
    dst[tokens / 32] &= (1u << (tokens % 32)) - 1u;
  }
  if (std::all_of(dst, dst + mask_words, [](uint32_t w) { return w == 0; })) {
    std::fill(dst, dst + mask_words, ~0u);
    if (vocab % 32 != 0) dst[vocab / 32] = (1u << (vocab % 32)) - 1u;
    std::fill(dst + (vocab + 31) / 32, dst + mask_words, 0u);
  }
}

bool EngineCore::CanOverlap(const StepBatch& in, const StepStates& states) const {
  if (!config_.overlap_steps || !model_->samples_on_device() || !model_->supports_overlap() ||
      logits_observer_ || routing_observer_ || !in.drafted.empty() ||
      !in.forward.hidden_rows.empty()) {  // the hidden states are kept after the emission
    return false;
  }
  for (size_t k : in.row_step) {
    if (!Overlappable(*states[k])) return false;
  }
  return true;
}

void EngineCore::HoldPlaceholders(std::vector<int64_t> row_seq) {
  // The tokens arrive with the next step: placeholders until then.
  for (size_t r = 0; r < row_seq.size(); ++r) {
    if (Sequence* seq = scheduler_->Find(row_seq[r])) {
      seq->output_ids.push_back(-static_cast<int32_t>(r) - 1);
    }
  }
  inflight_ = InFlight{std::move(row_seq)};
  metrics_->overlapped_steps.Inc();
}

void EngineCore::EmitTokens(const StepBatch& in, const StepStates& states,
                            const std::vector<int32_t>& device_tokens) {
  for (size_t r = 0; r < in.row_seq.size(); ++r) {
    Sequence* seq = scheduler_->Find(in.row_seq[r]);
    if (seq == nullptr) continue;  // ended while the previous step's tokens were streamed
    RequestState& rs = *states[in.row_step[r]];  // alive while its sequence is
    const SampledToken tok = SampleRow(in.forward, r, rs, *seq, device_tokens);
    if (rs.matcher && !rs.matcher->AcceptToken(tok.token)) {
      Fail(rs.request.request_id, GrammarRefused(tok.token));
      continue;
    }
    seq->output_ids.push_back(tok.token);
    OnToken(rs, *seq, tok);  // may finish and free the sequence
  }
}

SampledToken EngineCore::SampleRow(const ForwardBatch& batch, size_t r, RequestState& rs,
                                   const Sequence& seq, const std::vector<int32_t>& device_tokens) {
  if (!device_tokens.empty() && device_tokens[r] >= 0) {
    SampledToken tok;
    tok.token = device_tokens[r];  // sampled on the device
    return tok;
  }
  const int vocab = model_->config().vocab_size;
  std::span<float> l(logits_scratch_.data() + r * vocab, vocab);
  if (!batch.device_sampled.empty() && batch.device_sampled[r]) {
    // The job's draw is already taken: sample the returned logits with it.
    if (const uint32_t* mask = batch.mask_of(r)) ApplyTokenMask(l, mask, l.size());
    const std::span<const PenaltyEntry> pens(batch.penalties.data() + batch.penalty_indptr[r],
                                             batch.penalties.data() + batch.penalty_indptr[r + 1]);
    return SampleWithJob(l, batch.sampling_jobs[r], pens);
  }
  if (rs.matcher) {
    // Before the sampler: penalties, temperature and the kept set see only allowed tokens.
    rs.matcher->FillNextTokenBitmask(rs.mask.data());
    ApplyTokenMask(l, rs.mask.data(), rs.matcher->compiled().vocab().size());
  }
  if (logits_observer_) logits_observer_(rs.request.request_id, l);
  return rs.sampler->Sample(l, seq.prompt_ids, seq.output_ids);
}

Status EngineCore::set_routing_observer(RoutingObserver f) {
  if (!model_->set_routing_trace(f ? &routing_trace_ : nullptr) && f) {
    return FailedPrecondition("this model records no MoE routing (Model::set_routing_trace)");
  }
  routing_observer_ = std::move(f);
  return Status::Ok();
}

void EngineCore::ReportRouting(const AttentionBatch& batch,
                               const std::vector<StepRecord::Entry>& entries) {
  for (const MoeRoutingDecision& d : routing_trace_) {
    // The sequence whose query rows [q_indptr[s], q_indptr[s + 1]) hold the decision's row.
    const auto it = std::upper_bound(batch.q_indptr.begin(), batch.q_indptr.end(), d.row);
    const size_t s = static_cast<size_t>(it - batch.q_indptr.begin()) - 1;
    LLM_CHECK(s < entries.size()) << "routing decision for row " << d.row << " outside the batch";
    routing_observer_(entries[s].request_id, d);
  }
  routing_trace_.clear();
}

bool EngineCore::Overlappable(const RequestState& st) const {
  const SamplingParams& p = st.request.sampling;
  // A speculating request overlaps its steps without drafts under n-gram speculation only, which
  // proposes past a token still on the device (ProposeDrafts' late proposal); a step with drafts
  // never overlaps (CanOverlap). The draft model and the MTP layer read tokens the host holds, and
  // a constrained request's drafts wait for its grammar to take the pending token.
  const bool spec_blocks = Speculates(st) && (!proposer_ || st.matcher);
  return !spec_blocks && p.logprobs == 0 && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
}

std::optional<EngineCore::Collected> EngineCore::CollectInflight() {
  if (!inflight_) return std::nullopt;
  Collected c{std::move(*inflight_), {}, Status::Ok(), {}};
  inflight_.reset();
  c.status = model_->Collect(&c.tokens);
  if (!c.status.ok()) {
    spdlog::error("reading back the previous step failed: {}", c.status.ToString());
    return c;
  }
  const InFlight& f = c.step;
  const std::vector<int32_t>& tokens = c.tokens;
  LLM_CHECK_EQ(tokens.size(), f.row_seq.size());
  for (size_t r = 0; r < f.row_seq.size(); ++r) {
    Sequence* seq = scheduler_->Find(f.row_seq[r]);
    if (seq == nullptr) continue;  // aborted, expired or finished while on the device
    LLM_CHECK(!seq->output_ids.empty() && seq->output_ids.back() == -static_cast<int32_t>(r) - 1)
        << "sequence " << seq->id << " lost its placeholder for row " << r;
    LLM_CHECK(tokens[r] >= 0) << "no token for an overlapped row";
    seq->output_ids.back() = tokens[r];
    RequestState& rs = requests_.at(seq_to_request_.at(seq->id));
    if (rs.matcher && !rs.matcher->AcceptToken(tokens[r])) {
      c.refused.resize(tokens.size(), 0);
      c.refused[r] = 1;
    }
  }
  return c;
}

void EngineCore::StreamCollected(const Collected& c) {
  if (!c.status.ok()) {
    FailRows(c.step.row_seq, Internal("forward pass failed: " + c.status.message()));
    return;
  }
  for (size_t r = 0; r < c.step.row_seq.size(); ++r) {
    Sequence* seq = scheduler_->Find(c.step.row_seq[r]);
    if (seq == nullptr) continue;
    RequestState& rs = requests_.at(seq_to_request_.at(seq->id));
    if (r < c.refused.size() && c.refused[r]) {
      Fail(rs.request.request_id, GrammarRefused(c.tokens[r]));
      continue;
    }
    SampledToken tok;
    tok.token = c.tokens[r];
    OnToken(rs, *seq, tok);  // may finish the request
  }
}

Status EngineCore::GrammarRefused(int32_t token) {
  return Internal("token " + std::to_string(token) + " is outside the request's grammar");
}

void EngineCore::FailRows(const std::vector<int64_t>& seq_ids, const Status& error) {
  for (int64_t id : seq_ids) {
    auto it = seq_to_request_.find(id);
    if (it != seq_to_request_.end()) Fail(it->second, error);
  }
}

}  // namespace llm
