#include "topology/xml.h"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace loom::topology::xml {

const std::string* Element::attr(std::string_view key) const {
  for (const auto& [k, v] : attrs) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Element::attrOr(std::string_view key, std::string_view fallback) const {
  const std::string* v = attr(key);
  return v ? *v : std::string(fallback);
}

void Element::set(std::string_view key, std::string value) {
  for (auto& [k, v] : attrs) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  attrs.emplace_back(std::string(key), std::move(value));
}

Element& Element::add(std::string childName) {
  children.emplace_back();
  children.back().name = std::move(childName);
  return children.back();
}

// Structure only: where an element came from does not make it different.
bool operator==(const Element& a, const Element& b) {
  return a.name == b.name && a.attrs == b.attrs && a.children == b.children;
}

namespace {

class Parser {
 public:
  Parser(std::string_view text, std::string_view origin) : s_(text), origin_(origin) {}

  Result<Element> document() {
    if (s_.size() > kMaxBytes) return fail("the file is larger than " + std::to_string(kMaxBytes >> 20) + " MiB");
    LOOM_TRY(skipMisc(true));
    if (atEnd()) return fail("no root element");
    Element root;
    LOOM_TRY(element(&root, 1));
    LOOM_TRY(skipMisc(false));
    if (!atEnd()) return fail("content after the root element <" + root.name + ">");
    return root;
  }

 private:
  Status fail(std::string what) const {
    return invalidArgument(std::string(origin_) + ":" + std::to_string(line_) + ": " + what);
  }
  bool atEnd() const { return pos_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  bool startsWith(std::string_view p) const { return s_.substr(pos_, p.size()) == p; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < s_.size(); ++i) {
      if (s_[pos_++] == '\n') ++line_;
    }
  }
  void skipSpace() {
    while (!atEnd() && (peek() == ' ' || peek() == '\t' || peek() == '\r' || peek() == '\n')) advance();
  }
  static bool nameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.' || c == ':';
  }
  std::string name() {
    size_t b = pos_;
    while (!atEnd() && nameChar(peek())) advance();
    return std::string(s_.substr(b, pos_ - b));
  }

  // Comments, the declaration, processing instructions, a DOCTYPE and
  // whitespace; text is refused only where a document cannot have any.
  Status skipMisc(bool prolog) {
    for (;;) {
      skipSpace();
      if (startsWith("<!--")) {
        LOOM_TRY(skipPast("-->", "comment"));
      } else if (startsWith("<?")) {
        LOOM_TRY(skipPast("?>", "declaration"));
      } else if (prolog && startsWith("<!DOCTYPE")) {
        LOOM_TRY(skipPast(">", "DOCTYPE"));
      } else if (!atEnd() && peek() != '<') {
        return fail(prolog ? "text before the root element" : "text after the root element");
      } else {
        return Status::ok();
      }
    }
  }
  Status skipPast(std::string_view end, const char* what) {
    const int startLine = line_;
    size_t at = s_.find(end, pos_);
    if (at == std::string_view::npos) {
      line_ = startLine;
      return fail(std::string("unterminated ") + what);
    }
    advance(at + end.size() - pos_);
    return Status::ok();
  }

  Status value(std::string* out, const std::string& elem, const std::string& key) {
    const char quote = peek();
    if (quote != '"' && quote != '\'') return fail("<" + elem + "> attribute '" + key + "': value without quotes");
    advance();
    out->clear();
    while (!atEnd() && peek() != quote) {
      char c = peek();
      if (c == '<') return fail("<" + elem + "> attribute '" + key + "': '<' in a value");
      if (c == '&') {
        LOOM_TRY(entity(out, elem));
        continue;
      }
      out->push_back(c);
      advance();
    }
    if (atEnd()) return fail("<" + elem + "> attribute '" + key + "': unterminated value");
    advance();
    return Status::ok();
  }

  Status entity(std::string* out, const std::string& elem) {
    size_t semi = s_.find(';', pos_);
    if (semi == std::string_view::npos || semi - pos_ > 12) return fail("<" + elem + ">: bad '&' escape");
    std::string_view e = s_.substr(pos_ + 1, semi - pos_ - 1);
    if (e == "amp") out->push_back('&');
    else if (e == "lt") out->push_back('<');
    else if (e == "gt") out->push_back('>');
    else if (e == "quot") out->push_back('"');
    else if (e == "apos") out->push_back('\'');
    else if (e.size() > 1 && e[0] == '#') {
      unsigned long code = 0;
      bool hex = e[1] == 'x' || e[1] == 'X';
      std::string_view digits = e.substr(hex ? 2 : 1);
      if (digits.empty()) return fail("<" + elem + ">: bad character reference &" + std::string(e) + ";");
      for (char c : digits) {
        int d = (c >= '0' && c <= '9') ? c - '0'
                : (hex && c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (hex && c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return fail("<" + elem + ">: bad character reference &" + std::string(e) + ";");
        code = code * (hex ? 16 : 10) + unsigned(d);
        if (code > 0x10FFFF) return fail("<" + elem + ">: character reference out of range");
      }
      if (code == 0 || code > 0x7F) return fail("<" + elem + ">: only ASCII character references are read");
      out->push_back(char(code));
    } else {
      return fail("<" + elem + ">: unknown entity &" + std::string(e) + ";");
    }
    advance(semi + 1 - pos_);
    return Status::ok();
  }

  Status element(Element* el, int depth) {
    if (depth > kMaxDepth) return fail("elements nested deeper than " + std::to_string(kMaxDepth));
    if (++elements_ > kMaxElements) return fail("more than " + std::to_string(kMaxElements) + " elements");
    if (peek() != '<') return fail("expected an element");
    advance();
    el->line = line_;
    el->name = name();
    if (el->name.empty()) return fail("an element without a name");
    for (;;) {
      const size_t before = pos_;
      skipSpace();
      if (atEnd()) return fail("<" + el->name + "> is not closed");
      if (peek() == '/') {
        if (peek(1) != '>') return fail("<" + el->name + ">: '/' not followed by '>'");
        advance(2);
        return Status::ok();
      }
      if (peek() == '>') {
        advance();
        break;
      }
      if (pos_ == before) return fail("<" + el->name + ">: no space before an attribute");
      std::string key = name();
      if (key.empty()) return fail("<" + el->name + ">: unexpected character '" + std::string(1, peek()) + "'");
      skipSpace();
      if (peek() != '=') return fail("<" + el->name + "> attribute '" + key + "' has no value");
      advance();
      skipSpace();
      std::string v;
      LOOM_TRY(value(&v, el->name, key));
      if (el->attr(key)) return fail("<" + el->name + "> has attribute '" + key + "' twice");
      if (el->attrs.size() >= size_t(kMaxAttributes)) {
        return fail("<" + el->name + "> has more than " + std::to_string(kMaxAttributes) + " attributes");
      }
      el->attrs.emplace_back(std::move(key), std::move(v));
    }
    // Content: children, comments and ignored text up to the end tag.
    for (;;) {
      while (!atEnd() && peek() != '<') advance();
      if (atEnd()) return fail("<" + el->name + "> (line " + std::to_string(el->line) + ") is not closed");
      if (startsWith("<!--")) {
        LOOM_TRY(skipPast("-->", "comment"));
      } else if (startsWith("<?")) {
        LOOM_TRY(skipPast("?>", "processing instruction"));
      } else if (startsWith("<![CDATA[")) {
        LOOM_TRY(skipPast("]]>", "CDATA section"));
      } else if (startsWith("</")) {
        advance(2);
        std::string end = name();
        skipSpace();
        if (end != el->name) {
          return fail("</" + end + "> closes <" + el->name + "> (line " + std::to_string(el->line) + ")");
        }
        if (peek() != '>') return fail("</" + end + ">: expected '>'");
        advance();
        return Status::ok();
      } else {
        el->children.emplace_back();
        LOOM_TRY(element(&el->children.back(), depth + 1));
      }
    }
  }

  std::string_view s_;
  std::string_view origin_;
  size_t pos_ = 0;
  int line_ = 1;
  int elements_ = 0;
};

void escape(const std::string& v, std::string* out) {
  for (char c : v) {
    switch (c) {
      case '&': *out += "&amp;"; break;
      case '<': *out += "&lt;"; break;
      case '>': *out += "&gt;"; break;
      case '"': *out += "&quot;"; break;
      default: out->push_back(c);
    }
  }
}

void writeElement(const Element& e, int depth, std::string* out) {
  out->append(size_t(depth) * 2, ' ');
  *out += "<" + e.name;
  for (const auto& [k, v] : e.attrs) {
    *out += " " + k + "=\"";
    escape(v, out);
    *out += "\"";
  }
  if (e.children.empty()) {
    *out += "/>\n";
    return;
  }
  *out += ">\n";
  for (const auto& c : e.children) writeElement(c, depth + 1, out);
  out->append(size_t(depth) * 2, ' ');
  *out += "</" + e.name + ">\n";
}

}  // namespace

Result<Element> parse(std::string_view text, std::string_view origin) {
  return Parser(text, origin).document();
}

Result<Element> parseFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return systemErrno("cannot open topology file " + path, errno);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return systemErrno("cannot read topology file " + path, errno);
  return parse(buf.str(), path);
}

std::string write(const Element& root) {
  std::string out;
  writeElement(root, 0, &out);
  return out;
}

Status writeFile(const std::string& path, const Element& root) {
  const std::string text = write(root);
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return systemErrno("cannot create topology dump " + path, errno);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) return systemErrno("cannot write topology dump " + path, ok ? errno : err);
  return Status::ok();
}

}  // namespace loom::topology::xml
