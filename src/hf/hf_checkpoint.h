// Conversion between Hugging Face checkpoints (config.json + safetensors, single or sharded) and
// this project's checkpoints (checkpoint/checkpoint.h), for the architectures of hf_families.h:
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and the
// mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, gpt-oss, Llama 4), in
// fp32 or bf16 (and, on import, DeepSeek-V3's fp8 blocks and gpt-oss's MXFP4 experts: dequant.h).
// Meta's multimodal Llama 4 folders (Llama4ForConditionalGeneration) import as their text model,
// the other towers left out, and such a checkpoint exports as that text model (hf_families.h Multimodal).
//
// Our model and Hugging Face's share the rotary convention (rotate-half: pairs (i, i + d/2)), so
// q_proj / k_proj rows carry over unpermuted (DeepSeek's interleaved rope rows excepted:
// hf_families.h); only the fusions differ: our linear_qkv is [q_proj; k_proj; v_proj] by rows and
// linear_fc1 is [gate_proj; up_proj]. Qwen3's q_norm / k_norm are our q_layernorm / k_layernorm
// (qk_layernorm). Features this model lacks are refused by name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/model_spec.h"
#include "model/options.h"  // LoraOptions

namespace primus::hf {

// The model spec a config.json describes (a multimodal folder's: its text model's); `where` names
// the file in errors. Sets *architecture to the config's architecture (e.g. "LlamaForCausalLM",
// "Llama4ForConditionalGeneration").
ModelSpec spec_from_hf_config(const nlohmann::json& config, const std::string& where, std::string* architecture);
// config.json for `spec` as `architecture` (one of hf_families.h's); torch_dtype "float32" or
// "bfloat16". A spec the architecture cannot hold is refused by name.
nlohmann::json hf_config_from_spec(const ModelSpec& spec, const std::string& architecture, const std::string& torch_dtype);

struct ImportOptions {
  std::string hf_dir;     // config.json and model.safetensors (or the index and its shards)
  std::string save_dir;   // our save folder: the checkpoint goes to <save_dir>/iter_0000000
  std::string tokenizer;  // tokenizer.json (or its folder) recorded in the checkpoint's config; "": hf_dir's if any
  bool overwrite = false;
  bool allow_nonfinite = false;  // NaN / Inf weights: a warning instead of an error
};
// Returns the checkpoint folder written. Before anything of the model's size is allocated, the
// memory it needs (from config.json) is compared with the host's; the weights are checked to be
// finite. A failed import leaves no folder behind.
std::string import_hf(const ImportOptions& options);

struct ExportOptions {
  std::string checkpoint;    // a checkpoint folder or a save folder with `latest`
  std::string out_dir;       // gets config.json, the safetensors file(s), and the tokenizer files when known
  std::string dtype = "F32";  // F32 or BF16
  std::string architecture;   // "": the family the spec's parts say (hf_families.h default_architecture)
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default shard size ("5GB")
  bool overwrite = false;  // out_dir may hold files: its model files are replaced, others kept
  // A LoRA checkpoint (its config's lora.enabled): false writes the merged weights W + (alpha / dim)
  // B A; true writes the adapters alone as a PEFT folder (adapter_config.json and
  // adapter_model.safetensors, PEFT's names: base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight,
  // the fused qkv and gate/up adapters split as their weights are: A shared, B by rows).
  bool adapters = false;
};
// A PEFT adapter folder (adapter_config.json and adapter_model.safetensors with PEFT's names, as
// export_hf with `adapters` writes it) read back as `spec`'s LoRA adapters under `lora`: our
// adapter names ("<module>.adapter.linear_in.weight" / "linear_out") -> their whole values (fp32,
// row-major). Refused by name: another rank r or lora_alpha than the run's, an adapter this run
// expects that the folder lacks, a tensor the run does not adapt, a tensor of another shape (the
// adapters of another base model), the parts of a fused weight with different lora_A.
std::map<std::string, std::vector<float>> read_peft_adapters(const std::string& dir, const ModelSpec& spec,
                                                             const LoraOptions& lora);

// Returns the files written. out_dir must be new or empty unless `overwrite`; the files are written
// into a temporary folder beside it and moved into place, after the previous model's files (config,
// weights, index, tokenizer files) are removed. A failed export leaves out_dir as it was.
std::vector<std::string> export_hf(const ExportOptions& options);

}  // namespace primus::hf
