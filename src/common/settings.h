// The one table of settings (environment variables and config-file lines).
//
// Every setting loom reads is declared once in settings.cc with its name,
// type, default, subsystem and doc; getenv() appears nowhere else in src/.
// Values are read once into an immutable Config snapshot. NCCL_* names keep
// NCCL's meaning; LOOM_* names are loom's own. Precedence: environment, then
// NCCL_CONF_FILE (or ~/.nccl.conf, then /etc/nccl.conf), then the default.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::settings {

enum class Type { kInt, kBool, kString };

struct Spec {
  const char* name;
  Type type;
  const char* defaultValue;  // as text; "" for none
  const char* subsystem;     // INIT, NET, COLL, ...
  const char* doc;
};

// Every declared setting, in table order.
std::span<const Spec> table();
const Spec* find(std::string_view name);
const char* typeName(Type type);

enum class Source { kDefault, kConfFile, kEnvironment };
const char* sourceName(Source source);

class Config {
 public:
  // Typed reads. Asking for an undeclared name or the wrong type is a bug in
  // loom and aborts with a message (it can never depend on user input).
  int64_t getInt(std::string_view name) const;
  bool getBool(std::string_view name) const;
  // Strings are returned by value: a snapshot may be replaced (and freed) by
  // reload() while the caller still uses the text.
  std::string getString(std::string_view name) const;
  // Raw text as read ("" when unset and no default).
  std::string text(std::string_view name) const;
  bool isSet(std::string_view name) const;  // given by env or conf file
  Source source(std::string_view name) const;
  // Problems found while reading (bad numbers...), already logged once.
  const std::string& warnings() const { return warnings_; }
  // NCCL_* names given (environment or conf file) that loom does not read,
  // sorted, ", "-separated: logged at INFO, so that a user who tunes loom
  // like NCCL sees which knobs do nothing here.
  const std::string& unused() const { return unused_; }

 private:
  friend std::shared_ptr<const Config> build(const std::function<const char*(const char*)>& env,
                                             const std::map<std::string, std::string>& file,
                                             const std::vector<std::string>& envNames);
  struct Value {
    std::string text;
    int64_t number = 0;
    Source source = Source::kDefault;
    Type type = Type::kString;  // the declared type, checked on every read
  };
  const Value& lookup(std::string_view name, Type type) const;
  std::map<std::string, Value, std::less<>> values_;
  std::string warnings_;
  std::string unused_;
};

// The process-wide snapshot, read on first use. Cheap to call.
std::shared_ptr<const Config> current();
// Re-reads the environment and files (ncclResetDebugInit, tests).
void reload();
// Reads a fresh snapshot without installing it.
std::shared_ptr<const Config> load();

// The two parsers of outside text behind load(), exposed for tests and
// fuzzing. parseConf: NAME=VALUE lines, '#' starts a comment line, blanks
// trimmed, lines without '=' ignored. build: a snapshot from an environment
// lookup (null: unset) and conf-file values; bad numbers fall back to the
// default with a warning; `envNames` (the environment's names, where known)
// and the file's keys give unused().
std::map<std::string, std::string> parseConf(std::string_view text);
std::shared_ptr<const Config> build(const std::function<const char*(const char*)>& env,
                                    const std::map<std::string, std::string>& file,
                                    const std::vector<std::string>& envNames = {});

}  // namespace loom::settings
