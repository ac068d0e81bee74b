#include "engine/runtime/synthetic_model.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/sampling/token_mask.h"

namespace llm {

StatusOr<std::unique_ptr<Model>> SyntheticModel::Create(const ModelLoadOptions& options) {
  auto m = std::make_unique<SyntheticModel>();
  ModelConfig& c = m->config_;
  c.name = "synthetic";
  c.architecture_name = "synthetic";
  c.vocab_size = 32000;
  c.max_position_embeddings = 8192;
  c.num_layers = 1;
  c.hidden_size = c.num_q_heads = c.num_kv_heads = c.head_dim = 1;
  // "synthetic:vocab=1000,max_len=4096,step_delay_ms=20"
  const std::string& dir = options.model_dir;
  const size_t colon = dir.find(':');
  if (colon != std::string::npos) {
    std::stringstream ss(dir.substr(colon + 1));
    std::string kv;
    while (std::getline(ss, kv, ',')) {
      const size_t eq = kv.find('=');
      const std::string k = kv.substr(0, eq);
      const int v = eq == std::string::npos ? 0 : std::atoi(kv.c_str() + eq + 1);
      if (v <= 0) return InvalidArgument("synthetic model option '" + kv + "' needs a value > 0");
      if (k == "vocab")
        c.vocab_size = v;
      else if (k == "max_len")
        c.max_position_embeddings = v;
      else if (k == "device_sampling")
        m->device_sampling_ = true;
      else if (k == "step_delay_ms")
        m->step_delay_ms_ = v;
      else
        return InvalidArgument("unknown synthetic model option '" + k + "'");
    }
  }
  m->num_blocks_ = options.num_kv_blocks > 0 ? options.num_kv_blocks : 65536;
  return std::unique_ptr<Model>(std::move(m));
}

int32_t SyntheticModel::HotToken(const ForwardBatch& batch, int row) const {
  const int32_t id =
      batch.token_ids[row] >= 0 ? batch.token_ids[row] : feed_[-batch.token_ids[row] - 1];
  // splitmix64 finalizer over (id, position): every input bit reaches the output, so greedy
  // chains do not fall into a fixed point and a wrong fed-back id changes what follows.
  uint64_t h = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull +
               static_cast<uint64_t>(batch.positions[row]) * 0xD1B54A32D192ED03ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  return static_cast<int32_t>(h % static_cast<uint64_t>(config_.vocab_size));
}

Status SyntheticModel::CheckIds(const ForwardBatch& batch) const {
  for (int32_t id : batch.token_ids) {
    if (id >= config_.vocab_size || (id < 0 && -(id + 1) >= static_cast<int>(feed_.size()))) {
      return InvalidArgument("token id " + std::to_string(id) + " is not valid in this step");
    }
  }
  return Status::Ok();
}

void SyntheticModel::SetFeed(const ForwardBatch& batch, const std::vector<int32_t>& tokens) {
  const bool all_device = batch.device_sampled.size() == batch.logit_rows.size() &&
                          std::all_of(batch.device_sampled.begin(), batch.device_sampled.end(),
                                      [](uint8_t d) { return d != 0; });
  if (all_device) {
    feed_ = tokens;
  } else {
    feed_.clear();
  }
}

void SyntheticModel::Pace() const {
  if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
}

Status SyntheticModel::Launch(const ForwardBatch& batch) {
  for (uint8_t d : batch.device_sampled) {
    if (!d) return InvalidArgument("a launched forward must sample every row on the device");
  }
  if (batch.device_sampled.size() != batch.logit_rows.size()) {
    return InvalidArgument("a launched forward must sample every row on the device");
  }
  if (deferred_) return FailedPrecondition("the last launched forward still waits for its masks");
  if (batch.masks_deferred) {
    LLM_RETURN_IF_ERROR(CheckIds(batch));
    deferred_ = batch;  // computed when its masks come, with feed_ still the previous forward's
    return Status::Ok();
  }
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  LLM_RETURN_IF_ERROR(ForwardSampled(batch, &logits, &tokens));
  launched_.push_back(std::move(tokens));
  return Status::Ok();
}

Status SyntheticModel::SupplyMasks(std::vector<uint32_t> token_masks) {
  if (!deferred_) return FailedPrecondition("no launched forward waits for masks");
  ForwardBatch batch = std::move(*deferred_);
  deferred_.reset();
  batch.token_masks = std::move(token_masks);
  batch.masks_deferred = false;
  for (const SamplingJob& job : batch.sampling_jobs) {
    if (job.mask_row >= 0 &&
        (static_cast<size_t>(job.mask_row) + 1) * batch.mask_words > batch.token_masks.size()) {
      return InvalidArgument("the supplied masks do not cover the launched forward's rows");
    }
  }
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  LLM_RETURN_IF_ERROR(ForwardSampled(batch, &logits, &tokens));
  launched_.push_back(std::move(tokens));
  return Status::Ok();
}

Status SyntheticModel::Collect(std::vector<int32_t>* tokens) {
  if (launched_.empty()) {
    return FailedPrecondition(deferred_ ? "the launched forward still waits for its masks"
                                        : "no launched forward to collect");
  }
  *tokens = std::move(launched_.front());
  launched_.pop_front();
  return Status::Ok();
}

Status SyntheticModel::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  LLM_RETURN_IF_ERROR(CheckIds(batch));
  Pace();
  const int v = config_.vocab_size;
  logits->assign(batch.logit_rows.size() * static_cast<size_t>(v), 0.0f);
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    (*logits)[r * v + HotToken(batch, batch.logit_rows[r])] = 10.0f;
  }
  return Status::Ok();
}

Status SyntheticModel::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                      std::vector<int32_t>* tokens) {
  if (batch.device_sampled.empty()) {
    tokens->clear();
    LLM_RETURN_IF_ERROR(Forward(batch, logits));
    feed_.clear();
    return Status::Ok();
  }
  LLM_RETURN_IF_ERROR(CheckIds(batch));
  Pace();
  const int v = config_.vocab_size;
  const size_t rows = batch.logit_rows.size();
  logits->assign(rows * static_cast<size_t>(v), 0.0f);
  tokens->assign(rows, -1);
  std::vector<float> row(v);
  for (size_t r = 0; r < rows; ++r) {
    const int32_t hot = HotToken(batch, batch.logit_rows[r]);
    if (!batch.device_sampled[r]) {
      (*logits)[r * v + hot] = 10.0f;
      continue;
    }
    const SamplingJob& job = batch.sampling_jobs[r];
    const bool penalized = batch.penalty_indptr[r + 1] > batch.penalty_indptr[r];
    const uint32_t* mask = batch.mask_of(r);
    if (job.temperature == 0.0f && !penalized && mask == nullptr) {
      (*tokens)[r] = hot;  // the argmax of the row, without building it
      continue;
    }
    std::fill(row.begin(), row.end(), 0.0f);
    row[hot] = 10.0f;
    if (mask != nullptr) ApplyTokenMask(row, mask, row.size());
    const std::span<const PenaltyEntry> pens(batch.penalties.data() + batch.penalty_indptr[r],
                                             batch.penalties.data() + batch.penalty_indptr[r + 1]);
    (*tokens)[r] = SampleWithJob(row, job, pens).token;
  }
  SetFeed(batch, *tokens);
  return Status::Ok();
}

}  // namespace llm
