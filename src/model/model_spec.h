// ModelSpec: the shape of a Llama-family decoder, under Megatron-LM's argument names so that a
// Megatron or Primus user reads our presets without a glossary. Presets live in
// configs/models/*.yaml and may `extends:` another preset.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace YAML { class Node; }

namespace primus {

// How group-limited routing ranks a group of experts (moe_router_group_score, this engine's key):
//   topk_sum  the sum of its top max(1, moe_router_topk / moe_router_group_topk) scores: Megatron-Core's
//             rule (DeepSeek-V3's noaux_tc sums its top 2: topk / group_topk = 2 there)
//   max       its largest score: DeepSeek-V2's group_limited_greedy (Hugging Face's modeling_deepseek)
// The name is read once, by model_spec.cpp's key table; the router sees the enum.
enum class GroupScore : uint8_t { TopkSum, Max };
constexpr const char* group_score_name(GroupScore g) { return g == GroupScore::Max ? "max" : "topk_sum"; }

struct ModelSpec {
  std::string name;  // preset name or file it came from (for messages)

  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // 0 means = num_attention_heads (no GQA)
  int64_t kv_channels = 0;       // per-head dimension; 0 means hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double norm_epsilon = 1e-5;
  double rotary_base = 10000.0;
  bool untie_embeddings_and_output_weights = true;
  bool add_qkv_bias = false;
  // Megatron's add_bias_linear: a bias on every linear (QKV, linear_proj, the MLP's fc1 and fc2, the
  // router, each expert's fc1 and fc2), as gpt-oss has. Not with MLA or a shared expert (not built).
  bool add_bias_linear = false;
  bool qkv_bias() const { return add_qkv_bias || add_bias_linear; }
  double init_method_std = 0.02;

  // Llama 3.1 rotary frequency scaling ("rope_type": "llama3" in Hugging Face configs).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;
  // Megatron's rotary_percent: rotary embedding on the first rotary_dim() = int(head_dim *
  // rotary_percent) channels of each query/key head (rotate-half pairs within them, frequencies
  // over that width), the rest untouched (MiniMax-M2.5: 0.5).
  double rotary_percent = 1.0;

  // Per-head RMSNorm of queries and keys before rotary (Qwen3); under multi-latent attention,
  // Megatron's same key normalises the query and key/value latents (DeepSeek).
  bool qk_layernorm = false;

  // gpt-oss's attention (docs/model_math.md), Megatron's names. softmax_type: vanilla | off-by-one
  // (a fixed 0 logit in every softmax denominator) | learnable (one learned logit per head, the
  // attention sinks). window_size: Megatron's [left, right] pair, read as the left window (query t
  // sees keys t - left .. t; right must be 0, causal); -1 (YAML null, or left -1): none.
  // window_attn_skip_freq: which layers use the window, Megatron's rule: an integer N puts every
  // N-th layer (1-based) on full attention, the others on the window; a 0/1 list (1: window)
  // gives each layer; 0 (null): every layer.
  // The MLPs' gated linear unit (every MLP: dense, experts, shared), Megatron's glu():
  //   act = g sigmoid(a g) (u + glu_linear_offset), g = min(gate, c), u = clamp(up, -c, c)
  // a = 1 (SwiGLU) or 1.702 (quick_geglu: Megatron's quick_gelu), c = activation_func_clamp_value
  // (0, YAML null: no clamp). gpt-oss: quick_geglu, offset 1, clamp 7.
  bool quick_geglu = false;
  double glu_linear_offset = 0.0;
  double activation_func_clamp_value = 0.0;
  std::string softmax_type = "vanilla";
  int64_t window_size = -1;
  int64_t window_attn_skip_freq = 0;
  std::vector<int64_t> window_attn_pattern;  // non-empty: the list form, one entry per layer

