#include "hf/hf_families.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace primus::hf {

using json = nlohmann::json;

namespace {

bool has(const json& c, const char* key) { return c.contains(key) && !c[key].is_null(); }

template <typename T>
T need(const json& c, const char* key, const std::string& where) {
  if (!has(c, key)) fail("{}: '{}' is missing", where, key);
  try {
    return c[key].get<T>();
  } catch (const json::exception&) {
    fail("{}: '{}' has the wrong type: {}", where, key, c[key].dump());
  }
}

template <typename T>
T value_or(const json& c, const char* key, T fallback, const std::string& where) {
  return has(c, key) ? need<T>(c, key, where) : fallback;
}

bool is_deepseek(Family f) { return f == Family::DeepseekV2 || f == Family::DeepseekV3; }
bool is_qwen_moe(Family f) { return f == Family::Qwen2Moe || f == Family::Qwen3Moe; }
bool is_moe_family(Family f) {
  return f == Family::Mixtral || is_qwen_moe(f) || is_deepseek(f) || f == Family::GptOss || f == Family::Llama4;
}

// The MoE layers as our spec holds them: every layer (moe_layer_freq 1), else the 0/1 list.
void set_moe_layers(ModelSpec& s, const std::vector<int64_t>& sparse) {
  if (std::all_of(sparse.begin(), sparse.end(), [](int64_t v) { return v == 1; })) {
    s.moe_layer_freq = 1;
    s.moe_layer_pattern.clear();
  } else {
    s.moe_layer_pattern = sparse;
  }
}

// HF's load-balancing loss (load_balancing_loss_func, Mixtral and Qwen-MoE) is E * sum_i f_i P_i
// with f_i the fraction of tokens that chose expert i (the top-k slots of a token sum to k);
// Megatron's divides the counts by k: the same loss has a coefficient k times HF's. HF adds it
// only with output_router_logits.
void read_hf_aux_loss(const json& c, const std::string& where, ModelSpec& s) {
  if (value_or<double>(c, "router_jitter_noise", 0.0, where) != 0.0)
    fail("{}: router_jitter_noise {} is not supported (this router adds no noise)", where,
         c["router_jitter_noise"].dump());
  const bool on = value_or<bool>(c, "output_router_logits", false, where);
  s.moe_aux_loss_coeff = on ? value_or<double>(c, "router_aux_loss_coef", 0.001, where) * double(s.moe_router_topk)
                            : 0.0;
}

void write_hf_aux_loss(const ModelSpec& s, json& c) {
  const bool on = s.moe_aux_loss_coeff > 0 && s.moe_router_load_balancing_type == "aux_loss";
  c["output_router_logits"] = on;
  c["router_aux_loss_coef"] = on ? s.moe_aux_loss_coeff / double(s.moe_router_topk) : 0.001;
}

void read_mixtral(const json& c, const std::string& where, ModelSpec& s) {
  s.num_experts = need<int64_t>(c, "num_local_experts", where);
  s.moe_router_topk = need<int64_t>(c, "num_experts_per_tok", where);
  s.moe_router_pre_softmax = false;  // the softmax over the chosen logits: Mixtral's renormalised top-k
  read_hf_aux_loss(c, where, s);
}

void read_qwen_moe(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  s.num_experts = need<int64_t>(c, "num_experts", where);
  s.moe_router_topk = need<int64_t>(c, "num_experts_per_tok", where);
  s.moe_ffn_hidden_size = need<int64_t>(c, "moe_intermediate_size", where);
  s.moe_router_pre_softmax = true;  // softmax over all experts, then the top-k
  s.moe_router_norm_topk_prob = value_or<bool>(c, "norm_topk_prob", a.family == Family::Qwen3Moe, where);
  const int64_t step = value_or<int64_t>(c, "decoder_sparse_step", 1, where);
  if (step < 1) fail("{}: decoder_sparse_step must be at least 1, got {}", where, step);
  std::vector<int64_t> dense = value_or<std::vector<int64_t>>(c, "mlp_only_layers", {}, where);
  std::vector<int64_t> sparse(size_t(s.num_layers), 0);
  for (int64_t l = 0; l < s.num_layers; ++l)
    sparse[size_t(l)] = std::find(dense.begin(), dense.end(), l) == dense.end() && (l + 1) % step == 0;
  set_moe_layers(s, sparse);
  if (a.family == Family::Qwen2Moe) {
    s.moe_shared_expert_intermediate_size = need<int64_t>(c, "shared_expert_intermediate_size", where);
    if (s.moe_shared_expert_intermediate_size <= 0)
      fail("{}: shared_expert_intermediate_size must be positive, got {}", where,
           s.moe_shared_expert_intermediate_size);
    s.moe_shared_expert_gate = true;  // sigmoid(shared_expert_gate(x)) * shared_expert(x)
  }
  read_hf_aux_loss(c, where, s);
}

void read_yarn(const json& c, const std::string& where, ModelSpec& s) {
  if (!has(c, "rope_scaling")) return;
  const json& r = c["rope_scaling"];
  const std::string w = where + " rope_scaling";
  const std::string type = r.value("rope_type", r.value("type", ""));
  if (type == "default") return;
  if (type != "yarn") fail("{}: rope_scaling type '{}' is not supported (yarn only)", where, type);
  s.rotary_scaling_factor = need<double>(r, "factor", w);
  s.original_max_position_embeddings = need<int64_t>(r, "original_max_position_embeddings", w);
  s.beta_fast = value_or<double>(r, "beta_fast", 32.0, w);
  s.beta_slow = value_or<double>(r, "beta_slow", 1.0, w);
  s.mscale = value_or<double>(r, "mscale", 1.0, w);
  s.mscale_all_dim = value_or<double>(r, "mscale_all_dim", 0.0, w);
}

// DeepSeek's router (modeling_deepseek's MoEGate) in Megatron's keys.
void read_deepseek_router(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  const std::string scoring = value_or<std::string>(c, "scoring_func", "softmax", where);
  const std::string method = value_or<std::string>(c, "topk_method",
                                                   a.family == Family::DeepseekV3 ? "noaux_tc" : "greedy", where);
  const bool norm = value_or<bool>(c, "norm_topk_prob", false, where);
  const double scale = value_or<double>(c, "routed_scaling_factor", 1.0, where);
  const int64_t groups = value_or<int64_t>(c, "n_group", 1, where),
                group_topk = value_or<int64_t>(c, "topk_group", 1, where);
  if (scoring != "softmax" && scoring != "sigmoid")
    fail("{}: scoring_func '{}' is not supported (softmax, sigmoid)", where, scoring);
  if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
    fail("{}: topk_method '{}' is not supported (greedy, group_limited_greedy, noaux_tc)", where, method);
  if (a.family == Family::DeepseekV3 && method != "noaux_tc")  // transformers' DeepSeek-V3 router knows no other
    fail("{}: topk_method '{}' is not supported for DeepseekV3ForCausalLM: its router is noaux_tc (each group ranked "
         "by the sum of its top 2 biased scores)",
         where, method);
  s.moe_router_score_function = scoring;
  s.moe_router_pre_softmax = scoring == "softmax";
  if (scoring == "sigmoid" && !norm && s.moe_router_topk > 1)
    fail("{}: scoring_func sigmoid with norm_topk_prob false is not supported (this router divides sigmoid scores "
         "by their sum)",
         where);
  s.moe_router_norm_topk_prob = scoring == "softmax" && norm && s.moe_router_topk > 1;
  // V2 scales the weights only when it does not normalise them; V3 always.
  const bool scaled = a.family == Family::DeepseekV3 || !s.moe_router_norm_topk_prob;
  s.moe_router_topk_scaling_factor = scaled && scale != 1.0 ? scale : 0.0;
  s.moe_router_enable_expert_bias = method == "noaux_tc";
  if (method != "greedy" && groups > 1) {
    // A group's score: group_limited_greedy's is its largest (max), noaux_tc's the sum of its top 2
    // (topk_sum, which sums the top num_experts_per_tok / topk_group).
    s.moe_router_num_groups = groups;
    s.moe_router_group_topk = group_topk;
    s.moe_router_group_score = method == "noaux_tc" ? GroupScore::TopkSum : GroupScore::Max;
    if (method == "noaux_tc" && s.group_score_terms() != 2)
      fail("{}: topk_method noaux_tc with num_experts_per_tok {} and topk_group {} is not supported: it ranks a group "
           "by the sum of its top 2 scores, this router (moe_router_group_score topk_sum) by the sum of its top {}",
           where, s.moe_router_topk, group_topk, s.group_score_terms());
  }
  s.moe_aux_loss_coeff = value_or<double>(c, "aux_loss_alpha", 0.0, where);
  s.moe_router_load_balancing_type = value_or<bool>(c, "seq_aux", false, where) ? "seq_aux_loss" : "aux_loss";
}

void read_deepseek(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  s.multi_latent_attention = true;
  s.qk_layernorm = true;  // q_a_layernorm and kv_a_layernorm
  s.kv_channels = 0;      // transformers' DeepseekV3Config sets head_dim to qk_rope_head_dim: not a head width here
  s.q_lora_rank = value_or<int64_t>(c, "q_lora_rank", 0, where);
  s.kv_lora_rank = need<int64_t>(c, "kv_lora_rank", where);
  s.qk_head_dim = need<int64_t>(c, "qk_nope_head_dim", where);
  s.qk_pos_emb_head_dim = need<int64_t>(c, "qk_rope_head_dim", where);
  s.v_head_dim = need<int64_t>(c, "v_head_dim", where);
  if (s.qk_pos_emb_head_dim % 2 != 0) fail("{}: qk_rope_head_dim must be even, got {}", where, s.qk_pos_emb_head_dim);
  read_yarn(c, where, s);
  if (!has(c, "n_routed_experts")) return;  // a dense model
  s.num_experts = need<int64_t>(c, "n_routed_experts", where);
  s.moe_router_topk = need<int64_t>(c, "num_experts_per_tok", where);
  s.moe_ffn_hidden_size = need<int64_t>(c, "moe_intermediate_size", where);
  s.moe_shared_expert_intermediate_size = value_or<int64_t>(c, "n_shared_experts", 0, where) * s.moe_ffn_hidden_size;
  const int64_t first = value_or<int64_t>(c, "first_k_dense_replace", 0, where);
  const int64_t freq = value_or<int64_t>(c, "moe_layer_freq", 1, where);
  if (freq < 1) fail("{}: moe_layer_freq must be at least 1, got {}", where, freq);
  std::vector<int64_t> sparse(size_t(s.num_layers), 0);
  for (int64_t l = 0; l < s.num_layers; ++l) sparse[size_t(l)] = l >= first && l % freq == 0;
  set_moe_layers(s, sparse);
  read_deepseek_router(c, a, where, s);
}

// DeepSeek-V3's multi-token prediction: num_nextn_predict_layers depths, stored after the main
// layers as model.layers.<num_hidden_layers + k>.* (DeepSeek's README_WEIGHTS.md). HF's kind of that
// layer follows first_k_dense_replace / moe_layer_freq at its own index (vLLM's DeepseekV2DecoderLayer
// builds it by that index); ours is the last decoder layer's (Megatron's mirror_last): they must agree.
void read_deepseek_mtp(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  const int64_t depths = value_or<int64_t>(c, "num_nextn_predict_layers", 0, where);
  if (depths < 0) fail("{}: num_nextn_predict_layers must be 0 or positive, got {}", where, depths);
  if (depths > 0 && a.family != Family::DeepseekV3)
    fail("{}: num_nextn_predict_layers {} (multi-token prediction) is read for DeepseekV3ForCausalLM only, not {}",
         where, depths, a.name);
  if (depths > 1024) fail("{}: num_nextn_predict_layers {} is out of range (0 to 1024)", where, depths);
  s.mtp_num_layers = depths;
  if (depths == 0 || !has(c, "n_routed_experts")) return;
  const int64_t first = value_or<int64_t>(c, "first_k_dense_replace", 0, where);
  const int64_t freq = value_or<int64_t>(c, "moe_layer_freq", 1, where);
  for (int64_t l = s.num_layers; l < s.num_layers + depths; ++l) {
    const bool theirs = l >= first && l % freq == 0;
    if (theirs != s.is_moe_layer(l))
      fail("{}: the multi-token-prediction layer model.layers.{} is {} by first_k_dense_replace {} and moe_layer_freq "
           "{}, but this engine's MTP layer has the last decoder layer's kind ({})",
           where, l, theirs ? "MoE" : "dense", first, freq, theirs ? "dense" : "MoE");
  }
}

// gpt-oss (modeling_gpt_oss): every linear with a bias, learned sinks, the clamped GLU, windows by
// layer_types, YaRN with HF's default attention factor (mscale 1, mscale_all_dim 0 here).
void read_gpt_oss(const json& c, const std::string& where, ModelSpec& s) {
  if (!value_or<bool>(c, "attention_bias", true, where))
    fail("{}: attention_bias false is not supported for gpt-oss (every linear has a bias here)", where);
  s.add_bias_linear = true;
  s.softmax_type = "learnable";
  s.quick_geglu = true;
  s.glu_linear_offset = 1.0;
  s.activation_func_clamp_value = value_or<double>(c, "swiglu_limit", 7.0, where);
  s.num_experts = need<int64_t>(c, "num_local_experts", where);
  s.moe_router_topk = need<int64_t>(c, "num_experts_per_tok", where);
  s.moe_router_pre_softmax = false;  // softmax over the chosen logits
  read_hf_aux_loss(c, where, s);
  std::vector<std::string> types;
  if (has(c, "layer_types"))
    types = need<std::vector<std::string>>(c, "layer_types", where);
  else
    for (int64_t l = 0; l < s.num_layers; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  if (int64_t(types.size()) != s.num_layers)
    fail("{}: layer_types lists {} layers, num_hidden_layers is {}", where, types.size(), s.num_layers);
  std::vector<int64_t> pattern;
  for (const std::string& t : types) {
    if (t != "sliding_attention" && t != "full_attention")
      fail("{}: layer_types entry '{}' is not supported (sliding_attention, full_attention)", where, t);
    pattern.push_back(t == "sliding_attention");
  }
  if (std::count(pattern.begin(), pattern.end(), 1) > 0) {
    const int64_t w = need<int64_t>(c, "sliding_window", where);
    if (w < 1) fail("{}: sliding_window must be positive, got {}", where, w);
    s.window_size = w - 1;  // HF's window of w keys is t - (w - 1) .. t
    s.window_attn_pattern = pattern;
  }
  if (!has(c, "rope_scaling")) return;
  const json& r = c["rope_scaling"];
  const std::string w = where + " rope_scaling";
  const std::string type = r.value("rope_type", r.value("type", ""));
  if (type == "default") return;
  if (type != "yarn") fail("{}: rope_scaling type '{}' is not supported (yarn only)", where, type);
  for (const char* k : {"attention_factor", "mscale", "mscale_all_dim"})
    if (has(r, k)) fail("{}: '{}' is not supported (HF's default attention factor 0.1 ln(factor) + 1 only)", w, k);
  s.position_embedding_type = "yarn";
  s.rotary_scaling_factor = need<double>(r, "factor", w);
  s.yarn_original_max_position_embeddings = need<int64_t>(r, "original_max_position_embeddings", w);
  s.yarn_beta_fast = value_or<double>(r, "beta_fast", 32.0, w);
  s.yarn_beta_slow = value_or<double>(r, "beta_slow", 1.0, w);
  s.yarn_correction_range_round_to_int = value_or<bool>(r, "truncate", true, w);
  s.mscale = 1.0;
  s.mscale_all_dim = 0.0;
}

void write_gpt_oss(const ModelSpec& s, const Architecture& a, json& c) {
  auto need_part = [&](bool present, const char* what) {
    if (!present) fail("a {} checkpoint has {}; model '{}' has not", a.name, what, s.name);
  };
  need_part(s.add_bias_linear, "biases on every linear (add_bias_linear)");
  need_part(s.learns_attention_sinks(), "learned attention sinks (softmax_type: learnable)");
  need_part(s.quick_geglu && s.glu_linear_offset == 1.0,
            "the GLU g sigmoid(1.702 g) (up + 1) (quick_geglu, glu_linear_offset 1)");
  need_part(s.is_moe() && s.moe_layer_pattern.empty() && s.moe_layer_freq == 1, "experts in every layer");
  need_part(s.moe_shared_expert_intermediate_size == 0, "no shared expert");
  need_part(s.moe_router_score_function == "softmax" && !s.moe_router_pre_softmax,
            "a softmax over the chosen logits (moe_router_pre_softmax false)");
  need_part(s.position_embedding_type != "yarn" || (s.mscale == 1.0 && s.mscale_all_dim == 0.0),
            "YaRN's default attention factor (mscale 1, mscale_all_dim 0)");
  c["num_local_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.moe_router_topk;
  c["intermediate_size"] = s.expert_ffn();
  c["swiglu_limit"] = s.activation_func_clamp_value;
  c["attention_bias"] = true;
  std::vector<std::string> types;
  for (int64_t l = 0; l < s.num_layers; ++l)
    types.push_back(s.layer_window(l) >= 0 ? "sliding_attention" : "full_attention");
  c["layer_types"] = types;
  c["sliding_window"] = s.window_size >= 0 ? json(s.window_size + 1) : json(nullptr);
  if (s.position_embedding_type == "yarn")
    c["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", s.rotary_scaling_factor},
                         {"beta_fast", s.yarn_beta_fast},
                         {"beta_slow", s.yarn_beta_slow},
                         {"truncate", s.yarn_correction_range_round_to_int},
                         {"original_max_position_embeddings", s.yarn_original_max_position_embeddings}};
  write_hf_aux_loss(s, c);
}

// Llama 4 (transformers' modeling_llama4, Llama4TextConfig): experts of intermediate_size and one
// ungated shared expert of the same width on the moe_layers (default every
// interleave_moe_layer_step-th), dense layers of intermediate_size_mlp, top-1 routing whose sigmoid
// score scales the expert's input; no_rope_layers (1: RoPE; default every
// no_rope_layer_interval-th layer NoPE), use_qk_norm and attention_chunk_size on the RoPE layers,
// the NoPE layers' query temperature (attn_temperature_tuning, truthy as a number too).
void read_llama4(const json& c, const std::string& where, ModelSpec& s) {
  const int64_t L = s.num_layers;
  s.moe_ffn_hidden_size = need<int64_t>(c, "intermediate_size", where);
  s.ffn_hidden_size = need<int64_t>(c, "intermediate_size_mlp", where);
  s.num_experts = need<int64_t>(c, "num_local_experts", where);
  s.moe_router_topk = need<int64_t>(c, "num_experts_per_tok", where);
  if (s.moe_router_topk != 1)
    fail("{}: num_experts_per_tok {} is not supported (Llama 4's sigmoid score scales the expert's input: top-1 only)",
         where, s.moe_router_topk);
  s.moe_shared_expert_intermediate_size = s.moe_ffn_hidden_size;
  s.moe_router_score_function = "sigmoid";
  s.moe_router_pre_softmax = false;
  s.moe_apply_probs_on_input = true;
  read_hf_aux_loss(c, where, s);
  std::vector<int64_t> sparse(size_t(L), 0);
  if (has(c, "moe_layers")) {
    for (int64_t l : need<std::vector<int64_t>>(c, "moe_layers", where)) {
      if (l < 0 || l >= L) fail("{}: moe_layers names layer {}, num_hidden_layers is {}", where, l, L);
      sparse[size_t(l)] = 1;
    }
  } else {
    const int64_t step = value_or<int64_t>(c, "interleave_moe_layer_step", 1, where);
    if (step < 1) fail("{}: interleave_moe_layer_step must be at least 1, got {}", where, step);
    for (int64_t l = step - 1; l < L; l += step) sparse[size_t(l)] = 1;
  }
  if (std::count(sparse.begin(), sparse.end(), 1) == 0)
    fail("{}: no layer has experts (moe_layers, interleave_moe_layer_step): a dense Llama 4 is not supported", where);
  set_moe_layers(s, sparse);
  std::vector<int64_t> rope = value_or<std::vector<int64_t>>(c, "no_rope_layers", {}, where);
  if (rope.empty()) {  // HF's default: every no_rope_layer_interval-th layer (1-based) NoPE
    const int64_t every = value_or<int64_t>(c, "no_rope_layer_interval", 4, where);
    if (every < 1) fail("{}: no_rope_layer_interval must be at least 1, got {}", where, every);
    for (int64_t l = 0; l < L; ++l) rope.push_back((l + 1) % every != 0);
  }
  if (int64_t(rope.size()) != L)
    fail("{}: no_rope_layers lists {} layers, num_hidden_layers is {}", where, rope.size(), L);
  std::vector<int64_t> nope;
  for (int64_t r : rope) {
    if (r != 0 && r != 1) fail("{}: no_rope_layers entry {} is not 0 (NoPE) or 1 (RoPE)", where, r);
    nope.push_back(1 - r);
  }
  if (std::count(nope.begin(), nope.end(), 1) > 0) s.no_rope_pattern = nope;
  s.qk_l2_norm = value_or<bool>(c, "use_qk_norm", true, where);
  s.attention_chunk_size = value_or<int64_t>(c, "attention_chunk_size", 0, where);
  if (s.attention_chunk_size < 0)
    fail("{}: attention_chunk_size must be positive, got {}", where, s.attention_chunk_size);
  if (has(c, "attn_temperature_tuning") && !c["attn_temperature_tuning"].is_boolean() &&
      !c["attn_temperature_tuning"].is_number())
    fail("{}: 'attn_temperature_tuning' has the wrong type: {}", where, c["attn_temperature_tuning"].dump());
  const json& tuning = has(c, "attn_temperature_tuning") ? c["attn_temperature_tuning"] : json(true);
  s.attn_temperature_tuning = tuning.is_boolean() ? tuning.get<bool>() : tuning.get<double>() != 0;
  s.floor_scale = value_or<double>(c, "floor_scale", 8192.0, where);
  s.attn_scale = value_or<double>(c, "attn_scale", 0.1, where);
}

void write_llama4(const ModelSpec& s, const Architecture& a, json& c) {
  auto need_part = [&](bool present, const char* what) {
    if (!present) fail("a {} checkpoint has {}; model '{}' has not", a.name, what, s.name);
  };
  need_part(s.is_moe(), "experts");
  need_part(s.moe_router_topk == 1 && s.moe_router_score_function == "sigmoid" && s.moe_apply_probs_on_input,
            "top-1 routing whose sigmoid score scales the expert's input (moe_apply_probs_on_input)");
  need_part(s.moe_shared_expert_intermediate_size == s.expert_ffn() && !s.moe_shared_expert_gate,
            "one ungated shared expert as wide as the experts");
  need_part(s.rotary_percent == 1.0, "rotary embedding on the whole head (rotary_percent 1)");
  std::vector<int64_t> moe_layers, rope;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (s.is_moe_layer(l)) moe_layers.push_back(l);
    rope.push_back(s.layer_uses_rope(l));
  }
  need_part(!moe_layers.empty(), "a layer with experts");
  c["intermediate_size"] = s.expert_ffn();
  c["intermediate_size_mlp"] = s.ffn_hidden_size;
  c["num_local_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.moe_router_topk;
  // The step whose default list these layers are, when they are one (Scout 1, Maverick 2); else 1
  // (HF reads moe_layers first either way).
  const int64_t step = moe_layers.front() + 1;
  bool stepped = true;
  for (size_t i = 0; i < moe_layers.size(); ++i) stepped = stepped && moe_layers[i] == step - 1 + int64_t(i) * step;
  stepped = stepped && moe_layers.back() + step >= s.num_layers;
  c["interleave_moe_layer_step"] = stepped ? step : 1;
  c["moe_layers"] = moe_layers;
  c["no_rope_layers"] = rope;
  c["use_qk_norm"] = s.qk_l2_norm;
  c["attention_chunk_size"] = s.attention_chunk_size > 0 ? json(s.attention_chunk_size) : json(nullptr);
  c["attn_temperature_tuning"] = s.attn_temperature_tuning;
  c["floor_scale"] = s.floor_scale;
  c["attn_scale"] = s.attn_scale;
  c["attention_bias"] = false;
  c["router_jitter_noise"] = 0.0;
  write_hf_aux_loss(s, c);
}

// The spec's parts that none of these families has, refused by name on export.
void refuse_foreign_parts(const ModelSpec& s, const Architecture& a) {
  auto no = [&](bool present, const char* what) {
    if (present) fail("a {} checkpoint cannot hold {} (model '{}')", a.name, what, s.name);
  };
  no(s.softmax_type == "off-by-one", "fixed attention sinks (softmax_type: off-by-one)");
  no(s.final_logit_softcapping != 0 || s.router_logit_softcapping != 0, "logit soft-capping");
  if (a.family != Family::Llama4)
    no(s.qk_l2_norm || s.attention_chunk_size > 0 || s.no_rope_freq > 0 || !s.no_rope_pattern.empty() ||
           s.attn_temperature_tuning || s.moe_apply_probs_on_input,
       "Llama 4's parts (qk_l2_norm, attention_chunk_size, no_rope_freq, attn_temperature_tuning, "
       "moe_apply_probs_on_input; Llama4ForCausalLM)");
  no(s.mtp_num_layers > 0 && a.family != Family::DeepseekV3,
     "multi-token prediction (mtp_num_layers; DeepseekV3ForCausalLM's num_nextn_predict_layers)");
  if (a.family == Family::GptOss) return;
  no(s.add_bias_linear, "add_bias_linear (biases on every linear; GptOssForCausalLM)");
  no(s.has_attention_sinks(), "attention sinks (softmax_type; GptOssForCausalLM)");
  no(s.quick_geglu || s.glu_linear_offset != 0 || s.activation_func_clamp_value != 0,
     "gpt-oss's clamped GLU (quick_geglu, glu_linear_offset, activation_func_clamp_value; GptOssForCausalLM)");
  no(s.window_size >= 0, "sliding-window attention (window_size; GptOssForCausalLM)");
  no(!s.multi_latent_attention && s.position_embedding_type == "yarn",
     "YaRN on grouped-query attention (GptOssForCausalLM)");
  no(s.multi_latent_attention && !is_deepseek(a.family),
     "multi-latent attention (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)");
  no(s.is_moe() && !is_moe_family(a.family), "experts (MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, "
                                             "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM, "
                                             "Llama4ForCausalLM)");
}

// The MoE layers as HF's dense-layer list (Qwen's mlp_only_layers).
std::vector<int64_t> dense_layers(const ModelSpec& s) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < s.num_layers; ++l)
    if (!s.is_moe_layer(l)) out.push_back(l);
  return out;
}

