// `framework: maxtext`: MaxText's keys as Primus writes them (flat, MaxText's base.yml names),
// translated into this engine's keys. Names and defaults are those of MaxText's
// src/maxtext/configs/base.yml at AI-Hypercomputer/maxtext e591f30c (AMD-AGI/Primus fd1eeabb pins
// a MaxText submodule commit that is not public; its keys, the ones Primus's examples and module
// configs write, are all in this base.yml), model shapes from its configs/models/*.yml, the
// learning-rate schedule from src/maxtext/utils/maxtext_utils.py (create_learning_rate_schedule),
// batch sizes from configs/types.py; Primus's own keys from primus/configs/modules/maxtext/ and
// module_base.yaml.
#include <algorithm>

#include <fmt/format.h>

#include "config/dialect.h"
#include "core/error.h"

namespace primus::config {
namespace {

constexpr KeyStatus A = KeyStatus::Applied, N = KeyStatus::NoEffect, X = KeyStatus::NotSupported;

const char* const kLogging = "logging, metrics, profiling, monitoring or run naming that this engine does its own way";
const char* const kKernels =
    "a kernel, compiler or runtime choice; this engine runs its own kernels with the same math";
const char* const kMemory = "a memory-saving choice (rematerialisation, offloading); the result does not depend on it "
                            "(this engine's: recompute_granularity)";
const char* const kStorage =
    "checkpoint format or bookkeeping; this engine writes its own checkpoints (docs/checkpoints.md)";
const char* const kData = "MaxText's own input pipelines (tokenizing, packing, shuffling); this engine reads "
                          "Megatron-format data (data_path) or mock data (dataset_type: synthetic)";
const char* const kInference = "inference, decoding or serving; training does not read it";
const char* const kMoe =
    "configures mixture-of-experts layers beyond the Mixtral, Qwen3 MoE and DeepSeek-V2 ones mapped (docs/config.md)";
const char* const kMla = "how multi-head latent attention is computed (rematerialisation, chunking, fused projections); "
                         "the result does not depend on it";
const char* const kDeepSeekFile =
    "MaxText's DeepSeek-V2 models (deepseek2-16b, deepseek2-236b): must equal the model file's value, which the preset "
    "has (another is refused); other models have no latent attention or DeepSeek routing and do not read it";
const char* const kDeepSeekShape =
    "MaxText's DeepSeek-V2 models: applied (the preset's latent attention, YaRN or expert shape); other models have "
    "no latent attention or DeepSeek routing and do not read it";
const char* const kMultimodal = "configures a vision or audio encoder (use_multimodal), which is refused here";
const char* const kQuant = "configures quantized training or inference (quantization), which is refused here";
const char* const kPrecision = "the precision of one operation inside mixed precision; this engine's kernels keep "
                               "their own (fp32 accumulation, fp32 softmax and loss)";
const char* const kNotBuilt = "not implemented by this engine";
const char* const kInit = "weight initialisation is this engine's (normal with init_method_std, scaled for the "
                          "output projections, as Megatron)";
const char* const kCompile = "ahead-of-time compilation for a target topology; this engine does not compile";
const char* const kDistill = "configures distillation, which this engine's pretraining does not do";
const char* const kDiloco = "DiLoCo training (inner and outer optimizers over replicas) is not built";
const char* const kEval = "evaluation scheduling beyond eval_interval and eval_iters; the result does not depend on it";
const char* const kSplit = "how layers are scanned or split over pipeline stages; the result does not depend on it "
                           "(this engine's split: decoder_first/last_pipeline_num_layers, pipeline_balance)";
const char* const kPrimus = "Primus's module bookkeeping; this engine's task and log levels are its own";
const char* const kMesh =
    "how arrays are laid out over the device mesh; this engine's layout follows the *_parallelism "
    "degrees";
const char* const kVariant = "configures a model variant whose switch (attention_type, decoder_block, use_indexer, "
                             "mtp_num_layers, engram_layers, moba, ...) is refused here";
const char* const kMuon = "configures the Muon optimizer (opt_type: muon), which is refused here";

// clang-format off
const std::vector<DialectKey>& table() {
  static const std::vector<DialectKey> keys = {
      {"abort_on_inf_loss", N, "true", kLogging},
      {"abort_on_nan_loss", N, "true", kLogging},
      {"act_quantization_calibration_method", N, "absmax", kQuant},
      {"activation_dropout_for_audio", N, "0.0", kMultimodal},
      {"activation_function_for_audio", N, "gelu", kMultimodal},
      {"activations_in_float32", N, "false", kPrecision},
      {"adam_b1", A, "0.9", "adam_beta1"},
      {"adam_b2", A, "0.95", "adam_beta2"},
      {"adam_eps", A, "1e-08", "adam_eps"},
      {"adam_eps_root", X, "0.0", kNotBuilt},
      {"adam_weight_decay", A, "0.1", "weight_decay, with decay_norms_and_biases: true (MaxText decays every parameter)"},
      {"adamw_mask", X, "[]", "weight-decay masks are not built; decay_norms_and_biases false is Megatron's rule (no decay on norms and biases)"},
      {"add_bos", N, "true", kData},
      {"add_eos", N, "true", kData},
      {"allow_split_physical_axes", N, "false", kMesh},
      {"ar_cache_axis_order", N, "1,2,0,3", kInference},
      {"async_checkpointing", N, "true", kStorage},
      {"attention", N, "autoselected", kKernels},
      {"attention_bias", X, "false", kNotBuilt},
      {"attention_dropout_for_audio", N, "0.0", kMultimodal},
      {"attention_out", N, "remat", kMemory},
      {"attention_output_dim", X, "-1", kNotBuilt},
      {"attention_sink", X, "false", kNotBuilt},
      {"attention_type", A, "global", "global (causal attention); mla for the DeepSeek-V2 models (their model file's); other variants are refused"},
      {"attn_logits_soft_cap", X, "0.0", kNotBuilt},
      {"audio_path", N, "\"\"", kMultimodal},
      {"audio_placeholder", N, "<|audio|>", kMultimodal},
      {"autoregressive_decode_assert", N, "\"\"", kInference},
      {"base_config", N, "base.yml", kPrimus},
      {"base_emb_dim", A, "2048", "hidden_size"},
      {"base_mlp_dim", A, "7168", "ffn_hidden_size"},
      {"base_moe_mlp_dim", A, "-1", "moe_ffn_hidden_size (MoE models; -1: the model's)"},
      {"base_num_decoder_layers", A, "16", "num_layers"},
      {"base_num_kv_heads", A, "16", "num_query_groups"},
      {"base_num_query_heads", A, "16", "num_attention_heads"},
      {"base_output_directory", N, "\"\"", kLogging},
      {"batch_split_factor", N, "1", kMoe},
      {"beta_fast", A, "32", kDeepSeekShape},
      {"beta_slow", A, "1", kDeepSeekShape},
      {"block_diffusion_canvas_policy", N, "all_masked", kVariant},
      {"block_diffusion_logit_alignment", N, "same_position", kVariant},
      {"block_diffusion_mask_id", N, "-1", kVariant},
      {"block_diffusion_min_noise", N, "0.001", kVariant},
      {"bwd_quantization_calibration_method", N, "absmax", kQuant},
      {"capacity_factor", A, "-1.0", "with sparse_matmul: false, moe_expert_capacity_factor per sequence (moe_expert_capacity_per_sequence, drop policy position); else dropless"},
      {"cast_logits_to_fp32", N, "true", kPrecision},
      {"causal_block_size", N, "32", kKernels},
      {"chat_template", N, "\"\"", kData},
      {"chat_template_path", N, "\"\"", kData},
      {"check_vma", N, "false", kMesh},
      {"checkpoint_conversion_fn", N, "none", kStorage},
      {"checkpoint_is_quantized", X, "false", kQuant},
      {"checkpoint_period", A, "10000", "save_interval when enable_checkpointing"},
      {"checkpoint_storage_concurrent_gb", N, "96", kStorage},
      {"checkpoint_storage_target_data_file_size_bytes", N, "2147483648", kStorage},
      {"checkpoint_storage_use_ocdbt", N, "true", kStorage},
      {"checkpoint_storage_use_zarr3", N, "true", kStorage},
      {"checkpoint_todelete_full_path", N, "None", kStorage},
      {"checkpoint_todelete_subdir", N, "None", kStorage},
      {"chunk_attn_window_size", N, "0", kVariant},
      {"colocated_python_checkpointing", N, "false", kStorage},
      {"colocated_python_data_input", N, "false", kData},
      {"communication_overlapping_alpha", N, "0.0", kKernels},
      {"compile_topology", N, "\"\"", kCompile},
      {"compile_topology_num_slices", N, "-1", kCompile},
      {"compile_xla_flags", N, "\"\"", kCompile},
      {"compiled_trainstep_file", N, "\"\"", kCompile},
      {"compress_ratios", A, "[]", kDeepSeekFile},
      {"compressed_rope_max_timescale", A, "160000", kDeepSeekFile},
      {"compute_axis_order", N, "0,1,2,3", kInference},
      {"constant_bound_config", N, "\"\"", kQuant},
      {"context", N, "remat", kMemory},
      {"context_parallel_load_balance", N, "true", kMesh},
      {"context_parallel_reorder_strategy", N, "auto", kMesh},
      {"context_parallel_strategy", N, "all_gather", kMesh},
      {"context_sharding", N, "context", kMesh},
      {"conv_chunksize_for_audio", N, "500", kMultimodal},
      {"conv_stride_for_vit", N, "14", kMultimodal},
      {"cosine_learning_rate_final_fraction", A, "null", "older MaxText's name of learning_rate_final_fraction"},
      {"cost_estimate_flops_bwd", N, "-1", kKernels},
      {"cost_estimate_flops_fwd", N, "-1", kKernels},
      {"custom_mesh", N, "\"\"", kMesh},
      {"custom_mesh_and_rule", N, "\"\"", kMesh},
      {"custom_mesh_and_rule_for_eval", N, "\"\"", kMesh},
      {"d_model_for_audio", N, "256", kMultimodal},
      {"data_sharding", N, "(a list of mesh axes or sharding rules)", kMesh},
      {"data_shuffle_seed", N, "0", kData},
      {"dataset_name", N, "c4/en:3.1.0", kData},
      {"dataset_path", N, "\"\"", kData},
      {"dataset_type", A, "tfds", "mock_data (synthetic); the others are refused unless this engine's data_path is given"},
      {"dcn_autoregressive_parallelism", X, "1", "an inference mesh axis; training uses none"},
      {"dcn_bandwidth_burst", N, "10mb", kDiloco},
      {"dcn_bandwidth_interface", N, "eth0", kDiloco},
      {"dcn_bandwidth_latency", N, "50ms", kDiloco},
      {"dcn_bandwidth_limit", N, "\"\"", kDiloco},
      {"dcn_context_autoregressive_parallelism", X, "1", "an inference mesh axis; training uses none"},
      {"dcn_context_parallelism", A, "1", "context_parallel_size (p2p) (-1: the devices left over)"},
      {"dcn_context_usp_ulysses_parallelism", A, "1", "context_parallel_size with cp_comm_type a2a (-1: the devices left over)"},
      {"dcn_data_parallelism", A, "-1", "the data-parallel size (no_shard) (-1: the devices left over)"},
      {"dcn_diloco_parallelism", X, "1", kDiloco},
      {"dcn_expert_parallelism", A, "1", "the data-parallel size, sharded as fsdp; for MoE models also expert_model_parallel_size (-1: the devices left over)"},
      {"dcn_fsdp_parallelism", A, "1", "the data-parallel size, sharded: data_parallel_sharding_strategy optim_grads_params (-1: the devices left over)"},
      {"dcn_fsdp_transpose_parallelism", A, "1", "the data-parallel size, sharded as fsdp (-1: the devices left over)"},
      {"dcn_pipeline_parallelism", A, "1", "pipeline_model_parallel_size (-1: the devices left over)"},
      {"dcn_sequence_parallelism", A, "1", "context_parallel_size (p2p) (-1: the devices left over)"},
      {"dcn_tensor_parallelism", A, "1", "tensor_model_parallel_size (-1: the devices left over)"},
      {"dcn_tensor_sequence_parallelism", A, "1", "tensor_model_parallel_size with sequence_parallel (-1: the devices left over)"},
      {"debug_sharding", N, "false", kLogging},
      {"decode_sampling_nucleus_p", N, "-1", kInference},
      {"decode_sampling_strategy", N, "greedy", kInference},
      {"decode_sampling_temperature", N, "1.0", kInference},
      {"decode_sampling_top_k", N, "0", kInference},
      {"decoder_block", A, "llama2", "the model's own block (llama2, mixtral, qwen3, qwen3_moe, deepseek); another is refused"},
      {"decoder_layer_input", N, "device", kMemory},
      {"deepstack_visual_indexes_for_vit", N, "[]", kMultimodal},
      {"default_prompt", N, "\"\"", kInference},
      {"dense_fsdp_use_two_stage_all_gather", N, "false", kMesh},
      {"dense_init_scale", N, "1.0", kInit},
      {"diloco_outer_lr", N, "0.3", kDiloco},
      {"diloco_outer_momentum", N, "0.9", kDiloco},
      {"diloco_sync_period", N, "36", kDiloco},
      {"distill_alpha", N, "0.5", kDistill},
      {"distill_alpha_end", N, "None", kDistill},
      {"distill_alpha_schedule", N, "constant", kDistill},
      {"distill_beta", N, "0.0", kDistill},
      {"distill_beta_end", N, "None", kDistill},
      {"distill_beta_schedule", N, "constant", kDistill},
      {"distill_feature_loss_type", N, "cosine", kDistill},
      {"distill_layer_indices", N, "None", kDistill},
      {"distill_temperature", N, "1.0", kDistill},
      {"distill_temperature_end", N, "None", kDistill},
      {"distill_temperature_schedule", N, "constant", kDistill},
      {"downsample_hidden_size_for_audio", N, "256", kMultimodal},
      {"dq_reduction_steps", N, "0", kKernels},
      {"dropout_rate", X, "0.0", "dropout is not implemented by this engine"},
      {"dtype", A, "bfloat16", "bf16 (bfloat16: true, float32: false)"},
      {"dtype_mm", N, "float32", kMultimodal},
      {"dump_hlo", N, "false", kLogging},
      {"dump_hlo_delete_local_after", N, "true", kLogging},
      {"dump_hlo_gcs_dir", N, "\"\"", kLogging},
      {"dump_hlo_local_dir", N, "/tmp/xla_dump/", kLogging},
      {"dump_hlo_local_module_name", N, "jit_train_step", kLogging},
      {"dump_hlo_module_name", N, "jit_train_step", kLogging},
      {"dump_hlo_upload_all", N, "false", kLogging},
      {"dump_hlo_xla_flags", N, "\"\"", kLogging},
      {"dump_jaxpr", N, "false", kLogging},
      {"dump_jaxpr_delete_local_after", N, "true", kLogging},
      {"dump_jaxpr_gcs_dir", N, "\"\"", kLogging},
      {"dump_jaxpr_local_dir", N, "/tmp/jaxpr_dump/", kLogging},
      {"dump_step", N, "-1", kLogging},
      {"elastic_backup_kind", N, "snapshot", kLogging},
      {"elastic_enabled", X, "false", "elastic training is not built; this engine restarts from checkpoints (--max-restarts)"},
      {"elastic_max_retries", N, "10", kLogging},
      {"elastic_min_slice_count", N, "-1", kLogging},
      {"elastic_timeout_seconds", N, "300", kLogging},
      {"enable_autocheckpoint", N, "false", kStorage},
      {"enable_checkpoint_cloud_logger", N, "false", kLogging},
      {"enable_checkpointing", A, "true", "save_interval (false: the engine's end-of-run checkpoint only)"},
      {"enable_continuous_checkpointing", N, "false", kStorage},
      {"enable_data_shuffling", N, "true", kData},
      {"enable_diloco", X, "false", kDiloco},
      {"enable_dropout", N, "true", "dropout_rate 0.0 (the only rate here) drops nothing"},
      {"enable_emergency_checkpoint", N, "false", kStorage},
      {"enable_gcp_goodput_metrics", N, "true", kLogging},
      {"enable_gcp_step_deviation_metrics", N, "true", kLogging},
      {"enable_goodput_recording", N, "false", kLogging},
      {"enable_jax_profiler", N, "false", kLogging},
      {"enable_llm_inference_pool", N, "false", kInference},
      {"enable_mhc_lite", N, "false", kKernels},
      {"enable_model_warmup", N, "false", kInference},
      {"enable_multi_tier_checkpointing", N, "false", kStorage},
      {"enable_nnx", N, "true", kKernels},
      {"enable_orbax_v1", N, "false", kStorage},
      {"enable_padding_causal_mask", N, "true", kKernels},
      {"enable_pathways_goodput", N, "false", kLogging},
      {"enable_prefix_caching", N, "false", kInference},
      {"enable_rampup_batch_size", X, "false", "batch-size ramp-up is not built"},
      {"enable_single_controller", N, "false", kMesh},
      {"enable_single_replica_ckpt_restoring", N, "false", kStorage},
      {"enable_streaming_diloco", X, "false", kDiloco},
      {"enable_tensorboard", N, "true", kLogging},
      {"enable_tpu_profiling_options", N, "false", kLogging},
      {"enable_wandb", N, "false", kLogging},
      {"encoder_attention_heads_for_audio", N, "4", kMultimodal},
      {"encoder_ffn_dim_for_audio", N, "512", kMultimodal},
      {"encoder_layers_for_audio", N, "2", kMultimodal},
      {"engram", N, "remat", kMemory},
      {"engram_head_dim", N, "1280", kVariant},
      {"engram_kernel_size", N, "4", kVariant},
      {"engram_layers", X, "[]", kNotBuilt},
      {"engram_max_ngram_size", N, "3", kVariant},
      {"engram_num_heads", N, "8", kVariant},
      {"engram_seed", N, "0", kVariant},
      {"engram_vocab_bases", N, "[]", kVariant},
      {"eval_data_columns", N, "[text]", kData},
      {"eval_dataset_name", N, "c4/en:3.1.0", kData},
      {"eval_image_column", N, "image", kMultimodal},
      {"eval_interval", A, "-1", "eval_interval (-1: 0, never)"},
      {"eval_per_device_batch_size", X, "0.0", "an evaluation batch other than the training batch is not built"},
      {"eval_split", N, "validation", kData},
      {"eval_start_step", N, "0", kEval},
      {"eval_steps", A, "-1", "eval_iters"},
      {"expansion_factor_real_data", N, "-1.0", kData},
      {"experimental_sa_quant_k_fp8", X, "false", kQuant},
      {"experimental_sa_quant_q_fp8", X, "false", kQuant},
      {"file_sink_level", N, "DEBUG", kPrimus},
      {"final_logits_soft_cap", X, "0.0", kNotBuilt},
      {"first_num_dense_layers", A, "0", kDeepSeekShape},
      {"first_num_hash_layers", X, "0", kMoe},
      {"float32_gate_logits", N, "false", kMoe},
      {"float32_logits", N, "false", kPrecision},
      {"float32_qk_product", N, "false", kPrecision},
      {"float32_weight_sum", N, "true", kMoe},
      {"force_q_layout", N, "false", kKernels},
      {"force_unroll", N, "false", kStorage},
      {"freeze_audio_encoder_params", N, "true", kMultimodal},
      {"freeze_vision_encoder_params", N, "true", kMultimodal},
      {"fused_mlp", N, "false", kKernels},
      {"fused_qkv", N, "false", kKernels},
      {"gcs_metrics", N, "false", kLogging},
      {"gdn_chunk_size", N, "64", kVariant},
      {"gdn_conv_kernel_dim", N, "4", kVariant},
      {"gdn_key_head_dim", N, "128", kVariant},
      {"gdn_num_key_heads", N, "16", kVariant},
      {"gdn_num_value_heads", N, "32", kVariant},
      {"gdn_value_head_dim", N, "128", kVariant},
      {"generate_padding_batch_eval", N, "false", kData},
      {"generate_padding_batch_train", N, "false", kData},
      {"generate_slice", N, "v5e-16", kInference},
      {"global_head_dim", N, "0", kVariant},
      {"global_num_kv_heads", N, "0", kVariant},
      {"global_parameter_scale", X, "1", kNotBuilt},
      {"global_rampup_samples", N, "500", kData},
      {"global_rope_max_timescale", N, "-1", kVariant},
      {"global_rope_proportion", N, "0.25", kVariant},
      {"goodput_upload_interval_seconds", N, "30", kLogging},
      {"grad_dtype", X, "float32", "gradients are fp32 here"},
      {"gradient_accumulation_steps", A, "1", "global_batch_size (micro batches per step)"},
      {"gradient_clipping_threshold", A, "1.0", "clip_grad (0: off)"},
      {"grain_data_source_max_workers", N, "16", kData},
      {"grain_eval_files", N, "\"\"", kData},
      {"grain_file_type", N, "arrayrecord", kData},
      {"grain_index_storage_option", N, "null", kData},
      {"grain_num_threads", N, "16", kData},
      {"grain_num_threads_eval", N, "16", kData},
      {"grain_packing_type", N, "first_fit", kData},
      {"grain_per_worker_buffer_size", N, "1", kData},
      {"grain_per_worker_buffer_size_eval", N, "1", kData},
      {"grain_prefetch_buffer_size", N, "500", kData},
      {"grain_prefetch_buffer_size_eval", N, "500", kData},
      {"grain_ram_budget_mb", N, "1024", kData},
      {"grain_shuffle_buffer_size", N, "100", kData},
      {"grain_train_files", N, "\"\"", kData},
      {"grain_train_mixture_config_path", N, "\"\"", kData},
      {"grain_use_elastic_iterator", N, "false", kData},
      {"grain_worker_count", N, "1", kData},
      {"grain_worker_count_eval", N, "1", kData},
      {"hardware", N, "tpu", kLogging},
      {"head_dim", A, "128", "kv_channels"},
      {"heartbeat_reporting_interval_in_seconds", N, "5", kLogging},
      {"hf_access_token", N, "\"\"", kData},
      {"hf_data_dir", N, "\"\"", kData},
      {"hf_eval_files", N, "\"\"", kData},
      {"hf_eval_split", N, "\"\"", kData},
      {"hf_lora_adapter_path", X, "\"\"", "LoRA is not built"},
      {"hf_name", N, "\"\"", kData},
      {"hf_path", N, "\"\"", kData},
      {"hf_train_files", N, "\"\"", kData},
      {"hidden_size_for_vit", N, "1408", kMultimodal},
      {"hidden_size_per_layer_input", X, "0", kNotBuilt},
      {"hide_profiler_step_metric", N, "false", kLogging},
      {"ici_autoregressive_parallelism", X, "1", "an inference mesh axis; training uses none"},
      {"ici_context_autoregressive_parallelism", X, "1", "an inference mesh axis; training uses none"},
      {"ici_context_parallelism", A, "1", "context_parallel_size (p2p) (-1: the devices left over)"},
      {"ici_context_usp_ulysses_parallelism", A, "1", "context_parallel_size with cp_comm_type a2a (-1: the devices left over)"},
      {"ici_data_parallelism", A, "1", "the data-parallel size (no_shard) (-1: the devices left over)"},
      {"ici_diloco_parallelism", X, "1", kDiloco},
      {"ici_expert_parallelism", A, "1", "the data-parallel size, sharded as fsdp; for MoE models also expert_model_parallel_size (-1: the devices left over)"},
      {"ici_fsdp_parallelism", A, "-1", "the data-parallel size, sharded: data_parallel_sharding_strategy optim_grads_params (-1: the devices left over)"},
      {"ici_fsdp_transpose_parallelism", A, "1", "the data-parallel size, sharded as fsdp (-1: the devices left over)"},
      {"ici_pipeline_parallelism", A, "1", "pipeline_model_parallel_size (-1: the devices left over)"},
      {"ici_sequence_parallelism", A, "1", "context_parallel_size (p2p) (-1: the devices left over)"},
      {"ici_tensor_parallelism", A, "1", "tensor_model_parallel_size (-1: the devices left over)"},
      {"ici_tensor_sequence_parallelism", A, "1", "tensor_model_parallel_size with sequence_parallel (-1: the devices left over)"},
      {"image_path", N, "\"\"", kMultimodal},
      {"image_placeholder", N, "<|image|>", kMultimodal},
      {"image_size_for_vit", N, "896", kMultimodal},
      {"indexer_approx_top_k_recall", N, "0.95", kVariant},
      {"indexer_cutoff_threshold", N, "remat", kMemory},
      {"indexer_head_dim", N, "128", kVariant},
      {"indexer_loss_scaling_factor", N, "0.0", kVariant},
      {"indexer_mask_exact_topk", N, "true", kVariant},
      {"indexer_n_heads", N, "64", kVariant},
      {"indexer_sparse_training", N, "false", kVariant},
      {"indexer_topk", N, "2048", kVariant},
      {"indexer_use_approx_top_k", N, "false", kVariant},
      {"inference_benchmark_test", N, "false", kInference},
      {"inference_metadata_file", N, "\"\"", kInference},
      {"inference_microbenchmark_log_file_path", N, "\"\"", kInference},
      {"inference_microbenchmark_loop_iters", N, "10", kInference},
      {"inference_microbenchmark_num_samples", N, "[1, 2, 3, 4, 5]", kInference},
      {"inference_microbenchmark_prefill_lengths", N, "64,128,256,512,1024", kInference},
      {"inference_microbenchmark_stages", N, "prefill,generate", kInference},
      {"inference_server", N, "MaxtextInterleavedServer", kInference},
      {"inhomogeneous_layer_cycle_interval", N, "1", kMoe},
      {"init_weights_seed", A, "0", "seed"},
      {"input_data_sharding_logical_axes", N, "[activation_embed_and_logits_batch, activation_norm_length]", kMesh},
      {"interleave_moe_layer_step", N, "1", kMoe},
      {"intermediate_size_for_vit", N, "5632", kMultimodal},
      {"internal_compile", N, "false", kCompile},
      {"internal_compile_num_devices", N, "-1", kCompile},
      {"jax_cache_dir", N, "~/jax_cache", kLogging},
      {"jax_debug_log_modules", N, "\"\"", kLogging},
      {"jax_distributed_initialization_timeout", N, "300", kKernels},
      {"jax_profiler_port", N, "9999", kLogging},
      {"key_proj", N, "remat", kMemory},
      {"kv_lora_rank", A, "512", kDeepSeekShape},
      {"kv_proj", N, "remat", kMemory},
      {"kv_quant_axis", N, "heads_and_dkv", kInference},
      {"kv_quant_dtype", N, "int8", kInference},
      {"kv_wa_proj", N, "remat", kMemory},
      {"learning_rate", A, "3e-05", "lr"},
      {"learning_rate_final_fraction", A, "0.1", "min_lr = learning_rate x learning_rate_final_fraction"},
      {"learning_rate_schedule_steps", A, "-1", "lr_decay_iters = learning_rate_schedule_steps - 1 (-1: steps); shorter than steps is refused"},
      {"load_balance_loss_weight", A, "0.0", "0: no auxiliary loss (moe_router_load_balancing_type none); MaxText's per-sequence loss is refused"},
      {"load_from_prefill_dir", N, "false", kInference},
      {"load_full_state_path", X, "\"\"", "MaxText's Orbax checkpoints are not read; this engine starts from its own (load, pretrained_checkpoint)"},
      {"load_parameters_path", X, "\"\"", "MaxText's Orbax checkpoints are not read; this engine starts from its own (load, pretrained_checkpoint) or imported Hugging Face weights"},
      {"local_checkpoint_directory", N, "\"\"", kStorage},
      {"local_checkpoint_period", N, "0", kStorage},
      {"local_rope_max_timescale", N, "-1", kVariant},
      {"local_rope_proportion", N, "1.0", kVariant},
      {"local_sa_block_kv", N, "None", kKernels},
      {"local_sa_block_kv_compute", N, "None", kKernels},
      {"local_sa_block_kv_dkv", N, "None", kKernels},
      {"local_sa_block_kv_dkv_compute", N, "None", kKernels},
      {"local_sa_block_kv_dq", N, "None", kKernels},
      {"local_sa_block_q", N, "None", kKernels},
      {"local_sa_block_q_dkv", N, "None", kKernels},
      {"local_sa_block_q_dq", N, "None", kKernels},
      {"local_sa_fuse_reciprocal", N, "None", kKernels},
      {"local_sa_k_layout", N, "None", kKernels},
      {"local_sa_q_layout", N, "None", kKernels},
      {"local_sa_use_base2_exp", N, "None", kKernels},
      {"local_sa_use_fused_bwd_kernel", N, "None", kKernels},
      {"local_sa_v_layout", N, "None", kKernels},
      {"local_use_splash_scheduler", N, "None", kKernels},
      {"log_config", N, "true", kLogging},
      {"log_period", A, "100", "log_interval"},
      {"logical_axis_rules", N, "(a list of mesh axes or sharding rules)", kMesh},
      {"logical_axis_rules_for_eval", N, "[]", kMesh},
      {"logits_dot_in_fp32", N, "false", kPrecision},
      {"logits_via_embedding", A, "false", "untie_embeddings_and_output_weights: the opposite"},
      {"lora_input_adapters_path", X, "\"\"", "LoRA is not built"},
      {"lr_schedule_type", A, "cosine", "lr_decay_style (cosine: cosine; wsd: WSD)"},
      {"managed_mldiagnostics", N, "false", kLogging},
      {"managed_mldiagnostics_on_demand_profiling", N, "true", kLogging},
      {"managed_mldiagnostics_region", N, "\"\"", kLogging},
      {"managed_mldiagnostics_run_group", N, "\"\"", kLogging},
      {"managed_mldiagnostics_storage_path", N, "\"\"", kLogging},
      {"matmul_precision", N, "default", kPrecision},
      {"max_checkify", N, "false", kLogging},
      {"max_corpus_chars", N, "10000000", kData},
      {"max_inflight_computations", N, "2", kKernels},
      {"max_num_checkpoints_to_keep", A, "None", "keep_last_checkpoints (None: keep all)"},
      {"max_num_images_per_example", N, "-1", kMultimodal},
      {"max_position_embeddings", A, "163840", kDeepSeekShape},
      {"max_prefill_predict_length", N, "64", kInference},
      {"max_sample_len_for_audio", N, "10000", kMultimodal},
      {"max_segments_per_seq", N, "-1", kData},
      {"max_source_positions_for_audio", N, "1500", kMultimodal},
      {"max_target_length", A, "2048", "seq_length"},
      {"max_timescale_for_audio", N, "10000.0", kMultimodal},
      {"megablox", N, "true", kMoe},
      {"merge_gating_gmm", N, "false", kMoe},
      {"mesh_axes", N, "(a list of mesh axes or sharding rules)", kMesh},
      {"metrics_file", N, "\"\"", kLogging},
      {"mhc_expansion_rate", X, "1", kNotBuilt},
      {"mhc_pallas_kernel_bwd_block_size", N, "128", kKernels},
      {"mhc_pallas_kernel_fwd_block_size", N, "256", kKernels},
      {"mla_kv", N, "remat", kMla},
      {"mla_naive_kvcache", N, "true", kInference},
      {"mla_q", N, "remat", kMla},
      {"mla_qk_head_chunk_size", N, "0", kMla},
      {"mlp_activations", X, "[silu, linear]", kNotBuilt},
      {"mlp_activations_limit", X, "-1.0", kNotBuilt},
      {"mlp_bias", X, "false", kNotBuilt},
      {"mlpwi", N, "remat", kMemory},
      {"mlpwi_0", N, "remat", kMemory},
      {"mlpwi_1", N, "remat", kMemory},
      {"mlpwo", N, "remat", kMemory},
      {"moba", X, "false", kNotBuilt},
      {"moba_chunk_size", N, "1024", kVariant},
      {"moba_topk", N, "8", kVariant},
      {"model_call_mode", N, "\"\"", kInference},
      {"model_name", A, "default", "the model preset (docs/config.md lists the mapped names)"},
      {"moe_chunk_barrier", N, "false", kMoe},
      {"moe_dispatch_no_expert_sharding", N, "false", kMoe},
      {"moe_expert_input_dim", N, "-1", kMoe},
      {"moe_fsdp_use_two_stage_all_gather", N, "false", kMoe},
      {"moe_mlpwi_0", N, "remat", kMoe},
      {"moe_mlpwi_1", N, "remat", kMoe},
      {"moe_mlpwo", N, "remat", kMoe},
      {"monitor_goodput", N, "false", kLogging},
      {"monitor_step_time_deviation", N, "true", kLogging},
      {"mrope_section", N, "[24, 20, 20]", kMultimodal},
      {"mscale", A, "1.0", kDeepSeekShape},
      {"mtc_data_parallelism", N, "0", kStorage},
      {"mtp_eval_target_module", N, "0", kVariant},
      {"mtp_loss_scaling_factor", N, "0.1", kVariant},
      {"mtp_num_layers", X, "0", "MaxText's multi-token prediction is not mapped (Megatron's mtp_num_layers is built)"},
      {"mu_dtype", A, "\"\"", "exp_avg_dtype (float32: fp32, bfloat16: bf16; unset: weight_dtype's), with use_precision_aware_optimizer"},
      {"multi_sampling", N, "false", kInference},
      {"multi_tier_checkpointing_backup_interval_minutes", N, "null", kStorage},
      {"multi_tier_checkpointing_backup_interval_steps", N, "null", kStorage},
      {"muon_beta", N, "0.95", kMuon},
      {"muon_consistent_rms", N, "None", kMuon},
      {"muon_weight_decay", N, "0", kMuon},
      {"n_routing_groups", A, "-1", kDeepSeekFile},
      {"n_window_for_audio", N, "50", kMultimodal},
      {"n_window_infer_for_audio", N, "800", kMultimodal},
      {"nope_layer_interval", X, "-1", kNotBuilt},
      {"norm_topk_prob", A, "false", "read; the models mapped take a softmax over the chosen logits, which sums to 1 already"},
      {"normalization_layer_epsilon", A, "1e-05", "norm_epsilon"},
      {"normalize_embedding_logits", A, "true", "with logits_via_embedding: true, refused (logits divided by sqrt(emb_dim) are not built)"},
      {"num_attention_heads_for_vit", N, "16", kMultimodal},
      {"num_channels_for_vit", N, "3", kMultimodal},
      {"num_communication_overlapping_steps", N, "0", kKernels},
      {"num_conv_layers_for_audio", N, "3", kMultimodal},
      {"num_diloco_fragments", N, "null", kDiloco},
      {"num_epoch", N, "1", kData},
      {"num_experts", A, "1", "num_experts (MoE models: mixtral-*, qwen3-30b-a3b*)"},
      {"num_experts_per_tok", A, "1", "moe_router_topk (MoE models)"},
      {"num_hidden_layers_for_vit", N, "34", kMultimodal},
      {"num_kv_shared_layers", X, "0", kNotBuilt},
      {"num_layers_per_pipeline_stage", N, "1", kSplit},
      {"num_mel_bins_for_audio", N, "128", kMultimodal},
      {"num_moe_emb_chunks", N, "0", kMoe},
      {"num_moe_token_chunks", N, "1", kMoe},
      {"num_pipeline_microbatches", A, "-1", "micro_batch_size with pipeline stages (-1: the number of stages)"},
      {"num_pipeline_repeats", N, "-1", kSplit},
      {"num_position_embeddings_for_vit", N, "1024", kMultimodal},
      {"num_slices", N, "-1", kMesh},
      {"num_vocab_tiling", N, "1", kKernels},
      {"o_groups", A, "0", kDeepSeekFile},
      {"o_lora_rank", A, "0", kDeepSeekFile},
      {"olmo_apply_ngram_filter", N, "true", kData},
      {"olmo_index_path", N, "\"\"", kData},
      {"olmo_path_remap_from", N, "\"\"", kData},
      {"olmo_path_remap_to", N, "\"\"", kData},
      {"opt_type", X, "adamw", "only AdamW is built"},
      {"optimize_mesh_for_tpu_v6e", N, "false", kMesh},
      {"optimizer_memory_host_offload", N, "false", kMemory},
      {"original_max_position_embeddings", A, "4096", kDeepSeekShape},
      {"out_hidden_size_for_vit", N, "512", kMultimodal},
      {"out_proj", N, "remat", kMemory},
      {"output_dim_for_audio", N, "512", kMultimodal},
      {"override_logical_axis_rules", N, "false", kMesh},
      {"override_model_config", N, "false", "this engine always lets model keys override the model's defaults"},
      {"packing", N, "true", kData},
      {"param_scan_axis", N, "1", kSplit},
      {"parameter_memory_host_offload", N, "false", kMemory},
      {"partial_rotary_factor", X, "1.0", kNotBuilt},
      {"patch_size_for_vit", N, "14", kMultimodal},
      {"per_device_batch_size", A, "12.0", "micro_batch_size and global_batch_size (x the devices of the launch)"},
      {"per_device_batch_size_increment", N, "2.0", kData},
      {"per_device_batch_size_start", N, "4.0", kData},
      {"pipeline_delay_activation_forwarding", N, "false", kSplit},
      {"pipeline_fsdp_ag_once", N, "false", kSplit},
      {"pipeline_fsdp_ag_per_repeat", N, "false", kSplit},
      {"pipeline_parallel_layers", X, "-1", "pipelining only some layers is not built"},
      {"pixel_shuffle_ratio_for_vit", N, "0.5", kMultimodal},
      {"posemb_type_for_vit", N, "learn", kMultimodal},
      {"position_id_per_seconds", N, "25", kMultimodal},
      {"prefill_cache_axis_order", N, "1,2,0,3", kInference},
      {"prefill_cache_dir", N, "\"\"", kInference},
      {"prefill_chunk_size", N, "256", kInference},
      {"prefill_slice", N, "v5e-16", kInference},
      {"prefix_caching_dram_byte", N, "100000000000", kInference},
      {"prefix_caching_hbm_byte", N, "10000000000", kInference},
      {"profile_cleanly", N, "true", kLogging},
      {"profile_periodically_period", N, "-1", kLogging},
      {"profile_power_events", N, "false", kLogging},
      {"profiler", N, "\"\"", kLogging},
      {"profiler_steps", N, "5", kLogging},
      {"projector_dropout_for_vit", N, "0.0", kMultimodal},
      {"projector_input_dim_for_vit", N, "4096", kMultimodal},
      {"projector_output_dim_for_vit", N, "4096", kMultimodal},
      {"prometheus_port", N, "0", kLogging},
      {"prompt", N, "I love to", kInference},
      {"pure_nnx", N, "true", kKernels},
      {"pure_nnx_decoder", N, "true", kKernels},
      {"q_lora_rank", A, "0", kDeepSeekShape},
      {"qk_clip_threshold", N, "100.0", kVariant},
      {"qk_nope_head_dim", A, "128", kDeepSeekShape},
      {"qk_norm_with_scale", X, "true", kNotBuilt},
      {"qk_rope_head_dim", A, "64", kDeepSeekShape},
      {"qkv_proj", N, "remat", kMemory},
      {"quant_cfg_path", N, "\"\"", kQuant},
      {"quantization", A, "\"\"", "\"\" only: fp8 and nanoo_fp8 (flax's delayed scaling) quantize in the compute dtype, which this engine's FP8 does not (docs/fp8.md, From MaxText configs); int8, aqt and qwix modes are not built"},
      {"quantization_local_shard_count", N, "-1", kQuant},
      {"quantize_kvcache", N, "false", kInference},
      {"query_proj", N, "remat", kMemory},
      {"query_wa_proj", N, "remat", kMemory},
      {"ragged_block_size", N, "256", kMoe},
      {"ragged_buffer_factor", N, "-1.0", kMoe},
      {"ragged_gather_cost_estimate_bytes_accessed", N, "-1", kMoe},
      {"ragged_gather_cost_estimate_flops", N, "-1", kMoe},
      {"ragged_gather_fallback", N, "false", kMoe},
      {"ragged_gather_reduce_cost_estimate_bytes_accessed", N, "-1", kMoe},
      {"ragged_gather_reduce_cost_estimate_flops", N, "-1", kMoe},
      {"ragged_gather_reduce_fallback", N, "false", kMoe},
      {"record_internal_nn_metrics", N, "0", kLogging},
      {"remat_policy", A, "full", "recompute_granularity (full: full; the others: selective)"},
      {"remat_policy_for_vit", N, "minimal", kMultimodal},
      {"remove_size_one_mesh_axis_from_type", N, "true", kMesh},
      {"replicate_quant_scale", N, "false", kQuant},
      {"report_heartbeat_metric_for_gcp_monitoring", N, "false", kLogging},
      {"report_performance_metric_for_gcp_monitoring", N, "false", kLogging},
      {"reshape_q", N, "false", kInference},
      {"return_log_prob", N, "false", kInference},
      {"reuse_example_batch", X, "0", kNotBuilt},
      {"ring_scan_unroll", N, "1", kKernels},
      {"rope_attention_scaling", A, "false", kDeepSeekFile},
      {"rope_factor", A, "40", kDeepSeekShape},
      {"rope_interleave", A, "true", kDeepSeekFile},
      {"rope_linear_scaling_factor", X, "1.0", kNotBuilt},
      {"rope_max_timescale", A, "10000", "rotary_base"},
      {"rope_min_timescale", X, "1", kNotBuilt},
      {"rope_pairwise", A, "false", kDeepSeekFile},
      {"rope_theta_for_vit", N, "10000", kMultimodal},
      {"rope_truncate", A, "true", kDeepSeekFile},
      {"rope_type", A, "default", "use_rope_scaling (default: off; llama3.1: on); yarn for the DeepSeek-V2 models (their model file's, the preset's YaRN), refused elsewhere"},
      {"rope_use_scale", A, "true", "use_rope_scaling with the llama3.1 rotary"},
      {"routed_bias", A, "false", kDeepSeekFile},
      {"routed_bias_update_rate", N, "0.0", kMoe},
      {"routed_scaling_factor", A, "1.0", kDeepSeekShape},
      {"routed_score_func", A, "\"\"", kDeepSeekFile},
      {"run_name", N, "\"\"", kLogging},
      {"sa_block_kv", N, "512", kKernels},
      {"sa_block_kv_compute", N, "512", kKernels},
      {"sa_block_kv_dkv", N, "512", kKernels},
      {"sa_block_kv_dkv_compute", N, "512", kKernels},
      {"sa_block_kv_dq", N, "512", kKernels},
      {"sa_block_q", N, "512", kKernels},
      {"sa_block_q_dkv", N, "512", kKernels},
      {"sa_block_q_dq", N, "512", kKernels},
      {"sa_bwd_dkv_megacore", N, "false", kKernels},
      {"sa_fuse_reciprocal", N, "true", kKernels},
      {"sa_k_layout", N, "HEAD_DIM_MINOR", kKernels},
      {"sa_q_layout", N, "HEAD_DIM_MINOR", kKernels},
      {"sa_use_base2_exp", N, "true", kKernels},
      {"sa_use_fused_bwd_kernel", N, "false", kKernels},
      {"sa_v_layout", N, "HEAD_DIM_MINOR", kKernels},
      {"save_checkpoint_on_completion", N, "true", kStorage},
      {"save_checkpoint_on_start", N, "true", kStorage},
      {"save_config_to_gcs", N, "false", kLogging},
      {"save_quantized_params_path", N, "\"\"", kStorage},
      {"scale_embedding_for_audio", N, "true", kMultimodal},
      {"scan_layers", N, "true", kSplit},
      {"scan_layers_per_stage", N, "false", kSplit},
      {"scan_pipeline_iterations", N, "true", kSplit},
      {"scan_pipeline_repeats", N, "false", kSplit},
      {"set_remat_policy_on_layers_per_stage", N, "false", kMemory},
      {"set_remat_policy_on_pipeline_iterations", N, "true", kMemory},
      {"sft_train_on_completion_only", N, "false", kData},
      {"shard_exp_on_fsdp", N, "false", kMoe},
      {"shard_mode", N, "auto", kMesh},
      {"shard_optimizer_over_data", N, "false", kMemory},
      {"sharding_tolerance", N, "0.02", kMesh},
      {"shardy", N, "true", kMesh},
      {"share_kv_projections", X, "false", kNotBuilt},
      {"shared_experts", A, "0", kDeepSeekShape},
      {"sink_level", N, "null", kPrimus},
      {"sinkhorn_iterations", N, "20", kKernels},
      {"skip_first_n_steps_for_profiler", N, "1", kLogging},
      {"skip_jax_distributed_system", N, "false", kKernels},
      {"skip_step_interval", N, "128", "configures skip_step_on_spikes (refused)"},
      {"skip_step_on_spikes", X, "false", "skipping steps on loss spikes is not built (this engine's watch reports spikes: docs/stability.md)"},
      {"skip_step_scaling_factor", N, "6.0", "configures skip_step_on_spikes (refused)"},
      {"sliding_window_size", N, "0", kVariant},
      {"source_checkpoint_layout", N, "orbax", kStorage},
      {"sparse_matmul", A, "true", "true: dropless (MaxText's ragged-dot path ignores capacity_factor); false: capacity_factor applies"},
      {"spatial_merge_size_for_vit", N, "2", kMultimodal},
      {"stack_prefill_result_cache", N, "false", kInference},
      {"stderr_sink_level", N, "INFO", kPrimus},
      {"step_deviation_interval_seconds", N, "30", kLogging},
      {"steps", A, "150001", "train_iters (-1: learning_rate_schedule_steps)"},
      {"subslice_shape", N, "\"\"", kMesh},
      {"target_eval_loss", N, "0.0", kLogging},
      {"te_comm_gemm_overlap", N, "disabled", kQuant},
      {"temperature_tuning", X, "false", kNotBuilt},
      {"temporal_patch_size_for_vit", N, "2", kMultimodal},
      {"tile_size_for_vit", N, "336", kMultimodal},
      {"tokenize_eval_data", N, "true", kData},
      {"tokenize_train_data", N, "true", kData},
      {"tokenizer_path", N, "\"\"", kData},
      {"tokenizer_type", N, "sentencepiece", kData},
      {"topk_routing_group", A, "-1", kDeepSeekFile},
      {"tpu_num_chips_to_profile_per_task", N, "1", kLogging},
      {"tpu_num_sparse_core_tiles_to_trace", N, "1", kLogging},
      {"tpu_num_sparse_cores_to_trace", N, "2", kLogging},
      {"train_data_columns", N, "[text]", kData},
      {"train_image_column", N, "image", kMultimodal},
      {"train_split", N, "train", kData},
      {"trainable", N, "false", kPrimus},
      {"trainable_parameters_mask", X, "[]", "freezing parameters is not built"},
      {"trainable_position_size", X, "-1", kNotBuilt},
      {"training_objective", X, "causal_lm", kNotBuilt},
      {"ulysses_context_sharding", N, "context_usp_ulysses", kMesh},
      {"upload_all_profiler_results", N, "false", kLogging},
      {"use_2d_fsdp_sharding", N, "false", kMoe},
      {"use_audio", X, "false", "multimodal models are not built"},
      {"use_audio_in_video", N, "false", kMultimodal},
      {"use_batch_split_schedule", N, "false", kMoe},
      {"use_chat_template", N, "false", kData},
      {"use_chunked_prefill", N, "false", kInference},
      {"use_custom_sort_vjp", N, "true", kMoe},
      {"use_double_wide_mlp", X, "false", kNotBuilt},
      {"use_dpo", X, "false", "MaxText's DPO is not mapped (this engine's: stage: dpo under modules.post_trainer, docs/posttraining.md)"},
      {"use_gather_mosaic_kernel", N, "false", kMoe},
      {"use_gmm_v2", N, "false", kMoe},
      {"use_indexer", X, "false", kNotBuilt},
      {"use_iota_embed", N, "false", kKernels},
      {"use_jax_splash", N, "false", kKernels},
      {"use_manual_quantization", N, "false", kMoe},
      {"use_max_logit_estimate", N, "-1", kKernels},
      {"use_mhc_pallas_kernel", N, "false", kKernels},
      {"use_mrope", X, "false", kNotBuilt},
      {"use_multimodal", X, "false", "multimodal models are not built"},
      {"use_post_attn_norm", X, "false", kNotBuilt},
      {"use_post_ffw_norm", X, "false", kNotBuilt},
      {"use_qk_clip", X, "false", kNotBuilt},
      {"use_qk_norm", A, "false", "qk_layernorm"},
      {"use_qk_norm_in_gdn", N, "true", kVariant},
      {"use_qwix_quantization", N, "false", kQuant},
      {"use_ragged_attention", N, "false", kKernels},
      {"use_ragged_sort", N, "false", kMoe},
      {"use_random_routing", N, "false", kMoe},
      {"use_ring_of_experts", N, "false", kMoe},
      {"use_sequential_layers", N, "false", kKernels},
      {"use_sft", X, "false", "supervised fine-tuning data (prompt masking) is not built; `finetune` loads weights"},
      {"use_sliced_mla_proj", N, "false", kMla},
      {"use_splash_scheduler", N, "false", kKernels},
      {"use_tokamax_gmm", N, "false", kMoe},
      {"use_tokamax_splash", N, "false", kKernels},
      {"use_truncation", N, "true", kData},
      {"use_untrainable_positional_embedding", X, "false", kNotBuilt},
      {"use_vertex_tensorboard", N, "false", kLogging},
      {"v_head_dim", A, "128", kDeepSeekShape},
      {"v_norm_with_scale", N, "true", kVariant},
      {"value_proj", N, "remat", kMemory},
      {"vertex_tensorboard_project", N, "\"\"", kLogging},
      {"vertex_tensorboard_region", N, "\"\"", kLogging},
      {"video_max_grid_h", N, "null", kMultimodal},
      {"video_max_grid_t", N, "null", kMultimodal},
      {"video_max_grid_w", N, "null", kMultimodal},
      {"video_path", N, "\"\"", kMultimodal},
      {"video_placeholder", N, "<|video|>", kMultimodal},
      {"vision_output_dim_for_vit", N, "4096", kMultimodal},
      {"vision_output_length", N, "-1", kMultimodal},
      {"vllm_additional_config", N, "{}", kInference},
      {"vllm_hf_config_path", N, "\"\"", kInference},
      {"vllm_hf_overrides", N, "{}", kInference},
      {"vocab_size", A, "32000", "vocab_size"},
      {"vocab_size_per_layer_input", X, "0", kNotBuilt},
      {"vocab_tiling_ag_once", N, "false", kKernels},
      {"wandb_project_name", N, "maxtext", kLogging},
      {"wandb_run_name", N, "\"\"", kLogging},
      {"warmup_steps_fraction", A, "0.1", "lr_warmup_iters = int(learning_rate_schedule_steps x warmup_steps_fraction), from 0"},
      {"weight_dtype", A, "float32", "bfloat16: use_precision_aware_optimizer with main_params_dtype, main_grads_dtype and exp_avg_sq_dtype bf16 (optax keeps AdamW's nu in the parameters' dtype; needs dtype: bfloat16); float32: fp32 master weights"},
      {"weight_quantization_calibration_method", N, "absmax", kQuant},
      {"weight_sparsity_m", N, "null", kQuant},
      {"weight_sparsity_n", X, "null", kNotBuilt},
      {"weight_sparsity_start_step", N, "50", kQuant},
      {"weight_sparsity_update_step", N, "10", kQuant},
      {"wi_tile_dlhs_batch_seq", N, "512", kMoe},
      {"wi_tile_dlhs_embed_dim", N, "1024", kMoe},
      {"wi_tile_dlhs_mlp_dim", N, "1024", kMoe},
      {"wi_tile_drhs_batch_seq", N, "512", kMoe},
      {"wi_tile_drhs_embed_dim", N, "1024", kMoe},
      {"wi_tile_drhs_mlp_dim", N, "1024", kMoe},
      {"wi_tile_fwd_batch_seq", N, "512", kMoe},
      {"wi_tile_fwd_embed_dim", N, "1024", kMoe},
      {"wi_tile_fwd_mlp_dim", N, "1024", kMoe},
      {"wo_tile_dlhs_batch_seq", N, "512", kMoe},
      {"wo_tile_dlhs_embed_dim", N, "1024", kMoe},
      {"wo_tile_dlhs_mlp_dim", N, "1024", kMoe},
      {"wo_tile_drhs_batch_seq", N, "512", kMoe},
      {"wo_tile_drhs_embed_dim", N, "1024", kMoe},
      {"wo_tile_drhs_mlp_dim", N, "1024", kMoe},
      {"wo_tile_fwd_batch_seq", N, "512", kMoe},
      {"wo_tile_fwd_embed_dim", N, "1024", kMoe},
      {"wo_tile_fwd_mlp_dim", N, "1024", kMoe},
      {"write_estimator_result", N, "false", kCompile},
      {"wsd_decay_steps_fraction", A, "0.1", "lr_wsd_decay_iters = int(learning_rate_schedule_steps x fraction) - 1"},
      {"wsd_decay_style", A, "linear", "lr_wsd_decay_style (linear, cosine)"},
      {"xprof_e2e_enable_fw_power_level_event", N, "false", kLogging},
      {"xprof_e2e_enable_fw_thermal_event", N, "false", kLogging},
      {"xprof_e2e_enable_fw_throttle_event", N, "false", kLogging},
      {"xprof_tpu_power_trace_level", N, "0", kLogging},
      {"z_loss_multiplier", X, "0.0", kNotBuilt},
  };
  return keys;
}
// clang-format on

// A MaxText model_name on this engine: the preset and the model keys that make it MaxText's model,
// or why it is refused.
struct Model {
  const char* name;    // MaxText's model_name; a trailing '*' matches a prefix
  const char* preset;  // nullptr: refused with `why`
  const char* block;   // MaxText's decoder_block of the model
  const char* why;
  bool moe = false;
  // MaxText's model file's values where the preset has others (applied unless the config writes them).
  std::vector<std::pair<const char*, const char*>> differs = {};
};

const char* const kMoeModels =
    "MaxText's mixture-of-experts models other than mixtral-8x7b, mixtral-8x22b and qwen3-30b-a3b are not mapped "
    "onto this engine's MoE yet";
const char* const kDeepSeek =
    "MaxText's DeepSeek-V3 and later models (sigmoid routing with its bias update, and for 3.2 and 4 sparse attention) "
    "are not mapped onto this engine's presets yet; deepseek2-16b and deepseek2-236b are";
const char* const kFamilies = "this model family is not built on this engine yet (the model-families issue adds "
                              "gpt-oss and Llama 4)";

// clang-format off
const std::vector<Model>& models() {
  static const std::vector<Model> m = {
      {"llama2-7b", "llama2_7B", "llama2", nullptr},
      {"llama2-13b", "llama2_13B", "llama2", nullptr},
      {"llama2-70b", "llama2_70B", "llama2", nullptr},
      {"llama3-8b", "llama3_8B", "llama2", nullptr},
      {"llama3-70b", "llama3_70B", "llama2", nullptr},
      {"llama3-405b", "llama3.1_405B", "llama2", nullptr},   // Llama 3.1's shapes; no rotary scaling (below)
      {"llama3.1-8b", "llama3.1_8B", "llama2", nullptr},
      {"llama3.1-70b", "llama3.1_70B", "llama2", nullptr},
      {"llama3.1-405b", "llama3.1_405B", "llama2", nullptr},
      {"llama3.3-70b", "llama3.3_70B", "llama2", nullptr},   // MaxText scales the rotary of llama3.1* names only
      {"qwen3-0.6b", "qwen3_0.6B", "qwen3", nullptr},
      {"qwen3-1.7b", "qwen3_1.7B", "qwen3", nullptr},
      {"qwen3-4b", "qwen3_4B", "qwen3", nullptr},
      {"qwen3-8b", "qwen3_8B", "qwen3", nullptr},
      {"qwen3-14b", "qwen3_14B", "qwen3", nullptr},
      {"qwen3-32b", "qwen3_32B", "qwen3", nullptr},
      {"mixtral-8x7b", "mixtral_8x7B_v0.1", "mixtral", nullptr, true},
      {"mixtral-8x22b", "mixtral_8x22B_v0.1", "mixtral", nullptr, true, {{"vocab_size", "32768"}}},
      {"qwen3-30b-a3b-base", "qwen3_30B_A3B", "qwen3_moe", nullptr, true},
      {"qwen3-30b-a3b", "qwen3_30B_A3B", "qwen3_moe", nullptr, true, {{"rotary_base", "10000000"}}},
      {"deepseek2-16b", "deepseek_v2_lite", "deepseek", nullptr, true},
      // MaxText's file leaves out DeepSeek-V2's device-limited routing (n_routing_groups -1).
      {"deepseek2-236b", "deepseek_v2", "deepseek", nullptr, true,
       {{"moe_router_num_groups", "null"}, {"moe_router_group_topk", "null"}}},
      {"deepseek*", nullptr, nullptr, kDeepSeek},
      {"qwen3-235b-a22b", nullptr, nullptr, "its model file sets load_balance_loss_weight 0.001: MaxText's per-sequence "
                                            "load-balance loss (scaled by num_experts^2) is not mapped"},
      {"qwen3-480b-a35b", nullptr, nullptr, kMoeModels},
      {"gpt-oss-*", nullptr, nullptr, kFamilies},
      {"llama4-*", nullptr, nullptr, kFamilies},
      {"gemma*", nullptr, nullptr, "Gemma is not built on this engine"},
      {"default", nullptr, nullptr, "MaxText's default model (base.yml's shapes) has no preset here; name a model_name"},
  };
  return m;
}
// clang-format on

// MaxText's DeepSeek-V2 model files (configs/models/deepseek2-16b.yml and deepseek2-236b.yml at the
// commit above): the values the presets deepseek_v2_lite and deepseek_v2 carry (with the rows'
// `differs`). Two have no counterpart in the engine's math and are the same model either way:
// rope_interleave (MaxText rotates interleaved pairs, this engine's latent attention rotates halves:
// a fixed permutation of the rotary rows of the query and key projections, which training from a
// random initialisation does not see) and rope_attention_scaling false (the cos/sin factor
// mscale / mscale_all_dim is 1 for these models).
struct FileValue {
  const char* key;
  const char* v16b;
  const char* v236b;
};
// clang-format off
const std::vector<FileValue>& deepseek_file() {
  static const std::vector<FileValue> f = {
      {"attention_type", "mla", "mla"}, {"q_lora_rank", "0", "1536"}, {"kv_lora_rank", "512", "512"},
      {"qk_nope_head_dim", "128", "128"}, {"qk_rope_head_dim", "64", "64"}, {"v_head_dim", "128", "128"},
      {"rope_type", "yarn", "yarn"}, {"rope_factor", "40", "40"}, {"beta_fast", "32", "32"}, {"beta_slow", "1", "1"},
      {"mscale", "0.707", "0.707"}, {"rope_interleave", "true", "true"}, {"rope_truncate", "true", "true"},
      {"rope_attention_scaling", "false", "false"}, {"rope_pairwise", "false", "false"},
      {"original_max_position_embeddings", "4096", "4096"}, {"max_position_embeddings", "163840", "163840"},
      {"first_num_dense_layers", "1", "1"}, {"shared_experts", "2", "2"},
      {"routed_scaling_factor", "1.0", "16.0"}, {"routed_score_func", "softmax", "softmax"},
      {"routed_bias", "false", "false"}, {"n_routing_groups", "-1", "-1"}, {"topk_routing_group", "-1", "-1"},
      {"o_groups", "0", "0"}, {"o_lora_rank", "0", "0"},
  };
  return f;
}
// clang-format on

bool same_value(const std::string& a, const std::string& b) {
  char *ea = nullptr, *eb = nullptr;
  const double x = std::strtod(a.c_str(), &ea), y = std::strtod(b.c_str(), &eb);
  if (!a.empty() && !b.empty() && *ea == '\0' && *eb == '\0') return x == y;
  return a == b;
}

// The DeepSeek-V2 shapes a config may change: MaxText's key, the engine's.
const std::vector<std::pair<const char*, const char*>>& deepseek_shapes() {
  static const std::vector<std::pair<const char*, const char*>> m = {
      {"kv_lora_rank", "kv_lora_rank"},         {"qk_nope_head_dim", "qk_head_dim"},
      {"qk_rope_head_dim", "qk_pos_emb_head_dim"}, {"v_head_dim", "v_head_dim"},
      {"rope_factor", "rotary_scaling_factor"}, {"beta_fast", "beta_fast"},
      {"beta_slow", "beta_slow"},               {"original_max_position_embeddings", "original_max_position_embeddings"},
      {"max_position_embeddings", "max_position_embeddings"}, {"routed_scaling_factor", "moe_router_topk_scaling_factor"}};
  return m;
}

// The DeepSeek-V2 keys. For those models a written shape (deepseek_shapes, q_lora_rank, mscale,
// first_num_dense_layers, shared_experts) is applied; any other written key must be the model
// file's value. The other models read them and leave them alone, except the switch to latent
// attention.
void deepseek_keys(DialectSettings& s, const std::string& name, bool deepseek) {
  const auto is_shape = [](const std::string& key) {
    for (const auto& [k, e] : deepseek_shapes())
      if (key == k) return true;
    for (const char* k : {"q_lora_rank", "mscale", "first_num_dense_layers", "shared_experts"})
      if (key == k) return true;
    return false;
  };
  for (const FileValue& v : deepseek_file()) {
    const std::string got = s.is_null(v.key) ? "" : s.text(v.key);
    const std::string want = name == "deepseek2-236b" ? v.v236b : v.v16b;
    if (!deepseek || !s.written(v.key) || same_value(got, want)) continue;
    if (!is_shape(v.key))
      s.refuse(v.key, fmt::format("MaxText's {} model file has {}: {}, which the preset trains; another value is not "
                                  "mapped",
                                  name, v.key, want));
  }
  if (deepseek) {
    for (const auto& [key, engine] : deepseek_shapes())
      if (s.written(key)) s.set(engine, yaml_number(s.number(key)), {key});
    if (s.written("q_lora_rank")) {  // 0: no query latent
      const int64_t q = s.integer("q_lora_rank");
      s.set("q_lora_rank", q > 0 ? YAML::Node(q) : YAML::Node(YAML::NodeType::Null), {"q_lora_rank"});
    }
    if (s.written("mscale")) {  // softmax scale and the cos/sin factor mscale / mscale_all_dim = 1 (rope_attention_scaling false)
      s.set("mscale", yaml_number(s.number("mscale")), {"mscale"});
      s.set("mscale_all_dim", yaml_number(s.number("mscale")), {"mscale"});
    }
    // The layer count and expert width as written, else the model file's.
    const bool big = name == "deepseek2-236b";
    const int64_t layers = s.written("base_num_decoder_layers") ? s.integer("base_num_decoder_layers") : big ? 60 : 27;
    const int64_t width = s.written("base_moe_mlp_dim") ? s.integer("base_moe_mlp_dim") : big ? 1536 : 1408;
    const int64_t dense = s.written("first_num_dense_layers") ? s.integer("first_num_dense_layers") : 1;
    const int64_t shared = s.written("shared_experts") ? s.integer("shared_experts") : 2;
    if (dense < 0 || dense > layers)
      s.refuse("first_num_dense_layers", fmt::format("must be between 0 and the {} layers", layers));
    s.set("moe_layer_freq", YAML::Node(fmt::format("([0]*{}+[1]*{})", dense, layers - dense)),
          {"first_num_dense_layers", "base_num_decoder_layers"});
    s.set("moe_shared_expert_intermediate_size", YAML::Node(shared * width), {"shared_experts", "base_moe_mlp_dim"});
  }
  const bool compressed = s.node("compress_ratios").IsSequence() && s.node("compress_ratios").size() > 0;
  s.number("compressed_rope_max_timescale");  // read: only DeepSeek-V4's compression (refused below) uses it
  if (compressed) s.refuse("compress_ratios", "DeepSeek-V4's compressed attention is not built");
  if (!deepseek && s.text("attention_type") != "global")
    s.refuse("attention_type", "attention variants other than global causal attention are not built (latent "
                               "attention only as MaxText's DeepSeek-V2 models have it)");
}

bool matches(const char* pattern, const std::string& name) {
  const std::string p = pattern;
  return p.ends_with("*") ? name.starts_with(p.substr(0, p.size() - 1)) : name == p;
}

// The devices of each parallel axis, ici (within a slice) times dcn (across slices), with MaxText's
// -1 filled from the launch.
class Mesh {
 public:
  explicit Mesh(DialectSettings& s) : s_(s) {
    static const char* const axes[] = {"data",           "fsdp",
                                       "fsdp_transpose", "sequence",
                                       "context",        "context_usp_ulysses",
                                       "tensor",         "tensor_sequence",
                                       "pipeline",       "expert"};
    for (const char* axis : axes) {
      for (const char* level : {"ici", "dcn"}) {
        const std::string key = fmt::format("{}_{}_parallelism", level, axis);
        const int64_t v = s.integer(key);
        if (v == 0 || v < -1) s.refuse(key, "a degree is 1 or more, or -1 (the devices left over)");
        entries_.push_back({key, axis, level, v});
      }
    }
    fill("ici");
    fill("dcn");
  }
  int64_t degree(const std::string& axis) const {
    int64_t d = 1;
    for (const auto& e : entries_)
      if (e.axis == axis) d *= e.value;
    return d;
  }
  // The keys of an axis, those above 1 first (for messages).
  std::vector<std::string> keys(const std::string& axis) const {
    std::vector<std::string> out;
    for (const auto& e : entries_)
      if (e.axis == axis && e.value > 1) out.push_back(e.key);
    for (const auto& e : entries_)
      if (e.axis == axis && e.value <= 1) out.push_back(e.key);
    return out;
  }
  int64_t devices() const {
    int64_t d = 1;
    for (const auto& e : entries_) d *= e.value;
    return d;
  }

