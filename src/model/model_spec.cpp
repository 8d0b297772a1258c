// ModelSpec: YAML presets (with `extends:`), validation, and the counting that `analyze model`,
// MFU and the benchmarks share. The conventions are written out in docs/model_math.md.
#include "model/model_spec.h"
#include "model/attention_flops.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <variant>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "core/suggest.h"

namespace fs = std::filesystem;

namespace primus {
namespace {

// ---------------------------------------------------------------------------------------------
// The keys a preset may hold: every ModelSpec field under its Megatron name, plus `extends`
// (inherit another preset) and `description` (free text).

using Member = std::variant<int64_t ModelSpec::*, double ModelSpec::*, bool ModelSpec::*, std::string ModelSpec::*,
                            GroupScore ModelSpec::*>;

struct Field {
  const char* key;
  Member member;
  bool nullable = false;  // YAML null (as Megatron's None) sets the "none" value: 0 or ""
};

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"num_layers", &ModelSpec::num_layers},
      {"hidden_size", &ModelSpec::hidden_size},
      {"ffn_hidden_size", &ModelSpec::ffn_hidden_size},
      {"num_attention_heads", &ModelSpec::num_attention_heads},
      {"num_query_groups", &ModelSpec::num_query_groups},
      {"kv_channels", &ModelSpec::kv_channels},
      {"vocab_size", &ModelSpec::vocab_size},
      {"max_position_embeddings", &ModelSpec::max_position_embeddings},
      {"norm_epsilon", &ModelSpec::norm_epsilon},
      {"rotary_base", &ModelSpec::rotary_base},
      {"untie_embeddings_and_output_weights", &ModelSpec::untie_embeddings_and_output_weights},
      {"add_qkv_bias", &ModelSpec::add_qkv_bias},
      {"add_bias_linear", &ModelSpec::add_bias_linear},
      {"init_method_std", &ModelSpec::init_method_std},
      {"use_rope_scaling", &ModelSpec::use_rope_scaling},
      {"rope_scaling_factor", &ModelSpec::rope_scaling_factor},
      {"rope_low_freq_factor", &ModelSpec::rope_low_freq_factor},
      {"rope_high_freq_factor", &ModelSpec::rope_high_freq_factor},
      {"rope_original_max_position_embeddings", &ModelSpec::rope_original_max_position_embeddings},
      {"rotary_percent", &ModelSpec::rotary_percent},
      {"qk_layernorm", &ModelSpec::qk_layernorm},
      {"softmax_type", &ModelSpec::softmax_type},
      {"quick_geglu", &ModelSpec::quick_geglu},
      {"glu_linear_offset", &ModelSpec::glu_linear_offset},
      {"activation_func_clamp_value", &ModelSpec::activation_func_clamp_value, true},
      {"window_size", &ModelSpec::window_size, true},                      // a [left, right] pair: set_window_size
      {"window_attn_skip_freq", &ModelSpec::window_attn_skip_freq, true},  // also a list: set_window_pattern
      {"no_rope_freq", &ModelSpec::no_rope_freq, true},                    // also a list: set_no_rope_pattern
      {"qk_l2_norm", &ModelSpec::qk_l2_norm},
      {"attention_chunk_size", &ModelSpec::attention_chunk_size, true},
      {"attn_temperature_tuning", &ModelSpec::attn_temperature_tuning},
      {"floor_scale", &ModelSpec::floor_scale},
      {"attn_scale", &ModelSpec::attn_scale},
      {"final_logit_softcapping", &ModelSpec::final_logit_softcapping, true},
      {"router_logit_softcapping", &ModelSpec::router_logit_softcapping, true},
      {"multi_latent_attention", &ModelSpec::multi_latent_attention},
      {"q_lora_rank", &ModelSpec::q_lora_rank, true},
      {"kv_lora_rank", &ModelSpec::kv_lora_rank},
      {"qk_head_dim", &ModelSpec::qk_head_dim},
      {"qk_pos_emb_head_dim", &ModelSpec::qk_pos_emb_head_dim},
      {"v_head_dim", &ModelSpec::v_head_dim},
      {"rotary_scaling_factor", &ModelSpec::rotary_scaling_factor},
      {"mscale", &ModelSpec::mscale},
      {"mscale_all_dim", &ModelSpec::mscale_all_dim},
      {"beta_fast", &ModelSpec::beta_fast},
      {"beta_slow", &ModelSpec::beta_slow},
      {"original_max_position_embeddings", &ModelSpec::original_max_position_embeddings},
      {"position_embedding_type", &ModelSpec::position_embedding_type},
      {"yarn_beta_fast", &ModelSpec::yarn_beta_fast},
      {"yarn_beta_slow", &ModelSpec::yarn_beta_slow},
      {"yarn_original_max_position_embeddings", &ModelSpec::yarn_original_max_position_embeddings},
      {"yarn_correction_range_round_to_int", &ModelSpec::yarn_correction_range_round_to_int},
      {"num_experts", &ModelSpec::num_experts, true},
      {"moe_ffn_hidden_size", &ModelSpec::moe_ffn_hidden_size, true},
      {"moe_router_topk", &ModelSpec::moe_router_topk},
      {"moe_layer_freq", &ModelSpec::moe_layer_freq},  // also a list or an expression: set_moe_layer_freq
      {"moe_shared_expert_intermediate_size", &ModelSpec::moe_shared_expert_intermediate_size, true},
      {"moe_shared_expert_gate", &ModelSpec::moe_shared_expert_gate},
      {"moe_router_score_function", &ModelSpec::moe_router_score_function},
      {"moe_router_pre_softmax", &ModelSpec::moe_router_pre_softmax},
      {"moe_router_norm_topk_prob", &ModelSpec::moe_router_norm_topk_prob},
      {"moe_router_topk_scaling_factor", &ModelSpec::moe_router_topk_scaling_factor, true},
      {"moe_router_num_groups", &ModelSpec::moe_router_num_groups, true},
      {"moe_router_group_topk", &ModelSpec::moe_router_group_topk, true},
      {"moe_router_group_score", &ModelSpec::moe_router_group_score},
      {"moe_router_dtype", &ModelSpec::moe_router_dtype, true},
      {"moe_router_load_balancing_type", &ModelSpec::moe_router_load_balancing_type},
      {"moe_aux_loss_coeff", &ModelSpec::moe_aux_loss_coeff},
      {"moe_z_loss_coeff", &ModelSpec::moe_z_loss_coeff, true},
      {"moe_router_enable_expert_bias", &ModelSpec::moe_router_enable_expert_bias},
      {"moe_router_bias_update_rate", &ModelSpec::moe_router_bias_update_rate},
      {"moe_router_bias_update_centered", &ModelSpec::moe_router_bias_update_centered},
      {"moe_expert_capacity_factor", &ModelSpec::moe_expert_capacity_factor, true},
      {"moe_token_drop_policy", &ModelSpec::moe_token_drop_policy},
      {"moe_expert_capacity_per_sequence", &ModelSpec::moe_expert_capacity_per_sequence},
      {"moe_pad_expert_input_to_capacity", &ModelSpec::moe_pad_expert_input_to_capacity},
      {"moe_router_force_load_balancing", &ModelSpec::moe_router_force_load_balancing},
      {"moe_token_dispatcher_type", &ModelSpec::moe_token_dispatcher_type},
      {"mtp_num_layers", &ModelSpec::mtp_num_layers, true},
      {"mtp_loss_scaling_factor", &ModelSpec::mtp_loss_scaling_factor},
      {"moe_apply_probs_on_input", &ModelSpec::moe_apply_probs_on_input},
  };
  return f;
}

