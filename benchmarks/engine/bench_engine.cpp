// CPU training-step benchmark: tokens/s, achieved GFLOP/s and MFU of a full step (forward,
// backward, gradient clipping, AdamW) in fp32 or bf16 mixed precision, against this machine's
// peak for that precision (SGEMM, or the bf16 GEMM of kernels/cpu/bf16) measured in the same run
// (again just before each of our runs, for that run's MFU);
// then the same model and step in PyTorch (benchmarks/engine/torch_llama.py), in fp32 and under
// autocast bf16, and the ratios. --rounds N interleaves the programs N times (ours, PyTorch fp32,
// PyTorch bf16, ours, ...) and reports medians: the machine is shared, so only ratios taken in one
// run mean anything. --profile adds where our step's time goes, op by op. Both train one batch of
// random tokens on every step at the same learning rate (kLr), as torch_llama.py does, so their
// loss columns compare: both fall.
//
//   bench_engine --model llama2c_15M --micro-batch-size 8 --seq-length 256 --iters 5 [--precision bf16]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/ceiling.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "model/linears.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "model/router.h"
#include "optim/adamw.h"
#include "optim/flat_adamw.h"
#include "optim/grad_clip.h"
#include "timed_backend.h"

using namespace primus;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Result {
  double tokens_per_sec = 0, step_time = 0, gflops = 0, loss_first = 0, loss_last = 0, forward = 0, backward = 0,
         clip = 0, optimizer = 0;
  size_t peak_bytes = 0;
  double peak_gflops = 0;     // ours: the machine's peak, measured just before this run
  double ceiling_gflops = 0;  // ours: the instruction ceiling (kernels/cpu/ceiling.h), measured just before this run
  // --profile: seconds per step in each op category, the GEMMs' FLOPs, and the part of the
  // optimizer step that refreshes the bf16 working copy.
  std::array<double, bench::TimedBackend::kCategories> ops{};
  double gemm_flops = 0, grouped_flops = 0, refresh = 0;
  std::map<std::string, bench::TimedBackend::ShapeTime> gemm_shapes;  // per step
  std::map<std::string, bench::TimedBackend::OpTime> op_times;        // per step
  double routing = 0;  // MoE: the router's host work (model/router.h), seconds per step
};

constexpr double kLr = 1e-3;  // torch_llama.py's --lr, passed to it