 private:
  struct Entry {
    std::string key, axis, level;
    int64_t value;
  };
  // One -1 per level takes the devices the others leave. The launch is taken as one slice when
  // both levels hold a -1 (the dcn one becomes 1); with no launch known, every -1 is 1.
  void fill(const std::string& level) {
    Entry* open = nullptr;
    int64_t known = 1;
    for (auto& e : entries_) {
      if (e.value != -1) {
        known *= e.value;
        continue;
      }
      if (e.level != level) continue;
      if (open) s_.refuse(e.key, fmt::format("only one {}_*_parallelism may be -1 (also {})", level, open->key));
      open = &e;
    }
    if (!open) return;
    const bool other_open = std::any_of(entries_.begin(), entries_.end(),
                                        [&](const Entry& e) { return e.level != level && e.value == -1; });
    if (!s_.world_known() || (level == "dcn" && other_open)) {
      open->value = 1;
      return;
    }
    if (s_.world_size() % known != 0)
      s_.refuse(open->key, fmt::format("-1 takes the devices left over, but {} ranks are not a multiple of the other "
                                       "degrees' {}",
                                       s_.world_size(), known));
    open->value = s_.world_size() / known;
  }
  DialectSettings& s_;
  std::vector<Entry> entries_;
};

class MaxText final : public Dialect {
 public:
  Framework framework() const override { return Framework::MaxText; }
  const char* source() const override {
    return "AI-Hypercomputer/maxtext at e591f30c (base.yml, configs/models) and AMD-AGI/Primus at fd1eeabb";
  }
  const std::vector<DialectKey>& keys() const override { return table(); }
  void translate(DialectSettings& s) const override {
    quantization(s);  // first: a config that asks for quantized training hears that before the layout
    const bool moe = model(s);
    layout_and_batch(s, moe);
    schedule(s);
    rest(s);
  }

