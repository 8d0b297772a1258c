// The Hugging Face model families that `checkpoint import` / `export` convert (hf_checkpoint.h),
// and what differs between them: the architecture names, the config.json keys of the mixture of
// experts and of multi-head latent attention, and the tensor names of attention and MLP blocks.
//
//   Llama, Mistral, Qwen2, Qwen3   dense (Qwen2: QKV biases; Qwen3: q_norm / k_norm)
//   Mixtral                        block_sparse_moe.gate, experts.E.w1 (gate) / w3 (up) / w2 (down)
//   Qwen2-MoE                      mlp.gate, mlp.experts.E.*_proj, mlp.shared_expert.*_proj and its
//                                  sigmoid mlp.shared_expert_gate; QKV biases
//   Qwen3-MoE                      mlp.gate, mlp.experts.E.*_proj; q_norm / k_norm
//   DeepSeek-V2 (and V2-Lite), V3  multi-head latent attention, first_k_dense_replace dense layers,
//                                  shared experts; V3's sigmoid scores, e_score_correction_bias
//                                  and grouped routing; V3's fp8 block-quantized weights and its
//                                  multi-token-prediction layers (mtp_mappings)
//   gpt-oss                        biases on every linear, attention sinks (self_attn.sinks),
//                                  sliding windows by layer_types, YaRN, a router with a bias, and
//                                  each layer's experts packed in one tensor (gpt_oss_experts.h)
//   Llama 4 (Llama4ForCausalLM)     feed_forward.* blocks: dense layers' gate/up/down_proj of
//                                  intermediate_size_mlp; MoE layers' router, the experts packed in
//                                  experts.gate_up_proj / down_proj (gpt_oss_experts.h) and an
//                                  ungated shared_expert; no_rope_layers, use_qk_norm,
//                                  attention_chunk_size, attention temperature tuning. Meta's
//                                  folders (Llama4ForConditionalGeneration) wrap it: Multimodal
//
// DeepSeek's rotary parts are stored for interleaved pairs (x0, x1), (x2, x3), ... while this
// engine rotates halves (i, i + d/2): the rope rows of q (each head's last qk_rope_head_dim rows)
// and of kv_a_proj_with_mqa (its last rows) are permuted on import, by `perm`, and back on export.
// Llama 4's rotary (complex pairs) is interleaved alike: each q and k head's rows of its RoPE
// layers are permuted by the same rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model_spec.h"

namespace primus::hf {

enum class Family { Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen2Moe, Qwen3Moe, DeepseekV2, DeepseekV3, GptOss, Llama4 };

// A multimodal folder around one of the text architectures (Llama4ForConditionalGeneration, as Meta
// publishes Llama 4): config.json holds the text model's config under `text_config`, the safetensors
// hold the text model's tensors under `weight_prefix` and the other towers' under `other_prefixes`.
// Import reads the text model and leaves the other towers out (saying so); export writes the text
// architecture, since a checkpoint of this engine holds no weights of the other towers.
struct Multimodal {
  std::string text_architecture;            // e.g. "Llama4ForCausalLM"
  std::string weight_prefix;                // e.g. "language_model."
  std::vector<std::string> other_prefixes;  // e.g. "vision_model.", "multi_modal_projector."
  std::string others;                       // what they are, for the log: "the vision encoder and its projector"
};

struct Architecture {
  std::string name;        // config.json's architectures[0], e.g. "MixtralForCausalLM"
  std::string model_type;  // config.json's model_type, e.g. "mixtral"
  Family family;
  std::optional<Multimodal> multimodal = {};  // set for a multimodal folder around a text architecture
};
const std::vector<Architecture>& architectures();
// The entry of `name`; an error naming `where` and the supported architectures when there is none.
const Architecture& architecture_named(const std::string& name, const std::string& where);
// The architecture an export writes when none is asked for: the family the spec's parts say.
const Architecture& default_architecture(const ModelSpec& spec);

// One of our tensors and the Hugging Face tensors it is made of, concatenated along dim 0.
// rows: the rows of each part (empty: one part, all rows). perm (empty: none): our row i is row
// perm[i] of that concatenation.
struct Mapping {
  std::string ours;
  std::vector<std::string> theirs;
  std::vector<int64_t> rows;
  std::vector<int64_t> perm;
};

// The attention and MLP tensors of decoder layer `l` (HF prefix `h` = "model.layers.N.", ours
// `o` = ModelSpec::layer_prefix: "decoder.layers.N.", an MTP depth's layer past num_layers), appended to `m`;
// gpt-oss's and Llama 4's packed experts are not among them (gpt_oss_experts.h).
void layer_mappings(const ModelSpec& s, Family f, int64_t l, std::vector<Mapping>& m);

// Reads the family's MoE and MLA keys of config.json into `s` (the dense keys are read already);
// refuses by name any value this model cannot represent.
void read_family_config(const nlohmann::json& c, const Architecture& a, const std::string& where, ModelSpec& s);
// The family's MoE and MLA keys of `s`, into config.json `c`; refuses by name a spec the family
// cannot hold.
void write_family_config(const ModelSpec& s, const Architecture& a, nlohmann::json& c);

// DeepSeek-V3's multi-token-prediction depths (mtp_num_layers, config.json's
// num_nextn_predict_layers): depth k is HF's model.layers.<num_hidden_layers + k>.* and our
// mtp.layers.<k>.* (model/mtp.cpp): enorm, hnorm, eh_proj, the layer's tensors,
// shared_head.norm = final_layernorm. Appended to `m`.
void mtp_mappings(const ModelSpec& s, Family f, std::vector<Mapping>& m);
// The depths' copies of the main model's tensors, {copy, original}: HF stores each depth's
// embed_tokens and shared_head.head, which this model shares with the main model (the input
// embedding, the output layer). Export writes them; import checks each one present equals its original.
std::vector<std::pair<std::string, std::string>> mtp_copies(const ModelSpec& s);

}  // namespace primus::hf
