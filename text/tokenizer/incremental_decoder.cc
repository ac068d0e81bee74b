#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/tokenizer.h"

namespace llm {

namespace {

// Clean-up patterns all start with a space and span at most 4 characters; the " ' " rule can
// chain into another rule within two more, so text this far behind the last space is settled.
constexpr size_t kCleanupHorizon = 6;

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::Emit(std::string text, bool final) {
  if (!tokenizer_.clean_up_tokenization_spaces()) return text;
  cleanup_pending_ += text;
  // Settle the longest prefix with no space among its last kCleanupHorizon bytes: no clean-up
  // match can then straddle the cut. The cut is the text end or a space, so never mid-character.
  size_t cut = cleanup_pending_.size();
  while (!final && cut > 0) {
    const size_t from = cut > kCleanupHorizon ? cut - kCleanupHorizon : 0;
    const size_t space = cleanup_pending_.find(' ', from);
    if (space >= cut) break;
    cut = space;
  }
  std::string out = CleanUpTokenizationSpaces(cleanup_pending_.substr(0, cut));
  cleanup_pending_.erase(0, cut);
  return out;
}

std::string IncrementalDecoder::Step(int32_t id) {
  const std::string* token = tokenizer_.TokenString(id);
  if (token == nullptr || (skip_special_ && tokenizer_.IsSpecial(id))) return {};
  window_.push_back(*token);
  size_t stable = 0;
  const std::string raw = tokenizer_.DecodeWindow(window_, at_start_, /*at_end=*/false, &stable);
  // Pass on complete characters of the settled part and U+FFFD for sequences that can no longer
  // become valid; the sanitizer never looks past the current character, so piecewise output
  // equals sanitizing the whole.
  std::string out;
  if (stable > consumed_) {
    consumed_ += tokenizer_internal::AppendSanitizedUtf8(
        std::string_view(raw).substr(consumed_, stable - consumed_), /*final=*/false, &out);
  }
  // Start a new window once everything is passed on, so each step decodes only a few tokens.
  // At the text start an empty result keeps the window: a Metaspace or Strip decoder may still
  // remove what the next tokens begin with.
  if (consumed_ == raw.size() && stable == raw.size() && !(at_start_ && raw.empty())) {
    window_.clear();
    consumed_ = 0;
    at_start_ = false;
  }
  return Emit(std::move(out), /*final=*/false);
}

std::string IncrementalDecoder::Flush() {
  std::string out;
  if (!window_.empty()) {
    const std::string raw =
        tokenizer_.DecodeWindow(window_, at_start_, /*at_end=*/true, /*stable=*/nullptr);
    if (raw.size() > consumed_) {
      tokenizer_internal::AppendSanitizedUtf8(std::string_view(raw).substr(consumed_),
                                              /*final=*/true, &out);
    }
  }
  window_.clear();
  consumed_ = 0;
  return Emit(std::move(out), /*final=*/true);
}

}  // namespace llm
