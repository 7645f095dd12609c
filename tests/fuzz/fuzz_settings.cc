// Fuzz target `settings`: the settings read from outside text, a conf file
// (settings::parseConf) and the environment (settings::build), then every
// declared setting read back with its typed getter.
//
// Input: conf-file text, a NUL, then environment text as NAME=VALUE lines
// (an environment value can hold neither a NUL nor a newline).
#include <map>
#include <string>
#include <string_view>

#include "common/settings.h"
#include "fuzz_input.h"

namespace {

bool trimmed(const std::string& s) {
  constexpr std::string_view kBlank = " \t\r\n";
  return s.empty() ||
         (kBlank.find(s.front()) == std::string_view::npos && kBlank.find(s.back()) == std::string_view::npos);
}

std::map<std::string, std::string> parseEnvironment(std::string_view text) {
  std::map<std::string, std::string> env;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    std::string value(line.substr(eq + 1));
    if (value.find('\0') != std::string::npos) continue;
    env.emplace(std::string(line.substr(0, eq)), std::move(value));
  }
  return env;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace settings = loom::settings;
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t nul = all.find('\0');
  std::string_view confText = all.substr(0, nul);
  std::string_view envText = nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1);

  const std::map<std::string, std::string> file = settings::parseConf(confText);
  for (const auto& [name, value] : file) {
    FUZZ_CHECK(trimmed(name) && trimmed(value));
    FUZZ_CHECK(name.find('\n') == std::string::npos && value.find('\n') == std::string::npos);
    FUZZ_CHECK(name.empty() || name[0] != '#');
  }
  const std::map<std::string, std::string> env = parseEnvironment(envText);
  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto cfg = settings::build(lookup, file);
  FUZZ_CHECK(cfg != nullptr);
  FUZZ_TRACE("settings: %zu conf-file and %zu environment entries; warnings: %s\n", file.size(), env.size(),
             cfg->warnings().c_str());

  // Each setting once through its typed getter, plus where its value came from.
  for (const settings::Spec& spec : settings::table()) {
    const settings::Source source = cfg->source(spec.name);
    const bool inEnv = env.count(spec.name) == 1, inFile = file.count(spec.name) == 1;
    FUZZ_CHECK(source != settings::Source::kEnvironment || inEnv);
    FUZZ_CHECK(source != settings::Source::kConfFile || (inFile && !inEnv));
    switch (spec.type) {
      case settings::Type::kInt: (void)cfg->getInt(spec.name); break;
      case settings::Type::kBool: (void)cfg->getBool(spec.name); break;
      case settings::Type::kString: {
        // Strings are taken as given: the environment first, then the file.
        const std::string text = cfg->getString(spec.name);
        FUZZ_CHECK(text == (inEnv ? env.at(spec.name) : inFile ? file.at(spec.name) : spec.defaultValue));
        break;
      }
    }
  }
  (void)cfg->warnings();
  return 0;
}