std::vector<std::string> valid_keys() {
  std::vector<std::string> keys = {"extends", "description"};
  for (const auto& f : fields()) keys.push_back(f.key);
  return keys;
}

// "file:line:col" for messages; yaml-cpp marks are 0-based, editors count from 1.
std::string where(const std::string& origin, const YAML::Mark& m) {
  if (m.is_null()) return origin;
  return fmt::format("{}:{}:{}", origin, m.line + 1, m.column + 1);
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

// Primus writes moe_layer_freq as a Python expression over 0/1 lists: "([0]*3+[1]*58)", i.e.
// a sum of terms, each a list "[a, b, ...]" repeated by "*n" (on either side). Returns the list.
std::vector<int64_t> parse_layer_pattern(const std::string& text, const std::string& at) {
  std::string t;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  auto bad = [&](const std::string& why) -> void {
    fail("{}: 'moe_layer_freq' expression '{}' {}: write e.g. \"([0]*3+[1]*58)\", a list [0, 1, 1] or an "
         "integer",
         at, text, why);
  };
  while (t.size() >= 2 && t.front() == '(' && t.back() == ')') t = t.substr(1, t.size() - 2);
  if (t.empty()) bad("is empty");
  std::vector<int64_t> out;
  size_t i = 0;
  auto number = [&]() -> int64_t {
    size_t j = i;
    while (j < t.size() && std::isdigit(static_cast<unsigned char>(t[j]))) ++j;
    if (j == i) bad(fmt::format("expects a number at position {}", i + 1));
    int64_t v = std::stoll(t.substr(i, j - i));
    i = j;
    return v;
  };
  auto list = [&]() {
    std::vector<int64_t> l;
    if (i >= t.size() || t[i] != '[') bad(fmt::format("expects '[' at position {}", i + 1));
    ++i;
    while (true) {
      l.push_back(number());
      if (i < t.size() && t[i] == ',') { ++i; continue; }
      if (i < t.size() && t[i] == ']') { ++i; break; }
      bad("has an unclosed list");
    }
    return l;
  };
  while (i < t.size()) {
    int64_t times = 1;
    if (std::isdigit(static_cast<unsigned char>(t[i]))) {  // n*[...]
      times = number();
      if (i >= t.size() || t[i] != '*') bad("expects '*' after a repeat count");
      ++i;
    }
    std::vector<int64_t> l = list();
    if (i < t.size() && t[i] == '*') {
      ++i;
      times *= number();
    }
    if (times > 1000000) bad("repeats a list too often");
    for (int64_t r = 0; r < times; ++r) out.insert(out.end(), l.begin(), l.end());
    if (i < t.size()) {
      if (t[i] != '+') bad(fmt::format("expects '+' at position {}", i + 1));
      ++i;
      if (i == t.size()) bad("ends with '+'");
    }
  }
  return out;
}

// moe_layer_freq: an integer, a YAML list of 0/1, or an expression string.
void set_moe_layer_freq(ModelSpec& spec, const YAML::Node& value, const std::string& at) {
  if (value.IsSequence()) {
    std::vector<int64_t> l;
    for (const auto& e : value) {
      int64_t v = 0;
      if (!e.IsScalar() || !YAML::convert<int64_t>::decode(e, v))
        fail("{}: 'moe_layer_freq' list entries must be 0 or 1, got {}", at, scalar_text(e));
      l.push_back(v);
    }
    spec.moe_layer_pattern = l;
    return;
  }
  int64_t v = 0;
  if (value.IsScalar() && YAML::convert<int64_t>::decode(value, v)) {
    spec.moe_layer_freq = v;
    spec.moe_layer_pattern.clear();
    return;
  }
  if (!value.IsScalar())
    fail("{}: 'moe_layer_freq' must be an integer, a list of 0/1 or an expression string, got {}", at,
         scalar_text(value));
  spec.moe_layer_pattern = parse_layer_pattern(value.Scalar(), at);
}

// window_size: null, or Megatron's [left, right] with right 0 (causal) and left >= -1 (-1: none).
void set_window_size(ModelSpec& spec, const YAML::Node& value, const std::string& at) {
  if (value.IsNull()) {
    spec.window_size = -1;
    return;
  }
  int64_t left = 0, right = 0;
  if (!value.IsSequence() || value.size() != 2 || !YAML::convert<int64_t>::decode(value[0], left) ||
      !YAML::convert<int64_t>::decode(value[1], right))
    fail("{}: 'window_size' must be null or a pair [left, right] of integers, e.g. [128, 0], got {}", at,
         scalar_text(value));
  if (right != 0)
    fail("{}: 'window_size' [{}, {}]: only causal windows are supported (right = 0): queries never see later keys "
         "in a decoder",
         at, left, right);
  if (left < -1) fail("{}: 'window_size' left window must be >= 0 (or -1 for none), got {}", at, left);
  spec.window_size = left;
}

// A per-layer key that is null, an integer (every N-th layer) or a 0/1 list (one entry per layer,
// 1 meaning `one`, 0 meaning `zero`): window_attn_skip_freq, no_rope_freq.
void set_layer_pattern(const char* key, const char* zero, const char* one, int64_t& freq,
                       std::vector<int64_t>& pattern, const YAML::Node& value, const std::string& at) {
  pattern.clear();
  freq = 0;
  if (value.IsNull()) return;
  int64_t v = 0;
  if (value.IsScalar() && YAML::convert<int64_t>::decode(value, v)) {
    freq = v;
    return;
  }
  if (!value.IsSequence()) fail("{}: '{}' must be null, an integer or a 0/1 list, got {}", at, key, scalar_text(value));
  for (const auto& e : value) {
    if (!e.IsScalar() || !YAML::convert<int64_t>::decode(e, v) || (v != 0 && v != 1))
      fail("{}: '{}' list entries must be 0 ({}) or 1 ({}), got {}", at, key, zero, one, scalar_text(e));
    pattern.push_back(v);
  }
}

// A key's value as its field's type. YAML null (Megatron's None) gives the "none" value of a
// nullable key: 0 or "".
template <typename T>
T field_value(const Field& f, const YAML::Node& value, const std::string& at) {
  if (f.nullable && value.IsNull()) return T{};
  const char* want = std::is_same_v<T, bool>          ? "true or false"
                     : std::is_same_v<T, int64_t>     ? "an integer"
                     : std::is_same_v<T, std::string> ? "a name"
                                                      : "a number";
  if (!value.IsScalar()) fail("{}: '{}' must be {}, got {}", at, f.key, want, scalar_text(value));
  T v{};
  // yaml-cpp's convert<> reports failure through the bool; it checks that the whole
  // scalar was consumed, so "4096.5" is not an integer and "yes please" not a bool.
  if (!YAML::convert<T>::decode(value, v)) fail("{}: '{}' must be {}, got {}", at, f.key, want, scalar_text(value));
  return v;
}

// An enum key: the one place its name becomes the enum (model_spec_to_yaml writes the name back).
template <>
GroupScore field_value<GroupScore>(const Field& f, const YAML::Node& value, const std::string& at) {
  const std::vector<std::string> names = {group_score_name(GroupScore::TopkSum), group_score_name(GroupScore::Max)};
  const std::string v = value.IsScalar() ? value.Scalar() : "";
  if (v == names[1]) return GroupScore::Max;
  if (v != names[0])
    fail("{}: '{}' must be one of: {}, got {}{}", at, f.key, fmt::join(names, ", "), scalar_text(value),
         did_you_mean(v, names));
  return GroupScore::TopkSum;
}

template <typename T>
T yaml_value(const T& v) {
  return v;
}
const char* yaml_value(GroupScore g) { return group_score_name(g); }

void set_field(ModelSpec& spec, const Field& f, const YAML::Node& value, const std::string& at) {
  if (std::string_view(f.key) == "moe_layer_freq") return set_moe_layer_freq(spec, value, at);
  if (std::string_view(f.key) == "window_size") return set_window_size(spec, value, at);
  if (std::string_view(f.key) == "window_attn_skip_freq")
    return set_layer_pattern(f.key, "full attention", "window", spec.window_attn_skip_freq, spec.window_attn_pattern,
                             value, at);
  if (std::string_view(f.key) == "no_rope_freq")
    return set_layer_pattern(f.key, "RoPE", "NoPE", spec.no_rope_freq, spec.no_rope_pattern, value, at);
  std::visit(
      [&](auto member) { spec.*member = field_value<std::remove_reference_t<decltype(spec.*member)>>(f, value, at); },
      f.member);
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".yaml") || s.ends_with(".yml");
}

