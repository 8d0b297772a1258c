#include "data/jinja_lexer.h"

#include <cstring>

#include "core/error.h"
#include "data/jinja_value.h"

namespace primus::data::jinja {

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string source_position(std::string_view source, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xc0) != 0x80) {
      ++col;
    }
  }
  return fmt::format("line {}, column {}", line, col);
}

namespace {

std::string rstrip_spaces(const std::string& s) {
  std::u32string u = utf8_to_u32(s);
  while (!u.empty() && is_python_space(u.back())) u.pop_back();
  return u32_to_utf8(u);
}

// One code point of UTF-8 at s[i] (the lexer skips whitespace that may be multi-byte).
char32_t code_point_at(const std::string& s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
  *len = std::min(n, s.size() - i);
  return utf8_to_u32(std::string_view(s).substr(i, *len))[0];
}

// Python's unicode-escape decoding of a string literal's body (how Jinja reads 'a\nb').
class Unescaper {
 public:
  Unescaper(const std::string& src, size_t start, size_t end) : src_(src), i_(start), end_(end) {}

  std::string run() {
    std::u32string out;
    while (i_ < end_) {
      if (src_[i_] != '\\' || i_ + 1 >= end_) {
        size_t len;
        out += code_point_at(src_, i_, &len);
        i_ += len;
        continue;
      }
      out += escape();
    }
    return u32_to_utf8(out);
  }

 private:
  const std::string& src_;
  size_t i_, end_;

  std::u32string escape() {
    const char c = src_[i_ + 1];
    i_ += 2;
    switch (c) {
      case '\n': return U"";
      case '\\': return U"\\";
      case '\'': return U"'";
      case '"': return U"\"";
      case 'a': return U"\a";
      case 'b': return U"\b";
      case 'f': return U"\f";
      case 'n': return U"\n";
      case 'r': return U"\r";
      case 't': return U"\t";
      case 'v': return U"\v";
      case 'x': return std::u32string(1, hex(2));
      case 'u': return std::u32string(1, hex(4));
      case 'U': return std::u32string(1, hex(8));
      default: break;
    }
    if (c >= '0' && c <= '7') {
      char32_t v = char32_t(c - '0');
      for (int k = 0; k < 2 && i_ < end_ && src_[i_] >= '0' && src_[i_] <= '7'; ++k) v = v * 8 + (src_[i_++] - '0');
      return std::u32string(1, v);
    }
    i_ -= 1;  // an unknown escape keeps its backslash; the character is read as text next
    return U"\\";
  }

  char32_t hex(int n) {
    char32_t v = 0;
    for (int k = 0; k < n; ++k, ++i_) {
      const char h = i_ < end_ ? src_[i_] : '\0';
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) fail("chat template: {}: a \\x, \\u or \\U escape needs {} hex digits", source_position(src_, i_), n);
      v = v * 16 + char32_t(d);
    }
    if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
      fail("chat template: {}: the escape names no Unicode character", source_position(src_, i_));
    return v;
  }
};

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = find_tag_start(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit_data(std::move(text), pos_);
        break;
      }
      const char kind = src_[start + 1];
      const char control = start + 2 < src_.size() ? src_[start + 2] : '\0';
      emit_data(control_leading_space(std::move(text), kind, control), pos_);
      pos_ = start + 2 + (control == '-' || control == '+' ? 1 : 0);
      if (kind == '#')
        skip_comment(start);
      else
        lex_tag(kind, start);
    }
    tokens_.push_back({Tok::End, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  const std::string& src_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // the last tag consumed a newline (or nothing was read yet)
  std::vector<Token> tokens_;

  size_t find_tag_start(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  void emit_data(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back({Tok::Data, std::move(text), offset});
  }

  // `{%-` strips all whitespace before the tag; lstrip_blocks strips spaces from the line's start.
  std::string control_leading_space(std::string text, char kind, char control) const {
    if (control == '-') return rstrip_spaces(text);
    if (control == '+' || kind == '{') return text;
    const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (line_start == 0 && !line_starting_) return text;
    const std::string tail = text.substr(line_start);
    if (!tail.empty() && rstrip_spaces(tail).empty()) text.resize(line_start);
    return text;
  }

  // After a tag: `-%}` strips all whitespace that follows; trim_blocks drops one newline after a
  // block or comment tag.
  void control_trailing_space(bool strip, bool block_or_comment) {
    const size_t before = pos_;
    if (strip) {
      size_t len;
      while (pos_ < src_.size() && is_python_space(code_point_at(src_, pos_, &len))) pos_ += len;
    } else if (block_or_comment && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > before && src_[pos_ - 1] == '\n';
  }

  void skip_comment(size_t start) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("chat template: {}: the comment is never closed", source_position(src_, start));
    pos_ = end + 2;
    control_trailing_space(end > start + 2 && src_[end - 1] == '-', true);
  }

  void lex_tag(char kind, size_t start) {
    tokens_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", start});
    const char close = kind == '{' ? '}' : '%';
    int depth = 0;  // brackets open inside the tag: `}}` closes a dict there, not the tag
    for (;;) {
      skip_space();
      if (pos_ >= src_.size()) fail("chat template: {}: the tag is never closed", source_position(src_, start));
      if (depth == 0 && tag_end(close)) return;
      lex_token(&depth);
    }
  }

  bool tag_end(char close) {
    const bool strip = src_[pos_] == '-' && src_.compare(pos_ + 1, 2, std::string{close, '}'}) == 0;
    if (!strip && src_.compare(pos_, 2, std::string{close, '}'}) != 0) return false;
    tokens_.push_back({close == '}' ? Tok::VarEnd : Tok::BlockEnd, "", pos_});
    pos_ += strip ? 3 : 2;
    control_trailing_space(strip, close == '%');
    return true;
  }

  void skip_space() {
    size_t len;
    while (pos_ < src_.size() && is_python_space(code_point_at(src_, pos_, &len))) pos_ += len;
  }

  void lex_token(int* depth) {
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return lex_name();
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number();
    if (c == '\'' || c == '"') return lex_string();
    lex_operator(depth);
  }

  void lex_name() {
    const size_t s = pos_;
    while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    tokens_.push_back({Tok::Name, src_.substr(s, pos_ - s), s});
  }

  void lex_number() {
    const size_t s = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        pos_ = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = s; i < pos_; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    tokens_.push_back({is_float ? Tok::Float : Tok::Int, text, s});
  }

  void lex_string() {
    const size_t s = pos_;
    const char quote = src_[pos_++];
    while (pos_ < src_.size() && src_[pos_] != quote) pos_ += src_[pos_] == '\\' ? 2 : 1;
    if (pos_ >= src_.size()) fail("chat template: {}: the string is never closed", source_position(src_, s));
    tokens_.push_back({Tok::String, Unescaper(src_, s + 1, pos_).run(), s});
    ++pos_;
  }

  void lex_operator(int* depth) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({Tok::Op, op, pos_});
        pos_ += 2;
        return;
      }
    }
    const char c = src_[pos_];
    if (!std::strchr("+-*/%~<>=()[]{},.:|", c))
      fail("chat template: {}: unexpected character '{}' in a tag", source_position(src_, pos_), c);
    if (c == '(' || c == '[' || c == '{') ++*depth;
    if ((c == ')' || c == ']' || c == '}') && --*depth < 0)
      fail("chat template: {}: '{}' closes nothing", source_position(src_, pos_), c);
    tokens_.push_back({Tok::Op, std::string(1, c), pos_});
    ++pos_;
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace primus::data::jinja
