// The trainer, in the phases a run goes through (torchtitan's Trainer has the same shape):
//
//   build      processes and the parallel layout, data, the model (this rank's part of it, on
//              the chosen backend and precision) with its data-parallel strategy, resume
//   step       every microbatch's forward and backward (one process, or the pipeline schedule),
//              the strategy's gradient reduction, the norm and clipping, the strategy's step
//   evaluate   the validation loss
//   save       a checkpoint of this rank's part
//   loop       steps, logging, evaluation and saves up to train_iters
//
// A micro-batch flows data (data/microbatch.h) -> train (here) -> pipeline (train/pipeline_runner.h)
// -> model. What the data-parallel ranks share (gradient buckets, ZeRO shards, FSDP's weights, the
// experts' reduction) is one object, train/dp_strategy.h, whatever the layout.
//
// A feature adds to a phase (a new strategy to build, a new layout to build), not a branch
// through all of them: the model is one (model/llama.h) for every precision, device and layout.
#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_fit.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "data/dpo_dataset.h"
#include "data/gpt_dataset.h"
#include "data/microbatch.h"
#include "data/sft_chat_template.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"
#include "kernels/cpu/ceiling.h"
#include "kernels/cpu/gemm.h"
#include "model/attention_flops.h"
#include "model/llama.h"
#include "model/moe.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "parallel/mesh.h"
#include "parallel/mpi_process_group.h"
#include "parallel/self_process_group.h"
#include "pipeline/bubble.h"
#include "pipeline/executor.h"
#include "plan/memory_estimate.h"
#include "plan/model_options.h"
#include "plan/parallel_layout.h"
#include "safe/early_exit.h"
#include "safe/run_lock.h"
#include "safe/train_watch.h"
#include "trace/hardware.h"
#include "trace/pass_spans.h"
#include "train/pipeline_memory.h"
#include "trace/profiler.h"
#include "trace/traced_group.h"
#include "train/checkpoint_saves.h"
#include "train/compute.h"
#include "train/dp_strategy.h"
#include "train/dpo.h"
#include "train/metrics_log.h"
#include "train/moe_step.h"
#include "train/pipeline_runner.h"
#include "train/run_check.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace primus::train {
using namespace checkpoint;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string progress_bar(int64_t done, int64_t total, int width = 30) {
  const int filled = int(width * done / std::max<int64_t>(total, 1));
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0, compute_seconds = 0;
  double attention_flops = 0;  // the global batch's attention core, as its passes ran it (packed documents)
};

class Trainer {
 public:
  Trainer(const config::ExperimentConfig& cfg, const StartingAdapters& adapters);
  TrainSummary run();

 private:
  // ---- build ----
  void on_rank0_for_all(const std::function<void()>& check, const char* elsewhere);
  void build_processes();
  void build_profiler();
  void build_data();
  void build_sft_data(const data::Tokenizer& tok);
  void build_dpo_data(const data::Tokenizer& tok);
  void build_dpo();
  void build_model();
  AdamWOptions adam_options() const {
    // Megatron's fp8 is E4M3 (Transformer Engine's FusedAdam); check_precision_aware refuses the
    // combinations Megatron has not.
    const auto dtype = [](config::OptimDtype d) {
      switch (d) {
        case config::OptimDtype::Bf16: return DType::BF16;
        case config::OptimDtype::Fp16: return DType::F16;
        case config::OptimDtype::Fp8: return DType::F8E4M3;
        default: return DType::F32;
      }
    };
    AdamWOptions o{a_.adam_beta1, a_.adam_beta2, a_.adam_eps, a_.weight_decay, a_.decay_norms_and_biases};
    o.exp_avg_dtype = dtype(a_.exp_avg_dtype);
    o.exp_avg_sq_dtype = dtype(a_.exp_avg_sq_dtype);
    o.main_params_dtype = dtype(a_.main_params_dtype);
    return o;
  }
  void lock_save_folder();
  void update_fp8_scales();
  void resume();
  // Writes `adapters` (StartingAdapters) into this rank's adapter tensors (its tp pieces).
  void start_adapters(const StartingAdapters& adapters);
  // weights_only: the values alone (finetune, pretrained_checkpoint); iteration, data position and
  // optimizer start fresh.
  std::string try_restore(const std::string& dir, bool weights_only = false);
  void open_outputs();
  // ---- step ----
  StepResult train_step();
  double forward_backward(const data::MicrobatchFill& fill);
  // ---- evaluate, save, log ----
  double evaluate();
  void save();
  void log_interval(const StepResult& step);
  void log_pipeline(nlohmann::json& row);

  const config::ExperimentConfig& cfg_;
  const config::TrainingArgs& a_;
  const ModelSpec& spec_;
  const int64_t mbs_, gbs_, seq_, num_micro_;  // microbatches in the global batch, over all dp ranks
  int64_t seq_local_ = 0;                      // tokens of a sequence on this rank: seq_ / cp

  // Processes and layout.
  std::unique_ptr<parallel::SelfProcessGroup> self_;
  parallel::ProcessGroup* world_ = nullptr;  // host values: agreements, barriers, checkpoints
  plan::ParallelLayout layout_;
  Compute compute_;
  std::unique_ptr<trace::Profiler> profiler_;  // profiling on: the backend and the groups record through it
  std::unique_ptr<parallel::ProcessGroup> gpu_world_;  // the tensors' communicator on GPUs (NCCL)
  std::unique_ptr<parallel::RankMesh> mesh_;
  parallel::MeshGroups groups_;
  parallel::MeshCoord me_;
  bool rank0_ = false;
  int64_t m_local_ = 1;  // microbatches per dp rank and step

  // Data: this rank's microbatches of each global batch.
  data::SampleSource train_src_, valid_src_;
  data::MicrobatchSlice slice_;

  // The model, its data-parallel strategy (gradient reduction, optimizer, sharded weights) and
  // the learning rate.
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<DataParallelStrategy> dp_;
  std::unique_ptr<LRSchedule> lr_schedule_;
  // stage dpo: the preference pairs and the objective (train/dpo.h) in place of the LM loss; its
  // statistics of the last step, of the log interval, and of the last evaluation.
  std::shared_ptr<data::DpoDataset> dpo_train_, dpo_valid_;
  std::unique_ptr<DpoObjective> dpo_;
  DpoStats dpo_step_, dpo_interval_, dpo_eval_;

