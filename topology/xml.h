// A small XML reader and writer for NCCL's topology files: elements,
// attributes, comments and the <?xml?> declaration. Text between elements is
// ignored (NCCL's files have none). Every element remembers its line, so
// errors found later, while the topology is built, can name it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace loom::topology::xml {

struct Element {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;  // in file order
  std::vector<Element> children;
  int line = 0;  // 0 for elements built in memory

  // The attribute's value, or nullptr.
  const std::string* attr(std::string_view key) const;
  std::string attrOr(std::string_view key, std::string_view fallback) const;
  // Sets (replacing) or appends an attribute.
  void set(std::string_view key, std::string value);
  Element& add(std::string childName);
  friend bool operator==(const Element&, const Element&);
};

// Limits that keep a hostile file from exhausting memory or the stack.
constexpr size_t kMaxBytes = 64u << 20;
constexpr int kMaxDepth = 64;
constexpr int kMaxElements = 16384;  // a DGX node's file has about a hundred
constexpr int kMaxAttributes = 256;  // per element

// Parses one document whose root element is returned. `origin` (a file
// name) starts every error message: "<origin>:<line>: <what>".
Result<Element> parse(std::string_view text, std::string_view origin);
Result<Element> parseFile(const std::string& path);
// Indented by two spaces per level, attributes in order, values escaped.
std::string write(const Element& root);
Status writeFile(const std::string& path, const Element& root);

}  // namespace loom::topology::xml