static Result run_ours(const ModelSpec& spec, int64_t mbs, int64_t seq, int iters, int warmup, Recompute rc,
                       Precision precision, bool profile, const Fp8Options& fp8 = {}) {
  std::unique_ptr<ops::Backend> bf16_backend;
  if (precision == Precision::Bf16) bf16_backend = std::make_unique<cpu::Bf16Backend>();
  ops::Backend& inner = bf16_backend ? *bf16_backend : static_cast<ops::Backend&>(cpu::cpu_backend());
  bench::TimedBackend timed(inner);
  LlamaOptions opt;
  opt.recompute = rc;
  opt.fp8 = fp8;
  LlamaModel model(spec, profile ? timed : inner, precision, opt);
  model.init_weights(1234);
  const std::vector<ParamSegment> segments = segments_of(model.params());
  const AdamWOptions ao{0.9, 0.95, 1e-8, 0.1};
  AdamW adam(ao, model.params().numel());
  FlatAdamW flat(ao, segments, model.params().numel(), Device::CPU);
  // The trainer's step: the gradients' norm, then AdamW with the clipping factor (applied in its pass).
  auto optimizer_step = [&](bool refresh, double grad_scale) {
    if (precision == Precision::Bf16)
      flat.step(model.params().values(), model.params().grads(), refresh ? &model.working_weights() : nullptr, kLr,
                grad_scale);
    else
      adam.step(model.params().values().data<float>(), model.params().grads().data<float>(), segments, kLr, nullptr,
                grad_scale);
  };
  Rng rng(42);
  std::vector<int32_t> tokens(mbs * seq), targets(mbs * seq);
  for (auto& t : tokens) t = int32_t(rng.next_u64() % spec.vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
  Result r;
  reset_peak_host_memory();
  double routing0 = 0;
  for (int it = 0; it < warmup + iters; ++it) {
    if (it == warmup) timed.reset(), routing0 = routing_seconds();
    auto t0 = Clock::now();
    model.params().zero_grad();
    LlamaContext ctx;
    const double loss = model.forward(ctx, tokens.data(), targets.data(), mbs, seq);
    const double tf = seconds_since(t0);
    auto t1 = Clock::now();
    model.backward(ctx, 1.0);
    const double tb = seconds_since(t1);
    auto t2 = Clock::now();
    const double grad_scale =
        clip_coefficient(global_grad_norm(model.params().grads().data<float>(), model.params().numel()), 1.0);
    const double tc = seconds_since(t2);
    auto t3 = Clock::now();
    optimizer_step(true, grad_scale);
    if (fp8.enabled && fp8.recipe == Fp8Recipe::Delayed)  // the step's amaxes into the scales (one rank)
      model.linears().update_scales(model.linears().current_amaxes());
    const double to = seconds_since(t3);
    if (it == 0) r.loss_first = loss;
    r.loss_last = loss;
    if (it >= warmup) {
      r.forward += tf / iters;
      r.backward += tb / iters;
      r.clip += tc / iters;
      r.optimizer += to / iters;
      r.step_time += seconds_since(t0) / iters;
    }
  }
  r.tokens_per_sec = double(mbs * seq) / r.step_time;
  r.peak_bytes = host_memory_stats().peak;
  if (profile) {
    for (int c = 0; c < bench::TimedBackend::kCategories; ++c) r.ops[size_t(c)] = timed.seconds[size_t(c)] / iters;
    r.gemm_flops = timed.gemm_flops / iters;
    r.grouped_flops = timed.grouped_flops / iters;
    for (auto [shape, t] : timed.gemm_shapes)
      r.gemm_shapes[shape] = {t.seconds / iters, t.flops / iters, t.calls / iters};
    for (auto [op, t] : timed.ops) r.op_times[op] = {t.category, t.seconds / iters, t.calls / iters};
    r.routing = (routing_seconds() - routing0) / iters;
    if (precision == Precision::Bf16) {  // the working-copy refresh: a step with it minus one without
      double with = 1e9, without = 1e9;
      for (int i = 0; i < 3; ++i) {
        auto t = Clock::now();
        optimizer_step(true, 1.0);
        with = std::min(with, seconds_since(t));
        t = Clock::now();
        optimizer_step(false, 1.0);
        without = std::min(without, seconds_since(t));
      }
      r.refresh = std::max(0.0, with - without);
    }
  }
  return r;
}

static Result run_torch(const std::string& preset_path, int64_t mbs, int64_t seq, int iters, int warmup, int threads,
                        const std::string& precision, bool* ok) {
  const std::string cmd = fmt::format(
      "/usr/bin/python3 {}/benchmarks/engine/torch_llama.py --model {} --micro-batch-size {} --seq-length {} "
      "--iters {} --warmup {} --threads {} --precision {} --lr {}",
      PRIMUS_SOURCE_DIR, preset_path, mbs, seq, iters, warmup, threads, precision, kLr);
  Result r;
  *ok = false;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  if (pclose(pipe) != 0 || out.rfind('{') == std::string::npos) {
    std::cerr << "torch peer failed: " << cmd << "\n" << out << "\n";
    return r;
  }
  const auto line = out.substr(out.rfind('{'));
  auto j = nlohmann::json::parse(line);
  r.tokens_per_sec = j.at("tokens_per_sec");
  r.step_time = j.at("step_time_s");
  r.loss_first = j.at("loss_first");
  r.loss_last = j.at("loss_last");
  *ok = true;
  return r;
}

// The run whose tokens/s is the median of the rounds (the lower middle one for an even count).
static const Result& median(std::vector<Result>& runs) {
  std::sort(runs.begin(), runs.end(), [](const Result& a, const Result& b) { return a.tokens_per_sec < b.tokens_per_sec; });
  return runs[(runs.size() - 1) / 2];
}

// The median of values (the mean of the middle two for an even count).
static double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

static std::string all_rates(const std::vector<Result>& runs) {
  std::string s;
  for (const auto& r : runs) s += fmt::format("{}{:.0f}", s.empty() ? "" : ", ", r.tokens_per_sec);
  return s;
}

// --recompute-granularity's names are model/options.h's.
static Recompute recompute_of(const std::string& name) {
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full})
    if (name == recompute_name(r)) return r;
  return Recompute::None;  // (CLI11 checked the name)
}