void write_mixtral(const ModelSpec& s, const Architecture& a, json& c) {
  if (!dense_layers(s).empty())
    fail("a {} checkpoint has experts in every layer; model '{}' has dense layers", a.name, s.name);
  if (s.moe_shared_expert_intermediate_size > 0)
    fail("a {} checkpoint has no shared expert (model '{}')", a.name, s.name);
  if (s.moe_router_score_function != "softmax" || (s.moe_router_pre_softmax && !s.moe_router_norm_topk_prob))
    fail("a {} checkpoint routes by a softmax renormalised over the top-k; model '{}' routes otherwise", a.name,
         s.name);
  c["num_local_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.moe_router_topk;
  c["intermediate_size"] = s.expert_ffn();
  c["router_jitter_noise"] = 0.0;
  c["sliding_window"] = nullptr;
  write_hf_aux_loss(s, c);
}

void write_qwen_moe(const ModelSpec& s, const Architecture& a, json& c) {
  if (s.moe_router_score_function != "softmax")
    fail("a {} checkpoint routes by softmax scores; model '{}' has moe_router_score_function {}", a.name, s.name,
         s.moe_router_score_function);
  const bool shared = s.moe_shared_expert_intermediate_size > 0;
  if (a.family == Family::Qwen3Moe && shared) fail("a {} checkpoint has no shared expert (model '{}')", a.name, s.name);
  if (a.family == Family::Qwen2Moe && (!shared || !s.moe_shared_expert_gate))
    fail("a {} checkpoint has a gated shared expert; model '{}' has {}", a.name, s.name,
         shared ? "an ungated one" : "none");
  c["num_experts"] = s.num_experts;
  c["num_experts_per_tok"] = s.moe_router_topk;
  c["moe_intermediate_size"] = s.expert_ffn();
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = dense_layers(s);
  c["norm_topk_prob"] = !s.moe_router_pre_softmax || s.moe_router_norm_topk_prob;
  if (shared) c["shared_expert_intermediate_size"] = s.moe_shared_expert_intermediate_size;
  c["use_sliding_window"] = false;
  write_hf_aux_loss(s, c);
}

// DeepSeek's router keys (MoEGate) of our routing; a routing DeepSeek's code does not compute is
// refused by name.
void write_deepseek_router(const ModelSpec& s, const Architecture& a, json& c) {
  const bool v3 = a.family == Family::DeepseekV3, sigmoid = s.moe_router_score_function == "sigmoid";
  if (s.moe_router_score_function == "softmax" && !s.moe_router_pre_softmax)
    fail("a {} checkpoint's softmax router scores all experts before the top-k (moe_router_pre_softmax); model '{}' "
         "does not",
         a.name, s.name);
  if (s.moe_router_enable_expert_bias != v3)
    fail("model '{}' {} an expert bias (moe_router_enable_expert_bias) and a {} checkpoint {}: export it as {}", s.name,
         s.moe_router_enable_expert_bias ? "has" : "has no", a.name, v3 ? "needs one" : "has none",
         v3 ? "DeepseekV2ForCausalLM" : "DeepseekV3ForCausalLM");
  // A group's score: V2's group_limited_greedy takes its largest (the sum of its top 1), V3's
  // noaux_tc sums its top 2; this router sums its top group_score_terms().
  const bool grouped = s.moe_router_num_groups > 0;
  if (grouped && s.group_score_terms() != (v3 ? 2 : 1))
    fail("model '{}' ranks a group of experts by {} (moe_router_group_score {}, moe_router_topk {}, "
         "moe_router_group_topk {}); a {} checkpoint ranks it by {}",
         s.name,
         s.group_score_terms() == 1 ? std::string("its largest score")
                                    : fmt::format("the sum of its top {} scores", s.group_score_terms()),
         group_score_name(s.moe_router_group_score), s.moe_router_topk, s.moe_router_group_topk, a.name,
         v3 ? "the sum of its top 2 scores (topk_method noaux_tc)"
            : "its largest score (topk_method group_limited_greedy)");
  const bool norm = sigmoid ? s.moe_router_topk > 1 : s.moe_router_norm_topk_prob;
  const double scale = s.moe_router_topk_scaling_factor > 0 ? s.moe_router_topk_scaling_factor : 1.0;
  if (!v3 && norm && scale != 1.0)
    fail("a {} checkpoint does not scale normalised weights; model '{}' has moe_router_topk_scaling_factor {}", a.name,
         s.name, scale);
  c["routed_scaling_factor"] = scale;
  c["scoring_func"] = s.moe_router_score_function;
  c["topk_method"] = v3 ? "noaux_tc" : grouped ? "group_limited_greedy" : "greedy";
  c["n_group"] = grouped ? s.moe_router_num_groups : 1;
  c["topk_group"] = grouped ? s.moe_router_group_topk : 1;
  c["norm_topk_prob"] = norm;
  c["aux_loss_alpha"] = s.moe_aux_loss_coeff;
  c["seq_aux"] = s.moe_router_load_balancing_type == "seq_aux_loss";
}

void write_deepseek(const ModelSpec& s, const Architecture& a, json& c) {
  if (!s.multi_latent_attention)
    fail("a {} checkpoint has multi-latent attention; model '{}' has none", a.name, s.name);
  if (!s.qk_layernorm)
    fail("a {} checkpoint normalises the q and kv latents (qk_layernorm); model '{}' does not", a.name, s.name);
  c["head_dim"] = s.qk_pos_emb_head_dim;  // as transformers' DeepseekV3Config
  c["num_key_value_heads"] = s.num_attention_heads;
  c["q_lora_rank"] = s.q_lora_rank > 0 ? json(s.q_lora_rank) : json(nullptr);
  c["kv_lora_rank"] = s.kv_lora_rank;
  c["qk_nope_head_dim"] = s.qk_head_dim;
  c["qk_rope_head_dim"] = s.qk_pos_emb_head_dim;
  c["v_head_dim"] = s.v_head_dim;
  c["attention_bias"] = false;
  c["rope_scaling"] = nullptr;
  if (s.rotary_scaling_factor > 1)
    c["rope_scaling"] = {{"type", "yarn"},
                         {"factor", s.rotary_scaling_factor},
                         {"beta_fast", s.beta_fast},
                         {"beta_slow", s.beta_slow},
                         {"mscale", s.mscale},
                         {"mscale_all_dim", s.mscale_all_dim},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  if (a.family == Family::DeepseekV3) c["num_nextn_predict_layers"] = s.mtp_num_layers;
  if (!s.is_moe()) return;
  int64_t first = 0;
  while (first < s.num_layers && !s.is_moe_layer(first)) ++first;
  for (int64_t l = first; l < s.num_layers; ++l)
    if (!s.is_moe_layer(l))
      fail("a {} checkpoint has dense layers first (first_k_dense_replace), then experts; model '{}' has a dense layer "
           "{} after MoE layer {}",
           a.name, s.name, l, first);
  const int64_t fe = s.expert_ffn(), fs = s.moe_shared_expert_intermediate_size;
  if (fs % fe != 0)
    fail("a {} checkpoint's shared experts are n_shared_experts x moe_intermediate_size; model '{}' has "
         "moe_shared_expert_intermediate_size {}, not a multiple of {}",
         a.name, s.name, fs, fe);
  if (s.moe_shared_expert_gate) fail("a {} checkpoint's shared experts have no gate (model '{}')", a.name, s.name);
  write_deepseek_router(s, a, c);
  c["n_routed_experts"] = s.num_experts;
  c["n_shared_experts"] = fs > 0 ? json(fs / fe) : json(nullptr);
  c["num_experts_per_tok"] = s.moe_router_topk;
  c["moe_intermediate_size"] = fe;
  c["first_k_dense_replace"] = first;
  c["moe_layer_freq"] = 1;
}

// Row permutation of `n` rows that puts the rope rows [at, at + d) of each of `blocks` blocks of
// `stride` rows from interleaved pairs to halves: our row at + j is their row at + perm(j), with
// perm = 0, 2, 4, ..., 1, 3, 5, ...
std::vector<int64_t> rope_perm(int64_t blocks, int64_t stride, int64_t at, int64_t d) {
  std::vector<int64_t> p(size_t(blocks * stride));
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < stride; ++i) {
      const int64_t j = i - at;
      const int64_t src = j < 0 || j >= d ? i : at + (j < d / 2 ? 2 * j : 2 * (j - d / 2) + 1);
      p[size_t(b * stride + i)] = b * stride + src;
    }
  return p;
}

void attention_mappings(const ModelSpec& s, Family f, int64_t l, const std::string& o, const std::string& h,
                        std::vector<Mapping>& m) {
  const std::string a = o + "self_attention.", t = h + "self_attn.";
  if (s.multi_latent_attention) {
    const int64_t H = s.num_attention_heads, qk = s.qk_head_dim + s.qk_pos_emb_head_dim;
    const std::vector<int64_t> qperm = rope_perm(H, qk, s.qk_head_dim, s.qk_pos_emb_head_dim);
    if (s.q_lora_rank > 0) {
      m.push_back({a + "linear_q_down_proj.weight", {t + "q_a_proj.weight"}, {}, {}});
      m.push_back({a + "q_layernorm.weight", {t + "q_a_layernorm.weight"}, {}, {}});
      m.push_back({a + "linear_q_up_proj.weight", {t + "q_b_proj.weight"}, {}, qperm});
    } else {
      m.push_back({a + "linear_q_proj.weight", {t + "q_proj.weight"}, {}, qperm});
    }
    m.push_back({a + "linear_kv_down_proj.weight",
                 {t + "kv_a_proj_with_mqa.weight"},
                 {},
                 rope_perm(1, s.kv_lora_rank + s.qk_pos_emb_head_dim, s.kv_lora_rank, s.qk_pos_emb_head_dim)});
    m.push_back({a + "kv_layernorm.weight", {t + "kv_a_layernorm.weight"}, {}, {}});
    m.push_back({a + "linear_kv_up_proj.weight", {t + "kv_b_proj.weight"}, {}, {}});
    m.push_back({a + "linear_proj.weight", {t + "o_proj.weight"}, {}, {}});
    return;
  }
  const std::vector<int64_t> qkv = {s.q_size(), s.kv_size(), s.kv_size()};
  std::vector<int64_t> perm;  // Llama 4's RoPE layers: each q and k head's rotary rows, then v unmoved
  if (f == Family::Llama4 && s.layer_uses_rope(l)) {
    perm = rope_perm(s.num_attention_heads + s.query_groups(), s.head_dim(), 0, s.rotary_dim());
    for (int64_t i = s.q_size() + s.kv_size(); i < s.qkv_size(); ++i) perm.push_back(i);
  }
  m.push_back({a + "linear_qkv.weight", {t + "q_proj.weight", t + "k_proj.weight", t + "v_proj.weight"}, qkv, perm});
  if (s.qkv_bias())
    m.push_back({a + "linear_qkv.bias", {t + "q_proj.bias", t + "k_proj.bias", t + "v_proj.bias"}, qkv, {}});
  if (s.qk_layernorm) {  // Qwen3: one head_dim weight for all q heads, one for all k heads
    m.push_back({a + "q_layernorm.weight", {t + "q_norm.weight"}, {}, {}});
    m.push_back({a + "k_layernorm.weight", {t + "k_norm.weight"}, {}, {}});
  }
  m.push_back({a + "linear_proj.weight", {t + "o_proj.weight"}, {}, {}});
  if (s.add_bias_linear) m.push_back({a + "linear_proj.bias", {t + "o_proj.bias"}, {}, {}});
  if (s.learns_attention_sinks()) m.push_back({a + "core_attention.softmax_offset", {t + "sinks"}, {}, {}});
}

// A gated MLP: ours linear_fc1 = [gate; up], linear_fc2 = down.
void glu_mappings(const std::string& ours, const std::string& gate, const std::string& up, const std::string& down,
                  int64_t f, std::vector<Mapping>& m) {
  m.push_back({ours + "linear_fc1.weight", {gate + ".weight", up + ".weight"}, {f, f}, {}});
  m.push_back({ours + "linear_fc2.weight", {down + ".weight"}, {}, {}});
}

void moe_mappings(const ModelSpec& s, Family f, const std::string& o, const std::string& h, std::vector<Mapping>& m) {
  const std::string mlp = h + (f == Family::Mixtral  ? "block_sparse_moe."
                               : f == Family::Llama4 ? "feed_forward."
                                                     : "mlp.");
  if (f == Family::Llama4) {  // the experts are packed: gpt_oss_experts.h
    m.push_back({o + "mlp.router.weight", {mlp + "router.weight"}, {}, {}});
    glu_mappings(o + "mlp.shared_experts.", mlp + "shared_expert.gate_proj", mlp + "shared_expert.up_proj",
                 mlp + "shared_expert.down_proj", s.moe_shared_expert_intermediate_size, m);
    return;
  }
  if (f == Family::GptOss) {  // the experts are packed: gpt_oss_experts.h
    m.push_back({o + "mlp.router.weight", {mlp + "router.weight"}, {}, {}});
    m.push_back({o + "mlp.router.bias", {mlp + "router.bias"}, {}, {}});
    return;
  }
  m.push_back({o + "mlp.router.weight", {mlp + "gate.weight"}, {}, {}});
  if (s.moe_router_enable_expert_bias)
    m.push_back({o + "mlp.router.expert_bias", {mlp + "gate.e_score_correction_bias"}, {}, {}});
  for (int64_t e = 0; e < s.num_experts; ++e) {
    const std::string ours = o + fmt::format("mlp.experts.local_experts.{}.", e),
                      x = mlp + fmt::format("experts.{}.", e);
    if (f == Family::Mixtral)
      glu_mappings(ours, x + "w1", x + "w3", x + "w2", s.expert_ffn(), m);
    else
      glu_mappings(ours, x + "gate_proj", x + "up_proj", x + "down_proj", s.expert_ffn(), m);
  }
  if (s.moe_shared_expert_intermediate_size > 0) {
    const std::string x = mlp + (f == Family::Qwen2Moe ? "shared_expert." : "shared_experts.");
    glu_mappings(o + "mlp.shared_experts.", x + "gate_proj", x + "up_proj", x + "down_proj",
                 s.moe_shared_expert_intermediate_size, m);
    if (s.moe_shared_expert_gate)
      m.push_back({o + "mlp.shared_experts.gate_weight", {mlp + "shared_expert_gate.weight"}, {}, {}});
  }
}

}  // namespace

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> a = {{"LlamaForCausalLM", "llama", Family::Llama},
                                              {"MistralForCausalLM", "mistral", Family::Mistral},
                                              {"Qwen2ForCausalLM", "qwen2", Family::Qwen2},
                                              {"Qwen3ForCausalLM", "qwen3", Family::Qwen3},
                                              {"MixtralForCausalLM", "mixtral", Family::Mixtral},
                                              {"Qwen2MoeForCausalLM", "qwen2_moe", Family::Qwen2Moe},
                                              {"Qwen3MoeForCausalLM", "qwen3_moe", Family::Qwen3Moe},
                                              {"DeepseekV2ForCausalLM", "deepseek_v2", Family::DeepseekV2},
                                              {"DeepseekV3ForCausalLM", "deepseek_v3", Family::DeepseekV3},
                                              {"GptOssForCausalLM", "gpt_oss", Family::GptOss},
                                              {"Llama4ForCausalLM", "llama4_text", Family::Llama4},
                                              {"Llama4ForConditionalGeneration", "llama4", Family::Llama4,
                                               Multimodal{"Llama4ForCausalLM",
                                                          "language_model.",
                                                          {"vision_model.", "multi_modal_projector."},
                                                          "the vision encoder and its projector"}}};
  return a;
}