YAML::Node load_yaml_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) fail("model spec file '{}' does not exist", path.string());
  try {
    return YAML::LoadFile(path.string());
  } catch (const YAML::ParserException& e) {
    fail("{}: YAML syntax error: {}", where(path.string(), e.mark), e.msg);
  } catch (const YAML::BadFile&) {
    fail("cannot read model spec file '{}'", path.string());
  }
}

fs::path preset_path(const std::string& name) {
  fs::path dir = model_preset_dir();
  fs::path p = dir / (name + ".yaml");
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return p;
  std::vector<std::string> names = list_model_presets();
  fail("unknown model preset '{}'{}; presets in {}: {}", name, did_you_mean(name, names), dir.string(),
       fmt::join(names, ", "));
}

// Applies `node` on top of `spec`: first the preset it extends (recursively), then its own keys.
// `chain` holds the files being loaded, to report cycles instead of recursing forever.
void apply_yaml(ModelSpec& spec, const YAML::Node& node, const std::string& origin,
                const fs::path& base_dir, std::vector<std::string>& chain) {
  if (!node || node.IsNull()) fail("{}: model spec is empty", origin);
  if (!node.IsMap())
    fail("{}: a model spec must be a map of 'key: value' lines, got {}", where(origin, node.Mark()),
         scalar_text(node));

  if (const YAML::Node ext = node["extends"]) {
    const std::string at = where(origin, ext.Mark());
    if (!ext.IsScalar() || ext.Scalar().empty())
      fail("{}: 'extends' must name a preset or a YAML file, got {}", at, scalar_text(ext));
    const std::string parent = ext.Scalar();
    fs::path parent_path;
    if (looks_like_path(parent)) {
      parent_path = fs::path(parent).is_absolute() ? fs::path(parent) : base_dir / parent;
      std::error_code ec;
      if (!fs::is_regular_file(parent_path, ec))
        fail("{}: 'extends: {}': file '{}' does not exist", at, parent, parent_path.string());
    } else {
      try {
        parent_path = preset_path(parent);
      } catch (const Error& e) {
        fail("{}: 'extends: {}': {}", at, parent, e.what());
      }
    }
    std::string canon = fs::weakly_canonical(parent_path).string();
    if (std::find(chain.begin(), chain.end(), canon) != chain.end())
      fail("{}: 'extends: {}' makes a cycle: {} -> {}", at, parent, fmt::join(chain, " -> "), canon);
    chain.push_back(canon);
    apply_yaml(spec, load_yaml_file(parent_path), parent_path.string(), parent_path.parent_path(), chain);
    chain.pop_back();
  }

  std::set<std::string> seen;
  const std::vector<std::string> keys = valid_keys();
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node k = it->first;  // a copy: the iterator yields a temporary pair
    const std::string at = where(origin, k.Mark());
    if (!k.IsScalar()) fail("{}: keys must be plain names, got {}", at, scalar_text(k));
    const std::string key = k.Scalar();
    if (!seen.insert(key).second) fail("{}: key '{}' appears twice", at, key);
    if (key == "extends") continue;
    if (key == "description") {
      if (!it->second.IsScalar()) fail("{}: 'description' must be text", at);
      continue;
    }
    auto f = std::find_if(fields().begin(), fields().end(), [&](const Field& x) { return key == x.key; });
    if (f == fields().end())
      fail("{}: unknown key '{}'{} in a model spec", at, key, did_you_mean(key, keys));
    set_field(spec, *f, it->second, where(origin, it->second.Mark()));
  }
}

