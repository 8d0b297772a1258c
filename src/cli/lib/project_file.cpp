#include "cli/lib/project_file.h"

#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"

namespace primus::cli {
namespace fs = std::filesystem;
namespace {

const std::map<std::string, std::set<std::string>>& schema() {
  static const std::map<std::string, std::set<std::string>> s = {
      {"workspace", {}}, {"exp_name", {}}, {"log_ranks", {}}, {"hooks_dirs", {}}, {"patches", {}},
      {"env", {}},       {"direct", {"nproc"}}, {"container", {"image", "runtime", "mounts", "options"}},
      {"slurm", {"mpi"}}};
  return s;
}

void check_keys(const YAML::Node& root, const std::string& file) {
  if (!root.IsMap()) fail("{}: expected a mapping of settings at the top level", file);
  std::vector<std::string> top;
  for (auto& [k, _] : schema()) top.push_back(k);
  for (auto kv : root) {
    std::string key = kv.first.as<std::string>();
    auto it = schema().find(key);
    if (it == schema().end()) {
      std::string n = nearest(key, top);
      fail("{}: unknown key '{}'{}; known keys: {}", file, key, n.empty() ? "" : fmt::format(" (did you mean '{}'?)", n),
           fmt::join(top, ", "));
    }
    if (it->second.empty()) continue;
    if (!kv.second.IsMap()) fail("{}: '{}' must be a mapping", file, key);
    std::vector<std::string> subs(it->second.begin(), it->second.end());
    for (auto sub : kv.second) {
      std::string s = sub.first.as<std::string>();
      if (!it->second.count(s)) {
        std::string n = nearest(s, subs);
        fail("{}: unknown key '{}.{}'{}; '{}' has: {}", file, key, s, n.empty() ? "" : fmt::format(" (did you mean '{}'?)", n),
             key, fmt::join(subs, ", "));
      }
    }
  }
}

}  // namespace

ProjectFile ProjectFile::load_file(const fs::path& path) {
  ProjectFile p;
  p.path_ = fs::absolute(path).lexically_normal();
  try {
    p.root_ = YAML::LoadFile(path.string());
  } catch (const YAML::Exception& e) {
    fail("cannot read {}: {}", path.string(), e.what());
  }
  if (p.root_.IsNull()) p.root_ = YAML::Node(YAML::NodeType::Map);
  check_keys(p.root_, path.string());
  return p;
}

ProjectFile ProjectFile::load() {
  if (const char* f = std::getenv("PRIMUS_PROJECT_FILE"); f && *f) {
    if (!fs::is_regular_file(f)) fail("PRIMUS_PROJECT_FILE='{}' is not a file", f);
    return load_file(f);
  }
  std::error_code ec;
  for (fs::path dir = fs::current_path(ec); !dir.empty(); dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / ".primus.yaml", ec)) return load_file(dir / ".primus.yaml");
    if (dir == dir.root_path()) break;
  }
  return ProjectFile{};
}

std::optional<YAML::Node> ProjectFile::node(const std::string& key) const {
  if (!path_) return std::nullopt;
  YAML::Node n = YAML::Clone(root_);
  size_t pos = 0;
  while (true) {
    size_t dot = key.find('.', pos);
    std::string part = key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!n.IsMap() || !n[part] || n[part].IsNull()) return std::nullopt;
    YAML::Node child = n[part];
    n.reset(child);  // rebind; plain `n = child` would assign into the tree
    if (dot == std::string::npos) return n;
    pos = dot + 1;
  }
}

std::optional<std::string> ProjectFile::scalar(const std::string& key) const {
  auto found = node(key);
  if (!found) return std::nullopt;
  YAML::Node n = *found;
  if (!n.IsScalar()) fail("{}: '{}' must be a single value", label(), key);
  return n.as<std::string>();
}

std::vector<std::string> ProjectFile::list(const std::string& key, bool paths) const {
  auto found = node(key);
  std::vector<std::string> out;
  if (!found) return out;
  YAML::Node n = *found;
  if (!n.IsSequence()) fail("{}: '{}' must be a list", label(), key);
  for (auto item : n) {
    if (!item.IsScalar()) fail("{}: entries of '{}' must be single values", label(), key);
    std::string v = item.as<std::string>();
    if (paths && fs::path(v).is_relative()) v = (path_->parent_path() / v).lexically_normal().string();
    out.push_back(v);
  }
  return out;
}

std::map<std::string, std::string> ProjectFile::map(const std::string& key) const {
  auto found = node(key);
  std::map<std::string, std::string> out;
  if (!found) return out;
  YAML::Node n = *found;
  if (!n.IsMap()) fail("{}: '{}' must be a mapping of NAME: value", label(), key);
  for (auto kv : n) {
    if (!kv.second.IsScalar()) fail("{}: '{}.{}' must be a single value", label(), key, kv.first.as<std::string>());
    out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  return out;
}

Setting resolve_setting(const std::string& cli_value, const std::string& cli_name, const char* env_var,
                        const ProjectFile& project, const std::string& yaml_key, const std::string& def) {
  if (!cli_value.empty()) return {cli_value, cli_name};
  if (env_var)
    if (const char* v = std::getenv(env_var); v && *v) return {v, env_var};
  if (!yaml_key.empty())
    if (auto v = project.scalar(yaml_key)) return {*v, project.label() + " " + yaml_key};
  return {def, "default"};
}

}  // namespace primus::cli
