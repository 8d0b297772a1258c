// The trainer, in the phases a run goes through (torchtitan's Trainer has the same shape):
//
//   build      processes and the parallel layout, data, the model (this rank's part of it, on
//              the chosen backend and precision), gradient reduction, the optimizer, resume
//   step       every microbatch's forward and backward (one process, or the pipeline schedule),
//              gradient reduction over dp, the norm and clipping, the optimizer
//   evaluate   the validation loss
//   save       a checkpoint of this rank's part
//   loop       steps, logging, evaluation and saves up to train_iters
//
// A feature adds to a phase (a new gradient reduction to build and step, a new layout to build),
// not a branch through all of them: the model is one (model/llama.h) for every precision, device
// and layout.
#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "model/context_parallel.h"
#include "model/llama.h"
#include "model/moe.h"
#include "optim/flat_adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "parallel/data_parallel.h"
#include "parallel/distributed_optimizer.h"
#include "parallel/mesh.h"
#include "parallel/mpi_process_group.h"
#include "parallel/self_process_group.h"
#include "pipeline/executor.h"
#include "pipeline/simulator.h"
#include "plan/memory_estimate.h"
#include "plan/parallel_layout.h"
#include "safe/metrics_writer.h"
#include "train/expert_grads.h"
#include "train/moe_step.h"
#include "safe/run_lock.h"
#include "safe/train_watch.h"
#include "trace/hardware.h"
#include "trace/pass_spans.h"
#include "trace/profiler.h"
#include "trace/traced_group.h"
#include "train/checkpoint.h"
#include "train/compute.h"
#include "train/run_check.h"
#include "train/pipeline_runner.h"
#include "train/sharded_weights.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace primus::train {
namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Samples of seq_length + 1 tokens: from the Megatron datasets, or random ("mock_data").
struct SampleSource {
  std::shared_ptr<data::SampleDataset> dataset;
  int64_t mock_vocab = 0, seq = 0;
  uint64_t mock_seed = 0;
  int32_t eod_mask = -1;  // eod_mask_loss: no loss where the input token is this id

  bool empty() const { return !dataset && mock_vocab == 0; }
  std::vector<int32_t> get(int64_t i) const {
    if (dataset) return dataset->get(i % dataset->size());
    std::vector<int32_t> s(seq + 1);
    const Rng rng(mock_seed);
    for (int64_t j = 0; j <= seq; ++j) s[j] = int32_t(rng.at(uint64_t(i) * uint64_t(seq + 1) + j) % mock_vocab);
    return s;
  }
};

// Fills tokens/targets [mbs, seq] from samples first .. first+mbs-1.
void fill_microbatch(const SampleSource& src, int64_t first, int64_t mbs, int64_t seq, std::vector<int32_t>& tokens,
                     std::vector<int32_t>& targets) {
  tokens.resize(mbs * seq);
  targets.resize(mbs * seq);
  for (int64_t b = 0; b < mbs; ++b) {
    std::vector<int32_t> s = src.get(first + b);
    if (int64_t(s.size()) != seq + 1) fail("dataset sample {} has {} tokens, expected {}", first + b, s.size(), seq + 1);
    std::copy(s.begin(), s.end() - 1, tokens.begin() + b * seq);
    std::copy(s.begin() + 1, s.end(), targets.begin() + b * seq);
  }
  if (src.eod_mask >= 0)  // a negative target is left out of the loss
    for (int64_t i = 0; i < mbs * seq; ++i)
      if (tokens[i] == src.eod_mask) targets[i] = -1;
}

// A checkpoint must hold the model the config describes: same layers and sizes.
void check_same_model(const std::string& dir, const ModelSpec& spec) {
  const YAML::Node cfg = YAML::Load(read_checkpoint_config(dir));
  const YAML::Node node = cfg["modules"] && cfg["modules"]["pre_trainer"] ? cfg["modules"]["pre_trainer"]["model_spec"]
                                                                           : YAML::Node();
  if (!node) fail("{}/config.yaml has no modules.pre_trainer.model_spec", dir);
  const ModelSpec saved = model_spec_from_yaml(node, dir + "/config.yaml");
  auto same = [&](const char* key, auto a, auto b) {
    if (a != b) fail("checkpoint {} holds a model with {} {}, the config's model has {}", dir, key, a, b);
  };
  same("num_layers", saved.num_layers, spec.num_layers);
  same("hidden_size", saved.hidden_size, spec.hidden_size);
  same("ffn_hidden_size", saved.ffn_hidden_size, spec.ffn_hidden_size);
  same("num_attention_heads", saved.num_attention_heads, spec.num_attention_heads);
  same("num_query_groups", saved.query_groups(), spec.query_groups());
  same("kv_channels", saved.head_dim(), spec.head_dim());
  same("vocab_size", saved.vocab_size, spec.vocab_size);
  same("untie_embeddings_and_output_weights", saved.untie_embeddings_and_output_weights,
       spec.untie_embeddings_and_output_weights);
  same("add_qkv_bias", saved.add_qkv_bias, spec.add_qkv_bias);
}

