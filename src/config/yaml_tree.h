// YAML configuration files as Primus writes them: a file may `extends:` others (a path or a
// list, relative to the file; the child's keys win, maps merge key by key), scalars may hold
// ${VAR} or ${VAR:default} taken from the environment, and the command line may override any
// key. Every leaf remembers where its value came from, so that an error can name the file and
// line of the key at fault.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace primus::config {

struct Origin {
  std::string file;  // "" for the command line
  int line = 0;      // 1-based; 0 when unknown
  std::string str() const;  // "file:line" or "the command line"
};

struct YamlTree {
  YAML::Node root;
  std::map<std::string, Origin> origins;  // dotted key path -> where it was set

  Origin origin(const std::string& path) const;
  // Sets `path` (dotted, e.g. "modules.pre_trainer.overrides.lr") from command-line text, parsed
  // as YAML so that numbers, booleans and lists ([0.3, a, 0.7, b]) keep their types.
  void set(const std::string& path, const std::string& text);
};

// Loads a file with its `extends` chain and environment substitution. Errors (missing file,
// YAML syntax, an extends cycle, an unset variable without default) name file and line.
YamlTree load_yaml_tree(const std::string& path);

// Where `extends: name` is looked up when no file of that name sits beside the including file
// (e.g. configs/models for model presets).
void add_extends_search_dir(const std::string& dir);

}  // namespace primus::config
