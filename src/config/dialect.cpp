#include "config/dialect.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "config/experiment.h"
#include "core/error.h"
#include "core/suggest.h"
#include "model/model_spec.h"

namespace fs = std::filesystem;

namespace primus::config {

// The two dialects (dialect_torchtitan.cpp, dialect_maxtext.cpp).
const Dialect& torchtitan_dialect();
const Dialect& maxtext_dialect();

const char* to_string(Framework f) {
  switch (f) {
    case Framework::Megatron: return "megatron";
    case Framework::TorchTitan: return "torchtitan";
    case Framework::MaxText: return "maxtext";
  }
  return "?";
}

Framework parse_framework(const std::string& name, const Origin& at) {
  if (name == "megatron" || name == "primus") return Framework::Megatron;
  if (name == "torchtitan") return Framework::TorchTitan;
  if (name == "maxtext") return Framework::MaxText;
  const std::vector<std::string> known = {"megatron", "primus", "torchtitan", "maxtext"};
  fail("{}: framework '{}' is not supported{}; this engine reads configs written for: {} (docs/config.md)", at.str(),
       name, did_you_mean(name, known), fmt::join(known, ", "));
}

Framework written_framework(const YamlTree& tree, const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::string name = "megatron";
  const YAML::Node m = tree.root["modules"];
  if (m && m.IsMap() && m["pre_trainer"] && m["pre_trainer"].IsMap() && m["pre_trainer"]["framework"] &&
      m["pre_trainer"]["framework"].IsScalar())
    name = m["pre_trainer"]["framework"].Scalar();
  for (const auto& [k, v] : overrides)
    if (k == "modules.pre_trainer.framework") name = v;
  try {
    return parse_framework(name, Origin{});
  } catch (const Error&) {
    return Framework::Megatron;
  }
}

const Dialect& dialect_of(Framework f) {
  if (f == Framework::TorchTitan) return torchtitan_dialect();
  if (f == Framework::MaxText) return maxtext_dialect();
  fail("internal: the Megatron dialect is config/experiment.cpp's own");
}

const DialectKey* find_dialect_key(const Dialect& d, const std::string& name) {
  const auto& keys = d.keys();
  auto it = std::lower_bound(keys.begin(), keys.end(), name,
                             [](const DialectKey& k, const std::string& n) { return k.name < n; });
  return it != keys.end() && it->name == name ? &*it : nullptr;
}

namespace {

std::string first_segment(const std::string& key) { return key.substr(0, key.find('.')); }

// Whether `path` is a section of the dialect (a prefix of some key), not a key itself.
bool is_section(const Dialect& d, const std::string& path) {
  const std::string prefix = path + ".";
  const auto& keys = d.keys();
  auto it = std::lower_bound(keys.begin(), keys.end(), prefix,
                             [](const DialectKey& k, const std::string& n) { return k.name < n; });
  return it != keys.end() && std::string(it->name).starts_with(prefix);
}

bool is_engine_key(const std::string& key) {
  for (const auto& k : training_keys())
    if (key == k.name) return true;
  const std::vector<std::string> model = model_spec_keys();
  return std::find(model.begin(), model.end(), key) != model.end() && key != "extends" && key != "description";
}

std::string flow(const YAML::Node& n) {
  if (!n || n.IsNull()) return "null";
  if (n.IsScalar()) return n.Scalar().empty() ? "\"\"" : n.Scalar();
  YAML::Node copy = YAML::Clone(n);  // a block list from a file keeps its style unless told
  copy.SetStyle(YAML::EmitterStyle::Flow);
  YAML::Emitter e;
  e << copy;
  return e.c_str();
}

// An access token (MaxText's hf_access_token) is not echoed into logs and saved configs.
bool is_secret(const std::string& key) {
  return key.find("token") != std::string::npos || key.find("password") != std::string::npos ||
         key.find("secret") != std::string::npos;
}

// A not-supported key keeps the engine's value: null, that value, an empty list for "[]".
bool keeps_engine_value(const DialectKey& k, const YAML::Node& v) {
  if (!v || v.IsNull()) return true;
  if (v.IsSequence()) return flow(v) == k.value;  // "[]", "[silu, linear]"
  if (v.IsScalar() && std::string(k.value) == "\"\"" && v.Scalar().empty()) return true;
  return is_engine_value(ForeignKey{k.name, k.status, k.value, k.note, Src::P}, v);
}

// `config: pre_trainer.yaml` and `model: llama3.1_8B.yaml` of a dialect config: beside the
// experiment config, else this project's configs/<kind>/<framework>/.
std::string resolve_file(const std::string& name, const std::string& config_file, const std::string& kind, Framework f,
                         const Origin& at) {
  std::error_code ec;
  const fs::path beside = fs::path(config_file).parent_path() / name;
  if (fs::is_regular_file(beside, ec)) return beside.string();
  const fs::path dir = fs::path(model_preset_dir()).parent_path() / kind / to_string(f);
  const fs::path ours = dir / fs::path(name).filename();
  if (fs::is_regular_file(ours, ec)) return ours.string();
  std::vector<std::string> known;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".yaml" && e.path().stem() != "model_base")
        known.push_back(e.path().filename().string());
  std::sort(known.begin(), known.end());
  fail("{}: {} {} file '{}' not found beside the config nor in {}{}; known: {}", at.str(), to_string(f),
       kind == "models" ? "model" : "module", name, dir.string(),
       did_you_mean(fs::path(name).filename().string(), known), fmt::join(known, ", "));
}

// Flattens a dialect's nested sections into dotted keys; a map is a section when the dialect has
// keys under it, else a value (MaxText's vllm_hf_overrides).
struct Flattener {
  const Dialect& d;
  std::map<std::string, DialectSettings::Entry>& out;
  std::map<std::string, bool>& from_experiment;