std::string progress_bar(int64_t done, int64_t total, int width = 30) {
  const int filled = int(width * done / std::max<int64_t>(total, 1));
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

// Microbatch j of this dp rank in a step is the global batch's microbatch dp * m_local + j; under
// context parallelism this rank keeps its two chunks of each sequence (context_parallel_rows).
MicrobatchFill fill_from(const SampleSource& src, int64_t first_sample, int64_t dp_rank, int64_t m_local, int64_t mbs,
                         int64_t seq, int cp = 1, int cp_rank = 0) {
  return [&src, first_sample, dp_rank, m_local, mbs, seq, cp, cp_rank](int j, std::vector<int32_t>& tk,
                                                                     std::vector<int32_t>& tg) {
    fill_microbatch(src, first_sample + (dp_rank * m_local + j) * mbs, mbs, seq, tk, tg);
    if (cp > 1) {
      tk = context_parallel_rows(tk.data(), mbs, seq, cp, cp_rank);
      tg = context_parallel_rows(tg.data(), mbs, seq, cp, cp_rank);
    }
  };
}

// Pipeline timing over a log interval: wall and wait per rank, mean F/B/W per chunk op.
struct PipelineTimes {
  double wall = 0, wait = 0, f = 0, b = 0, w = 0;
  void add(const pipeline::ExecutorStats& s) {
    wall += s.wall_s;
    wait += s.wait_s;
    f += s.mean_f_s;
    b += s.mean_b_s;
    w += s.mean_w_s;
  }
};

// The simulator's costs from what the pipeline ranks measured: each rank's mean F, B and W time
// per chunk op, shared over the pipeline group, and split between a rank's chunks (vpp > 1) in
// proportion to their modelled work (ParallelLayout::stage_costs) when the stages are unequal.
// The runner runs an overlapped pair's two passes one after the other: pair_overlap 0.
pipeline::Costs measured_stage_costs(const plan::ParallelLayout& layout, parallel::ProcessGroup& pp, double f, double b,
                                     double w) {
  std::vector<double> per_rank(size_t(3 * layout.pp), 0.0);
  per_rank[3 * pp.rank()] = f;
  per_rank[3 * pp.rank() + 1] = b;
  per_rank[3 * pp.rank() + 2] = w;
  pp.all_reduce(per_rank);
  const pipeline::Schedule& s = *layout.schedule;
  const int stages = layout.pp * layout.vpp;
  pipeline::Costs c;
  c.pair_overlap = 0;
  c.stages.resize(size_t(stages));
  for (int st = 0; st < stages; ++st) {
    const int r = s.rank_of_stage(st);
    // This stage's share of its rank's mean op: 1 with equal stages.
    pipeline::StageCost share{1, 1, 1};
    if (int(layout.stage_costs.size()) == stages) {
      pipeline::StageCost mean{0, 0, 0};
      for (int c2 = 0; c2 < layout.vpp; ++c2) {
        const auto& o = layout.stage_costs[size_t(s.stage_of(r, c2))];
        mean.forward += o.forward / layout.vpp;
        mean.backward += o.backward / layout.vpp;
        mean.weight += o.weight / layout.vpp;
      }
      const auto& mine = layout.stage_costs[size_t(st)];
      share = {mine.forward / mean.forward, mine.backward / mean.backward, mine.weight / mean.weight};
    }
    c.stages[size_t(st)] = {per_rank[3 * r] * share.forward, per_rank[3 * r + 1] * share.backward,
                            per_rank[3 * r + 2] * share.weight};
  }
  return c;
}

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0, compute_seconds = 0;
};

class Trainer {
 public:
  explicit Trainer(const config::ExperimentConfig& cfg);
  TrainSummary run();

 private:
  // ---- build ----
  void on_rank0_for_all(const std::function<void()>& check, const char* elsewhere);
  void build_processes();
  void build_profiler();
  void build_data();
  void build_model();
  void build_gradient_reduction();
  void build_optimizer();
  AdamWOptions adam_options() const { return {a_.adam_beta1, a_.adam_beta2, a_.adam_eps, a_.weight_decay}; }
  // Where the dp gradients are summed and the ZeRO shards span: dp, or dp x cp under context parallel.
  parallel::ProcessGroup& gradient_group() const { return layout_.cp > 1 ? *groups_.dp_cp : *groups_.dp; }
  void resume();
  // weights_only: the values alone (finetune, pretrained_checkpoint); iteration, data position and
  // optimizer start fresh.
  std::string try_restore(const std::string& dir, bool weights_only = false);
  void open_outputs();
  // ---- step ----
  StepResult train_step();
  double forward_backward(const MicrobatchFill& fill);
  void reduce_gradients();
  double gradient_norm();
  void optimizer_step(double lr, double grad_scale);
  // ---- evaluate, save, log ----
  double evaluate();
  void save();
  void log_interval(const StepResult& step);

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

  // Data.
  SampleSource train_src_, valid_src_;

  // The model and its gradient reduction.
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<parallel::ProcessGroup> embedding_group_;
  int tied_tensor_ = -1;              // this rank's copy of a tied embedding split over stages
  std::vector<int> counted_tensors_;  // the tensors the global gradient norm counts on this rank
  std::vector<int> expert_tensors_;   // expert parallel: this rank's experts (counted apart)
  std::unique_ptr<parallel::GradBuckets> buckets_;
  std::vector<int> w_done_, w_expected_;  // per tensor: W passes seen this step, and expected
  std::unique_ptr<ExpertGradients> experts_;  // expert parallel: the experts' reduction over edp (x cp)

