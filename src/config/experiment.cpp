#include "config/experiment.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/foreign_keys.h"
#include "config/lora.h"
#include "core/error.h"
#include "core/suggest.h"

namespace fs = std::filesystem;

namespace primus::config {

#define KEY(name, help) KeyInfo{#name, &TrainingArgs::name, help}

const std::vector<KeyInfo>& training_keys() {
  static const std::vector<KeyInfo> keys = {
      KEY(micro_batch_size, "sequences per microbatch (one forward/backward)"),
      KEY(global_batch_size, "sequences per optimizer step; a multiple of micro_batch_size (gradient accumulation). "
                             "0: micro_batch_size"),
      KEY(seq_length, "tokens per sequence; at most the model's max_position_embeddings. 0: max_position_embeddings"),
      KEY(train_iters, "optimizer steps to train for (required)"),
      KEY(lr, "peak learning rate"),
      KEY(min_lr, "learning rate at the end of the decay"),
      KEY(lr_warmup_init, "learning rate at the first warmup step"),
      KEY(lr_warmup_iters, "steps of linear warmup from lr_warmup_init to lr"),
      KEY(lr_decay_iters, "steps over which lr decays to min_lr (warmup included). 0: train_iters"),
      KEY(lr_decay_style, "constant | linear | cosine | inverse-square-root | WSD"),
      KEY(lr_wsd_decay_style, "WSD's final decay: linear | cosine | exponential | minus_sqrt"),
      KEY(lr_wsd_decay_iters, "WSD: steps of the final decay at the end of lr_decay_iters"),
      KEY(weight_decay, "AdamW's decoupled weight decay (not applied to norms and biases)"),
      KEY(decay_norms_and_biases, "apply weight_decay to norm weights and biases too, as torchtitan's and MaxText's "
                                  "AdamW do (their configs set it); false: Megatron's rule"),
      KEY(clip_grad, "clip gradients to this global L2 norm; 0 turns clipping off"),
      KEY(adam_beta1, "AdamW beta1"),
      KEY(adam_beta2, "AdamW beta2"),
      KEY(adam_eps, "AdamW epsilon"),
      KEY(use_precision_aware_optimizer,
          "allow the four dtypes below to be other than fp32 (Megatron's precision-aware "
          "optimizer; docs/optim.md#low-precision-optimizer-state)"),
      KEY(main_grads_dtype, "fp32 | bf16: bf16 rounds the gradients to bf16 after each microbatch's accumulation and "
                            "after the data-parallel reduction, as Megatron's bf16 gradient buffer (needs bf16: true)"),
      KEY(main_params_dtype, "fp32 | fp16 | bf16: fp16 reads each step's master weights as Transformer Engine's "
                             "fp16 master with a per-tensor scale (needs bf16: true); bf16 keeps the parameters bf16 "
                             "(each update rounded to bf16, no fp32 master values: MaxText's weight_dtype bfloat16)"),
      KEY(exp_avg_dtype, "fp32 | bf16 | fp16 | fp8: AdamW's first moment stored in that dtype (the update computed in "
                         "fp32; bf16 rounded to nearest even, fp16 and fp8 (E4M3) with a per-tensor scale from the "
                         "tensor's amax, as Transformer Engine's FusedAdam)"),
      KEY(exp_avg_sq_dtype, "fp32 | bf16 | fp16 | fp8: AdamW's second moment, as exp_avg_dtype"),
      KEY(seed, "seed of weight init and data shuffling"),
      KEY(log_interval, "log a line (and a metrics.jsonl row) every this many steps"),
      KEY(eval_interval, "evaluate on the valid split every this many steps; 0: never"),
      KEY(eval_iters, "global batches of the valid split per evaluation"),
      KEY(save_interval, "save a checkpoint every this many steps; 0: only at the end"),
      KEY(save, "checkpoint folder. Empty: <workspace>/<exp_name>/checkpoints"),
      KEY(load, "checkpoint to start from: an iter_NNNNNNN folder, or a folder with a `latest` file"),
      KEY(auto_resume, "resume from the newest good checkpoint in `save` when there is one"),
      KEY(finetune, "load only the weights of `load` (an imported Hugging Face checkpoint, say): start at "
                    "iteration 0 with a fresh optimizer and data order"),
      KEY(pretrained_checkpoint, "checkpoint whose weights a new run starts from (as `finetune`) when `save` holds "
                                 "no checkpoint to resume; a restarted run resumes its own checkpoints"),
      KEY(no_load_optim, "resume the weights, iteration and data position of a checkpoint without its optimizer state "
                         "(AdamW starts afresh), e.g. when only that state is damaged"),
      KEY(load_strict, "a checkpoint must hold exactly the model of this config: a field that changes the weights "
                       "(docs/checkpoints.md#what-a-load-checks) or a tensor without a place is an error. false: load "
                       "the tensors whose name and shape match, leave the others at their initial values, and log "
                       "every tensor dropped or left"),
      KEY(keep_last_checkpoints, "this run's checkpoints kept in `save` (newest saves); older ones are deleted. 0: keep all"),
      KEY(async_save, "copy each checkpoint's state to host buffers at the save step and write it on a background "
                      "thread while training goes on; the next save and the end of training wait for it, and "
                      "`latest` moves only when every rank's shard is durable"),
      KEY(ckpt_fully_parallel_load,
          "on resume, the data-parallel replicas of a tensor each read a 1/N share of it and exchange the rest, "
          "instead of each reading all of it (pays where reads are remote or the disk is the limit)"),
      KEY(exit_signal_handler,
          "on SIGTERM (Slurm's time limit, scancel) finish the step in progress, save a checkpoint "
          "and exit with code 0"),
      KEY(exit_duration_in_mins, "save a checkpoint and exit with code 0 after the step that passes this many minutes "
                                 "since the trainer started (set it below the job's time limit). 0: off"),
      KEY(overwrite, "let this run replace checkpoints of another run (or model) in `save`; off: that is an error"),
      KEY(data_path, "Megatron indexed dataset prefixes, optionally weighted: [0.3, a, 0.7, b]"),
      KEY(split, "train,valid,test proportions of the documents, e.g. 969,30,1"),
      KEY(mock_data, "train on random tokens instead of data_path (benchmarks, smoke tests)"),
      KEY(eod_mask_loss, "no loss on positions whose input token is the end-of-document token (the tokenizer's eod; "
                         "with mock_data and no tokenizer, the last vocabulary id)"),
      KEY(reset_position_ids, "rotary positions restart at 0 after each end-of-document input token (the eod as for "
                              "eod_mask_loss): documents packed in a sample are positioned as if alone"),
      KEY(reset_attention_mask, "attention stays within each document of a sample, documents split after each "
                                "end-of-document input token; the attention kernels skip the key tiles of other "
                                "documents"),
      KEY(tokenizer_type, "Megatron tokenizer type, e.g. SentencePieceTokenizer, HuggingFaceTokenizer, TikTokenizer"),
      KEY(tokenizer_model, "the tokenizer's model file"),
      KEY(stage, "what a modules.post_trainer config trains: sft (supervised fine-tuning) or dpo (direct preference "
                 "optimization); unset under modules.pre_trainer (docs/posttraining.md)"),
      KEY(hf_path, "post-training: a local Hugging Face model folder (config.json, safetensors) whose weights the "
                   "run starts from, imported once into <run dir>/hf_import as `checkpoint import` does"),
      KEY(peft_adapter_path, "post-training with LoRA: a PEFT adapter folder (adapter_config.json, "
                             "adapter_model.safetensors, as `checkpoint export --adapters` writes) whose adapters "
                             "a run that starts at iteration 0 starts from, over its base weights; its rank, alpha, "
                             "targets and shapes must be the run's"),
      KEY(sft_dataset_name, "SFT: the chat data set, a local JSONL file or JSON file (a list of records, or an "
                            "object of splits)"),
      KEY(sft_dataset_split, "SFT: the split of a JSON object of splits that trains; its `validation` split "
                             "evaluates"),
      KEY(sft_conversation_format, "SFT: alpaca | chatml | openai (alias messages) | squad | chat_template (the "
                                   "tokenizer_config.json's, as Hugging Face's apply_chat_template): how a record "
                                   "becomes text; the loss covers the responses and their end token"),
      KEY(enable_packed_sequences, "SFT: as many conversations per sequence as fit (first-fit decreasing), "
                                   "attending across each other; false: one conversation per sequence, padded"),
      KEY(use_packed_attention, "SFT with packing: attention kept within each conversation and positions "
                                "restarting at each (the packed-document attention of docs/engine.md)"),
      KEY(dpo_beta, "DPO: beta, the strength of the implicit KL penalty against the reference (TRL's beta): the loss "
                    "is -log sigmoid(beta * (chosen - rejected log-ratio margin))"),
      KEY(dpo_loss_type, "DPO: sigmoid (the DPO paper's loss; TRL's other loss types are not built)"),
      KEY(dpo_label_smoothing, "DPO: the probability that a pair's preference is flipped (TRL's label_smoothing, "
                               "conservative DPO); 0: plain DPO"),
      KEY(recompute_granularity, "activation recompute: full | selective; empty: none"),
      KEY(device, "auto | cpu | cuda. auto: the GPU when bf16 is on and one is present, else the CPU"),
      KEY(bf16, "bf16 mixed precision: bf16 weights and activations, fp32 master weights, gradients and "
                "optimizer state. Required on the GPU; on the CPU the bf16 backend (AVX512-BF16, AMX), else the slow "
                "reference backend"),
      KEY(gemm_tuning_cache, "GPU only: a GEMM tuning file from `benchmark gemm --tune`; its algorithms are used"),
      KEY(gemm_online_tuning, "GPU only: time cuBLASLt's candidate algorithms for each new GEMM shape and keep "
                              "the fastest"),
      KEY(tensor_model_parallel_size, "tensor-parallel ranks (tp): attention heads, query groups, ffn and vocabulary "
                                      "are split over them"),
      KEY(pipeline_model_parallel_size, "pipeline stages (pp): layers are split over them"),
      KEY(virtual_pipeline_model_parallel_size, "model chunks per pipeline rank (vpp). 0: the schedule's default "
                                                "(2 for interleaved-1f1b and the V-shape schedules, else 1); more "
                                                "than 1 with pipeline_schedule 1f1b runs interleaved-1f1b"),
      KEY(num_virtual_stages_per_pipeline_rank,
          "Megatron's name of the model chunks per pipeline rank: sets virtual_pipeline_model_parallel_size (with "
          "more than 1, pipeline_schedule 1f1b runs as interleaved-1f1b). Not with "
          "num_layers_per_virtual_pipeline_stage or pipeline_model_parallel_layout. 0 or null: unset"),
      KEY(num_layers_per_virtual_pipeline_stage,
          "Megatron's other way to give the chunks per pipeline rank: (num_layers / pipeline_model_parallel_size) / "
          "this, each divisible, no uneven first or last stage; otherwise as num_virtual_stages_per_pipeline_rank. "
          "0 or null: unset"),
      KEY(context_parallel_size, "context-parallel ranks (cp): each sequence is cut in 2 x cp chunks, a rank holds "
                                 "chunks cp_rank and 2 cp - 1 - cp_rank"),
      KEY(cp_comm_type, "p2p | a2a. p2p: ring attention, key/value blocks passed around the cp group; a2a: "
                        "all-to-all over heads (Ulysses), needs heads and query groups per tp rank divisible by cp"),
      KEY(expert_model_parallel_size,
          "expert-parallel ranks (ep), folded into dp: each holds num_experts / ep of the routed experts"),
      KEY(expert_tensor_parallel_size,
          "tensor-parallel ranks of the MoE blocks (etp): 1 keeps the experts whole on every "
          "tp rank, tensor_model_parallel_size splits each expert's ffn (and the shared "
          "expert's) over the tp ranks. 0 or null: tensor_model_parallel_size (Megatron's "
          "default)"),
      KEY(sequence_parallel, "split norms and residuals over the tp ranks by tokens (needs tp > 1)"),
      KEY(pipeline_schedule, "1f1b | interleaved-1f1b | zb-h1 | zb-h2 | zbv | v-half | v-min | dualpipev | zb-auto | "
                             "gpipe"),
      KEY(decoder_first_pipeline_num_layers, "layers on the first pipeline stage; 0: an even split"),
      KEY(decoder_last_pipeline_num_layers, "layers on the last pipeline stage; 0: an even split"),
      KEY(pipeline_model_parallel_layout,
          "the layers of each pipeline stage in Megatron's notation: stages in model order separated by |, E the "
          "embedding (first), t a transformer layer, L the loss (last), t*n and (...)*n repeats, e.g. "
          "\"Et*3|(t*4|)*2,t*3L\"; the stages over pipeline_model_parallel_size give the vpp. null: an even split"),
      KEY(pipeline_balance, "none | auto. auto: choose the layers per pipeline stage from each layer's cost, the "
                            "embedding and the output layer with its loss included, so that the stages take equal "
                            "time (instead of decoder_first/last_pipeline_num_layers)"),
      KEY(zero_bubble_max_pending_backward, "zb-auto's memory limit in microbatch activations per rank: "
                                            "pipeline_model_parallel_size gives ZB-1p, twice that ZB-2p. 0: "
                                            "pipeline_model_parallel_size"),
      KEY(fp8, "FP8 linear layers: null (off) | e4m3 (E4M3 everywhere) | hybrid (E4M3 forward, E5M2 gradients); "
               "docs/fp8.md"),
      KEY(fp8_recipe, "how FP8 operands are scaled: delayed (amax history) | tensorwise (current) | blockwise (1x128 "
                      "tiles, 128x128 weight blocks) | mxfp8 (32-element blocks, E8M0 scales)"),
      KEY(fp8_margin, "delayed scaling: scale = FP8 max / 2^margin / amax"),
      KEY(fp8_amax_history_len, "delayed scaling: steps of amax history per tensor"),
      KEY(fp8_amax_compute_algo, "delayed scaling: max (of the history) | most_recent"),
      KEY(fp8_wgrad, "the weight gradients' GEMMs in FP8 too (false: in the activation dtype)"),
      KEY(first_last_layers_bf16, "keep the first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 "
                                  "layers out of FP8"),
      KEY(num_layers_at_start_in_bf16, "with first_last_layers_bf16: the first layers kept out of FP8"),
      KEY(num_layers_at_end_in_bf16, "with first_last_layers_bf16: the last layers kept out of FP8"),
      KEY(fp8_output_layer, "the output layer's three GEMMs in FP8 too, with the linears' recipe (false: in the "
                            "activation dtype, as Megatron and Transformer Engine keep it); torchtitan's float8 "
                            "without \"output\" in filter_fqns"),
      KEY(fp8_param_gather, "all-gather FP8 parameters under the distributed optimizer (not built: false only)"),
      KEY(use_distributed_optimizer, "ZeRO-1: each data-parallel rank keeps the optimizer state of its shard only"),
      KEY(data_parallel_sharding_strategy, "no_shard | optim (ZeRO-1) | optim_grads (ZeRO-2) | optim_grads_params "
                                           "(ZeRO-3 / FSDP) (Megatron's names); empty: optim when "
                                           "use_distributed_optimizer, else no_shard (docs/context_parallel.md)"),
      KEY(use_torch_fsdp2, "alias of data_parallel_sharding_strategy optim_grads_params (FSDP: parameters, gradients "
                           "and optimizer state sharded over dp)"),
      KEY(torch_fsdp2_reshard_after_forward,
          "optim_grads_params: free each unit's gathered weights after its forward (true) or keep them until its "
          "backward is done (false: one all-gather per unit and microbatch instead of two, the whole working weights "
          "held between a microbatch's forward and backward; FSDP2's reshard_after_forward)"),
      KEY(reduce_sharded_grads_once_per_step,
          "optim_grads / optim_grads_params: keep every unit's whole fp32 gradient through the step and reduce-scatter "
          "it once, in the last microbatch's backward (false: once per microbatch); costs 4 bytes per parameter "
          "(docs/data_parallel.md)"),
      KEY(mpi_progress_interval_us, "under MPI: a progress thread advances the non-blocking collectives (gradient "
                                    "reductions, FSDP gathers) every this many microseconds while any is in flight, so "
                                    "they run behind compute; 0: none (they advance only in MPI calls)"),
      KEY(overlap_grad_reduce, "start each gradient bucket's reduction as soon as its backward is done"),
      KEY(ddp_bucket_size, "elements per gradient bucket; 0: max(40M, 1M x dp)"),
      KEY(profile, "write a Chrome trace per profiled rank to <run dir>/trace/ (docs/profiling.md)"),
      KEY(profile_step_start, "profiling starts after this many steps (Megatron's count)"),
      KEY(profile_step_end, "profiling ends after this step: steps profile_step_start + 1 .. profile_step_end are "
                            "traced"),
      KEY(profile_ranks, "the ranks that write a trace"),
      KEY(tensorboard_dir, "write TensorBoard event files with Megatron's tags here (docs/stability.md#tensorboard); "
                           "empty: none (unless disable_tensorboard is false)"),
      KEY(disable_tensorboard, "Primus's switch: false writes the event files to <run dir>/tensorboard when "
                               "tensorboard_dir is empty"),
      KEY(tensorboard_log_interval, "the per-iteration tags are written for the logged iterations divisible by this"),
      KEY(tensorboard_queue_size, "events kept in memory before they are written (and at least every 2 minutes, "
                                  "at each checkpoint and at the end)"),
      KEY(log_timers_to_tensorboard, "also write iteration-time (s) and throughput (TFLOP/s per rank)"),
      KEY(log_memory_to_tensorboard, "also write mem-reserved-bytes, mem-allocated-bytes, mem-max-allocated-bytes"),
      KEY(log_validation_ppl_to_tensorboard, "also write the validation perplexity (lm loss validation ppl)"),
      KEY(log_world_size_to_tensorboard, "also write world-size"),
      KEY(log_loss_scale_to_tensorboard, "write loss-scale (1: this engine trains without loss scaling)"),
      KEY(log_learning_rate_to_tensorboard, "write learning-rate"),
      KEY(log_batch_size_to_tensorboard, "write batch-size"),
  };
  return keys;
}
#undef KEY

namespace {

const std::vector<std::string> kTopKeys = {"work_group", "user_name", "exp_name", "workspace", "env", "modules"};
const std::vector<std::string> kTrainerKeys = {"framework", "config", "model", "overrides"};

std::vector<std::string> names_of_training_keys() {
  std::vector<std::string> out;
  for (const auto& k : training_keys()) out.push_back(k.name);
  return out;
}

// Primus-Turbo's switch of gpt-oss's attention (its PrimusTurboAttention): use_sink_attention
// turns learned sinks on in every layer and, with sink_sliding_window N > 0, a window (N, 0) on
// layers 1, 3, ... (1-based; sink_window_even_layers_only, its default) or on all; N = 0: no
// window. Read as this engine's model keys softmax_type, window_size and window_attn_skip_freq
// (TurboSinks below); without use_sink_attention the other two have no effect, as in Primus.
const std::vector<std::string> kTurboSinkKeys = {"use_sink_attention", "sink_sliding_window",
                                                 "sink_window_even_layers_only"};
bool is_turbo_sink_key(const std::string& k) {
  return std::find(kTurboSinkKeys.begin(), kTurboSinkKeys.end(), k) != kTurboSinkKeys.end();
}

// Every key name the overrides know: ours, then Megatron's and Primus's (for "did you mean").
std::vector<std::string> all_key_names() {
  std::vector<std::string> out = names_of_training_keys();
  for (const auto& k : model_spec_keys()) out.push_back(k);
  for (const auto& k : foreign_keys()) out.push_back(k.name);
  for (const auto& k : kTurboSinkKeys) out.push_back(k);
  return out;
}

// `config: pre_trainer.yaml`: Primus's module defaults, resolved to this project's
// configs/modules/ (or a file beside the experiment config).
std::string resolve_module_config(const std::string& name, const std::string& config_file, const Origin& at) {
  const fs::path beside = fs::path(config_file).parent_path() / name;
  if (fs::is_regular_file(beside)) return beside.string();
  const fs::path ours = fs::path(model_preset_dir()).parent_path() / "modules" / fs::path(name).filename();
  if (fs::is_regular_file(ours)) return ours.string();
  std::vector<std::string> known;
  if (fs::is_directory(ours.parent_path()))
    for (const auto& e : fs::directory_iterator(ours.parent_path())) known.push_back(e.path().filename().string());
  std::sort(known.begin(), known.end());
  fail("{}: module config '{}' not found beside the config nor in {}{}; known: {}", at.str(), name,
       ours.parent_path().string(), did_you_mean(fs::path(name).filename().string(), known), fmt::join(known, ", "));
}

std::string describe(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

void set_training_key(TrainingArgs& args, const KeyInfo& key, const YAML::Node& value, const Origin& at) {
  if (value.IsNull()) return;  // null: unset, as in Megatron (the default stays)
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(args.*member)>;
        if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::vector<std::string> out;
          if (value.IsScalar()) {
            out.push_back(value.Scalar());
          } else if (value.IsSequence()) {
            for (const auto& e : value) {
              if (!e.IsScalar()) fail("{}: '{}' must be a list of names and weights, got {}", at.str(), key.name, describe(e));
              out.push_back(e.Scalar());
            }
          } else if (!value.IsNull()) {
            fail("{}: '{}' must be a list, got {}", at.str(), key.name, describe(value));
          }
          args.*member = out;
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::vector<int64_t> out;
          auto add = [&](const YAML::Node& e) {
            int64_t v = 0;
            if (!e.IsScalar() || !YAML::convert<int64_t>::decode(e, v))
              fail("{}: '{}' must be a list of integers, got {}", at.str(), key.name, describe(e));
            out.push_back(v);
          };
          if (value.IsSequence())
            for (const auto& e : value) add(e);
          else if (!value.IsNull())
            add(value);
          args.*member = out;
        } else if constexpr (std::is_enum_v<T>) {  // a name of config/choices.h's table
          const std::optional<T> v = value.IsScalar() ? find_choice<T>(value.Scalar()) : std::nullopt;
          if (!v)
            fail("{}: {}", at.str(), not_a_choice<T>(key.name, value.IsScalar() ? value.Scalar() : describe(value)));
          args.*member = *v;
        } else {
          const char* want = std::is_same_v<T, bool>          ? "true or false"
                             : std::is_same_v<T, int64_t>     ? "an integer"
                             : std::is_same_v<T, std::string> ? "text"
                                                              : "a number";
          T v{};
          // Primus configs write flags as 0 and 1 too (Python's truthiness).
          if constexpr (std::is_same_v<T, bool>)
            if (value.IsScalar() && (value.Scalar() == "0" || value.Scalar() == "1")) {
              args.*member = value.Scalar() == "1";
              return;
            }
          if (!value.IsScalar() || !YAML::convert<T>::decode(value, v))
            fail("{}: '{}' must be {}, got {}", at.str(), key.name, want, describe(value));
          args.*member = v;
        }
      },
      key.field);
}

