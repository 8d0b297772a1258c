// Experiment configs, shaped like Primus's:
//
//   work_group: ${TEAM:amd}
//   user_name: ${USER:root}
//   exp_name: llama_tiny_demo
//   workspace: ./output
//   modules:
//     pre_trainer:
//       config: pre_trainer.yaml  # optional: module defaults from configs/modules/ (as Primus's)
//       model: tiny               # a preset in configs/models, or a path to a model YAML
//       overrides:                # Megatron-named training keys; model keys override the preset
//         micro_batch_size: 4
//         train_iters: 200
//         lr: 3.0e-3
//
// A post-training config names `modules: post_trainer:` instead (Primus's `train posttrain`), with
// the same keys and `stage: sft`; it is read as a pre_trainer section is, and written back (config.yaml,
// --print-config) under its own name.
//
// `framework: torchtitan` and `framework: maxtext` modules are written in those frameworks' names
// and translated into these keys first (config/dialect.h).
//
// Unknown keys and wrong types are errors naming the key, its file and line, and the nearest
// valid key. The table of training keys (training_keys()) is also the source of the config
// reference in docs/config.md, checked by a test.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "config/choices.h"
#include "config/dialect.h"
#include "config/yaml_tree.h"
#include "model/model_spec.h"

namespace primus::config {

struct TrainingArgs {
  // batch and length
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;  // 0: micro_batch_size (no accumulation)
  int64_t seq_length = 0;         // 0: the model's max_position_embeddings
  int64_t train_iters = 0;
  // optimizer
  double lr = 1e-4;
  double min_lr = 0;
  double lr_warmup_init = 0;
  int64_t lr_warmup_iters = 0;
  int64_t lr_decay_iters = 0;  // 0: train_iters
  std::string lr_decay_style = "linear";
  std::string lr_wsd_decay_style = "exponential";
  int64_t lr_wsd_decay_iters = 0;
  double weight_decay = 0.01;
  bool decay_norms_and_biases = false;  // decay every tensor (torchtitan's, MaxText's AdamW); off: Megatron's rule
  double clip_grad = 1.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  // The precision-aware optimizer (Megatron's keys; docs/optim.md#low-precision-optimizer-state)
  bool use_precision_aware_optimizer = false;
  OptimDtype main_grads_dtype = OptimDtype::Fp32;   // fp32 | bf16
  OptimDtype main_params_dtype = OptimDtype::Fp32;  // fp32 | fp16 (TE's scaled fp16 master) | bf16 (ours: MaxText's)
  OptimDtype exp_avg_dtype = OptimDtype::Fp32;      // fp32 | bf16 | fp16 | fp8 (fp16 and fp8 with a per-tensor scale)
  OptimDtype exp_avg_sq_dtype = OptimDtype::Fp32;   // as exp_avg_dtype
  int64_t seed = 1234;
  // logging, evaluation, checkpoints
  int64_t log_interval = 100;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  int64_t save_interval = 0;  // 0: save only at the end when `save` is set
  std::string save;           // "": <workspace>/<exp_name>/checkpoints
  std::string load;           // checkpoint folder (or its parent with a `latest` file) to resume from
  bool auto_resume = true;    // resume from `save` when it holds a checkpoint
  bool finetune = false;      // `load` gives the weights only: iteration 0, fresh optimizer (Megatron's --finetune)
  std::string pretrained_checkpoint;  // weights to start from when `save` holds no checkpoint of this run
  bool no_load_optim = false;  // resume weights and data position, a fresh optimizer (Megatron's --no-load-optim)
  bool load_strict = true;     // a checkpoint must hold this model (checkpoint/model_fit.h); false: load what matches
  int64_t keep_last_checkpoints = 3;
  bool async_save = false;    // write checkpoints on a thread from host copies (docs/checkpoints.md)
  bool ckpt_fully_parallel_load = false;  // dp replicas each read a share of what they hold alike and exchange it
  bool overwrite = false;     // replace another run's checkpoints in `save` (else an error)
  bool exit_signal_handler = false;  // SIGTERM: save after the step in progress and exit 0 (safe/early_exit.h)
  double exit_duration_in_mins = 0;  // > 0: save and exit 0 once this many minutes have passed
  // data
  std::vector<std::string> data_path;
  std::string split = "969,30,1";
  bool mock_data = false;
  bool eod_mask_loss = false;  // no loss on positions whose input token is the end-of-document token
  // Documents split after each end-of-document input token (data/microbatch.h): positions restart
  // at each, attention stays within each.
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  std::string tokenizer_type;
  std::string tokenizer_model;
  // post-training (docs/posttraining.md): Primus's post_trainer keys
  TrainStage stage = TrainStage::Pretrain;  // sft | dpo under modules.post_trainer; unset: pretraining
  std::string hf_path;                      // a Hugging Face model folder to start from (imported once)
  std::string peft_adapter_path;            // a PEFT adapter folder whose LoRA adapters the run starts from
  std::string sft_dataset_name;             // a local JSONL or JSON file
  std::string sft_dataset_split = "train";
  data::ChatFormatName sft_conversation_format = data::ChatFormatName::Alpaca;
  bool enable_packed_sequences = false;  // several conversations per sequence, first-fit decreasing
  bool use_packed_attention = false;     // attention kept within each packed conversation, positions restarting
  // DPO (stage: dpo; TRL's beta, loss_type, label_smoothing)
  double dpo_beta = 0.1;
  DpoLossType dpo_loss_type = DpoLossType::Sigmoid;
  double dpo_label_smoothing = 0.0;
  // engine
  Recompute recompute_granularity = Recompute::None;  // "": none
  std::string device = "auto";
  bool bf16 = false;                 // bf16 mixed precision (the GPU backend's precision)
  std::string gemm_tuning_cache;     // GEMM tuning file for the GPU (benchmark gemm --tune writes it)
  bool gemm_online_tuning = false;   // time GEMM algorithms on first use and keep the fastest
  // parallelism (Megatron's names; the layout is checked in plan/parallel_layout.h)
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t virtual_pipeline_model_parallel_size = 0;  // 0: the schedule's default
  // Megatron's names of the chunks per rank (resolve_virtual_pipeline in experiment.cpp); 0: unset
  int64_t num_virtual_stages_per_pipeline_rank = 0;
  int64_t num_layers_per_virtual_pipeline_stage = 0;
  int64_t context_parallel_size = 1;
  CpComm cp_comm_type = CpComm::P2P;  // p2p (ring attention) | a2a (all-to-all over heads)
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;  // 0 (or null): tensor_model_parallel_size, as Megatron
  bool sequence_parallel = false;
  std::string pipeline_schedule = "1f1b";
  int64_t decoder_first_pipeline_num_layers = 0;
  int64_t decoder_last_pipeline_num_layers = 0;
  std::string pipeline_model_parallel_layout;  // Megatron's "Et*3|t*4|...,L" (pipeline/partition.h); empty: unset
  PipelineBalance pipeline_balance = PipelineBalance::None;  // none | auto (plan/parallel_layout.h)
  int64_t zero_bubble_max_pending_backward = 0;   // zb-auto's memory limit; 0: pp (ZB-1p)
  bool use_distributed_optimizer = false;
  // no_shard | optim | optim_grads | optim_grads_params; unset: optim when use_distributed_optimizer
  DpSharding data_parallel_sharding_strategy = DpSharding::Unset;
  bool use_torch_fsdp2 = false;  // Primus recipes' alias of optim_grads_params
  // optim_grads_params: false keeps a unit gathered from its forward to its backward (Megatron's key)
  bool torch_fsdp2_reshard_after_forward = true;
  // optim_grads / optim_grads_params: whole gradients through the step, one reduce-scatter per unit
  bool reduce_sharded_grads_once_per_step = false;
  // MPI's progress thread (parallel/mpi_process_group.h): microseconds between progress passes; 0: none
  int64_t mpi_progress_interval_us = 100;
  bool overlap_grad_reduce = true;
  int64_t ddp_bucket_size = 0;  // elements; 0: max(40M, 1M x dp) as Megatron
  // FP8 linear layers (docs/fp8.md): Megatron's keys with Primus's defaults (trainer_base.yaml)
  Fp8Mode fp8 = Fp8Mode::Off;  // null | e4m3 | hybrid
  Fp8Recipe fp8_recipe = Fp8Recipe::Delayed;
  int64_t fp8_margin = 0;
  int64_t fp8_amax_history_len = 1024;
  fp8::AmaxAlgo fp8_amax_compute_algo = fp8::AmaxAlgo::Max;
  bool fp8_wgrad = true;
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  bool fp8_param_gather = false;
  bool fp8_output_layer = false;  // this engine's: the output layer in FP8 too (torchtitan's float8 default)
  // Primus's `lora:` block (config/lora.h): adapters on the named linears, the rest frozen
  LoraOptions lora;
  // profiling (Megatron's names; trace/profiler.h)
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int64_t> profile_ranks = {0};
  // TensorBoard event files (Megatron's and Primus's names; safe/tensorboard.h)
  std::string tensorboard_dir;      // "": none, unless disable_tensorboard is false
  bool disable_tensorboard = true;  // Primus: false writes them to <run dir>/tensorboard
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_timers_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool log_loss_scale_to_tensorboard = true;
  bool log_learning_rate_to_tensorboard = true;
  bool log_batch_size_to_tensorboard = true;
};

using FieldRef =
    std::variant<int64_t TrainingArgs::*, double TrainingArgs::*, bool TrainingArgs::*, std::string TrainingArgs::*,
                 std::vector<std::string> TrainingArgs::*, std::vector<int64_t> TrainingArgs::*,
                 Recompute TrainingArgs::*, CpComm TrainingArgs::*, DpSharding TrainingArgs::*, Fp8Mode TrainingArgs::*,
                 Fp8Recipe TrainingArgs::*, fp8::AmaxAlgo TrainingArgs::*, TrainStage TrainingArgs::*,
                 DpoLossType TrainingArgs::*, data::ChatFormatName TrainingArgs::*, PipelineBalance TrainingArgs::*,
                 OptimDtype TrainingArgs::*>;
struct KeyInfo {
  const char* name;
  FieldRef field;
  const char* help;
};
const std::vector<KeyInfo>& training_keys();

struct ExperimentConfig {
  std::string config_file;
  std::string work_group, user_name, exp_name, workspace;
  // Primus's top-level `env:` block: variables the task sets for the run (train pretrain exports them).
  std::vector<std::pair<std::string, std::string>> env;
  std::string model;  // as written: preset name or path
  bool post_trainer = false;  // the module is modules.post_trainer (train posttrain), else pre_trainer
  ModelSpec model_spec;
  TrainingArgs train;
  YamlTree tree;      // the resolved YAML, for --print-config and checkpoints
  // Megatron/Primus keys set in the config that this engine accepts with no effect, listed once
  // at start-up and in --print-config.
  struct NoEffectKey {
    std::string key, value, note;
  };
  std::vector<NoEffectKey> no_effect;
  // framework torchtitan / maxtext (config/dialect.h): each key as written and what it became.
  DialectRecord dialect;

  std::string run_dir() const;          // <workspace>/<exp_name>
  std::string checkpoint_dir() const;   // train.save or <run_dir>/checkpoints
  std::string resolved_yaml() const;    // the whole config, model spec included
};

// Loads `path`, applies command-line overrides given as (key, value) pairs (a key is a training
// or model key, a top-level key, a dotted path, or a key of the config's dialect), validates
// everything. `world_size`: the ranks that will train (0: not known), which a torchtitan or
// MaxText config's "the ranks left over" degrees and per-device batches are resolved against.
ExperimentConfig load_experiment(const std::string& path,
                                 const std::vector<std::pair<std::string, std::string>>& overrides = {},
                                 int world_size = 0);

// Markdown table of every training key (name, type, default, meaning).
std::string training_keys_reference();
// Markdown table of every Megatron-LM and Primus argument name with its status here (applied,
// no effect, not supported; config/foreign_keys.h).
std::string argument_status_reference();
// The start-up line listing the no-effect keys of `cfg` ("" when there are none).
std::string no_effect_summary(const ExperimentConfig& cfg);

}  // namespace primus::config