  // Optimizer: AdamW replicated on every dp rank, ZeRO-1's shards, or (ZeRO-2 and ZeRO-3 / FSDP)
  // the rank's shards of weights, gradients and moments, which also serve the model its weights.
  std::unique_ptr<FlatAdamW> replicated_;
  std::unique_ptr<parallel::DistributedOptimizer> sharded_;
  std::unique_ptr<ShardedWeights> sharded_weights_;
  std::unique_ptr<LRSchedule> lr_schedule_;

  // Run state and outputs.
  TrainState state_;
  TrainSummary summary_;
  std::unique_ptr<safe::TrainWatch> watch_;
  std::string config_yaml_;
  safe::RunLock run_lock_;                        // world rank 0: the run folder's lock (or its launcher's)
  std::unique_ptr<safe::MetricsWriter> metrics_;  // rank 0
  MoeStepSummary moe_;                             // the last step's MoE statistics
  ModelStats stats_;
  double peak_gflops_ = 0;
  bool mfu_warned_ = false;
  bool tty_ = false;
  double interval_loss_ = 0, interval_time_ = 0;
  int64_t interval_steps_ = 0;
  PipelineTimes pipe_;
};

// =============================================================================================
// build

Trainer::Trainer(const config::ExperimentConfig& cfg)
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
  build_gradient_reduction();
  build_optimizer();
  resume();
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
  m_local_ = layout_.microbatches_per_rank;
  seq_local_ = seq_ / layout_.cp;
  // One run per run folder: rank 0 holds the lock (or joins its launcher's); every rank stops if
  // another run has it.
  on_rank0_for_all([&] { run_lock_ = safe::RunLock::acquire_or_join(cfg_.run_dir(), "trainer rank 0"); },
                   "rank 0 could not take the run folder's lock");
  // A model that cannot fit stops here, before anything is allocated.
  // (The ranks of a host share its memory; each rank has a GPU of its own.)
  plan::check_memory(plan::estimate_memory(spec_, layout_, a_, compute_.precision == Precision::Bf16),
               compute_.device == Device::CUDA ? 1 : env.local_world_size, compute_.memory_available(),
               compute_.memory_name());
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
  if (!a_.tokenizer_type.empty()) {
    auto tok = data::build_tokenizer({a_.tokenizer_type, a_.tokenizer_model});
    if (tok->vocab_size() > spec_.vocab_size)
      fail("tokenizer {} has {} tokens but the model's vocab_size is {}", a_.tokenizer_model, tok->vocab_size(),
           spec_.vocab_size);
    eod = tok->eod();
  } else if (a_.mock_data) {
    eod = int32_t(spec_.vocab_size - 1);  // mock data without a tokenizer: the last id stands for eod
  }
  if (a_.eod_mask_loss && eod < 0)
    fail("eod_mask_loss needs tokenizer_type (and tokenizer_model) to know the end-of-document token");
  const int32_t eod_mask = a_.eod_mask_loss ? eod : -1;
  const int64_t evals = a_.eval_interval > 0 ? a_.train_iters / a_.eval_interval + 1 : 0;
  if (a_.mock_data) {
    train_src_ = {nullptr, spec_.vocab_size, seq_, uint64_t(a_.seed) * 2 + 1, eod_mask};
    valid_src_ = {nullptr, spec_.vocab_size, seq_, uint64_t(a_.seed) * 2 + 2, eod_mask};
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
  if (!ds.valid && a_.eval_interval > 0 && a_.eval_iters > 0)
    log::warn("split {} leaves no validation documents: evaluation is off", a_.split);
}

// This rank's part of the model: its tensor-parallel shard of its pipeline chunks.
void Trainer::build_model() {
  LlamaOptions mopt;
  mopt.recompute = parse_recompute(a_.recompute_granularity);
  ModelPartition part;
  part.tp_size = layout_.tp;
  part.tp_group = groups_.tp.get();
  part.sequence_parallel = layout_.sequence_parallel;
  part.cp_size = layout_.cp;
  part.cp_rank = me_.cp;
  part.cp_group = groups_.cp.get();
  part.cp_comm = layout_.cp_all_to_all ? CpComm::A2A : CpComm::P2P;
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
  // ZeRO-2 and FSDP: the model holds no weights of its own; the rank's shards serve them.
  mopt.resident_weights = !layout_.shard_gradients();
  model_ = std::make_unique<LlamaModel>(spec_, *compute_.backend, compute_.precision, mopt, part);
  if (layout_.shard_gradients()) {
    sharded_weights_ = std::make_unique<ShardedWeights>(
        *model_, gradient_group(), layout_.ep > 1 ? groups_.edp_cp.get() : nullptr,
        layout_.shard_parameters() ? ShardedStage::OptimGradsParams : ShardedStage::OptimGrads, adam_options());
    model_->set_weight_source(sharded_weights_.get());
    sharded_weights_->init_weights(uint64_t(a_.seed));
    return;  // (the profiler's per-module weight memory needs resident weights)
  }
  model_->init_weights(uint64_t(a_.seed));
  if (profiler_) profiler_->set_parameters(model_->params(), model_->working_weights());
}

