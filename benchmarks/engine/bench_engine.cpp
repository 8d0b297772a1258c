// CPU training-step benchmark: tokens/s, achieved GFLOP/s and MFU of a full step (forward,
// backward, gradient clipping, AdamW) against this machine's SGEMM peak, measured in the same
// run; then the same model and step in PyTorch (benchmarks/engine/torch_llama.py) and the ratio.
//
//   bench_engine --model llama2c_15M --micro-batch-size 8 --seq-length 256 --iters 5
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/memory.h"
#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"

using namespace primus;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Result {
  double tokens_per_sec = 0, step_time = 0, gflops = 0, loss_first = 0, loss_last = 0, forward = 0, backward = 0,
         optimizer = 0;
  size_t peak_bytes = 0;
};

static Result run_ours(const ModelSpec& spec, int64_t mbs, int64_t seq, int iters, int warmup, Recompute rc) {
  LlamaOptions opt;
  opt.recompute = rc;
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp32, opt);
  model.init_weights(1234);
  const std::vector<ParamSegment> segments = segments_of(model.params());
  AdamW adam({0.9, 0.95, 1e-8, 0.1}, model.params().numel());
  Rng rng(42);
  std::vector<int32_t> tokens(mbs * seq), targets(mbs * seq);
  Result r;
  reset_peak_host_memory();
  for (int it = 0; it < warmup + iters; ++it) {
    for (auto& t : tokens) t = int32_t(rng.next_u64() % spec.vocab_size);
    for (size_t i = 0; i < tokens.size(); ++i) targets[i] = tokens[(i + 1) % tokens.size()];
    auto t0 = Clock::now();
    model.params().zero_grad();
    LlamaContext ctx;
    const double loss = model.forward(ctx, tokens.data(), targets.data(), mbs, seq);
    const double tf = seconds_since(t0);
    auto t1 = Clock::now();
    model.backward(ctx, 1.0);
    const double tb = seconds_since(t1);
    auto t2 = Clock::now();
    clip_grad_norm(model.params().grads().data<float>(), model.params().numel(), 1.0);
    adam.step(model.params().values().data<float>(), model.params().grads().data<float>(), segments, 3e-4);
    const double to = seconds_since(t2);
    if (it == 0) r.loss_first = loss;
    r.loss_last = loss;
    if (it >= warmup) {
      r.forward += tf / iters;
      r.backward += tb / iters;
      r.optimizer += to / iters;
      r.step_time += seconds_since(t0) / iters;
    }
  }
  r.tokens_per_sec = double(mbs * seq) / r.step_time;
  r.peak_bytes = host_memory_stats().peak;
  return r;
}

static Result run_torch(const std::string& preset_path, int64_t mbs, int64_t seq, int iters, int warmup, int threads,
                        bool* ok) {
  const std::string cmd = fmt::format(
      "/usr/bin/python3 {}/benchmarks/engine/torch_llama.py --model {} --micro-batch-size {} --seq-length {} "
      "--iters {} --warmup {} --threads {}",
      PRIMUS_SOURCE_DIR, preset_path, mbs, seq, iters, warmup, threads);
  Result r;
  *ok = false;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  if (pclose(pipe) != 0) {
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

int main(int argc, char** argv) {
  CLI::App app{"Primus CPU engine benchmark: one training step, ours beside PyTorch"};
  std::vector<std::string> models{"llama2c_15M"};
  int64_t mbs = 8, seq = 256;
  int iters = 5, warmup = 1;
  bool torch = true;
  std::string recompute;
  app.add_option("--model", models, "preset names or YAML paths (repeatable)");
  app.add_option("--micro-batch-size", mbs);
  app.add_option("--seq-length", seq);
  app.add_option("--iters", iters, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--recompute-granularity", recompute, "none | selective | full");
  app.add_flag("!--no-torch", torch, "skip the PyTorch peer");
  CLI11_PARSE(app, argc, argv);

  try {
    const int threads = omp_get_max_threads();
    cpu::flush_denormals_to_zero();  // as the PyTorch peer does (torch.set_flush_denormal)
    const double peak = cpu::measure_sgemm_peak_gflops(2048, 4);
    fmt::print("machine: {} threads, SGEMM peak {:.1f} GFLOP/s (2048^3, best of 4)\n", threads, peak);
    for (const auto& name : models) {
      ModelSpec spec = load_model_spec(name);
      ModelStats stats = model_stats(spec, seq);
      fmt::print("\nmodel {}: {:.2f}M parameters, {:.1f} MFLOP/token (training), micro batch {} x seq {}\n",
                 spec.name, stats.parameters / 1e6, stats.flops_per_token / 1e6, mbs, seq);
      Result ours = run_ours(spec, mbs, seq, iters, warmup, parse_recompute(recompute));
      ours.gflops = stats.flops_per_token * ours.tokens_per_sec / 1e9;
      fmt::print("  primus   {:>9.0f} tokens/s  step {:.3f} s (fwd {:.3f}, bwd {:.3f}, optim {:.3f})  "
                 "{:.1f} GFLOP/s  MFU {:.1f}%  peak mem {:.0f} MiB  loss {:.3f} -> {:.3f}\n",
                 ours.tokens_per_sec, ours.step_time, ours.forward, ours.backward, ours.optimizer, ours.gflops,
                 100 * ours.gflops / peak, ours.peak_bytes / 1048576.0, ours.loss_first, ours.loss_last);
      nlohmann::json row{{"model", spec.name},
                         {"micro_batch_size", mbs},
                         {"seq_length", seq},
                         {"threads", threads},
                         {"sgemm_peak_gflops", peak},
                         {"tokens_per_sec", ours.tokens_per_sec},
                         {"gflops", ours.gflops},
                         {"mfu", ours.gflops / peak}};
      if (torch) {
        bool ok = false;
        const std::string path = spec.name.find('/') != std::string::npos || spec.name.ends_with(".yaml")
                                     ? spec.name
                                     : model_preset_dir() + "/" + spec.name + ".yaml";
        Result peer = run_torch(path, mbs, seq, iters, warmup, threads, &ok);
        if (ok) {
          const double peer_gflops = stats.flops_per_token * peer.tokens_per_sec / 1e9;
          fmt::print("  pytorch  {:>9.0f} tokens/s  step {:.3f} s  {:.1f} GFLOP/s  MFU {:.1f}%  loss {:.3f} -> {:.3f}\n",
                     peer.tokens_per_sec, peer.step_time, peer_gflops, 100 * peer_gflops / peak, peer.loss_first,
                     peer.loss_last);
          fmt::print("  ratio    {:.2f}x PyTorch's tokens/s\n", ours.tokens_per_sec / peer.tokens_per_sec);
          row["torch_tokens_per_sec"] = peer.tokens_per_sec;
          row["ratio_vs_torch"] = ours.tokens_per_sec / peer.tokens_per_sec;
        }
      }
      std::cout << "JSON " << row.dump() << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
