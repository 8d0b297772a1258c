// The environment a launch runs with, built in layers, each value remembering where it came
// from (for --print-env and the snapshot):
//   inherited shell  <  configs/envs/base.sh  <  configs/envs/<MODEL>.sh  <  .primus.yaml env:
//   <  --patch files (in order)  <  a replayed snapshot  <  --env K=V
// Presets only fill what is unset (`export X=${X:-v}`), so a value exported in the user's shell
// is kept over a preset; the layers after them overwrite.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cli/lib/process.h"

namespace primus::cli {

struct EnvEntry {
  std::string value;
  std::string source;
  bool unset = false;  // removed (a patch ran `unset X`)
};

class EnvPlan {
 public:
  EnvPlan() : EnvPlan(current_environment()) {}
  explicit EnvPlan(EnvMap start) : start_(std::move(start)) {}

  void set(const std::string& key, const std::string& value, const std::string& source);
  void unset(const std::string& key, const std::string& source);
  // Sources `script` with bash on top of the current plan (`set -a; source F; env -0`) and
  // records what it added, changed or removed under `label`. A syntax error or `exit N` in the
  // script throws primus::Error with its output.
  void source_script(const std::filesystem::path& script, const std::string& label);

  EnvMap full() const;
  const std::map<std::string, EnvEntry>& changes() const { return changes_; }
  std::vector<std::string> notes;  // e.g. "no preset configs/envs/T4.sh for model T4"

  // "KEY=value  # source" lines, sorted by key.
  std::string describe() const;

 private:
  EnvMap start_;
  std::map<std::string, EnvEntry> changes_;
};

// "KEY=VALUE" -> {KEY, VALUE}; throws on a missing '=' or a bad name.
std::pair<std::string, std::string> parse_assignment(const std::string& text, const std::string& what);

}  // namespace primus::cli