// Data-parallel gradient buckets (started as the W passes finish), the tied embedding's group
// across the first and last pipeline stages, and which tensors the gradient norm counts here.
void Trainer::build_gradient_reduction() {
  ParamStore& params = model_->params();
  const int num_tensors = int(params.infos().size());
  // A tied embedding split over pipeline stages lives on the first and the last stage: their
  // gradients are summed (Megatron's embedding group) before data parallelism reduces them.
  if (!spec_.untie_embeddings_and_output_weights && layout_.schedule) {
    const int last = layout_.schedule->rank_of_stage(layout_.pp * layout_.vpp - 1);
    if (last != 0) {
      embedding_group_ = groups_.pp->new_group({0, last}, "embedding");
      if (embedding_group_)
        tied_tensor_ = model_->embedding_param() >= 0 ? model_->embedding_param() : model_->output_param();
    }
  }
  if (layout_.ep > 1 && !sharded_weights_)  // (ZeRO-2 / FSDP shard the experts over edp x cp themselves)
    experts_ = std::make_unique<ExpertGradients>(
        params, *groups_.edp_cp, layout_.shard_optimizer(), adam_options());
  // The norm counts each tensor of the whole model once: tp-replicated tensors on tp rank 0, the
  // tied embedding on the first stage (expert-parallel experts apart: gradient_norm()).
  for (int t = 0; t < num_tensors; ++t) {
    if (layout_.ep > 1 && is_expert_param(params.infos()[size_t(t)].name)) {
      expert_tensors_.push_back(t);
      continue;
    }
    if (params.infos()[t].tp_replicated && me_.tp != 0) continue;
    if (t == tied_tensor_ && model_->embedding_param() < 0) continue;
    counted_tensors_.push_back(t);
  }
  if (sharded_weights_) {  // ZeRO-2 / FSDP reduce-scatter each unit as its W passes finish
    model_->set_weight_grad_hook([this](const std::vector<int>& ids) { sharded_weights_->weights_done(ids); });
    return;
  }
  parallel::GradBucketsOptions bo;
  bo.bucket_size = a_.ddp_bucket_size > 0 ? a_.ddp_bucket_size : parallel::default_bucket_size(layout_.dp);
  bo.overlap_grad_reduce = a_.overlap_grad_reduce;
  bo.reduce = layout_.shard_optimizer() ? parallel::GradReduce::ReduceScatter : parallel::GradReduce::AllReduce;
  // Under context parallelism each cp rank holds a part of every gradient (its chunks' share):
  // the buckets sum over dp x cp (Megatron's data-parallel group with context parallel).
  buckets_ = std::make_unique<parallel::GradBuckets>(gradient_group(), params.grads().data<float>(), params.numel(),
                                                     segments_of(params), bo);
  // Each tensor's bucket may start once the last microbatch's W pass of it is done.
  w_done_.assign(num_tensors, 0);
  w_expected_.resize(num_tensors);
  for (int t = 0; t < num_tensors; ++t) w_expected_[t] = int(m_local_) * model_->weight_grad_passes(t);
  model_->set_weight_grad_hook([this](const std::vector<int>& ids) {
    for (int t : ids)
      if (++w_done_[t] == w_expected_[t] && t != tied_tensor_) {
        if (experts_ && experts_->is_expert(t)) experts_->keep(t);
        buckets_->mark_ready(t);
      }
  });
}

void Trainer::build_optimizer() {
  const AdamWOptions adam = adam_options();
  ParamStore& params = model_->params();
  lr_schedule_ = std::make_unique<LRSchedule>(lr_schedule_options(a_));
  if (sharded_weights_) return;  // its own AdamW over the rank's shards
  if (layout_.shard_optimizer())
    sharded_ = std::make_unique<parallel::DistributedOptimizer>(*buckets_, params.values().data<float>(), adam);
  else
    replicated_ = std::make_unique<FlatAdamW>(adam, segments_of(params), params.numel(), compute_.device);
}

// Every rank reads its own part; a checkpoint counts only if all ranks could read theirs.
std::string Trainer::try_restore(const std::string& dir, bool weights_only) {
  ParamStore& params = model_->params();
  std::string problem;
  CheckpointData ck;
  try {
    check_same_model(dir, spec_);  // a rank loads only its tensors, so it cannot see missing layers
    LoadOptions lo;
    lo.optimizer = !weights_only;
    ck = load_checkpoint(dir, params, lo);
  } catch (const Error& e) {
    problem = e.what();
  }
  if (world_->all_reduce_value(int32_t(problem.empty() ? 0 : 1)) != 0)
    return problem.empty() ? "another rank could not read its part" : problem;
  if (sharded_weights_) {
    sharded_weights_->load_values(ck.params.data());
  } else {
    Tensor loaded = Tensor::empty({params.numel()});
    std::copy(ck.params.begin(), ck.params.end(), loaded.data<float>());
    Tensor values = params.values();  // a handle on the store's buffer (on the GPU for a device store)
    values.copy_from(loaded);
    model_->sync_working_weights();
  }
  if (weights_only) {
    log::info("starting from the weights of {} (iteration 0, fresh optimizer)", dir);
    return "";
  }
  if (sharded_weights_)
    sharded_weights_->load_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data());
  if (sharded_)
    sharded_->load_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data(), int64_t(ck.exp_avg.size()));
  if (sharded_ && experts_) experts_->load_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data());
  if (replicated_)
    replicated_->set_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data());
  state_ = ck.state;
  log::info("resumed from {} at iteration {} ({} samples consumed)", dir, state_.iteration, state_.consumed_samples);
  return "";
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
    if (a_.auto_resume) {
      for (const std::string& dir : list_checkpoints(cfg_.checkpoint_dir())) {
        const std::string problem = try_restore(dir);
        if (problem.empty()) {
          resumed = true;
          break;
        }
        log::warn("skipping checkpoint {}: {}", dir, problem);
      }
    }
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