ModelSpec load_file(const fs::path& path, const std::string& name) {
  ModelSpec spec;
  std::vector<std::string> chain = {fs::weakly_canonical(path).string()};
  apply_yaml(spec, load_yaml_file(path), path.string(), path.parent_path(), chain);
  spec.name = name;
  return spec;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string model_preset_dir() {
  if (const char* env = std::getenv("PRIMUS_CONFIG_DIR"); env && *env) return (fs::path(env) / "models").string();
  // Beside the executable: a build folder inside the source tree, or an install prefix.
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path p = exe.parent_path(); !p.empty(); p = p.parent_path()) {
      if (is_dir(p / "configs" / "models")) return (p / "configs" / "models").string();
      if (is_dir(p / "share" / "primus" / "configs" / "models"))
        return (p / "share" / "primus" / "configs" / "models").string();
      if (p == p.root_path()) break;
    }
  }
  // The source tree this file was compiled from (CMake passes absolute source paths).
  fs::path src = fs::path(__FILE__).parent_path().parent_path().parent_path() / "configs" / "models";
  if (src.is_absolute() && is_dir(src)) return src.string();
  fail("cannot find the model presets (configs/models): set PRIMUS_CONFIG_DIR to the folder that holds "
       "models/");
}

std::vector<std::string> list_model_presets() {
  fs::path dir = model_preset_dir();
  if (!is_dir(dir)) fail("model preset folder '{}' does not exist", dir.string());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

ModelSpec model_spec_from_yaml(const YAML::Node& node, const std::string& origin) {
  ModelSpec spec;
  std::vector<std::string> chain;
  fs::path base = fs::path(origin).parent_path();
  if (base.empty() || !is_dir(base)) base = fs::current_path();
  apply_yaml(spec, node, origin, base, chain);
  spec.name = origin;
  return spec;
}

ModelSpec load_model_spec(const std::string& name_or_path) {
  if (name_or_path.empty()) fail("no model given: name a preset ({}) or a YAML file",
                                 fmt::join(list_model_presets(), ", "));
  // A bare name is always a preset, even if a file of that name sits in the working folder;
  // "./name" or "name.yaml" reads a file.
  if (looks_like_path(name_or_path)) return load_file(name_or_path, name_or_path);
  return load_file(preset_path(name_or_path), name_or_path);
}

void ModelSpec::validate() const {
  const std::string& who = name.empty() ? std::string("model spec") : "model '" + name + "'";
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail("{}: {} must be positive, got {}", who, field, v);
  };
  positive("num_layers", num_layers);
  positive("hidden_size", hidden_size);
  positive("ffn_hidden_size", ffn_hidden_size);
  positive("num_attention_heads", num_attention_heads);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_query_groups < 0)
    fail("{}: num_query_groups must be positive (or 0 for one group per head), got {}", who, num_query_groups);
  if (kv_channels < 0)
    fail("{}: kv_channels must be positive (or 0 for hidden_size / num_attention_heads), got {}", who,
         kv_channels);
  if (kv_channels == 0 && hidden_size % num_attention_heads != 0)
    fail("{}: hidden_size ({}) must be divisible by num_attention_heads ({}) unless kv_channels is set", who,
         hidden_size, num_attention_heads);
  if (num_attention_heads % query_groups() != 0)
    fail("{}: num_attention_heads ({}) must be divisible by num_query_groups ({})", who, num_attention_heads,
         query_groups());
  if (query_groups() > num_attention_heads)
    fail("{}: num_query_groups ({}) cannot exceed num_attention_heads ({})", who, query_groups(),
         num_attention_heads);
  // Rotary embeddings turn pairs of channels, so each head needs an even width.
  if (!multi_latent_attention && head_dim() % 2 != 0)
    fail("{}: the head dimension ({}: {}) must be even for rotary embeddings", who,
         kv_channels ? "kv_channels" : "hidden_size / num_attention_heads", head_dim());
  if (!(rotary_percent > 0 && rotary_percent <= 1))
    fail("{}: rotary_percent must be in (0, 1], got {}", who, rotary_percent);
  if (rotary_percent != 1 && multi_latent_attention)
    fail("{}: rotary_percent {} with multi-latent attention: its rotary part is qk_pos_emb_head_dim", who,
         rotary_percent);
  if (!multi_latent_attention && (rotary_dim() < 2 || rotary_dim() % 2 != 0))
    fail("{}: rotary_percent {} of the head dimension {} gives {} rotary channels; rotary embeddings need an even "
         "number, at least 2",
         who, rotary_percent, head_dim(), rotary_dim());
  if (multi_latent_attention) {
    if (q_lora_rank < 0) fail("{}: q_lora_rank must be positive (or null for none), got {}", who, q_lora_rank);
    positive("kv_lora_rank", kv_lora_rank);
    positive("qk_head_dim", qk_head_dim);
    positive("qk_pos_emb_head_dim", qk_pos_emb_head_dim);
    positive("v_head_dim", v_head_dim);
    if (qk_pos_emb_head_dim % 2 != 0)
      fail("{}: qk_pos_emb_head_dim ({}) must be even for rotary embeddings", who, qk_pos_emb_head_dim);
    if (!std::isfinite(rotary_scaling_factor) || rotary_scaling_factor < 1)
      fail("{}: rotary_scaling_factor must be at least 1 (1: no YaRN scaling), got {}", who, rotary_scaling_factor);
  }
  if (position_embedding_type != "rope" && position_embedding_type != "yarn")
    fail("{}: position_embedding_type must be rope or yarn (the rotary embeddings this engine builds), got '{}'", who,
         position_embedding_type);
  if (!multi_latent_attention && position_embedding_type == "yarn") {
    if (!std::isfinite(rotary_scaling_factor) || rotary_scaling_factor < 1)
      fail("{}: rotary_scaling_factor must be at least 1 (1: no YaRN scaling), got {}", who, rotary_scaling_factor);
    if (use_rope_scaling)
      fail("{}: position_embedding_type yarn and use_rope_scaling (Llama 3.1's scaling) are two rotary scalings; "
           "set one",
           who);
    if (!(yarn_beta_fast > yarn_beta_slow && yarn_beta_slow > 0))
      fail("{}: yarn_beta_fast ({}) must be greater than yarn_beta_slow ({}), and both positive", who, yarn_beta_fast,
           yarn_beta_slow);
    positive("yarn_original_max_position_embeddings", yarn_original_max_position_embeddings);
  }
  if (!std::isfinite(mscale) || mscale < 0 || !std::isfinite(mscale_all_dim) || mscale_all_dim < 0)
    fail("{}: mscale ({}) and mscale_all_dim ({}) must be finite and not negative", who, mscale, mscale_all_dim);
  if (!std::isfinite(glu_linear_offset)) fail("{}: glu_linear_offset must be a finite number, got {}", who, glu_linear_offset);
  if (!std::isfinite(activation_func_clamp_value) || activation_func_clamp_value < 0)
    fail("{}: activation_func_clamp_value must be positive (or null for no clamp), got {}", who,
         activation_func_clamp_value);
  if (softmax_type != "vanilla" && softmax_type != "off-by-one" && softmax_type != "learnable")
    fail("{}: softmax_type must be vanilla, off-by-one or learnable, got '{}'", who, softmax_type);
  if (window_attn_skip_freq < 0)
    fail("{}: window_attn_skip_freq must be positive (or null), got {}", who, window_attn_skip_freq);
  if (!window_attn_pattern.empty() && int64_t(window_attn_pattern.size()) != num_layers)
    fail("{}: window_attn_skip_freq lists {} layers for num_layers {}", who, window_attn_pattern.size(), num_layers);
  if (no_rope_freq < 0) fail("{}: no_rope_freq must be positive (or null), got {}", who, no_rope_freq);
  if (no_rope_freq == 1)
    fail("{}: no_rope_freq 1 puts every layer on NoPE; a model without rotary embedding is not built (use 2 or more, "
         "or a 0/1 list)",
         who);
  if (!no_rope_pattern.empty() && int64_t(no_rope_pattern.size()) != num_layers)
    fail("{}: no_rope_freq lists {} layers for num_layers {}", who, no_rope_pattern.size(), num_layers);
  if (attention_chunk_size < 0)
    fail("{}: attention_chunk_size must be positive (or null for none), got {}", who, attention_chunk_size);
  if (attn_temperature_tuning && (!std::isfinite(floor_scale) || floor_scale <= 0 || !std::isfinite(attn_scale)))
    fail("{}: floor_scale ({}) must be positive and attn_scale ({}) finite", who, floor_scale, attn_scale);
  if (multi_latent_attention && (no_rope_freq > 0 || !no_rope_pattern.empty() || qk_l2_norm ||
                                 attention_chunk_size > 0 || attn_temperature_tuning))
    fail("{}: no_rope_freq, qk_l2_norm, attention_chunk_size and attn_temperature_tuning are Llama 4's grouped-query "
         "attention options, not multi-latent attention's",
         who);
  if (qk_l2_norm && qk_layernorm)
    fail("{}: qk_layernorm and qk_l2_norm are two norms of the queries and keys; set one", who);
  if (attention_chunk_size > 0 && window_size >= 0)
    fail("{}: attention_chunk_size and window_size are two local attentions; set one", who);
  if (add_bias_linear && multi_latent_attention)
    fail("{}: add_bias_linear with multi-latent attention is not built (gpt-oss's biases are on grouped-query "
         "attention)", who);
  if (add_bias_linear && moe_shared_expert_intermediate_size > 0)
    fail("{}: add_bias_linear with a shared expert (moe_shared_expert_intermediate_size {}) is not built: the shared "
         "expert's linears have no biases yet",
         who, moe_shared_expert_intermediate_size);
  if (multi_latent_attention && (window_size >= 0 || has_attention_sinks()))
    fail("{}: window_size and softmax_type {} are gpt-oss's grouped-query attention options, not multi-latent "
         "attention's",
         who, softmax_type);
  validate_moe();
  if (mtp_num_layers < 0) fail("{}: mtp_num_layers must be 0 (none) or positive, got {}", who, mtp_num_layers);
  if (!std::isfinite(mtp_loss_scaling_factor) || mtp_loss_scaling_factor < 0)
    fail("{}: mtp_loss_scaling_factor must be a finite number, not negative, got {}", who, mtp_loss_scaling_factor);
  for (const auto& [key, cap] : {std::pair{"final_logit_softcapping", final_logit_softcapping},
                                 std::pair{"router_logit_softcapping", router_logit_softcapping}})
    if (!std::isfinite(cap) || cap < 0)
      fail("{}: {} must be a positive number (or null for none), got {}", who, key, cap);
  auto finite_positive = [&](const char* field, double v) {
    if (!std::isfinite(v) || v <= 0) fail("{}: {} must be a positive number, got {}", who, field, v);
  };
  finite_positive("norm_epsilon", norm_epsilon);
  finite_positive("rotary_base", rotary_base);
  finite_positive("init_method_std", init_method_std);
  if (use_rope_scaling) {
    finite_positive("rope_scaling_factor", rope_scaling_factor);
    finite_positive("rope_low_freq_factor", rope_low_freq_factor);
    finite_positive("rope_high_freq_factor", rope_high_freq_factor);
    // Llama 3.1's scaling interpolates between the two wavelength bounds, dividing by their gap.
    if (!(rope_high_freq_factor >= rope_low_freq_factor))
      fail("{}: rope_high_freq_factor ({}) must be at least rope_low_freq_factor ({})", who,
           rope_high_freq_factor, rope_low_freq_factor);
    positive("rope_original_max_position_embeddings", rope_original_max_position_embeddings);
  }
}