 private:
  // model_name -> a preset; returns whether it has MoE layers.
  static bool model(DialectSettings& s) {
    const std::string name = s.text("model_name");
    auto it = std::find_if(models().begin(), models().end(), [&](const Model& m) { return matches(m.name, name); });
    if (it == models().end()) {
      std::vector<std::string> known;
      for (const auto& m : models())
        if (m.preset) known.push_back(m.name);
      s.refuse("model_name", fmt::format("no preset of this engine is MaxText's '{}'; mapped models: {}", name,
                                         fmt::join(known, ", ")));
    }
    if (!it->preset) s.refuse("model_name", it->why);
    s.set_model(it->preset, {"model_name"});
    for (const auto& [key, value] : it->differs) s.set(key, YAML::Load(value), {"model_name"});
    const std::string block = s.text("decoder_block");
    if (s.written("decoder_block") && block != it->block)
      s.refuse("decoder_block",
               fmt::format("{} is built from the '{}' block here; another block is not mapped", name, it->block));
    static const std::vector<std::pair<const char*, const char*>> shapes = {{"base_emb_dim", "hidden_size"},
                                                                            {"base_num_query_heads",
                                                                             "num_attention_heads"},
                                                                            {"base_num_kv_heads", "num_query_groups"},
                                                                            {"base_mlp_dim", "ffn_hidden_size"},
                                                                            {"base_num_decoder_layers", "num_layers"},
                                                                            {"head_dim", "kv_channels"},
                                                                            {"vocab_size", "vocab_size"}};
    for (const auto& [key, engine] : shapes)  // MaxText's model file sets them; only a written value overrides
      if (s.written(key)) s.set(engine, YAML::Node(s.integer(key)), {key});
    if (s.written("normalization_layer_epsilon"))
      s.set("norm_epsilon", yaml_number(s.number("normalization_layer_epsilon")), {"normalization_layer_epsilon"});
    if (s.written("rope_max_timescale"))
      s.set("rotary_base", yaml_number(s.number("rope_max_timescale")), {"rope_max_timescale"});
    if (s.written("use_qk_norm")) s.set("qk_layernorm", YAML::Node(s.flag("use_qk_norm")), {"use_qk_norm"});
    // Tied embeddings: MaxText divides the logits by sqrt(emb_dim) unless normalize_embedding_logits
    // is off, which the Qwen3 model files (the tied models mapped here) set.
    if (s.written("logits_via_embedding")) {
      const bool tied = s.flag("logits_via_embedding");
      s.set("untie_embeddings_and_output_weights", YAML::Node(!tied), {"logits_via_embedding"});
      const bool normalize = s.written("normalize_embedding_logits") ? s.flag("normalize_embedding_logits")
                                                                     : std::string(it->block) != "qwen3";
      if (tied && normalize)
        s.refuse("logits_via_embedding",
                 "tied embeddings with normalize_embedding_logits (logits divided by sqrt(emb_dim)) are not built");
    } else if (s.written("normalize_embedding_logits")) {
      s.flag("normalize_embedding_logits");  // only tied embeddings read it
    }
    const bool deepseek = std::string(it->block) == "deepseek";
    deepseek_keys(s, name, deepseek);
    // MaxText's Llama 3.1 rotary scaling: model names llama3.1* or rope_type llama3.1, with rope_use_scale.
    const std::string rope = s.text("rope_type");
    if (rope.starts_with("yarn") && !deepseek)
      s.refuse("rope_type", "the YaRN rotary of a model without latent attention is not mapped");
    const bool use_scale = s.flag("rope_use_scale");
    const bool scaled = (name.starts_with("llama3.1") || rope.starts_with("llama3.1")) && use_scale;
    s.set("use_rope_scaling", YAML::Node(scaled), {"model_name", "rope_type", "rope_use_scale"});
    experts(s, *it);
    return it->moe;
  }

