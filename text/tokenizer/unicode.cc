#include "text/tokenizer/unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "base/check.h"

namespace llm::tokenizer_internal {

std::string NormalizeUnicode(std::string_view text, NormalizationForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalizationForm::kNfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalizationForm::kNfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalizationForm::kNfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalizationForm::kNfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  LLM_CHECK(U_SUCCESS(status) && n != nullptr) << "ICU normalizer unavailable: " << status;
  icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  icu::UnicodeString out = n->normalize(in, status);
  LLM_CHECK(U_SUCCESS(status)) << "ICU normalization failed: " << status;
  std::string result;
  out.toUTF8String(result);
  return result;
}

std::string ToLowerUnicode(std::string_view text) {
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  s.toLower(icu::Locale::getRoot());
  std::string result;
  s.toUTF8String(result);
  return result;
}

size_t DecodeUtf8At(std::string_view text, size_t pos, uint32_t* code_point) {
  const auto c = static_cast<unsigned char>(text[pos]);
  size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  len = std::min(len, text.size() - pos);
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t i = 1; i < len; ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3Fu);
  *code_point = cp;
  return len;
}

size_t DecodeUtf8Before(std::string_view text, size_t end, uint32_t* code_point) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  DecodeUtf8At(text, start, code_point);
  return start;
}

bool IsWhitespace(uint32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool IsAlphanumeric(uint32_t c) {
  if (u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC)) return true;
  const int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

}  // namespace llm::tokenizer_internal