std::string ModelSpec::layer_prefix(int64_t layer) const {
  if (layer < num_layers) return fmt::format("decoder.layers.{}.", layer);
  return fmt::format("mtp.layers.{}.transformer_layer.", layer - num_layers);
}

bool ModelSpec::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  layer = layer_kind(layer);
  if (!moe_layer_pattern.empty())
    return layer >= 0 && layer < int64_t(moe_layer_pattern.size()) && moe_layer_pattern[size_t(layer)] != 0;
  return moe_layer_freq > 0 && layer % moe_layer_freq == 0;
}

void ModelSpec::validate_moe() const {
  const std::string& who = name.empty() ? std::string("model spec") : "model '" + name + "'";
  if (num_experts < 0) fail("{}: num_experts must be positive (or null for a dense model), got {}", who, num_experts);
  if (num_experts == 0) return;
  auto one_of = [&](const char* key, const std::string& v, std::initializer_list<const char*> allowed) {
    std::vector<std::string> names(allowed.begin(), allowed.end());
    if (std::find(names.begin(), names.end(), v) == names.end())
      fail("{}: {} '{}' is not one of: {}{}", who, key, v, fmt::join(names, ", "), did_you_mean(v, names));
  };
  one_of("moe_router_score_function", moe_router_score_function, {"softmax", "sigmoid"});
  one_of("moe_router_load_balancing_type", moe_router_load_balancing_type, {"aux_loss", "seq_aux_loss", "none"});
  one_of("moe_token_drop_policy", moe_token_drop_policy, {"probs", "position"});
  one_of("moe_token_dispatcher_type", moe_token_dispatcher_type, {"allgather", "alltoall"});
  if (!moe_router_dtype.empty()) one_of("moe_router_dtype", moe_router_dtype, {"fp32", "fp64"});
  if (moe_ffn_hidden_size < 0) fail("{}: moe_ffn_hidden_size must be positive, got {}", who, moe_ffn_hidden_size);
  if (moe_router_topk < 1) fail("{}: moe_router_topk must be at least 1, got {}", who, moe_router_topk);
  if (moe_router_topk > num_experts)
    fail("{}: moe_router_topk ({}) cannot exceed num_experts ({})", who, moe_router_topk, num_experts);
  if (moe_shared_expert_intermediate_size < 0)
    fail("{}: moe_shared_expert_intermediate_size must be positive (or null), got {}", who,
         moe_shared_expert_intermediate_size);
  if (moe_shared_expert_gate && moe_shared_expert_intermediate_size == 0)
    fail("{}: moe_shared_expert_gate needs a shared expert (moe_shared_expert_intermediate_size)", who);
  if (moe_router_pre_softmax && moe_router_score_function != "softmax")
    fail("{}: moe_router_pre_softmax applies to moe_router_score_function: softmax only", who);
  if (moe_router_enable_expert_bias && moe_router_score_function != "sigmoid" && !moe_router_pre_softmax)
    fail("{}: moe_router_enable_expert_bias adds the bias to the scores the choice ranks: it needs "
         "moe_router_score_function: sigmoid, or softmax with moe_router_pre_softmax: true",
         who);
  if (moe_router_norm_topk_prob && !moe_router_pre_softmax)
    fail("{}: moe_router_norm_topk_prob applies to moe_router_pre_softmax: true only (the other routings' "
         "weights are normalised by their definition)",
         who);
  if (moe_router_num_groups < 0 || moe_router_group_topk < 0)
    fail("{}: moe_router_num_groups and moe_router_group_topk must be positive (or null)", who);
  if ((moe_router_num_groups > 0) != (moe_router_group_topk > 0))
    fail("{}: group-limited routing needs both moe_router_num_groups and moe_router_group_topk", who);
  if (moe_router_group_score != GroupScore::TopkSum && moe_router_num_groups == 0)
    fail("{}: moe_router_group_score {} applies to group-limited routing only (moe_router_num_groups)", who,
         group_score_name(moe_router_group_score));
  if (moe_router_num_groups > 0) {
    if (num_experts % moe_router_num_groups != 0)
      fail("{}: num_experts ({}) must be divisible by moe_router_num_groups ({})", who, num_experts,
           moe_router_num_groups);
    if (moe_router_group_topk > moe_router_num_groups)
      fail("{}: moe_router_group_topk ({}) cannot exceed moe_router_num_groups ({})", who, moe_router_group_topk,
           moe_router_num_groups);
    if (moe_router_topk > moe_router_group_topk * (num_experts / moe_router_num_groups))
      fail("{}: moe_router_topk ({}) exceeds the experts of the {} selected groups ({})", who, moe_router_topk,
           moe_router_group_topk, moe_router_group_topk * (num_experts / moe_router_num_groups));
  }
  auto non_negative = [&](const char* key, double v) {
    if (!std::isfinite(v) || v < 0) fail("{}: {} must be a non-negative number, got {}", who, key, v);
  };
  non_negative("moe_aux_loss_coeff", moe_aux_loss_coeff);
  non_negative("moe_z_loss_coeff", moe_z_loss_coeff);
  non_negative("moe_router_topk_scaling_factor", moe_router_topk_scaling_factor);
  non_negative("moe_router_bias_update_rate", moe_router_bias_update_rate);
  non_negative("moe_expert_capacity_factor", moe_expert_capacity_factor);
  if (moe_expert_capacity_per_sequence && (moe_expert_capacity_factor <= 0 || moe_token_drop_policy != "position"))
    fail("{}: moe_expert_capacity_per_sequence (MaxText's dropping) needs moe_expert_capacity_factor and "
         "moe_token_drop_policy: position",
         who);
  if (moe_layer_pattern.empty()) {
    if (moe_layer_freq < 1) fail("{}: moe_layer_freq must be at least 1, got {}", who, moe_layer_freq);
  } else {
    if (int64_t(moe_layer_pattern.size()) != num_layers)
      fail("{}: moe_layer_freq lists {} layers but num_layers is {}", who, moe_layer_pattern.size(), num_layers);
    for (int64_t v : moe_layer_pattern)
      if (v != 0 && v != 1) fail("{}: moe_layer_freq entries must be 0 (dense) or 1 (MoE), got {}", who, v);
  }
}