std::string scalar_or(const YAML::Node& n, const std::string& key, const std::string& fallback, const YamlTree& tree,
                      const std::string& path) {
  if (!n[key] || n[key].IsNull()) return fallback;
  if (!n[key].IsScalar()) fail("{}: '{}' must be text, got {}", tree.origin(path).str(), key, describe(n[key]));
  return n[key].Scalar();
}

void check_keys(const YAML::Node& map, const std::vector<std::string>& allowed, const YamlTree& tree,
                const std::string& prefix, const char* where) {
  for (auto kv : map) {
    const std::string k = kv.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      fail("{}: unknown key '{}'{} in {}; valid keys: {}", tree.origin(prefix.empty() ? k : prefix + "." + k).str(), k,
           did_you_mean(k, allowed), where, fmt::join(allowed, ", "));
  }
}

std::string resolve_model(const std::string& model, const std::string& config_file) {
  const bool path_like = model.find('/') != std::string::npos || model.ends_with(".yaml") || model.ends_with(".yml");
  if (!path_like) return model;  // a preset name
  fs::path p(model);
  if (p.is_relative()) {
    fs::path beside = fs::path(config_file).parent_path() / p;
    if (fs::is_regular_file(beside)) return beside.string();
    if (!fs::is_regular_file(p)) {
      // "llama2_7B.yaml" as Primus writes it: a preset file name; one that is no file here is a
      // preset name, which load_model_spec knows or refuses by name (e.g. gpt-oss's, not built yet).
      fs::path preset = fs::path(model_preset_dir()) / p.filename();
      if (p.parent_path().empty()) return fs::is_regular_file(preset) ? preset.string() : p.stem().string();
    }
  }
  return model;
}

}  // namespace