  // MaxText's MoE layers (layers/moe.py) for the Mixtral and Qwen3 MoE blocks: the top-k of the
  // raw gate logits, a softmax over them (norm_topk_prob then changes nothing); for the DeepSeek-V2
  // block a softmax over every expert, then the top-k, scaled by routed_scaling_factor and not
  // renormalised, with the shared experts beside them (the presets' own routing); no auxiliary loss
  // unless load_balance_loss_weight (refused: a per-sequence loss scaled by num_experts^2), and on
  // the dense-matmul path (sparse_matmul: false) tokens dropped per sequence beyond the capacity.
  static void experts(DialectSettings& s, const Model& m) {
    const int64_t experts = s.integer("num_experts"), topk = s.integer("num_experts_per_tok");
    const int64_t moe_dim = s.integer("base_moe_mlp_dim");
    const double capacity = s.number("capacity_factor"), balance = s.number("load_balance_loss_weight");
    const bool sparse = s.flag("sparse_matmul");
    s.flag("norm_topk_prob");
    if (!m.moe) {
      if (experts > 1)
        s.refuse("num_experts", fmt::format("{} is a dense model here; the MoE models mapped are mixtral-8x7b, "
                                            "mixtral-8x22b, qwen3-30b-a3b, deepseek2-16b and deepseek2-236b",
                                            m.name));
      return;
    }
    if (s.written("num_experts")) s.set("num_experts", YAML::Node(experts), {"num_experts"});
    if (s.written("num_experts_per_tok")) s.set("moe_router_topk", YAML::Node(topk), {"num_experts_per_tok"});
    if (s.written("base_moe_mlp_dim") && moe_dim > 0)
      s.set("moe_ffn_hidden_size", YAML::Node(moe_dim), {"base_moe_mlp_dim"});
    if (balance > 0)
      s.refuse("load_balance_loss_weight",
               "MaxText's load-balance loss (per sequence, scaled by num_experts^2) is not mapped onto this engine's "
               "aux_loss or seq_aux_loss");
    s.set("moe_router_load_balancing_type", YAML::Node("none"), {"load_balance_loss_weight"});
    s.set("moe_aux_loss_coeff", YAML::Node(0), {"load_balance_loss_weight"});
    const std::vector<std::string> from = {"capacity_factor", "sparse_matmul"};
    if (capacity > 0 && !sparse) {
      s.set("moe_expert_capacity_factor", yaml_number(capacity), from);
      s.set("moe_token_drop_policy", YAML::Node("position"), from);
      s.set("moe_expert_capacity_per_sequence", YAML::Node(true), from);
    } else {
      s.set("moe_expert_capacity_factor", YAML::Node(YAML::NodeType::Null), from);
    }
  }