  // Run state and outputs.
  TrainState state_;
  TrainSummary summary_;
  std::unique_ptr<safe::TrainWatch> watch_;
  std::unique_ptr<safe::EarlyExit> early_exit_;  // exit_signal_handler, exit_duration_in_mins
  std::string config_yaml_;
  safe::RunLock run_lock_;                        // world rank 0: the run folder's lock (or its launcher's)
  safe::RunLock save_lock_;                       // world rank 0: the save folder's lock
  std::unique_ptr<MetricsLog> metrics_;  // rank 0: metrics.jsonl, TensorBoard
  std::unique_ptr<CheckpointSaves> saves_;         // sync or async; at most one in flight
  MoeStepSummary moe_;                             // the last step's MoE statistics
  std::vector<double> mtp_losses_;                 // the last step's MTP losses per depth (mean, unscaled)
  ModelStats stats_;
  double peak_gflops_ = 0;
  double ceiling_gflops_ = 0;  // CPU: the instruction ceiling over all ranks (kernels/cpu/ceiling.h); 0 elsewhere
  std::string ceiling_instruction_;
  bool mfu_warned_ = false;
  bool tty_ = false;
  double interval_loss_ = 0, interval_time_ = 0, interval_attention_flops_ = 0;
  double step_attention_flops_ = 0;  // this rank's microbatches' (documents_attention_flops)
  int64_t interval_steps_ = 0;
  pipeline::BubbleMeter bubble_;
  std::unique_ptr<PipelineMemoryMeter> pipeline_memory_;  // with a pipeline
};

// =============================================================================================
// build

Trainer::Trainer(const config::ExperimentConfig& cfg, const StartingAdapters& adapters)
    : cfg_(cfg),
      a_(cfg.train),
      spec_(cfg.model_spec),
      mbs_(a_.micro_batch_size),
      gbs_(a_.global_batch_size),
      seq_(a_.seq_length),
      num_micro_(gbs_ / mbs_) {
  // Everything that can fail on user input fails here, before step 1.
  cpu::flush_denormals_to_zero();
  build_processes();
  build_profiler();
  build_data();
  build_model();
  lr_schedule_ = std::make_unique<LRSchedule>(lr_schedule_options(a_));
  lock_save_folder();
  resume();
  start_adapters(adapters);
  build_dpo();
  open_outputs();
  // The peak the log reports is the training loop's: the build's transient full copies (the
  // initial weights and a loaded checkpoint under ZeRO-2 / FSDP) are gone by now.
  compute_.backend->reset_peak_memory();
}

// Runs `check` on world rank 0; when it throws, every rank stops (rank 0 with its message, the
// others with `elsewhere`), so that no rank goes on into collectives the others left.
void Trainer::on_rank0_for_all(const std::function<void()>& check, const char* elsewhere) {
  std::string problem;
  if (rank0_) try {
      check();
    } catch (const Error& e) {
      problem = e.what();
    }
  if (world_->all_reduce_value(int32_t(problem.empty() ? 0 : 1)) != 0) fail("{}", rank0_ ? problem : elsewhere);
}

// The world (MPI when this process is one of several ranks, else a group of one), the layout
// (the same verdict on every rank), the compute, and the mesh's groups over the tensors'
// communicator: MPI on the CPU, NCCL on GPUs.
void Trainer::build_processes() {
  const LaunchEnv env = discover_launch_env();
  if (env.world_size > 1) {
    parallel::init_mpi();
    world_ = &parallel::mpi_world();
    parallel::set_mpi_progress_interval(a_.mpi_progress_interval_us);
    if (world_->size() != env.world_size)
      fail("the launcher says {} ranks but MPI sees {}: start the ranks with mpirun or srun", env.world_size,
           world_->size());
  } else {
    self_ = std::make_unique<parallel::SelfProcessGroup>();
    world_ = self_.get();
  }
  layout_ = plan::plan_layout(a_, spec_, world_->size());
  compute_ = choose_compute(a_, env.local_rank);
  gpu_world_ = device_world(compute_, *world_);
  mesh_ = std::make_unique<parallel::RankMesh>(world_->size(), layout_.sizes());
  groups_ = parallel::build_groups(*mesh_, gpu_world_ ? *gpu_world_ : *world_);
  me_ = mesh_->coord(world_->rank());
  rank0_ = world_->rank() == 0;
  // DPO runs each side of each pair as a microbatch of one sequence: two per pair, and the
  // data-parallel strategy waits for that many backward passes per step.
  if (a_.stage == config::TrainStage::Dpo) layout_.microbatches_per_rank = 2 * gbs_ / layout_.dp;
  m_local_ = layout_.microbatches_per_rank;
  seq_local_ = seq_ / layout_.cp;
  slice_ = {me_.dp, m_local_, mbs_, seq_, layout_.cp, me_.cp};
  // One run per run folder: rank 0 holds the lock (or joins its launcher's); every rank stops if
  // another run has it.
  on_rank0_for_all([&] { run_lock_ = safe::RunLock::acquire_or_join(cfg_.run_dir(), "trainer rank 0"); },
                   "rank 0 could not take the run folder's lock");
  // A model that cannot fit stops here, before anything is allocated.
  // (The ranks of a host share its memory; each rank has a GPU of its own.)
  plan::check_memory(plan::estimate_memory(spec_, layout_, a_, compute_.precision == Precision::Bf16),
                     compute_.device == Device::CUDA ? 1 : env.local_world_size, compute_.memory_available(),
                     compute_.memory_name());
  if (layout_.schedule)
    pipeline_memory_ = std::make_unique<PipelineMemoryMeter>(spec_, layout_, a_, compute_.precision, me_.pp);
}

// Profiling (docs/profiling.md): the backend and the mesh's groups are wrapped in decorators that
// record while the window is open, and the step marks its phases; nothing else changes.
void Trainer::build_profiler() {
  if (!a_.profile) return;
  const trace::ProfileOptions po{true, a_.profile_step_start, a_.profile_step_end, a_.profile_ranks, a_.train_iters};
  profiler_ = std::make_unique<trace::Profiler>(po, *world_, fs::path(cfg_.run_dir()) / "trace",
                                                compute_.device == Device::CUDA ? trace::cuda_clock() : trace::host_clock());
  compute_.backend = &profiler_->wrap(*compute_.backend);
  trace::trace_groups(groups_, *profiler_);
  trace::RunInfo& i = profiler_->info();
  i.tp = layout_.tp, i.pp = layout_.pp, i.dp = layout_.dp, i.cp = layout_.cp, i.vpp = layout_.vpp;
  i.tp_rank = me_.tp, i.pp_rank = me_.pp, i.dp_rank = me_.dp;
  if (layout_.schedule) i.schedule = layout_.schedule->algorithm;
  for (const auto& r : layout_.stages) i.stage_layers.push_back(r.num_layers);
  i.model = cfg_.model;
  i.micro_batch_size = mbs_;
  i.seq_length = seq_;
  i.global_batch_size = gbs_;
  i.microbatches_per_rank = m_local_;
  i.precision = precision_name(compute_.precision);
  if (profiler_->records_this_rank()) trace::describe_device(i, *compute_.backend);
}

