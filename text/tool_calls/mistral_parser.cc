// Mistral tool calls: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]` (Mistral
// 7B v0.3, Nemo, Small before 3.2) and `[TOOL_CALLS]name[ARGS]{...}` (tokenizer v11 and later:
// Small 3.2, Devstral, Magistral). Text before the first [TOOL_CALLS] is content.
#include <optional>

#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {
namespace {

using tool_scan::JsonCallStreamer;
using tool_scan::JsonValueStreamer;

constexpr std::string_view kToolCalls = "[TOOL_CALLS]";
constexpr std::string_view kArgs = "[ARGS]";
// A function name longer than this before [ARGS] means the text is not the v11 form.
constexpr size_t kMaxName = 256;

class MistralParser final : public BufferedParser {
 public:
  explicit MistralParser(std::function<std::string()> new_id) : calls_(std::move(new_id)) {}

 private:
  enum class State { kContent, kAfterTag, kItem, kSeparator, kName, kArgs, kDrop };

  void Flush(ParsedDelta* d) override {
    if (state_ == State::kContent) d->content += buf_;
  }

  void Run(ParsedDelta* d, bool final) override {
    for (;;) {
      switch (state_) {
        case State::kContent: {
          if (!tool_scan::TakeUntil(buf_, kToolCalls, final, &d->content)) return;
          state_ = State::kAfterTag;
          break;
        }
        case State::kAfterTag: {
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          if (p == buf_.size()) return Wait(final);
          if (buf_[p] == '[') {
            buf_.erase(0, p + 1);
            state_ = State::kItem;
          } else {
            buf_.erase(0, p);
            state_ = State::kName;
          }
          break;
        }
        case State::kItem: {
          if (!call_) {
            const size_t p = tool_scan::SkipSpace(buf_, 0);
            if (p == buf_.size()) return Wait(final);
            if (buf_[p] == ']') {
              buf_.erase(0, p + 1);
              state_ = State::kContent;
              break;
            }
            buf_.erase(0, p);
            call_.emplace();
          }
          const StateResult r = StreamJsonCall(*call_, buf_, calls_, d);
          if (r == StateResult::kWait) return;
          call_.reset();
          state_ = r == StateResult::kDone ? State::kSeparator : State::kDrop;
          break;
        }
        case State::kSeparator: {
          const size_t p = tool_scan::SkipSpace(buf_, 0);
          if (p == buf_.size()) return Wait(final);
          const char c = buf_[p];
          buf_.erase(0, p + 1);
          state_ = c == ',' ? State::kItem : c == ']' ? State::kContent : State::kDrop;
          break;
        }
        case State::kName: {
          std::string name;
          const StateResult r = TakeHead(buf_, kArgs, kMaxName, final, &name);
          if (r == StateResult::kWait) return;
          if (r == StateResult::kBroken) {
            state_ = State::kDrop;
            break;
          }
          while (!name.empty() && (name.back() == ' ' || name.back() == '\n')) name.pop_back();
          calls_.Begin(d, std::move(name));
          args_.emplace();
          state_ = State::kArgs;
          break;
        }
        case State::kArgs: {
          const StateResult r = StreamArguments(*args_, buf_, calls_, d);
          if (r == StateResult::kWait) return;
          args_.reset();
          // After the arguments another [TOOL_CALLS] may follow.
          state_ = r == StateResult::kDone ? State::kContent : State::kDrop;
          break;
        }
        case State::kDrop:
          buf_.clear();
          return;
      }
    }
  }

  CallWriter calls_;
  State state_ = State::kContent;
  std::optional<JsonCallStreamer> call_;
  std::optional<JsonValueStreamer> args_;
};

}  // namespace

std::unique_ptr<ChatOutputParser> CreateMistralParser(std::function<std::string()> new_id) {
  return std::make_unique<MistralParser>(std::move(new_id));
}

}  // namespace llm::tool_parsers
