// `framework: torchtitan`: torchtitan's JobConfig sections as Primus writes them, translated into
// this engine's keys. Names, defaults and model flavours are those of pytorch/torchtitan at
// 73a0e697 (torchtitan/config/job_config.py, torchtitan/models/*/__init__.py,
// torchtitan/components/lr_scheduler.py), the commit AMD-AGI/Primus fd1eeabb pins, with Primus's
// additions (training.mock_data, the primus_turbo section, the module keys of
// primus/configs/modules/module_base.yaml). Older torchtitan's top-level `float8` section is
// listed too (refused, as FP8).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "config/dialect.h"
#include "core/error.h"

namespace primus::config {
namespace {

constexpr KeyStatus A = KeyStatus::Applied, N = KeyStatus::NoEffect, X = KeyStatus::NotSupported;

const char* const kLogging = "logging, metrics, profiling or job bookkeeping that this engine does its own way";
const char* const kKernels =
    "a kernel, compiler or backend choice; this engine runs its own kernels with the same math";
const char* const kTuning = "performance or communication tuning; the result does not depend on it here";
const char* const kMemory =
    "a memory-saving choice; the result does not depend on it (this engine's: recompute_granularity, "
    "data_parallel_sharding_strategy)";
const char* const kStorage =
    "checkpoint format or bookkeeping; this engine writes its own checkpoints (docs/checkpoints.md)";
const char* const kData = "torchtitan's Hugging Face data loading; this engine reads Megatron-format data (data_path)";
const char* const kFp8Moe = "FP8 / MX training of MoE experts' grouped GEMMs (FP8 on torchtitan's MoE flavours is not mapped)";
const char* const kFp8Same =
    "a communication choice: the FP8 values are the same either way, a weight's tensorwise scale coming from the "
    "whole weight's amax";
const char* const kFp8Filter =
    "applied: \"output\" keeps the output layer in bf16, its absence puts it in FP8 (fp8_output_layer); other "
    "entries are refused";
const char* const kValidation = "configures torchtitan's validation loop, which is refused (validation.enable)";
const char* const kFt = "TorchFT fault tolerance (replica groups) is not built; this engine restarts from checkpoints "
                        "(--max-restarts)";
const char* const kNotBuilt = "not implemented by this engine";

// clang-format off
const std::vector<DialectKey>& table() {
  static const std::vector<DialectKey> keys = {
      {"activation_checkpoint.debug", N, "false", kLogging},
      {"activation_checkpoint.determinism_check", N, "default", kTuning},
      {"activation_checkpoint.early_stop", N, "false", kMemory},
      {"activation_checkpoint.memory_budget", N, "0.5", kMemory},
      {"activation_checkpoint.mode", A, "selective", "recompute_granularity (none: none; selective and memory_budget: selective; full: full)"},
      {"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", N, "[moe.router.gate]", kMemory},
      {"activation_checkpoint.preserve_rng_state", N, "true", kTuning},
      {"activation_checkpoint.selective_ac_option", N, "2", kMemory},
      {"activation_checkpoint.visualize_memory_budget_pareto", N, "false", kLogging},
      {"checkpoint.async_mode", N, "disabled", kStorage},
      {"checkpoint.create_seed_checkpoint", X, "false", "a seed-checkpoint run (no training) is not built; `checkpoint export` writes weights"},
      {"checkpoint.enable", A, "false", "save_interval (false: the engine's end-of-run checkpoint only; true: every checkpoint.interval steps)"},
      {"checkpoint.enable_first_step_checkpoint", N, "false", kStorage},
      {"checkpoint.enable_ft_dataloader_checkpoints", N, "true", kStorage},
      {"checkpoint.exclude_from_loading", X, "[]", "partial loading of torchtitan checkpoints is not built (finetune loads weights only)"},
      {"checkpoint.export_dtype", N, "float32", kStorage},
      {"checkpoint.folder", N, "checkpoint", "this engine saves to <workspace>/<exp_name>/checkpoints (or save)"},
      {"checkpoint.initial_load_in_hf", X, "false", "Hugging Face weights come in through `checkpoint import`, then pretrained_checkpoint"},
      {"checkpoint.initial_load_in_hf_quantized", X, "false", "Hugging Face weights come in through `checkpoint import`, then pretrained_checkpoint"},
      {"checkpoint.initial_load_model_only", N, "true", kStorage},
      {"checkpoint.initial_load_path", X, "null", "torchtitan's DCP checkpoints are not read; this engine starts from its own (load, pretrained_checkpoint)"},
      {"checkpoint.interval", A, "500", "save_interval when checkpoint.enable"},
      {"checkpoint.keep_latest_k", A, "10", "keep_last_checkpoints (0: keep all)"},
      {"checkpoint.last_save_in_hf", N, "false", kStorage},
      {"checkpoint.last_save_model_only", N, "true", kStorage},
      {"checkpoint.load_only", X, "false", "a load-only run is not built"},
      {"checkpoint.load_step", X, "-1", "resuming from a chosen step is not built; this engine resumes from the newest checkpoint (or load)"},
      {"comm.init_timeout_seconds", N, "300", kTuning},
      {"comm.mode", X, "default", "fake and local-tensor communication modes are not built"},
      {"comm.save_traces_file_prefix", N, "rank_", kLogging},
      {"comm.save_traces_folder", N, "comm_traces", kLogging},
      {"comm.trace_buf_size", N, "20000", kLogging},
      {"comm.train_timeout_seconds", N, "100", kTuning},
      {"compile.backend", N, "inductor", kKernels},
      {"compile.components", N, "[model, loss]", kKernels},
      {"compile.enable", N, "false", kKernels},
      {"debug.deterministic", N, "false", "this engine's runs are deterministic for a given layout"},
      {"debug.deterministic_warn_only", N, "false", kLogging},
      {"debug.moe_force_load_balance", A, "false", "moe_router_force_load_balancing (MoE models only)"},
      {"debug.seed", A, "null", "seed (null: this engine's default seed)"},
      {"experimental.custom_args_module", N, "", "a Python extension point; Primus's primus_turbo section is read here directly"},
      {"experimental.custom_import", X, "\"\"", "importing Python code (models, components) is not possible in this engine"},
      {"fault_tolerance.enable", X, "false", kFt},
      {"fault_tolerance.group_size", N, "0", kFt},
      {"fault_tolerance.min_replica_size", N, "1", kFt},
      {"fault_tolerance.process_group", N, "gloo", kFt},
      {"fault_tolerance.process_group_timeout_ms", N, "10000", kFt},
      {"fault_tolerance.replica_id", N, "0", kFt},
      {"fault_tolerance.semi_sync_method", X, "null", kFt},
      {"file_sink_level", N, "DEBUG", kLogging},
      {"float8.emulate", N, "false", "this engine's FP8 is an exact emulation on every device (docs/fp8.md)"},
      {"float8.enable_fsdp_float8_all_gather", N, "false", kFp8Same},
      {"float8.filter_fqns", A, "[]", kFp8Filter},
      {"float8.moe_fqns_prototype", X, "[]", kFp8Moe},
      {"float8.precompute_float8_dynamic_scale_for_fsdp", N, "false", kFp8Same},
      {"float8.recipe_name", A, "null", "with the float8 converter: null and tensorwise: fp8 hybrid, fp8_recipe tensorwise; rowwise scaling is refused"},
      {"job.config_file", N, "null", kLogging},
      {"job.custom_config_module", N, "", "a Python extension point; Primus's primus_turbo section is read here directly"},
      {"job.description", N, "default job", kLogging},
      {"job.dump_folder", N, "./outputs", "this engine writes to <workspace>/<exp_name>/"},
      {"job.print_config", N, "false", "--print-config prints the resolved config"},
      {"job.save_config_file", N, "null", "this engine saves the resolved config as <workspace>/<exp_name>/config.yaml"},
      {"lr_scheduler.decay_ratio", A, "null", "lr_wsd_decay_iters (round(steps x decay_ratio); null: every step after the warmup)"},
      {"lr_scheduler.decay_type", A, "linear", "lr_wsd_decay_style (linear: linear, sqrt: minus_sqrt, cosine: cosine)"},
      {"lr_scheduler.min_lr_factor", A, "0.0", "min_lr = optimizer.lr x min_lr_factor"},
      {"lr_scheduler.total_steps", A, "null", "lr_decay_iters (null: training.steps)"},
      {"lr_scheduler.warmup_steps", A, "200", "lr_warmup_init = lr / warmup_steps, lr_warmup_iters = warmup_steps - 1 (torchtitan's first step already runs at lr / warmup_steps)"},
      {"memory_estimation.disable_fake_mode", N, "false", kLogging},
      {"memory_estimation.enable", N, "false", "this engine checks memory before starting ranks (docs/stability.md)"},
      {"metrics.disable_color_printing", N, "false", kLogging},
      {"metrics.enable_tensorboard", N, "false", kLogging},
      {"metrics.enable_wandb", N, "false", kLogging},
      {"metrics.log_freq", A, "10", "log_interval"},
      {"metrics.save_for_all_ranks", N, "false", kLogging},
      {"metrics.save_tb_folder", N, "tb", kLogging},
      {"model.converters", A, "[]", "primus_turbo: no effect (kernels); quantize.linear.float8 (or float8): fp8 hybrid with tensorwise scaling; quantize.linear.mx: fp8 e4m3, fp8_recipe mxfp8 (docs/fp8.md)"},
      {"model.flavor", A, "debugmodel", "the model preset, with model.name (docs/config.md lists the flavours)"},
      {"model.hf_assets_path", N, "./tests/assets/tokenizer", "Hugging Face assets (tokenizer, weights); this engine's: tokenizer_type and tokenizer_model, `checkpoint import`"},
      {"model.name", A, "llama3", "the model preset, with model.flavor"},
      {"model.print_after_conversion", N, "false", kLogging},
      {"model.tokenizer_path", N, "null", "this engine's tokenizer keys are tokenizer_type and tokenizer_model"},
      {"optimizer.beta1", A, "0.9", "adam_beta1"},
      {"optimizer.beta2", A, "0.95", "adam_beta2"},
      {"optimizer.early_step_in_backward", X, "false", "stepping the optimizer inside the backward pass (no global gradient clipping) is not built"},
      {"optimizer.eps", A, "1e-08", "adam_eps"},
      {"optimizer.implementation", N, "fused", kKernels},
      {"optimizer.lr", A, "0.0008", "lr"},
      {"optimizer.name", A, "AdamW", "AdamW only (with decay_norms_and_biases: torchtitan decays every parameter)"},
      {"optimizer.weight_decay", A, "0.1", "weight_decay, with decay_norms_and_biases: true"},
      {"parallelism.context_parallel_degree", A, "1", "context_parallel_size (ring attention: cp_comm_type p2p)"},
      {"parallelism.context_parallel_load_balancer", N, "headtail", "this engine balances causal attention over cp with two chunks per rank (head and tail)"},
      {"parallelism.context_parallel_rotate_method", N, "allgather", kTuning},
      {"parallelism.data_parallel_replicate_degree", A, "1", "the data-parallel size (with the shard degree; HSDP, both above 1, is refused)"},
      {"parallelism.data_parallel_shard_degree", A, "-1", "the data-parallel size; above 1: data_parallel_sharding_strategy optim_grads_params (FSDP). -1: the ranks left over"},
      {"parallelism.disable_loss_parallel", N, "false", kTuning},
      {"parallelism.enable_async_tensor_parallel", N, "false", kTuning},
      {"parallelism.expert_parallel_comm_backend", N, "standard", kTuning},
      {"parallelism.expert_parallel_degree", A, "1", "expert_model_parallel_size"},
      {"parallelism.expert_tensor_parallel_degree", A, "1", "expert_tensor_parallel_size"},
      {"parallelism.fsdp_reshard_after_forward", A, "default", "torch_fsdp2_reshard_after_forward: never is false; default and always are true (FSDP2's default under no pipeline stages)"},
      {"parallelism.module_fqns_per_model_part", N, "null", "how layers are split over pipeline stages; the result does not depend on it (this engine's: decoder_first/last_pipeline_num_layers, pipeline_balance)"},
      {"parallelism.pipeline_parallel_degree", A, "1", "pipeline_model_parallel_size"},
      {"parallelism.pipeline_parallel_expert_parallel_overlap", N, "true", kTuning},
      {"parallelism.pipeline_parallel_first_stage_less_layers", N, "1", "how layers are split over pipeline stages; the result does not depend on it (this engine's: decoder_first/last_pipeline_num_layers, pipeline_balance)"},
      {"parallelism.pipeline_parallel_last_stage_less_layers", N, "1", "how layers are split over pipeline stages; the result does not depend on it (this engine's: decoder_first/last_pipeline_num_layers, pipeline_balance)"},
      {"parallelism.pipeline_parallel_layers_per_stage", N, "null", "how layers are split over pipeline stages; the result does not depend on it (this engine's: decoder_first/last_pipeline_num_layers, pipeline_balance)"},
      {"parallelism.pipeline_parallel_microbatch_size", A, "1", "micro_batch_size when pipeline_parallel_degree > 1"},
      {"parallelism.pipeline_parallel_schedule", A, "1F1B", "pipeline_schedule (1F1B, Interleaved1F1B, GPipe, ZBVZeroBubble, DualPipeV)"},
      {"parallelism.pipeline_parallel_schedule_csv", X, "\"\"", "a pipeline schedule read from a CSV file is not built (this engine's schedules: pipeline_schedule)"},
      {"parallelism.tensor_parallel_degree", A, "1", "tensor_model_parallel_size, with sequence_parallel as torchtitan's tensor parallelism"},
      {"primus_turbo.enable_attention_float8", X, "false", "FP8 attention is not built (attention stays in bf16; docs/fp8.md)"},
      {"primus_turbo.enable_embedding_autocast", N, "true", kKernels},
      {"primus_turbo.enable_primus_turbo", A, "false", "Turbo's kernels, with this engine's math; on MoE flavours read with use_moe_fp8"},
      {"primus_turbo.use_classic_attention", N, "false", kKernels},
      {"primus_turbo.use_moe_fp8", A, "true", "Turbo's FP8 grouped GEMM for the experts: refused on MoE flavours when enable_primus_turbo and use_turbo_grouped_mm are on, else no effect"},
      {"primus_turbo.use_turbo_async_tp", N, "false", kKernels},
      {"primus_turbo.use_turbo_attention", N, "false", kKernels},
      {"primus_turbo.use_turbo_float8_linear", N, "false", "Turbo's kernel for FP8 linears; this engine runs its own, with the same math"},
      {"primus_turbo.use_turbo_grouped_mm", A, "false", "Turbo's grouped GEMM, with this engine's math; on MoE flavours read with use_moe_fp8"},
      {"primus_turbo.use_turbo_mx_linear", N, "false", "Turbo's kernel for MX linears; this engine runs its own, with the same math"},
      {"profiling.enable_memory_snapshot", N, "false", kLogging},
      {"profiling.enable_profiling", N, "false", "torchtitan's profiler; this engine's: profile, profile_step_start, profile_step_end (docs/profiling.md)"},
      {"profiling.profile_freq", N, "10", kLogging},
      {"profiling.profiler_active", N, "1", kLogging},
      {"profiling.profiler_warmup", N, "3", kLogging},
      {"profiling.save_memory_snapshot_folder", N, "memory_snapshot", kLogging},
      {"profiling.save_traces_folder", N, "profile_traces", kLogging},
      {"quantize.grouped_mm.float8.fqns", X, "[]", kFp8Moe},
      {"quantize.grouped_mm.mx.fqns", X, "[]", kFp8Moe},
      {"quantize.grouped_mm.mx.recipe_name", N, "mxfp8", kFp8Moe},
      {"quantize.linear.float8.emulate", N, "false", "this engine's FP8 is an exact emulation on every device (docs/fp8.md)"},
      {"quantize.linear.float8.enable_fsdp_float8_all_gather", N, "false", kFp8Same},
      {"quantize.linear.float8.filter_fqns", A, "[]", kFp8Filter},
      {"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", N, "false", kFp8Same},
      {"quantize.linear.float8.recipe_name", A, "null", "with the quantize.linear.float8 converter: null and tensorwise: fp8 hybrid, fp8_recipe tensorwise; rowwise scaling is refused"},
      {"quantize.linear.mx.filter_fqns", A, "[output]", kFp8Filter},
      {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", N, "triton", kKernels},
      {"quantize.linear.mx.recipe_name", A, "mxfp8_cublas", "with the quantize.linear.mx converter: mxfp8_cublas_rceil (scales rounded up, as this engine's): fp8 e4m3, fp8_recipe mxfp8; the recipes that round scales down (mxfp8_cublas, mxfp8_emulated) and MXFP4 are refused"},
      {"sink_level", N, "null", kLogging},
      {"stderr_sink_level", N, "INFO", kLogging},
      {"trainable", N, "false", "Primus's module flag; this engine's task decides what runs"},
      {"training.dataloader.num_workers", N, "0", kTuning},
      {"training.dataloader.persistent_workers", N, "false", kTuning},
      {"training.dataloader.pin_memory", N, "false", kTuning},
      {"training.dataloader.prefetch_factor", N, "null", kTuning},
      {"training.dataset", A, "c4_test", "with mock_data false: refused (a Hugging Face dataset) unless this engine's data_path is given"},
      {"training.dataset_path", A, "null", "with mock_data false: refused (a Hugging Face dataset) unless this engine's data_path is given"},
      {"training.dtype", X, "float32", "full bf16 training (bf16 parameters and optimizer state) is not built; this engine's bf16 keeps fp32 master weights (training.mixed_precision_param)"},
      {"training.enable_cpu_offload", N, "false", kMemory},
      {"training.gc_debug", N, "false", kTuning},
      {"training.gc_freq", N, "50", kTuning},
      {"training.global_batch_size", A, "-1", "global_batch_size (-1: local_batch_size x the data-parallel size)"},
      {"training.local_batch_size", A, "8", "micro_batch_size (per rank; with pipeline parallelism the pipeline's microbatch size is)"},
      {"training.max_norm", A, "1.0", "clip_grad"},
      {"training.mixed_precision_param", A, "bfloat16", "bf16 (bfloat16: true, float32: false)"},
      {"training.mixed_precision_reduce", X, "float32", "gradients are reduced in fp32 here"},
      {"training.mock_data", A, "false", "mock_data (Primus's key)"},
      {"training.seq_len", A, "2048", "seq_length"},
      {"training.steps", A, "10000", "train_iters"},
      {"validation.dataloader.num_workers", N, "0", kValidation},
      {"validation.dataloader.persistent_workers", N, "false", kValidation},
      {"validation.dataloader.pin_memory", N, "false", kValidation},
      {"validation.dataloader.prefetch_factor", N, "null", kValidation},
      {"validation.dataset", N, "c4_validation", kValidation},
      {"validation.dataset_path", N, "null", kValidation},
      {"validation.enable", A, "false", "false: eval_interval 0; true is refused (torchtitan's validation set, batch and length are not mapped; this engine's: eval_interval, eval_iters)"},
      {"validation.freq", N, "10", kValidation},
      {"validation.local_batch_size", N, "8", kValidation},
      {"validation.seq_len", N, "2048", kValidation},
      {"validation.steps", N, "-1", kValidation},
  };
  return keys;
}
// clang-format on

// How a torchtitan MoE flavour scores the experts (its MoEArgs' score_func and route_norm).
enum class TitanScores {
  Softmax,            // softmax over all experts before the top-k, not renormalised
  SoftmaxRouteNorm,   // the same, the chosen scores renormalised (route_norm)
  Sigmoid,            // sigmoid scores, renormalised for top-k > 1 (the preset's own routing)
};

// torchtitan's MoE layers (models/moe/moe.py) on this engine's router: no auxiliary loss; the
// aux-loss-free expert bias (load_balance_coeff 1e-3, MoEArgs' default, which no flavour changes)
// added to the scores for the choice only and moved once per optimizer step by the sign of each
// expert's load against the mean, centred on its mean (components/optimizer.py); the scores as the
// flavour's row of the table says. route_scale and the node-limited groups are the presets'
// moe_router_topk_scaling_factor and moe_router_num_groups / moe_router_group_topk.
void titan_moe(DialectSettings& s, TitanScores scores) {
  const std::vector<std::string> from = {"model.name", "model.flavor"};
  s.set("moe_router_load_balancing_type", YAML::Node("none"), from);
  s.set("moe_aux_loss_coeff", YAML::Node(0), from);
  s.set("moe_router_enable_expert_bias", YAML::Node(true), from);
  s.set("moe_router_bias_update_rate", yaml_number(1e-3), from);
  s.set("moe_router_bias_update_centered", YAML::Node(true), from);
  if (scores != TitanScores::Sigmoid) {
    s.set("moe_router_pre_softmax", YAML::Node(true), from);
    s.set("moe_router_norm_topk_prob", YAML::Node(scores == TitanScores::SoftmaxRouteNorm), from);
  }
}

void qwen3_moe(DialectSettings& s, TitanScores scores) {
  titan_moe(s, scores);
  // torchtitan's 235B-A22B flavour sets rope_theta 5e6 (the 30B-A3B one, like the preset, 1e6).
  if (s.text("model.flavor") == "235B-A22B")
    s.set("rotary_base", YAML::Node(5000000), {"model.name", "model.flavor"});
}

// torchtitan's deepseek_v3 flavours (models/deepseek_v3/model/args.py): RMSNorm eps 1e-5; YaRN
// (factor 40 over 4096 positions) only when training.seq_len exceeds 4096, with the attention's
// softmax scale multiplied by (0.1 mscale ln 40 + 1)^2 (mscale 0.70 for 16B, else 1.0); attention
// within each document (block_causal) for every flavour at this commit, which torchtitan runs
// without context parallelism.
void deepseek_moe(DialectSettings& s, TitanScores scores) {
  titan_moe(s, scores);
  const std::vector<std::string> from = {"model.name", "model.flavor"};
  s.set("norm_epsilon", yaml_number(1e-5), from);
  s.set("mtp_num_layers", YAML::Node(0), from);  // torchtitan's flavours have no multi-token prediction
  if (s.integer("training.seq_len") <= 4096) {
    s.set("rotary_scaling_factor", YAML::Node(1), {"model.flavor", "training.seq_len"});
  } else {
    const double mscale = s.text("model.flavor") == "16B" ? 0.70 : 1.0;
    s.set("mscale", yaml_number(mscale), from);
    s.set("mscale_all_dim", yaml_number(mscale), from);
  }
  s.set("reset_attention_mask", YAML::Node(true), from);
  if (s.integer("parallelism.context_parallel_degree") > 1)
    s.refuse("parallelism.context_parallel_degree",
             "torchtitan's deepseek_v3 flavours attend within each document (flex attention, block_causal), which "
             "torchtitan runs without context parallelism");
}

// torchtitan's llama4 17bx16e and 17bx128e flavours (models/llama4): Meta's shapes (the
// llama4_17B16E and llama4_17B128E presets: experts of 8192 from its auto-scaled hidden dim, a
// shared expert, sigmoid top-1 scores on the experts' input, Scout's rope scaling) with
// torchtitan's MoE routing, global attention with RoPE on every layer, and neither the QK L2-norm
// nor the attention temperature, which torchtitan's model does not have.
void llama4_moe(DialectSettings& s, TitanScores scores) {
  titan_moe(s, scores);
  const std::vector<std::string> from = {"model.name", "model.flavor"};
  s.set("qk_l2_norm", YAML::Node(false), from);
  s.set("attn_temperature_tuning", YAML::Node(false), from);
  s.set("no_rope_freq", YAML::Node(YAML::NodeType::Null), from);
  s.set("attention_chunk_size", YAML::Node(YAML::NodeType::Null), from);
}

// A torchtitan flavour on this engine: the preset (and, for MoE flavours, what differs from it),
// or why it is refused.
struct Flavour {
  const char* name;
  const char* flavor;
  const char* preset;  // nullptr: refused with `why`
  const char* why;
  void (*moe)(DialectSettings&, TitanScores) = nullptr;  // an MoE flavour: torchtitan's routing on the preset
  TitanScores scores = TitanScores::Sigmoid;              // an MoE flavour's expert scores
};

const char* const kLlama4Other =
    "torchtitan's llama4 debug flavours (dim 256, 6 layers) have no preset on this engine, and its _irope flavours "
    "(NoPE on layers 0, 4, 8, ..., which no_rope_freq's rule cannot say for every layer count) are not mapped; its "
    "17bx16e and 17bx128e flavours map onto llama4_17B16E and llama4_17B128E";
const char* const kGptOssDebug =
    "torchtitan's gpt_oss debugmodel (dim 256, 4 layers, 8 experts) has no preset on this engine; its 20b and 120b "
    "flavours map onto gpt_oss_20B and gpt_oss_120B";

// clang-format off
const std::vector<Flavour>& flavours() {
  static const std::vector<Flavour> f = {
      // torchtitan's llama3 always applies Llama 3.1's rotary scaling: the Llama 3.1 presets.
      {"llama3", "8B", "llama3.1_8B", nullptr},
      {"llama3", "70B", "llama3.1_70B", nullptr},
      {"llama3", "405B", "llama3.1_405B", nullptr},
      {"qwen3", "0.6B", "qwen3_0.6B", nullptr},
      {"qwen3", "1.7B", "qwen3_1.7B", nullptr},
      {"qwen3", "4B", "qwen3_4B", nullptr},
      {"qwen3", "8B", "qwen3_8B", nullptr},
      {"qwen3", "14B", "qwen3_14B", nullptr},
      {"qwen3", "32B", "qwen3_32B", nullptr},
      {"qwen3", "30B-A3B", "qwen3_30B_A3B", nullptr, qwen3_moe, TitanScores::SoftmaxRouteNorm},
      {"qwen3", "235B-A22B", "qwen3_235B_A22B", nullptr, qwen3_moe, TitanScores::SoftmaxRouteNorm},
      // DeepSeek-V2-Lite's and DeepSeek-V2's shapes under the deepseek_v3 model.
      {"deepseek_v3", "16B", "deepseek_v2_lite", nullptr, deepseek_moe, TitanScores::Softmax},
      {"deepseek_v3", "236B", "deepseek_v2", nullptr, deepseek_moe, TitanScores::Softmax},
      {"deepseek_v3", "671B", "deepseek_v3", nullptr, deepseek_moe, TitanScores::Sigmoid},
      {"llama4", "17bx16e", "llama4_17B16E", nullptr, llama4_moe, TitanScores::Sigmoid},
      {"llama4", "17bx128e", "llama4_17B128E", nullptr, llama4_moe, TitanScores::Sigmoid},
      {"llama4", "*", nullptr, kLlama4Other},
      // gpt-oss (models/gpt_oss): OpenAI's models as the presets hold them (sinks, a 128-key window on
      // layers 0, 2, ..., biases, the clamped GLU, unrounded YaRN of factor 32); softmax scores
      // renormalised over the top 4, with the router's bias (gate_bias).
      {"gpt_oss", "20b", "gpt_oss_20B", nullptr, titan_moe, TitanScores::SoftmaxRouteNorm},
      {"gpt_oss", "120b", "gpt_oss_120B", nullptr, titan_moe, TitanScores::SoftmaxRouteNorm},
      {"gpt_oss", "*", nullptr, kGptOssDebug},
  };
  return f;
}
// clang-format on

class TorchTitan final : public Dialect {
 public:
  Framework framework() const override { return Framework::TorchTitan; }
  const char* source() const override {
    return "pytorch/torchtitan at 73a0e697 (the commit AMD-AGI/Primus fd1eeabb pins) and AMD-AGI/Primus at fd1eeabb";
  }
  const std::vector<DialectKey>& keys() const override { return table(); }
  void translate(DialectSettings& s) const override {
    const bool moe = model(s);
    const Layout layout = parallel_layout(s, moe);
    batch(s, layout);
    optimizer(s);
    schedule(s);
    data(s);
    rest(s, moe);
  }

 private:
  // model.name and model.flavor -> a preset; returns whether it has MoE layers.
  static bool model(DialectSettings& s) {
    // The FP8 converters' keys, read whether or not their converter is on (as torchtitan does).
    for (const char* k : {"float8.recipe_name", "float8.filter_fqns", "quantize.linear.float8.recipe_name",
                          "quantize.linear.float8.filter_fqns", "quantize.linear.mx.recipe_name",
                          "quantize.linear.mx.filter_fqns"})
      s.node(k);
    // Turbo's FP8 experts, read whether or not the flavour has experts.
    const bool turbo = s.flag("primus_turbo.enable_primus_turbo"), grouped = s.flag("primus_turbo.use_turbo_grouped_mm");
    const bool turbo_fp8_experts = s.flag("primus_turbo.use_moe_fp8") && turbo && grouped;
    std::vector<std::string> converters;  // a list, or torchtitan's comma-separated text
    const YAML::Node list = s.node("model.converters");
    if (list.IsScalar()) {
      for (size_t b = 0, e; b <= list.Scalar().size(); b = e + 1) {
        e = std::min(list.Scalar().find(',', b), list.Scalar().size());
        if (e > b) converters.push_back(list.Scalar().substr(b, e - b));
      }
    } else {
      for (const YAML::Node& c : list) converters.push_back(c.IsScalar() ? c.Scalar() : "(a map)");
    }
    bool fp8 = false;
    for (const std::string& name : converters) {
      if (name == "primus_turbo") continue;
      fp8 = true;  // or refused below
      if (name == "float8" || name == "quantize.linear.float8") {
        float8(s, name + ".");
      } else if (name == "quantize.linear.mx") {
        mx(s);
      } else if (name.find("float8") != std::string::npos || name.find("mx") != std::string::npos) {
        s.refuse("model.converters",
                 fmt::format("the '{}' converter is not built (the FP8 converters mapped: quantize.linear.float8, "
                             "float8, quantize.linear.mx)",
                             name));
      } else {
        s.refuse("model.converters",
                 fmt::format("the '{}' converter is not built (known: primus_turbo, quantize.linear.float8, float8, "
                             "quantize.linear.mx)",
                             name));
      }
    }
    const std::string name = s.text("model.name"), flavor = s.text("model.flavor");
    std::vector<std::string> known;
    for (const auto& f : flavours()) {
      if (f.preset) known.push_back(fmt::format("{} {}", f.name, f.flavor));
      if (name != f.name || (flavor != f.flavor && std::string(f.flavor) != "*")) continue;
      if (!f.preset) s.refuse(flavor == f.flavor ? "model.flavor" : "model.name", f.why);
      s.set_model(f.preset, {"model.name", "model.flavor"});
      if (f.moe) {
        if (fp8)
          s.refuse("model.converters",
                   "FP8 on torchtitan's MoE flavours is not mapped: torchtitan's float8 converter puts the router's "
                   "gate in FP8 and leaves the experts in bf16 (or scales them rowwise, quantize.grouped_mm), while "
                   "this engine's FP8 keeps the router in fp32 and covers the experts with the linears' recipe");
        if (turbo_fp8_experts)
          s.refuse("primus_turbo.use_moe_fp8",
                   "Primus-Turbo's FP8 grouped GEMM for the experts (on with enable_primus_turbo and "
                   "use_turbo_grouped_mm) is not mapped onto this engine's FP8 recipes; set it false for bf16 experts");
        f.moe(s, f.scores);
      }
      return f.moe != nullptr;
    }
    s.refuse("model.flavor", fmt::format("no preset of this engine is torchtitan's {} '{}'; mapped flavours: {}", name,
                                         flavor, fmt::join(known, ", ")));
  }

  // torchao's float8 training as torchtitan configures it: dynamic (current) scaling per tensor,
  // E4M3 for inputs and weights and E5M2 for the output gradients, every linear's three GEMMs in
  // FP8: this engine's fp8 hybrid with fp8_recipe tensorwise. `prefix`: the converter's section.
  static void float8(DialectSettings& s, const std::string& prefix) {
    const std::string recipe = prefix + "recipe_name";
    if (!s.is_null(recipe) && s.text(recipe) != "tensorwise")
      s.refuse(recipe, "rowwise scaling is not built; this engine's FP8 recipes are tensorwise (null), and with "
                       "Megatron's keys delayed, blockwise and mxfp8 (docs/fp8.md)");
    output_filtered(s, prefix + "filter_fqns");
    const std::vector<std::string> from = {"model.converters", recipe};
    s.set("fp8", YAML::Node("hybrid"), from);
    s.set("fp8_recipe", YAML::Node("tensorwise"), from);
  }

  // torchao's MXFP8: E4M3 in blocks of 32 along the reduction dimension with E8M0 scales for all
  // three GEMMs. This engine rounds a block's scale up (TE's rule, torchao's rceil).
  static void mx(DialectSettings& s) {
    const std::string recipe = s.text("quantize.linear.mx.recipe_name");
    if (recipe != "mxfp8_cublas_rceil")
      s.refuse("quantize.linear.mx.recipe_name",
               fmt::format("'{}' is not built: this engine's MXFP8 rounds each block's scale up (the "
                           "mxfp8_cublas_rceil recipe); the recipes that round it down and MXFP4 would train "
                           "other values",
                           recipe));
    output_filtered(s, "quantize.linear.mx.filter_fqns");
    const std::vector<std::string> from = {"model.converters", "quantize.linear.mx.recipe_name"};
    s.set("fp8", YAML::Node("e4m3"), from);
    s.set("fp8_recipe", YAML::Node("mxfp8"), from);
  }

  // filter_fqns: the modules left out of FP8. This engine's FP8 covers every linear of the decoder
  // layers, and the output layer with fp8_output_layer: "output" in the list keeps it in bf16 (as
  // Megatron does), its absence puts it in FP8; other modules are refused.
  static void output_filtered(DialectSettings& s, const std::string& key) {
    bool output = false;
    for (const YAML::Node& f : s.node(key)) {
      const std::string name = f.IsScalar() ? f.Scalar() : "(a map)";
      if (name == "output") {
        output = true;
        continue;
      }
      s.refuse(key, fmt::format("leaving '{}' out of FP8 is not built: FP8 covers every linear of the decoder "
                                "layers (first_last_layers_bf16 keeps whole layers out), and the output layer "
                                "unless \"output\" is listed",
                                name));
    }
    s.set("fp8_output_layer", YAML::Node(!output), {key});
  }

  struct Layout {
    int64_t dp, pp;
  };

  // parallelism.*: the degrees against the launch, FSDP, the pipeline schedule.
  static Layout parallel_layout(DialectSettings& s, bool moe) {
    const int64_t tp = s.integer("parallelism.tensor_parallel_degree");
    const int64_t pp = s.integer("parallelism.pipeline_parallel_degree");
    const int64_t cp = s.integer("parallelism.context_parallel_degree");
    const int64_t replicate = s.integer("parallelism.data_parallel_replicate_degree");
    int64_t shard = s.integer("parallelism.data_parallel_shard_degree");
    for (const char* k : {"parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
                          "parallelism.context_parallel_degree", "parallelism.data_parallel_replicate_degree"})
      if (s.integer(k) < 1) s.refuse(k, "a parallel degree is 1 or more");
    if (shard == 0 || shard < -1)
      s.refuse("parallelism.data_parallel_shard_degree", "1 or more, or -1 (the ranks left over)");
    const int64_t others = tp * pp * cp * replicate;
    if (shard == -1 && !s.world_known()) {
      shard = 1;  // no launch to fill (--print-config, projection): one data-parallel rank
    } else if (shard == -1) {
      if (s.world_size() % others != 0)
        s.refuse("parallelism.data_parallel_shard_degree",
                 fmt::format("-1 takes the ranks left over, but {} ranks are not a multiple of tp x pp x cp x "
                             "data_parallel_replicate_degree = {}",
                             s.world_size(), others));
      shard = s.world_size() / others;
    } else if (s.world_known() && others * shard != s.world_size()) {
      s.refuse("parallelism.data_parallel_shard_degree",
               fmt::format("the degrees ask for {} ranks (tp x pp x cp x replicate x shard), this launch has {}",
                           others * shard, s.world_size()));
    }
    if (replicate > 1 && shard > 1)
      s.refuse("parallelism.data_parallel_replicate_degree",
               "HSDP (replicated and sharded data parallelism at once) is not built; this engine shards over the "
               "whole data-parallel group (data_parallel_shard_degree) or replicates (data_parallel_replicate_degree)");
    const int64_t dp = replicate * shard;
    const std::vector<std::string> degrees = {"parallelism.data_parallel_replicate_degree",
                                              "parallelism.data_parallel_shard_degree"};
    s.set("data_parallel_sharding_strategy", YAML::Node(shard > 1 ? "optim_grads_params" : "no_shard"), degrees);
    const std::string reshard = s.text("parallelism.fsdp_reshard_after_forward");
    if (reshard != "default" && reshard != "always" && reshard != "never")
      s.refuse("parallelism.fsdp_reshard_after_forward",
               fmt::format("'{}' is not one of default, always, never", reshard));
    s.set("torch_fsdp2_reshard_after_forward", YAML::Node(reshard != "never"),
          {"parallelism.fsdp_reshard_after_forward"});
    s.set("tensor_model_parallel_size", YAML::Node(tp), {"parallelism.tensor_parallel_degree"});
    s.set("sequence_parallel", YAML::Node(tp > 1), {"parallelism.tensor_parallel_degree"});
    s.set("pipeline_model_parallel_size", YAML::Node(pp), {"parallelism.pipeline_parallel_degree"});
    s.set("context_parallel_size", YAML::Node(cp), {"parallelism.context_parallel_degree"});
    const int64_t ep = s.integer("parallelism.expert_parallel_degree");
    const int64_t etp = s.integer("parallelism.expert_tensor_parallel_degree");
    if (moe) {  // without MoE layers torchtitan ignores both
      s.set("expert_model_parallel_size", YAML::Node(ep), {"parallelism.expert_parallel_degree"});
      s.set("expert_tensor_parallel_size", YAML::Node(etp), {"parallelism.expert_tensor_parallel_degree"});
    }
    pipeline_schedule(s, pp);
    return {dp, pp};
  }

  // parallelism.pipeline_parallel_schedule: read always; without pipeline stages it has no effect.
  static void pipeline_schedule(DialectSettings& s, int64_t pp) {
    // clang-format off
    static const std::vector<std::pair<const char*, const char*>> schedules = {
        {"1F1B", "1f1b"}, {"Interleaved1F1B", "interleaved-1f1b"}, {"GPipe", "gpipe"}, {"ZBVZeroBubble", "zbv"},
        {"DualPipeV", "dualpipev"}};
    // clang-format on
    const std::string want = s.text("parallelism.pipeline_parallel_schedule");
    if (pp == 1) return;
    auto it = std::find_if(schedules.begin(), schedules.end(), [&](const auto& p) { return want == p.first; });
    if (it == schedules.end())
      s.refuse("parallelism.pipeline_parallel_schedule",
               "not built; the schedules mapped: 1F1B, Interleaved1F1B, GPipe, ZBVZeroBubble, DualPipeV");
    s.set("pipeline_schedule", YAML::Node(it->second), {"parallelism.pipeline_parallel_schedule"});
  }

  // training.local_batch_size and global_batch_size: micro and global batch, length and steps.
  static void batch(DialectSettings& s, const Layout& layout) {
    const int64_t dp = layout.dp, pp = layout.pp;
    const int64_t local = s.integer("training.local_batch_size");
    int64_t global = s.integer("training.global_batch_size");
    if (local < 1) s.refuse("training.local_batch_size", "a batch holds 1 sequence or more");
    if (global == -1) global = local * dp;
    if (global < 1 || global % (local * dp) != 0)
      s.refuse("training.global_batch_size",
               fmt::format("a multiple of local_batch_size x the data-parallel size = {} x {}", local, dp));
    int64_t micro = local;
    std::vector<std::string> micro_from = {"training.local_batch_size"};
    const int64_t pp_micro = s.integer("parallelism.pipeline_parallel_microbatch_size");
    if (pp > 1) {
      if (pp_micro < 1 || local % pp_micro != 0)
        s.refuse("parallelism.pipeline_parallel_microbatch_size",
                 fmt::format("must divide training.local_batch_size ({})", local));
      micro = pp_micro;
      micro_from.push_back("parallelism.pipeline_parallel_microbatch_size");
    }
    s.set("micro_batch_size", YAML::Node(micro), micro_from);
    s.set("global_batch_size", YAML::Node(global), {"training.global_batch_size", "training.local_batch_size"});
    s.set("seq_length", YAML::Node(s.integer("training.seq_len")), {"training.seq_len"});
    s.set("train_iters", YAML::Node(s.integer("training.steps")), {"training.steps"});
  }

  static void optimizer(DialectSettings& s) {
    if (s.text("optimizer.name") != "AdamW")
      s.refuse("optimizer.name", "only AdamW is built (torchtitan's Adam adds weight decay to the gradient instead)");
    s.set("lr", yaml_number(s.number("optimizer.lr")), {"optimizer.lr"});
    s.set("adam_beta1", yaml_number(s.number("optimizer.beta1")), {"optimizer.beta1"});
    s.set("adam_beta2", yaml_number(s.number("optimizer.beta2")), {"optimizer.beta2"});
    s.set("adam_eps", yaml_number(s.number("optimizer.eps")), {"optimizer.eps"});
    s.set("weight_decay", yaml_number(s.number("optimizer.weight_decay")), {"optimizer.weight_decay"});
    s.set("decay_norms_and_biases", YAML::Node(true), {"optimizer.name"});
    s.set("clip_grad", yaml_number(s.number("training.max_norm")), {"training.max_norm"});
  }

  // torchtitan's warmup-stable-decay schedule (components/lr_scheduler.py) as this engine's: its
  // step s (from 0) runs at lr x (s + 1) / warmup while s < warmup, at lr until the decay, then
  // decays over decay_steps with progress (s + 1 - warmup - stable) / decay_steps, where
  // stable = total + 1 - warmup - decay_steps. That is the engine's WSD with lr_warmup_init =
  // lr / warmup, lr_warmup_iters = warmup - 1, lr_decay_iters = total and lr_wsd_decay_iters =
  // decay_steps; without decay steps, the constant style.
  static void schedule(DialectSettings& s) {
    const int64_t steps = s.integer("training.steps");
    const int64_t total = s.is_null("lr_scheduler.total_steps") ? steps : s.integer("lr_scheduler.total_steps");
    if (total < steps)
      s.refuse("lr_scheduler.total_steps",
               "a schedule shorter than training.steps (torchtitan extends its decay past the end) is not built");
    const int64_t warmup = std::min(s.integer("lr_scheduler.warmup_steps"), total);  // torchtitan clamps too
    if (warmup < 0) s.refuse("lr_scheduler.warmup_steps", "must not be negative");
    int64_t decay = total - warmup;
    if (!s.is_null("lr_scheduler.decay_ratio")) {
      const double ratio = s.number("lr_scheduler.decay_ratio");
      if (ratio < 0 || ratio > 1) s.refuse("lr_scheduler.decay_ratio", "a fraction of the steps, in [0, 1]");
      decay = std::min<int64_t>(int64_t(std::nearbyint(double(total) * ratio)), total - warmup);
    }
    static const std::vector<std::pair<const char*, const char*>> styles = {{"linear", "linear"},
                                                                            {"sqrt", "minus_sqrt"},
                                                                            {"cosine", "cosine"}};
    const std::string type = s.text("lr_scheduler.decay_type");
    auto style = std::find_if(styles.begin(), styles.end(), [&](const auto& p) { return type == p.first; });
    if (style == styles.end()) s.refuse("lr_scheduler.decay_type", "one of linear, sqrt, cosine");
    const double lr = s.number("optimizer.lr"), factor = s.number("lr_scheduler.min_lr_factor");
    if (factor < 0 || factor > 1) s.refuse("lr_scheduler.min_lr_factor", "a fraction of the learning rate, in [0, 1]");
    const std::vector<std::string> w = {"lr_scheduler.warmup_steps", "optimizer.lr"};
    s.set("lr_warmup_init", yaml_number(warmup > 0 ? lr / double(warmup) : 0.0), w);
    s.set("lr_warmup_iters", YAML::Node(std::max<int64_t>(warmup - 1, 0)), w);
    s.set("min_lr", yaml_number(lr * factor), {"lr_scheduler.min_lr_factor", "optimizer.lr"});
    const std::vector<std::string> d = {"lr_scheduler.decay_ratio", "lr_scheduler.decay_type",
                                        "lr_scheduler.total_steps"};
    if (decay == 0) {
      s.set("lr_decay_style", YAML::Node("constant"), d);
      return;
    }
    s.set("lr_decay_style", YAML::Node("WSD"), d);
    s.set("lr_wsd_decay_style", YAML::Node(style->second), d);
    s.set("lr_decay_iters", YAML::Node(total), d);
    s.set("lr_wsd_decay_iters", YAML::Node(decay), d);
  }

  static void data(DialectSettings& s) {
    const bool mock = s.flag("training.mock_data");
    const std::vector<std::string> from = {"training.mock_data", "training.dataset", "training.dataset_path"};
    s.text("training.dataset");
    s.text("training.dataset_path");
    if (!mock && !s.has_engine_key("data_path"))
      s.refuse("training.mock_data",
               fmt::format("the data would be torchtitan's Hugging Face dataset '{}', which this engine does not read; "
                           "set training.mock_data: true, ",
                           s.text("training.dataset")) +
                   "or give Megatron-format data with this engine's keys data_path, tokenizer_type and tokenizer_model "
                   "(docs/data.md)");
    s.set("mock_data", YAML::Node(mock), from);
    if (!s.is_null("debug.seed")) s.set("seed", YAML::Node(s.integer("debug.seed")), {"debug.seed"});
    const std::string precision = s.text("training.mixed_precision_param");
    if (precision != "bfloat16" && precision != "float32")
      s.refuse("training.mixed_precision_param", "bfloat16 or float32");
    s.set("bf16", YAML::Node(precision == "bfloat16"), {"training.mixed_precision_param"});
  }

  static void rest(DialectSettings& s, bool moe) {
    s.set("log_interval", YAML::Node(s.integer("metrics.log_freq")), {"metrics.log_freq"});
    if (s.flag("validation.enable"))
      s.refuse("validation.enable",
               "torchtitan's validation loop (its own dataset, batch and length) is not mapped; this engine evaluates "
               "with eval_interval and eval_iters on the valid split of its data");
    s.set("eval_interval", YAML::Node(0), {"validation.enable"});
    const bool save = s.flag("checkpoint.enable");
    const int64_t interval = s.integer("checkpoint.interval");
    s.set("save_interval", YAML::Node(save ? interval : 0), {"checkpoint.enable", "checkpoint.interval"});
    s.set("keep_last_checkpoints", YAML::Node(s.integer("checkpoint.keep_latest_k")), {"checkpoint.keep_latest_k"});
    static const std::vector<std::pair<const char*, const char*>> modes = {
        {"none", ""}, {"selective", "selective"}, {"memory_budget", "selective"}, {"full", "full"}};
    const std::string mode = s.text("activation_checkpoint.mode");
    auto m = std::find_if(modes.begin(), modes.end(), [&](const auto& p) { return mode == p.first; });
    if (m == modes.end()) s.refuse("activation_checkpoint.mode", "one of none, selective, full, memory_budget");
    if (*m->second) s.set("recompute_granularity", YAML::Node(m->second), {"activation_checkpoint.mode"});
    if (s.flag("debug.moe_force_load_balance") && moe)
      s.set("moe_router_force_load_balancing", YAML::Node(true), {"debug.moe_force_load_balance"});
  }
};

}  // namespace

const Dialect& torchtitan_dialect() {
  static const TorchTitan d;
  return d;
}

}  // namespace primus::config
