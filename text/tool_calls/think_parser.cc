// `<think>...</think>` reasoning (Qwen3, DeepSeek-R1, QwQ): the output opens with <think> (or
// the prompt left it open), and what follows </think> is the answer, handed to the inner
// parser for tool calls. An output cut off inside the thinking is reasoning.
#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

class ThinkParser final : public ChatOutputParser {
 public:
  ThinkParser(bool starts_in_reasoning, std::unique_ptr<ChatOutputParser> inner)
      : state_(starts_in_reasoning ? State::kReasoning : State::kStart), inner_(std::move(inner)) {}

  ParsedDelta Push(std::string_view text) override {
    if (state_ == State::kAnswer) return Answer(text);
    buf_ += text;
    ParsedDelta d;
    Run(&d, false);
    return d;
  }
  ParsedDelta Finish() override {
    ParsedDelta d;
    Run(&d, true);
    if (state_ == State::kReasoning) d.reasoning += buf_;
    if (state_ != State::kAnswer) d.Append(Answer(buf_));  // kStart: no <think>, all answer
    buf_.clear();
    if (inner_) d.Append(inner_->Finish());
    return d;
  }

 private:
  enum class State { kStart, kReasoning, kAnswer };

  ParsedDelta Answer(std::string_view text) {
    if (inner_) return inner_->Push(text);
    ParsedDelta d;
    d.content = std::string(text);
    return d;
  }

  void Run(ParsedDelta* d, bool final) {
    if (state_ == State::kStart) {
      const size_t p = tool_scan::SkipSpace(buf_, 0);
      const std::string_view rest = std::string_view(buf_).substr(p);
      if (rest.substr(0, kOpen.size()) == kOpen) {
        buf_.erase(0, p + kOpen.size());
        state_ = State::kReasoning;
      } else if (!final && kOpen.substr(0, rest.size()) == rest) {
        return;  // only whitespace or a prefix of <think> so far
      } else {
        state_ = State::kAnswer;
        std::string all = std::move(buf_);
        buf_.clear();
        d->Append(Answer(all));
        return;
      }
    }
    if (state_ == State::kReasoning) {
      if (!tool_scan::TakeUntil(buf_, kClose, final, &d->reasoning)) return;
      std::string rest = std::move(buf_);
      buf_.clear();
      state_ = State::kAnswer;
      d->Append(Answer(rest));
    }
  }

  State state_;
  std::string buf_;
  std::unique_ptr<ChatOutputParser> inner_;
};

}  // namespace

std::unique_ptr<ChatOutputParser> CreateThinkParser(bool starts_in_reasoning,
                                                    std::unique_ptr<ChatOutputParser> inner) {
  return std::make_unique<ThinkParser>(starts_in_reasoning, std::move(inner));
}

}  // namespace llm::tool_parsers
