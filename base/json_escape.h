// JSON string literals: the one escaper behind grammar literals (raw UTF-8) and the Jinja tojson
// filter (Python json.dumps, whose default ensure_ascii=True writes non-ASCII as \uXXXX).
#pragma once

#include <string>
#include <string_view>

namespace llm {

enum class JsonNonAscii {
  kRaw,     // bytes >= 0x80 are copied as they are (json.dumps ensure_ascii=False)
  kEscape,  // each code point >= 0x80 becomes \uXXXX, above U+FFFF a surrogate pair
};

// Appends `text` to `out` as a quoted JSON string, escaped as Python's json.dumps does: \" \\ \b
// \f \n \r \t, other control characters as \u00XX, '/' unescaped, DEL as \u007f under kEscape
// only. Under kEscape a byte that does not start a valid UTF-8 sequence is written as \u00XX of
// its value.
void AppendJsonString(std::string_view text, JsonNonAscii non_ascii, std::string& out);

// The same, returned as a new string.
std::string JsonQuoted(std::string_view text, JsonNonAscii non_ascii);

}  // namespace llm
