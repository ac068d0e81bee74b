// Unicode services the tokenizer needs, all through ICU: normalization forms, full lower-case
// mapping and the character classes Rust's `char` methods use (HF tokenizers is written in Rust).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace llm::tokenizer_internal {

enum class NormalizationForm { kNfc, kNfd, kNfkc, kNfkd };

// `text` must be valid UTF-8.
std::string NormalizeUnicode(std::string_view text, NormalizationForm form);
// Full (context-free, locale-independent) lower-casing, as Rust's str::to_lowercase.
std::string ToLowerUnicode(std::string_view text);

// Decodes the code point at text[pos] (valid UTF-8) and returns its byte length.
size_t DecodeUtf8At(std::string_view text, size_t pos, uint32_t* code_point);
// Code point ending at text[end] (exclusive); returns its starting offset.
size_t DecodeUtf8Before(std::string_view text, size_t end, uint32_t* code_point);

// Rust char::is_whitespace (the White_Space property).
bool IsWhitespace(uint32_t c);
// Rust char::is_alphanumeric (Alphabetic or a numeric general category).
bool IsAlphanumeric(uint32_t c);

}  // namespace llm::tokenizer_internal