int main(int argc, char** argv) {
  CLI::App app{"Primus CPU engine benchmark: one training step, ours beside PyTorch"};
  std::vector<std::string> models{"llama2c_15M"};
  int64_t mbs = 8, seq = 256;
  int iters = 5, warmup = 1, rounds = 1;
  bool torch = true, profile = false;
  std::string recompute = "none", precision = "fp32", torch_modes = "both";
  app.add_option("--model", models, "preset names or YAML paths (repeatable)");
  app.add_option("--micro-batch-size", mbs);
  app.add_option("--seq-length", seq);
  app.add_option("--iters", iters, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--recompute-granularity", recompute, "none | selective | full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--precision", precision, "fp32 | bf16 (bf16 mixed precision on the CPU bf16 backend)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--torch-precision", torch_modes, "the PyTorch peer's modes: both (fp32 and autocast bf16) | match")
      ->check(CLI::IsMember({"both", "match"}));
  app.add_option("--rounds", rounds, "run ours and the peers this many times, interleaved; medians are reported")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-torch", torch, "skip the PyTorch peer");
  app.add_flag("--profile", profile, "time every op of our step by category (adds a little overhead)");
  std::string fp8_recipe;
  app.add_option("--fp8", fp8_recipe,
                 "also run ours with FP8 linears (hybrid formats) in this recipe, in the same rounds, and print its "
                 "ratio to ours without: delayed | tensorwise | blockwise | mxfp8")
      ->check(CLI::IsMember({"delayed", "tensorwise", "blockwise", "mxfp8"}));
  CLI11_PARSE(app, argc, argv);

  try {
    const bool bf16 = precision == "bf16";
    std::string why;
    if (bf16 && !cpu::Bf16Backend::supported(&why))
      fail("--precision bf16: {} (the CPU bf16 backend needs AVX512-BF16)", why);
    const int threads = omp_get_max_threads();
    cpu::flush_denormals_to_zero();  // as the PyTorch peer does (torch.set_flush_denormal)
    const double sgemm_peak = cpu::measure_sgemm_peak_gflops(2048, 4);
    const double bf16_peak = bf16 ? cpu::bf16k::measure_bf16_gemm_peak_gflops(2048, 4) : 0.0;
    const double peak = bf16 ? bf16_peak : sgemm_peak;
    const std::string peak_name = bf16 ? "bf16 GEMM" : "SGEMM";
    fmt::print("machine: {} threads, {}; SGEMM peak {:.1f} GFLOP/s{} (2048^3, best of 4)\n", threads,
               cpu::cpu_features().summary(), sgemm_peak,
               bf16 ? fmt::format(", bf16 GEMM peak {:.1f} GFLOP/s", bf16_peak) : std::string());
    fmt::print("ours in {}{}; MFU against the {} peak\n", bf16 ? "bf16 mixed precision on " : "fp32 on ",
               bf16 ? cpu::Bf16Backend().name() : std::string("cpu"), peak_name);
    std::vector<std::string> peer_modes;
    if (torch) {
      if (torch_modes == "both" || !bf16) peer_modes.push_back("fp32");
      if (torch_modes == "both" || bf16) peer_modes.push_back("bf16");
    }
    for (const auto& name : models) {
      ModelSpec spec = load_model_spec(name);
      ModelStats stats = model_stats(spec, seq);
      fmt::print("\nmodel {}: {:.2f}M parameters, {:.1f} MFLOP/token (training), micro batch {} x seq {}\n",
                 spec.name, stats.parameters / 1e6, stats.flops_per_token / 1e6, mbs, seq);
      const std::string path = spec.name.find('/') != std::string::npos || spec.name.ends_with(".yaml")
                                   ? spec.name
                                   : model_preset_dir() + "/" + spec.name + ".yaml";
      std::vector<Result> ours_runs, fp8_runs;
      std::string ceiling_instruction;
      std::map<std::string, std::vector<Result>> peer_runs;
      Fp8Options fp8;
      if (!fp8_recipe.empty()) {
        fp8.enabled = true;
        for (Fp8Recipe r : {Fp8Recipe::Delayed, Fp8Recipe::Tensorwise, Fp8Recipe::Blockwise, Fp8Recipe::Mxfp8})
          if (fp8_recipe == fp8_recipe_name(r)) fp8.recipe = r;
      }
      for (int round = 0; round < rounds; ++round) {
        // The peak again right before each of our runs: MFU from numbers taken under the same load.
        const double round_peak =
            bf16 ? cpu::bf16k::measure_bf16_gemm_peak_gflops(2048, 2) : cpu::measure_sgemm_peak_gflops(2048, 2);
        const cpu::InstructionCeiling round_ceiling = cpu::measure_instruction_ceiling(bf16);
        ceiling_instruction = round_ceiling.instruction;
        ours_runs.push_back(run_ours(spec, mbs, seq, iters, warmup, recompute_of(recompute),
                                     bf16 ? Precision::Bf16 : Precision::Fp32, profile));
        ours_runs.back().peak_gflops = round_peak;
        ours_runs.back().ceiling_gflops = round_ceiling.gflops;
        if (fp8.enabled)
          fp8_runs.push_back(run_ours(spec, mbs, seq, iters, warmup, recompute_of(recompute),
                                      bf16 ? Precision::Bf16 : Precision::Fp32, profile, fp8));
        for (const auto& mode : peer_modes) {
          bool ok = false;
          Result p = run_torch(path, mbs, seq, iters, warmup, threads, mode, &ok);
          if (ok) peer_runs[mode].push_back(p);
        }
      }
      std::vector<Result> ours_sorted = ours_runs;
      Result ours = median(ours_sorted);
      ours.gflops = stats.flops_per_token * ours.tokens_per_sec / 1e9;
      // MFU of each round against the peak measured just before it; the median of those.
      std::vector<double> mfus, ceiling_mfus;
      std::string round_peaks, round_ceilings;
      for (const auto& r : ours_runs) {
        mfus.push_back(stats.flops_per_token * r.tokens_per_sec / 1e9 / r.peak_gflops);
        ceiling_mfus.push_back(stats.flops_per_token * r.tokens_per_sec / 1e9 / r.ceiling_gflops);
        round_peaks += fmt::format("{}{:.0f}", round_peaks.empty() ? "" : ", ", r.peak_gflops);
        round_ceilings += fmt::format("{}{:.0f}", round_ceilings.empty() ? "" : ", ", r.ceiling_gflops);
      }
      const double mfu = median_of(mfus), mfu_ceiling = median_of(ceiling_mfus);
      fmt::print("  primus {:<5} {:>8.0f} tokens/s  step {:.3f} s (fwd {:.3f}, bwd {:.3f}, clip {:.3f}, optim {:.3f})  "
                 "{:.1f} GFLOP/s  peak mem {:.0f} MiB  loss {:.3f} -> {:.3f}{}\n",
                 precision, ours.tokens_per_sec, ours.step_time, ours.forward, ours.backward, ours.clip, ours.optimizer,
                 ours.gflops, ours.peak_bytes / 1048576.0, ours.loss_first, ours.loss_last,
                 rounds > 1 ? fmt::format("  (rounds: {})", all_rates(ours_runs)) : std::string());
      fmt::print("  MFU          {:.1f}% of the {} peak measured before each run ({} GFLOP/s){}\n", 100 * mfu, peak_name,
                 round_peaks, rounds > 1 ? " (median of the rounds)" : "");
      fmt::print("  MFU          {:.1f}% of the instruction ceiling measured before each run ({}: {} GFLOP/s){}\n",
                 100 * mfu_ceiling, ceiling_instruction, round_ceilings, rounds > 1 ? " (median of the rounds)" : "");
      nlohmann::json row{{"model", spec.name},
                         {"micro_batch_size", mbs},
                         {"seq_length", seq},
                         {"threads", threads},
                         {"precision", precision},
                         {"rounds", rounds},
                         {"sgemm_peak_gflops", sgemm_peak},
                         {"peak", peak_name},
                         {"peak_gflops", peak},
                         {"tokens_per_sec", ours.tokens_per_sec},
                         {"gflops", ours.gflops},
                         {"mfu", mfu},
                         {"ceiling_instruction", ceiling_instruction},
                         {"mfu_ceiling", mfu_ceiling}};
      if (bf16) row["bf16_gemm_peak_gflops"] = bf16_peak;
      if (!fp8_runs.empty()) {  // FP8 beside ours without it, round by round
        std::vector<Result> sorted = fp8_runs;
        const Result& f = median(sorted);
        std::vector<double> ratios;
        for (size_t k = 0; k < fp8_runs.size(); ++k) ratios.push_back(fp8_runs[k].tokens_per_sec / ours_runs[k].tokens_per_sec);
        const double ratio = median_of(ratios);
        fmt::print("  primus fp8   {:>8.0f} tokens/s  step {:.3f} s  ({} recipe, hybrid, on the {} path)  loss {:.3f} -> "
                   "{:.3f}{}\n",
                   f.tokens_per_sec, f.step_time, fp8_recipe, precision, f.loss_first, f.loss_last,
                   rounds > 1 ? fmt::format("  (rounds: {})", all_rates(fp8_runs)) : std::string());
        fmt::print("  fp8 ratio    {:.2f}x ours without fp8{}\n", ratio, rounds > 1 ? " (median of the rounds' ratios)" : "");
        row["fp8_recipe"] = fp8_recipe;
        row["fp8_tokens_per_sec"] = f.tokens_per_sec;
        row["fp8_ratio"] = ratio;
        if (profile)
          row["fp8_quantize_seconds"] = f.ops[size_t(bench::TimedBackend::Fp8Quantize)];
        if (profile)
          fmt::print("  fp8 quantization {:.3f} s of its {:.3f} s step\n", f.ops[size_t(bench::TimedBackend::Fp8Quantize)],
                     f.step_time);
      }
      for (const auto& mode : peer_modes) {
        auto it = peer_runs.find(mode);
        if (it == peer_runs.end()) continue;
        std::vector<Result> sorted = it->second;  // it->second stays in round order
        const Result& p = median(sorted);
        const double peer_gflops = stats.flops_per_token * p.tokens_per_sec / 1e9;
        fmt::print("  pytorch {:<4} {:>8.0f} tokens/s  step {:.3f} s  {:.1f} GFLOP/s  MFU {:.1f}% of {}  loss {:.3f} -> "
                   "{:.3f}{}\n",
                   mode, p.tokens_per_sec, p.step_time, peer_gflops, 100 * peer_gflops / peak, peak_name, p.loss_first,
                   p.loss_last, rounds > 1 ? fmt::format("  (rounds: {})", all_rates(it->second)) : std::string());
        // The ratio of each round (ours and the peer run minutes apart at most), and their median:
        // steadier than a ratio of medians when the machine's load changes between rounds.
        std::vector<double> ratios;
        for (size_t k = 0; k < it->second.size() && k < ours_runs.size(); ++k)
          ratios.push_back(ours_runs[k].tokens_per_sec / it->second[k].tokens_per_sec);
        std::string per_round;
        for (double x : ratios) per_round += fmt::format("{}{:.2f}", per_round.empty() ? "" : ", ", x);
        const double ratio = median_of(ratios);
        fmt::print("  ratio        {:.2f}x PyTorch {}'s tokens/s{}\n", ratio, mode == "bf16" ? "autocast bf16" : "fp32",
                   rounds > 1 ? fmt::format(" (median of the rounds' ratios: {})", per_round) : std::string());
        row["torch_" + mode + "_tokens_per_sec"] = p.tokens_per_sec;
        row["ratio_vs_torch_" + mode] = ratio;
        if (mode == precision) {  // the fields of earlier versions: the peer in our precision
          row["torch_tokens_per_sec"] = p.tokens_per_sec;
          row["ratio_vs_torch"] = ratio;
        }
      }
      if (profile) {
        const Result& r = ours;
        fmt::print("  where the step's {:.3f} s go (median round, per step):\n", r.step_time);
        double ops_total = 0;
        for (int c = 0; c < bench::TimedBackend::kCategories; ++c) {
          const double s = r.ops[size_t(c)];
          ops_total += s;
          std::string extra;
          const double flops = c == bench::TimedBackend::Gemm          ? r.gemm_flops
                               : c == bench::TimedBackend::GroupedGemm ? r.grouped_flops
                                                                       : 0.0;
          if (flops > 0 && s > 0)
            extra = fmt::format("  ({:.1f} GFLOP/s, {:.0f}% of the {} peak measured before the run)", flops / s / 1e9,
                                100 * flops / s / 1e9 / r.peak_gflops, peak_name);
          fmt::print("    {:<40} {:>8.3f} s  {:>5.1f}%{}\n", bench::TimedBackend::category_name(c), s,
                     100 * s / r.step_time, extra);
          row["profile"][bench::TimedBackend::category_name(c)] = s;
        }
        if (spec.is_moe())
          fmt::print("    {:<40} {:>8.3f} s  {:>5.1f}%\n", "MoE routing on the host", r.routing,
                     100 * r.routing / r.step_time);
        const double other = r.forward + r.backward - ops_total - r.routing;
        fmt::print("    {:<40} {:>8.3f} s  {:>5.1f}%\n", "model code between ops", other, 100 * other / r.step_time);
        fmt::print("    {:<40} {:>8.3f} s  {:>5.1f}%\n", "gradient norm", r.clip, 100 * r.clip / r.step_time);
        fmt::print("    {:<40} {:>8.3f} s  {:>5.1f}%\n", "optimizer step (with the clipping)", r.optimizer,
                   100 * r.optimizer / r.step_time);
        if (bf16)
          fmt::print("    {:<40} {:>8.3f} s  {:>5.1f}%\n", "  of which the bf16 working-copy refresh", r.refresh,
                     100 * r.refresh / r.step_time);
        // The GEMMs by shape, the slowest first: which of them the step loses its time in.
        std::vector<std::pair<std::string, bench::TimedBackend::ShapeTime>> shapes(r.gemm_shapes.begin(),
                                                                                   r.gemm_shapes.end());
        std::sort(shapes.begin(), shapes.end(),
                  [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
        fmt::print("  its GEMMs by shape (per step; op(A) op(B) M x N x K, as `benchmark gemm` names them):\n");
        for (const auto& [shape, t] : shapes) {
          const double gf = t.seconds > 0 ? t.flops / t.seconds / 1e9 : 0.0;
          fmt::print("    {:<40} {:>3} calls {:>8.4f} s  {:>7.1f} GFLOP/s{}\n", shape, t.calls, t.seconds, gf,
                     r.ceiling_gflops > 0 ? fmt::format("  {:>3.0f}% of the ceiling", 100 * gf / r.ceiling_gflops)
                                          : std::string());
          row["profile"]["gemm_shapes"].push_back(
              {{"shape", shape}, {"calls", t.calls}, {"seconds", t.seconds}, {"gflops", gf}});
        }
        // The other ops by name, the slowest first: where the memory-bound categories' time goes.
        std::vector<std::pair<std::string, bench::TimedBackend::OpTime>> others;
        for (const auto& [op, t] : r.op_times)
          if (t.category != bench::TimedBackend::Gemm && t.seconds > 0) others.emplace_back(op, t);
        std::sort(others.begin(), others.end(),
                  [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
        fmt::print("  its other ops (per step):\n");
        for (const auto& [op, t] : others) {
          fmt::print("    {:<40} {:>3} calls {:>8.4f} s  {:>5.1f}%  ({})\n", op, t.calls, t.seconds,
                     100 * t.seconds / r.step_time, bench::TimedBackend::category_name(t.category));
          row["profile"]["ops"].push_back({{"op", op}, {"calls", t.calls}, {"seconds", t.seconds}});
        }
        row["profile"]["other"] = other;
        row["profile"]["routing"] = r.routing;
        row["profile"]["clip"] = r.clip;
        row["profile"]["optimizer"] = r.optimizer;
        row["profile"]["refresh"] = r.refresh;
        row["profile"]["gemm_gflops"] = r.ops[0] > 0 ? r.gemm_flops / r.ops[0] / 1e9 : 0.0;
        const double grouped_s = r.ops[size_t(bench::TimedBackend::GroupedGemm)];
        row["profile"]["grouped_gemm_gflops"] = grouped_s > 0 ? r.grouped_flops / grouped_s / 1e9 : 0.0;
      }
      std::cout << "JSON " << row.dump() << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