  // Llama 4's attention (docs/model_math.md, Llama 4). no_rope_freq (Megatron's): which layers
  // have no rotary embedding (NoPE): an integer N puts every N-th layer (1-based) on NoPE, a 0/1
  // list (1: NoPE) gives each layer; 0 (null): RoPE everywhere. The RoPE layers of such a model
  // carry the rest: qk_l2_norm (Megatron's: each query and key head divided by its RMS, no
  // weights; Meta's Llama 4 applies it on the RoPE layers only, and so does this engine) and
  // attention_chunk_size (Hugging Face's: a query sees the keys of its own chunk of that many
  // positions, floor(t / C) * C .. t; 0 (null): none). The NoPE layers attend globally, their
  // queries scaled by the temperature log1p(floor((t + 1) / floor_scale)) * attn_scale + 1 when
  // attn_temperature_tuning (Hugging Face's names).
  int64_t no_rope_freq = 0;
  std::vector<int64_t> no_rope_pattern;  // non-empty: the list form, one entry per layer
  bool qk_l2_norm = false;
  int64_t attention_chunk_size = 0;
  bool attn_temperature_tuning = false;
  double floor_scale = 8192;
  double attn_scale = 0.1;

  // Soft-capping (Grok 2), Primus's names: z = cap * tanh(x / cap) (kernels/softcap.h) on the final
  // logits before the loss and in decoding (final_logit_softcapping), and on the MoE router's logits
  // before the scores and the z-loss (router_logit_softcapping); 0 (YAML null): none.
  double final_logit_softcapping = 0;
  double router_logit_softcapping = 0;

  // Multi-head latent attention (DeepSeek-V2/V3), Megatron's MLATransformerConfig names.
  bool multi_latent_attention = false;
  int64_t q_lora_rank = 0;  // 0 (YAML null): queries straight from the hidden state
  int64_t kv_lora_rank = 512;
  int64_t qk_head_dim = 128;          // the non-rotary part of a query/key head
  int64_t qk_pos_emb_head_dim = 64;   // the decoupled rotary part, shared by all heads for keys
  int64_t v_head_dim = 128;
  // YaRN rotary scaling (model/rope.h, Yarn), Megatron's keys and defaults. MLA uses it when
  // rotary_scaling_factor > 1 with beta_fast, beta_slow and original_max_position_embeddings;
  // grouped-query attention when position_embedding_type is yarn (else rope), with the yarn_*
  // keys (gpt-oss). Both take rotary_scaling_factor, mscale and mscale_all_dim.
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 4096;
  std::string position_embedding_type = "rope";
  double yarn_beta_fast = 32.0;
  double yarn_beta_slow = 1.0;
  int64_t yarn_original_max_position_embeddings = 4096;
  bool yarn_correction_range_round_to_int = true;

  // Mixture of experts (Megatron-Core names and defaults; docs/moe.md).
  int64_t num_experts = 0;          // 0 (YAML null): dense model
  int64_t moe_ffn_hidden_size = 0;  // 0: ffn_hidden_size
  int64_t moe_router_topk = 2;
  // moe_layer_freq: an int N (every N-th layer, from layer 0, is MoE) or a per-layer 0/1 list; a
  // Primus expression string "([0]*3+[1]*58)" is read into the list.
  int64_t moe_layer_freq = 1;
  std::vector<int64_t> moe_layer_pattern;  // non-empty: the list form, one entry per layer
  int64_t moe_shared_expert_intermediate_size = 0;  // 0: no shared expert
  bool moe_shared_expert_gate = false;
  std::string moe_router_score_function = "softmax";  // softmax | sigmoid
  bool moe_router_pre_softmax = false;
  // With moe_router_pre_softmax: the chosen experts' scores renormalised to sum to 1 (Hugging
  // Face's norm_topk_prob, torchtitan's route_norm). Sigmoid scores are for top-k > 1 always, and
  // a softmax over the chosen logits sums to 1 by construction.
  bool moe_router_norm_topk_prob = false;
  double moe_router_topk_scaling_factor = 0;  // 0 (null): none
  int64_t moe_router_num_groups = 0;          // 0 (null): no group-limited routing
  int64_t moe_router_group_topk = 0;
  GroupScore moe_router_group_score = GroupScore::TopkSum;
  std::string moe_router_dtype;  // "" (null): the activation dtype; fp32 | fp64
  std::string moe_router_load_balancing_type = "aux_loss";  // aux_loss | seq_aux_loss | none
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;  // 0 (null): none
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // The bias update centred on its mean over the experts (torchtitan's): the same choices (a shift
  // of every expert's bias moves no top-k), other stored biases.
  bool moe_router_bias_update_centered = false;
  double moe_expert_capacity_factor = 0;   // 0 (null): dropless
  std::string moe_token_drop_policy = "probs";  // probs | position
  // MaxText's token dropping (its dense-matmul path): the capacity is per sequence,
  // int(max(ceil(seq * topk / experts) * factor, factor)), the earliest tokens kept (position).
  bool moe_expert_capacity_per_sequence = false;
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_router_force_load_balancing = false;
  // Megatron's moe_apply_probs_on_input (top-1 only): the routing weight scales the expert's
  // input instead of its output (Llama 4: expert(sigmoid(logit) x)).
  bool moe_apply_probs_on_input = false;
  std::string moe_token_dispatcher_type = "allgather";  // allgather | alltoall

