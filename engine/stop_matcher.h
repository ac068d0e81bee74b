// Streams generated text while holding back any tail that could still grow into a stop string,
// so a stop string split across tokens is matched and never emitted.
#pragma once

#include <string>
#include <vector>

namespace llm {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds decoded text. Returns the text that is now safe to emit; sets *matched when a stop
  // string completed (the stop string and anything after it are dropped).
  std::string Push(const std::string& delta, std::string* matched);
  // Releases the held-back tail (call when generation ends without a match).
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet emitted
  size_t max_stop_len_ = 0;
};

}  // namespace llm
