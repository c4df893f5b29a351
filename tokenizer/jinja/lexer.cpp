// Jinja2's lexer with transformers' options: text, {{ }}, {% %} and {# #}, the -/+ whitespace controls,
// trim_blocks (a block or comment tag eats the one newline after it), lstrip_blocks (a block or comment tag
// alone after a line's start eats that line's leading spaces and tabs: the line's start is a newline in the
// text before it, or the template's start, or the end of a tag that ate a newline) and keep_trailing_newline
// off (the source's last newline is dropped). \r\n and \r become \n first, as Jinja2's lexer does.
#include <cctype>
#include <cstdlib>

#include "tokenizer/error.h"
#include "tokenizer/jinja/ast.h"

namespace tokenizer::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("chat template line " + std::to_string(line) + ": " + what);
}

// A string literal's value: Python's unicode-escape of the text between the quotes.
std::string unescape(const std::string& s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) { out += s[i]; continue; }
    const char c = s[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '0': out += '\0'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        if (i + digits >= s.size()) fail(line, "truncated \\" + std::string(1, c) + " escape");
        const uint32_t cp = static_cast<uint32_t>(std::strtoul(s.substr(i + 1, digits).c_str(), nullptr, 16));
        i += digits;
        if (cp < 0x80) {
          out += static_cast<char>(cp);
        } else if (cp < 0x800) {
          out += static_cast<char>(0xc0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
          out += static_cast<char>(0xe0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
          out += static_cast<char>(0x80 | (cp & 0x3f));
        } else {
          out += static_cast<char>(0xf0 | (cp >> 18));
          out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
          out += static_cast<char>(0x80 | (cp & 0x3f));
        }
        break;
      }
      default: out += '\\'; out += c;  // Python keeps unknown escapes
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ <= src_.size()) {
      size_t found = std::string::npos;
      for (const char* open : {"{{", "{%", "{#"}) found = std::min(found, src_.find(open, pos_));
      std::string text = src_.substr(pos_, found == std::string::npos ? std::string::npos : found - pos_);
      if (found == std::string::npos) {
        emit_text(text);
        break;
      }
      const char kind = src_[found + 1];
      const char sign = found + 2 < src_.size() && (src_[found + 2] == '-' || src_[found + 2] == '+') ? src_[found + 2] : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        bool blank = l_pos < text.size();
        for (size_t i = l_pos; i < text.size() && blank; ++i) blank = text[i] == ' ' || text[i] == '\t' || text[i] == '\f' || text[i] == '\v';
        if ((l_pos > 0 || line_starting) && blank) text.resize(l_pos);
      }
      emit_text(text);
      pos_ = found + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) fail(line_, "missing end of comment tag");
        count_lines(pos_, close + 2);
        const bool strip = close > pos_ && src_[close - 1] == '-', keep = close > pos_ && src_[close - 1] == '+';
        pos_ = close + 2;
        line_starting = after_tag(strip, !keep);
      } else if (kind == '%' && raw_block()) {
        line_starting = false;
      } else {
        tokens_.push_back({kind == '{' ? Token::Kind::VarBegin : Token::Kind::BlockBegin, "", 0, 0, line_});
        line_starting = lex_tag(kind == '{' ? "}}" : "%}");
      }
    }
    tokens_.push_back({Token::Kind::End, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }
  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Kind::Text, text, 0, 0, line_});
    for (char c : text) line_ += c == '\n';
  }
  // After a tag's end: `-` eats all whitespace, trim_blocks one newline. Returns whether what was eaten ended
  // in a newline (Jinja2's line_starting).
  bool after_tag(bool strip, bool trim) {
    const size_t start = pos_;
    if (strip) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (trim && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    count_lines(start, pos_);
    return pos_ > start && src_[pos_ - 1] == '\n';
  }

  // {% raw %}...{% endraw %}: the text in between, untouched.
  bool raw_block() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    const bool strip = src_.compare(p, 3, "-%}") == 0;
    if (src_.compare(p + (strip || src_.compare(p, 3, "+%}") == 0 ? 1 : 0), 2, "%}") != 0) return false;
    pos_ = p + (src_[p] == '%' ? 2 : 3);
    after_tag(strip, true);
    size_t search = pos_;
    for (;;) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail(line_, "missing end of raw directive");
      size_t q = open + 2 + (open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+'));
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) { search = open + 2; continue; }
      std::string text = src_.substr(pos_, open - pos_);
      if (src_[open + 2] == '-') while (!text.empty() && is_space(text.back())) text.pop_back();
      emit_text(text);
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      const bool end_strip = src_.compare(q, 3, "-%}") == 0;
      const bool end_keep = src_.compare(q, 3, "+%}") == 0;
      if (src_.compare(q + (end_strip || end_keep), 2, "%}") != 0) fail(line_, "malformed endraw tag");
      pos_ = q + 2 + (end_strip || end_keep);
      after_tag(end_strip, !end_keep);
      return true;
    }
  }

  // The tokens of one {{ }} or {% %}, then its end. Returns line_starting after it.
  bool lex_tag(const std::string& close) {
    int depth = 0;
    const auto kind = close == "}}" ? Token::Kind::VarEnd : Token::Kind::BlockEnd;
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) fail(line_, "unexpected end of template: missing '" + close + "'");
      if (depth == 0) {
        const bool strip = src_.compare(pos_, 3, "-" + close) == 0;
        const bool keep = kind == Token::Kind::BlockEnd && src_.compare(pos_, 3, "+" + close) == 0;
        if (strip || keep || src_.compare(pos_, 2, close) == 0) {
          pos_ += 2 + (strip || keep ? 1 : 0);
          tokens_.push_back({kind, "", 0, 0, line_});
          return after_tag(strip, kind == Token::Kind::BlockEnd && !keep);
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t start = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        tokens_.push_back({Token::Kind::Name, src_.substr(start, pos_ - start), 0, 0, line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        const size_t start = ++pos_;
        while (pos_ < src_.size() && src_[pos_] != c) pos_ += src_[pos_] == '\\' ? 2 : 1;
        if (pos_ >= src_.size()) fail(line_, "unterminated string");
        const std::string body = src_.substr(start, pos_ - start);
        tokens_.push_back({Token::Kind::String, unescape(body, line_), 0, 0, line_});
        count_lines(start, pos_);
        ++pos_;
      } else {
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        std::string op;
        for (const char* o : kOps) {
          if (src_.compare(pos_, std::char_traits<char>::length(o), o) == 0) { op = o; break; }
        }
        if (op.empty()) fail(line_, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        pos_ += op.size();
        tokens_.push_back({Token::Kind::Op, op, 0, 0, line_});
      }
    }
  }

  void lex_number() {
    const size_t start = pos_;
    auto digits = [&] { while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_; };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
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
    for (size_t i = start; i < pos_; ++i) if (src_[i] != '_') text += src_[i];
    Token t{is_float ? Token::Kind::Float : Token::Kind::Int, text, 0, 0, line_};
    if (is_float) t.float_value = std::strtod(text.c_str(), nullptr);
    else t.int_value = std::strtoll(text.c_str(), nullptr, 10);
    tokens_.push_back(t);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace tokenizer::jinja