  // Multi-token prediction (DeepSeek-V3; Megatron's keys, docs/model_math.md#multi-token-prediction):
  // mtp_num_layers depths after the head, each one transformer layer of the last decoder layer's
  // kind ("mtp.layers.<k>."), their loss scaled by mtp_loss_scaling_factor / mtp_num_layers.
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;


  // Derived values (valid after validate()).
  // Layer `layer`'s parameter prefix: "decoder.layers.<l>." for l < num_layers, else MTP depth
  // l - num_layers's transformer layer "mtp.layers.<k>.transformer_layer.". An MTP layer has the
  // last decoder layer's kind (dense or MoE, window).
  std::string layer_prefix(int64_t layer) const;
  int64_t layer_kind(int64_t layer) const { return layer < num_layers ? layer : num_layers - 1; }
  int64_t query_groups() const { return num_query_groups ? num_query_groups : num_attention_heads; }
  int64_t head_dim() const { return kv_channels ? kv_channels : hidden_size / num_attention_heads; }
  int64_t rotary_dim() const { return int64_t(double(head_dim()) * rotary_percent); }
  int64_t q_size() const { return num_attention_heads * head_dim(); }
  // Megatron's scaled init for the layers that write into the residual stream (linear_proj,
  // linear_fc2): init_method_std / sqrt(2 num_layers).
  double scaled_init_std() const { return init_method_std / std::sqrt(2.0 * double(num_layers)); }
  int64_t kv_size() const { return query_groups() * head_dim(); }
  int64_t qkv_size() const { return q_size() + 2 * kv_size(); }
  bool is_moe() const { return num_experts > 0; }
  // How many of a group's top scores topk_sum adds (group-limited routing):
  // max(1, moe_router_topk / moe_router_group_topk).
  int64_t topk_sum_terms() const {
    return moe_router_group_topk > 0 ? std::max<int64_t>(1, moe_router_topk / moe_router_group_topk) : 1;
  }
  // How many the group score sums: 1 under max (the largest), else topk_sum_terms().
  int64_t group_score_terms() const { return moe_router_group_score == GroupScore::Max ? 1 : topk_sum_terms(); }
  // The sliding window of decoder layer `layer` (0-based): window_size, or -1 (full attention).
  int64_t layer_window(int64_t layer) const;
  // Whether decoder layer `layer` (0-based) has a rotary embedding (no_rope_freq), and its
  // attention chunk (attention_chunk_size on the RoPE layers, else 0: none).
  bool layer_uses_rope(int64_t layer) const;
  int64_t layer_attention_chunk(int64_t layer) const {
    return layer_uses_rope(layer) ? attention_chunk_size : 0;
  }
  // Whether attention has sinks (softmax_type learnable or off-by-one), and whether they learn.
  bool has_attention_sinks() const { return softmax_type != "vanilla"; }
  bool learns_attention_sinks() const { return softmax_type == "learnable"; }
  // Whether decoder layer `layer` (0-based) has an MoE block instead of the dense MLP.
  bool is_moe_layer(int64_t layer) const;
  int64_t expert_ffn() const { return moe_ffn_hidden_size ? moe_ffn_hidden_size : ffn_hidden_size; }
  // Width of the attention output (linear_proj's input): heads x v_head_dim under MLA.
  int64_t attention_out_size() const {
    return multi_latent_attention ? num_attention_heads * v_head_dim : q_size();
  }

