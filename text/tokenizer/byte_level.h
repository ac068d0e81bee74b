// Internals shared by the tokenizer, the incremental decoder and the BPE trainer: the GPT-2
// byte <-> unicode alphabet, UTF-8 validation / repair, and a thin PCRE2 wrapper.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

struct pcre2_real_code_8;  // pcre2_code, kept out of this header

namespace llm::tokenizer_internal {

// GPT-2's reversible mapping of every byte to a printable code point, e.g. ' ' -> 'Ġ' (U+0120).
// Entry b is the UTF-8 encoding of the code point byte b maps to.
const std::array<std::string, 256>& ByteToUnicode();
// Inverse: code point -> byte, or -1 when the code point is not in the alphabet.
int UnicodeToByte(uint32_t code_point);

// Raw bytes -> byte-level alphabet string.
std::string BytesToByteLevel(std::string_view bytes);
// Byte-level token -> raw bytes. Like HF's ByteLevel decoder, a token containing a character
// outside the alphabet is taken verbatim (its own UTF-8 bytes).
std::string ByteLevelToBytes(std::string_view token);

// Appends `in` to `out` with every ill-formed UTF-8 subsequence replaced by U+FFFD, one per
// maximal subpart (the Unicode / WHATWG convention, same as Rust's from_utf8_lossy). When
// `final` is false a trailing sequence that is still a valid prefix of a character is left
// unconsumed. Returns the number of bytes of `in` consumed. Because decisions never depend on
// bytes past the current character, feeding a string in pieces gives the same result as
// feeding it whole.
size_t AppendSanitizedUtf8(std::string_view in, bool final, std::string* out);
std::string SanitizeUtf8(std::string_view in);
bool IsValidUtf8(std::string_view in);
// Appends the UTF-8 encoding of a code point (must be a valid scalar value).
void AppendUtf8(uint32_t code_point, std::string* out);

// Compiled PCRE2 regex (UTF + UCP, JIT when available). Immutable after Compile, so one
// instance may be used from several threads at once.
class Regex {
 public:
  static StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [begin, end) byte ranges of the successive non-overlapping, non-empty matches in
  // `text`, which must be valid UTF-8.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;
  // Convenience for tests: the matched substrings.
  std::vector<std::string> Matches(std::string_view text) const;

  bool jit() const { return jit_; }

 private:
  Regex(pcre2_real_code_8* code, bool jit) : code_(code), jit_(jit) {}
  pcre2_real_code_8* code_;
  bool jit_;
};

}  // namespace llm::tokenizer_internal