std::string ExperimentConfig::run_dir() const { return (fs::path(workspace) / exp_name).string(); }

std::string ExperimentConfig::checkpoint_dir() const {
  return train.save.empty() ? (fs::path(run_dir()) / "checkpoints").string() : train.save;
}

std::string ExperimentConfig::resolved_yaml() const {
  YAML::Node out = YAML::Clone(tree.root);
  out["work_group"] = work_group;
  out["user_name"] = user_name;
  out["exp_name"] = exp_name;
  out["workspace"] = workspace;
  YAML::Node ov = out["modules"]["pre_trainer"]["overrides"];
  // One value per key: the training keys are written below, resolved, under their own names; the
  // model keys live in model_spec. What the config wrote for either (under an alias too) goes.
  std::vector<std::string> written_elsewhere;
  const std::vector<std::string> model_keys = model_spec_keys();
  if (ov.IsMap())
    for (auto kv : ov) {
      const std::string k = kv.first.as<std::string>();
      const ForeignKey* fk = find_foreign_key(k);
      if ((fk && fk->status == KeyStatus::Applied) || std::find(model_keys.begin(), model_keys.end(), k) != model_keys.end())
        written_elsewhere.push_back(k);
    }
  for (const auto& k : written_elsewhere) ov.remove(k);
  for (const auto& k : training_keys())
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(train.*member)>;
          if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int64_t>>) {
            YAML::Node seq(YAML::NodeType::Sequence);
            for (const auto& s : train.*member) seq.push_back(s);
            ov[k.name] = seq;
          } else if constexpr (std::is_enum_v<T>) {
            ov[k.name] = std::string(choice_name(train.*member));
          } else {
            ov[k.name] = train.*member;
          }
        },
        k.field);
  ov["lora"] = lora_to_yaml(train.lora);
  out["modules"]["pre_trainer"]["model_spec"] = model_spec_to_yaml(model_spec);
  if (post_trainer) {  // under the name the config gave it
    out["modules"]["post_trainer"] = out["modules"]["pre_trainer"];
    out["modules"].remove("pre_trainer");
  }
  YAML::Emitter e;
  e << out;
  std::string head;
  if (!no_effect.empty()) {
    head = "# accepted with no effect on this engine:\n";
    for (const auto& k : no_effect) head += fmt::format("#   {}: {}  ({})\n", k.key, k.value, k.note);
  }
  return head + dialect_side_by_side(dialect) + std::string(e.c_str()) + "\n";
}

