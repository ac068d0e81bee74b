// DeepSeek-V3 tool calls: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
// ```json\n{...}\n```<｜tool▁call▁end｜>` per call, newline-separated, then
// `<｜tool▁calls▁end｜>`; V3.1 writes `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}` instead.
// Text before the calls is content.
#include <optional>

#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {
namespace {

using tool_scan::JsonValueStreamer;

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kFence = "```";
constexpr size_t kMaxHead = 256;  // a type or name longer than this is not one

bool StartsWith(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

class DeepSeekV3Parser final : public BufferedParser {
 public:
  explicit DeepSeekV3Parser(std::function<std::string()> new_id) : calls_(std::move(new_id)) {}

 private:
  enum class State {
    kContent,
    kBetween,
    kHead,
    kAfterSep,
    kName,
    kFence,
    kArgs,
    kAfterArgs,
    kDrop
  };

  void Flush(ParsedDelta* d) override {
    if (state_ == State::kContent) d->content += buf_;
  }

  void Run(ParsedDelta* d, bool final) override {
    for (;;) {
      switch (state_) {
        case State::kContent: {
          if (!tool_scan::TakeUntil(buf_, kCallsBegin, final, &d->content)) return;
          state_ = State::kBetween;
          break;
        }
        case State::kBetween: {
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          const std::string_view rest = std::string_view(buf_).substr(p);
          if (StartsWith(rest, kCallBegin)) {
            buf_.erase(0, p + kCallBegin.size());
            state_ = State::kHead;
          } else if (StartsWith(rest, kCallsEnd)) {
            buf_.erase(0, p + kCallsEnd.size());
            state_ = State::kContent;
          } else if (!final && (StartsWith(kCallBegin, rest) || StartsWith(kCallsEnd, rest))) {
            return;
          } else {
            buf_.erase(0, p);
            state_ = State::kContent;
          }
          break;
        }
        case State::kHead: {
          const StateResult r = TakeHead(buf_, kSep, kMaxHead, final, &head_);
          if (r == StateResult::kWait) return;
          state_ = r == StateResult::kDone ? State::kAfterSep : State::kDrop;
          break;
        }
        case State::kAfterSep: {
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          if (p == buf_.size()) return Wait(final);
          if (buf_[p] == '{' || buf_[p] == '[') {  // V3.1: the head was the name
            calls_.Begin(d, Trim(head_));
            args_.emplace();
            state_ = State::kArgs;
          } else {
            state_ = State::kName;
          }
          break;
        }
        case State::kName: {
          std::string name;
          const StateResult r = TakeHead(buf_, "\n", kMaxHead, final, &name);
          if (r == StateResult::kWait) return;
          if (r == StateResult::kBroken) {
            state_ = State::kDrop;
            break;
          }
          calls_.Begin(d, Trim(std::move(name)));
          state_ = State::kFence;
          break;
        }
        case State::kFence: {  // ```json, then the arguments on the next line
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          const std::string_view rest = std::string_view(buf_).substr(p);
          if (rest.size() < kFence.size() && StartsWith(kFence, rest) && !final) return;
          if (StartsWith(rest, kFence)) {
            const size_t nl = buf_.find('\n', p);
            if (nl == std::string::npos) return Wait(final);
            buf_.erase(0, nl + 1);
          }
          args_.emplace();
          state_ = State::kArgs;
          break;
        }
        case State::kArgs: {
          const StateResult r = StreamArguments(*args_, buf_, calls_, d);
          if (r == StateResult::kWait) return;
          args_.reset();
          state_ = r == StateResult::kDone ? State::kAfterArgs : State::kDrop;
          break;
        }
        case State::kAfterArgs: {  // the closing fence, then the call's end marker
          const size_t at = buf_.find(kCallEnd);
          if (at == std::string::npos) return Wait(final);
          buf_.erase(0, at + kCallEnd.size());
          state_ = State::kBetween;
          break;
        }
        case State::kDrop:
          buf_.clear();
          return;
      }
    }
  }

  static std::string Trim(std::string s) {
    const size_t b = tool_scan::SkipSpace(s, 0);
    s.erase(0, b);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }

  CallWriter calls_;
  State state_ = State::kContent;
  std::string head_;
  std::optional<JsonValueStreamer> args_;
};

}  // namespace

std::unique_ptr<ChatOutputParser> CreateDeepSeekV3Parser(std::function<std::string()> new_id) {
  return std::make_unique<DeepSeekV3Parser>(std::move(new_id));
}

}  // namespace llm::tool_parsers
