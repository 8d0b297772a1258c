#include "config/lora.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "config/choices.h"
#include "core/error.h"
#include "core/suggest.h"

namespace primus::config {
namespace {

struct LoraKey {
  const char* name;
  const char* help;
};

const std::vector<LoraKey>& lora_keys() {
  static const std::vector<LoraKey> keys = {
      {"enabled", "adapters on the target linears, every other weight frozen (no gradient, no optimizer state)"},
      {"dim", "the adapters' rank r: A is [r, in], B [out, r]"},
      {"alpha", "the adapters' output is scaled by alpha / dim"},
      {"dropout", "the probability of dropping an element in training (kept ones scaled by 1 / (1 - p)); 0: none"},
      {"dropout_position", "pre: on the adapter's input; post: on its scaled output"},
      {"lora_A_init_method", "xavier, normal, kaiming or zero (model/param_store.h ParamInit)"},
      {"lora_B_init_method", "xavier, normal, kaiming or zero (zero: the first step is the base model's)"},
      {"target_modules",
       "the linears that get adapters: linear_qkv, linear_proj, linear_fc1, linear_fc2 (Megatron-Core "
       "names; the routed experts' and the shared expert's too)"},
  };
  return keys;
}

// Megatron-Bridge's other LoRA fields: refused by name.
constexpr const char* kLoraNotBuilt[][2] = {
    {"exclude_modules", "matching the linears by exclusion is not built: list target_modules"},
    {"a2a_experimental", "the experimental all-to-all of the expert adapters is not built"},
    {"lora_dtype", "the adapters are kept in the run's master dtype (fp32) and computed in its activation dtype"},
};

template <class T>
T scalar(const YAML::Node& v, const std::string& at, const char* key, const char* want) {
  T out{};
  if (!v.IsScalar() || !YAML::convert<T>::decode(v, out)) fail("{}: lora.{} must be {}", at, key, want);
  return out;
}

template <class E>
E choice(const YAML::Node& v, const std::string& at, const std::string& key) {
  const std::optional<E> c = v.IsScalar() ? find_choice<E>(v.Scalar()) : std::nullopt;
  if (!c) fail("{}: {}", at, not_a_choice<E>("lora." + key, v.IsScalar() ? v.Scalar() : "a non-name"));
  return *c;
}

void read_targets(const YAML::Node& v, const std::string& at, LoraOptions& out) {
  if (!v.IsSequence() || v.size() == 0)
    fail("{}: lora.target_modules must be a non-empty list of: {}", at, choice_list<LoraTarget>());
  std::fill(std::begin(out.targets), std::end(out.targets), false);
  for (const auto& e : v) {
    // Megatron-Bridge accepts wildcard paths (*.layers.0.*.linear_qkv): not built here.
    if (e.IsScalar() && e.Scalar().find_first_of("*.") != std::string::npos)
      fail("{}: lora.target_modules '{}': wildcard and dotted module paths are not built; name modules: {}", at,
           e.Scalar(), choice_list<LoraTarget>());
    out.targets[uint8_t(choice<LoraTarget>(e, at, "target_modules"))] = true;
  }
}

}  // namespace

void read_lora(const YAML::Node& node, const std::string& at, LoraOptions& out) {
  if (!node || node.IsNull()) return;
  if (!node.IsMap()) fail("{}: lora must be a map (enabled, dim, alpha, ...)", at);
  std::vector<std::string> names;
  for (const LoraKey& k : lora_keys()) names.push_back(k.name);
  for (auto kv : node) {
    const std::string k = kv.first.as<std::string>();
    const YAML::Node v = kv.second;
    for (const auto& nb : kLoraNotBuilt)
      if (k == nb[0] && !v.IsNull()) {
        bool off = false;
        if (!(YAML::convert<bool>::decode(v, off) && !off)) fail("{}: lora.{} is not supported: {}", at, k, nb[1]);
      }
    if (std::none_of(std::begin(kLoraNotBuilt), std::end(kLoraNotBuilt), [&](const auto& nb) { return k == nb[0]; }) &&
        std::find(names.begin(), names.end(), k) == names.end())
      fail("{}: unknown key 'lora.{}'{}; valid keys: {}", at, k, did_you_mean(k, names), fmt::join(names, ", "));
    if (v.IsNull()) continue;
    if (k == "enabled") out.enabled = scalar<bool>(v, at, "enabled", "true or false");
    if (k == "dim") out.dim = scalar<int64_t>(v, at, "dim", "an integer");
    if (k == "alpha") out.alpha = scalar<double>(v, at, "alpha", "a number");
    if (k == "dropout") out.dropout = scalar<double>(v, at, "dropout", "a number");
    if (k == "dropout_position") out.dropout_position = choice<LoraDropoutPosition>(v, at, k);
    if (k == "lora_A_init_method") out.a_init = choice<LoraInit>(v, at, k);
    if (k == "lora_B_init_method") out.b_init = choice<LoraInit>(v, at, k);
    if (k == "target_modules") read_targets(v, at, out);
  }
  if (!out.enabled) return;
  if (out.dim <= 0) fail("{}: lora.dim must be positive, got {}", at, out.dim);
  if (!(out.dropout >= 0.0 && out.dropout < 1.0))
    fail("{}: lora.dropout must be in [0, 1) (the probability of dropping an element), got {}", at, out.dropout);
}

YAML::Node lora_to_yaml(const LoraOptions& l) {
  YAML::Node n(YAML::NodeType::Map);
  n["enabled"] = l.enabled;
  n["dim"] = l.dim;
  n["alpha"] = l.alpha;
  n["dropout"] = l.dropout;
  n["dropout_position"] = std::string(choice_name(l.dropout_position));
  n["lora_A_init_method"] = std::string(choice_name(l.a_init));
  n["lora_B_init_method"] = std::string(choice_name(l.b_init));
  YAML::Node t(YAML::NodeType::Sequence);
  for (const auto& c : kLoraTargetChoices)
    if (l.applies_to(c.value)) t.push_back(std::string(c.name));
  n["target_modules"] = t;
  return n;
}

std::string lora_keys_reference() {
  const YAML::Node d = lora_to_yaml(LoraOptions{});
  std::string out = "| key | default | meaning |\n|---|---|---|\n";
  for (const LoraKey& k : lora_keys()) {
    YAML::Emitter e;
    e << YAML::Flow << d[k.name];
    out += fmt::format("| `lora.{}` | `{}` | {} |\n", k.name, e.c_str(), k.help);
  }
  return out;
}

}  // namespace primus::config