namespace {

// Command-line overrides: a dotted path or a top-level key sets that node; a training, model or
// foreign key, or a key of the config's dialect (`--training.steps 10` of a torchtitan config),
// sets it under modules.pre_trainer.overrides.
void apply_command_line(YamlTree& tree, const std::vector<std::pair<std::string, std::string>>& overrides) {
  const std::vector<std::string> model_keys = model_spec_keys();
  const std::vector<std::string> train_keys = names_of_training_keys();
  const Framework dialect = written_framework(tree, overrides);
  for (auto [key, value] : overrides) {
    std::replace(key.begin(), key.end(), '-', '_');
    if (is_dialect_key(dialect, key)) {
      tree.set("modules.pre_trainer.overrides." + key, value);
      continue;
    }
    if (const ForeignKey* fk = find_foreign_key(key); fk && fk->status == KeyStatus::Applied) key = fk->engine_value;
    if (key.starts_with("lora.")) {  // --lora.dim 8: the trainer's lora block
      tree.set("modules.pre_trainer.overrides." + key, value);
      continue;
    }
    if (key.find('.') != std::string::npos ||
        std::find(kTopKeys.begin(), kTopKeys.end(), key) != kTopKeys.end())
      tree.set(key, value);
    else if (std::find(train_keys.begin(), train_keys.end(), key) != train_keys.end() ||
             std::find(model_keys.begin(), model_keys.end(), key) != model_keys.end() || find_foreign_key(key) ||
             is_turbo_sink_key(key))
      tree.set("modules.pre_trainer.overrides." + key, value);
    else {
      std::vector<std::string> all = kTopKeys;
      for (const auto& k : all_key_names()) all.push_back(k);
      for (const auto& k : dialect_key_names(dialect)) all.push_back(k);
      fail("unknown option --{} on the command line{}", key, did_you_mean(key, all));
    }
  }
}

// Primus's post-training module, modules.post_trainer, is read as modules.pre_trainer: its node,
// the origins of its keys and the command line's dotted paths into it move to pre_trainer's name.
// Returns whether the config had one.
bool adopt_post_trainer(YamlTree& tree, std::vector<std::pair<std::string, std::string>>& overrides,
                        const std::string& path) {
  YAML::Node modules = tree.root["modules"];
  if (!modules || !modules.IsMap() || !modules["post_trainer"]) return false;
  if (modules["pre_trainer"])
    fail("{}: a config has one trainer module: modules.pre_trainer (train pretrain) or modules.post_trainer "
         "(train posttrain), not both",
         path);
  modules["pre_trainer"] = modules["post_trainer"];
  modules.remove("post_trainer");
  const std::string from = "modules.post_trainer", to = "modules.pre_trainer";
  auto moved = [&](const std::string& key) {
    return key == from || key.starts_with(from + ".") ? to + key.substr(from.size()) : key;
  };
  std::map<std::string, Origin> origins;
  for (const auto& [k, o] : tree.origins) origins[moved(k)] = o;
  tree.origins = std::move(origins);
  for (auto& kv : overrides) {
    std::replace(kv.first.begin(), kv.first.end(), '-', '_');
    kv.first = moved(kv.first);
  }
  return true;
}

// DPO (train/dpo.h): the loss's parameters, and what it does not run on yet.
template <class At>
void check_dpo(const ExperimentConfig& cfg, const At& at) {
  const TrainingArgs& t = cfg.train;
  if (!(t.dpo_beta > 0)) fail("{}: dpo_beta must be positive, got {}", at("dpo_beta"), t.dpo_beta);
  if (!(t.dpo_label_smoothing >= 0 && t.dpo_label_smoothing < 0.5))
    fail("{}: dpo_label_smoothing must be in [0, 0.5), got {}", at("dpo_label_smoothing"), t.dpo_label_smoothing);
  if (t.pipeline_model_parallel_size > 1)
    fail("{}: stage dpo runs the chosen and rejected sides of a pair and then their backward, which the pipeline "
         "schedules do not yet: pipeline_model_parallel_size must be 1",
         at("pipeline_model_parallel_size"));
  if (cfg.model_spec.num_experts > 0)
    fail("{}: stage dpo with mixture-of-experts models is not built yet (the router's auxiliary losses would be "
         "weighted by the DPO gradient)",
         at("num_experts"));
  if (t.enable_packed_sequences)
    fail("{}: stage dpo runs each side of a pair as a sequence of its own: set enable_packed_sequences to false",
         at("enable_packed_sequences"));
}

// Post-training: a post_trainer module trains stage sft or dpo (what is not built refused by
// name); a pre_trainer module pretrains.
template <class At>
void check_stage(const ExperimentConfig& cfg, const At& at) {
  const TrainingArgs& t = cfg.train;
  if (!cfg.post_trainer) {
    if (t.stage != TrainStage::Pretrain)
      fail("{}: stage '{}' is post-training: put the config's keys under modules.post_trainer and run train posttrain",
           at("stage"), choice_name(t.stage));
    return;
  }
  if (t.stage == TrainStage::Pretrain)
    fail("{}: a modules.post_trainer config needs stage: sft or dpo (Primus's sft_trainer.yaml sets sft)", at("stage"));
  const char* stage = choice_name(t.stage);
  if (t.sft_dataset_name.empty())
    fail("{}: stage {} needs sft_dataset_name: a local JSONL or JSON file of {}", at("sft_dataset_name"), stage,
         t.stage == TrainStage::Dpo ? "preference pairs" : "conversations");
  if (!t.data_path.empty() || t.mock_data)
    fail("{}: stage {} reads its data from sft_dataset_name; remove data_path and mock_data", at("data_path"), stage);
  if (t.tokenizer_type.empty())
    fail("{}: stage {} tokenizes its conversations: set tokenizer_type (and tokenizer_model)", at("tokenizer_type"),
         stage);
  if (t.stage == TrainStage::Dpo) check_dpo(cfg, at);
}

// The top-level keys and the modules.pre_trainer section (returned), its keys checked.
// Primus reads only its meta keys, `platform` and `modules` at the top of an experiment config: a
// trainer key written there (llama3_8B-BF16-lora-sft.yaml's `lora:` and `lr:` beside its `extends:`)
// has no effect in Primus, and none here; it is listed with the keys accepted with no effect.
void top_level_trainer_keys(ExperimentConfig& cfg) {
  const std::vector<std::string> model_keys = model_spec_keys();
  std::vector<std::string> seen;
  for (auto kv : cfg.tree.root) {
    const std::string k = kv.first.as<std::string>();
    const bool known = k == "lora" ||
                       std::any_of(training_keys().begin(), training_keys().end(),
                                   [&](const KeyInfo& x) { return k == x.name; }) ||
                       std::find(model_keys.begin(), model_keys.end(), k) != model_keys.end() || find_foreign_key(k);
    if (!known || std::find(kTopKeys.begin(), kTopKeys.end(), k) != kTopKeys.end()) continue;
    cfg.no_effect.push_back({k, describe(kv.second),
                             "a top-level key: Primus reads trainer keys only under modules.<trainer>.overrides"});
    seen.push_back(k);
  }
  for (const auto& k : seen) cfg.tree.root.remove(k);
}

YAML::Node read_top_level(ExperimentConfig& cfg, const std::string& path) {
  top_level_trainer_keys(cfg);
  const YamlTree& tree = cfg.tree;
  const YAML::Node& root = tree.root;
  check_keys(root, kTopKeys, tree, "", "the experiment config");
  cfg.work_group = scalar_or(root, "work_group", "", tree, "work_group");
  cfg.user_name = scalar_or(root, "user_name", "", tree, "user_name");
  cfg.exp_name = scalar_or(root, "exp_name", fs::path(path).stem().string(), tree, "exp_name");
  cfg.workspace = scalar_or(root, "workspace", "./output", tree, "workspace");
  if (cfg.exp_name.empty() || cfg.exp_name.find('/') != std::string::npos)
    fail("{}: exp_name '{}' must be a non-empty name without '/'", tree.origin("exp_name").str(), cfg.exp_name);

  const YAML::Node modules = root["modules"];
  if (!modules || !modules.IsMap())
    fail("{}: the config needs a 'modules: pre_trainer:' (or 'post_trainer:') section", path);
  check_keys(modules, {"pre_trainer"}, tree, "modules", "modules");
  const YAML::Node pt = modules["pre_trainer"];
  if (!pt || !pt.IsMap()) fail("{}: 'modules.pre_trainer' must be a map", tree.origin("modules").str());
  check_keys(pt, kTrainerKeys, tree, "modules.pre_trainer", "modules.pre_trainer");
  return pt;
}

// Primus's top-level `env:` block: the variables the task exports for the run.
void read_env(ExperimentConfig& cfg) {
  const YamlTree& tree = cfg.tree;
  const YAML::Node env = tree.root["env"];
  if (!env || env.IsNull()) return;
  if (!env.IsMap()) fail("{}: 'env' must be a map of NAME: value", tree.origin("env").str());
  for (auto kv : env) {
    const std::string name = kv.first.Scalar();
    if (!kv.second.IsScalar()) fail("{}: env '{}' must be a value", tree.origin("env." + name).str(), name);
    cfg.env.emplace_back(name, kv.second.Scalar());
  }
}

// modules.pre_trainer's framework: a torchtitan or MaxText module is translated into this engine's
// keys in place (config/dialect.h), its "-1" degrees and per-device batches resolved against
// world_size; then its model.
void read_framework(ExperimentConfig& cfg, const YAML::Node& pt, const std::string& path, int world_size) {
  const Framework framework =
      parse_framework(scalar_or(pt, "framework", "megatron", cfg.tree, "modules.pre_trainer.framework"),
                      cfg.tree.origin("modules.pre_trainer.framework"));
  if (framework != Framework::Megatron) {
    cfg.dialect = translate_dialect(framework, cfg.tree, path, world_size);
    for (const auto& k : cfg.dialect.no_effect) cfg.no_effect.push_back({k.key, k.value, k.note});
  }
  cfg.model = scalar_or(pt, "model", "", cfg.tree, "modules.pre_trainer.model");
}

// `config: pre_trainer.yaml`: the module config's keys are defaults under the experiment's overrides.
void merge_module_config(YamlTree& tree, const YAML::Node& pt, const std::string& path) {
  const std::string module = scalar_or(pt, "config", "", tree, "modules.pre_trainer.config");
  if (module.empty()) return;
  const std::string file = resolve_module_config(module, path, tree.origin("modules.pre_trainer.config"));
  const YamlTree defaults = load_yaml_tree(file);
  if (!defaults.root.IsMap()) fail("{}: a module config must be a map of key: value", file);
  YAML::Node ov = tree.root["modules"]["pre_trainer"]["overrides"];
  if (!ov || ov.IsNull()) {
    tree.root["modules"]["pre_trainer"]["overrides"] = YAML::Node(YAML::NodeType::Map);
    ov = tree.root["modules"]["pre_trainer"]["overrides"];
  }
  if (!ov.IsMap()) fail("{}: 'overrides' must be a map of key: value", tree.origin("modules.pre_trainer.overrides").str());
  for (auto kv : defaults.root) {
    const std::string k = kv.first.as<std::string>();
    // A null default sets nothing: it must not turn a nullable model key of the preset to "none".
    if (ov[k] || kv.second.IsNull()) continue;
    ov[k] = kv.second;
    tree.origins["modules.pre_trainer.overrides." + k] = defaults.origin(k);
  }
}

// Primus-Turbo's sink keys (kTurboSinkKeys) of the overrides, as the model keys they stand for.
class TurboSinks {
 public:
  explicit TurboSinks(const YamlTree& tree) : tree_(tree) {}
  void add(const std::string& key, const YAML::Node& value) { written_[key] = value; }
  // Writes softmax_type, window_size and window_attn_skip_freq into the model keys when
  // use_sink_attention is on (refusing a config that also writes them), else lists the other two
  // as having no effect.
  void apply(ExperimentConfig& cfg, YAML::Node& model_overrides) const {
    if (written_.empty()) return;
    if (!flag("use_sink_attention", false)) {
      for (const auto& [k, v] : written_)
        if (k != "use_sink_attention" && !v.IsNull())
          cfg.no_effect.push_back({k, describe(v), "read by Primus-Turbo only with use_sink_attention: true"});
      return;
    }
    for (const char* ours : {"softmax_type", "window_size", "window_attn_skip_freq"})
      if (model_overrides[ours])
        fail("{}: use_sink_attention (Primus-Turbo's switch of gpt-oss's sinks and window) and {} both set the "
             "attention's sinks and window; write one of them",
             at("use_sink_attention"), ours);
    int64_t window = 0;
    if (const auto it = written_.find("sink_sliding_window"); it != written_.end() && !it->second.IsNull())
      if (!YAML::convert<int64_t>::decode(it->second, window) || window < 0)
        fail("{}: sink_sliding_window must be 0 (no window) or a positive number of tokens, got {}",
             at("sink_sliding_window"), describe(it->second));
    model_overrides["softmax_type"] = "learnable";
    YAML::Node pair(YAML::NodeType::Sequence);
    pair.push_back(window);
    pair.push_back(0);
    model_overrides["window_size"] = window > 0 ? pair : YAML::Node(YAML::NodeType::Null);
    model_overrides["window_attn_skip_freq"] = flag("sink_window_even_layers_only", true)
                                                   ? YAML::Node(2)
                                                   : YAML::Node(YAML::NodeType::Null);
  }

