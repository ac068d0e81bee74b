// A test model that samples on the device as the CUDA runner does, over any host model.
#pragma once

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/runtime/model.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/token_mask.h"

namespace llm::test {

// The tiny model as a GPU model looks to the engine: rows with a sampling job are drawn "on the
// device" (here SampleWithJob over the row's logits after its token mask, the definition the CUDA
// kernel computes), so constrained rows take the device path with their masks. With `overlap` it
// also overlaps steps as the CUDA runner does: fed-back ids (-(r + 1)) stand for the previous
// forward's tokens, a forward launched with deferred masks is sampled when they come, and it
// refuses what the runner refuses (a launched forward with a row not drawn on the device, a
// forward issued while two launched ones are outstanding). The counters say how it was driven;
// fail_launch / fail_collect inject one failure.
class DeviceSamplingModel final : public Model {
 public:
  explicit DeviceSamplingModel(std::unique_ptr<Model> inner, bool overlap = false)
      : inner_(std::move(inner)), overlap_(overlap) {}
  const ModelConfig& config() const override { return inner_->config(); }
  Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    return inner_->Forward(b, logits);
  }
  bool samples_on_device() const override { return true; }
  Status ForwardSampled(const ForwardBatch& b, std::vector<float>* logits,
                        std::vector<int32_t>* tokens) override {
    if (launched_.size() > 1) return FailedPrecondition("two launched forwards are outstanding");
    LLM_RETURN_IF_ERROR(Sample(b, logits, tokens));
    for (int32_t t : *tokens) sync_drawn_rows += t >= 0 ? 1 : 0;
    return Status::Ok();
  }
  bool supports_overlap() const override { return overlap_; }
  Status Launch(const ForwardBatch& b) override {
    if (launches++ == fail_launch) return Internal("injected launch failure");
    if (launched_.size() > 1) return FailedPrecondition("two launched forwards are outstanding");
    if (deferred_) return FailedPrecondition("a launched forward waits for its masks");
    if (b.device_sampled.size() != b.logit_rows.size() ||
        std::find(b.device_sampled.begin(), b.device_sampled.end(), 0) != b.device_sampled.end()) {
      return InvalidArgument("a launched forward must sample every logit row on the device");
    }
    for (size_t t = 0; t < b.token_ids.size(); ++t) {
      if (b.token_ids[t] >= 0) continue;
      ++fed_back_ids;
      if (static_cast<size_t>(-(b.token_ids[t] + 1)) != t) ++moved_fed_back_ids;
    }
    if (b.masks_deferred) {
      ++deferred_launches;
      deferred_ = b;
      return Status::Ok();
    }
    return Run(b);
  }
  Status SupplyMasks(std::vector<uint32_t> masks) override {
    if (!deferred_) return FailedPrecondition("no launched forward waits for masks");
    ForwardBatch b = std::move(*deferred_);
    deferred_.reset();
    b.token_masks = std::move(masks);
    b.masks_deferred = false;
    return Run(b);
  }
  Status Collect(std::vector<int32_t>* tokens) override {
    if (launched_.empty()) return FailedPrecondition("nothing to collect");
    *tokens = std::move(launched_.front());
    launched_.pop_front();  // a failed collect loses the forward, as the runner's does
    if (collects++ == fail_collect) return Internal("injected collect failure");
    return Status::Ok();
  }
  std::string attention_backend_name() const override { return inner_->attention_backend_name(); }
  int num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  Status AllocateKvCache(int num_blocks) override { return inner_->AllocateKvCache(num_blocks); }
  size_t kv_bytes_per_block() const override { return inner_->kv_bytes_per_block(); }
  // Launched forwards not collected yet.
  int outstanding() const { return static_cast<int>(launched_.size()); }
  int masked_rows = 0;
  int deferred_launches = 0;
  int host_rows = 0;        // logit rows returned to the host (not device-sampled)
  int sync_drawn_rows = 0;  // device-drawn rows of ForwardSampled calls (the host waited for them)
  int launches = 0, collects = 0;
  int max_outstanding = 0;     // most launched forwards uncollected at once
  int fed_back_ids = 0;        // token ids of launched forwards that read the previous forward's
  int moved_fed_back_ids = 0;  // ... of which read another row than their own index
  int fail_launch = -1, fail_collect = -1;  // the index of the call that fails (-1: none)

 private:
  Status Run(const ForwardBatch& b) {
    std::vector<float> logits;
    std::vector<int32_t> tokens;
    LLM_RETURN_IF_ERROR(Sample(b, &logits, &tokens));
    launched_.push_back(std::move(tokens));
    max_outstanding = std::max(max_outstanding, outstanding());
    return Status::Ok();
  }

  // The forward with its device-sampled rows drawn (fed-back ids resolved).
  Status Sample(const ForwardBatch& b, std::vector<float>* logits, std::vector<int32_t>* tokens) {
    ForwardBatch fed = b;
    for (int32_t& id : fed.token_ids) {
      if (id >= 0) continue;
      if (static_cast<size_t>(-(id + 1)) >= feed_.size()) {
        return InvalidArgument("a fed-back id names no row of the previous forward");
      }
      id = feed_[-(id + 1)];
    }
    LLM_RETURN_IF_ERROR(inner_->Forward(fed, logits));
    const size_t v = config().vocab_size;
    tokens->assign(b.logit_rows.size(), -1);
    bool all_device = b.device_sampled.size() == b.logit_rows.size();
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      if (b.device_sampled.empty() || !b.device_sampled[r]) {
        all_device = false;
        ++host_rows;
        continue;
      }
      std::span<float> row(logits->data() + r * v, v);
      if (const uint32_t* mask = b.mask_of(r)) {
        ApplyTokenMask(row, mask, v);
        ++masked_rows;
      }
      const std::span<const PenaltyEntry> pens(b.penalties.data() + b.penalty_indptr[r],
                                               b.penalties.data() + b.penalty_indptr[r + 1]);
      (*tokens)[r] = SampleWithJob(row, b.sampling_jobs[r], pens).token;
    }
    feed_ = all_device ? *tokens : std::vector<int32_t>();
    return Status::Ok();
  }

  std::unique_ptr<Model> inner_;
  bool overlap_;
  std::vector<int32_t> feed_;  // the last forward's tokens by logit row
  std::optional<ForwardBatch> deferred_;
  std::deque<std::vector<int32_t>> launched_;
};

}  // namespace llm::test
