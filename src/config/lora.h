// Primus's `lora:` block (sft_trainer.yaml; Megatron-Bridge's LoRA dataclass), read into the
// model's LoraOptions at the config boundary: its names become enums here, a key this engine does
// not build is refused by name.
//
//   lora:
//     enabled: false
//     dim: 32                      adapter rank
//     alpha: 32                    scale alpha / dim
//     dropout: 0.0                 in [0, 1), training passes only
//     dropout_position: pre        pre | post
//     lora_A_init_method: xavier   xavier | normal | kaiming | zero
//     lora_B_init_method: zero
//     target_modules: [linear_qkv, linear_proj, linear_fc1, linear_fc2]
#pragma once

#include <string>

#include <yaml-cpp/yaml.h>

#include "model/options.h"

namespace primus::config {

// Reads `node` (a map) into `out`; `at` names where it was written, for the errors.
void read_lora(const YAML::Node& node, const std::string& at, LoraOptions& out);
// The block as a config writes it (config.yaml).
YAML::Node lora_to_yaml(const LoraOptions& lora);
// A Markdown table of the block's keys with their defaults (docs/config.md).
std::string lora_keys_reference();

}  // namespace primus::config