void Trainer::open_outputs() {
  stats_ = model_stats(spec_, seq_);
  // MFU's denominator: the backend's peak (on the CPU one rank's measured SGEMM peak: ranks measure
  // one at a time, rank 0's number is used; on a GPU the data sheet's dense bf16 peak), times the
  // ranks.
  double peak = rank0_ ? compute_.backend->peak_tflops() * 1e3 : 0.0;
  peak_gflops_ = world_->all_reduce_value(peak) * world_->size();
  if (profiler_) profiler_->info().peak_tflops = peak_gflops_ / world_->size() / 1e3;
  config_yaml_ = cfg_.resolved_yaml();
  if (rank0_) {
    std::ofstream(fs::path(cfg_.run_dir()) / "config.yaml") << config_yaml_;
    write_resolved_config(config_yaml_);  // into the launch snapshot, when primus-cli made one
    metrics_ = std::make_unique<safe::MetricsWriter>((fs::path(cfg_.run_dir()) / "metrics.jsonl").string());
  }
  tty_ = ::isatty(STDOUT_FILENO) && rank0_;
  log::info("model {}: {:.2f}M parameters, {:.1f} MFLOP per token; {} x {} tokens per microbatch, {} microbatches "
            "per step",
            cfg_.model, stats_.parameters / 1e6, stats_.flops_per_token / 1e6, mbs_, seq_, num_micro_);
  log::info("parallel layout: {}; this rank: tp {} cp {} pp {} dp {}, {:.2f}M parameters", layout_.describe(), me_.tp,
            me_.cp, me_.pp, me_.dp, model_->params().numel() / 1e6);
  log::info("compute: {}", compute_.describe());
  if (rank0_ && !cfg_.no_effect.empty()) log::info("{}", config::no_effect_summary(cfg_));
  log::info("training iterations {} to {}; MFU against a peak of {:.1f} GFLOP/s ({})", state_.iteration + 1,
            a_.train_iters, peak_gflops_,
            compute_.device == Device::CUDA ? "data-sheet dense bf16" : "measured SGEMM");
  summary_.start_iteration = state_.iteration;
  watch_ = std::make_unique<safe::TrainWatch>(cfg_.run_dir(), state_.iteration);  // heartbeats, NaN policy, faults
}

// =============================================================================================
// step

// Every microbatch of this rank, forward and backward: through the pipeline schedule when the
// model is split in stages, else one after the other. The W passes mark gradient buckets ready,
// which starts their reduction while the backward goes on. Returns the loss summed over the
// microbatches whose loss this rank computed.
double Trainer::forward_backward(const MicrobatchFill& fill) {
  const double dloss = 1.0 / double(num_micro_);
  if (layout_.schedule) {
    LlamaStageRunner runner(*model_, mbs_, seq_local_, dloss, fill);
    trace::PassSpans passes(runner, profiler_.get());  // F / B / W spans when profiling
    pipe_.add(pipeline::run_schedule(*layout_.schedule, passes, *groups_.pp));
    return runner.loss_sum();
  }
  double loss_sum = 0;
  std::vector<int32_t> tokens, targets;
  for (int j = 0; j < m_local_; ++j) {
    fill(j, tokens, targets);
    LlamaContext ctx;
    {
      trace::PassSpan f(profiler_.get(), trace::Pass::F, j, -1);
      loss_sum += model_->forward(ctx, tokens.data(), targets.data(), mbs_, seq_local_);
    }
    trace::PassSpan bw(profiler_.get(), trace::Pass::B, j, -1, /*fused_bw=*/true);
    model_->backward(ctx, dloss);
  }
  return loss_sum;
}

// After the backward: the tied embedding summed over its two stages, the dp buckets finished,
// and under sequence parallelism the norm weights' gradients summed over tp (each tp rank's cover
// its rows only; the two sums commute, and tp peers share the dp shard layout under ZeRO).
void Trainer::reduce_gradients() {
  trace::Span span(profiler_.get(), trace::Category::Annotation, "reduce_gradients");
  ParamStore& params = model_->params();
  // A tensor's gradient here: whole, or (ZeRO-2 / FSDP) this rank's piece of it, which is the same
  // piece on its tp peers and on the other stage of a tied embedding (same shapes, same dp rank).
  auto sum_over = [&](parallel::ProcessGroup& g, int t) {
    const Tensor grad = sharded_weights_ ? sharded_weights_->grad_piece(t) : params.grad_tensor(t);
    if (grad.numel() > 0) g.all_reduce(grad.raw(), grad.numel(), parallel::CommType::F32, parallel::ReduceOp::Sum);
  };
  if (sharded_weights_) {
    sharded_weights_->finish_gradients();
    if (embedding_group_) sum_over(*embedding_group_, tied_tensor_);
  } else {
    if (embedding_group_) {
      sum_over(*embedding_group_, tied_tensor_);
      buckets_->mark_ready(tied_tensor_);
    }
    buckets_->finish();
  }
  if (experts_) experts_->reduce();
  // Sequence parallel: every replicated tensor saw only this rank's rows; without it, only those
  // whose gradient covers this rank's heads (QK norms).
  if (layout_.tp > 1)
    for (size_t t = 0; t < params.infos().size(); ++t)
      if (layout_.sequence_parallel ? params.infos()[t].tp_replicated : params.infos()[t].tp_partial_grads)
        sum_over(*groups_.tp, int(t));
}