  // The mesh, the batch (per_device_batch_size x the devices), the precision.
  static void layout_and_batch(DialectSettings& s, bool moe) {
    const Mesh mesh(s);
    if (s.world_known() && mesh.devices() != s.world_size())
      s.refuse("ici_fsdp_parallelism", fmt::format("the *_parallelism degrees ask for {} devices, this launch has {}",
                                                   mesh.devices(), s.world_size()));
    // MaxText shards the dense parameters over the expert axis as over fsdp, and splits the batch
    // over it; the experts of an MoE model are split over it (expert parallelism).
    const int64_t data = mesh.degree("data");
    const int64_t fsdp = mesh.degree("fsdp") * mesh.degree("fsdp_transpose") * mesh.degree("expert");
    const int64_t ring = mesh.degree("sequence") * mesh.degree("context"), a2a = mesh.degree("context_usp_ulysses");
    const int64_t tp = mesh.degree("tensor") * mesh.degree("tensor_sequence"), pp = mesh.degree("pipeline");
    if (data > 1 && fsdp > 1)
      s.refuse(mesh.keys("data").front(),
               fmt::format("data ({}) and fsdp ({}) parallelism at once (hybrid sharding) is not built; this engine "
                           "shards over the whole data-parallel group or replicates",
                           data, fsdp));
    if (ring > 1 && a2a > 1)
      s.refuse("ici_context_usp_ulysses_parallelism",
               "Ulysses and ring context parallelism at once is not built (one of cp_comm_type p2p or a2a)");
    const std::vector<std::string> dp_keys = {"ici_data_parallelism", "dcn_data_parallelism", "ici_fsdp_parallelism",
                                              "dcn_fsdp_parallelism"};
    s.set("data_parallel_sharding_strategy", YAML::Node(fsdp > 1 ? "optim_grads_params" : "no_shard"), dp_keys);
    s.set("tensor_model_parallel_size", YAML::Node(tp), {"ici_tensor_parallelism", "ici_tensor_sequence_parallelism"});
    s.set("sequence_parallel", YAML::Node(mesh.degree("tensor_sequence") > 1), {"ici_tensor_sequence_parallelism"});
    s.set("pipeline_model_parallel_size", YAML::Node(pp), {"ici_pipeline_parallelism", "dcn_pipeline_parallelism"});
    s.set("context_parallel_size", YAML::Node(ring * a2a), {"ici_context_parallelism", "ici_sequence_parallelism"});
    if (a2a > 1) s.set("cp_comm_type", YAML::Node("a2a"), {"ici_context_usp_ulysses_parallelism"});
    if (moe) {
      s.set("expert_model_parallel_size", YAML::Node(mesh.degree("expert")),
            {"ici_expert_parallelism", "dcn_expert_parallelism"});
      if (ring * a2a > 1 && s.number("capacity_factor") > 0 && !s.flag("sparse_matmul"))
        s.refuse("capacity_factor", "MaxText drops tokens per sub-sequence under context parallelism; not mapped");
    }

    // MaxText: global batch = int(devices x per_device_batch_size) x gradient_accumulation_steps,
    // spread over the batch axes (data, fsdp and expert); pipeline stages split it in microbatches.
    const double per_device = s.number("per_device_batch_size");
    const int64_t accumulation = s.integer("gradient_accumulation_steps");
    if (per_device <= 0) s.refuse("per_device_batch_size", "must be positive");
    if (accumulation < 1) s.refuse("gradient_accumulation_steps", "1 or more");
    const int64_t step_batch = int64_t(double(mesh.devices()) * per_device);
    const int64_t batch_ranks = data * fsdp;
    if (step_batch < batch_ranks || step_batch % batch_ranks != 0)
      s.refuse("per_device_batch_size",
               fmt::format("{} devices x {} = {} sequences do not split evenly over the {} data-parallel ranks",
                           mesh.devices(), per_device, step_batch, batch_ranks));
    int64_t micro = step_batch / batch_ranks;
    std::vector<std::string> micro_from = {"per_device_batch_size"};
    const int64_t pipeline_micro = s.integer("num_pipeline_microbatches");
    if (pp > 1) {
      const int64_t n = pipeline_micro == -1 ? pp : pipeline_micro;
      if (n < 1 || micro % n != 0)
        s.refuse("num_pipeline_microbatches",
                 fmt::format("must divide the {} sequences of a data-parallel rank", micro));
      micro /= n;
      micro_from.push_back("num_pipeline_microbatches");
    }
    s.set("micro_batch_size", YAML::Node(micro), micro_from);
    s.set("global_batch_size", YAML::Node(step_batch * accumulation),
          {"per_device_batch_size", "gradient_accumulation_steps"});
    s.set("seq_length", YAML::Node(s.integer("max_target_length")), {"max_target_length"});
    const std::string dtype = s.text("dtype");
    if (dtype != "bfloat16" && dtype != "float32") s.refuse("dtype", "bfloat16 or float32");
    s.set("bf16", YAML::Node(dtype == "bfloat16"), {"dtype"});
  }

