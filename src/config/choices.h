// The keys whose value is one of a few names become enums here, at the config boundary: the
// table of each enum's spellings, the parse with an error naming the key, the value and the
// choices, and the name written back (config.yaml and --print-config print what was given).
// Header-only: the model's enums come from model/options.h, which has no dependencies, so the
// config library still links only core and yaml-cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "data/sft_options.h"  // data::ChatFormatName
#include "kernels/fp8.h"  // fp8::AmaxAlgo
#include "model/options.h"

namespace primus::config {

// data_parallel_sharding_strategy, Megatron's names: no_shard, optim (ZeRO-1), optim_grads
// (ZeRO-2), optim_grads_params (ZeRO-3 / FSDP). Unset: the key was not given; the layout resolves
// it from use_torch_fsdp2 and use_distributed_optimizer (plan/parallel_layout.h).
enum class DpSharding : uint8_t { Unset, NoShard, Optim, OptimGrads, OptimGradsParams };

// Primus's `stage`: what a run trains. Pretraining (modules.pre_trainer, `train pretrain`) leaves it
// unset; post-training (modules.post_trainer, `train posttrain`) names sft or dpo.
enum class TrainStage : uint8_t { Pretrain, Sft, Dpo };

// pipeline_balance: none, the even split or decoder_first/last_pipeline_num_layers; auto, the layers
// per stage chosen from each layer's cost (plan/parallel_layout.h).
enum class PipelineBalance : uint8_t { None, Auto };

// dpo_loss_type, TRL's `loss_type` names: sigmoid, the DPO paper's loss (train/dpo.h). TRL's other
// losses (hinge, ipo, robust, ...) are not built: their names are not in the table below.
enum class DpoLossType : uint8_t { Sigmoid };

// The precision-aware optimizer's dtypes (Megatron's main_grads_dtype, main_params_dtype,
// exp_avg_dtype, exp_avg_sq_dtype; docs/optim.md): Megatron's spellings. Which are built for
// which key is checked in experiment.cpp (check_precision_aware); the rest are refused by name.
enum class OptimDtype : uint8_t { Fp32, Bf16, Fp16, Fp8 };

template <class E>
struct Choice {
  E value;
  const char* name;  // "" is the spelling of "unset" where a key has one
};

// The model's enums are spelled by model/options.h's name functions (the log's names too); the
// tables below take those, adding "" where a key has an unset value.
inline constexpr Choice<Recompute> kRecomputeChoices[] = {{Recompute::None, ""},
                                                          {Recompute::Full, recompute_name(Recompute::Full)},
                                                          {Recompute::Selective, recompute_name(Recompute::Selective)}};
inline constexpr Choice<CpComm> kCpCommChoices[] = {{CpComm::P2P, cp_comm_name(CpComm::P2P)},
                                                    {CpComm::A2A, cp_comm_name(CpComm::A2A)}};
inline constexpr Choice<DpSharding> kDpShardingChoices[] = {{DpSharding::Unset, ""},
                                                           {DpSharding::NoShard, "no_shard"},
                                                           {DpSharding::Optim, "optim"},
                                                           {DpSharding::OptimGrads, "optim_grads"},
                                                           {DpSharding::OptimGradsParams, "optim_grads_params"}};

inline constexpr Choice<Fp8Mode> kFp8ModeChoices[] = {
    {Fp8Mode::Off, ""}, {Fp8Mode::E4M3, "e4m3"}, {Fp8Mode::Hybrid, "hybrid"}};
inline constexpr Choice<Fp8Recipe> kFp8RecipeChoices[] = {{Fp8Recipe::Delayed, fp8_recipe_name(Fp8Recipe::Delayed)},
                                                          {Fp8Recipe::Tensorwise,
                                                           fp8_recipe_name(Fp8Recipe::Tensorwise)},
                                                          {Fp8Recipe::Blockwise, fp8_recipe_name(Fp8Recipe::Blockwise)},
                                                          {Fp8Recipe::Mxfp8, fp8_recipe_name(Fp8Recipe::Mxfp8)}};
inline constexpr Choice<fp8::AmaxAlgo> kAmaxAlgoChoices[] = {
    {fp8::AmaxAlgo::Max, fp8::amax_algo_name(fp8::AmaxAlgo::Max)},
    {fp8::AmaxAlgo::MostRecent, fp8::amax_algo_name(fp8::AmaxAlgo::MostRecent)}};

inline constexpr Choice<OptimDtype> kOptimDtypeChoices[] = {
    {OptimDtype::Fp32, "fp32"}, {OptimDtype::Bf16, "bf16"}, {OptimDtype::Fp16, "fp16"}, {OptimDtype::Fp8, "fp8"}};

inline constexpr Choice<TrainStage> kTrainStageChoices[] = {
    {TrainStage::Pretrain, ""}, {TrainStage::Pretrain, "pretrain"}, {TrainStage::Sft, "sft"}, {TrainStage::Dpo, "dpo"}};
inline constexpr Choice<PipelineBalance> kPipelineBalanceChoices[] = {{PipelineBalance::None, "none"},
                                                                     {PipelineBalance::Auto, "auto"}};
inline constexpr Choice<DpoLossType> kDpoLossTypeChoices[] = {{DpoLossType::Sigmoid, "sigmoid"}};
// sft_conversation_format; "messages" is Primus's other name of "openai"; "chat_template" (the
// tokenizer's own) is ours: Primus's formatters have no such value.
inline constexpr Choice<data::ChatFormatName> kChatFormatChoices[] = {{data::ChatFormatName::Alpaca, "alpaca"},
                                                                      {data::ChatFormatName::ChatML, "chatml"},
                                                                      {data::ChatFormatName::OpenAI, "openai"},
                                                                      {data::ChatFormatName::OpenAI, "messages"},
                                                                      {data::ChatFormatName::Squad, "squad"},
                                                                      {data::ChatFormatName::ChatTemplate,
                                                                       "chat_template"}};

// The lora block's names (model/options.h; Megatron-Bridge's LoRA dataclass).
inline constexpr Choice<LoraInit> kLoraInitChoices[] = {
    {LoraInit::Xavier, "xavier"}, {LoraInit::Normal, "normal"}, {LoraInit::Kaiming, "kaiming"}, {LoraInit::Zero, "zero"}};
inline constexpr Choice<LoraDropoutPosition> kLoraDropoutPositionChoices[] = {{LoraDropoutPosition::Pre, "pre"},
                                                                              {LoraDropoutPosition::Post, "post"}};
inline constexpr Choice<LoraTarget> kLoraTargetChoices[] = {{LoraTarget::LinearQkv, "linear_qkv"},
                                                            {LoraTarget::LinearProj, "linear_proj"},
                                                            {LoraTarget::LinearFc1, "linear_fc1"},
                                                            {LoraTarget::LinearFc2, "linear_fc2"}};

inline std::span<const Choice<Recompute>> choices_of(Recompute) { return kRecomputeChoices; }
inline std::span<const Choice<LoraInit>> choices_of(LoraInit) { return kLoraInitChoices; }
inline std::span<const Choice<LoraDropoutPosition>> choices_of(LoraDropoutPosition) {
  return kLoraDropoutPositionChoices;
}
inline std::span<const Choice<LoraTarget>> choices_of(LoraTarget) { return kLoraTargetChoices; }
inline std::span<const Choice<Fp8Mode>> choices_of(Fp8Mode) { return kFp8ModeChoices; }
inline std::span<const Choice<Fp8Recipe>> choices_of(Fp8Recipe) { return kFp8RecipeChoices; }
inline std::span<const Choice<fp8::AmaxAlgo>> choices_of(fp8::AmaxAlgo) { return kAmaxAlgoChoices; }
inline std::span<const Choice<CpComm>> choices_of(CpComm) { return kCpCommChoices; }
inline std::span<const Choice<DpSharding>> choices_of(DpSharding) { return kDpShardingChoices; }
inline std::span<const Choice<OptimDtype>> choices_of(OptimDtype) { return kOptimDtypeChoices; }
inline std::span<const Choice<TrainStage>> choices_of(TrainStage) { return kTrainStageChoices; }
inline std::span<const Choice<DpoLossType>> choices_of(DpoLossType) { return kDpoLossTypeChoices; }
inline std::span<const Choice<PipelineBalance>> choices_of(PipelineBalance) { return kPipelineBalanceChoices; }
inline std::span<const Choice<data::ChatFormatName>> choices_of(data::ChatFormatName) { return kChatFormatChoices; }

// The name a config writes for `v`.
template <class E>
const char* choice_name(E v) {
  for (const Choice<E>& c : choices_of(E{}))
    if (c.value == v) return c.name;
  return "?";
}

template <class E>
std::optional<E> find_choice(std::string_view name) {
  for (const Choice<E>& c : choices_of(E{}))
    if (name == c.name) return c.value;
  return std::nullopt;
}

// "full, selective (or leave it unset)": the names a key accepts, for its error.
template <class E>
std::string choice_list() {
  std::string out;
  bool unset = false;
  for (const Choice<E>& c : choices_of(E{})) {
    if (*c.name == '\0') {
      unset = true;
      continue;
    }
    out += (out.empty() ? "" : ", ") + std::string(c.name);
  }
  return unset ? out + " (or leave it unset)" : out;
}

// "cp_comm_type 'ring' is not one of: p2p, a2a"
template <class E>
std::string not_a_choice(std::string_view key, std::string_view value) {
  return fmt::format("{} '{}' is not one of: {}", key, value, choice_list<E>());
}

}  // namespace primus::config
