#include "text/tokenizer/byte_level.h"

#include <algorithm>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace llm::tokenizer_internal {
namespace {

struct ByteTables {
  std::array<std::string, 256> byte_to_unicode;
  std::array<int16_t, 512> unicode_to_byte;  // every mapped code point is below 512
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables;
    t->unicode_to_byte.fill(-1);
    // Printable bytes keep their own code point; the rest are shifted to 256, 257, ... in byte
    // order so every token is printable text (this is exactly GPT-2's bytes_to_unicode()).
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      AppendUtf8(cp, &t->byte_to_unicode[b]);
      t->unicode_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

// Length of a well-formed UTF-8 character starting at in[0] given in the Unicode table 3-7
// sense; 0 when in[0] cannot start one. `lo`/`hi` bound the second byte.
int LeadInfo(unsigned char c, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;
  if (c < 0xE0) return 2;
  if (c < 0xF0) {
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;  // no surrogates
    return 3;
  }
  if (c < 0xF5) {
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;  // nothing above U+10FFFF
    return 4;
  }
  return 0;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Per-thread PCRE2 scratch: match data and JIT stack are mutable, the compiled code is not.
struct MatchScratch {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    // One ovector pair is enough: we only need the whole match, and pcre2_match still fills it
    // (returning 0) for patterns with capture groups.
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() {
  return Tables().byte_to_unicode;
}

int UnicodeToByte(uint32_t code_point) {
  return code_point < 512 ? Tables().unicode_to_byte[code_point] : -1;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const auto& map = ByteToUnicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += map[b];
  return out;
}

std::string ByteLevelToBytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    unsigned char c = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    size_t len;
    // The alphabet lies below U+0200, so only 1- and 2-byte characters can be in it.
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      len = 2;
    } else {
      return std::string(token);
    }
    int b = UnicodeToByte(cp);
    if (b < 0) return std::string(token);
    out.push_back(static_cast<char>(b));
    i += len;
  }
  return out;
}

size_t AppendSanitizedUtf8(std::string_view in, bool final, std::string* out) {
  size_t i = 0;
  const size_t n = in.size();
  while (i < n) {
    // Fast path for ASCII runs.
    size_t start = i;
    while (i < n && static_cast<unsigned char>(in[i]) < 0x80) ++i;
    if (i > start) out->append(in.data() + start, i - start);
    if (i == n) break;

    unsigned char lo, hi;
    int len = LeadInfo(static_cast<unsigned char>(in[i]), &lo, &hi);
    if (len == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    // Count how many bytes form a valid prefix of the character.
    int ok = 1;
    while (ok < len && i + ok < n) {
      unsigned char c = static_cast<unsigned char>(in[i + ok]);
      unsigned char l = ok == 1 ? lo : 0x80, h = ok == 1 ? hi : 0xBF;
      if (c < l || c > h) break;
      ++ok;
    }
    if (ok == len) {
      out->append(in.data() + i, len);
      i += len;
    } else if (i + ok == n && !final) {
      return i;  // incomplete but may still become valid
    } else {
      out->append(kReplacement);  // maximal subpart of an ill-formed sequence
      i += ok;
    }
  }
  return n;
}

std::string SanitizeUtf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  AppendSanitizedUtf8(in, /*final=*/true, &out);
  return out;
}

bool IsValidUtf8(std::string_view in) {
  std::string tmp;
  tmp.reserve(in.size());
  AppendSanitizedUtf8(in, /*final=*/true, &tmp);
  return tmp == in;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(error_code, buf, sizeof(buf));
    return InvalidArgument("invalid pre-tokenizer regex '" + std::string(pattern) + "' at offset " +
                           std::to_string(error_offset) + ": " +
                           reinterpret_cast<const char*>(buf));
  }
  // JIT is an optimization only: when unavailable pcre2_match falls back to the interpreter.
  bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Regex>(new Regex(code, jit));
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  MatchScratch& scratch = Scratch();
  LLM_CHECK(scratch.match_data != nullptr) << "pcre2 match data allocation failed";
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    // The text is validated UTF-8 (the caller sanitizes), so skip PCRE2's own check.
    int rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, scratch.match_data,
                         scratch.context);
    if (rc < 0) break;  // no match, or a resource limit: the rest stays unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_data);
    size_t begin = ov[0], end = ov[1];
    if (end <= begin || begin < pos) {
      // Empty match: step over one character so the scan always progresses.
      size_t next = std::max(begin, pos) + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) {
        ++next;
      }
      pos = next;
      continue;
    }
    out->emplace_back(begin, end);
    pos = end;
  }
}

std::vector<std::string> Regex::Matches(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> ranges;
  FindAll(text, &ranges);
  std::vector<std::string> result;
  for (auto [b, e] : ranges) result.emplace_back(text.substr(b, e - b));
  return result;
}

}  // namespace llm::tokenizer_internal