 private:
  std::string at(const std::string& key) const { return tree_.origin("modules.pre_trainer.overrides." + key).str(); }
  bool flag(const std::string& key, bool unset) const {
    const auto it = written_.find(key);
    if (it == written_.end() || it->second.IsNull()) return unset;
    bool v = false;
    if (!YAML::convert<bool>::decode(it->second, v))
      fail("{}: {} must be true or false, got {}", at(key), key, describe(it->second));
    return v;
  }
  const YamlTree& tree_;
  std::map<std::string, YAML::Node> written_;
};

// The overrides: training keys into cfg.train, Megatron's no-effect keys listed, refused ones
// refused; the model keys are returned for the preset.
YAML::Node read_overrides(ExperimentConfig& cfg, const YAML::Node& pt) {
  const YamlTree& tree = cfg.tree;
  const std::vector<std::string> model_keys = model_spec_keys();
  YAML::Node model_overrides(YAML::NodeType::Map);
  const YAML::Node ov = pt["overrides"];
  if (!ov || ov.IsNull()) return model_overrides;
  if (!ov.IsMap()) fail("{}: 'overrides' must be a map of key: value", tree.origin("modules.pre_trainer.overrides").str());
  TurboSinks turbo(tree);
  for (auto kv : ov) {
    const std::string written = kv.first.as<std::string>();
    const std::string kpath = "modules.pre_trainer.overrides." + written;
    std::string k = written;  // Megatron's other name of one of our keys: ours
    if (const ForeignKey* fk = find_foreign_key(k); fk && fk->status == KeyStatus::Applied) k = fk->engine_value;
    auto ti = std::find_if(training_keys().begin(), training_keys().end(), [&](const KeyInfo& x) { return k == x.name; });
    if (k == "lora") {
      read_lora(kv.second, tree.origin(kpath).str(), cfg.train.lora);
    } else if (is_turbo_sink_key(k)) {
      turbo.add(k, kv.second);
    } else if (ti != training_keys().end()) {
      set_training_key(cfg.train, *ti, kv.second, tree.origin(kpath));
    } else if (std::find(model_keys.begin(), model_keys.end(), k) != model_keys.end()) {
      // null: "none" for a nullable key (q_lora_rank: null drops the query's low-rank projection),
      // else the preset's value.
      if (!kv.second.IsNull() || model_key_nullable(k)) model_overrides[k] = kv.second;
    } else if (const ForeignKey* fk = find_foreign_key(k)) {
      if (fk->status == KeyStatus::NoEffect) {
        if (!kv.second.IsNull()) cfg.no_effect.push_back({k, describe(kv.second), fk->note});
      } else if (!is_engine_value(*fk, kv.second)) {
        if (kv.second.IsMap())  // a feature's block (lora: {enabled: true, ...})
          fail("{}: '{}' is not supported: {}; set {}.enabled: false (or remove the key)", tree.origin(kpath).str(), k,
               fk->note, k);
        fail("{}: '{}' is not supported: {}; this engine runs as '{}: {}' (remove the key or set it to that)",
             tree.origin(kpath).str(), k, fk->note, k, fk->engine_value);
      }
    } else {
      fail("{}: unknown key '{}'{} in overrides", tree.origin(kpath).str(), k, did_you_mean(k, all_key_names()));
    }
  }
  turbo.apply(cfg, model_overrides);
  return model_overrides;
}

// The model preset (or YAML) with the config's model keys applied.
void load_model(ExperimentConfig& cfg, const YAML::Node& model_overrides, const std::string& path) {
  try {
    cfg.model_spec = load_model_spec(resolve_model(cfg.model, path));
  } catch (const Error& e) {
    fail("{}: model '{}': {}", cfg.tree.origin("modules.pre_trainer.model").str(), cfg.model, e.what());
  }
  if (model_overrides.size() > 0) {
    const std::string name = cfg.model_spec.name;
    apply_model_keys(cfg.model_spec, model_overrides, path);
    cfg.model_spec.name = name;
    cfg.model_spec.validate();
  }
}

// The FP8 keys: what is built, and every combination that is not refused by name (docs/fp8.md).
template <class At>
void check_fp8(const TrainingArgs& t, const At& at) {
  if (t.fp8 == Fp8Mode::Off && t.fp8_output_layer)
    fail("{}: fp8_output_layer puts the output layer in FP8 with the linears' recipe, but fp8 is off; set fp8 "
         "(e4m3 | hybrid) or fp8_output_layer false",
         at("fp8_output_layer"));
  if (t.fp8 == Fp8Mode::Off) return;
  if (t.mpi_progress_interval_us < 0)
    fail("{}: mpi_progress_interval_us must be 0 (no progress thread) or a positive number of microseconds, got {}",
         at("mpi_progress_interval_us"), t.mpi_progress_interval_us);
  if (t.fp8_margin < 0) fail("{}: fp8_margin must not be negative, got {}", at("fp8_margin"), t.fp8_margin);
  if (t.fp8_amax_history_len < 1)
    fail("{}: fp8_amax_history_len must be at least 1, got {}", at("fp8_amax_history_len"), t.fp8_amax_history_len);
  if (t.fp8_param_gather)
    fail("{}: fp8_param_gather (FP8 parameters all-gathered by the distributed optimizer) is not built: the "
         "weights are kept and gathered in bf16/fp32 and quantized where each GEMM reads them; set it to false",
         at("fp8_param_gather"));
  if (t.first_last_layers_bf16 && (t.num_layers_at_start_in_bf16 < 0 || t.num_layers_at_end_in_bf16 < 0))
    fail("{}: num_layers_at_start_in_bf16 ({}) and num_layers_at_end_in_bf16 ({}) must not be negative",
         at("first_last_layers_bf16"), t.num_layers_at_start_in_bf16, t.num_layers_at_end_in_bf16);
}

// Megatron's virtual pipeline keys (megatron/training/arguments.py, "Uneven virtual pipeline
// parallelism"): at most one of num_virtual_stages_per_pipeline_rank (the chunks per rank) and
// num_layers_per_virtual_pipeline_stage (the layers per chunk: no uneven first or last stage, and
// num_layers / pp divisible by it) and pipeline_model_parallel_layout (whose stages give the vpp in
// plan/parallel_layout.cpp). The chunks per rank become virtual_pipeline_model_parallel_size, which
// must agree when the config sets it too. That a virtual pipeline needs pipeline_model_parallel_size
// > 1, and that 1f1b with more than one chunk per rank runs Megatron's interleaved schedule, are
// plan/parallel_layout.cpp's.
template <class At>
void resolve_virtual_pipeline(ExperimentConfig& cfg, const At& at) {
  TrainingArgs& t = cfg.train;
  const int64_t stages = t.num_virtual_stages_per_pipeline_rank, layers = t.num_layers_per_virtual_pipeline_stage;
  if (stages < 0)
    fail("{}: num_virtual_stages_per_pipeline_rank must be positive (or null), got {}",
         at("num_virtual_stages_per_pipeline_rank"), stages);
  if (layers < 0)
    fail("{}: num_layers_per_virtual_pipeline_stage must be positive (or null), got {}",
         at("num_layers_per_virtual_pipeline_stage"), layers);
  if (stages == 0 && layers == 0) return;
  if (!t.pipeline_model_parallel_layout.empty())
    fail("{}: pipeline_model_parallel_layout sets the stages and with them the chunks per rank; unset {} (Megatron's "
         "rule: one of the three)",
         at("pipeline_model_parallel_layout"),
         stages > 0 ? "num_virtual_stages_per_pipeline_rank" : "num_layers_per_virtual_pipeline_stage");
  if (stages > 0 && layers > 0)
    fail("{}: set one of num_virtual_stages_per_pipeline_rank ({}) and num_layers_per_virtual_pipeline_stage ({}), "
         "not both (Megatron's rule)",
         at("num_layers_per_virtual_pipeline_stage"), stages, layers);
  int64_t vpp = stages;
  if (layers > 0) {
    const int64_t L = cfg.model_spec.num_layers, pp = std::max<int64_t>(t.pipeline_model_parallel_size, 1);
    if (t.decoder_first_pipeline_num_layers > 0 || t.decoder_last_pipeline_num_layers > 0)
      fail("{}: num_layers_per_virtual_pipeline_stage gives every chunk the same layers; with an uneven first or last "
           "stage (decoder_first/last_pipeline_num_layers) give the chunks per rank as "
           "num_virtual_stages_per_pipeline_rank (Megatron's rule)",
           at("num_layers_per_virtual_pipeline_stage"));
    if (L % pp != 0)
      fail("{}: num_layers_per_virtual_pipeline_stage needs num_layers ({}) divisible by pipeline_model_parallel_size "
           "({})",
           at("num_layers_per_virtual_pipeline_stage"), L, pp);
    if ((L / pp) % layers != 0)
      fail("{}: the {} layers per pipeline stage (num_layers {} / pipeline_model_parallel_size {}) are not divisible "
           "by num_layers_per_virtual_pipeline_stage {}",
           at("num_layers_per_virtual_pipeline_stage"), L / pp, L, pp, layers);
    vpp = (L / pp) / layers;
  }
  const char* key = stages > 0 ? "num_virtual_stages_per_pipeline_rank" : "num_layers_per_virtual_pipeline_stage";
  if (t.virtual_pipeline_model_parallel_size > 0 && t.virtual_pipeline_model_parallel_size != vpp)
    fail("{}: {} gives {} model chunks per pipeline rank, virtual_pipeline_model_parallel_size says {}: set one",
         at(key), key, vpp, t.virtual_pipeline_model_parallel_size);
  t.virtual_pipeline_model_parallel_size = vpp;
}

// The precision-aware optimizer's keys: Megatron's rules (a dtype other than fp32 needs
// use_precision_aware_optimizer) and what is built here (docs/optim.md#low-precision-optimizer-state).
template <class At>
void check_precision_aware(const TrainingArgs& t, const At& at) {
  const std::pair<const char*, OptimDtype> keys[] = {{"main_grads_dtype", t.main_grads_dtype},
                                                     {"main_params_dtype", t.main_params_dtype},
                                                     {"exp_avg_dtype", t.exp_avg_dtype},
                                                     {"exp_avg_sq_dtype", t.exp_avg_sq_dtype}};
  for (const auto& [key, d] : keys) {
    if (d == OptimDtype::Fp32) continue;
    if (!t.use_precision_aware_optimizer)
      fail("{}: {} {} needs use_precision_aware_optimizer: true (Megatron's rule: without it every optimizer dtype "
           "is fp32)",
           at(key), key, choice_name(d));
  }
  if (t.main_grads_dtype == OptimDtype::Fp16 || t.main_grads_dtype == OptimDtype::Fp8)
    fail("{}: main_grads_dtype {} is not one of Megatron's choices (fp32, bf16)", at("main_grads_dtype"),
         choice_name(t.main_grads_dtype));
  if (t.main_params_dtype == OptimDtype::Fp8)
    fail("{}: main_params_dtype fp8 is not one of Megatron's choices (fp32, fp16; bf16 is MaxText's)",
         at("main_params_dtype"));
  if (t.main_grads_dtype == OptimDtype::Bf16 && !t.bf16)
    fail("{}: main_grads_dtype bf16 needs bf16: true (in fp32 training Megatron's gradients stay fp32 whatever this "
         "key says)",
         at("main_grads_dtype"));
  if (t.main_params_dtype == OptimDtype::Fp16 && !t.bf16)
    fail("{}: main_params_dtype fp16 needs bf16: true (with fp32 parameters Transformer Engine's FusedAdam updates "
         "them in place and never reads its fp16 master)",
         at("main_params_dtype"));
}

// Derived defaults, then the checks that must fail before any training starts.
void derive_and_check(ExperimentConfig& cfg) {
  TrainingArgs& t = cfg.train;
  const ModelSpec& m = cfg.model_spec;
  auto at = [&](const char* key) { return cfg.tree.origin(std::string("modules.pre_trainer.overrides.") + key).str(); };
  if (t.seq_length == 0) t.seq_length = m.max_position_embeddings;
  if (t.global_batch_size == 0) t.global_batch_size = t.micro_batch_size;
  if (t.lr_decay_iters == 0) t.lr_decay_iters = t.train_iters;
  if (t.micro_batch_size <= 0) fail("{}: micro_batch_size must be positive, got {}", at("micro_batch_size"), t.micro_batch_size);
  if (t.train_iters <= 0) fail("{}: train_iters must be positive (got {})", at("train_iters"), t.train_iters);
  if (t.seq_length < 0) fail("{}: seq_length must be positive, got {}", at("seq_length"), t.seq_length);
  if (t.seq_length > m.max_position_embeddings)
    fail("{}: seq_length {} exceeds max_position_embeddings {} of model '{}'", at("seq_length"), t.seq_length,
         m.max_position_embeddings, cfg.model);
  if (t.global_batch_size < t.micro_batch_size || t.global_batch_size % t.micro_batch_size != 0)
    fail("{}: global_batch_size {} is not a multiple of micro_batch_size {}", at("global_batch_size"),
         t.global_batch_size, t.micro_batch_size);
  if (t.log_interval <= 0) fail("{}: log_interval must be positive", at("log_interval"));
  if (t.eval_interval < 0 || t.eval_iters < 0) fail("{}: eval_interval and eval_iters must not be negative", at("eval_interval"));
  if (t.save_interval < 0) fail("{}: save_interval must not be negative", at("save_interval"));
  if (t.keep_last_checkpoints < 0) fail("{}: keep_last_checkpoints must not be negative", at("keep_last_checkpoints"));
  if (t.clip_grad < 0) fail("{}: clip_grad must not be negative", at("clip_grad"));
  check_stage(cfg, at);
  if (t.data_path.empty() && !t.mock_data && t.stage == TrainStage::Pretrain)
    fail("{}: data_path is empty: give Megatron dataset prefixes (data preprocess makes them) or set mock_data: true",
         at("data_path"));
  if (t.device != "auto" && t.device != "cpu" && t.device != "cuda")
    fail("{}: device '{}' is not one of: auto, cpu, cuda", at("device"), t.device);
  check_fp8(t, at);
  resolve_virtual_pipeline(cfg, at);
  check_precision_aware(t, at);
  if (t.lora.enabled && !t.peft_adapter_path.empty() &&
      (t.use_torch_fsdp2 || t.data_parallel_sharding_strategy == DpSharding::OptimGrads ||
       t.data_parallel_sharding_strategy == DpSharding::OptimGradsParams))
    fail("{}: starting LoRA adapters from a PEFT folder under ZeRO-2 / FSDP (optim_grads, optim_grads_params, "
         "use_torch_fsdp2) is not built (the adapters are written into whole weights); use no_shard or optim for the "
         "first run, then resume its checkpoint under any layout",
         at("peft_adapter_path"));
  if (t.profile_step_start < 0) fail("{}: profile_step_start must not be negative", at("profile_step_start"));
  if (t.profile && t.profile_step_end <= t.profile_step_start)
    fail("{}: profile_step_end ({}) must be greater than profile_step_start ({})", at("profile_step_end"),
         t.profile_step_end, t.profile_step_start);
  if (t.profile && t.profile_step_start >= t.train_iters)
    fail("{}: profile_step_start {} leaves nothing to profile in a run of train_iters {}", at("profile_step_start"),
         t.profile_step_start, t.train_iters);
  if (t.exit_duration_in_mins < 0) fail("{}: exit_duration_in_mins must not be negative", at("exit_duration_in_mins"));
  if (t.tensorboard_log_interval <= 0)
    fail("{}: tensorboard_log_interval must be positive", at("tensorboard_log_interval"));
  if (t.tensorboard_queue_size <= 0) fail("{}: tensorboard_queue_size must be positive", at("tensorboard_queue_size"));
  for (int64_t r : t.profile_ranks)
    if (r < 0) fail("{}: profile_ranks lists rank {}; ranks are 0 or more", at("profile_ranks"), r);
}

ExperimentConfig load_experiment_unguarded(const std::string& path,
                                          const std::vector<std::pair<std::string, std::string>>& overrides,
                                          int world_size) {
  ExperimentConfig cfg;
  cfg.config_file = path;
  cfg.tree = load_yaml_tree(path);
  std::vector<std::pair<std::string, std::string>> command_line = overrides;
  cfg.post_trainer = adopt_post_trainer(cfg.tree, command_line, path);
  apply_command_line(cfg.tree, command_line);
  const YAML::Node pt = read_top_level(cfg, path);
  read_env(cfg);
  read_framework(cfg, pt, path, world_size);
  merge_module_config(cfg.tree, pt, path);
  if (cfg.model.empty()) fail("{}: modules.pre_trainer.model is missing: name a preset (e.g. tiny) or a model YAML", path);
  const YAML::Node model_overrides = read_overrides(cfg, pt);
  load_model(cfg, model_overrides, path);
  derive_and_check(cfg);
  return cfg;
}

}  // namespace