  void add(const YAML::Node& map, const std::string& path, const YamlTree& tree, const std::string& origin_prefix,
           bool experiment) {
    for (auto kv : map) {
      const std::string key = path.empty() ? kv.first.as<std::string>() : path + "." + kv.first.as<std::string>();
      const std::string origin_path = origin_prefix.empty() ? key : origin_prefix + "." + key;
      if (kv.second.IsNull() && !find_dialect_key(d, key) && is_section(d, key)) continue;  // `quantize:` alone
      if (kv.second.IsMap() && !find_dialect_key(d, key) && is_section(d, key)) {
        add(kv.second, key, tree, origin_prefix, experiment);
        continue;
      }
      out[key] = {kv.second, tree.origin(origin_path)};
      from_experiment[key] = experiment;
    }
  }
};

}  // namespace

bool is_dialect_key(Framework f, const std::string& key) {
  if (f == Framework::Megatron) return false;
  const Dialect& d = dialect_of(f);
  const std::string head = first_segment(key);
  return find_dialect_key(d, head) || is_section(d, head);
}

std::vector<std::string> dialect_key_names(Framework f) {
  std::vector<std::string> out;
  if (f == Framework::Megatron) return out;
  for (const auto& k : dialect_of(f).keys()) out.push_back(k.name);
  return out;
}

YAML::Node yaml_number(double v) { return YAML::Node(fmt::format("{}", v)); }

// ---- DialectSettings ------------------------------------------------------------------------

DialectSettings::DialectSettings(const Dialect& d, std::map<std::string, Entry> written, int world_size)
    : d_(d), written_(std::move(written)), world_size_(world_size) {}

const DialectKey& DialectSettings::applied(const std::string& key) const {
  const DialectKey* k = find_dialect_key(d_, key);
  PRIMUS_CHECK(k && k->status == KeyStatus::Applied, "{} reads '{}', which its table does not apply",
               to_string(d_.framework()), key);
  if (std::find(read_.begin(), read_.end(), key) == read_.end()) read_.push_back(key);
  return *k;
}

YAML::Node DialectSettings::node(const std::string& key) const {
  const DialectKey& k = applied(key);
  auto it = written_.find(key);
  if (it != written_.end() && it->second.value && !it->second.value.IsNull()) return it->second.value;
  return YAML::Load(k.value);
}

bool DialectSettings::written(const std::string& key) const {
  applied(key);
  auto it = written_.find(key);
  return it != written_.end() && it->second.value && !it->second.value.IsNull();
}

Origin DialectSettings::at(const std::string& key) const {
  auto it = written_.find(key);
  if (it != written_.end()) return it->second.at;
  return Origin{fmt::format("{}'s default of {}", to_string(d_.framework()), key), 0};
}

std::string DialectSettings::show(const std::string& key) const {
  return fmt::format("{}: {}{}", key, flow(node(key)), written(key) ? "" : " (default)");
}

std::string DialectSettings::text(const std::string& key) const {
  const YAML::Node n = node(key);
  if (n.IsNull()) return "";
  if (!n.IsScalar()) fail("{}: '{}' must be text, got {}", at(key).str(), key, flow(n));
  return n.Scalar();
}

