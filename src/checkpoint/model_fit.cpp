#include "checkpoint/model_fit.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/format.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace primus::checkpoint {
namespace {

// What a field of the model description changes about the weights.
enum class Changes {
  Tensors,  // their set or shapes: a checkpoint of the other value cannot be loaded as it is
  Meaning,  // the function the same tensors compute (rotary positions, routing, normalization)
};

struct ModelField {
  const char* key;  // the config key (Megatron's name)
  Changes changes;
  bool (*applies)(const ModelSpec&);  // compared when it applies to both models
  std::string (*value)(const ModelSpec&);
};

std::string text(int64_t v) { return std::to_string(v); }
std::string text(double v) { return fmt::format("{}", v); }
std::string text(bool v) { return v ? "true" : "false"; }
std::string text(const std::string& v) { return v.empty() ? "null" : v; }
std::string or_null(int64_t v) { return v > 0 ? std::to_string(v) : "null"; }

bool always(const ModelSpec&) { return true; }
bool mla(const ModelSpec& s) { return s.multi_latent_attention; }
bool not_mla(const ModelSpec& s) { return !s.multi_latent_attention; }
bool moe(const ModelSpec& s) { return s.is_moe(); }
bool grouped_routing(const ModelSpec& s) { return s.is_moe() && s.moe_router_num_groups > 0; }
// Where the group score's rule matters: topk_sum sums more than a group's largest score.
bool group_rule_matters(const ModelSpec& s) { return grouped_routing(s) && s.topk_sum_terms() > 1; }
bool shared_expert(const ModelSpec& s) { return s.is_moe() && s.moe_shared_expert_intermediate_size > 0; }
bool rope_scaled(const ModelSpec& s) { return s.use_rope_scaling; }
bool yarn(const ModelSpec& s) { return s.multi_latent_attention && s.rotary_scaling_factor > 1; }
bool gqa_yarn(const ModelSpec& s) { return !s.multi_latent_attention && s.position_embedding_type == "yarn"; }
bool any_yarn(const ModelSpec& s) { return yarn(s) || gqa_yarn(s); }
bool has_dense_layer(const ModelSpec& s) {
  for (int64_t l = 0; l < s.num_layers; ++l)
    if (!s.is_moe_layer(l)) return true;
  return false;
}
// moe_layer_freq as the layers it makes MoE: the integer and the list forms compare equal when
// they describe the same layers.
std::string moe_layers(const ModelSpec& s) {
  std::vector<int> l;
  for (int64_t i = 0; i < s.num_layers; ++i) l.push_back(s.is_moe_layer(i) ? 1 : 0);
  return fmt::format("[{}]", fmt::join(l, ", "));
}
// window_size and window_attn_skip_freq as each layer's window (-1: full attention): the forms
// compare equal when they give the layers the same windows.
std::string layer_windows(const ModelSpec& s) {
  std::vector<int64_t> l;
  for (int64_t i = 0; i < s.num_layers; ++i) l.push_back(s.layer_window(i));
  return fmt::format("[{}]", fmt::join(l, ", "));
}

// no_rope_freq as each layer's rotary embedding (1: NoPE): the forms compare equal when they put
// the same layers on NoPE.
std::string nope_layers(const ModelSpec& s) {
  std::vector<int> l;
  for (int64_t i = 0; i < s.num_layers; ++i) l.push_back(s.layer_uses_rope(i) ? 0 : 1);
  return fmt::format("[{}]", fmt::join(l, ", "));
}
bool temperature(const ModelSpec& s) { return s.attn_temperature_tuning; }

#define AS_IS(field) [](const ModelSpec& s) { return text(s.field); }
#define OR_NULL(field) [](const ModelSpec& s) { return or_null(s.field); }

// Every field of ModelSpec that changes the set, shape or meaning of the weights. The other keys
// (model_keys_free_to_change below) change how the model trains, not what its weights are; a test
// checks that every model key is in one of the two lists.
const std::vector<ModelField>& fields() {
  static const std::vector<ModelField> f = {
      {"num_layers", Changes::Tensors, always, AS_IS(num_layers)},
      {"hidden_size", Changes::Tensors, always, AS_IS(hidden_size)},
      {"ffn_hidden_size", Changes::Tensors, has_dense_layer, AS_IS(ffn_hidden_size)},
      {"num_attention_heads", Changes::Tensors, always, AS_IS(num_attention_heads)},
      {"num_query_groups", Changes::Tensors, not_mla, [](const ModelSpec& s) { return text(s.query_groups()); }},
      {"kv_channels", Changes::Tensors, not_mla, [](const ModelSpec& s) { return text(s.head_dim()); }},
      {"add_qkv_bias", Changes::Tensors, not_mla, AS_IS(add_qkv_bias)},
      {"add_bias_linear", Changes::Tensors, always, AS_IS(add_bias_linear)},
      {"softmax_type", Changes::Tensors, not_mla, AS_IS(softmax_type)},  // learnable: the sinks' tensors
      {"qk_layernorm", Changes::Tensors, always, AS_IS(qk_layernorm)},
      {"multi_latent_attention", Changes::Tensors, always, AS_IS(multi_latent_attention)},
      {"q_lora_rank", Changes::Tensors, mla, OR_NULL(q_lora_rank)},
      {"kv_lora_rank", Changes::Tensors, mla, AS_IS(kv_lora_rank)},
      {"qk_head_dim", Changes::Tensors, mla, AS_IS(qk_head_dim)},
      {"qk_pos_emb_head_dim", Changes::Tensors, mla, AS_IS(qk_pos_emb_head_dim)},
      {"v_head_dim", Changes::Tensors, mla, AS_IS(v_head_dim)},
      {"mtp_num_layers", Changes::Tensors, always, AS_IS(mtp_num_layers)},  // the MTP depths' tensors
      {"vocab_size", Changes::Tensors, always, AS_IS(vocab_size)},
      {"untie_embeddings_and_output_weights", Changes::Tensors, always, AS_IS(untie_embeddings_and_output_weights)},
      {"num_experts", Changes::Tensors, always, OR_NULL(num_experts)},
      {"moe_layer_freq", Changes::Tensors, moe, moe_layers},
      {"moe_ffn_hidden_size", Changes::Tensors, moe, [](const ModelSpec& s) { return text(s.expert_ffn()); }},
      {"moe_shared_expert_intermediate_size", Changes::Tensors, moe, OR_NULL(moe_shared_expert_intermediate_size)},
      {"moe_shared_expert_gate", Changes::Tensors, shared_expert, AS_IS(moe_shared_expert_gate)},
      {"moe_router_enable_expert_bias", Changes::Tensors, moe, AS_IS(moe_router_enable_expert_bias)},
      {"norm_epsilon", Changes::Meaning, always, AS_IS(norm_epsilon)},
      {"final_logit_softcapping", Changes::Meaning, always, AS_IS(final_logit_softcapping)},
      {"router_logit_softcapping", Changes::Meaning, moe, AS_IS(router_logit_softcapping)},
      {"window_size", Changes::Meaning, not_mla, layer_windows},
      {"quick_geglu", Changes::Meaning, always, AS_IS(quick_geglu)},
      {"glu_linear_offset", Changes::Meaning, always, AS_IS(glu_linear_offset)},
      {"activation_func_clamp_value", Changes::Meaning, always, AS_IS(activation_func_clamp_value)},
      {"window_attn_skip_freq", Changes::Meaning, not_mla, layer_windows},
      {"rotary_base", Changes::Meaning, always, AS_IS(rotary_base)},
      {"rotary_percent", Changes::Meaning, not_mla, AS_IS(rotary_percent)},
      {"no_rope_freq", Changes::Meaning, not_mla, nope_layers},
      {"qk_l2_norm", Changes::Meaning, not_mla, AS_IS(qk_l2_norm)},
      {"attention_chunk_size", Changes::Meaning, not_mla, OR_NULL(attention_chunk_size)},
      {"attn_temperature_tuning", Changes::Meaning, not_mla, AS_IS(attn_temperature_tuning)},
      {"floor_scale", Changes::Meaning, temperature, AS_IS(floor_scale)},
      {"attn_scale", Changes::Meaning, temperature, AS_IS(attn_scale)},
      {"use_rope_scaling", Changes::Meaning, always, AS_IS(use_rope_scaling)},
      {"rope_scaling_factor", Changes::Meaning, rope_scaled, AS_IS(rope_scaling_factor)},
      {"rope_low_freq_factor", Changes::Meaning, rope_scaled, AS_IS(rope_low_freq_factor)},
      {"rope_high_freq_factor", Changes::Meaning, rope_scaled, AS_IS(rope_high_freq_factor)},
      {"rope_original_max_position_embeddings", Changes::Meaning, rope_scaled,
       AS_IS(rope_original_max_position_embeddings)},
      {"rotary_scaling_factor", Changes::Meaning, [](const ModelSpec& s) { return mla(s) || gqa_yarn(s); },
       AS_IS(rotary_scaling_factor)},
      {"mscale", Changes::Meaning, any_yarn, AS_IS(mscale)},
      {"mscale_all_dim", Changes::Meaning, any_yarn, AS_IS(mscale_all_dim)},
      {"position_embedding_type", Changes::Meaning, not_mla, AS_IS(position_embedding_type)},
      {"yarn_beta_fast", Changes::Meaning, gqa_yarn, AS_IS(yarn_beta_fast)},
      {"yarn_beta_slow", Changes::Meaning, gqa_yarn, AS_IS(yarn_beta_slow)},
      {"yarn_original_max_position_embeddings", Changes::Meaning, gqa_yarn,
       AS_IS(yarn_original_max_position_embeddings)},
      {"yarn_correction_range_round_to_int", Changes::Meaning, gqa_yarn, AS_IS(yarn_correction_range_round_to_int)},
      {"beta_fast", Changes::Meaning, yarn, AS_IS(beta_fast)},
      {"beta_slow", Changes::Meaning, yarn, AS_IS(beta_slow)},
      {"original_max_position_embeddings", Changes::Meaning, yarn, AS_IS(original_max_position_embeddings)},
      {"moe_router_topk", Changes::Meaning, moe, AS_IS(moe_router_topk)},
      {"moe_apply_probs_on_input", Changes::Meaning, moe, AS_IS(moe_apply_probs_on_input)},
      {"moe_router_score_function", Changes::Meaning, moe, AS_IS(moe_router_score_function)},
      {"moe_router_pre_softmax", Changes::Meaning, moe, AS_IS(moe_router_pre_softmax)},
      {"moe_router_norm_topk_prob", Changes::Meaning, moe, AS_IS(moe_router_norm_topk_prob)},
      {"moe_router_topk_scaling_factor", Changes::Meaning, moe, AS_IS(moe_router_topk_scaling_factor)},
      {"moe_router_num_groups", Changes::Meaning, moe, OR_NULL(moe_router_num_groups)},
      {"moe_router_group_topk", Changes::Meaning, grouped_routing, OR_NULL(moe_router_group_topk)},
      {"moe_router_group_score", Changes::Meaning, group_rule_matters,
       [](const ModelSpec& s) { return std::string(group_score_name(s.moe_router_group_score)); }},
  };
  return f;
}

#undef AS_IS
#undef OR_NULL

struct Difference {
  const ModelField* field;
  std::string saved, wanted;
};

std::vector<Difference> field_differences(const ModelSpec& saved, const ModelSpec& wanted) {
  std::vector<Difference> out;
  for (const ModelField& f : fields()) {
    if (!f.applies(saved) || !f.applies(wanted)) continue;
    std::string a = f.value(saved), b = f.value(wanted);
    if (a != b) out.push_back({&f, std::move(a), std::move(b)});
  }
  return out;
}

// The tensors of the checkpoint's index against those of the model's layout.
struct TensorDiff {
  std::vector<std::string> dropped, fresh;
};

TensorDiff tensor_differences(const std::string& dir, const ModelSpec& spec, const FitOptions& options,
                              bool& extra_fresh) {
  std::map<std::string, Shape> saved;
  for (const auto& [name, st] : parse_index(dir, read_meta(dir))) saved[name] = st.global;
  TensorDiff d;
  std::map<std::string, Shape> model;
  for (const ParamInfo& p : model_parameter_layout(spec)) model[p.name] = p.shape;
  // The extra tensors (LoRA adapters): a Weights load of a checkpoint without any of them starts
  // them from their initial values.
  extra_fresh = options.purpose == LoadPurpose::Weights && !options.extra.empty() &&
                std::none_of(options.extra.begin(), options.extra.end(),
                             [&](const auto& e) { return saved.count(e.first) > 0; });
  if (!extra_fresh)
    for (const auto& [name, shape] : options.extra) model[name] = shape;
  for (const auto& [name, shape] : model) {
    auto it = saved.find(name);
    if (it == saved.end())
      d.fresh.push_back(name);
    else if (it->second != shape)
      d.fresh.push_back(fmt::format("{} ({} here)", name, shape_str(shape)));
  }
  for (const auto& [name, shape] : saved) {
    auto it = model.find(name);
    if (it == model.end())
      d.dropped.push_back(name);
    else if (it->second != shape)
      d.dropped.push_back(fmt::format("{} ({} there)", name, shape_str(shape)));
  }
  return d;
}

std::string some(const std::vector<std::string>& names, size_t shown = 4) {
  std::vector<std::string> head(names.begin(), names.begin() + std::min(shown, names.size()));
  std::string s = fmt::format("{}", fmt::join(head, ", "));
  if (names.size() > shown) s += fmt::format(" and {} more", names.size() - shown);
  return s;
}

// The refusal: what differs, what a load would do, and the ways to go on on purpose.
std::string refusal(const std::string& dir, const std::vector<Difference>& diffs, const TensorDiff& t,
                    LoadPurpose purpose) {
  std::string msg;
  if (purpose == LoadPurpose::Read) {
    msg = fmt::format("checkpoint {} does not hold the model its own config.yaml describes (saved by another "
                      "version, or altered)",
                      dir);
  } else {
    std::vector<std::string> parts;
    for (const Difference& d : diffs)
      parts.push_back(fmt::format("{} is {} there and {} in this run's config", d.field->key, d.saved, d.wanted));
    msg = diffs.empty() ? fmt::format("checkpoint {} holds other tensors than this run's model", dir)
                        : fmt::format("checkpoint {} was saved from another model: {}", dir, fmt::join(parts, "; "));
  }
  if (!t.dropped.empty())
    msg += fmt::format(". The model has no place for {} of its tensors: {}", t.dropped.size(), some(t.dropped));
  if (!t.fresh.empty())
    msg += fmt::format(". It has no match for {} tensors of the model: {}", t.fresh.size(), some(t.fresh));
  if (t.dropped.empty() && t.fresh.empty())
    msg += ". The tensors are the same, but they would compute another function";
  if (purpose == LoadPurpose::Read) return msg;

  std::vector<std::string> ways;
  if (!diffs.empty()) {
    std::vector<std::string> back;
    for (const Difference& d : diffs) back.push_back(fmt::format("{} back to {}", d.field->key, d.saved));
    ways.push_back(fmt::format("set {} (the checkpoint's)", fmt::join(back, " and ")));
  }
  if (purpose == LoadPurpose::Resume && t.dropped.empty() && t.fresh.empty())
    ways.push_back(fmt::format("`--finetune true --load {}` to start a new run from these weights (iteration 0, a "
                               "fresh optimizer)",
                               dir));
  ways.push_back("`--load_strict false` to load what matches and go on (the log lists every tensor it drops and "
                 "every one that starts from its initial values)");
  return msg + fmt::format(". To go on on purpose: {}", fmt::join(ways, "; or "));
}

}  // namespace