void Trainer::build_data() {
  int32_t eod = -1;
  std::unique_ptr<data::Tokenizer> tok;
  if (!a_.tokenizer_type.empty()) {
    tok = data::build_tokenizer({a_.tokenizer_type, a_.tokenizer_model});
    if (tok->vocab_size() > spec_.vocab_size)
      fail("tokenizer {} has {} tokens but the model's vocab_size is {}", a_.tokenizer_model, tok->vocab_size(),
           spec_.vocab_size);
    eod = tok->eod();
  }
  if (a_.stage == config::TrainStage::Sft) return build_sft_data(*tok);  // the config checked the tokenizer
  if (a_.stage == config::TrainStage::Dpo) return build_dpo_data(*tok);
  if (!tok && a_.mock_data) {
    eod = int32_t(spec_.vocab_size - 1);  // mock data without a tokenizer: the last id stands for eod
  }
  for (const auto& [on, key] : {std::pair{a_.eod_mask_loss, "eod_mask_loss"},
                                 std::pair{a_.reset_position_ids, "reset_position_ids"},
                                 std::pair{a_.reset_attention_mask, "reset_attention_mask"}})
    if (on && eod < 0) fail("{} needs tokenizer_type (and tokenizer_model) to know the end-of-document token", key);
  const int32_t eod_mask = a_.eod_mask_loss ? eod : -1;
  // Documents split after each eod (data/microbatch.h), in training and evaluation alike.
  const auto set_documents = [&](data::SampleSource& src) {
    src.eod = eod;
    src.reset_position_ids = a_.reset_position_ids;
    src.reset_attention_mask = a_.reset_attention_mask;
  };
  const int64_t evals = a_.eval_interval > 0 ? a_.train_iters / a_.eval_interval + 1 : 0;
  if (a_.mock_data) {
    train_src_ = {nullptr, spec_.vocab_size, seq_, uint64_t(a_.seed) * 2 + 1, eod_mask};
    valid_src_ = {nullptr, spec_.vocab_size, seq_, uint64_t(a_.seed) * 2 + 2, eod_mask};
    set_documents(train_src_);
    set_documents(valid_src_);
    return;
  }
  data::GPTDatasetConfig dc;
  dc.data_path = a_.data_path;
  dc.split = a_.split;
  dc.seq_length = seq_;
  dc.seed = uint64_t(a_.seed);
  dc.num_samples = {a_.train_iters * gbs_, evals * a_.eval_iters * gbs_, a_.eval_iters * gbs_};
  // Rank 0 builds the index caches first; the others then read them instead of racing to write.
  data::GPTDatasets ds;
  if (rank0_) ds = data::build_gpt_datasets(dc);
  world_->barrier();
  if (!rank0_) ds = data::build_gpt_datasets(dc);
  if (!ds.train) fail("data_path {} gives no training documents with split {}", fmt::join(a_.data_path, " "), a_.split);
  train_src_.dataset = ds.train;
  valid_src_.dataset = ds.valid;
  train_src_.eod_mask = valid_src_.eod_mask = eod_mask;
  set_documents(train_src_);
  set_documents(valid_src_);
  if (!ds.valid && a_.eval_interval > 0 && a_.eval_iters > 0)
    log::warn("split {} leaves no validation documents: evaluation is off", a_.split);
}

// SFT: one conversation per sample from the chat data set, the loss on the responses only
// (data/sft_dataset.h); the same sample order on every rank, each taking its microbatches.
void Trainer::build_sft_data(const data::Tokenizer& tok) {
  const std::unique_ptr<data::ChatFormat> format = data::chat_format(a_.sft_conversation_format, a_.tokenizer_model);
  const int64_t evals = a_.eval_interval > 0 ? a_.train_iters / a_.eval_interval + 1 : 0;
  data::SftDatasetOptions o{seq_, a_.train_iters * gbs_, uint64_t(a_.seed), a_.enable_packed_sequences};
  auto train = std::make_shared<data::SftDataset>(data::read_sft_records(a_.sft_dataset_name, a_.sft_dataset_split),
                                                  *format, tok, o);
  log::info("sft: {} conversations of {} ({}, split {}) in {} samples of {} tokens", train->conversations(),
            a_.sft_dataset_name, config::choice_name(a_.sft_conversation_format), a_.sft_dataset_split,
            train->sequences(), seq_ + 1);
  train_src_.dataset = train;
  train_src_.dataset_documents = valid_src_.dataset_documents = a_.enable_packed_sequences && a_.use_packed_attention;
  const data::SftRecords valid = data::read_sft_records(a_.sft_dataset_name, "validation", /*optional=*/true);
  if (!valid.records.empty()) {
    o.num_samples = evals * a_.eval_iters * gbs_;
    valid_src_.dataset = std::make_shared<data::SftDataset>(valid, *format, tok, o);
  } else if (a_.eval_interval > 0 && a_.eval_iters > 0) {
    log::warn("sft: {} has no validation split (a JSON object's \"validation\" list): evaluation is off",
              a_.sft_dataset_name);
  }
}

// DPO: preference pairs from the same files and formats as SFT's conversations
// (data/dpo_dataset.h), a global batch of global_batch_size pairs.
void Trainer::build_dpo_data(const data::Tokenizer& tok) {
  const std::unique_ptr<data::ChatFormat> format = data::fixed_chat_format(a_.sft_conversation_format);
  data::DpoDatasetOptions o{seq_, a_.train_iters * gbs_, uint64_t(a_.seed)};
  dpo_train_ = std::make_shared<data::DpoDataset>(
      data::read_sft_records(a_.sft_dataset_name, a_.sft_dataset_split), *format, tok, o);
  log::info("dpo: {} preference pairs of {} ({}, split {}), each side a sequence of {} tokens", dpo_train_->pairs(),
            a_.sft_dataset_name, config::choice_name(a_.sft_conversation_format), a_.sft_dataset_split, seq_ + 1);
  train_src_.dataset = dpo_train_;
  const data::SftRecords valid = data::read_sft_records(a_.sft_dataset_name, "validation", /*optional=*/true);
  if (!valid.records.empty()) {
    o.num_pairs = 0;  // evaluation draws wrap around one epoch
    valid_src_.dataset = dpo_valid_ = std::make_shared<data::DpoDataset>(valid, *format, tok, o);
  } else if (a_.eval_interval > 0 && a_.eval_iters > 0) {
    log::warn("dpo: {} has no validation split (a JSON object's \"validation\" list): evaluation is off",
              a_.sft_dataset_name);
  }
}

// DPO's objective over the model as built and loaded: the reference log-probabilities of every
// pair come from these starting weights (or, on a resumed run, from the file the start wrote).
void Trainer::build_dpo() {
  if (a_.stage != config::TrainStage::Dpo) return;
  if (spec_.mtp_num_layers > 0)
    fail("DPO with multi-token prediction (mtp_num_layers {}) is not built: DPO's objective has no MTP term; set "
         "mtp_num_layers 0",
         spec_.mtp_num_layers);
  const DpoObjective::Setup setup{*model_, *groups_.dp,   me_.dp, seq_, seq_local_, layout_.cp, me_.cp,
                                  {a_.dpo_beta, a_.dpo_label_smoothing}, uint64_t(a_.seed)};
  dpo_ = std::make_unique<DpoObjective>(setup, dpo_train_, dpo_valid_);
  dpo_->prepare_reference((fs::path(cfg_.checkpoint_dir()) / "dpo_reference.json").string(), state_.iteration > 0,
                          rank0_);
}

