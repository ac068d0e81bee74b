// Tests for the JSON string escaper in base/: every expectation is Python's json.dumps output
// (ensure_ascii=True for kEscape, ensure_ascii=False for kRaw), except the invalid UTF-8 cases,
// which json.dumps cannot receive.
#include <catch2/catch.hpp>

#include <string>

#include "base/json_escape.h"

namespace llm {
namespace {

std::string Escaped(const std::string& s) {
  return JsonQuoted(s, JsonNonAscii::kEscape);
}
std::string Raw(const std::string& s) {
  return JsonQuoted(s, JsonNonAscii::kRaw);
}

TEST_CASE("JSON escaper: ASCII specials and control characters as json.dumps", "[json_escape]") {
  // json.dumps('a"b\\c/d\x00\x01\x1f\b\f\n\r\t')
  const std::string in = std::string("a\"b\\c/d") + std::string(1, '\0') + "\x01\x1f\b\f\n\r\t";
  const std::string want = R"("a\"b\\c/d\u0000\u0001\u001f\b\f\n\r\t")";
  CHECK(Escaped(in) == want);
  CHECK(Raw(in) == want);
  CHECK(Escaped("") == "\"\"");
  // DEL: json.dumps('\x7f') and json.dumps('\x7f', ensure_ascii=False).encode()
  CHECK(Escaped("\x7f") == R"("\u007f")");
  CHECK(Raw("\x7f") == "\"\x7f\"");
  CHECK(Raw("~ plain") == "\"~ plain\"");
}

TEST_CASE("JSON escaper: ensure_ascii writes u-escapes and surrogate pairs", "[json_escape]") {
  // json.dumps('é€😀') and json.dumps('\u2028\ufeff\x80\U0010ffff')
  CHECK(Escaped("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") == R"("\u00e9\u20ac\ud83d\ude00")");
  CHECK(Escaped("\xE2\x80\xA8\xEF\xBB\xBF\xC2\x80\xF4\x8F\xBF\xBF") ==
        R"("\u2028\ufeff\u0080\udbff\udfff")");
}

TEST_CASE("JSON escaper: raw mode copies UTF-8 unchanged", "[json_escape]") {
  // json.dumps('é€😀\u2028', ensure_ascii=False).encode()
  CHECK(Raw("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xE2\x80\xA8") ==
        "\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xE2\x80\xA8\"");
  // Bytes that are not UTF-8 pass through untouched.
  CHECK(Raw("a\xFF\xC3") == "\"a\xFF\xC3\"");
}

TEST_CASE("JSON escaper: invalid UTF-8 under ensure_ascii escapes each stray byte",
          "[json_escape]") {
  // A lone continuation byte, a truncated two-byte lead at the end, a lead followed by ASCII.
  CHECK(Escaped("\x80") == R"("\u0080")");
  CHECK(Escaped("a\xC3") == R"("a\u00c3")");
  CHECK(Escaped("\xE2x") == R"("\u00e2x")");
}

}  // namespace
}  // namespace llm
