// tokenizer.json "pre_tokenizer": ByteLevel, Split, Metaspace, Digits and Sequence, applied in
// order as HF tokenizers does (each stage refines the pieces of the previous one). Anything else
// is refused by name at load.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "text/tokenizer/byte_level.h"

namespace llm {
// GPT-2's pre-tokenizer regex, used by ByteLevel with use_regex.
extern const char* const kGpt2PretokenizerRegex;
// The Split regexes of Llama-3 and Qwen2 tokenizers (used by the BPE trainer and tests).
extern const char* const kLlama3PretokenizerRegex;
extern const char* const kQwen2PretokenizerRegex;
}  // namespace llm

namespace llm::tokenizer_internal {

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `j` may be null (the whole text is one piece).
  static StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& j);

  // Appends the pieces of `text` (valid UTF-8). `at_origin`: `text` begins at offset 0 of the
  // caller's input (Metaspace's prepend_scheme "first" prepends only there).
  void Split(std::string_view text, bool at_origin, std::vector<std::string>* out) const;

 private:
  struct Piece {
    std::string text;
    bool at_origin;
  };
  struct Step {
    enum class Kind { kSplit, kByteLevel, kMetaspace };
    Kind kind = Kind::kSplit;
    std::unique_ptr<Regex> regex;  // Split{Regex}, Digits, ByteLevel with use_regex
    std::string literal;           // Split{String}, Metaspace replacement
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;                                              // ByteLevel
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;  // Metaspace
    bool split = true;                                                          // Metaspace
  };
  Status Parse(const nlohmann::json& j);
  void Apply(const Step& step, const Piece& piece, std::vector<Piece>* out) const;

  std::vector<Step> steps_;
};

// Splits `text` at `matches` (sorted, non-overlapping byte ranges) with HF's delimiter
// behavior; appends (begin, end) of the non-empty parts.
void SplitByMatches(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches,
                    SplitBehavior behavior, bool invert,
                    std::vector<std::pair<size_t, size_t>>* parts);

}  // namespace llm::tokenizer_internal