// This rank's part of the model (its tensor-parallel shard of its pipeline chunks) and the
// data-parallel strategy attached to it, which initializes the weights.
void Trainer::build_model() {
  LlamaOptions mopt = plan::model_options(a_);
  // ZeRO-2 and FSDP: the model holds no weights of its own; the strategy's shards serve them.
  mopt.resident_weights = !layout_.shard_gradients();
  ModelPartition part;
  part.tp_size = layout_.tp;
  part.tp_group = groups_.tp.get();
  part.sequence_parallel = layout_.sequence_parallel;
  part.cp_size = layout_.cp;
  part.cp_rank = me_.cp;
  part.cp_group = groups_.cp.get();
  part.cp_comm = a_.cp_comm_type;
  part.ep_size = layout_.ep;
  part.ep_rank = me_.ep;
  part.ep_group = groups_.ep.get();
  part.etp_size = layout_.etp;
  const int num_stages = layout_.pp * layout_.vpp;
  if (layout_.schedule)
    for (int c = 0; c < layout_.vpp; ++c) {
      const int stage = layout_.schedule->stage_of(me_.pp, c);
      const pipeline::LayerRange r = layout_.stages[stage];
      part.chunks.push_back({r.first_layer, r.num_layers, stage == 0, stage == num_stages - 1});
    }
  model_ = std::make_unique<LlamaModel>(spec_, *compute_.backend, compute_.precision, mopt, part);
  dp_ = make_dp_strategy({*model_, layout_, groups_, me_, adam_options(), a_.ddp_bucket_size, a_.overlap_grad_reduce,
                          uint64_t(a_.seed), a_.main_grads_dtype == config::OptimDtype::Bf16,
                          a_.reduce_sharded_grads_once_per_step, a_.torch_fsdp2_reshard_after_forward});
  // (the profiler's per-module weight memory needs resident weights)
  if (profiler_ && mopt.resident_weights) profiler_->set_parameters(model_->params(), model_->working_weights());
}

// Every rank reads its own part; a checkpoint counts only if all ranks could read theirs.
std::string Trainer::try_restore(const std::string& dir, bool weights_only) {
  std::string problem;
  ModelFit fit;
  try {  // the whole model on every rank: a rank loads only its own tensors
    fit = check_model_fit(dir, spec_,
                          {weights_only ? LoadPurpose::Weights : LoadPurpose::Resume, a_.load_strict,
                           lora_adapter_layout(model_parameter_layout(spec_), a_.lora)});
  } catch (const Error& e) {
    problem = e.what();
  }
  if (world_->all_reduce_value(int32_t(problem.empty() ? 0 : 1)) != 0)
    return problem.empty() ? "another rank could not read the checkpoint's model" : problem;
  LoadOptions lo;
  lo.optimizer = !weights_only && !a_.no_load_optim;
  // load_strict false: the tensors the checkpoint does not fill keep their initial values (in place).
  lo.strict = a_.load_strict && !fit.extra_fresh;  // LoRA from a base model: the adapters keep their init
  if (rank0_ && fit.extra_fresh)
    log::info("LoRA: {} holds no adapters; they start from their initial values (lora_B_init_method {})", dir,
              config::choice_name(a_.lora.b_init));
  // Straight into this rank's own state: only its pieces (ZeRO-2 / FSDP) and optimizer shards
  // (ZeRO-1) are read; of what dp replicas hold alike each reads all, or with
  // ckpt_fully_parallel_load a share, and they exchange the rest.
  ResidentLoad resident;
  dp_->load_targets(resident, lo.optimizer);
  lo.targets = resident.targets();
  if (!a_.ckpt_fully_parallel_load)
    for (checkpoint::LoadTarget& t : lo.targets) t.replicas = nullptr;
  lo.world = world_;
  if (!weights_only) lo.state = model_->linears().state_names();
  CheckpointData ck;
  try {
    ck = load_checkpoint(dir, model_->params(), lo);
  } catch (const Error& e) {
    problem = e.what();
  }
  if (world_->all_reduce_value(int32_t(problem.empty() ? 0 : 1)) != 0) {
    // The load wrote into the model's state before it failed: start again from the initial state.
    dp_.reset();
    model_.reset();
    build_model();
    return problem.empty() ? "another rank could not read its part" : problem;
  }
  const int64_t step = lo.optimizer ? ck.state.optimizer_step : 0;
  resident.commit(step);
  dp_->finish_load(step, lo.optimizer);
  const std::string io = fmt::format("read {:.1f} MiB, received {:.1f} MiB from replicas, host copies {:.1f} MiB",
                                     double(ck.bytes_read) / double(1 << 20), double(ck.bytes_received) / double(1 << 20),
                                     double(resident.staging_bytes()) / double(1 << 20));
  if (a_.ckpt_fully_parallel_load && rank0_)
    log::info("resume from {} (ckpt_fully_parallel_load): rank 0 {}", dir, io);
  else
    log::debug("resume from {}: {}", dir, io);
  if (rank0_ && !fit.exact()) log::warn("{}", fit.summary(dir));
  if (weights_only) {
    log::info("starting from the weights of {} (iteration 0, fresh optimizer)", dir);
    return "";
  }
  if (!lo.optimizer)
    ck.state.optimizer_step = 0;  // no_load_optim: the weights and the data position, a fresh optimizer
  state_ = ck.state;
  const std::vector<std::string> fresh_fp8 = model_->linears().load_state(ck.state_values);
  if (rank0_ && !fresh_fp8.empty())
    log::warn("{} holds no FP8 scaling state for {} of this model's {} FP8 linears (e.g. {}, saved without fp8 "
              "delayed scaling or with another fp8_amax_history_len): their amax histories start fresh",
              dir, fresh_fp8.size(), model_->linears().state_names().size(), fresh_fp8.front());
  log::info("resumed from {} at iteration {} ({} samples consumed{})", dir, state_.iteration, state_.consumed_samples,
            lo.optimizer ? "" : "; a fresh optimizer state: no_load_optim");
  return "";
}

// One run per save folder as per run folder: a second run given another run's `save` stops here,
// before it reads or writes checkpoints there (a save folder outside the run folder is shared by
// runs of any name). Taken after the data and model are built, so that a run refused earlier
// creates no save folder.
void Trainer::lock_save_folder() {
  on_rank0_for_all(
      [&] { save_lock_ = safe::RunLock::acquire(cfg_.checkpoint_dir(), "trainer rank 0", safe::kSaveFolder); },
      "rank 0 could not take the save folder's lock");
}

