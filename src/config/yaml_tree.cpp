#include "config/yaml_tree.h"

#include <cstdlib>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "core/bytes.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace primus::config {

std::string Origin::str() const {
  if (file.empty()) return "the command line";
  return line > 0 ? fmt::format("{}:{}", file, line) : file;
}

Origin YamlTree::origin(const std::string& path) const {
  auto it = origins.find(path);
  return it == origins.end() ? Origin{} : it->second;
}

namespace {

std::vector<std::string>& search_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

// ${VAR} and ${VAR:default} in one scalar.
std::string substitute_env(const std::string& text, const Origin& where) {
  static const std::regex var(R"(\$\{([A-Za-z_][A-Za-z0-9_]*)(:([^}]*))?\})");
  std::string out;
  auto begin = std::sregex_iterator(text.begin(), text.end(), var);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    out.append(text, last, m.position() - last);
    const char* value = std::getenv(m[1].str().c_str());
    if (value)
      out += value;
    else if (m[2].matched)
      out += m[3].str();
    else
      fail("{}: environment variable {} is not set and has no default (write ${{{}:default}})", where.str(),
           m[1].str(), m[1].str());
    last = m.position() + m.length();
  }
  out.append(text, last);
  return out;
}

// Bounds on a config file, checked before it is walked: real configs are a few kilobytes, a few
// levels deep, with at most thousands of values. yaml-cpp's parser stops at 2000 levels itself, but
// what follows here recurses once per level, and aliases (*name) share one node among many places:
// a few lines of aliases to aliases stand for billions of values.
constexpr uint64_t kMaxConfigBytes = uint64_t(16) << 20;
constexpr int kMaxConfigDepth = 64;
constexpr int64_t kMaxConfigValues = 100'000;

// Records origins of every leaf and substitutes variables in place. `values` counts the nodes
// visited (an alias's target once per use).
void annotate(YAML::Node node, const std::string& path, const std::string& file, YamlTree& tree, int depth,
              int64_t& values) {
  if (++values > kMaxConfigValues)
    fail("{}: the config holds more than {} values (each use of an alias counts its target again); a real "
         "config has a few thousand", file, kMaxConfigValues);
  if ((node.IsMap() || node.IsSequence()) && depth >= kMaxConfigDepth)
    fail("{}:{}: maps and lists nest more than {} levels deep here; a real config needs a few", file,
         node.Mark().line + 1, kMaxConfigDepth);
  if (node.IsMap()) {
    std::map<std::string, int> seen;  // key -> line: yaml-cpp keeps both of a duplicate pair
    for (auto kv : node) {
      const int line = kv.first.Mark().line + 1;
      if (!kv.first.IsScalar())
        fail("{}:{}: a key must be a plain name, not a {}", file, line, kv.first.IsMap() ? "map" : "list");
      const std::string key = kv.first.Scalar();
      if (auto [it, fresh] = seen.emplace(key, line); !fresh)
        fail("{}:{}: duplicate key '{}'{} (first set at line {}); YAML keeps one of them silently, remove the other",
             file, line, key, path.empty() ? "" : " in " + path, it->second);
      tree.origins[join(path, key)] = Origin{file, line};
      annotate(kv.second, join(path, key), file, tree, depth + 1, values);
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) annotate(node[i], path, file, tree, depth + 1, values);
  } else if (node.IsScalar()) {
    const std::string s = node.Scalar();
    if (s.find("${") != std::string::npos) node = substitute_env(s, Origin{file, node.Mark().line + 1});
  }
}

// Child over base, key by key for maps; anything else is replaced.
void merge_into(YAML::Node base, const YAML::Node& child) {
  for (auto kv : child) {
    const std::string key = kv.first.as<std::string>();
    if (kv.second.IsMap() && base[key] && base[key].IsMap())
      merge_into(base[key], kv.second);
    else
      base[key] = YAML::Clone(kv.second);
  }
}