const Architecture& architecture_named(const std::string& name, const std::string& where) {
  for (const Architecture& a : architectures())
    if (a.name == name) return a;
  std::vector<std::string> names;
  for (const Architecture& a : architectures()) names.push_back(a.name);
  fail("{}architecture '{}' is not supported ({})", where.empty() ? "" : where + ": ", name, fmt::join(names, ", "));
}

const Architecture& default_architecture(const ModelSpec& s) {
  const char* name = s.add_bias_linear && s.learns_attention_sinks() ? "GptOssForCausalLM"
                     : s.moe_apply_probs_on_input || s.qk_l2_norm    ? "Llama4ForCausalLM"
                     : s.multi_latent_attention
                         ? (s.moe_router_enable_expert_bias ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM")
                     : s.is_moe() && s.moe_shared_expert_intermediate_size > 0 ? "Qwen2MoeForCausalLM"
                     : s.is_moe() && s.qk_layernorm                            ? "Qwen3MoeForCausalLM"
                     : s.is_moe()                                              ? "MixtralForCausalLM"
                     : s.qk_layernorm                                          ? "Qwen3ForCausalLM"
                     : s.add_qkv_bias                                          ? "Qwen2ForCausalLM"
                                                                               : "LlamaForCausalLM";
  return architecture_named(name, "");
}

void layer_mappings(const ModelSpec& s, Family f, int64_t l, std::vector<Mapping>& m) {
  const std::string o = s.layer_prefix(l), h = fmt::format("model.layers.{}.", l);
  m.push_back({o + "input_layernorm.weight", {h + "input_layernorm.weight"}, {}, {}});
  attention_mappings(s, f, l, o, h, m);
  m.push_back({o + "pre_mlp_layernorm.weight", {h + "post_attention_layernorm.weight"}, {}, {}});
  const std::string mlp = h + (f == Family::Llama4 ? "feed_forward." : "mlp.");
  if (s.is_moe_layer(l))
    moe_mappings(s, f, o, h, m);
  else
    glu_mappings(o + "mlp.", mlp + "gate_proj", mlp + "up_proj", mlp + "down_proj", s.ffn_hidden_size, m);
}

namespace {

void read_family_parts(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  switch (a.family) {
    case Family::Mixtral: return read_mixtral(c, where, s);
    case Family::Qwen2Moe:
    case Family::Qwen3Moe: return read_qwen_moe(c, a, where, s);
    case Family::DeepseekV2:
    case Family::DeepseekV3: return read_deepseek(c, a, where, s);
    case Family::GptOss: return read_gpt_oss(c, where, s);
    case Family::Llama4: return read_llama4(c, where, s);
    default: return;
  }
}

}  // namespace

void read_family_config(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  // The MoE families' per-layer lists (dense and MoE layers, windows) have num_hidden_layers entries.
  constexpr int64_t kMaxLayers = 1'000'000;
  if (is_moe_family(a.family) && (s.num_layers < 1 || s.num_layers > kMaxLayers))
    fail("{}: num_hidden_layers {} is out of range (1 to {})", where, s.num_layers, kMaxLayers);
  read_family_parts(c, a, where, s);
  read_deepseek_mtp(c, a, where, s);
}

void write_family_config(const ModelSpec& s, const Architecture& a, json& c) {
  refuse_foreign_parts(s, a);
  switch (a.family) {
    case Family::Mixtral: return write_mixtral(s, a, c);
    case Family::Qwen2Moe:
    case Family::Qwen3Moe: return write_qwen_moe(s, a, c);
    case Family::DeepseekV2:
    case Family::DeepseekV3: return write_deepseek(s, a, c);
    case Family::GptOss: return write_gpt_oss(s, a, c);
    case Family::Llama4: return write_llama4(s, a, c);
    default: return;
  }
}

// Each depth k's own tensors at HF's layer L + k (DeepSeek's README_WEIGHTS.md: enorm, hnorm,
// eh_proj, the layer's self_attn and mlp, shared_head.norm); their meaning from vLLM's
// deepseek_mtp.py, the reference that serves these checkpoints: enorm normalizes the embedded
// tokens and hnorm the main model's output, eh_proj takes cat([enorm(e), hnorm(h)]) (the
// embedding's half first, as Megatron's and mtp.cpp's order), and the logits are
// shared_head.head(shared_head.norm(layer output)): shared_head.norm is mtp.cpp's final_layernorm.
void mtp_mappings(const ModelSpec& s, Family f, std::vector<Mapping>& m) {
  for (int64_t k = 0; k < s.mtp_num_layers; ++k) {
    const std::string o = fmt::format("mtp.layers.{}.", k), h = fmt::format("model.layers.{}.", s.num_layers + k);
    m.push_back({o + "enorm.weight", {h + "enorm.weight"}, {}, {}});
    m.push_back({o + "hnorm.weight", {h + "hnorm.weight"}, {}, {}});
    m.push_back({o + "eh_proj.weight", {h + "eh_proj.weight"}, {}, {}});
    layer_mappings(s, f, s.num_layers + k, m);
    m.push_back({o + "final_layernorm.weight", {h + "shared_head.norm.weight"}, {}, {}});
  }
}

std::vector<std::pair<std::string, std::string>> mtp_copies(const ModelSpec& s) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string head = s.untie_embeddings_and_output_weights ? "lm_head.weight" : "model.embed_tokens.weight";
  for (int64_t k = 0; k < s.mtp_num_layers; ++k) {
    const std::string h = fmt::format("model.layers.{}.", s.num_layers + k);
    out.push_back({h + "embed_tokens.weight", "model.embed_tokens.weight"});
    out.push_back({h + "shared_head.head.weight", head});
  }
  return out;
}

}  // namespace primus::hf