// An explicit `load` must load; auto-resume falls back past damaged checkpoints.
void Trainer::resume() {
  state_.seed = a_.seed;
  state_.run_id = new_run_id(world_);  // a resume replaces it with the checkpoint's
  if (a_.finetune && a_.load.empty() && a_.pretrained_checkpoint.empty())
    fail("finetune: true needs the checkpoint to start from in `load` or `pretrained_checkpoint`");
  if (!a_.load.empty()) {
    const std::string dir = resolve_checkpoint(a_.load);
    const std::string problem = try_restore(dir, a_.finetune);
    if (!problem.empty()) fail("cannot load checkpoint {}: {}", dir, problem);
  } else {
    bool resumed = false;
    std::vector<std::pair<std::string, std::string>> skipped;  // (checkpoint, why), newest first
    if (a_.auto_resume) {
      for (const std::string& dir : list_checkpoints(cfg_.checkpoint_dir())) {
        const std::string problem = try_restore(dir);
        if (problem.empty()) {
          resumed = true;
          break;
        }
        skipped.push_back({dir, problem});
      }
    }
    // Checkpoints that this run cannot resume are not started over beside, unless --overwrite asks
    // for their numbers to be replaced. Each reason is said once: in that error, or as a warning.
    if (!resumed && !skipped.empty() && !a_.overwrite) fail_nothing_to_resume(cfg_.checkpoint_dir(), skipped);
    for (const auto& [dir, why] : skipped) log::warn("skipped checkpoint {}: {}", dir, why);
    if (!resumed && !a_.pretrained_checkpoint.empty()) {
      const std::string dir = resolve_checkpoint(a_.pretrained_checkpoint);
      const std::string problem = try_restore(dir, true);
      if (!problem.empty()) fail("cannot load pretrained_checkpoint {}: {}", dir, problem);
    }
  }
  if (state_.seed != a_.seed)
    log::warn("the checkpoint was trained with seed {}, the config says {}; data order follows the config",
              state_.seed, a_.seed);
  // A save that would replace another run's checkpoint stops the job now, not at that save.
  on_rank0_for_all(
      [&] {
        check_save_folder(cfg_.checkpoint_dir(), state_.run_id,
                          planned_saves(state_.iteration, a_.train_iters, a_.save_interval), a_.overwrite);
      },
      "rank 0 refused the save folder");
}

void Trainer::start_adapters(const StartingAdapters& adapters) {
  if (adapters.empty()) return;
  if (state_.iteration > 0) {
    if (rank0_)
      log::info("peft_adapter_path {}: not read, the run resumed at iteration {} with its checkpoint's adapters",
                a_.peft_adapter_path, state_.iteration);
    return;
  }
  ParamStore& p = model_->params();
  for (int id = model_->first_trainable(); id < int(p.infos().size()); ++id) {
    const StoredParam& info = p.infos()[size_t(id)];
    const auto it = adapters.find(info.name);
    PRIMUS_CHECK(it != adapters.end() && int64_t(it->second.size()) == info.global_shape[0] * info.global_shape[1],
                 "starting adapters: {} missing or of another size", info.name);
    const std::vector<float>& g = it->second;
    const int64_t cols = info.global_shape[1];
    std::vector<float> local;  // this rank's pieces (ShardSpec), in order
    local.reserve(size_t(info.numel));
    if (info.shard.pieces.empty()) {
      local = g;
    } else if (info.shard.dim == 0) {
      for (const ShardPiece& s : info.shard.pieces)
        local.insert(local.end(), g.begin() + s.global_start * cols, g.begin() + (s.global_start + s.length) * cols);
    } else {
      for (int64_t row = 0; row < info.global_shape[0]; ++row)
        for (const ShardPiece& s : info.shard.pieces)
          local.insert(local.end(), g.begin() + row * cols + s.global_start,
                       g.begin() + row * cols + s.global_start + s.length);
    }
    Tensor host = Tensor::empty(info.shape, DType::F32);
    std::copy(local.begin(), local.end(), host.data<float>());
    Tensor dst = p.value_tensor(id);
    dst.copy_from(host);
  }
  dp_->finish_load(0, false);  // bf16 main params rounded, the working copy refreshed
  if (rank0_)
    log::info("LoRA: the adapters start from the PEFT folder {}", a_.peft_adapter_path);
}

void Trainer::open_outputs() {
  stats_ = model_stats(spec_, seq_);
  // MFU's denominator: the backend's peak (on the CPU one rank's measured SGEMM peak: ranks measure
  // one at a time, rank 0's number is used; on a GPU the data sheet's dense bf16 peak), times the
  // ranks.
  double peak = rank0_ ? compute_.backend->peak_tflops() * 1e3 : 0.0;
  peak_gflops_ = world_->all_reduce_value(peak) * world_->size();
  if (compute_.device == Device::CPU) {  // MFU against the instruction ceiling too (rank 0 measures, as for the peak)
    const cpu::InstructionCeiling c =
        rank0_ ? cpu::instruction_ceiling(compute_.precision == Precision::Bf16) : cpu::InstructionCeiling{};
    ceiling_gflops_ = world_->all_reduce_value(c.gflops) * world_->size();
    ceiling_instruction_ = rank0_ ? c.instruction : cpu::ceiling_instruction(compute_.precision == Precision::Bf16);
  }
  if (profiler_) profiler_->info().peak_tflops = peak_gflops_ / world_->size() / 1e3;
  config_yaml_ = cfg_.resolved_yaml();
  if (rank0_) {
    std::ofstream(fs::path(cfg_.run_dir()) / "config.yaml") << config_yaml_;
    write_resolved_config(config_yaml_);  // into the launch snapshot, when primus-cli made one
    metrics_ = std::make_unique<MetricsLog>(cfg_, world_->size());
  }
  saves_ = std::make_unique<CheckpointSaves>(
      CheckpointSaves::Setup{world_, cfg_.checkpoint_dir(), a_.async_save, a_.keep_last_checkpoints, metrics_.get()});
  tty_ = ::isatty(STDOUT_FILENO) && rank0_;
  log::info("model {}: {:.2f}M parameters, {:.1f} MFLOP per token; {} x {} tokens per microbatch, {} microbatches "
            "per step",
            cfg_.model, stats_.parameters / 1e6, stats_.flops_per_token / 1e6, mbs_, seq_, num_micro_);
  log::info("parallel layout: {}; this rank: tp {} cp {} pp {} dp {}, {:.2f}M parameters", layout_.describe(), me_.tp,
            me_.cp, me_.pp, me_.dp, model_->params().numel() / 1e6);
  if (model_->frozen_base()) {  // LoRA: what trains (docs/posttraining.md#lora)
    const ParamStore& p = model_->params();
    const int64_t trainable = p.numel() - model_->trainable_begin();
    const LoraOptions& l = model_->linears().lora();
    log::info("LoRA: dim {}, alpha {} (scale {}){}: this rank trains {} adapter parameters in {} tensors ({:.3f}% of "
              "its {}), AdamW state {:.3f} MiB; the rest is frozen (no gradient, no optimizer state)",
              l.dim, l.alpha, l.scale(),
              l.dropout > 0 ? fmt::format(", dropout {} {}", l.dropout, config::choice_name(l.dropout_position)) : "",
              trainable, p.infos().size() - size_t(model_->first_trainable()),
              100.0 * double(trainable) / double(p.numel()), p.numel(), dp_->memory().optimizer / 1048576.0);
  }
  log::info("compute: {}", compute_.describe());
  if (const std::string fp8 = model_->linears().describe_fp8(); !fp8.empty())  // docs/fp8.md
    log::info("{}; {}, counted in MFU against the peak named below (not an FP8 peak)", fp8,
              compute_.device == Device::CUDA ? "cuBLASLt's FP8 GEMMs where the GPU and the problem allow them (the "
                                                "backend names any that run as the bf16 GEMM of the same values)"
                                              : "the GEMMs are the backend's own GEMMs of the FP8 values (the exact "
                                                "emulation)");
  if (a_.use_precision_aware_optimizer)  // docs/optim.md#low-precision-optimizer-state
    log::info("precision-aware optimizer: main_grads_dtype {}, main_params_dtype {}, exp_avg_dtype {}, "
              "exp_avg_sq_dtype {}; AdamW state {:.3f} MiB on this rank",
              config::choice_name(a_.main_grads_dtype), config::choice_name(a_.main_params_dtype),
              config::choice_name(a_.exp_avg_dtype), config::choice_name(a_.exp_avg_sq_dtype),
              dp_->memory().optimizer / 1048576.0);
  if (rank0_ && !cfg_.no_effect.empty()) log::info("{}", config::no_effect_summary(cfg_));
  const bool bf16_gemm = compute_.device == Device::CPU && compute_.precision == Precision::Bf16;
  log::info("training iterations {} to {}; MFU against a peak of {:.1f} GFLOP/s ({}){}", state_.iteration + 1,
            a_.train_iters, peak_gflops_,
            compute_.device == Device::CUDA ? "data-sheet dense bf16"
            : bf16_gemm                     ? "measured bf16 GEMM"
                                            : "measured SGEMM",
            ceiling_gflops_ > 0 ? fmt::format(" and, in brackets, against the instruction ceiling of {:.1f} GFLOP/s "
                                              "({}, a register loop on every thread)",
                                              ceiling_gflops_, ceiling_instruction_)
                                : std::string());
  summary_.start_iteration = state_.iteration;
  watch_ = std::make_unique<safe::TrainWatch>(cfg_.run_dir(), state_.iteration);  // heartbeats, NaN policy, faults
  early_exit_ = std::make_unique<safe::EarlyExit>(a_.exit_signal_handler, a_.exit_duration_in_mins);
}