int64_t DialectSettings::integer(const std::string& key) const {
  const YAML::Node n = node(key);
  int64_t v = 0;
  if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v))
    fail("{}: '{}' must be an integer, got {}", at(key).str(), key, flow(n));
  return v;
}

double DialectSettings::number(const std::string& key) const {
  const YAML::Node n = node(key);
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v))
    fail("{}: '{}' must be a number, got {}", at(key).str(), key, flow(n));
  return v;
}

bool DialectSettings::flag(const std::string& key) const {
  const YAML::Node n = node(key);
  if (n.IsScalar() && (n.Scalar() == "0" || n.Scalar() == "1")) return n.Scalar() == "1";
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v))
    fail("{}: '{}' must be true or false, got {}", at(key).str(), key, flow(n));
  return v;
}

void DialectSettings::set(const std::string& engine_key, const YAML::Node& value,
                          const std::vector<std::string>& from) {
  PRIMUS_CHECK(!from.empty(), "engine key {} set from no dialect key", engine_key);
  engine_[engine_key] = value;
  engine_origins_[engine_key] = at(from.front());
  std::vector<std::string> shown;
  for (const auto& k : from) shown.push_back(show(k));
  record_.push_back({fmt::format("{}", fmt::join(shown, ", ")), fmt::format("{}: {}", engine_key, flow(value))});
}

void DialectSettings::set_model(const std::string& preset, const std::vector<std::string>& from) {
  model_ = preset;
  engine_origins_["model"] = at(from.front());
  std::vector<std::string> shown;
  for (const auto& k : from) shown.push_back(show(k));
  record_.push_back({fmt::format("{}", fmt::join(shown, ", ")), fmt::format("model: {} (configs/models)", preset)});
}

void DialectSettings::refuse(const std::string& key, const std::string& why) const {
  fail("{}: '{}: {}' is not supported: {}", at(key).str(), key, flow(node(key)), why);
}

// ---- the translation --------------------------------------------------------------------------

namespace {

// A dialect config's pre-trainer as written: module defaults, then the model file, then the
// experiment's overrides (the command line's are already in them), each later one winning key by
// key, flattened into the dialect's dotted names.
struct WrittenModule {
  std::map<std::string, DialectSettings::Entry> keys;
  std::map<std::string, bool> from_experiment;  // false: from the module or model file
  Origin model_at;
};

WrittenModule read_module(const Dialect& d, const YamlTree& tree, const YAML::Node& pt,
                          const std::string& config_file) {
  const Framework f = d.framework();
  const std::string at = "modules.pre_trainer";
  WrittenModule w;
  Flattener flat{d, w.keys, w.from_experiment};
  if (pt["config"] && !pt["config"].IsNull()) {
    if (!pt["config"].IsScalar()) fail("{}: 'config' must be a file name", tree.origin(at + ".config").str());
    const YamlTree module = load_yaml_tree(
        resolve_file(pt["config"].Scalar(), config_file, "modules", f, tree.origin(at + ".config")));
    flat.add(module.root, "", module, "", false);
  }
  if (!pt["model"] || !pt["model"].IsScalar() || pt["model"].Scalar().empty())
    fail("{}: modules.pre_trainer.model is missing: name a {} model file of configs/models/{}/ (e.g. {})", config_file,
         to_string(f), to_string(f), f == Framework::TorchTitan ? "llama3.1_8B.yaml" : "llama3_8B.yaml");
  w.model_at = tree.origin(at + ".model");
  const YamlTree model = load_yaml_tree(resolve_file(pt["model"].Scalar(), config_file, "models", f, w.model_at));
  flat.add(model.root, "", model, "", false);
  if (const YAML::Node ov = pt["overrides"]; ov && !ov.IsNull()) {
    if (!ov.IsMap()) fail("{}: 'overrides' must be a map of key: value", tree.origin(at + ".overrides").str());
    flat.add(ov, "", tree, at + ".overrides", true);
  }
  return w;
}

// Every written key: the dialect's (checked by its verdict; no-effect ones listed), an engine key
// (returned), or an error naming the nearest name.
std::vector<std::string> check_verdicts(const Dialect& d, const WrittenModule& w, DialectRecord& record) {
  std::vector<std::string> engine_keys;
  for (const auto& [key, e] : w.keys) {
    if (const DialectKey* k = find_dialect_key(d, key)) {
      if (k->status == KeyStatus::NoEffect && w.from_experiment.at(key) && e.value && !e.value.IsNull())
        record.no_effect.push_back({key, is_secret(key) ? "(hidden)" : flow(e.value), k->note});
      if (k->status == KeyStatus::NotSupported && !keeps_engine_value(*k, e.value))
        fail("{}: '{}' is not supported: {}; this engine runs as '{}: {}' (remove the key or set it to that)",
             e.at.str(), key, k->note, key, k->value);
    } else if (key.find('.') == std::string::npos && is_engine_key(key)) {
      engine_keys.push_back(key);
    } else {
      std::vector<std::string> names = dialect_key_names(d.framework());
      for (const auto& t : training_keys()) names.push_back(t.name);
      for (const auto& m : model_spec_keys()) names.push_back(m);
      fail("{}: unknown key '{}'{} in a {} config (docs/config.md lists its keys)", e.at.str(), key,
           did_you_mean(key, names), to_string(d.framework()));
    }
  }
  return engine_keys;
}

// The pre-trainer in engine keys: the preset, the translated keys, then the engine keys the
// config names itself, which win; their origins point at the keys they came from.
void rewrite_module(YAML::Node pt, YamlTree& tree, const DialectSettings& s, const WrittenModule& w,
                    const std::vector<std::string>& engine_keys, DialectRecord& record) {
  YAML::Node engine = YAML::Clone(s.engine());
  std::map<std::string, Origin> origins = s.engine_origins();
  record.keys = s.record();
  for (const auto& key : engine_keys) {
    const auto& e = w.keys.at(key);
    const bool over = static_cast<bool>(engine[key]);
    engine[key] = e.value;
    origins[key] = e.at;
    record.keys.push_back(
        {fmt::format("{}: {}", key, flow(e.value)),
         fmt::format("{}: {} (an engine key{})", key, flow(e.value), over ? ", over the translated value" : "")});
  }
  const std::string at = "modules.pre_trainer";
  pt.remove("config");
  pt["model"] = s.model();
  pt["overrides"] = engine;
  tree.origins[at + ".model"] = origins.count("model") ? origins.at("model") : w.model_at;
  for (const auto& [key, o] : origins)
    if (key != "model") tree.origins[at + ".overrides." + key] = o;
}

}  // namespace