// The global L2 norm of the gradients, the same on every rank.
double Trainer::gradient_norm() {
  trace::Region region(profiler_.get(), "gradient_norm");
  // Under expert parallelism each expert is on one rank of ep x pp, and either whole on each tp
  // rank (counted on tp rank 0) or split over tp (expert_tensor_parallel_size > 1).
  const bool counts_experts = me_.tp == 0 || layout_.etp > 1;
  const double experts =
      experts_ ? groups_.mp->all_reduce_value(groups_.ep->all_reduce_value(
                     counts_experts ? experts_->grad_sq_sum(replicated_.get()) : 0.0))
               : 0.0;
  if (sharded_weights_) {  // each element of a tensor is on one rank of its shards' group
    const double dense = gradient_group().all_reduce_value(sharded_weights_->grad_sq_sum(counted_tensors_));
    const double experts =
        expert_tensors_.empty()
            ? 0.0
            : groups_.ep->all_reduce_value(
                  groups_.edp_cp->all_reduce_value(counts_experts ? sharded_weights_->grad_sq_sum(expert_tensors_) : 0.0));
    return std::sqrt(groups_.mp->all_reduce_value(dense + experts));
  }
  if (sharded_) {
    const std::vector<int>& counted = counted_tensors_;
    const double dense = sharded_->grad_norm(groups_.mp.get(), [&counted](int t) {
      return std::binary_search(counted.begin(), counted.end(), t);
    });
    return experts_ ? std::sqrt(dense * dense + experts) : dense;
  }
  return std::sqrt(
      groups_.mp->all_reduce_value(replicated_->grad_sq_sum(model_->params().grads(), counted_tensors_)) + experts);
}

// AdamW with the clipping factor folded in; the model's working weights follow the master.
void Trainer::optimizer_step(double lr, double grad_scale) {
  trace::Region region(profiler_.get(), "optimizer_step");
  ParamStore& params = model_->params();
  if (sharded_weights_) {
    sharded_weights_->step(lr, grad_scale);
  } else if (sharded_) {
    if (experts_) experts_->save_values();
    sharded_->step(lr, grad_scale);
    if (experts_) experts_->step(lr, grad_scale);  // the experts are not the dp shards'
    model_->sync_working_weights();
  } else {
    Tensor* working = model_->has_separate_working_weights() ? &model_->working_weights() : nullptr;
    replicated_->step(params.values(), params.grads(), working, lr, grad_scale);
  }
  compute_.backend->synchronize();
}

StepResult Trainer::train_step() {
  const auto t0 = Clock::now();
  StepResult r;
  if (profiler_) profiler_->step_begin(state_.iteration + 1);
  watch_->begin_step(state_.iteration + 1);
  if (sharded_weights_) {
    sharded_weights_->begin_step();
  } else {
    model_->params().zero_grad();
    buckets_->reset();
  }
  model_->reset_moe_stats();  // evaluation forwards do not count
  std::fill(w_done_.begin(), w_done_.end(), 0);
  double loss_sum = forward_backward(trace::in_host_span(
      profiler_.get(), "data_loading",
      fill_from(train_src_, state_.consumed_samples, me_.dp, m_local_, mbs_, seq_, layout_.cp, me_.cp)));
  compute_.backend->synchronize();  // compute time counts the device's work
  // This rank's own work; the reductions below wait for the slowest rank (stragglers show here).
  r.compute_seconds = seconds_since(t0);
  watch_->inject_faults(state_.iteration + 1,
                        sharded_weights_ ? sharded_weights_->grad_shards() : model_->params().grads());
  reduce_gradients();
  // Loss: the last stage's sum, over pipeline ranks and dp ranks (tp ranks agree).
  if (layout_.schedule) loss_sum = groups_.pp->all_reduce_value(loss_sum);
  r.loss = groups_.dp->all_reduce_value(loss_sum) / double(num_micro_);
  r.grad_norm = gradient_norm();
  const double clip_scale = a_.clip_grad > 0 ? clip_coefficient(r.grad_norm, a_.clip_grad) : 1.0;
  // loss and grad_norm are reduced over every rank, so every rank takes the same decision.
  const bool skip = watch_->check(state_.iteration + 1, r.loss, r.grad_norm) == safe::StepAction::Skip;
  r.lr = lr_schedule_->lr_at(state_.iteration);
  if (!skip) optimizer_step(r.lr, clip_scale);
  moe_ = finish_moe_step(*model_, *groups_.dp, m_local_, !skip,  // expert load, bias update
                         {layout_.sequence_parallel && layout_.etp == 1 ? groups_.tp.get() : nullptr,
                          layout_.cp > 1 ? groups_.cp.get() : nullptr});
  state_.iteration += 1;
  state_.consumed_samples += gbs_;
  state_.optimizer_step = sharded_weights_ ? sharded_weights_->step_count()
                          : sharded_         ? sharded_->step_count()
                                             : replicated_->step_count();
  r.seconds = seconds_since(t0);
  if (profiler_)
    if (const fs::path f = profiler_->step_end(state_.iteration); !f.empty()) log::info("profile: wrote {}", f.string());
  return r;
}

