// The model's run options that a config chooses by name: the enums and their names, nothing else
// (no dependencies), so that the config library can include it without linking the model. The
// config parses these keys (config/choices.h); the model only ever sees the enums.
#pragma once

#include <cstdint>

namespace primus {

// Megatron's recompute_granularity. selective recomputes the cheap, memory-hungry parts (the
// attention core, SwiGLU and the norms) from saved inputs; full keeps only each block's input
// and re-runs the whole block before its backward.
enum class Recompute : uint8_t { None, Selective, Full };
constexpr const char* recompute_name(Recompute r) {
  return r == Recompute::Full ? "full" : r == Recompute::Selective ? "selective" : "none";
}

// cp_comm_type: how attention under context parallelism reaches the other ranks' keys and values.
//   p2p  ring attention: key/value blocks passed around the cp group while the current one computes
//   a2a  all-to-all over heads (Ulysses): each rank attends over the whole sequence for heads/cp heads
enum class CpComm : uint8_t { P2P, A2A };
constexpr const char* cp_comm_name(CpComm c) { return c == CpComm::P2P ? "p2p" : "a2a"; }

// fp8 (Megatron's key): off (null), e4m3 (E4M3 for every operand), hybrid (E4M3 forward, E5M2 for
// the gradients). fp8_recipe: how FP8 operands are scaled (model/linears.h, docs/fp8.md).
enum class Fp8Mode : uint8_t { Off, E4M3, Hybrid };
enum class Fp8Recipe : uint8_t { Delayed, Tensorwise, Blockwise, Mxfp8 };
constexpr const char* fp8_recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::Delayed      ? "delayed"
         : r == Fp8Recipe::Tensorwise ? "tensorwise"
         : r == Fp8Recipe::Blockwise  ? "blockwise"
                                      : "mxfp8";
}

// LoRA (Primus's `lora:` block of sft_trainer.yaml, Megatron-Bridge's LoRA dataclass): low-rank
// adapters beside the named linears, y = W x + (alpha / dim) B A dropout(x), the base frozen
// (model/linears.h, docs/posttraining.md#lora).
//   target_modules  linear_qkv | linear_proj | linear_fc1 | linear_fc2 (Megatron-Core's module names)
//   *_init_method   xavier (normal, std sqrt(2 / (fan_in + fan_out))) | normal (N(0, 0.2)) |
//                   kaiming (uniform, a = sqrt 5: bound 1 / sqrt(fan_in)) | zero
enum class LoraTarget : uint8_t { LinearQkv, LinearProj, LinearFc1, LinearFc2 };
enum class LoraInit : uint8_t { Xavier, Normal, Kaiming, Zero };
enum class LoraDropoutPosition : uint8_t { Pre, Post };

struct LoraOptions {
  bool enabled = false;
  int64_t dim = 32;
  double alpha = 32;
  double dropout = 0.0;
  LoraDropoutPosition dropout_position = LoraDropoutPosition::Pre;
  LoraInit a_init = LoraInit::Xavier, b_init = LoraInit::Zero;
  bool targets[4] = {true, true, true, true};  // by LoraTarget
  bool applies_to(LoraTarget t) const { return targets[uint8_t(t)]; }
  double scale() const { return alpha / double(dim); }
};

}  // namespace primus
