#include "text/jinja/string_methods.h"

#include <cerrno>
#include <cstdlib>

#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include "text/jinja/error.h"
#include "text/jinja/python_format.h"

namespace llm::jinja {

namespace {

// str.isspace() code points, as UTF-8.
bool IsPyWhitespace(const std::string& c) {
  if (c.size() == 1) {
    unsigned char b = c[0];
    return b == ' ' || (b >= 0x09 && b <= 0x0D) || (b >= 0x1C && b <= 0x1F);
  }
  static const char* kSpaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001",
                                  "\u2002", "\u2003", "\u2004", "\u2005", "\u2006",
                                  "\u2007", "\u2008", "\u2009", "\u200a", "\u2028",
                                  "\u2029", "\u202f", "\u205f", "\u3000"};
  for (const char* s : kSpaces) {
    if (c == s) return true;
  }
  return false;
}

bool IsAsciiAlpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace

namespace {

std::u16string ToUtf16(const std::string& s) {
  std::u16string out(s.size() + 1, u'\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strFromUTF8WithSub(reinterpret_cast<UChar*>(out.data()), static_cast<int32_t>(out.size()), &len,
                       s.data(), static_cast<int32_t>(s.size()), 0xFFFD, nullptr, &err);
  out.resize(U_SUCCESS(err) ? len : 0);
  return out;
}

std::string ToUtf8(const std::u16string& s) {
  std::string out(s.size() * 3 + 1, '\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len,
              reinterpret_cast<const UChar*>(s.data()), static_cast<int32_t>(s.size()), &err);
  out.resize(U_SUCCESS(err) ? len : 0);
  return out;
}

// Full (SpecialCasing) mapping with the root locale, as Python's str.upper/lower do.
std::string MapCase(const std::string& s, bool upper) {
  bool ascii = true;
  for (unsigned char c : s) ascii = ascii && c < 0x80;
  if (ascii) {
    std::string out = s;
    for (char& c : out) {
      if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
      if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  std::u16string src = ToUtf16(s);
  std::u16string dst(src.size() * 3 + 4, u'\0');
  UErrorCode err = U_ZERO_ERROR;
  auto fn = upper ? u_strToUpper : u_strToLower;
  int32_t len =
      fn(reinterpret_cast<UChar*>(dst.data()), static_cast<int32_t>(dst.size()),
         reinterpret_cast<const UChar*>(src.data()), static_cast<int32_t>(src.size()), "", &err);
  if (U_FAILURE(err)) return s;
  dst.resize(len);
  return ToUtf8(dst);
}

// Python's str.capitalize/title first letter: the code point's titlecase mapping.
std::string TitleChar(const std::string& c) {
  std::u16string u = ToUtf16(c);
  if (u.empty()) return c;
  UChar32 cp;
  int32_t i = 0;
  U16_NEXT(u.data(), i, static_cast<int32_t>(u.size()), cp);
  UChar32 t = u_totitle(cp);
  std::u16string out;
  if (t <= 0xFFFF) {
    out += static_cast<char16_t>(t);
  } else {
    out += static_cast<char16_t>(U16_LEAD(t));
    out += static_cast<char16_t>(U16_TRAIL(t));
  }
  return ToUtf8(out);
}

bool IsCased(const std::string& c) {
  std::u16string u = ToUtf16(c);
  if (u.empty()) return false;
  UChar32 cp;
  int32_t i = 0;
  U16_NEXT(u.data(), i, static_cast<int32_t>(u.size()), cp);
  return u_hasBinaryProperty(cp, UCHAR_CASED);
}

}  // namespace

std::string PyLower(const std::string& s) {
  return MapCase(s, false);
}
std::string PyUpper(const std::string& s) {
  return MapCase(s, true);
}

std::string PyCapitalize(const std::string& s) {
  std::vector<std::string> cs = Utf8Chars(s);
  if (cs.empty()) return s;
  return TitleChar(cs[0]) + PyLower(s.substr(cs[0].size()));
}

std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const std::string& c : Utf8Chars(s)) {
    bool cased = IsCased(c);
    out += cased ? (prev_cased ? PyLower(c) : TitleChar(c)) : c;
    prev_cased = cased;
  }
  return out;
}

std::string JinjaTitle(const std::string& s) {
  // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s))
  std::string out;
  std::vector<std::string> cs = Utf8Chars(s);
  auto is_sep = [](const std::string& c) {
    return c == "-" || c == "(" || c == "{" || c == "[" || c == "<" || IsPyWhitespace(c);
  };
  size_t i = 0;
  while (i < cs.size()) {
    size_t j = i;
    bool sep = is_sep(cs[i]);
    std::string rest;
    while (j < cs.size() && is_sep(cs[j]) == sep) {
      if (j > i) rest += cs[j];
      ++j;
    }
    out += PyUpper(cs[i]) + PyLower(rest);
    i = j;
  }
  return out;
}

std::string PyStrip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<std::string> cs = Utf8Chars(s);
  std::vector<std::string> set = chars ? Utf8Chars(*chars) : std::vector<std::string>{};
  auto strip = [&](const std::string& c) {
    if (!chars) return IsPyWhitespace(c);
    for (const auto& x : set) {
      if (x == c) return true;
    }
    return false;
  };
  size_t b = 0, e = cs.size();
  if (left) {
    while (b < e && strip(cs[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cs[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::string PyReplace(const std::string& s, const std::string& old, const std::string& repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts repl between every character (and at both ends).
    std::vector<std::string> cs = Utf8Chars(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (i < cs.size()) out += cs[i];
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(old, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += repl;
    pos = f + old.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<std::string> PySplit(const std::string& s, const std::string* sep, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) ThrowRender("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        size_t f = s.find(*sep, pos);
        if (f == std::string::npos) break;
        out.push_back(s.substr(pos, f - pos));
        pos = f + sep->size();
      }
      out.push_back(s.substr(pos));
      return out;
    }
    size_t end = s.size();
    std::vector<std::string> rev;
    while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string::npos) break;
      rev.push_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    rev.push_back(s.substr(0, end));
    return std::vector<std::string>(rev.rbegin(), rev.rend());
  }
  std::vector<std::string> cs = Utf8Chars(s);
  if (from_right) {
    std::vector<std::string> rev;
    size_t i = cs.size();
    while (i > 0) {
      while (i > 0 && IsPyWhitespace(cs[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) {
        std::string rest;
        for (size_t k = 0; k < i; ++k) rest += cs[k];
        rev.push_back(rest);
        break;
      }
      size_t e = i;
      while (i > 0 && !IsPyWhitespace(cs[i - 1])) --i;
      std::string w;
      for (size_t k = i; k < e; ++k) w += cs[k];
      rev.push_back(w);
    }
    return std::vector<std::string>(rev.rbegin(), rev.rend());
  }
  size_t i = 0;
  while (i < cs.size()) {
    while (i < cs.size() && IsPyWhitespace(cs[i])) ++i;
    if (i == cs.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      std::string rest;
      for (size_t k = i; k < cs.size(); ++k) rest += cs[k];
      // Python keeps the remainder's trailing whitespace when maxsplit is reached.
      out.push_back(rest);
      return out;
    }
    std::string w;
    while (i < cs.size() && !IsPyWhitespace(cs[i])) w += cs[i++];
    out.push_back(w);
  }
  return out;
}

std::vector<std::string> PySplitLines(const std::string& s) {
  std::vector<std::string> out;
  std::vector<std::string> cs = Utf8Chars(s);
  std::string cur;
  for (size_t i = 0; i < cs.size(); ++i) {
    const std::string& c = cs[i];
    bool brk = c == "\n" || c == "\r" || c == "\v" || c == "\f" || c == "\x1c" || c == "\x1d" ||
               c == "\x1e" || c == "\u0085" || c == "\u2028" || c == "\u2029";
    if (!brk) {
      cur += c;
      continue;
    }
    if (c == "\r" && i + 1 < cs.size() && cs[i + 1] == "\n") ++i;
    out.push_back(cur);
    cur.clear();
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::optional<double> PyParseFloat(const std::string& raw) {
  std::string s = PyStrip(raw, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

std::optional<int64_t> PyParseInt(const std::string& raw, int64_t base) {
  std::string s = PyStrip(raw, nullptr, true, true);
  std::string digits;
  for (char c : s) {
    if (c != '_') digits += c;
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
  if (end != digits.c_str() + digits.size() || errno != 0) return std::nullopt;
  return v;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

int64_t WordCount(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : s) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

}  // namespace llm::jinja
