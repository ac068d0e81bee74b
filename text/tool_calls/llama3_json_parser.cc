// Llama 3.1-3.3 JSON tool calls: the turn is `{"name": ..., "parameters": {...}}` (optionally
// after <|python_tag|>), several separated by `;`. Text that does not open with such an object
// is content; <|python_tag|> later in the text starts calls there.
#include <optional>

#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {
namespace {

using tool_scan::JsonCallStreamer;

constexpr std::string_view kPythonTag = "<|python_tag|>";

class Llama3JsonParser final : public BufferedParser {
 public:
  explicit Llama3JsonParser(std::function<std::string()> new_id) : calls_(std::move(new_id)) {}

 private:
  enum class State { kStart, kContent, kCall, kBetween, kDrop };

  void Flush(ParsedDelta* d) override {
    if (state_ == State::kStart || state_ == State::kContent) d->content += buf_;
    if (state_ == State::kCall && call_ && !call_->name_released()) d->content += call_->text();
  }

  void Run(ParsedDelta* d, bool final) override {
    for (;;) {
      switch (state_) {
        case State::kStart: {
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          const std::string_view rest = std::string_view(buf_).substr(p);
          if (rest.empty()) return;
          if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
            buf_.erase(0, p + kPythonTag.size());
            StartCall("");
          } else if (!final && kPythonTag.substr(0, rest.size()) == rest) {
            return;  // maybe the tag
          } else if (rest[0] == '{') {
            StartCall(buf_.substr(0, p));
            buf_.erase(0, p);
          } else {
            state_ = State::kContent;
          }
          break;
        }
        case State::kContent: {
          if (!tool_scan::TakeUntil(buf_, kPythonTag, final, &d->content)) return;
          StartCall("");
          break;
        }
        case State::kCall: {
          if (!call_) {  // between `;` and the next object
            const size_t p = tool_scan::SkipSpace(buf_, 0);
            if (p == buf_.size()) return Wait(final);
            buf_.erase(0, p);
            call_.emplace();
          }
          const StateResult r = StreamJsonCall(*call_, buf_, calls_, d);
          if (r == StateResult::kWait) return;
          if (r == StateResult::kBroken && !call_->name_known()) {
            // Not a call: the text is content, scanned again.
            d->content += prefix_;
            buf_ = call_->text();
            state_ = State::kContent;
          } else {
            state_ = r == StateResult::kDone ? State::kBetween : State::kDrop;
          }
          prefix_.clear();
          call_.reset();
          break;
        }
        case State::kBetween: {
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          if (p == buf_.size()) return Wait(final);
          if (buf_[p] == ';') {
            buf_.erase(0, p + 1);
            state_ = State::kCall;
          } else {
            buf_.erase(0, p);
            state_ = State::kContent;
          }
          break;
        }
        case State::kDrop:
          buf_.clear();
          return;
      }
    }
  }

  void StartCall(std::string prefix) {
    prefix_ = std::move(prefix);
    call_.reset();
    state_ = State::kCall;
  }

  CallWriter calls_;
  State state_ = State::kStart;
  std::string prefix_;  // whitespace before a tentative call, content again if it is not one
  std::optional<JsonCallStreamer> call_;
};

}  // namespace

std::unique_ptr<ChatOutputParser> CreateLlama3JsonParser(std::function<std::string()> new_id) {
  return std::make_unique<Llama3JsonParser>(std::move(new_id));
}

}  // namespace llm::tool_parsers