// =============================================================================================
// step

// Every microbatch of this rank, forward and backward: through the pipeline schedule when the
// model is split in stages, else one after the other. The W passes hand their gradients to the
// strategy's hook, which starts their reduction while the backward goes on. Returns the loss
// summed over the microbatches whose loss this rank computed.
double Trainer::forward_backward(const data::MicrobatchFill& data_fill) {
  const double dloss = 1.0 / double(num_micro_);
  // LoRA dropout: each microbatch's key from the seed and its first sample (model/linears.h).
  struct ClearKey {
    LlamaModel& m;
    ~ClearKey() { m.set_dropout_key(std::nullopt); }
  } clear{*model_};
  const int64_t first = state_.consumed_samples + slice_.dp_rank * slice_.per_rank * mbs_;
  const data::MicrobatchFill fill = [&](int m, data::Microbatch& mb) {
    data_fill(m, mb);
    model_->set_dropout_key(lora_dropout_key(uint64_t(a_.seed), first + int64_t(m) * mbs_));
    step_attention_flops_ += documents_attention_flops(spec_, mb.docs, mbs_, seq_);
  };
  if (layout_.schedule) {
    LlamaStageRunner runner(*model_, mbs_, seq_local_, dloss, fill);
    trace::PassSpans passes(runner, profiler_.get());  // F / B / W spans when profiling
    bubble_.add(pipeline::run_schedule(*layout_.schedule, passes, *groups_.pp));
    pipeline_memory_->add(runner.peak_held_bytes());
    return runner.loss_sum();
  }
  double loss_sum = 0;
  data::Microbatch mb;
  for (int j = 0; j < m_local_; ++j) {
    fill(j, mb);
    LlamaContext ctx;
    {
      trace::PassSpan f(profiler_.get(), trace::Pass::F, j, -1);
      loss_sum += model_->forward(ctx, mb.tokens.data(), mb.targets.data(), mbs_, seq_local_, &mb.docs);
    }
    trace::PassSpan bw(profiler_.get(), trace::Pass::B, j, -1, /*fused_bw=*/true);
    model_->backward(ctx, dloss);
  }
  return loss_sum;
}

StepResult Trainer::train_step() {
  const auto t0 = Clock::now();
  StepResult r;
  if (profiler_) profiler_->step_begin(state_.iteration + 1);
  watch_->begin_step(state_.iteration + 1);
  dp_->begin_step();
  model_->reset_moe_stats();  // evaluation forwards do not count
  model_->reset_mtp_losses();
  model_->linears().clear_current_amaxes();  // nor do they in FP8's amax histories
  double loss_sum = 0;
  step_attention_flops_ = 0;
  if (dpo_)  // (its statistics are summed over the dp ranks already)
    dpo_step_ = dpo_->train(state_.consumed_samples, gbs_);
  else
    loss_sum = forward_backward(trace::in_host_span(
        profiler_.get(), "data_loading", data::microbatches_from(train_src_, state_.consumed_samples, slice_)));
  compute_.backend->synchronize();  // compute time counts the device's work
  // This rank's own work; the reductions below wait for the slowest rank (stragglers show here).
  r.compute_seconds = seconds_since(t0);
  watch_->inject_faults(state_.iteration + 1, dp_->gradients());
  {
    trace::Span span(profiler_.get(), trace::Category::Annotation, "reduce_gradients");
    dp_->finish_gradients();
  }
  // Loss: the last stage's sum, over pipeline ranks and dp ranks (tp ranks agree).
  if (layout_.schedule) loss_sum = groups_.pp->all_reduce_value(loss_sum);
  if (dpo_) {
    r.loss = dpo_step_.mean_loss();
    r.attention_flops = double(gbs_) * attention_flops(spec_, seq_);  // one document per sequence
  } else {  // the sums over the dp ranks' microbatches (tp, cp and pp ranks saw the same ones)
    std::vector<double> sums = {loss_sum, step_attention_flops_};
    groups_.dp->all_reduce(sums);
    r.loss = sums[0] / double(num_micro_);
    r.attention_flops = sums[1];
  }
  if (spec_.mtp_num_layers > 0) {  // logged apart, as Megatron's "mtp_1 loss": the last stage's, over pp and dp
    mtp_losses_ = model_->mtp_loss_sums();
    mtp_losses_.resize(size_t(spec_.mtp_num_layers), 0.0);
    if (layout_.schedule) groups_.pp->all_reduce(mtp_losses_);
    groups_.dp->all_reduce(mtp_losses_);
    for (double& l : mtp_losses_) l /= double(num_micro_);
  }
  {
    trace::Region region(profiler_.get(), "gradient_norm");
    r.grad_norm = dp_->gradient_norm();
  }
  const double clip_scale = a_.clip_grad > 0 ? clip_coefficient(r.grad_norm, a_.clip_grad) : 1.0;
  // loss and grad_norm are reduced over every rank, so every rank takes the same decision.
  const bool skip = watch_->check(state_.iteration + 1, r.loss, r.grad_norm) == safe::StepAction::Skip;
  r.lr = lr_schedule_->lr_at(state_.iteration);
  if (!skip) {
    trace::Region region(profiler_.get(), "optimizer_step");
    dp_->step(r.lr, clip_scale);
    compute_.backend->synchronize();
  }
  update_fp8_scales();
  moe_ = finish_moe_step(*model_, *groups_.dp, m_local_, !skip,  // expert load, bias update
                         {layout_.sequence_parallel && layout_.etp == 1 ? groups_.tp.get() : nullptr,
                          layout_.cp > 1 ? groups_.cp.get() : nullptr});
  state_.iteration += 1;
  state_.consumed_samples += gbs_;
  state_.optimizer_step = dp_->step_count();
  r.seconds = seconds_since(t0);
  if (profiler_)
    if (const fs::path f = profiler_->step_end(state_.iteration); !f.empty()) log::info("profile: wrote {}", f.string());
  return r;
}

