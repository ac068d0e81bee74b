#include "engine/metrics.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace llm {

void Counter::Inc(double v) {
  std::lock_guard<std::mutex> l(mu_);
  value_ += v;
}
double Counter::value() const {
  std::lock_guard<std::mutex> l(mu_);
  return value_;
}
void Gauge::Set(double v) {
  std::lock_guard<std::mutex> l(mu_);
  value_ = v;
}
double Gauge::value() const {
  std::lock_guard<std::mutex> l(mu_);
  return value_;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard<std::mutex> l(mu_);
  counts_[i]++;
  sum_ += v;
  count_++;
}

void Histogram::Snapshot(std::vector<uint64_t>* cumulative, double* sum, uint64_t* count) const {
  std::lock_guard<std::mutex> l(mu_);
  cumulative->resize(counts_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < counts_.size(); ++i) (*cumulative)[i] = acc += counts_[i];
  *sum = sum_;
  *count = count_;
}

namespace {

const std::vector<double> kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                             0.08,  0.1,    0.25,  0.5,  0.75, 1.0,  2.5,
                                             5.0,   7.5,    10.0,  20.0, 40.0, 80.0};
const std::vector<double> kItlBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01,  0.015, 0.02,
                                         0.025,  0.03,  0.04,   0.05,  0.075, 0.1,   0.15,
                                         0.2,    0.3,   0.4,    0.5,   0.75,  1.0,   2.5};
const std::vector<double> kStepBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                          0.015,  0.02,    0.03,   0.05,  0.1,    0.25,  1.0};

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void RenderHistogram(std::ostringstream& os, const char* name, const char* help,
                     const Histogram& h) {
  std::vector<uint64_t> cum;
  double sum;
  uint64_t count;
  h.Snapshot(&cum, &sum, &count);
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    os << name << "_bucket{le=\"" << Num(h.bounds()[i]) << "\"} " << cum[i] << "\n";
  }
  os << name << "_bucket{le=\"+Inf\"} " << cum.back() << "\n";
  os << name << "_sum " << Num(sum) << "\n" << name << "_count " << count << "\n";
}

void RenderScalar(std::ostringstream& os, const char* name, const char* type, const char* help,
                  double v) {
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
     << name << " " << Num(v) << "\n";
}

}  // namespace

EngineMetrics::EngineMetrics()
    : ttft(kLatencyBuckets),
      itl(kItlBuckets),
      e2e(kLatencyBuckets),
      queue_time(kLatencyBuckets),
      step_schedule(kStepBuckets),
      step_prepare(kStepBuckets),
      step_forward(kStepBuckets),
      step_sample(kStepBuckets),
      step_draft(kStepBuckets),
      step_verify(kStepBuckets),
      step_mask(kStepBuckets) {}

void EngineMetrics::CountOutcome(const std::string& outcome) {
  std::lock_guard<std::mutex> l(mu_);
  outcomes_[outcome] += 1;
}

std::string EngineMetrics::Render() const {
  std::ostringstream os;
  RenderHistogram(os, "llm_time_to_first_token_seconds", "Time to first token.", ttft);
  RenderHistogram(os, "llm_inter_token_latency_seconds", "Time between streamed tokens.", itl);
  RenderHistogram(os, "llm_e2e_request_latency_seconds", "Arrival to final token.", e2e);
  RenderHistogram(os, "llm_request_queue_time_seconds", "Arrival to first scheduling.", queue_time);
  RenderScalar(os, "llm_num_requests_running", "gauge", "Requests in the running batch.",
               running.value());
  RenderScalar(os, "llm_num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
               waiting.value());
  RenderScalar(os, "llm_kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (0-1).",
               kv_usage.value());
  RenderScalar(os, "llm_prefix_cache_queries_total", "counter", "Prefix-cache block lookups.",
               prefix_queries.value());
  RenderScalar(os, "llm_prefix_cache_hits_total", "counter", "Prefix-cache block hits.",
               prefix_hits.value());
  RenderScalar(os, "llm_num_preemptions_total", "counter", "Sequences preempted (recompute).",
               preemptions.value());
  RenderScalar(os, "llm_prompt_tokens_total", "counter", "Prompt tokens of ended requests.",
               prompt_tokens.value());
  RenderScalar(os, "llm_generation_tokens_total", "counter", "Generated tokens.",
               generation_tokens.value());
  RenderScalar(os, "llm_engine_steps_total", "counter", "Engine steps run.", steps.value());
  RenderScalar(os, "llm_engine_graph_steps_total", "counter",
               "Model forwards whose layers replayed a CUDA graph (decode steps).",
               graph_steps.value());
  RenderScalar(os, "llm_engine_overlapped_steps_total", "counter",
               "Steps queued on the device before the previous step's tokens were read.",
               overlapped_steps.value());
  RenderHistogram(os, "llm_engine_step_schedule_seconds", "Scheduling per non-empty step.",
                  step_schedule);
  RenderHistogram(os, "llm_engine_step_prepare_seconds", "Batch preparation per step.",
                  step_prepare);
  RenderHistogram(os, "llm_engine_step_forward_seconds", "Model forward per step (device synced).",
                  step_forward);
  RenderHistogram(os, "llm_engine_step_sample_seconds",
                  "Sampling, detokenizing and streaming per step.", step_sample);
  RenderHistogram(os, "llm_engine_step_mask_seconds",
                  "Filling the structured-output token masks of a step that has any.", step_mask);
  RenderHistogram(os, "llm_engine_step_draft_seconds",
                  "Speculative decoding: proposing drafts, per step.", step_draft);
  RenderHistogram(os, "llm_engine_step_verify_seconds",
                  "Speculative decoding: verifying drafts and streaming the accepted tokens, per "
                  "step that verified drafts.",
                  step_verify);
  const double drafts = spec_drafts.value(), draft_tokens = spec_draft_tokens.value();
  const double accepted = spec_accepted_tokens.value();
  RenderScalar(os, "llm_spec_decode_num_drafts_total", "counter",
               "Sequence-steps that verified draft tokens.", drafts);
  RenderScalar(os, "llm_spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
               draft_tokens);
  RenderScalar(os, "llm_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
               accepted);
  RenderScalar(os, "llm_spec_decode_acceptance_rate", "gauge",
               "Accepted over verified draft tokens since start (0 before any).",
               draft_tokens > 0 ? accepted / draft_tokens : 0.0);
  RenderScalar(os, "llm_spec_decode_mean_accepted_tokens", "gauge",
               "Draft tokens accepted per sequence-step that verified drafts, since start.",
               drafts > 0 ? accepted / drafts : 0.0);
  os << "# HELP llm_requests_total Ended requests by outcome.\n# TYPE llm_requests_total counter\n";
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [outcome, n] : outcomes_) {
    os << "llm_requests_total{outcome=\"" << outcome << "\"} " << Num(n) << "\n";
  }
  return os.str();
}

}  // namespace llm