YAML::Node trainer_module(const YAML::Node& config) {
  if (!config.IsMap() || !config["modules"] || !config["modules"].IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  for (const char* name : {"pre_trainer", "post_trainer"})
    if (config["modules"][name]) return config["modules"][name];
  return YAML::Node(YAML::NodeType::Undefined);
}

ModelSpec read_checkpoint_model(const std::string& dir) {
  const std::string origin = dir + "/config.yaml";
  YAML::Node node;
  try {
    const YAML::Node module = trainer_module(YAML::Load(read_checkpoint_config(dir)));
    if (module.IsMap()) node = module["model_spec"];
  } catch (const YAML::Exception& e) {
    fail("{} is not valid YAML: {}", origin, e.what());
  }
  if (!node || !node.IsMap()) fail("{} has no modules.pre_trainer.model_spec (nor post_trainer's)", origin);
  ModelSpec spec = model_spec_from_yaml(node, origin);
  spec.validate();
  return spec;
}

ModelFit check_model_fit(const std::string& dir, const ModelSpec& spec, const FitOptions& options) {
  const std::vector<Difference> diffs = field_differences(read_checkpoint_model(dir), spec);
  bool extra_fresh = false;
  const TensorDiff t = tensor_differences(dir, spec, options, extra_fresh);
  bool refused = !t.dropped.empty() || !t.fresh.empty();
  for (const Difference& d : diffs)
    if (d.field->changes == Changes::Tensors || options.purpose != LoadPurpose::Weights) refused = true;
  if (refused && options.strict) throw Error(refusal(dir, diffs, t, options.purpose));
  ModelFit fit;
  for (const Difference& d : diffs)
    fit.differences.push_back(fmt::format("{}: {} in the checkpoint, {} in this run", d.field->key, d.saved, d.wanted));
  fit.dropped = t.dropped;
  fit.fresh = t.fresh;
  fit.extra_fresh = extra_fresh;
  return fit;
}

std::string ModelFit::summary(const std::string& dir) const {
  std::string s = fmt::format("checkpoint {} differs from this run's model", dir);
  if (!differences.empty()) s += fmt::format(" in {}", fmt::join(differences, "; "));
  if (!dropped.empty())
    s += fmt::format(". Dropped ({} checkpoint tensors this model has no place for): {}", dropped.size(),
                     fmt::join(dropped, ", "));
  if (!fresh.empty())
    s += fmt::format(". Starting from their initial values ({} tensors the checkpoint lacks): {}", fresh.size(),
                     fmt::join(fresh, ", "));
  return s;
}

void fail_nothing_to_resume(const std::string& save_dir,
                            const std::vector<std::pair<std::string, std::string>>& skipped) {
  PRIMUS_CHECK(!skipped.empty(), "fail_nothing_to_resume without a checkpoint");
  // Each reason once: checkpoints refused for the same reason (their own folder aside) go together.
  struct Group {
    std::vector<std::string> names;
    std::string key, reason;
  };
  std::vector<Group> groups;
  for (const auto& [dir, why] : skipped) {
    std::string key;  // the reason with the checkpoint's own folder left out
    size_t from = 0;
    for (size_t at = why.find(dir); !dir.empty() && at != std::string::npos; at = why.find(dir, from)) {
      key += why.substr(from, at - from) + "*";
      from = at + dir.size();
    }
    key += why.substr(from);
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.key == key; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{{}, key, why});
    g->names.push_back(fs::path(dir).filename().string());
  }
  std::vector<std::string> parts;
  for (const Group& g : groups) parts.push_back(fmt::format("{}: {}", fmt::join(g.names, ", "), g.reason));
  fail("{} in {} can be resumed by this run. {}.\nThis run does not start over beside {}. To start a new run "
       "instead, give it another save folder (`save`, or another `exp_name`)",
       skipped.size() == 1 ? "no checkpoint" : fmt::format("none of the {} checkpoints", skipped.size()), save_dir,
       fmt::join(parts, ".\n"), skipped.size() == 1 ? "it" : "them");
}

std::vector<std::string> model_keys_compared() {
  std::vector<std::string> out;
  for (const ModelField& f : fields()) out.push_back(f.key);
  return out;
}

std::vector<std::string> model_keys_free_to_change() {
  // How the model trains, not what its weights are: position limit, initialization, the MTP loss's
  // weight, the router's arithmetic precision, load balancing, its losses, capacity and dispatch.
  return {"max_position_embeddings",
          "init_method_std",
          "mtp_loss_scaling_factor",
          "moe_router_dtype",
          "moe_router_load_balancing_type",
          "moe_aux_loss_coeff",
          "moe_z_loss_coeff",
          "moe_router_bias_update_rate",
          "moe_router_bias_update_centered",
          "moe_expert_capacity_factor",
          "moe_token_drop_policy",
          "moe_expert_capacity_per_sequence",
          "moe_pad_expert_input_to_capacity",
          "moe_router_force_load_balancing",
          "moe_token_dispatcher_type"};
}

}  // namespace primus::checkpoint