// =============================================================================================
// evaluate, save, log

double Trainer::evaluate() {
  trace::Span span(profiler_.get(), trace::Category::Annotation, "evaluate");
  double total = 0;
  std::vector<int32_t> tokens, targets;
  for (int64_t e = 0; e < a_.eval_iters; ++e) {
    const MicrobatchFill fill =
        fill_from(valid_src_, e * num_micro_ * mbs_, me_.dp, m_local_, mbs_, seq_, layout_.cp, me_.cp);
    if (layout_.schedule) {
      total += pipeline_forward_only(*model_, *layout_.schedule, *groups_.pp, mbs_, seq_local_, int(m_local_), fill);
      continue;
    }
    for (int j = 0; j < m_local_; ++j) {
      fill(j, tokens, targets);
      LlamaContext ctx;
      total += model_->forward(ctx, tokens.data(), targets.data(), mbs_, seq_local_);
    }
  }
  return groups_.dp->all_reduce_value(total) / double(a_.eval_iters * num_micro_);
}

void Trainer::save() {
  trace::Span span(profiler_.get(), trace::Category::Host, "checkpoint_save");
  watch_->before_save(state_.iteration);
  // The full optimizer state in this rank's layout (ZeRO gathers its shards over dp).
  parallel::FullOptimizerState full;
  // ZeRO-2 / FSDP: every rank of the gradient group gathers the full values and moments of its
  // tensor-parallel and pipeline layout (transient host copies) so that the usual writer saves them.
  std::optional<ParamStore> gathered;
  if (sharded_weights_) {
    full = sharded_weights_->gather_state();
    gathered.emplace(model_->params());
    gathered->allocate_values(Device::CPU);
    const std::vector<float> values = sharded_weights_->gather_values();
    std::copy(values.begin(), values.end(), gathered->values().data<float>());
  } else if (sharded_) {
    full = sharded_->gather_state();
    if (experts_) experts_->gather_state(full.exp_avg, full.exp_avg_sq);  // the experts' own, over edp
  } else {
    full.exp_avg = replicated_->exp_avg();  // host copies
    full.exp_avg_sq = replicated_->exp_avg_sq();
  }
  SaveOptions so;
  so.world = world_;
  // dp replicas hold the same tensors; under expert parallelism the ep ranks of edp 0 hold the experts.
  so.writer = me_.edp == 0 && me_.cp == 0;
  so.layout = {world_->size(), layout_.tp, layout_.pp, layout_.dp, layout_.cp, layout_.vpp};
  so.overwrite = a_.overwrite;
  summary_.last_checkpoint = save_checkpoint(cfg_.checkpoint_dir(), gathered ? *gathered : model_->params(),
                                             full.exp_avg.data(), full.exp_avg_sq.data(), state_, config_yaml_, so);
  if (rank0_) prune_checkpoints(cfg_.checkpoint_dir(), a_.keep_last_checkpoints, state_.run_id, summary_.last_checkpoint);
  world_->barrier();
  log::info("saved checkpoint {}", summary_.last_checkpoint);
}