// FP8 delayed scaling: the step's amaxes, max-reduced over the ranks that hold the same linears
// (the tp shards of a tensor, and the replicas that saw other data: dp x cp for the dense ones,
// edp x cp for an expert's under expert parallelism, the other ep ranks holding other experts at
// the same positions), become the scales of the next step, the same on all of them.
void Trainer::update_fp8_scales() {
  Linears& lin = model_->linears();
  if (!lin.delayed()) return;
  std::vector<float> amax = lin.current_amaxes();
  const auto reduce = [](parallel::ProcessGroup& g, std::vector<float>& v) {
    if (g.size() > 1 && !v.empty()) g.all_reduce(v, parallel::ReduceOp::Max);
  };
  reduce(*groups_.tp, amax);
  parallel::ProcessGroup& dense_replicas = layout_.cp > 1 ? *groups_.dp_cp : *groups_.dp;
  if (layout_.ep <= 1) {
    reduce(dense_replicas, amax);
  } else {  // three amaxes (x, W, dy) per linear, in state_names() order
    const std::vector<std::string> names = lin.state_names();
    std::vector<float> part[2];  // dense, experts
    for (size_t k = 0; k < names.size(); ++k) {
      std::vector<float>& p = part[is_expert_param(names[k])];
      p.insert(p.end(), amax.begin() + 3 * k, amax.begin() + 3 * k + 3);
    }
    reduce(dense_replicas, part[0]);
    reduce(*groups_.edp_cp, part[1]);
    size_t at[2] = {0, 0};
    for (size_t k = 0; k < names.size(); ++k) {
      const bool e = is_expert_param(names[k]);
      std::copy_n(part[e].begin() + at[e], 3, amax.begin() + 3 * k);
      at[e] += 3;
    }
  }
  lin.update_scales(amax);
}

// =============================================================================================
// evaluate, save, log

double Trainer::evaluate() {
  trace::Span span(profiler_.get(), trace::Category::Annotation, "evaluate");
  if (dpo_) {
    dpo_eval_ = DpoStats();
    for (int64_t e = 0; e < a_.eval_iters; ++e) dpo_eval_ += dpo_->evaluate(e * gbs_, gbs_);
    return dpo_eval_.mean_loss();
  }
  double total = 0;
  data::Microbatch mb;
  for (int64_t e = 0; e < a_.eval_iters; ++e) {
    const data::MicrobatchFill fill = data::microbatches_from(valid_src_, e * num_micro_ * mbs_, slice_);
    if (layout_.schedule) {
      total += pipeline_forward_only(*model_, *layout_.schedule, *groups_.pp, mbs_, seq_local_, int(m_local_), fill);
      continue;
    }
    for (int j = 0; j < m_local_; ++j) {
      fill(j, mb);
      LlamaContext ctx;
      total += model_->forward(ctx, mb.tokens.data(), mb.targets.data(), mbs_, seq_local_, &mb.docs);
    }
  }
  return groups_.dp->all_reduce_value(total) / double(a_.eval_iters * num_micro_);
}

// Every rank writes what it owns (its ZeRO / FSDP shards, its share of replicated tensors):
// checkpoint_saves.h, which also measures the save.
void Trainer::save() {
  trace::Span span(profiler_.get(), trace::Category::Host, "checkpoint_save");
  watch_->before_save(state_.iteration);
  SaveOptions so;
  so.layout = {world_->size(), layout_.tp, layout_.pp, layout_.dp, layout_.cp, layout_.vpp};
  so.overwrite = a_.overwrite;
  so.state = model_->linears().state();  // FP8 delayed scaling's histories and scales (none otherwise)
  saves_->save(*dp_, state_, config_yaml_, so);
  summary_.last_checkpoint = saves_->last_checkpoint();
}

