// Prometheus metrics: thread-safe counters, gauges and histograms, rendered as text exposition.
// The engine thread records; the HTTP thread renders.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace llm {

class Counter {
 public:
  void Inc(double v = 1.0);
  double value() const;

 private:
  mutable std::mutex mu_;
  double value_ = 0.0;
};

class Gauge {
 public:
  void Set(double v);
  double value() const;

 private:
  mutable std::mutex mu_;
  double value_ = 0.0;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Cumulative counts per bucket (last is +Inf), plus sum and count.
  void Snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, non-cumulative; last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// The server's metrics, named after vLLM's with an `llm_` prefix.
struct EngineMetrics {
  EngineMetrics();

  Histogram ttft;                       // llm_time_to_first_token_seconds
  Histogram itl;                        // llm_inter_token_latency_seconds
  Histogram e2e;                        // llm_e2e_request_latency_seconds
  Histogram queue_time;                 // llm_request_queue_time_seconds
  Gauge running, waiting;               // llm_num_requests_running / _waiting
  Gauge kv_usage;                       // llm_kv_cache_usage_perc (0..1)
  Counter prefix_queries, prefix_hits;  // llm_prefix_cache_{queries,hits}_total (blocks)
  Counter preemptions;                  // llm_num_preemptions_total
  Counter prompt_tokens, generation_tokens;
  Counter steps;             // llm_engine_steps_total
  Counter graph_steps;       // llm_engine_graph_steps_total: forwards replayed from CUDA graphs
  Counter overlapped_steps;  // llm_engine_overlapped_steps_total: queued before the previous
                             // step's tokens were read
  // Where a non-empty engine step's time goes (llm_engine_step_{schedule,prepare,forward,sample}
  // _seconds): scheduling, batch preparation, the model forward (on a GPU, until the stream has
  // finished the step), and sampling + detokenizing + streaming the step's tokens.
  Histogram step_schedule, step_prepare, step_forward, step_sample;
  // Speculative decoding, named after vLLM's spec_decode metrics: llm_spec_decode_num_drafts_total
  // (sequence-steps that verified drafts), _num_draft_tokens_total, _num_accepted_tokens_total;
  // the acceptance rate (accepted / draft tokens) and the mean accepted tokens per verified
  // sequence-step are rendered from them as gauges. Step phases: llm_engine_step_draft_seconds
  // (the proposer, per step while a method is on) and llm_engine_step_verify_seconds (host-side
  // acceptance and streaming of a step that verified drafts; its forward is in step_forward).
  Counter spec_drafts, spec_draft_tokens, spec_accepted_tokens;
  Histogram step_draft, step_verify;
  // llm_engine_step_mask_seconds: filling the token masks of a step's constrained rows (part of
  // `forward`; hidden behind the device's forward in an overlapped step).
  Histogram step_mask;

  void CountOutcome(const std::string& outcome);  // llm_requests_total{outcome=...}
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, double> outcomes_;
};

}  // namespace llm
