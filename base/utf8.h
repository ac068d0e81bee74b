// Lenient UTF-8 stepping over byte strings that may hold invalid sequences: a byte that does not
// start a complete, well-formed sequence counts as one unit of its own (its value as the code
// point), the way the Jinja filters and the JSON escaper walk text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace llm {

// Length of the UTF-8 sequence starting at s[i]; 1 for a byte that does not start a valid one.
inline size_t Utf8SeqLen(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

// The code point of the n-byte sequence at s[i] (n from Utf8SeqLen); a lone byte is its value.
inline uint32_t DecodeUtf8(std::string_view s, size_t i, size_t n) {
  auto c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

}  // namespace llm
