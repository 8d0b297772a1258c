// Config dialects: experiment configs written for Primus's other backends (`framework:
// torchtitan`, `framework: maxtext`) in those frameworks' own key names, translated at the config
// boundary into this engine's keys (the training keys of config/experiment.h, the model keys of
// model/model_spec.h and a model preset), then loaded like a Megatron config.
//
// Each dialect has a table of every key of its framework (DialectKey), with the same three
// verdicts as the Megatron table of config/foreign_keys.h:
//
//   applied        translated into engine keys (the note says which); the framework's default
//                  is used when the config leaves the key out
//   no effect      accepted, listed once at start-up and in --print-config
//   not supported  would change the result and is not built: an error naming the key, unless the
//                  value is the one this engine runs with (or null)
//
// A dialect config may also name engine keys (top-level `overrides` or the command line, e.g.
// `--num_layers 2`); they win over what the dialect's keys translate to, key by key.
//
// The tables and translations live in dialect_torchtitan.cpp and dialect_maxtext.cpp; this file's
// code (dialect.cpp) reads the config, checks every key against its table and rewrites the
// pre-trainer module into engine keys.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "config/foreign_keys.h"
#include "config/yaml_tree.h"

namespace primus::config {

// `framework:` of the pre-trainer module. "megatron" and "primus" are Megatron's dialect.
enum class Framework { Megatron, TorchTitan, MaxText };
const char* to_string(Framework f);
// Fails at `at` naming the known frameworks for any other name.
Framework parse_framework(const std::string& name, const Origin& at);

struct DialectKey {
  const char* name;  // torchtitan: "section.key" as nested in the config; MaxText: flat
  KeyStatus status;
  const char* value;  // the framework's default (YAML text); for not supported: the value this
                      // engine runs with, which the key may keep
  const char* note;   // applied: the engine keys it becomes; otherwise why
};

// One written key and what it became, for --print-config's side-by-side view.
struct TranslatedKey {
  std::string written;  // "training.steps: 50" (or "(default)" marks a framework default)
  std::string engine;   // "train_iters: 50"
};

// What a dialect config turned into, besides the engine keys themselves.
struct DialectRecord {
  Framework framework = Framework::Megatron;
  std::vector<TranslatedKey> keys;
  struct NoEffect {
    std::string key, value, note;
  };
  std::vector<NoEffect> no_effect;
  bool empty() const { return framework == Framework::Megatron; }
};

class DialectSettings;

// A number as YAML text in its shortest exact form (0.0008, not 0.00080000000000000004).
YAML::Node yaml_number(double v);

// One framework's dialect: its table and its translation.
class Dialect {
 public:
  virtual ~Dialect() = default;
  virtual Framework framework() const = 0;
  // Where the names, defaults and model flavours come from (repositories and commits).
  virtual const char* source() const = 0;
  // Every key of the framework, sorted by name.
  virtual const std::vector<DialectKey>& keys() const = 0;
  // Reads the applied keys from `s` and sets engine keys and the model preset on it.
  virtual void translate(DialectSettings& s) const = 0;
};

// The framework `tree` is written for (with a command-line `--modules.pre_trainer.framework` among
// `overrides`), before the command line's keys are placed; Megatron when not written or unknown
// (an unknown name is refused, with its line, where the module is read).
Framework written_framework(const YamlTree& tree, const std::vector<std::pair<std::string, std::string>>& overrides);

const Dialect& dialect_of(Framework f);  // TorchTitan or MaxText
const DialectKey* find_dialect_key(const Dialect& d, const std::string& name);
// Whether a command-line override `--key value` names a key (or, for torchtitan, a section) of
// `f`'s dialect; such a key goes under the module's overrides in the dialect's own names.
bool is_dialect_key(Framework f, const std::string& key);
// Every key name of the dialect (for "did you mean").
std::vector<std::string> dialect_key_names(Framework f);

// Rewrites `tree`'s modules.pre_trainer, written in `f`'s dialect, into engine keys: `model`
// becomes a preset, `config` goes, `overrides` holds training and model keys (their origins point
// at the dialect keys they came from). `config_file` is the experiment config (module and model
// files are looked up beside it, then in configs/modules/<framework>/ and
// configs/models/<framework>/). `world_size` resolves the data-parallel degrees that the dialect
// leaves to the launch (-1) and the global batch made of per-device batches; 0: not known (one
// process is assumed). Errors name the key, its file and line.
DialectRecord translate_dialect(Framework f, YamlTree& tree, const std::string& config_file, int world_size);

// The record as comment lines for --print-config and the saved config.yaml: each key as written
// beside the engine key it became ("" for a Megatron config).
std::string dialect_side_by_side(const DialectRecord& r);

// Markdown table of every key of `f`'s dialect: key, status, default or accepted value, note.
std::string dialect_keys_reference(Framework f);

// The view of a dialect config that Dialect::translate works on: every written key with its
// origin, the framework's defaults behind them, and the engine keys being made.
class DialectSettings {
 public:
  struct Entry {
    YAML::Node value;
    Origin at;
  };
  DialectSettings(const Dialect& d, std::map<std::string, Entry> written, int world_size);

  // An applied key's value as written, else the table's default. Typed getters fail naming the
  // key when the value has another type.
  YAML::Node node(const std::string& key) const;
  bool is_null(const std::string& key) const { return node(key).IsNull(); }
  std::string text(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool flag(const std::string& key) const;
  bool written(const std::string& key) const;  // set by the config, the command line or a module/model file
  Origin at(const std::string& key) const;     // where; the framework's default when not written
  // "training.steps: 50" or "training.steps: 50 (default)".
  std::string show(const std::string& key) const;

  // The launch's world size; when not known (0 given), 1, and world_known() is false.
  int world_size() const { return std::max(1, world_size_); }
  bool world_known() const { return world_size_ > 0; }
  // Whether the config names this engine key itself (e.g. data_path beside a dialect's keys).
  bool has_engine_key(const std::string& key) const { return written_.count(key) > 0; }

  // Sets an engine key (training or model key) from the dialect keys in `from`.
  void set(const std::string& engine_key, const YAML::Node& value, const std::vector<std::string>& from);
  // The model preset (configs/models/<preset>.yaml), from the keys in `from`.
  void set_model(const std::string& preset, const std::vector<std::string>& from);
  // Fails at `key`'s origin: "'key: value' is not supported: why".
  [[noreturn]] void refuse(const std::string& key, const std::string& why) const;

  const std::string& model() const { return model_; }
  const YAML::Node& engine() const { return engine_; }
  const std::map<std::string, Origin>& engine_origins() const { return engine_origins_; }
  const std::vector<TranslatedKey>& record() const { return record_; }
  const std::vector<std::string>& read_keys() const { return read_; }

 private:
  const DialectKey& applied(const std::string& key) const;
  const Dialect& d_;
  std::map<std::string, Entry> written_;
  int world_size_;
  std::string model_;
  YAML::Node engine_{YAML::NodeType::Map};
  std::map<std::string, Origin> engine_origins_;
  std::vector<TranslatedKey> record_;
  mutable std::vector<std::string> read_;
};

}  // namespace primus::config
