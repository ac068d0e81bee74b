#include "server/generate_reactor.h"

#include <spdlog/spdlog.h>

#include "server/generation_service.h"

namespace llm {
namespace pb = ::llm::v1;

namespace {

pb::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return pb::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return pb::FINISH_REASON_STOP;
    case FinishReason::kAborted:
      return pb::FINISH_REASON_ABORTED;
    case FinishReason::kNone:
      break;
  }
  return pb::FINISH_REASON_UNSPECIFIED;
}

void AddLogprobs(const std::vector<SampledToken>& in,
                 google::protobuf::RepeatedPtrField<pb::TokenLogprob>* out) {
  for (const SampledToken& t : in) {
    pb::TokenLogprob* lp = out->Add();
    lp->set_token_id(t.token);
    lp->set_logprob(t.logprob);
    for (const auto& [id, v] : t.top) {
      pb::TopLogprob* top = lp->add_top();
      top->set_token_id(id);
      top->set_logprob(v);
    }
  }
}

}  // namespace

// The engine's handle on the reactor. Dropping it releases the engine's reference.
class GenerateReactor::Sink final : public ResultSink {
 public:
  explicit Sink(GenerateReactor* r) : r_(r) {}
  ~Sink() override { r_->Unref(); }
  void OnOutput(GenerationOutput out) override { r_->Push(std::move(out)); }

 private:
  GenerateReactor* r_;
};

GenerateReactor::GenerateReactor(RequestGateway* gateway, StreamWriter* writer)
    : gateway_(gateway), writer_(writer) {}

void GenerateReactor::Start(const GenerateParams& params,
                            std::optional<std::chrono::steady_clock::time_point> deadline,
                            const ChatOutputPlan& chat_plan) {
  auto sink = std::make_shared<Sink>(this);
  std::string prompt;
  // Outputs that arrive before parse_ is set wait on mu_.
  std::unique_lock<std::mutex> hold(mu_);
  Status st = gateway_->Submit(params, deadline, sink, &request_id_, &prompt);
  if (st.ok() && chat_plan.parse) {
    parse_ = chat_plan.options;
    parse_->starts_in_reasoning = PromptOpensThinking(prompt);
  }
  hold.unlock();
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    final_ = ToGrpcStatus(st);
  }
  if (!st.ok()) Pump();
  // On success the engine holds the sink; on failure `sink` dies here and drops its reference.
}

void GenerateReactor::Fail(const Status& error) {
  Fail(ToGrpcStatus(error));
}

void GenerateReactor::Fail(const grpc::Status& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_ = error;
  }
  Pump();
  Unref();  // no engine sink will ever exist
}

void GenerateReactor::SetChatOutput(const GenerationOutput& out, pb::ChatOutput* co) {
  std::string& text = texts_[out.index];
  if (out.finished) text += out.text;  // a chunk's text was added as it arrived
  const ParsedMessage m = ParseChatOutput(*parse_, text);
  co->set_content(m.content);
  co->set_reasoning_content(m.reasoning);
  for (const ParsedToolCall& t : m.tool_calls) {
    pb::ToolCall* tc = co->add_tool_calls();
    tc->set_id(t.id);
    tc->set_name(t.name);
    tc->set_arguments(t.arguments);
  }
  text.clear();
}

void GenerateReactor::Push(GenerationOutput out) {
  pb::GenerateResponse msg;
  msg.set_request_id(request_id_);
  bool schedule = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!out.error.ok()) {
      final_ = ToGrpcStatus(out.error);
    } else if (out.finished) {
      pb::GenerateComplete* c = msg.mutable_complete();
      c->set_finish_reason(ToProto(out.finish_reason));
      c->set_matched_stop(out.matched_stop);
      c->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
      c->set_text(out.text);
      if (parse_) SetChatOutput(out, c->mutable_chat_output());
      AddLogprobs(out.logprobs, c->mutable_logprobs());
      c->set_index(out.index);
      c->mutable_usage()->set_prompt_tokens(out.usage.prompt_tokens);
      c->mutable_usage()->set_completion_tokens(out.usage.completion_tokens);
      c->mutable_usage()->set_cached_tokens(out.usage.cached_tokens);
      queue_.push_back(std::move(msg));
      final_ = grpc::Status::OK;
    } else {
      pb::GenerateChunk* c = msg.mutable_chunk();
      c->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
      c->set_text(out.text);
      if (parse_) texts_[out.index] += out.text;
      AddLogprobs(out.logprobs, c->mutable_logprobs());
      c->set_index(out.index);
      if (out.finish_reason != FinishReason::kNone) {  // a choice of n > 1 ended
        c->set_finish_reason(ToProto(out.finish_reason));
        c->set_matched_stop(out.matched_stop);
        if (parse_) SetChatOutput(out, c->mutable_chat_output());
      }
      queue_.push_back(std::move(msg));
    }
    // With a write in flight, OnWriteDone sends this one; otherwise the writer thread starts it.
    schedule = !writing_ && !pump_scheduled_ && !finish_called_;
    if (schedule) pump_scheduled_ = true;
  }
  if (!schedule) return;
  refs_.fetch_add(1, std::memory_order_relaxed);  // held until the queued Pump has run
  writer_->Schedule([this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pump_scheduled_ = false;
    }
    Pump();
    Unref();
  });
}

void GenerateReactor::Pump() {
  enum { kNothing, kWrite, kFinish } action = kNothing;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      action = kWrite;
    } else if (final_) {
      finish_called_ = true;
      status = *final_;
      action = kFinish;
    }
  }
  // gRPC calls happen outside the lock: a reaction may run inline on this thread.
  if (action == kWrite) StartWrite(&current_);
  if (action == kFinish) Finish(status);
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) queue_.clear();  // the stream is broken; only the Finish remains
  }
  if (!ok) gateway_->Abort(request_id_, Status(StatusCode::kCancelled, "stream write failed"));
  Pump();
}

void GenerateReactor::OnCancel() {
  // Client went away or its deadline passed: free the request's resources now.
  gateway_->Abort(request_id_, Status(StatusCode::kCancelled, "cancelled by the client"));
}

void GenerateReactor::OnDone() {
  Unref();
}

void GenerateReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace llm
