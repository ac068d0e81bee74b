#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"

namespace llm {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::Step(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  pending_ += tokenizer_.TokenBytes(id);
  // Emit complete characters and U+FFFD for sequences that can no longer become valid; keep a
  // trailing partial character for the next token. The sanitizer's decisions never look past
  // the current character, so the concatenated output equals Decode() of all ids.
  std::string out;
  size_t consumed = tokenizer_internal::AppendSanitizedUtf8(pending_, /*final=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out;
  tokenizer_internal::AppendSanitizedUtf8(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace llm