bool ModelSpec::layer_uses_rope(int64_t layer) const {
  layer = layer_kind(layer);
  if (!no_rope_pattern.empty()) return no_rope_pattern[size_t(layer)] == 0;
  return no_rope_freq <= 0 || (layer + 1) % no_rope_freq != 0;
}

int64_t ModelSpec::layer_window(int64_t layer) const {
  if (window_size < 0) return -1;
  layer = layer_kind(layer);
  if (!window_attn_pattern.empty()) return window_attn_pattern[size_t(layer)] ? window_size : -1;
  if (window_attn_skip_freq > 0) return (layer + 1) % window_attn_skip_freq != 0 ? window_size : -1;
  return window_size;
}

std::vector<ParamInfo> model_parameter_layout(const ModelSpec& spec) {
  spec.validate();
  const int64_t h = spec.hidden_size, f = spec.ffn_hidden_size, v = spec.vocab_size;
  const int64_t q = spec.q_size(), qkv = spec.qkv_size();
  std::vector<ParamInfo> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool wd) {
    int64_t n = 1;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(n, d, &n))
        fail("model '{}': tensor {} has more than 2^63 elements; check the sizes", spec.name, name);
    out.push_back({std::move(name), std::move(shape), n, wd});
  };
  add("embedding.word_embeddings.weight", {v, h}, true);
  const int64_t H = spec.num_attention_heads;
  // One transformer layer (a decoder layer, or an MTP depth's: ModelSpec::layer_prefix).
  const auto add_layer = [&](int64_t l) {
    const std::string p = spec.layer_prefix(l);
    add(p + "input_layernorm.weight", {h}, false);
    if (spec.multi_latent_attention) {
      // Queries through a low-rank latent (or straight), keys and values through a shared latent
      // plus one decoupled rotary key for all heads (DeepSeek-V2).
      const int64_t qk = spec.qk_head_dim + spec.qk_pos_emb_head_dim;
      if (spec.q_lora_rank > 0) {
        add(p + "self_attention.linear_q_down_proj.weight", {spec.q_lora_rank, h}, true);
        if (spec.qk_layernorm) add(p + "self_attention.q_layernorm.weight", {spec.q_lora_rank}, false);
        add(p + "self_attention.linear_q_up_proj.weight", {H * qk, spec.q_lora_rank}, true);
      } else {
        add(p + "self_attention.linear_q_proj.weight", {H * qk, h}, true);
      }
      add(p + "self_attention.linear_kv_down_proj.weight", {spec.kv_lora_rank + spec.qk_pos_emb_head_dim, h}, true);
      if (spec.qk_layernorm) add(p + "self_attention.kv_layernorm.weight", {spec.kv_lora_rank}, false);
      add(p + "self_attention.linear_kv_up_proj.weight", {H * (spec.qk_head_dim + spec.v_head_dim), spec.kv_lora_rank},
          true);
      add(p + "self_attention.linear_proj.weight", {h, spec.attention_out_size()}, true);
    } else {
      add(p + "self_attention.linear_qkv.weight", {qkv, h}, true);
      if (spec.qkv_bias()) add(p + "self_attention.linear_qkv.bias", {qkv}, false);
      if (spec.qk_layernorm) {  // one weight per head channel, shared by the heads (Qwen3)
        add(p + "self_attention.q_layernorm.weight", {spec.head_dim()}, false);
        add(p + "self_attention.k_layernorm.weight", {spec.head_dim()}, false);
      }
      if (spec.learns_attention_sinks())  // one logit per head (Megatron's softmax_offset)
        add(p + "self_attention.core_attention.softmax_offset", {H}, false);
      add(p + "self_attention.linear_proj.weight", {h, q}, true);
      if (spec.add_bias_linear) add(p + "self_attention.linear_proj.bias", {h}, false);
    }
    add(p + "pre_mlp_layernorm.weight", {h}, false);
    if (!spec.is_moe_layer(l)) {
      add(p + "mlp.linear_fc1.weight", {2 * f, h}, true);  // gate and up, fused
      if (spec.add_bias_linear) add(p + "mlp.linear_fc1.bias", {2 * f}, false);
      add(p + "mlp.linear_fc2.weight", {h, f}, true);
      if (spec.add_bias_linear) add(p + "mlp.linear_fc2.bias", {h}, false);
      return;
    }
    const int64_t E = spec.num_experts, fe = spec.expert_ffn(), fs = spec.moe_shared_expert_intermediate_size;
    add(p + "mlp.router.weight", {E, h}, true);
    if (spec.add_bias_linear) add(p + "mlp.router.bias", {E}, false);
    if (spec.moe_router_enable_expert_bias) {
      add(p + "mlp.router.expert_bias", {E}, false);
      out.back().trainable = false;  // moved by the load-balancing rule, not the optimizer
    }
    for (int64_t e = 0; e < E; ++e) {  // keyed by the global expert index: any EP layout loads them
      const std::string x = p + fmt::format("mlp.experts.local_experts.{}.", e);
      add(x + "linear_fc1.weight", {2 * fe, h}, true);
      out.back().expert = e;
      if (spec.add_bias_linear) {
        add(x + "linear_fc1.bias", {2 * fe}, false);
        out.back().expert = e;
      }
      add(x + "linear_fc2.weight", {h, fe}, true);
      out.back().expert = e;
      if (spec.add_bias_linear) {
        add(x + "linear_fc2.bias", {h}, false);
        out.back().expert = e;
      }
    }
    if (fs > 0) {
      add(p + "mlp.shared_experts.linear_fc1.weight", {2 * fs, h}, true);
      add(p + "mlp.shared_experts.linear_fc2.weight", {h, fs}, true);
      if (spec.moe_shared_expert_gate) add(p + "mlp.shared_experts.gate_weight", {1, h}, true);
    }
  };
  for (int64_t l = 0; l < spec.num_layers; ++l) add_layer(l);
  add("decoder.final_layernorm.weight", {h}, false);
  if (spec.untie_embeddings_and_output_weights) add("output_layer.weight", {v, h}, true);
  for (int64_t k = 0; k < spec.mtp_num_layers; ++k) {  // after the head, as LlamaModel registers them
    const std::string p = fmt::format("mtp.layers.{}.", k);
    add(p + "enorm.weight", {h}, false);
    add(p + "hnorm.weight", {h}, false);
    add(p + "eh_proj.weight", {h, 2 * h}, true);
    add_layer(spec.num_layers + k);
    add(p + "final_layernorm.weight", {h}, false);
  }
  return out;
}