ExperimentConfig load_experiment(const std::string& path,
                                 const std::vector<std::pair<std::string, std::string>>& overrides, int world_size) {
  // Whatever a library throws on odd input (a path the file system refuses, a YAML node of an
  // unexpected kind) becomes an error naming the config file.
  try {
    return load_experiment_unguarded(path, overrides, world_size);
  } catch (const std::filesystem::filesystem_error& e) {
    fail("{}: {}", path, e.what());
  } catch (const YAML::Exception& e) {
    fail("{}:{}: {}", path, e.mark.line + 1, e.msg);
  }
}

std::string no_effect_summary(const ExperimentConfig& cfg) {
  if (cfg.no_effect.empty()) return "";
  std::vector<std::pair<std::string, std::vector<std::string>>> by_note;  // in order of first use
  for (const auto& k : cfg.no_effect) {
    auto it = std::find_if(by_note.begin(), by_note.end(), [&](const auto& g) { return g.first == k.note; });
    if (it == by_note.end()) it = by_note.insert(by_note.end(), {k.note, {}});
    it->second.push_back(k.key);
  }
  std::string out = fmt::format("accepted with no effect on this engine ({} keys):", cfg.no_effect.size());
  for (const auto& [note, keys] : by_note) out += fmt::format(" {} ({});", fmt::join(keys, ", "), note);
  out.pop_back();
  return out;
}