void Trainer::log_interval(const StepResult& step) {
  const double tps = double(interval_steps_ * gbs_ * seq_) / interval_time_;
  const double tflops = stats_.flops_per_token * tps / 1e12;
  const double mfu = tflops * 1e3 / peak_gflops_;
  const double mean_loss = interval_loss_ / double(interval_steps_);
  const size_t peak = compute_.backend->memory_stats().peak;
  if (mfu > 1.0 && !mfu_warned_) {  // a CPU peak measured while other work held the cores
    log::warn("MFU above 100%: this run computes faster than the peak of {:.1f} GFLOP/s it divides by (on a CPU, "
              "a peak measured at start-up while other work held the cores); set PRIMUS_PEAK_GFLOPS to the "
              "machine's peak for a meaningful MFU",
              peak_gflops_);
    mfu_warned_ = true;
  }
  // The peak split: weights (master and bf16 working copy), fp32 gradients and AdamW moments are
  // what this rank's buffers hold; the rest of the peak is activations and transient buffers.
  const ParamStore& params = model_->params();
  double param_bytes = 0, grad_bytes = 0, optim_bytes = 0;
  if (sharded_weights_) {  // the rank's shards (and ZeRO-2's whole working copy); gathered units count as "the rest"
    param_bytes = double(sharded_weights_->parameter_bytes());
    grad_bytes = double(sharded_weights_->gradient_bytes());
    optim_bytes = double(sharded_weights_->optimizer_bytes());
  } else {
    param_bytes = double(params.numel()) * double(dtype_size(params.dtype())) +
                  (model_->has_separate_working_weights() ? double(model_->working_weights().nbytes()) : 0.0);
    grad_bytes = double(params.grads().nbytes());
    optim_bytes = sharded_ ? double(sharded_->state_bytes()) : 2.0 * double(params.numel()) * double(sizeof(float));
    if (sharded_ && experts_) optim_bytes += 2.0 * double(experts_->state_numel()) * double(sizeof(float));
  }
  const double activation_bytes = std::max(0.0, double(peak) - param_bytes - grad_bytes - optim_bytes);
  if (tty_) fmt::print("\r\033[K");
  log::info(" iteration {:>6}/{:>6} | consumed samples: {:>9} | elapsed time per iteration (ms): {:.1f} | "
            "learning rate: {:.3E} | global batch size: {} | lm loss: {:.6E} | grad norm: {:.3f} | "
            "tokens/s: {:.0f} | TFLOP/s: {:.3f} | MFU: {:.1f}% | peak tensor memory: {:.0f} MiB (parameters {:.1f}, "
            "gradients {:.1f}, optimizer {:.1f}, activations and the rest {:.1f})",
            state_.iteration, a_.train_iters, state_.consumed_samples, 1e3 * interval_time_ / interval_steps_, step.lr,
            gbs_, mean_loss, step.grad_norm, tps, tflops, 100 * mfu, peak / 1048576.0, param_bytes / 1048576.0,
            grad_bytes / 1048576.0, optim_bytes / 1048576.0, activation_bytes / 1048576.0);
  nlohmann::json row{{"iteration", state_.iteration},   {"consumed_samples", state_.consumed_samples},
                     {"lm_loss", mean_loss},            {"lr", step.lr},
                     {"grad_norm", step.grad_norm},     {"tokens_per_sec", tps},
                     {"tflops", tflops},                {"mfu", mfu},
                     {"step_time_ms", 1e3 * interval_time_ / interval_steps_},
                     {"peak_memory_bytes", peak},       {"restarts", watch_->restarts()},
                     {"memory_parameters_bytes", param_bytes},
                     {"memory_gradients_bytes", grad_bytes},
                     {"memory_optimizer_bytes", optim_bytes},
                     {"memory_activations_bytes", activation_bytes},
                     {"skipped_iterations", watch_->skipped_iterations()}};
  if (layout_.schedule) {
    // Measured bubble: (slowest rank's wall - busiest rank's compute) / slowest wall. Predicted:
    // the simulator on the same schedule with each stage's measured F, B and W times.
    const double n = double(interval_steps_);
    auto& g = *groups_.pp;
    const double wall = g.all_reduce_value(pipe_.wall / n, parallel::ReduceOp::Max);
    const double busy = g.all_reduce_value((pipe_.wall - pipe_.wait) / n, parallel::ReduceOp::Max);
    const pipeline::Costs c = measured_stage_costs(layout_, g, pipe_.f / n, pipe_.b / n, pipe_.w / n);
    const double measured = wall > 0 ? (wall - busy) / wall : 0;
    const double predicted = pipeline::simulate(*layout_.schedule, c).bubble_rate;
    pipeline::StageCost mean{0, 0, 0};
    for (const auto& sc : c.stages) {
      mean.forward += sc.forward / double(c.stages.size());
      mean.backward += sc.backward / double(c.stages.size());
      mean.weight += sc.weight / double(c.stages.size());
    }
    log::info(" pipeline {}: measured bubble {:.1f}% | simulated from measured F {:.2f} ms, B {:.2f} ms, "
              "W {:.2f} ms per stage (mean): {:.1f}%",
              layout_.schedule->algorithm, 100 * measured, 1e3 * mean.forward, 1e3 * mean.backward,
              1e3 * mean.weight, 100 * predicted);
    row["pipeline_bubble_measured"] = measured;
    row["pipeline_bubble_simulated"] = predicted;
    pipe_ = PipelineTimes();
  }
  if (moe_.any) {  // of the interval's last iteration
    log::info(" {}", describe_moe_step(moe_));
    add_moe_metrics(moe_, row);
  }
  if (rank0_) metrics_->write(row);
  interval_loss_ = interval_time_ = 0;
  interval_steps_ = 0;
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
    interval_time_ += step.seconds;
    interval_steps_ += 1;
    watch_->end_step(state_.iteration, step.loss, step.grad_norm, step.seconds, step.compute_seconds);
    if (tty_)
      fmt::print("\r{} {}/{} loss {:.4f}\033[K", progress_bar(state_.iteration, a_.train_iters), state_.iteration,
                 a_.train_iters, step.loss);
    if (state_.iteration % a_.log_interval == 0 || state_.iteration == a_.train_iters) log_interval(step);
    if (a_.eval_interval > 0 && a_.eval_iters > 0 && state_.iteration % a_.eval_interval == 0 && !valid_src_.empty()) {
      watch_->phase("eval", state_.iteration);
      summary_.last_eval_loss = evaluate();
      log::info(" validation at iteration {} | lm loss: {:.6E} | lm loss PPL: {:.3f}", state_.iteration,
                summary_.last_eval_loss, std::exp(summary_.last_eval_loss));
      if (rank0_) metrics_->write({{"iteration", state_.iteration}, {"eval_lm_loss", summary_.last_eval_loss}});
    }
    if (a_.save_interval > 0 && state_.iteration % a_.save_interval == 0) save();
  }
  if (state_.iteration > summary_.start_iteration && (a_.save_interval == 0 || state_.iteration % a_.save_interval != 0))
    save();
  watch_->finish(state_.iteration);
  log::flush();
  return summary_;
}

}  // namespace

TrainSummary pretrain(const config::ExperimentConfig& cfg) { return Trainer(cfg).run(); }

}  // namespace primus::train
