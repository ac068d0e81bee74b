// The family parsers behind CreateChatOutputParser (chat_output_parser.h), and the bookkeeping
// they share for numbering calls.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "text/tool_calls/chat_output_parser.h"
#include "text/tool_calls/text_scan.h"

namespace llm::tool_parsers {

// Numbers a turn's calls and writes their deltas.
class CallWriter {
 public:
  explicit CallWriter(std::function<std::string()> new_id) : new_id_(std::move(new_id)) {}
  void Begin(ParsedDelta* d, std::string name);
  void Arguments(ParsedDelta* d, std::string fragment);
  // Releases what `s` has ready (its name first) into `d`.
  void Drain(tool_scan::JsonCallStreamer* s, ParsedDelta* d);

 private:
  std::function<std::string()> new_id_;
  int next_index_ = 0;
};

// A parser that buffers what it is given and runs a state machine over the buffer: Push runs it
// on what has come; Finish runs it knowing the output has ended, then Flush says what becomes of
// the text still held back (content, or nothing).
class BufferedParser : public ChatOutputParser {
 public:
  ParsedDelta Push(std::string_view text) final {
    buf_ += text;
    ParsedDelta d;
    Run(&d, /*final=*/false);
    return d;
  }
  ParsedDelta Finish() final {
    ParsedDelta d;
    Run(&d, /*final=*/true);
    Flush(&d);
    buf_.clear();
    return d;
  }

 protected:
  virtual void Run(ParsedDelta* d, bool final) = 0;
  virtual void Flush(ParsedDelta* d) = 0;
  std::string buf_;
};

// Each parses content and tool calls; `new_id` names the calls.
std::unique_ptr<ChatOutputParser> CreateHermesParser(std::function<std::string()> new_id);
std::unique_ptr<ChatOutputParser> CreateLlama3JsonParser(std::function<std::string()> new_id);
std::unique_ptr<ChatOutputParser> CreateMistralParser(std::function<std::string()> new_id);
std::unique_ptr<ChatOutputParser> CreateDeepSeekV3Parser(std::function<std::string()> new_id);
// Harmony carries reasoning (the analysis channel) and calls (to=functions.NAME) in one syntax;
// with `parse_tools` false a call's body is content.
std::unique_ptr<ChatOutputParser> CreateHarmonyParser(bool parse_tools,
                                                      std::function<std::string()> new_id);
// <think>...</think> around whatever `inner` (may be null: plain content) parses after it.
std::unique_ptr<ChatOutputParser> CreateThinkParser(bool starts_in_reasoning,
                                                    std::unique_ptr<ChatOutputParser> inner);

}  // namespace llm::tool_parsers