  // MaxText's schedule (create_learning_rate_schedule) as this engine's: a linear warmup from 0 over
  // int(S x warmup_steps_fraction) steps, then a cosine over the remaining steps of S whose last
  // step lands on learning_rate x final_fraction (this engine's cosine with lr_decay_iters S - 1),
  // or WSD: stable, then a decay over int(S x wsd_decay_steps_fraction) steps ending on the final
  // value (this engine's WSD with lr_wsd_decay_iters one less).
  static void schedule(DialectSettings& s) {
    int64_t steps = s.integer("steps"), total = s.integer("learning_rate_schedule_steps");
    if (steps == -1) steps = total;
    if (total == -1) total = steps;
    if (steps < 1) s.refuse("steps", "train for 1 step or more (steps, or learning_rate_schedule_steps)");
    if (total < steps)
      s.refuse("learning_rate_schedule_steps",
               "a schedule shorter than steps (MaxText then trains at learning rate 0) is not built");
    const double lr = s.number("learning_rate");
    // Older MaxText names the final fraction cosine_learning_rate_final_fraction.
    const bool old_name = s.written("cosine_learning_rate_final_fraction") &&
                          !s.written("learning_rate_final_fraction");
    const std::string final_key = old_name ? "cosine_learning_rate_final_fraction" : "learning_rate_final_fraction";
    const double final_fraction = s.number(final_key);
    const int64_t warmup = int64_t(double(total) * s.number("warmup_steps_fraction"));
    s.set("train_iters", YAML::Node(steps), {"steps"});
    s.set("lr", yaml_number(lr), {"learning_rate"});
    s.set("min_lr", yaml_number(lr * final_fraction), {final_key, "learning_rate"});
    s.set("lr_warmup_init", yaml_number(0.0), {"warmup_steps_fraction"});
    s.set("lr_warmup_iters", YAML::Node(warmup), {"warmup_steps_fraction", "learning_rate_schedule_steps"});
    const std::string type = s.text("lr_schedule_type");
    const int64_t wsd_steps = int64_t(double(total) * s.number("wsd_decay_steps_fraction"));
    const std::string wsd_style = s.text("wsd_decay_style");
    if (total - warmup < 2)
      s.refuse("warmup_steps_fraction",
               fmt::format("the warmup ({} steps) leaves fewer than 2 of the schedule's {} steps to decay", warmup,
                           total));
    const std::vector<std::string> from = {"lr_schedule_type", "learning_rate_schedule_steps"};
    s.set("lr_decay_iters", YAML::Node(total - 1), from);
    if (type == "cosine") {
      s.set("lr_decay_style", YAML::Node("cosine"), from);
      return;
    }
    if (type != "wsd") s.refuse("lr_schedule_type", "cosine or wsd");
    if (wsd_style != "linear" && wsd_style != "cosine") s.refuse("wsd_decay_style", "linear or cosine");
    if (wsd_steps < 2 || warmup + wsd_steps > total)
      s.refuse("wsd_decay_steps_fraction",
               fmt::format("the decay takes {} steps; 2 or more, and with the warmup within the {} steps", wsd_steps,
                           total));
    s.set("lr_decay_style", YAML::Node("WSD"), from);
    s.set("lr_wsd_decay_style", YAML::Node(wsd_style), {"wsd_decay_style"});
    s.set("lr_wsd_decay_iters", YAML::Node(wsd_steps - 1), {"wsd_decay_steps_fraction"});
  }

