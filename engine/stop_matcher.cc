#include "engine/stop_matcher.h"

#include <algorithm>

namespace llm {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

std::string StopMatcher::Push(const std::string& delta, std::string* matched) {
  if (stops_.empty()) return delta;
  held_ += delta;
  // Earliest match wins.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos != std::string::npos && pos < best) {
      best = pos;
      *matched = s;
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  const size_t limit = std::min(held_.size(), max_stop_len_ - 1);
  for (size_t len = limit; len > 0; --len) {
    const std::string_view tail(held_.data() + held_.size() - len, len);
    const bool is_prefix = std::any_of(stops_.begin(), stops_.end(), [&](const std::string& s) {
      return s.size() > len && std::string_view(s).substr(0, len) == tail;
    });
    if (is_prefix) {
      keep = len;
      break;
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace llm