std::string argument_status_reference() {
  struct Row {
    std::string name, status, value, from, note;
  };
  auto from = [](const std::string& name) { return key_source(name); };
  std::vector<Row> rows;
  for (const auto& k : training_keys()) rows.push_back({k.name, "applied", "", from(k.name), "training key (table above)"});
  for (const auto& k : model_spec_keys())
    if (k != "extends" && k != "description")
      rows.push_back({k, "applied", "", from(k), "model key ([model_math.md](model_math.md))"});
  rows.push_back({"lora", "applied", "", from("lora"), "the LoRA block ([posttraining.md](posttraining.md#lora))"});
  for (const auto& k : kTurboSinkKeys)
    rows.push_back(
        {k, "applied", "", from(k),
         "Primus-Turbo's switch of gpt-oss's sinks and window, read as softmax_type: learnable, window_size: "
         "[sink_sliding_window, 0] (0: none) and window_attn_skip_freq: 2 (sink_window_even_layers_only) or "
         "null ([model_math.md](model_math.md#gpt-oss))"});
  for (const auto& k : foreign_keys()) {
    if (std::any_of(rows.begin(), rows.end(), [&](const Row& r) { return r.name == k.name; })) continue;
    rows.push_back({k.name, to_string(k.status), k.status == KeyStatus::NoEffect ? "" : k.engine_value, from(k.name),
                    k.note});
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.name < b.name; });
  std::string out = "| key | status | accepted value | from | note |\n|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    std::string v = r.value;
    for (size_t i = 0; (i = v.find('|', i)) != std::string::npos; i += 2) v.replace(i, 1, "\\|");
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", r.name, r.status, v.empty() ? "" : "`" + v + "`", r.from,
                       r.note);
  }
  return out;
}

