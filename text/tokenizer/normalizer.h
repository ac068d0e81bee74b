// tokenizer.json "normalizer": Prepend, Replace, Strip, Lowercase, NFC/NFD/NFKC/NFKD and Sequence,
// applied in order exactly as HF tokenizers does. Anything else is refused by name at load.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/unicode.h"

namespace llm::tokenizer_internal {

class Normalizer {
 public:
  // `j` is the non-null "normalizer" object.
  static StatusOr<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& j);

  // `text` must be valid UTF-8; so is the result.
  std::string Apply(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kPrepend, kReplace, kStrip, kLowercase, kUnicode };
    Kind kind;
    std::string literal;           // Prepend text, or Replace{String} pattern
    std::unique_ptr<Regex> regex;  // Replace{Regex}
    std::string content;           // Replace content
    bool strip_left = false, strip_right = false;
    NormalizationForm form = NormalizationForm::kNfc;
  };
  Status Parse(const nlohmann::json& j);

  std::vector<Step> steps_;
};

// Replaces every non-overlapping occurrence of `pattern` (a literal when `regex` is null).
std::string ReplaceAll(std::string_view text, const std::string& literal, const Regex* regex,
                       std::string_view content);

}  // namespace llm::tokenizer_internal
