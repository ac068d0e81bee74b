#include "text/tool_calls/text_scan.h"

#include <nlohmann/json.hpp>

namespace llm::tool_scan {

size_t PartialMarkerLength(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    const size_t most = std::min(text.size(), m.size() - 1);
    for (size_t n = most; n > best; --n) {
      if (text.substr(text.size() - n) == m.substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

bool TakeUntil(std::string& buf, std::string_view marker, bool final, std::string* out) {
  const size_t at = buf.find(marker);
  if (at == std::string::npos) {
    const size_t keep = final ? 0 : PartialMarkerLength(buf, {marker});
    out->append(buf, 0, buf.size() - keep);
    buf.erase(0, buf.size() - keep);
    return false;
  }
  out->append(buf, 0, at);
  buf.erase(0, at + marker.size());
  return true;
}

size_t SkipSpace(std::string_view text, size_t pos) {
  while (pos < text.size() &&
         (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t' || text[pos] == '\r')) {
    ++pos;
  }
  return pos;
}

ScanResult ScanJsonValue(std::string_view text, size_t pos, size_t* end) {
  return JsonValueScanner(pos).Scan(text, end);
}

ScanResult JsonValueScanner::Scan(std::string_view text, size_t* end) {
  if (result_ != ScanResult::kIncomplete) {
    *end = end_;
    return result_;
  }
  if (start_ >= text.size()) return ScanResult::kIncomplete;
  auto scalar_char = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-' || c == '+' || c == '.' ||
           c == 'E';
  };
  auto done = [&](ScanResult r, size_t e) {
    result_ = r;
    end_ = e;
    *end = e;
    return r;
  };
  const char c0 = text[start_];
  if (c0 != '{' && c0 != '[' && c0 != '"') {
    if (!scalar_char(c0)) return done(ScanResult::kInvalid, start_);
    while (pos_ < text.size() && scalar_char(text[pos_])) ++pos_;
    if (pos_ == text.size()) return ScanResult::kIncomplete;  // more digits may follow
    return done(ScanResult::kComplete, pos_);
  }
  // Brackets are matched by count; a mismatched pair is caught when the value is parsed.
  for (; pos_ < text.size(); ++pos_) {
    const char c = text[pos_];
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        if (depth_ == 0) return done(ScanResult::kComplete, pos_ + 1);
      }
      continue;
    }
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if (c == '}' || c == ']') {
      if (--depth_ == 0) return done(ScanResult::kComplete, pos_ + 1);
      if (depth_ < 0) return done(ScanResult::kInvalid, pos_);
    }
  }
  return ScanResult::kIncomplete;
}

namespace {

bool IsArgumentsKey(const std::string& k) {
  return k == "arguments" || k == "parameters";
}

}  // namespace

bool JsonCallStreamer::Advance() {
  const std::string_view t = text_;
  while (state_ != State::kDone && state_ != State::kInvalid) {
    pos_ = SkipSpace(t, pos_);
    if (pos_ >= t.size()) break;
    const char c = t[pos_];
    if (state_ == State::kOpen) {
      if (c != '{') {
        state_ = State::kInvalid;
        break;
      }
      ++pos_;
      state_ = State::kKey;
    } else if (state_ == State::kKey) {
      if (c == '}' && !name_) {
        state_ = State::kInvalid;
        break;
      }
      size_t end = 0;
      const ScanResult r = ScanJsonValue(t, pos_, &end);
      if (r == ScanResult::kIncomplete) break;
      if (r == ScanResult::kInvalid || c != '"') {
        state_ = State::kInvalid;
        break;
      }
      // Model text: a bad escape makes it no JSON key (never an exception).
      const auto key = nlohmann::json::parse(t.substr(pos_, end - pos_), nullptr, false);
      if (!key.is_string()) {
        state_ = State::kInvalid;
        break;
      }
      key_ = key.get<std::string>();
      pos_ = end;
      state_ = State::kColon;
    } else if (state_ == State::kColon) {
      if (c != ':') {
        state_ = State::kInvalid;
        break;
      }
      ++pos_;
      state_ = State::kValue;
    } else if (state_ == State::kValue) {
      size_t end = 0;
      if (!value_) value_.emplace(pos_);
      const ScanResult r = value_->Scan(t, &end);
      if (r == ScanResult::kInvalid) {
        state_ = State::kInvalid;
        break;
      }
      if (IsArgumentsKey(key_) && args_begin_ == std::string::npos) {
        args_begin_ = pos_;
        args_sent_ = pos_;
      }
      if (r == ScanResult::kIncomplete) break;
      const std::string_view value = t.substr(pos_, end - pos_);
      if (key_ == "name" && !name_) {
        auto v = nlohmann::json::parse(value, nullptr, false);
        if (!v.is_string()) {
          state_ = State::kInvalid;
          break;
        }
        name_ = v.get<std::string>();
      } else if (IsArgumentsKey(key_) && args_end_ == std::string::npos) {
        args_end_ = end;
        if (value[0] == '"') {  // arguments as a JSON string: its content is the JSON text
          auto v = nlohmann::json::parse(value, nullptr, false);
          if (!v.is_string()) {
            state_ = State::kInvalid;
            break;
          }
          args_decoded_ = v.get<std::string>();
        }
      }
      pos_ = end;
      value_.reset();
      state_ = State::kComma;
    } else if (state_ == State::kComma) {
      ++pos_;
      if (c == ',') {
        state_ = State::kKey;
      } else if (c == '}') {
        if (!name_) {
          state_ = State::kInvalid;
          break;
        }
        end_ = pos_;
        state_ = State::kDone;
      } else {
        state_ = State::kInvalid;
      }
    }
  }
  return state_ != State::kInvalid;
}

std::optional<std::string> JsonCallStreamer::TakeName() {
  if (!name_ || name_released_) return std::nullopt;
  name_released_ = true;
  return name_;
}

std::string JsonCallStreamer::TakeArguments() {
  if (!name_released_ || args_begin_ == std::string::npos) {
    if (name_released_ && state_ == State::kDone && args_sent_ == 0) {
      args_sent_ = 1;  // a call written without arguments: an empty object
      return "{}";
    }
    return "";
  }
  if (args_decoded_) {
    if (args_sent_ == args_end_) return "";
    args_sent_ = args_end_;
    return *args_decoded_;
  }
  // A string value is sent whole once decoded; an object or array as it arrives.
  if (text_[args_begin_] == '"') return "";
  const size_t upto = args_end_ != std::string::npos ? args_end_ : text_.size();
  if (upto <= args_sent_) return "";
  std::string out = text_.substr(args_sent_, upto - args_sent_);
  args_sent_ = upto;
  return out;
}

std::string JsonValueStreamer::Feed(std::string_view more) {
  if (result_ != ScanResult::kIncomplete) {
    text_ += more;
    return "";
  }
  if (sent_ == 0) {  // nothing of the value yet: drop the whitespace before it
    text_ += more;
    const size_t p = SkipSpace(text_, 0);
    text_.erase(0, p);
  } else {
    text_ += more;
  }
  if (text_.empty()) return "";
  size_t end = 0;
  result_ = scan_.Scan(text_, &end);
  if (result_ == ScanResult::kInvalid) return "";
  const size_t upto = result_ == ScanResult::kComplete ? end : text_.size();
  end_ = upto;
  std::string out = text_.substr(sent_, upto - sent_);
  sent_ = upto;
  return out;
}

}  // namespace llm::tool_scan
