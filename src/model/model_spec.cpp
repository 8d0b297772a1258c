// ModelSpec: YAML presets (with `extends:`), validation, and the counting that `analyze model`,
// MFU and the benchmarks share. The conventions are written out in docs/model_math.md.
#include "model/model_spec.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
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

using Member = std::variant<int64_t ModelSpec::*, double ModelSpec::*, bool ModelSpec::*>;

struct Field {
  const char* key;
  Member member;
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
      {"init_method_std", &ModelSpec::init_method_std},
      {"use_rope_scaling", &ModelSpec::use_rope_scaling},
      {"rope_scaling_factor", &ModelSpec::rope_scaling_factor},
      {"rope_low_freq_factor", &ModelSpec::rope_low_freq_factor},
      {"rope_high_freq_factor", &ModelSpec::rope_high_freq_factor},
      {"rope_original_max_position_embeddings", &ModelSpec::rope_original_max_position_embeddings},
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

void set_field(ModelSpec& spec, const Field& f, const YAML::Node& value, const std::string& at) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(spec.*member)>;
        const char* want = std::is_same_v<T, bool>      ? "true or false"
                           : std::is_same_v<T, int64_t> ? "an integer"
                                                        : "a number";
        if (!value.IsScalar())
          fail("{}: '{}' must be {}, got {}", at, f.key, want, scalar_text(value));
        T v{};
        // yaml-cpp's convert<> reports failure through the bool; it checks that the whole
        // scalar was consumed, so "4096.5" is not an integer and "yes please" not a bool.
        if (!YAML::convert<T>::decode(value, v))
          fail("{}: '{}' must be {}, got {}", at, f.key, want, scalar_text(value));
        spec.*member = v;
      },
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
  if (head_dim() % 2 != 0)
    fail("{}: the head dimension ({}: {}) must be even for rotary embeddings", who,
         kv_channels ? "kv_channels" : "hidden_size / num_attention_heads", head_dim());
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
    if (!(rope_high_freq_factor > rope_low_freq_factor))
      fail("{}: rope_high_freq_factor ({}) must be greater than rope_low_freq_factor ({})", who,
           rope_high_freq_factor, rope_low_freq_factor);
    positive("rope_original_max_position_embeddings", rope_original_max_position_embeddings);
  }
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
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    add(p + "input_layernorm.weight", {h}, false);
    add(p + "self_attention.linear_qkv.weight", {qkv, h}, true);
    if (spec.add_qkv_bias) add(p + "self_attention.linear_qkv.bias", {qkv}, false);
    add(p + "self_attention.linear_proj.weight", {h, q}, true);
    add(p + "pre_mlp_layernorm.weight", {h}, false);
    add(p + "mlp.linear_fc1.weight", {2 * f, h}, true);  // gate and up, fused
    add(p + "mlp.linear_fc2.weight", {h, f}, true);
  }
  add("decoder.final_layernorm.weight", {h}, false);
  if (spec.untie_embeddings_and_output_weights) add("output_layer.weight", {v, h}, true);
  return out;
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
  // Group the layout into rows: embedding, one per decoder layer, final norm, output layer.
  std::vector<int64_t> layer_params(spec.num_layers, 0);
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
      int64_t l = std::stoll(p.name.substr(std::string("decoder.layers.").size()));
      layer_params[l] += p.numel;
    }
  }
  st.embedding_parameters = embedding + output;
  st.non_embedding_parameters = st.parameters - st.embedding_parameters;

  // Activations saved per token (fp32, no recompute): see docs/model_math.md for each term.
  const double layer_act = 4.0 * (4 * h + 2 + qkv + q + heads + 3 * f);
  const double final_act = 4.0 * (h + 1);

  st.layers.push_back({"embedding", embedding, 0.0, 0.0});
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    // 6 FLOPs per weight per token (2 forward, 4 backward) plus causal attention's
    // QK^T and PV: 2 * 2 * q_size per visible key, s/2 keys on average, times 3.
    double flops = 6.0 * double(layer_params[l]) + 6.0 * s * q;
    st.layers.push_back({fmt::format("decoder.layers.{}", l), layer_params[l], flops, layer_act});
  }
  st.layers.push_back({"decoder.final_layernorm", final_norm, 6.0 * double(final_norm), final_act});
  // The logits matmul runs whether or not the weight is tied to the embedding.
  st.layers.push_back({"output_layer", output, 6.0 * v * h, 0.0});

  for (const auto& l : st.layers) {
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
  for (const auto& f : fields()) std::visit([&](auto member) { out[f.key] = spec.*member; }, f.member);
  return out;
}

}  // namespace primus