  // Throws primus::Error naming the field when shapes are inconsistent.
  void validate() const;
  void validate_moe() const;  // the num_experts and moe_* keys (called by validate)
};

// Loads a preset by name ("llama3_8B", looked up in configs/models/) or by path to a YAML file.
ModelSpec load_model_spec(const std::string& name_or_path);
// Builds a spec from an already-parsed YAML map (keys as in the preset files); `origin` names
// the file in error messages.
ModelSpec model_spec_from_yaml(const YAML::Node& node, const std::string& origin);
// Folder holding the presets: $PRIMUS_CONFIG_DIR/models, else <source tree>/configs/models.
std::string model_preset_dir();
std::vector<std::string> list_model_presets();

// Counting, used by `analyze model`, the trainer's MFU and the benchmarks.
struct ModelStats {
  int64_t parameters = 0;            // all parameters (with MoE's expert bias, as published)
  // Parameters one token passes through: every expert of an MoE layer counted top-k times of
  // num_experts (shared experts always). Embedding (input) counted; see docs/moe.md.
  int64_t active_parameters = 0;
  int64_t embedding_parameters = 0;  // input embedding (+ untied output layer)
  int64_t non_embedding_parameters = 0;
  double flops_per_token = 0;        // training FLOPs per token, see docs/model_math.md
  double activation_bytes_per_token = 0;
  // Of those, the multi-token prediction depths' (rows "mtp.layers.<k>"; 0 without MTP).
  int64_t mtp_parameters = 0, mtp_active_parameters = 0;
  double mtp_flops_per_token = 0;
  struct Layer {
    std::string name;
    int64_t parameters;
    double flops_per_token;
    double activation_bytes_per_token = 0;  // (added) saved activations, fp32, no recompute
    int64_t active_parameters = 0;          // parameters a token passes through (MoE: top-k experts)
  };
  std::vector<Layer> layers;
};
ModelStats model_stats(const ModelSpec& spec, int64_t seq_length);

// (added) Every trainable tensor of the model in storage order, under Megatron-Core's names
// ("decoder.layers.0.self_attention.linear_qkv.weight"). model_stats counts from this list, so
// a model that lays its flat buffer out in this order has exactly the counted parameters.
// weight_decay follows Megatron: off for biases and norm weights (1-D tensors).
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  bool weight_decay = true;
  bool trainable = true;  // false: a buffer counted with the parameters (MoE expert bias)
  int64_t expert = -1;    // global expert index of a routed expert's tensor, else -1
};
std::vector<ParamInfo> model_parameter_layout(const ModelSpec& spec);

// The keys a model spec accepts (Megatron names), e.g. for an experiment config's overrides.
std::vector<std::string> model_spec_keys();
// Whether YAML null (Megatron's None) is a value of this model key ("none": 0 or ""), as for
// q_lora_rank and num_experts; for the other keys null means "unset".
bool model_key_nullable(const std::string& key);
// Applies the model keys of `node` (a map) on top of `spec`, with the same type checks and
// errors (naming `origin`, line and column) as a preset file. Does not validate.
void apply_model_keys(ModelSpec& spec, const YAML::Node& node, const std::string& origin);
// Every field of `spec` as a YAML map under its key (for resolved configs and checkpoints).
YAML::Node model_spec_to_yaml(const ModelSpec& spec);

}  // namespace primus