std::string training_keys_reference() {
  const TrainingArgs d;
  std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& k : training_keys()) {
    std::string type, def;
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(d.*member)>;
          if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            type = "list";
            def = fmt::format("[{}]", fmt::join(d.*member, ", "));
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            type = "integer list";
            def = fmt::format("[{}]", fmt::join(d.*member, ", "));
          } else if constexpr (std::is_same_v<T, std::string>) {
            type = "text";
            def = (d.*member).empty() ? "\"\"" : d.*member;
          } else if constexpr (std::is_enum_v<T>) {
            type = "choice";
            def = *choice_name(d.*member) ? choice_name(d.*member) : "\"\"";
          } else if constexpr (std::is_same_v<T, bool>) {
            type = "bool";
            def = d.*member ? "true" : "false";
          } else if constexpr (std::is_same_v<T, int64_t>) {
            type = "integer";
            def = fmt::format("{}", d.*member);
          } else {
            type = "number";
            def = fmt::format("{}", d.*member);
          }
        },
        k.field);
    std::string help = k.help;  // a '|' in a cell would end it: Markdown wants it escaped
    for (size_t i = 0; (i = help.find('|', i)) != std::string::npos; i += 2) help.replace(i, 1, "\\|");
    out += fmt::format("| `{}` | {} | `{}` | {} |\n", k.name, type, def, help);
  }
  return out;
}

}  // namespace primus::config
