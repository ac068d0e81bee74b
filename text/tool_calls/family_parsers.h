// The family parsers behind CreateChatOutputParser (chat_output_parser.h), and the bookkeeping
// they share for numbering calls.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

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
  // A state waiting for more text: at the end of the output what it holds is dropped.
  void Wait(bool final) {
    if (final) buf_.clear();
  }
  std::string buf_;
};

// ---- States the family parsers share (call_states.cc). Each consumes the parser's buffer and
// says how far it got: kWait (more text must come), kDone (the buffer holds what follows) or
// kBroken (the text is not what the state expects; the parser drops or re-reads it).
enum class StateResult { kWait, kDone, kBroken };

// A name or head that ends at `marker` within max_len characters: *head gets the text before it
// and the buffer what follows. Decided alike however the text arrives: broken once the marker
// stands, or could only stand, past max_len.
StateResult TakeHead(std::string& buf, std::string_view marker, size_t max_len, bool final,
                     std::string* head);
// One JSON call object (`{"name": ..., <arguments key>: {...}}`) streamed into `calls` as it
// comes; on kBroken the call was sent as far as it went if its name was complete
// (JsonCallStreamer::name_known), else nothing was sent.
StateResult StreamJsonCall(tool_scan::JsonCallStreamer& call, std::string& buf, CallWriter& calls,
                           ParsedDelta* d);
// A call's JSON arguments value, streamed into `calls` (after CallWriter::Begin) as it comes.
StateResult StreamArguments(tool_scan::JsonValueStreamer& args, std::string& buf, CallWriter& calls,
                            ParsedDelta* d);

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
