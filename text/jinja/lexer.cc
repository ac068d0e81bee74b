#include "text/jinja/lexer.h"

#include <cstring>

#include "text/jinja/error.h"

namespace llm::jinja {

namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// jinja2 normalizes \r\n and \r to \n and drops one trailing newline (keep_trailing_newline off).
std::string NormalizeNewlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal's body, as jinja2 applies it.
std::string Unescape(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          int h = i + 1 + k < body.size() ? HexValue(body[i + 1 + k]) : -1;
          if (h < 0)
            throw JinjaError(ErrorKind::kSyntax,
                             "truncated \\" + std::string(1, e) + " escape in a string literal",
                             line);
          cp = cp * 16 + h;
        }
        i += n;
        AppendUtf8(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + (body[++i] - '0');
          }
          AppendUtf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(NormalizeNewlines(src)) {}

  std::vector<Token> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = FindTagStart(pos_);
      if (start == std::string::npos) {
        Emit(Token::Type::kText, src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      char kind = src_[start + 1];  // '{', '%' or '#'
      char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsSpace(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: whitespace alone between a line start and a block tag is dropped.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool all_space = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && IsSpace(text[i]);
          if (all_space) text.resize(l_pos);
        }
      }
      CountLines(pos_, start);
      Emit(Token::Type::kText, text);
      pos_ = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        line_starting = LexComment();
      } else if (kind == '%' && IsRawBegin()) {
        line_starting = LexRaw();
      } else {
        line_starting = LexTag(kind == '%');
      }
    }
    tokens_.push_back({Token::Type::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  void Emit(Token::Type type, std::string text) {
    if (type == Token::Type::kText && text.empty()) return;
    tokens_.push_back({type, std::move(text), line_});
  }

  // After a closing marker: "-" eats all following whitespace, a plain block end eats one newline.
  // Returns whether what was consumed ended in a newline (jinja2's line_starting).
  bool AfterClose(bool minus, bool trim_newline) {
    size_t before = pos_;
    if (minus) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
    } else if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    CountLines(before, pos_);
    return pos_ > 0 && src_[pos_ - 1] == '\n' && pos_ > before;
  }

  bool LexComment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) throw JinjaError(ErrorKind::kSyntax, "unclosed comment", line_);
    bool minus = end > pos_ && src_[end - 1] == '-';
    bool plus = end > pos_ && src_[end - 1] == '+';
    CountLines(pos_, end);
    pos_ = end + 2;
    return AfterClose(minus, !plus);
  }

  bool IsRawBegin() const {
    size_t p = pos_;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  bool LexRaw() {
    size_t close = src_.find("%}", pos_);
    bool minus = src_[close - 1] == '-';
    pos_ = close + 2;
    AfterClose(minus, false);
    // Find {%[-+]? endraw [-+]?%}
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = p < src_.size() ? src_[p] : '\0';
      if (sign == '-' || sign == '+') ++p;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      bool end_minus = src_.compare(p, 3, "-%}") == 0;
      bool end_plus = src_.compare(p, 3, "+%}") == 0;
      if (!end_minus && !end_plus && src_.compare(p, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, i - pos_);
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (sign != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        bool all_space = l_pos < text.size();
        for (size_t k = l_pos; k < text.size(); ++k) all_space = all_space && IsSpace(text[k]);
        if (l_pos > 0 && all_space) text.resize(l_pos);
      }
      CountLines(pos_, i);
      Emit(Token::Type::kText, text);
      pos_ = p + (end_minus || end_plus ? 3 : 2);
      return AfterClose(end_minus, !end_plus);
    }
    throw JinjaError(ErrorKind::kSyntax, "missing endraw", line_);
  }

  // Expression tokens up to the closing "%}" or "}}".
  bool LexTag(bool block) {
    Emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, block ? "{%" : "{{");
    const char* close = block ? "%}" : "}}";
    int depth = 0;  // brackets: "}}" inside a dict literal is not the end
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        throw JinjaError(ErrorKind::kSyntax,
                         std::string("unexpected end of template, expected '") + close + "'",
                         line_);
      }
      if (depth == 0 || block) {
        bool minus = src_.compare(pos_, 3, std::string("-") + close) == 0;
        bool plus = block && src_.compare(pos_, 3, std::string("+") + close) == 0;
        if (minus || plus || src_.compare(pos_, 2, close) == 0) {
          pos_ += (minus || plus) ? 3 : 2;
          Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, close);
          return AfterClose(minus, block && !plus);
        }
      }
      char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        Emit(Token::Type::kName, src_.substr(b, pos_ - b));
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber();
      } else if (c == '\'' || c == '"') {
        LexString(c);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                     "|",  "(",  ")",  "[",  "]",  "{",  "}", ";"};
        bool matched = false;
        for (const char* op : kOps) {
          size_t n = std::strlen(op);
          if (src_.compare(pos_, n, op) == 0) {
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
            if (op[0] == ')' || op[0] == ']' || op[0] == '}') --depth;
            Emit(Token::Type::kOperator, op);
            pos_ += n;
            matched = true;
            break;
          }
        }
        if (!matched) {
          throw JinjaError(ErrorKind::kSyntax, std::string("unexpected char '") + c + "'", line_);
        }
      }
    }
  }

  void LexNumber() {
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) ||
                                    (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                     std::isdigit(static_cast<unsigned char>(src_[pos_ + 1])))))
        ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        is_float = true;
        pos_ = p;
        digits();
      }
    }
    std::string text;
    for (size_t i = b; i < pos_; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, text);
  }

  void LexString(char quote) {
    size_t b = ++pos_;
    int start_line = line_;
    while (pos_ < src_.size() && src_[pos_] != quote) {
      if (src_[pos_] == '\\') ++pos_;
      if (pos_ < src_.size() && src_[pos_] == '\n') ++line_;
      ++pos_;
    }
    if (pos_ >= src_.size()) {
      throw JinjaError(ErrorKind::kSyntax, "unterminated string literal", start_line);
    }
    tokens_.push_back(
        {Token::Type::kString, Unescape(src_.substr(b, pos_ - b), start_line), start_line});
    ++pos_;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> Tokenize(const std::string& source) {
  return Lexer(source).Run();
}

}  // namespace llm::jinja
