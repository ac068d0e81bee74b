// Scanning helpers the family parsers share: held-back marker prefixes, JSON value extents, and a
// streamer for a {"name": ..., "arguments": {...}} object arriving in pieces.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace llm::tool_scan {

// The longest suffix of `text` that is a proper prefix of one of `markers`: bytes that must be
// held back until the next delta says whether a marker starts there.
size_t PartialMarkerLength(std::string_view text, std::initializer_list<std::string_view> markers);

// Moves the text of `buf` before `marker` to `out`, drops the marker and returns true. Without
// the marker, moves all of `buf` but an end that may still begin one (all of it when `final`)
// and returns false.
bool TakeUntil(std::string& buf, std::string_view marker, bool final, std::string* out);

size_t SkipSpace(std::string_view text, size_t pos);

enum class ScanResult { kComplete, kIncomplete, kInvalid };

// The extent of the JSON value starting at `pos` (no leading whitespace): strings with escapes,
// nested objects / arrays, literals and numbers. kComplete sets *end one past it; a literal or a
// number at the very end of `text` is kIncomplete (more digits may follow).
ScanResult ScanJsonValue(std::string_view text, size_t pos, size_t* end);

// ScanJsonValue that resumes: called again on the same text grown at its end, it goes on from
// where it stopped, so a value arriving in n pieces is scanned once, not n times.
class JsonValueScanner {
 public:
  explicit JsonValueScanner(size_t start) : start_(start), pos_(start) {}
  ScanResult Scan(std::string_view text, size_t* end);

 private:
  size_t start_, pos_;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
  ScanResult result_ = ScanResult::kIncomplete;
  size_t end_ = 0;
};

// A tool call written as one JSON object, arriving in pieces: the name from `name` and the
// arguments from `arguments` or `parameters` (an object, or a JSON string holding one). The name
// is released as soon as it is complete, the arguments as they arrive once the name is known.
class JsonCallStreamer {
 public:
  void Feed(std::string_view more) { text_ += more; }
  // Advances over what was fed. Returns false once the text is not such an object.
  bool Advance();
  bool done() const { return state_ == State::kDone; }
  bool invalid() const { return state_ == State::kInvalid; }
  // What follows the object once done().
  std::string Leftover() const { return text_.substr(end_); }
  // The name, once, when known (nullopt before and after).
  std::optional<std::string> TakeName();
  // Argument text ready to send (empty when none; never before the name).
  std::string TakeArguments();
  bool name_released() const { return name_released_; }
  // The name is complete: the text is a call, whatever follows (a parser that finds the rest
  // broken still sends the call, as it would have streamed it).
  bool name_known() const { return name_.has_value(); }
  // The whole text fed (for a parser that gives up and sends it as content).
  const std::string& text() const { return text_; }

 private:
  enum class State { kOpen, kKey, kColon, kValue, kComma, kDone, kInvalid };
  std::string text_;
  size_t pos_ = 0;
  size_t end_ = 0;
  State state_ = State::kOpen;
  std::string key_;
  std::optional<std::string> name_;
  bool name_released_ = false;
  // Arguments: their start in text_, how much was sent, and their end once known.
  size_t args_begin_ = std::string::npos;
  size_t args_end_ = std::string::npos;
  size_t args_sent_ = 0;
  std::optional<std::string> args_decoded_;  // arguments given as a JSON string
  std::optional<JsonValueScanner> value_;    // the value being scanned (kValue)
};

// One JSON value (a call's arguments) arriving in pieces, sent on as it arrives; leading
// whitespace is dropped.
class JsonValueStreamer {
 public:
  // Returns the new part of the value; done() once it is complete.
  std::string Feed(std::string_view more);
  bool done() const { return result_ == ScanResult::kComplete; }
  bool invalid() const { return result_ == ScanResult::kInvalid; }
  std::string Leftover() const { return text_.substr(end_); }
  bool started() const { return sent_ > 0; }

 private:
  std::string text_;
  size_t sent_ = 0;
  size_t end_ = 0;
  ScanResult result_ = ScanResult::kIncomplete;
  JsonValueScanner scan_{0};  // text_ starts at the value once sent_ > 0
};

}  // namespace llm::tool_scan
