// tokenizer.json "added_tokens" with their flags, matched as HF tokenizers does: tokens with
// normalized=false are split out of the raw text first; each remaining piece is normalized and
// tokens with normalized=true (whose own content is normalized too) are split out of it.
// Matching is leftmost-longest; single_word requires non-word characters (or the text edge)
// on both sides; lstrip / rstrip absorb the whitespace to the left / right into the token.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace llm::tokenizer_internal {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// A piece of input: either an added token (`id` >= 0) or text still to be tokenized.
struct TextSegment {
  std::string text;
  int32_t id = -1;
  bool at_origin = false;  // begins at offset 0 of the input
};

class AddedVocabulary {
 public:
  Status Parse(const nlohmann::json& added_tokens);
  // Builds both matchers; `normalizer` (may be null) normalizes the normalized=true contents.
  void Build(const Normalizer* normalizer);

  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits `text`. `normalized_pass` selects the normalized=true tokens, else the others.
  void Split(std::string_view text, bool at_origin, bool normalized_pass,
             std::vector<TextSegment>* out) const;

 private:
  struct Matcher {
    // (pattern, index into tokens_), bucketed by first byte, longest first.
    std::array<std::vector<std::pair<std::string, size_t>>, 256> by_first_byte;
    bool empty = true;
  };
  std::vector<AddedToken> tokens_;
  Matcher raw_, normalized_;
};

}  // namespace llm::tokenizer_internal
