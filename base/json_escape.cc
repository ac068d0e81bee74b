#include "base/json_escape.h"

#include <cstdint>
#include <cstdio>

#include "base/utf8.h"

namespace llm {

namespace {

void AppendU4(std::string& out, uint32_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(v));
  out += buf;
}

}  // namespace

void AppendJsonString(std::string_view text, JsonNonAscii non_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          // ensure_ascii escapes all but printable ASCII, so DEL as well.
          if (c < 0x20 || (c == 0x7F && non_ascii == JsonNonAscii::kEscape)) {
            AppendU4(out, c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    if (non_ascii == JsonNonAscii::kRaw) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t n = Utf8SeqLen(text, i);
    uint32_t cp = DecodeUtf8(text, i, n);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      AppendU4(out, 0xD800 + (cp >> 10));
      AppendU4(out, 0xDC00 + (cp & 0x3FF));
    } else {
      AppendU4(out, cp);
    }
    i += n;
  }
  out += '"';
}

std::string JsonQuoted(std::string_view text, JsonNonAscii non_ascii) {
  std::string out;
  out.reserve(text.size() + 2);
  AppendJsonString(text, non_ascii, out);
  return out;
}

}  // namespace llm