DialectRecord translate_dialect(Framework f, YamlTree& tree, const std::string& config_file, int world_size) {
  const Dialect& d = dialect_of(f);
  YAML::Node pt = tree.root["modules"]["pre_trainer"];
  const WrittenModule written = read_module(d, tree, pt, config_file);
  DialectRecord record;
  record.framework = f;
  const std::vector<std::string> engine_keys = check_verdicts(d, written, record);

  DialectSettings s(d, written.keys, world_size);
  d.translate(s);
  // A written key that the table calls applied but the translation never read would be dropped
  // silently: that is a bug in the dialect's code, not in the config.
  for (const auto& [key, e] : written.keys)
    if (const DialectKey* k = find_dialect_key(d, key); k && k->status == KeyStatus::Applied)
      PRIMUS_CHECK(std::find(s.read_keys().begin(), s.read_keys().end(), key) != s.read_keys().end(),
                   "the {} dialect applies '{}' but did not read it", to_string(f), key);
  PRIMUS_CHECK(!s.model().empty(), "the {} dialect chose no model preset", to_string(f));
  rewrite_module(pt, tree, s, written, engine_keys, record);
  return record;
}

std::string dialect_side_by_side(const DialectRecord& r) {
  if (r.empty()) return "";
  size_t width = 0;
  for (const auto& k : r.keys) width = std::max(width, std::min<size_t>(k.written.size(), 64));
  std::string out = fmt::format("# framework: {}, each key as written -> this engine's key (docs/config.md):\n",
                                to_string(r.framework));
  for (const auto& k : r.keys) out += fmt::format("#   {:<{}}  ->  {}\n", k.written, width, k.engine);
  return out;
}

std::string dialect_keys_reference(Framework f) {
  const Dialect& d = dialect_of(f);
  std::string out =
      fmt::format("| {} key | status | default (not supported: accepted value) | note |\n|---|---|---|---|\n",
                  f == Framework::TorchTitan ? "torchtitan" : "MaxText");
  auto cell = [](std::string v) {
    for (size_t i = 0; (i = v.find('|', i)) != std::string::npos; i += 2) v.replace(i, 1, "\\|");
    return v;
  };
  for (const auto& k : d.keys())
    out += fmt::format("| `{}` | {} | {} | {} |\n", k.name, to_string(k.status),
                       std::string(k.value).empty() ? "" : "`" + cell(k.value) + "`", cell(k.note));
  return out;
}

}  // namespace primus::config