namespace {

// Layer l's attention FLOPs over one causal document of s tokens: attention_core per token (3 s
// heads x (qk width + v width) FLOPs: 2 per multiply-add, s / 2 keys on average, forward and
// backward) times s, less the pairs a sliding window of w leaves unseen, (s - w - 1)(s - w) / 2,
// or that chunks of c (Llama 4's attention_chunk_size) leave unseen: they see
// floor(s / c) c^2 / 2 + r^2 / 2 of the s^2 / 2, r = s mod c.
double layer_attention_flops(const ModelSpec& spec, int64_t l, double s) {
  const double heads = double(spec.num_attention_heads), q = double(spec.q_size());
  const double per_token = spec.multi_latent_attention
                               ? 3.0 * s * heads *
                                     double(spec.qk_head_dim + spec.qk_pos_emb_head_dim + spec.v_head_dim)
                               : 6.0 * s * q;
  const double w = double(spec.layer_window(l)), c = double(spec.layer_attention_chunk(l));
  double unseen = w >= 0 && w + 1 < s ? (s - w - 1) * (s - w) / 2 : 0.0;
  if (c > 0 && c < s) {
    const double r = std::fmod(s, c);
    unseen = s * s / 2 - (std::floor(s / c) * c * c / 2 + r * r / 2);
  }
  return s > 0 ? per_token * s * (1.0 - unseen / (s * s / 2)) : 0.0;
}

}  // namespace

double attention_flops(const ModelSpec& spec, int64_t tokens) {
  double f = 0;
  for (int64_t l = 0; l < spec.num_layers + spec.mtp_num_layers; ++l) f += layer_attention_flops(spec, l, double(tokens));
  return f;
}

