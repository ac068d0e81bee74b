// tokenizer.json "decoder": ByteFallback, Fuse, Strip, Replace, Metaspace, ByteLevel and Sequence,
// as HF tokenizers chains them (each step maps the list of token strings to a new list, and the
// result is joined). A missing decoder joins the tokens with spaces, as HF does.
//
// For streaming the chain must be decodable window by window: per-token steps, then optionally
// Fuse followed only by Strip (its `start` counts at the text start, its `stop` at the end), with
// ByteLevel, when present, last. Chains outside that shape are refused by name.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "text/tokenizer/byte_level.h"

namespace llm::tokenizer_internal {

class Decoder {
 public:
  // `j` may be null.
  static StatusOr<std::unique_ptr<Decoder>> FromJson(const nlohmann::json& j);

  // Decodes a window of token strings. `at_start`: the window begins the text (Metaspace's first
  // token and a fused Strip's `start` apply); `at_end`: it ends the text (a fused Strip's
  // `stop` applies). The result is raw bytes: after ByteLevel they may be ill-formed UTF-8.
  // `*stable` (optional) receives the length of the prefix that no further token can change.
  std::string Decode(std::span<const std::string> tokens, bool at_start, bool at_end,
                     size_t* stable = nullptr) const;

 private:
  struct Step {
    enum class Kind { kReplace, kByteFallback, kStrip, kMetaspace, kFuse, kByteLevel };
    Kind kind;
    std::string pattern;            // Replace{String}; Strip / Metaspace character
    std::unique_ptr<Regex> regex;   // Replace{Regex}
    std::string content;            // Replace content
    int start = 0, stop = 0;        // Strip
    bool metaspace_prepend = true;  // Metaspace: prepend_scheme != never
  };
  Status Parse(const nlohmann::json& j);
  Status Validate();
  std::vector<std::string> Run(std::span<const std::string> tokens, bool at_start,
                               bool at_end) const;

  bool none_ = false;  // no decoder: tokens joined with " "
  std::vector<Step> steps_;
  bool has_byte_fallback_ = false;
  const Step* fused_strip_ = nullptr;  // Strip after Fuse, if any
};

// "<0xNN>" -> NN, as HF's ByteFallback reads it; -1 otherwise.
int ByteFallbackValue(std::string_view token);

}  // namespace llm::tokenizer_internal
