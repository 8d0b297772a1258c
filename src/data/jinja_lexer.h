// The Jinja lexer, with the settings Hugging Face renders chat templates with: trim_blocks (the first
// newline after a block or comment tag is dropped), lstrip_blocks (spaces and tabs from the start of
// a line up to a block or comment tag are dropped, unless the tag opens with `{%+`), `-` on either
// side of a tag strips all whitespace on that side, comments vanish, newlines are "\n", and one
// trailing newline at the end of the template is dropped (keep_trailing_newline=False).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace primus::data::jinja {

enum class Tok {
  Data,        // text outside tags (already whitespace-controlled)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // text is the unescaped value
  Int,
  Float,
  Op,  // text is the operator: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  End,
};

struct Token {
  Tok type;
  std::string text;
  size_t offset = 0;  // into the normalized source, for line:column in messages
};

// The normalized source the offsets refer to ("\r\n" and "\r" made "\n", one trailing newline off).
std::string normalize_source(std::string_view source);

// Line and column (1-based) of `offset` in `source`, as "line L, column C".
std::string source_position(std::string_view source, size_t offset);

// Tokens of a normalized source; errors (unclosed tags, strings, comments, stray characters) are
// primus::Error naming the line and column.
std::vector<Token> tokenize(const std::string& source);

// Python's str.isspace() on one code point (what str.strip() and str.split() remove).
bool is_python_space(char32_t c);

}  // namespace primus::data::jinja
