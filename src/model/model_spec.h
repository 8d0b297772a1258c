// ModelSpec: the shape of a Llama-family decoder, under Megatron-LM's argument names so that a
// Megatron or Primus user reads our presets without a glossary. Presets live in
// configs/models/*.yaml and may `extends:` another preset.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace YAML { class Node; }

namespace primus {

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
  double init_method_std = 0.02;

  // Llama 3.1 rotary frequency scaling ("rope_type": "llama3" in Hugging Face configs).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;

  // Derived values (valid after validate()).
  int64_t query_groups() const { return num_query_groups ? num_query_groups : num_attention_heads; }
  int64_t head_dim() const { return kv_channels ? kv_channels : hidden_size / num_attention_heads; }
  int64_t q_size() const { return num_attention_heads * head_dim(); }
  // Megatron's scaled init for the layers that write into the residual stream (linear_proj,
  // linear_fc2): init_method_std / sqrt(2 num_layers).
  double scaled_init_std() const { return init_method_std / std::sqrt(2.0 * double(num_layers)); }
  int64_t kv_size() const { return query_groups() * head_dim(); }
  int64_t qkv_size() const { return q_size() + 2 * kv_size(); }

  // Throws primus::Error naming the field when shapes are inconsistent.
  void validate() const;
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
  int64_t parameters = 0;            // all trainable parameters
  int64_t embedding_parameters = 0;  // input embedding (+ untied output layer)
  int64_t non_embedding_parameters = 0;
  double flops_per_token = 0;        // training FLOPs per token, see docs/model_math.md
  double activation_bytes_per_token = 0;
  struct Layer {
    std::string name;
    int64_t parameters;
    double flops_per_token;
    double activation_bytes_per_token = 0;  // (added) saved activations, fp32, no recompute
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
};
std::vector<ParamInfo> model_parameter_layout(const ModelSpec& spec);

// The keys a model spec accepts (Megatron names), e.g. for an experiment config's overrides.
std::vector<std::string> model_spec_keys();
// Applies the model keys of `node` (a map) on top of `spec`, with the same type checks and
// errors (naming `origin`, line and column) as a preset file. Does not validate.
void apply_model_keys(ModelSpec& spec, const YAML::Node& node, const std::string& origin);
// Every field of `spec` as a YAML map under its key (for resolved configs and checkpoints).
YAML::Node model_spec_to_yaml(const ModelSpec& spec);

}  // namespace primus
