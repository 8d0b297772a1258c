#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/rng.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "model/llama.h"
#include "model/llama_mixed.h"
#include "optim/adamw.h"
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
#include "safe/train_watch.h"
#include "train/checkpoint.h"
#include "train/run_check.h"
#include "train/compute.h"
#include "train/parallel_layout.h"
#include "train/pipeline_runner.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace primus::train {
namespace {

// Samples of seq_length + 1 tokens: from the Megatron datasets, or random ("mock_data").
struct SampleSource {
  std::shared_ptr<data::SampleDataset> dataset;
  int64_t mock_vocab = 0, seq = 0;
  uint64_t mock_seed = 0;

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

// The world group: MPI when this process is one of several ranks, else a group of one.
struct Processes {
  std::unique_ptr<parallel::SelfProcessGroup> self;
  parallel::ProcessGroup* world = nullptr;
};
Processes start_processes() {
  Processes p;
  const LaunchEnv env = discover_launch_env();
  if (env.world_size > 1) {
    parallel::init_mpi();
    p.world = &parallel::mpi_world();
    if (p.world->size() != env.world_size)
      fail("the launcher says {} ranks but MPI sees {}: start the ranks with mpirun or srun", env.world_size,
           p.world->size());
  } else {
    p.self = std::make_unique<parallel::SelfProcessGroup>();
    p.world = p.self.get();
  }
  return p;
}

// Optimizer over the flat buffers: one AdamW, ZeRO-1's shards (use_distributed_optimizer), or
// for bf16 mixed precision the device's FlatAdamW (which also refreshes the bf16 weights).
struct Optimizer {
  std::unique_ptr<AdamW> adam;
  std::unique_ptr<parallel::DistributedOptimizer> zero;
  std::unique_ptr<FlatAdamW> flat;
  int64_t step_count() const {
    return zero ? zero->step_count() : flat ? flat->step_count() : adam->step_count();
  }
};

// bf16 mixed precision holds the whole model in one process (MixedLlamaModel): data parallel
// layouts only, for now.
void check_mixed_layout(const ParallelLayout& layout, const config::TrainingArgs& a) {
  if (layout.tp > 1 || layout.pp > 1 || layout.cp > 1)
    fail("bf16 mixed precision trains data-parallel layouts only so far: tensor_model_parallel_size {}, "
         "pipeline_model_parallel_size {} and context_parallel_size {} need bf16: false (fp32 on the CPU)",
         layout.tp, layout.pp, layout.cp);
  if (a.use_distributed_optimizer)
    fail("use_distributed_optimizer is not built for bf16 mixed precision yet: set it to false");
}

std::string progress_bar(int64_t done, int64_t total, int width = 30) {
  const int filled = int(width * done / std::max<int64_t>(total, 1));
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

}  // namespace

TrainSummary pretrain(const config::ExperimentConfig& cfg) {
  const config::TrainingArgs& a = cfg.train;
  const ModelSpec& spec = cfg.model_spec;
  const int64_t mbs = a.micro_batch_size, gbs = a.global_batch_size, seq = a.seq_length;
  const int64_t num_micro = gbs / mbs;  // microbatches in the global batch, over all dp ranks

  // ---- set-up: everything that can fail on user input fails here, before step 1 -----------------
  cpu::flush_denormals_to_zero();
  Processes procs = start_processes();
  parallel::ProcessGroup& world = *procs.world;  // host values: agreements, barriers, checkpoints
  const ParallelLayout layout = plan_layout(a, spec, world.size());  // the same verdict on every rank
  Compute compute = choose_compute(a, discover_launch_env().local_rank);
  if (compute.mixed) check_mixed_layout(layout, a);
  // Gradients on a GPU are reduced by NCCL groups; on the CPU by the host world's (MPI) groups.
  const std::unique_ptr<parallel::ProcessGroup> gpu_world = device_world(compute, world);
  const parallel::RankMesh mesh(world.size(), layout.sizes());
  const parallel::MeshGroups groups = parallel::build_groups(mesh, gpu_world ? *gpu_world : world);
  const parallel::MeshCoord me = mesh.coord(world.rank());
  const bool rank0 = world.rank() == 0;
  const int64_t m_local = layout.microbatches_per_rank;
  fs::create_directories(cfg.run_dir());
  if (!a.tokenizer_type.empty()) {
    auto tok = data::build_tokenizer({a.tokenizer_type, a.tokenizer_model});
    if (tok->vocab_size() > spec.vocab_size)
      fail("tokenizer {} has {} tokens but the model's vocab_size is {}", a.tokenizer_model, tok->vocab_size(),
           spec.vocab_size);
  }
  SampleSource train_src, valid_src;
  const int64_t evals = a.eval_interval > 0 ? a.train_iters / a.eval_interval + 1 : 0;
  if (a.mock_data) {
    train_src = {nullptr, spec.vocab_size, seq, uint64_t(a.seed) * 2 + 1};
    valid_src = {nullptr, spec.vocab_size, seq, uint64_t(a.seed) * 2 + 2};
  } else {
    data::GPTDatasetConfig dc;
    dc.data_path = a.data_path;
    dc.split = a.split;
    dc.seq_length = seq;
    dc.seed = uint64_t(a.seed);
    dc.num_samples = {a.train_iters * gbs, evals * a.eval_iters * gbs, a.eval_iters * gbs};
    // Rank 0 builds the index caches first; the others then read them instead of racing to write.
    data::GPTDatasets ds;
    if (rank0) ds = data::build_gpt_datasets(dc);
    world.barrier();
    if (!rank0) ds = data::build_gpt_datasets(dc);
    if (!ds.train) fail("data_path {} gives no training documents with split {}", fmt::join(a.data_path, " "), a.split);
    train_src.dataset = ds.train;
    valid_src.dataset = ds.valid;
    if (!ds.valid && a.eval_interval > 0 && a.eval_iters > 0)
      log::warn("split {} leaves no validation documents: evaluation is off", a.split);
  }

  // ---- this rank's part of the model ---------------------------------------------------------------
  LlamaOptions mopt;
  mopt.recompute = parse_recompute(a.recompute_granularity);
  ModelPartition part;
  part.tp_size = layout.tp;
  part.tp_group = groups.tp.get();
  part.sequence_parallel = layout.sequence_parallel;
  const int num_stages = layout.pp * layout.vpp;
  if (layout.schedule)
    for (int c = 0; c < layout.vpp; ++c) {
      const int stage = layout.schedule->stage_of(me.pp, c);
      const pipeline::LayerRange r = layout.stages[stage];
      part.chunks.push_back({r.first_layer, r.num_layers, stage == 0, stage == num_stages - 1});
    }
  // fp32 on the CPU (every layout), or bf16 mixed precision on the compute's backend.
  std::unique_ptr<LlamaModel<float>> fp32_model;
  std::unique_ptr<MixedLlamaModel> mixed;
  if (compute.mixed) {
    MixedLlamaOptions mo;
    mo.recompute = mopt.recompute;
    mixed = std::make_unique<MixedLlamaModel>(spec, *compute.backend, mo);
    mixed->init_weights(uint64_t(a.seed));
  } else {
    fp32_model = std::make_unique<LlamaModel<float>>(spec, mopt, part);
    fp32_model->init_weights(uint64_t(a.seed));
  }
  ParamStore<float>& params = mixed ? mixed->params() : fp32_model->params();
  const std::vector<ParamSegment> segments = segments_of(params);
  const int num_tensors = int(params.infos().size());

  // A tied embedding split over pipeline stages lives on the first and the last stage: their
  // gradients are summed (Megatron's embedding group) before data parallelism reduces them.
  std::unique_ptr<parallel::ProcessGroup> embedding_group;
  int tied_tensor = -1;  // this rank's copy of it, when it is in that group
  if (!spec.untie_embeddings_and_output_weights && layout.schedule) {
    const int last = layout.schedule->rank_of_stage(num_stages - 1);
    if (last != 0) {
      embedding_group = groups.pp->new_group({0, last}, "embedding");
      if (embedding_group)
        tied_tensor = fp32_model->embedding_param() >= 0 ? fp32_model->embedding_param() : fp32_model->output_param();
    }
  }
  // The gradient norm counts each tensor of the whole model once: tp-replicated tensors on tp rank
  // 0, the tied embedding on the first stage.
  auto counted = [&](int t) {
    const StoredParam& p = params.infos()[t];
    if (p.tp_replicated && me.tp != 0) return false;
    return !(t == tied_tensor && fp32_model->embedding_param() < 0);
  };

  std::vector<int> counted_tensors;  // for the fused norm (FlatAdamW)
  for (int t = 0; t < num_tensors; ++t)
    if (counted(t)) counted_tensors.push_back(t);

  parallel::GradBucketsOptions bo;
  bo.bucket_size = a.ddp_bucket_size > 0 ? a.ddp_bucket_size : parallel::default_bucket_size(layout.dp);
  bo.overlap_grad_reduce = a.overlap_grad_reduce;
  bo.reduce = a.use_distributed_optimizer ? parallel::GradReduce::ReduceScatter : parallel::GradReduce::AllReduce;
  parallel::GradBuckets buckets(*groups.dp, params.grads().data<float>(), params.numel(), segments, bo);
  // Each tensor's bucket may start once the last microbatch's W pass of it is done.
  std::vector<int> w_done(num_tensors, 0), w_expected(num_tensors);
  for (int t = 0; t < num_tensors; ++t)
    w_expected[t] = int(m_local) * (mixed ? mixed->weight_grad_passes(t) : fp32_model->weight_grad_passes(t));
  auto grad_hook = [&](const std::vector<int>& ids) {
    for (int t : ids)
      if (++w_done[t] == w_expected[t] && t != tied_tensor) buckets.mark_ready(t);
  };
  if (mixed)
    mixed->set_weight_grad_hook(grad_hook);
  else
    fp32_model->set_weight_grad_hook(grad_hook);

  const AdamWOptions adam_opt{a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay};
  Optimizer opt;
  if (mixed)
    opt.flat = std::make_unique<FlatAdamW>(adam_opt, segments, params.numel(), compute.device);
  else if (a.use_distributed_optimizer)
    opt.zero = std::make_unique<parallel::DistributedOptimizer>(buckets, params.values().data<float>(), adam_opt);
  else
    opt.adam = std::make_unique<AdamW>(adam_opt, params.numel());
  LRSchedule schedule(lr_schedule_options(a));

  // Resume: an explicit `load` must load; auto-resume falls back past damaged checkpoints. Every
  // rank reads its own part; a checkpoint counts only if all ranks could read theirs.
  TrainState state;
  state.seed = a.seed;
  state.run_id = new_run_id(&world);  // a resume replaces it with the checkpoint's
  auto try_restore = [&](const std::string& dir) -> std::string {
    std::string problem;
    CheckpointData ck;
    try {
      check_same_model(dir, spec);  // a rank loads only its tensors, so it cannot see missing layers
      ck = load_checkpoint(dir, params);
    } catch (const Error& e) {
      problem = e.what();
    }
    if (world.all_reduce_value(int32_t(problem.empty() ? 0 : 1)) != 0)
      return problem.empty() ? "another rank could not read its part" : problem;
    Tensor loaded = Tensor::empty({params.numel()});
    std::copy(ck.params.begin(), ck.params.end(), loaded.data<float>());
    Tensor values = params.values();  // a handle on the store's buffer (on the GPU for a device store)
    values.copy_from(loaded);
    if (mixed) mixed->sync_working_weights();
    if (opt.zero)
      opt.zero->load_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data(), int64_t(ck.exp_avg.size()));
    else if (opt.flat)
      opt.flat->set_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data());
    else
      opt.adam->set_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data());
    state = ck.state;
    log::info("resumed from {} at iteration {} ({} samples consumed)", dir, state.iteration, state.consumed_samples);
    return "";
  };
  if (!a.load.empty()) {
    const std::string dir = resolve_checkpoint(a.load);
    const std::string problem = try_restore(dir);
    if (!problem.empty()) fail("cannot load checkpoint {}: {}", dir, problem);
  } else if (a.auto_resume) {
    std::vector<std::string> dirs = list_checkpoints(cfg.checkpoint_dir());
    for (const std::string& dir : dirs) {
      const std::string problem = try_restore(dir);
      if (problem.empty()) break;
      log::warn("skipping checkpoint {}: {}", dir, problem);
    }
  }
  if (state.seed != a.seed)
    log::warn("the checkpoint was trained with seed {}, the config says {}; data order follows the config",
              state.seed, a.seed);

  const ModelStats stats = model_stats(spec, seq);
  // MFU's denominator: on the CPU one rank's measured SGEMM peak (ranks measure one at a time,
  // rank 0's number is used), on a GPU the data sheet's dense bf16 peak; times the ranks.
  double peak_gflops = 0;
  if (rank0) peak_gflops = compute.mixed ? compute.backend->peak_tflops() * 1e3 : cpu::sgemm_peak_gflops();
  peak_gflops = world.all_reduce_value(peak_gflops) * world.size();
  const std::string config_yaml = cfg.resolved_yaml();
  std::ofstream metrics;
  if (rank0) {
    std::ofstream(fs::path(cfg.run_dir()) / "config.yaml") << config_yaml;
    write_resolved_config(config_yaml);  // into the launch snapshot, when primus-cli made one
    metrics.open(fs::path(cfg.run_dir()) / "metrics.jsonl", std::ios::app);
    if (!metrics) fail("cannot write {}/metrics.jsonl", cfg.run_dir());
  }
  const bool tty = ::isatty(STDOUT_FILENO) && rank0;

  log::info("model {}: {:.2f}M parameters, {:.1f} MFLOP per token; {} x {} tokens per microbatch, {} microbatches per step",
            cfg.model, stats.parameters / 1e6, stats.flops_per_token / 1e6, mbs, seq, num_micro);
  log::info("parallel layout: {}; this rank: tp {} pp {} dp {}, {:.2f}M parameters", layout.describe(), me.tp, me.pp,
            me.dp, params.numel() / 1e6);
  log::info("compute: {}", compute.describe());
  log::info("training iterations {} to {}; MFU against a peak of {:.1f} GFLOP/s ({})", state.iteration + 1,
            a.train_iters, peak_gflops,
            compute.device == Device::CUDA ? "data-sheet dense bf16" : "measured SGEMM");

  TrainSummary summary;
  summary.start_iteration = state.iteration;
  safe::TrainWatch watch(cfg.run_dir(), state.iteration);  // heartbeats, NaN policy, test faults
  std::vector<int32_t> tokens, targets;
  double interval_loss = 0, interval_time = 0;
  int64_t interval_steps = 0;
  // Pipeline timing over the log interval: wall and wait per rank, mean F/B/W per chunk op.
  double pipe_wall = 0, pipe_wait = 0, pipe_f = 0, pipe_b = 0, pipe_w = 0;

  // Microbatch j of this dp rank in a step is the global batch's microbatch dp * m_local + j.
  auto fill_from = [&](const SampleSource& src, int64_t first_sample) {
    return [&, first_sample](int j, std::vector<int32_t>& tk, std::vector<int32_t>& tg) {
      fill_microbatch(src, first_sample + (me.dp * m_local + j) * mbs, mbs, seq, tk, tg);
    };
  };
  // One microbatch through the one-process model (fp32 or bf16): its loss, and with backward its
  // gradients too (the weight-gradient hook marks buckets ready as tensors finish).
  const float dloss = 1.0f / float(num_micro);
  auto run_microbatch = [&](bool backward) -> double {
    if (mixed) {
      MixedContext ctx;
      const double loss = mixed->forward(ctx, tokens.data(), targets.data(), mbs, seq);
      if (backward) mixed->backward(ctx, dloss);
      return loss;
    }
    LlamaContext<float> ctx;
    const double loss = fp32_model->forward(ctx, tokens.data(), targets.data(), mbs, seq);
    if (backward) fp32_model->backward(ctx, dloss);
    return loss;
  };
  auto evaluate = [&]() -> double {
    double total = 0;
    for (int64_t e = 0; e < a.eval_iters; ++e) {
      const MicrobatchFill fill = fill_from(valid_src, e * num_micro * mbs);
      if (layout.schedule) {
        total += pipeline_forward_only(*fp32_model, *layout.schedule, *groups.pp, mbs, seq, int(m_local), fill);
      } else {
        for (int j = 0; j < m_local; ++j) {
          fill(j, tokens, targets);
          total += run_microbatch(false);
        }
      }
    }
    return groups.dp->all_reduce_value(total) / double(a.eval_iters * num_micro);
  };
  auto save = [&]() {
    watch.before_save(state.iteration);
    // The full optimizer state in this rank's layout (ZeRO gathers its shards over dp).
    parallel::FullOptimizerState full;
    const float *m = nullptr, *v = nullptr;
    if (opt.zero) {
      full = opt.zero->gather_state();
      m = full.exp_avg.data();
      v = full.exp_avg_sq.data();
    } else if (opt.flat) {
      full.exp_avg = opt.flat->exp_avg();  // copied from the device
      full.exp_avg_sq = opt.flat->exp_avg_sq();
      m = full.exp_avg.data();
      v = full.exp_avg_sq.data();
    } else {
      m = opt.adam->exp_avg();
      v = opt.adam->exp_avg_sq();
    }
    SaveOptions so;
    so.world = &world;
    so.writer = me.dp == 0 && me.cp == 0;  // dp replicas hold the same tensors
    so.layout = {world.size(), layout.tp, layout.pp, layout.dp, layout.cp, layout.vpp};
    so.overwrite = a.overwrite;
    summary.last_checkpoint = save_checkpoint(cfg.checkpoint_dir(), params, m, v, state, config_yaml, so);
    if (rank0) prune_checkpoints(cfg.checkpoint_dir(), a.keep_last_checkpoints, state.run_id, summary.last_checkpoint);
    world.barrier();
    log::info("saved checkpoint {}", summary.last_checkpoint);
  };

  while (state.iteration < a.train_iters) {
    const auto t0 = Clock::now();
    watch.begin_step(state.iteration + 1);
    params.zero_grad();
    buckets.reset();
    std::fill(w_done.begin(), w_done.end(), 0);
    const MicrobatchFill fill = fill_from(train_src, state.consumed_samples);
    double loss_sum = 0;  // over the microbatches whose loss this rank computed
    if (layout.schedule) {
      LlamaStageRunner runner(*fp32_model, mbs, seq, dloss, fill);
      const pipeline::ExecutorStats ps = pipeline::run_schedule(*layout.schedule, runner, *groups.pp);
      loss_sum = runner.loss_sum();
      pipe_wall += ps.wall_s;
      pipe_wait += ps.wait_s;
      pipe_f += ps.mean_f_s;
      pipe_b += ps.mean_b_s;
      pipe_w += ps.mean_w_s;
    } else {
      for (int j = 0; j < m_local; ++j) {
        fill(j, tokens, targets);
        loss_sum += run_microbatch(true);
      }
      if (mixed) compute.backend->synchronize();  // compute_time counts the device's work
    }
    // This rank's own work; the reductions below wait for the slowest rank (stragglers show here).
    const double compute_time = std::chrono::duration<double>(Clock::now() - t0).count();
    watch.inject_faults(state.iteration + 1, params.grads());
    if (embedding_group) {
      embedding_group->all_reduce(params.grad(tied_tensor), params.infos()[tied_tensor].numel,
                                  parallel::CommType::F32, parallel::ReduceOp::Sum);
      buckets.mark_ready(tied_tensor);
    }
    buckets.finish();
    // Sequence parallel: each tp rank's norm gradients cover its rows only. Summed after the dp
    // reduction (the two sums commute; tp peers share the dp shard layout under ZeRO).
    if (layout.sequence_parallel)
      for (int t = 0; t < num_tensors; ++t)
        if (params.infos()[t].tp_replicated)
          groups.tp->all_reduce(params.grad(t), params.infos()[t].numel, parallel::CommType::F32,
                                parallel::ReduceOp::Sum);
    // Loss: the last stage's sum, over pipeline ranks and dp ranks (tp ranks agree).
    if (layout.schedule) loss_sum = groups.pp->all_reduce_value(loss_sum);
    const double loss = groups.dp->all_reduce_value(loss_sum) / double(num_micro);

    float* grads = params.grads().data<float>();
    double grad_norm = 0;
    double clip_scale = 1.0;  // applied inside the fused step (FlatAdamW)
    if (opt.zero) {
      grad_norm = opt.zero->clip_grad_norm(a.clip_grad, groups.mp.get(), counted);
    } else if (opt.flat) {
      grad_norm = std::sqrt(groups.mp->all_reduce_value(opt.flat->grad_sq_sum(params.grads(), counted_tensors)));
      if (a.clip_grad > 0) clip_scale = clip_coefficient(grad_norm, a.clip_grad);
    } else {
      double sq = 0;
      for (int t = 0; t < num_tensors; ++t)
        if (counted(t)) sq += grad_sq_sum(params.grad(t), params.infos()[t].numel);
      grad_norm = std::sqrt(groups.mp->all_reduce_value(sq));
      if (a.clip_grad > 0) scale_grads(grads, params.numel(), clip_coefficient(grad_norm, a.clip_grad));
    }
    // loss and grad_norm are reduced over every rank, so every rank takes the same decision.
    const bool skip = watch.check(state.iteration + 1, loss, grad_norm) == safe::StepAction::Skip;
    const double lr = schedule.lr_at(state.iteration);
    if (!skip && opt.zero) opt.zero->step(lr);
    if (!skip && opt.adam) opt.adam->step(params.values().data<float>(), grads, segments, lr);
    if (!skip && opt.flat) {
      opt.flat->step(params.values(), params.grads(), &mixed->working_weights(), lr, clip_scale);
      compute.backend->synchronize();
    }
    state.iteration += 1;
    state.consumed_samples += gbs;
    state.optimizer_step = opt.step_count();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (summary.iterations == 0) summary.first_loss = loss;
    summary.iterations = state.iteration;
    summary.last_loss = loss;
    interval_loss += loss;
    interval_time += dt;
    interval_steps += 1;
    watch.end_step(state.iteration, loss, grad_norm, dt, compute_time);

    if (tty)
      fmt::print("\r{} {}/{} loss {:.4f}\033[K", progress_bar(state.iteration, a.train_iters), state.iteration,
                 a.train_iters, loss);
    if (state.iteration % a.log_interval == 0 || state.iteration == a.train_iters) {
      const double tps = double(interval_steps * gbs * seq) / interval_time;
      const double tflops = stats.flops_per_token * tps / 1e12;
      const double mfu = tflops * 1e3 / peak_gflops;
      const double mean_loss = interval_loss / double(interval_steps);
      const size_t peak = compute.mixed ? compute.backend->memory_stats().peak : host_memory_stats().peak;
      if (tty) fmt::print("\r\033[K");
      log::info(" iteration {:>6}/{:>6} | consumed samples: {:>9} | elapsed time per iteration (ms): {:.1f} | "
                "learning rate: {:.3E} | global batch size: {} | lm loss: {:.6E} | grad norm: {:.3f} | "
                "tokens/s: {:.0f} | TFLOP/s: {:.3f} | MFU: {:.1f}% | peak tensor memory: {:.0f} MiB",
                state.iteration, a.train_iters, state.consumed_samples, 1e3 * interval_time / interval_steps, lr, gbs,
                mean_loss, grad_norm, tps, tflops, 100 * mfu, peak / 1048576.0);
      nlohmann::json row{{"iteration", state.iteration},     {"consumed_samples", state.consumed_samples},
                         {"lm_loss", mean_loss},             {"lr", lr},
                         {"grad_norm", grad_norm},           {"tokens_per_sec", tps},
                         {"tflops", tflops},                 {"mfu", mfu},
                         {"step_time_ms", 1e3 * interval_time / interval_steps},
                         {"peak_memory_bytes", peak},        {"restarts", watch.restarts()},
                         {"skipped_iterations", watch.skipped_iterations()}};
      if (layout.schedule) {
        // Measured bubble: (slowest rank's wall - mean compute) / slowest wall. Predicted: the
        // simulator run with the measured mean F, B and W times of a whole stage.
        const double n = double(interval_steps), pp = double(layout.pp);
        const double wall = groups.pp->all_reduce_value(pipe_wall / n, parallel::ReduceOp::Max);
        const double busy = groups.pp->all_reduce_value((pipe_wall - pipe_wait) / n) / pp;
        pipeline::Costs c;
        c.t_forward = groups.pp->all_reduce_value(pipe_f / n) / pp * layout.vpp;
        c.t_backward = groups.pp->all_reduce_value(pipe_b / n) / pp * layout.vpp;
        c.t_weight = groups.pp->all_reduce_value(pipe_w / n) / pp * layout.vpp;
        const double measured = wall > 0 ? (wall - busy) / wall : 0;
        const double predicted = pipeline::simulate(*layout.schedule, c).bubble_rate;
        log::info(" pipeline {}: measured bubble {:.1f}% | simulated from measured F {:.2f} ms, B {:.2f} ms, "
                  "W {:.2f} ms per stage: {:.1f}%",
                  layout.schedule->algorithm, 100 * measured, 1e3 * c.t_forward, 1e3 * c.t_backward,
                  1e3 * c.t_weight, 100 * predicted);
        row["pipeline_bubble_measured"] = measured;
        row["pipeline_bubble_simulated"] = predicted;
        pipe_wall = pipe_wait = pipe_f = pipe_b = pipe_w = 0;
      }
      if (rank0) metrics << row.dump() << "\n" << std::flush;
      interval_loss = interval_time = 0;
      interval_steps = 0;
    }
    if (a.eval_interval > 0 && a.eval_iters > 0 && state.iteration % a.eval_interval == 0 && !valid_src.empty()) {
      watch.phase("eval", state.iteration);
      summary.last_eval_loss = evaluate();
      log::info(" validation at iteration {} | lm loss: {:.6E} | lm loss PPL: {:.3f}", state.iteration,
                summary.last_eval_loss, std::exp(summary.last_eval_loss));
      if (rank0)
        metrics << nlohmann::json{{"iteration", state.iteration}, {"eval_lm_loss", summary.last_eval_loss}}.dump()
                << "\n"
                << std::flush;
    }
    if (a.save_interval > 0 && state.iteration % a.save_interval == 0) save();
  }
  if (state.iteration > summary.start_iteration && (a.save_interval == 0 || state.iteration % a.save_interval != 0)) save();
  watch.finish(state.iteration);
  log::flush();
  return summary;
}

}  // namespace primus::train