void Trainer::log_interval(const StepResult& step) {
  const double tps = double(interval_steps_ * gbs_ * seq_) / interval_time_;
  // Attention as the passes ran it (packed documents attend within themselves), the rest per token.
  const double tflops = ((stats_.flops_per_token - attention_flops(spec_, seq_) / double(seq_)) * tps +
                         interval_attention_flops_ / interval_time_) / 1e12;
  const double mfu = tflops * 1e3 / peak_gflops_;
  const double mfu_ceiling = ceiling_gflops_ > 0 ? tflops * 1e3 / ceiling_gflops_ : 0.0;
  const double mean_loss = interval_loss_ / double(interval_steps_);
  const MemoryStats mem = compute_.backend->memory_stats();
  const size_t peak = mem.peak;
  if (mfu > 1.0 && !mfu_warned_) {  // a CPU peak measured while other work held the cores
    log::warn("MFU above 100%: this run computes faster than the peak of {:.1f} GFLOP/s it divides by (on a CPU, "
              "a peak measured at start-up while other work held the cores); set PRIMUS_PEAK_GFLOPS to the "
              "machine's peak for a meaningful MFU",
              peak_gflops_);
    mfu_warned_ = true;
  }
  // The peak split: weights (master and bf16 working copy), fp32 gradients and AdamW moments are
  // what this rank's buffers hold (the strategy's); the rest of the peak is activations and
  // transient buffers (gathered FSDP units among them).
  const DpMemory buffers = dp_->memory();
  const double param_bytes = buffers.parameters, grad_bytes = buffers.gradients, optim_bytes = buffers.optimizer;
  const double activation_bytes = std::max(0.0, double(peak) - param_bytes - grad_bytes - optim_bytes);
  if (tty_) fmt::print("\r\033[K");
  log::info(" iteration {:>6}/{:>6} | consumed samples: {:>9} | elapsed time per iteration (ms): {:.1f} | "
            "learning rate: {:.3E} | global batch size: {} | lm loss: {:.6E} | grad norm: {:.3f} | "
            "tokens/s: {:.0f} | TFLOP/s: {:.3f} | MFU: {:.1f}%{} | peak tensor memory: {:.0f} MiB (parameters {:.1f}, "
            "gradients {:.1f}, optimizer {:.1f}, activations and the rest {:.1f})",
            state_.iteration, a_.train_iters, state_.consumed_samples, 1e3 * interval_time_ / interval_steps_, step.lr,
            gbs_, mean_loss, step.grad_norm, tps, tflops, 100 * mfu,
            mfu_ceiling > 0 ? fmt::format(" ({:.1f}%)", 100 * mfu_ceiling) : std::string(), peak / 1048576.0, param_bytes / 1048576.0,
            grad_bytes / 1048576.0, optim_bytes / 1048576.0, activation_bytes / 1048576.0);
  nlohmann::json row{{"iteration", state_.iteration},   {"consumed_samples", state_.consumed_samples},
                     {"lm_loss", mean_loss},            {"lr", step.lr},
                     {"grad_norm", step.grad_norm},     {"tokens_per_sec", tps},
                     {"tflops", tflops},                {"mfu", mfu},
                     {"mfu_ceiling", mfu_ceiling},
                     {"step_time_ms", 1e3 * interval_time_ / interval_steps_},
                     {"peak_memory_bytes", peak},       {"restarts", watch_->restarts()},
                     {"memory_allocated_bytes", mem.in_use}, {"memory_reserved_bytes", mem.in_use + mem.cached},
                     {"memory_parameters_bytes", param_bytes},
                     {"memory_gradients_bytes", grad_bytes},
                     {"memory_optimizer_bytes", optim_bytes},
                     {"memory_activations_bytes", activation_bytes},
                     {"skipped_iterations", watch_->skipped_iterations()}};
  if (layout_.schedule) log_pipeline(row);
  if (!mtp_losses_.empty()) {  // of the interval's last iteration
    std::string line;
    for (size_t k = 0; k < mtp_losses_.size(); ++k) {
      line += fmt::format("{}mtp_{} loss: {:.6E}", k ? " | " : "", k + 1, mtp_losses_[k]);
      row[fmt::format("mtp_{}_loss", k + 1)] = mtp_losses_[k];
    }
    log::info(" {}", line);
  }
  if (dpo_) {  // the interval's pairs
    log::info(" dpo | {}", dpo_interval_.describe());
    dpo_interval_.to_metrics(row, "");
    dpo_interval_ = DpoStats();
  }
  if (moe_.any) {  // of the interval's last iteration
    log::info(" {}", describe_moe_step(moe_));
    add_moe_metrics(moe_, row);
  }
  if (rank0_) metrics_->write(row);
  interval_loss_ = interval_time_ = interval_attention_flops_ = 0;
  interval_steps_ = 0;
}

// Measured bubble: (slowest rank's wall - busiest rank's compute) / slowest wall. Predicted: the
// simulator on the same schedule with each stage's measured F, B and W times (pipeline/bubble.h).
void Trainer::log_pipeline(nlohmann::json& row) {
  const pipeline::BubbleMeter::Report b =
      bubble_.report(*layout_.schedule, layout_.stage_costs, *groups_.pp, interval_steps_);
  log::info(" pipeline {}: measured bubble {:.1f}% | simulated from measured F {:.2f} ms, B {:.2f} ms, "
            "W {:.2f} ms per stage (mean): {:.1f}%",
            layout_.schedule->algorithm, 100 * b.measured, 1e3 * b.mean.forward, 1e3 * b.mean.backward,
            1e3 * b.mean.weight, 100 * b.simulated);
  row["pipeline_bubble_measured"] = b.measured;
  row["pipeline_bubble_simulated"] = b.simulated;
  const PipelineMemoryMeter::Report m = pipeline_memory_->report(*groups_.pp);
  std::string measured, simulated;
  for (size_t r = 0; r < m.measured.size(); ++r) {
    measured += fmt::format("{}{:.2f}", r ? " " : "", m.measured[r] / 1048576.0);
    simulated += fmt::format("{}{:.2f}", r ? " " : "", m.simulated[r] / 1048576.0);
  }
  log::info(" pipeline activations held between passes per rank (MiB): {} | simulated (M_W / M_B {:.3g}): {}",
            measured, layout_.activation_after_b, simulated);
  row["pipeline_activation_bytes"] = m.measured;
  row["pipeline_activation_simulated_bytes"] = m.simulated;
  row["pipeline_activation_after_b"] = layout_.activation_after_b;
}

// =============================================================================================
// loop

TrainSummary Trainer::run() {
  while (state_.iteration < a_.train_iters) {
    const StepResult step = train_step();
    if (summary_.iterations == 0) summary_.first_loss = step.loss;
    summary_.iterations = state_.iteration;
    summary_.last_loss = step.loss;
    interval_loss_ += step.loss;
    dpo_interval_ += dpo_step_;
    interval_time_ += step.seconds;
    interval_attention_flops_ += step.attention_flops;
    interval_steps_ += 1;
    watch_->end_step(state_.iteration, step.loss, step.grad_norm, step.seconds, step.compute_seconds);
    if (tty_)
      fmt::print("\r{} {}/{} loss {:.4f}\033[K", progress_bar(state_.iteration, a_.train_iters), state_.iteration,
                 a_.train_iters, step.loss);
    if (state_.iteration % a_.log_interval == 0 || state_.iteration == a_.train_iters) log_interval(step);
    if (a_.eval_interval > 0 && a_.eval_iters > 0 && state_.iteration % a_.eval_interval == 0 && !valid_src_.empty()) {
      watch_->phase("eval", state_.iteration);
      summary_.last_eval_loss = evaluate();
      log::info(" validation at iteration {} | lm loss: {:.6E} | lm loss PPL: {:.3f}{}", state_.iteration,
                summary_.last_eval_loss, std::exp(summary_.last_eval_loss),
                dpo_ ? " | " + dpo_eval_.describe() : std::string());
      nlohmann::json row{{"iteration", state_.iteration},
                         {"consumed_samples", state_.consumed_samples},
                         {"eval_lm_loss", summary_.last_eval_loss}};
      if (dpo_) dpo_eval_.to_metrics(row, "eval_");
      if (rank0_) metrics_->write(row);
    }
    if (a_.save_interval > 0 && state_.iteration % a_.save_interval == 0)
      save();
    else
      saves_->poll();  // an async save whose writes are done is published
    if (early_exit_->due(*world_)) {  // the checkpoint below, then exit code 0
      log::info("exiting after iteration {}: {}", state_.iteration, early_exit_->reason());
      break;
    }
  }
  if (state_.iteration > summary_.start_iteration && (a_.save_interval == 0 || state_.iteration % a_.save_interval != 0))
    save();
  saves_->wait();
  summary_.last_checkpoint = saves_->last_checkpoint();
  if (rank0_) metrics_->flush();
  watch_->finish(state_.iteration);
  log::flush();
  return summary_;
}

}  // namespace

TrainSummary pretrain(const config::ExperimentConfig& cfg, const StartingAdapters& adapters) {
  return Trainer(cfg, adapters).run();
}

}  // namespace primus::train
