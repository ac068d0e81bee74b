// One Model over the N rank models of a tensor-parallel group (LoadTensorParallelRank): what the
// engine thread sees when the model is split. Each Forward hands the step's batch, by pointer, to
// N - 1 rank threads that this model owns, runs rank 0 on the calling thread (the engine thread),
// and returns when every rank has finished; the ranks meet in their communicators' collectives,
// and rank 0's logits (gathered from every rank) are the model's. Everything but the forward is
// rank 0's: its configuration, KV cache geometry (per rank: each rank holds its heads' share of
// every block), hidden states and routing trace (every rank routes the same way).
//
// Device sampling and overlapped steps (samples_on_device / supports_overlap: rank 0's) run on
// every rank, not on rank 0 alone: each rank's LM head all-gathers the whole logits, so every
// rank holds the same logit bytes, and a job carries its draw (SamplingJob::u), so every rank
// samples the same tokens. That lets each rank resolve a fed-back id (-(r + 1)) from the tokens
// it keeps on its own device, with no broadcast of rank 0's tokens, and it is cheaper than the
// other ranks' plain Forward, which would copy their whole [rows, vocab] logits to the host: their
// ForwardSampled copies back only the tokens of device-sampled rows. Rank 0's tokens (and logits
// of the rows sampled on the host) are the model's; a rank whose tokens differ fails the step.
// Launch / SupplyMasks return once every rank has queued its part (a CUDA rank returns before its
// step ends; a CPU rank runs it there), Collect once every rank has its tokens.
//
// A rank's device state is its thread's: the optional start hook (`on_rank_thread(r)`, e.g.
// cudaSetDevice for rank r's device) runs first on each rank thread, and on the calling thread
// before rank 0's part of every call; each rank model is destroyed on its own thread too.
//
// Every rank gets the same batch, so a batch one rank refuses, every rank refuses before its
// first collective. A rank that failed inside the layers while the others wait in a collective
// would leave them waiting: the rank models fail only on their inputs.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/runtime/communicator.h"
#include "engine/runtime/model.h"

namespace llm {

class TensorParallelModel final : public Model {
 public:
  // ranks[r]: rank r's model, built with group->rank(r). Returns once every rank thread has run
  // on_rank_thread (start_status() says whether they all succeeded).
  TensorParallelModel(std::unique_ptr<CommunicatorGroup> group,
                      std::vector<std::unique_ptr<Model>> ranks,
                      std::function<Status(int)> on_rank_thread = {});
  ~TensorParallelModel() override;

  int size() const { return static_cast<int>(ranks_.size()); }
  // The first failure of on_rank_thread on a rank thread; a model whose start failed runs no rank
  // (every call returns this status).
  const Status& start_status() const { return start_status_; }
  Model& rank(int r) { return *ranks_[r]; }

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  Status ForwardSampled(const ForwardBatch& batch, std::vector<float>* logits,
                        std::vector<int32_t>* tokens) override;
  bool samples_on_device() const override { return ranks_[0]->samples_on_device(); }
  bool supports_overlap() const override { return ranks_[0]->supports_overlap(); }
  Status Launch(const ForwardBatch& batch) override;
  Status Collect(std::vector<int32_t>* tokens) override;
  Status SupplyMasks(std::vector<uint32_t> token_masks) override;
  bool returns_hidden_states() const override { return ranks_[0]->returns_hidden_states(); }
  std::span<const float> hidden_states() const override { return ranks_[0]->hidden_states(); }
  std::string attention_backend_name() const override {
    return ranks_[0]->attention_backend_name();
  }
  int num_kv_blocks() const override { return ranks_[0]->num_kv_blocks(); }
  Status AllocateKvCache(int num_blocks) override;
  size_t kv_bytes_per_block() const override { return ranks_[0]->kv_bytes_per_block(); }
  std::string kv_cache_dtype_name() const override { return ranks_[0]->kv_cache_dtype_name(); }
  int64_t graph_steps() const override { return ranks_[0]->graph_steps(); }
  bool set_routing_trace(std::vector<MoeRoutingDecision>* trace) override {
    return ranks_[0]->set_routing_trace(trace);
  }

 private:
  // Runs job(r) for every rank r, rank 0 here, the others on their threads; the first failure.
  Status RunOnEveryRank(const std::function<Status(int)>& job);
  // Internal unless every rank drew rank 0's tokens (`tokens`; the others' in tokens_).
  Status CheckSameTokens(const std::vector<int32_t>& tokens) const;
  void RankThread(int r);

  std::unique_ptr<CommunicatorGroup> group_;  // outlives the ranks, which hold its communicators
  std::function<Status(int)> on_rank_thread_;
  Status start_status_;
  std::vector<std::unique_ptr<Model>> ranks_;
  std::vector<std::vector<float>> logits_;    // [ranks]: ranks 1.. write theirs here
  std::vector<std::vector<int32_t>> tokens_;  // [ranks]: ranks 1.. write their sampled tokens

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<Status(int)>* job_ = nullptr;  // the job of generation_
  uint64_t generation_ = 0;
  int pending_ = 0;             // rank threads still running generation_'s job (or starting)
  std::vector<Status> status_;  // [ranks]
  bool stop_ = false;
  std::vector<std::thread> threads_;  // ranks 1..
};

}  // namespace llm
