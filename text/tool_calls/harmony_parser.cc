// gpt-oss harmony: the output is a sequence of messages `HEADER<|message|>BODY<|end|>` (or
// <|call|>, <|return|>), each after <|start|> but the first (the prompt ends with
// `<|start|>assistant`). The header names the channel (`<|channel|>analysis` is reasoning,
// `final` and plain `commentary` are content) and a recipient (`to=functions.NAME`: the body is
// that call's JSON arguments), in either order.
#include "text/tool_calls/family_parsers.h"

namespace llm::tool_parsers {
namespace {

constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::string_view kReturn = "<|return|>";
// A header longer than this is not one: the text is content.
constexpr size_t kMaxHeader = 512;

// The word after `key` in `header` (up to a space or the next special token), empty if none.
std::string WordAfter(const std::string& header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string::npos) return "";
  size_t b = at + key.size(), e = b;
  while (e < header.size() && header[e] != ' ' && header[e] != '<' && header[e] != '\n') ++e;
  return header.substr(b, e - b);
}

class HarmonyParser final : public BufferedParser {
 public:
  HarmonyParser(bool parse_tools, std::function<std::string()> new_id)
      : parse_tools_(parse_tools), calls_(std::move(new_id)) {}

 private:
  enum class State { kHeader, kBody, kPlain };
  enum class Route { kReasoning, kContent, kCall };

  void Flush(ParsedDelta* d) override {
    // A header cut off says nothing; plain text that never became a header is content.
    if (state_ == State::kHeader && buf_.find("<|") == std::string::npos) d->content += buf_;
  }

  void Run(ParsedDelta* d, bool final) override {
    for (;;) {
      if (state_ == State::kPlain) {
        d->content += buf_;
        buf_.clear();
        return;
      }
      if (state_ == State::kHeader) {
        const size_t at = buf_.find(kMessage);
        if (at == std::string::npos || at > kMaxHeader) {
          // Decided alike however the text arrives: a header ends within kMaxHeader bytes.
          if (at != std::string::npos || buf_.size() >= kMaxHeader + kMessage.size()) {
            state_ = State::kPlain;
            continue;
          }
          return;
        }
        std::string header = buf_.substr(0, at);
        buf_.erase(0, at + kMessage.size());
        if (header.rfind(kStart, 0) == 0) header.erase(0, kStart.size());
        OpenMessage(header, d);
        state_ = State::kBody;
        continue;
      }
      // kBody: up to the message's end.
      size_t end = std::string::npos, len = 0;
      for (std::string_view m : {kEnd, kCall, kReturn, kStart}) {
        const size_t at = buf_.find(m);
        if (at < end) {
          end = at;
          len = m == kStart ? 0 : m.size();  // <|start|> without an end: the next header's
        }
      }
      const size_t upto = end != std::string::npos
                              ? end
                              : buf_.size() - (final ? 0
                                                     : tool_scan::PartialMarkerLength(
                                                           buf_, {kEnd, kCall, kReturn, kStart}));
      Emit(buf_.substr(0, upto), d);
      buf_.erase(0, upto);
      if (end == std::string::npos) return;
      buf_.erase(0, len);
      state_ = State::kHeader;
    }
  }

  void OpenMessage(const std::string& header, ParsedDelta* d) {
    const std::string channel = WordAfter(header, kChannel);
    std::string recipient = WordAfter(header, "to=");
    if (!recipient.empty() && recipient != "assistant" && parse_tools_) {
      if (recipient.rfind("functions.", 0) == 0) recipient.erase(0, 10);
      calls_.Begin(d, recipient);
      route_ = Route::kCall;
    } else {
      route_ = channel == "analysis" ? Route::kReasoning : Route::kContent;
    }
  }

  void Emit(std::string text, ParsedDelta* d) {
    if (text.empty()) return;
    switch (route_) {
      case Route::kReasoning:
        d->reasoning += text;
        break;
      case Route::kContent:
        d->content += text;
        break;
      case Route::kCall:
        calls_.Arguments(d, std::move(text));
        break;
    }
  }

  bool parse_tools_;
  CallWriter calls_;
  State state_ = State::kHeader;
  Route route_ = Route::kContent;
};

}  // namespace

std::unique_ptr<ChatOutputParser> CreateHarmonyParser(bool parse_tools,
                                                      std::function<std::string()> new_id) {
  return std::make_unique<HarmonyParser>(parse_tools, std::move(new_id));
}

}  // namespace llm::tool_parsers
