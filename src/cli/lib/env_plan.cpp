#include "cli/lib/env_plan.h"

#include <regex>
#include <set>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::cli {

void EnvPlan::set(const std::string& key, const std::string& value, const std::string& source) {
  changes_[key] = EnvEntry{value, source, false};
}

void EnvPlan::unset(const std::string& key, const std::string& source) {
  changes_[key] = EnvEntry{"", source, true};
}

EnvMap EnvPlan::full() const {
  EnvMap m = start_;
  for (auto& [k, e] : changes_) {
    if (e.unset) m.erase(k);
    else m[k] = e.value;
  }
  return m;
}

void EnvPlan::source_script(const std::filesystem::path& script, const std::string& label) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(script, ec)) fail("{}: file '{}' does not exist", label, script.string());
  auto check = run_capture({"bash", "-n", script.string()});
  if (check.exit_code != 0) fail("{}: '{}' is not valid bash:\n{}", label, script.string(), check.err + check.out);
  EnvMap before = full();
  // The script's own stdout goes to stderr so that only env -0 reaches our pipe.
  auto r = run_capture({"bash", "-c", "set -a; source \"$0\" 1>&2; env -0", script.string()}, &before);
  if (r.exit_code != 0)
    fail("{}: sourcing '{}' failed (exit {}):\n{}", label, script.string(), r.exit_code, r.err);
  static const std::set<std::string> shell_noise = {"_", "SHLVL", "PWD", "OLDPWD"};
  EnvMap after;
  size_t pos = 0;
  while (pos < r.out.size()) {
    size_t end = r.out.find('\0', pos);
    if (end == std::string::npos) end = r.out.size();
    std::string item = r.out.substr(pos, end - pos);
    pos = end + 1;
    auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    after[item.substr(0, eq)] = item.substr(eq + 1);
  }
  for (auto& [k, v] : after) {
    if (shell_noise.count(k)) continue;
    auto it = before.find(k);
    if (it == before.end() || it->second != v) set(k, v, label);
  }
  for (auto& [k, v] : before)
    if (!shell_noise.count(k) && !after.count(k)) unset(k, label);
}

std::string EnvPlan::describe() const {
  std::string s;
  size_t width = 0;
  for (auto& [k, e] : changes_) width = std::max(width, k.size() + e.value.size() + 1);
  for (auto& [k, e] : changes_) {
    std::string kv = e.unset ? "unset " + k : k + "=" + e.value;
    s += fmt::format("{:<{}}  # {}\n", kv, std::min<size_t>(width, 60), e.source);
  }
  return s;
}

std::pair<std::string, std::string> parse_assignment(const std::string& text, const std::string& what) {
  auto eq = text.find('=');
  static const std::regex name_re("[A-Za-z_][A-Za-z0-9_]*");
  if (eq == std::string::npos || !std::regex_match(text.substr(0, eq), name_re))
    fail("{} '{}' must look like NAME=VALUE", what, text);
  return {text.substr(0, eq), text.substr(eq + 1)};
}

}  // namespace primus::cli
