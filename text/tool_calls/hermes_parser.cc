// Qwen2.5 / Qwen3 (Hermes) tool calls: `<tool_call>\n{"name": ..., "arguments":
// {...}}\n</tool_call>`, several in a row, text around them content.
#include <optional>

#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {
namespace {

using tool_scan::JsonCallStreamer;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

class HermesParser final : public BufferedParser {
 public:
  explicit HermesParser(std::function<std::string()> new_id) : calls_(std::move(new_id)) {}

 private:
  enum class State { kText, kCall, kAfterCall, kBadCall };

  void Flush(ParsedDelta* d) override {
    // A call cut off keeps what it had; a body that never named a function is dropped.
    if (state_ == State::kText) d->content += buf_;
  }

  void Run(ParsedDelta* d, bool final) override {
    for (;;) {
      if (state_ == State::kText) {
        if (!tool_scan::TakeUntil(buf_, kOpen, final, &d->content)) return;
        call_.emplace();
        state_ = State::kCall;
      } else if (state_ == State::kCall) {
        call_->Feed(buf_);
        buf_.clear();
        if (!call_->Advance()) {
          if (call_->name_known()) {  // broken after the name: the rest up to </tool_call> goes
            calls_.Drain(&*call_, d);
            state_ = State::kBadCall;
            buf_ = call_->text();
          } else {  // not a call after all: the tag is content, what follows is scanned again
            d->content += kOpen;
            buf_ = call_->text();
            call_.reset();
            state_ = State::kText;
          }
          continue;
        }
        calls_.Drain(&*call_, d);
        if (!call_->done()) return;
        buf_ = call_->Leftover();
        call_.reset();
        state_ = State::kAfterCall;
      } else {  // kAfterCall / kBadCall: skip to the closing tag
        call_.reset();
        // Only whitespace is expected; anything else is dropped up to the closing tag, or up to
        // a new call's tag when that comes first.
        const size_t at = buf_.find(kClose), open = buf_.find(kOpen);
        if (open < at) {
          buf_.erase(0, open);
          state_ = State::kText;
          continue;
        }
        if (at == std::string::npos) {
          if (final) buf_.clear();
          return;
        }
        buf_.erase(0, at + kClose.size());
        state_ = State::kText;
      }
    }
  }

  CallWriter calls_;
  State state_ = State::kText;
  std::optional<JsonCallStreamer> call_;
};

}  // namespace

std::unique_ptr<ChatOutputParser> CreateHermesParser(std::function<std::string()> new_id) {
  return std::make_unique<HermesParser>(std::move(new_id));
}

}  // namespace llm::tool_parsers