ModelStats model_stats(const ModelSpec& spec, int64_t seq_length) {
  spec.validate();
  if (seq_length <= 0) fail("seq_length must be positive, got {}", seq_length);
  if (seq_length > spec.max_position_embeddings)
    fail("seq_length ({}) exceeds max_position_embeddings ({}) of model '{}'", seq_length,
         spec.max_position_embeddings, spec.name);

  const double h = double(spec.hidden_size), f = double(spec.ffn_hidden_size), v = double(spec.vocab_size);
  const double q = double(spec.q_size()), qkv = double(spec.qkv_size()), heads = double(spec.num_attention_heads);
  const double s = double(seq_length);

  ModelStats st;
  // Group the layout into rows: embedding, one per decoder layer, final norm, output layer, one per
  // MTP depth (transformer layer index num_layers + k). A routed expert's tensors count top-k /
  // num_experts towards the active parameters.
  const size_t rows = size_t(spec.num_layers + spec.mtp_num_layers);
  std::vector<int64_t> layer_params(rows, 0), layer_active(rows, 0), layer_experts(rows, 0), layer_buffers(rows, 0);
  int64_t embedding = 0, final_norm = 0, output = 0;
  for (const auto& p : model_parameter_layout(spec)) {
    if (__builtin_add_overflow(st.parameters, p.numel, &st.parameters))
      fail("model '{}' has more than 2^63 parameters; check the sizes", spec.name);
    if (p.name.starts_with("embedding.")) {
      embedding += p.numel;
    } else if (p.name.starts_with("output_layer.")) {
      output += p.numel;
    } else if (p.name.starts_with("decoder.final_layernorm.")) {
      final_norm += p.numel;
    } else {
      const bool mtp = p.name.starts_with("mtp.layers.");
      int64_t l = std::stoll(p.name.substr(std::string(mtp ? "mtp.layers." : "decoder.layers.").size()));
      if (mtp) l += spec.num_layers;
      layer_params[l] += p.numel;
      if (p.expert >= 0) layer_experts[l] += p.numel;
      else layer_active[l] += p.numel;
      if (!p.trainable) layer_buffers[l] += p.numel;
    }
  }
  st.embedding_parameters = embedding + output;
  st.non_embedding_parameters = st.parameters - st.embedding_parameters;

  // Activations saved per token (fp32, no recompute): see docs/model_math.md (and docs/moe.md for
  // MoE and MLA layers).
  double attn_act = qkv + q;
  if (spec.multi_latent_attention) {
    const double hq = heads * double(spec.qk_head_dim + spec.qk_pos_emb_head_dim);
    attn_act = 2 * hq + heads * double(spec.v_head_dim) + double(spec.q_lora_rank + spec.kv_lora_rank) +
               double(spec.qk_pos_emb_head_dim) + heads * double(spec.v_head_dim);
  }
  const double dense_act = 4.0 * (4 * h + 2 + attn_act + heads + 3 * f);
  const double E = double(spec.num_experts), k = double(spec.moe_router_topk);
  const double moe_act = 4.0 * (4 * h + 2 + attn_act + heads + E + k * (2 * h + 3 * double(spec.expert_ffn())) +
                                3 * double(spec.moe_shared_expert_intermediate_size));
  const double final_act = 4.0 * (h + 1);

  st.layers.push_back({"embedding", embedding, 0.0, 0.0, embedding});
  const auto layer_row = [&](int64_t l) -> ModelStats::Layer {
    const bool moe = spec.is_moe_layer(l);
    // Every routed expert has the same size: top-k of num_experts of them run per token.
    const int64_t active = layer_active[l] + (moe ? layer_experts[l] / spec.num_experts * spec.moe_router_topk : 0);
    // 6 FLOPs per weight per token (2 forward, 4 backward) over the weights a token meets, and the
    // attention core's (layer_attention_flops) per token of a sequence.
    const double attn = layer_attention_flops(spec, l, s) / s;
    double flops = 6.0 * double(active - layer_buffers[l]) + attn;
    return {fmt::format("decoder.layers.{}", l), layer_params[l], flops, moe ? moe_act : dense_act, active};
  };
  for (int64_t l = 0; l < spec.num_layers; ++l) st.layers.push_back(layer_row(l));
  st.layers.push_back({"decoder.final_layernorm", final_norm, 6.0 * double(final_norm), final_act, final_norm});
  // The logits matmul runs whether or not the weight is tied to the embedding.
  st.layers.push_back({"output_layer", output, 6.0 * v * h, 0.0, output});
  // An MTP depth: its norms, eh_proj and transformer layer, and its logits through the shared
  // output layer; counted apart from the main model's (mtp_parameters, mtp_flops_per_token).
  for (int64_t k = 0; k < spec.mtp_num_layers; ++k) {
    ModelStats::Layer row = layer_row(spec.num_layers + k);
    row.name = fmt::format("mtp.layers.{}", k);
    row.flops_per_token += 6.0 * v * h;
    row.activation_bytes_per_token += 4.0 * (4 * h + 3) + final_act;  // enorm, hnorm, their concat
    st.mtp_parameters += row.parameters;
    st.mtp_active_parameters += row.active_parameters;
    st.mtp_flops_per_token += row.flops_per_token;
    st.layers.push_back(row);
  }

  for (const auto& l : st.layers) {
    st.active_parameters += l.active_parameters;
    st.flops_per_token += l.flops_per_token;
    st.activation_bytes_per_token += l.activation_bytes_per_token;
  }
  return st;
}

std::vector<std::string> model_spec_keys() {
  std::vector<std::string> keys;
  for (const auto& f : fields()) keys.push_back(f.key);
  return keys;
}

bool model_key_nullable(const std::string& key) {
  for (const auto& f : fields())
    if (key == f.key) return f.nullable;
  return false;
}

void apply_model_keys(ModelSpec& spec, const YAML::Node& node, const std::string& origin) {
  const std::vector<std::string> keys = model_spec_keys();
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    auto f = std::find_if(fields().begin(), fields().end(), [&](const Field& x) { return key == x.key; });
    if (f == fields().end())
      fail("{}: unknown model key '{}'{}", where(origin, it->first.Mark()), key, did_you_mean(key, keys));
    set_field(spec, *f, it->second, where(origin, it->second.Mark()));
  }
}

YAML::Node model_spec_to_yaml(const ModelSpec& spec) {
  YAML::Node out(YAML::NodeType::Map);
  for (const auto& f : fields()) std::visit([&](auto member) { out[f.key] = yaml_value(spec.*member); }, f.member);
  if (!spec.moe_layer_pattern.empty()) {
    YAML::Node l(YAML::NodeType::Sequence);
    for (int64_t v : spec.moe_layer_pattern) l.push_back(v);
    l.SetStyle(YAML::EmitterStyle::Flow);
    out["moe_layer_freq"] = l;
  }
  if (spec.window_size >= 0) {
    YAML::Node w(YAML::NodeType::Sequence);
    w.push_back(spec.window_size);
    w.push_back(0);
    w.SetStyle(YAML::EmitterStyle::Flow);
    out["window_size"] = w;
  } else {
    out["window_size"] = YAML::Node(YAML::NodeType::Null);
  }
  for (const auto& [key, pattern] : {std::pair{"window_attn_skip_freq", &spec.window_attn_pattern},
                                     std::pair{"no_rope_freq", &spec.no_rope_pattern}})
    if (!pattern->empty()) {
      YAML::Node l(YAML::NodeType::Sequence);
      for (int64_t v : *pattern) l.push_back(v);
      l.SetStyle(YAML::EmitterStyle::Flow);
      out[key] = l;
    }
  return out;
}

}  // namespace primus
