#include "engine/runtime/tensor_parallel_model.h"

#include <string>

namespace llm {

TensorParallelModel::TensorParallelModel(std::unique_ptr<CommunicatorGroup> group,
                                         std::vector<std::unique_ptr<Model>> ranks,
                                         std::function<Status(int)> on_rank_thread)
    : group_(std::move(group)),
      on_rank_thread_(std::move(on_rank_thread)),
      ranks_(std::move(ranks)),
      logits_(ranks_.size()),
      tokens_(ranks_.size()),
      status_(ranks_.size()) {
  LLM_CHECK(!ranks_.empty() && static_cast<int>(ranks_.size()) == group_->size());
  pending_ = size() - 1;  // the threads' starts
  for (int r = 1; r < size(); ++r) threads_.emplace_back([this, r] { RankThread(r); });
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  for (int r = 1; r < size() && start_status_.ok(); ++r) start_status_ = status_[r];
}

TensorParallelModel::~TensorParallelModel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
  if (on_rank_thread_) (void)on_rank_thread_(0);
  ranks_[0].reset();
}

void TensorParallelModel::RankThread(int r) {
  Status started = on_rank_thread_ ? on_rank_thread_(r) : Status::Ok();
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  status_[r] = std::move(started);
  if (--pending_ == 0) done_.notify_one();
  for (;;) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) {
      lock.unlock();
      ranks_[r].reset();  // on the rank's thread (its device)
      return;
    }
    seen = generation_;
    const std::function<Status(int)>* job = job_;
    lock.unlock();
    Status st = (*job)(r);
    lock.lock();
    status_[r] = std::move(st);
    if (--pending_ == 0) done_.notify_one();
  }
}

Status TensorParallelModel::RunOnEveryRank(const std::function<Status(int)>& job) {
  LLM_RETURN_IF_ERROR(start_status_);
  if (on_rank_thread_) LLM_RETURN_IF_ERROR(on_rank_thread_(0));
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    pending_ = size() - 1;
    ++generation_;
  }
  start_.notify_all();
  status_[0] = job(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  for (const Status& st : status_) {
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status TensorParallelModel::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  return RunOnEveryRank(
      [&](int r) { return ranks_[r]->Forward(batch, r == 0 ? logits : &logits_[r]); });
}

Status TensorParallelModel::CheckSameTokens(const std::vector<int32_t>& tokens) const {
  for (int r = 1; r < size(); ++r) {
    if (tokens_[r] != tokens) {
      return Internal("tensor-parallel rank " + std::to_string(r) +
                      " sampled other tokens than rank 0");
    }
  }
  return Status::Ok();
}

Status TensorParallelModel::ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                                           std::vector<int32_t>* tokens) {
  LLM_RETURN_IF_ERROR(RunOnEveryRank([&](int r) {
    return ranks_[r]->ForwardSampled(batch, r == 0 ? logits : &logits_[r],
                                     r == 0 ? tokens : &tokens_[r]);
  }));
  return CheckSameTokens(*tokens);
}

Status TensorParallelModel::Launch(const ForwardBatch& batch) {
  return RunOnEveryRank([&](int r) { return ranks_[r]->Launch(batch); });
}

Status TensorParallelModel::SupplyMasks(std::vector<uint32_t> token_masks) {
  // Every rank reads the same masks at once: each takes a copy.
  return RunOnEveryRank([&](int r) { return ranks_[r]->SupplyMasks(token_masks); });
}

Status TensorParallelModel::Collect(std::vector<int32_t>* tokens) {
  LLM_RETURN_IF_ERROR(
      RunOnEveryRank([&](int r) { return ranks_[r]->Collect(r == 0 ? tokens : &tokens_[r]); }));
  return CheckSameTokens(*tokens);
}

Status TensorParallelModel::AllocateKvCache(int num_blocks) {
  return RunOnEveryRank([&](int r) { return ranks_[r]->AllocateKvCache(num_blocks); });
}

}  // namespace llm