  // weight_dtype and mu_dtype as the precision-aware optimizer. MaxText keeps the parameters in
  // weight_dtype, their gradients with them, and optax's AdamW keeps mu in mu_dtype (weight_dtype when
  // unset) and nu in the parameters' dtype. This engine stores them so (bf16 values) but computes the
  // update in fp32 and rounds on store, as Transformer Engine does; optax computes in the arrays'
  // dtype (docs/optim.md#low-precision-optimizer-state).
  static void state_dtypes(DialectSettings& s) {
    const std::string weight = s.text("weight_dtype"), mu_written = s.text("mu_dtype");
    if (weight != "float32" && weight != "bfloat16") s.refuse("weight_dtype", "float32 or bfloat16");
    if (!mu_written.empty() && mu_written != "float32" && mu_written != "bfloat16")
      s.refuse("mu_dtype", "float32 or bfloat16 (or unset: weight_dtype's)");
    const bool bf16_weights = weight == "bfloat16";
    const bool bf16_mu = (mu_written.empty() ? weight : mu_written) == "bfloat16";
    if (bf16_weights && s.text("dtype") != "bfloat16")
      s.refuse("weight_dtype",
               "bfloat16 weights computed in float32 (dtype: float32) are not mapped: this engine's bf16 gradients "
               "need bf16 compute; set dtype: bfloat16, or weight_dtype: float32");
    const std::vector<std::string> from = {"weight_dtype", "mu_dtype"};
    s.set("use_precision_aware_optimizer", YAML::Node(bf16_weights || bf16_mu), from);
    s.set("exp_avg_dtype", YAML::Node(bf16_mu ? "bf16" : "fp32"), from);
    s.set("exp_avg_sq_dtype", YAML::Node(bf16_weights ? "bf16" : "fp32"), {"weight_dtype"});
    s.set("main_params_dtype", YAML::Node(bf16_weights ? "bf16" : "fp32"), {"weight_dtype"});
    s.set("main_grads_dtype", YAML::Node(bf16_weights ? "bf16" : "fp32"), {"weight_dtype", "dtype"});
  }

