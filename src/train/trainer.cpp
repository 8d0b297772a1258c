#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/rng.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "safe/train_watch.h"
#include "train/checkpoint.h"

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

std::vector<ParamSegment> segments_of(const ParamStore<float>& p) {
  std::vector<ParamSegment> out;
  for (const auto& i : p.infos()) out.push_back({i.name, i.offset, i.numel, i.weight_decay});
  return out;
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
  const int64_t num_micro = gbs / mbs;

  // ---- set-up: everything that can fail on user input fails here, before step 1 -----------------
  cpu::flush_denormals_to_zero();
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
    data::GPTDatasets ds = data::build_gpt_datasets(dc);
    if (!ds.train) fail("data_path {} gives no training documents with split {}", fmt::join(a.data_path, " "), a.split);
    train_src.dataset = ds.train;
    valid_src.dataset = ds.valid;
    if (!ds.valid && a.eval_interval > 0 && a.eval_iters > 0)
      log::warn("split {} leaves no validation documents: evaluation is off", a.split);
  }

  LlamaOptions mopt;
  mopt.recompute = parse_recompute(a.recompute_granularity);
  LlamaModel<float> model(spec, mopt);
  model.init_weights(uint64_t(a.seed));
  ParamStore<float>& params = model.params();
  const std::vector<ParamSegment> segments = segments_of(params);
  AdamW adam({a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay}, params.numel());
  LRScheduleOptions so;
  so.lr = a.lr;
  so.min_lr = a.min_lr;
  so.lr_warmup_init = a.lr_warmup_init;
  so.lr_warmup_iters = a.lr_warmup_iters;
  so.lr_decay_iters = a.lr_decay_iters;
  so.lr_decay_style = a.lr_decay_style;
  so.lr_wsd_decay_style = a.lr_wsd_decay_style;
  so.lr_wsd_decay_iters = a.lr_wsd_decay_iters;
  LRSchedule schedule(so);

  // Resume: an explicit `load` must load; auto-resume falls back past damaged checkpoints.
  TrainState state;
  state.seed = a.seed;
  auto restore = [&](const CheckpointData& ck, const std::string& from) {
    std::copy(ck.params.begin(), ck.params.end(), params.values().data<float>());
    adam.set_state(ck.state.optimizer_step, ck.exp_avg.data(), ck.exp_avg_sq.data());
    state = ck.state;
    log::info("resumed from {} at iteration {} ({} samples consumed)", from, state.iteration, state.consumed_samples);
  };
  if (!a.load.empty()) {
    const std::string dir = resolve_checkpoint(a.load);
    restore(load_checkpoint(dir, params), dir);
  } else if (a.auto_resume) {
    for (const std::string& dir : list_checkpoints(cfg.checkpoint_dir())) {
      try {
        restore(load_checkpoint(dir, params), dir);
        break;
      } catch (const Error& e) {
        log::warn("skipping checkpoint {}: {}", dir, e.what());
      }
    }
  }
  if (state.seed != a.seed)
    log::warn("the checkpoint was trained with seed {}, the config says {}; data order follows the config",
              state.seed, a.seed);

  const ModelStats stats = model_stats(spec, seq);
  const double peak_gflops = cpu::sgemm_peak_gflops();
  const std::string config_yaml = cfg.resolved_yaml();
  { std::ofstream(fs::path(cfg.run_dir()) / "config.yaml") << config_yaml; }
  write_resolved_config(config_yaml);  // into the launch snapshot, when primus-cli made one
  std::ofstream metrics(fs::path(cfg.run_dir()) / "metrics.jsonl", std::ios::app);
  if (!metrics) fail("cannot write {}/metrics.jsonl", cfg.run_dir());
  const bool tty = ::isatty(STDOUT_FILENO) && discover_launch_env().rank == 0;

  log::info("model {}: {:.2f}M parameters, {:.1f} MFLOP per token; {} x {} tokens per microbatch, {} microbatches per step",
            cfg.model, stats.parameters / 1e6, stats.flops_per_token / 1e6, mbs, seq, num_micro);
  log::info("training iterations {} to {}; MFU against a measured SGEMM peak of {:.1f} GFLOP/s", state.iteration + 1,
            a.train_iters, peak_gflops);

  TrainSummary summary;
  summary.start_iteration = state.iteration;
  safe::TrainWatch watch(cfg.run_dir(), state.iteration);  // heartbeats, NaN policy, test faults
  std::vector<int32_t> tokens, targets;
  double interval_loss = 0, interval_time = 0;
  int64_t interval_steps = 0;

  auto evaluate = [&]() -> double {
    double total = 0;
    for (int64_t e = 0; e < a.eval_iters; ++e)
      for (int64_t m = 0; m < num_micro; ++m) {
        fill_microbatch(valid_src, (e * num_micro + m) * mbs, mbs, seq, tokens, targets);
        LlamaContext<float> ctx;
        total += model.forward(ctx, tokens.data(), targets.data(), mbs, seq);
      }
    return total / double(a.eval_iters * num_micro);
  };
  auto save = [&]() {
    watch.before_save(state.iteration);
    summary.last_checkpoint = save_checkpoint(cfg.checkpoint_dir(), params, adam.exp_avg(), adam.exp_avg_sq(), state,
                                              config_yaml);
    prune_checkpoints(cfg.checkpoint_dir(), a.keep_last_checkpoints);
    log::info("saved checkpoint {}", summary.last_checkpoint);
  };

  while (state.iteration < a.train_iters) {
    const auto t0 = Clock::now();
    watch.begin_step(state.iteration + 1);
    params.zero_grad();
    double loss = 0;
    for (int64_t m = 0; m < num_micro; ++m) {
      fill_microbatch(train_src, state.consumed_samples + m * mbs, mbs, seq, tokens, targets);
      LlamaContext<float> ctx;
      loss += model.forward(ctx, tokens.data(), targets.data(), mbs, seq);
      model.backward(ctx, 1.0f / float(num_micro));
    }
    loss /= double(num_micro);
    float* grads = params.grads().data<float>();
    watch.inject_faults(state.iteration + 1, grads, params.numel());
    const double grad_norm = a.clip_grad > 0 ? clip_grad_norm(grads, params.numel(), a.clip_grad)
                                             : global_grad_norm(grads, params.numel());
    const bool skip = watch.check(state.iteration + 1, loss, grad_norm) == safe::StepAction::Skip;
    const double lr = schedule.lr_at(state.iteration);
    if (!skip) adam.step(params.values().data<float>(), grads, segments, lr);
    state.iteration += 1;
    state.consumed_samples += gbs;
    state.optimizer_step = adam.step_count();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (summary.iterations == 0) summary.first_loss = loss;
    summary.iterations = state.iteration;
    summary.last_loss = loss;
    interval_loss += loss;
    interval_time += dt;
    interval_steps += 1;
    watch.end_step(state.iteration, loss, grad_norm, dt);

    if (tty)
      fmt::print("\r{} {}/{} loss {:.4f}\033[K", progress_bar(state.iteration, a.train_iters), state.iteration,
                 a.train_iters, loss);
    if (state.iteration % a.log_interval == 0 || state.iteration == a.train_iters) {
      const double tps = double(interval_steps * gbs * seq) / interval_time;
      const double tflops = stats.flops_per_token * tps / 1e12;
      const double mfu = tflops * 1e3 / peak_gflops;
      const double mean_loss = interval_loss / double(interval_steps);
      const size_t peak = host_memory_stats().peak;
      if (tty) fmt::print("\r\033[K");
      log::info(" iteration {:>6}/{:>6} | consumed samples: {:>9} | elapsed time per iteration (ms): {:.1f} | "
                "learning rate: {:.3E} | global batch size: {} | lm loss: {:.6E} | grad norm: {:.3f} | "
                "tokens/s: {:.0f} | TFLOP/s: {:.3f} | MFU: {:.1f}% | peak tensor memory: {:.0f} MiB",
                state.iteration, a.train_iters, state.consumed_samples, 1e3 * interval_time / interval_steps, lr, gbs,
                mean_loss, grad_norm, tps, tflops, 100 * mfu, peak / 1048576.0);
      metrics << nlohmann::json{{"iteration", state.iteration},     {"consumed_samples", state.consumed_samples},
                                {"lm_loss", mean_loss},             {"lr", lr},
                                {"grad_norm", grad_norm},           {"tokens_per_sec", tps},
                                {"tflops", tflops},                 {"mfu", mfu},
                                {"step_time_ms", 1e3 * interval_time / interval_steps},
                                {"peak_memory_bytes", peak},        {"restarts", watch.restarts()},
                                {"skipped_iterations", watch.skipped_iterations()}}
                     .dump()
              << "\n" << std::flush;
      interval_loss = interval_time = 0;
      interval_steps = 0;
    }
    if (a.eval_interval > 0 && a.eval_iters > 0 && state.iteration % a.eval_interval == 0 && !valid_src.empty()) {
      watch.phase("eval", state.iteration);
      summary.last_eval_loss = evaluate();
      log::info(" validation at iteration {} | lm loss: {:.6E} | lm loss PPL: {:.3f}", state.iteration,
                summary.last_eval_loss, std::exp(summary.last_eval_loss));
      metrics << nlohmann::json{{"iteration", state.iteration}, {"eval_lm_loss", summary.last_eval_loss}}.dump() << "\n"
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