std::string resolve_extends(const std::string& name, const fs::path& from_dir, const Origin& where) {
  std::vector<fs::path> tries{from_dir / name, from_dir / (name + ".yaml")};
  for (const auto& d : search_dirs()) {
    tries.push_back(fs::path(d) / name);
    tries.push_back(fs::path(d) / (name + ".yaml"));
  }
  std::error_code ec;  // a name too long for the file system is simply not found
  for (const auto& p : tries)
    if (fs::is_regular_file(p, ec)) return p.string();
  fail("{}: extends '{}', but no such file (looked in {} and the preset folders)", where.str(), name,
       from_dir.string());
}

YamlTree load_rec(const std::string& path, std::vector<std::string>& stack) {
  const std::string canon = fs::weakly_canonical(path).string();
  for (const auto& s : stack)
    if (s == canon) fail("{}: extends cycle back to itself", path);
  if (!fs::is_regular_file(path)) fail("config file {} does not exist or is not a file", path);
  if (const uint64_t size = fs::file_size(path); size > kMaxConfigBytes)
    fail("config file {} is {}, more than the {} a config may have", path, human_bytes(size),
         human_bytes(kMaxConfigBytes));
  YAML::Node doc;
  try {
    doc = YAML::LoadFile(path);
  } catch (const YAML::ParserException& e) {
    fail("{}:{}: YAML syntax error: {}", path, e.mark.line + 1, e.msg);
  } catch (const YAML::BadFile&) {
    fail("cannot read config file {}", path);
  }
  if (doc.IsNull()) doc = YAML::Node(YAML::NodeType::Map);
  if (!doc.IsMap()) fail("{}: a config file must be a map of keys, not a {}", path, doc.IsSequence() ? "list" : "scalar");

  stack.push_back(canon);
  YamlTree result;
  result.root = YAML::Node(YAML::NodeType::Map);
  if (YAML::Node ext = doc["extends"]) {
    const Origin where{path, ext.Mark().line + 1};
    std::vector<std::string> bases;
    auto name = [&](const YAML::Node& e) {
      if (!e.IsScalar()) fail("{}: extends takes a file name or a list of them", where.str());
      return e.Scalar();
    };
    if (ext.IsSequence())
      for (const auto& e : ext) bases.push_back(name(e));
    else
      bases.push_back(name(ext));
    for (const auto& b : bases) {
      YamlTree base = load_rec(resolve_extends(b, fs::path(path).parent_path(), where), stack);
      merge_into(result.root, base.root);
      for (auto& [k, o] : base.origins) result.origins[k] = o;
    }
    doc.remove("extends");
  }
  YamlTree own;
  int64_t values = 0;
  annotate(doc, "", path, own, 0, values);
  merge_into(result.root, doc);
  for (auto& [k, o] : own.origins) result.origins[k] = o;
  stack.pop_back();
  return result;
}

}  // namespace

void add_extends_search_dir(const std::string& dir) {
  for (const auto& d : search_dirs())
    if (d == dir) return;
  search_dirs().push_back(dir);
}

YamlTree load_yaml_tree(const std::string& path) {
  std::vector<std::string> stack;
  try {
    return load_rec(path, stack);
  } catch (const YAML::Exception& e) {  // anything yaml-cpp throws past the checks above
    fail("{}:{}: {}", path, e.mark.line + 1, e.msg);
  } catch (const fs::filesystem_error& e) {  // a path the file system refuses (too long, ...)
    fail("{}: {}", path, e.what());
  }
}

void YamlTree::set(const std::string& path, const std::string& text) {
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail("command-line value for {} is not valid YAML: {}", path, e.msg);
  }
  // "null" (or "~") unsets a key as in a YAML file; any other empty-looking value is text.
  if (!value.IsDefined() || (value.IsNull() && text != "null" && text != "~")) value = YAML::Node(text);
  // Walk down, creating maps as needed. yaml-cpp's operator[] on a non-const node creates.
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // yaml-cpp's Node is a handle: operator= writes through it, reset() rebinds it.
  YAML::Node cur;
  cur.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!cur[parts[i]] || cur[parts[i]].IsNull()) cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
    if (!cur[parts[i]].IsMap()) fail("command-line override {}: {} is a value, not a section", path, parts[i]);
    YAML::Node next = cur[parts[i]];
    cur.reset(next);
  }
  cur[parts.back()] = value;
  origins[path] = Origin{};
}

}  // namespace primus::config