  // quantization: MaxText's fp8 (flax's Fp8DirectDotGeneralOp) and nanoo_fp8 (NANOOFp8DotGeneralOp,
  // with the FNUZ formats) are delayed scaling as TE's, E4M3 forward and E5M2 gradients with a
  // 1024-step history's max and margin 0, but flax quantizes x / scale in the compute dtype (bf16
  // in MaxText's and Primus's configs): the reciprocal scale rounded to bf16 and the quotient rounded
  // to bf16 before FP8, and nanoo_fp8 feeds the GEMM bf16(q x scale) rather than FP8 values with the
  // scales after it. Other values than those FP8 would train: refused, each with why.
  static void quantization(DialectSettings& s) {
    const std::string q = s.text("quantization");
    if (q.empty()) return;
    const char* flax = "flax's delayed scaling (E4M3 forward, E5M2 gradients, a 1024-step amax history, margin 0, as "
                       "this engine's fp8 hybrid with fp8_recipe delayed) quantizes x / scale in the compute dtype: "
                       "with dtype bfloat16 the scale and each scaled value are rounded to bf16 before FP8 (two "
                       "roundings), where this engine rounds x * scale in fp32 once as Transformer Engine does; ";
    if (q == "fp8")
      s.refuse("quantization", std::string(flax) + "the numbers would differ. Use this engine's keys instead (fp8: "
                                                   "hybrid, fp8_recipe: delayed, docs/fp8.md)");
    if (q == "nanoo_fp8")
      s.refuse("quantization",
               std::string(flax) + "nanoo_fp8 also runs the GEMM on the dequantized bf16(q x scale) operands in the "
                                   "FNUZ formats (E4M3FNUZ, E5M2FNUZ) that this engine does not quantize to; the "
                                   "numbers would differ. Use this engine's keys instead (fp8: hybrid, fp8_recipe: "
                                   "delayed, docs/fp8.md)");
    s.refuse("quantization", fmt::format("'{}' is not built: of MaxText's modes only FP8 is, through this engine's "
                                         "keys (fp8, fp8_recipe; docs/fp8.md); int8, AQT and Qwix quantization are not",
                                         q));
  }

  static void rest(DialectSettings& s) {
    s.set("adam_beta1", yaml_number(s.number("adam_b1")), {"adam_b1"});
    s.set("adam_beta2", yaml_number(s.number("adam_b2")), {"adam_b2"});
    s.set("adam_eps", yaml_number(s.number("adam_eps")), {"adam_eps"});
    s.set("weight_decay", yaml_number(s.number("adam_weight_decay")), {"adam_weight_decay"});
    s.set("decay_norms_and_biases", YAML::Node(true), {"adam_weight_decay"});
    s.set("clip_grad", yaml_number(s.number("gradient_clipping_threshold")), {"gradient_clipping_threshold"});
    state_dtypes(s);
    s.set("seed", YAML::Node(s.integer("init_weights_seed")), {"init_weights_seed"});
    s.set("log_interval", YAML::Node(s.integer("log_period")), {"log_period"});
    const std::string data = s.text("dataset_type");
    if (data != "synthetic" && !s.has_engine_key("data_path"))
      s.refuse("dataset_type",
               "MaxText's tfds, hf and grain pipelines are not built; set dataset_type: synthetic, or give "
               "Megatron-format data with this engine's keys data_path, tokenizer_type and tokenizer_model "
               "(docs/data.md)");
    s.set("mock_data", YAML::Node(data == "synthetic"), {"dataset_type"});
    const std::string remat = s.text("remat_policy");
    s.set("recompute_granularity", YAML::Node(remat == "full" ? "full" : "selective"), {"remat_policy"});
    const int64_t eval_interval = s.integer("eval_interval"), eval_steps = s.integer("eval_steps");
    if (eval_interval > 0 && eval_steps < 1)
      s.refuse("eval_steps", "evaluation needs a number of batches (eval_steps) here");
    s.set("eval_interval", YAML::Node(std::max<int64_t>(eval_interval, 0)), {"eval_interval"});
    if (eval_interval > 0) s.set("eval_iters", YAML::Node(eval_steps), {"eval_steps"});
    const bool save = s.flag("enable_checkpointing");
    const int64_t period = s.integer("checkpoint_period");
    s.set("save_interval", YAML::Node(save ? period : 0), {"enable_checkpointing", "checkpoint_period"});
    const std::string keep = s.text("max_num_checkpoints_to_keep");
    if (keep != "None" && !keep.empty())
      s.set("keep_last_checkpoints", YAML::Node(s.integer("max_num_checkpoints_to_keep")),
            {"max_num_checkpoints_to_keep"});
    else
      s.set("keep_last_checkpoints", YAML::Node(0), {"max_num_checkpoints_to_keep"});
  }
};

}  // namespace

const Dialect& maxtext_dialect() {
  static const MaxText d;
  return d;
}

}  // namespace primus::config
