// projection memory|performance|both (Primus's command): per-rank memory and step time of an
// experiment config at a target scale (src/projection/projection.h).
//
//   primus-cli direct -- projection both --config exp.yaml [--<key> <value> ...] [--target-nodes N]
//        [--gpus-per-node G] [--hardware-config H100|H200|MI300X|MI325X|MI355X|CPU|file.yaml]
//        [--profiling-mode benchmark|simulate] [--sharding no_shard|zero1|zero2|fsdp] [--router-load RUN]
//        [--format text|json]
//
// benchmark (the default on this machine's CPU) times each op on the backend the trainer would
// use here; simulate (the default for a named GPU) uses the hardware's roofline.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <omp.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "cli/lib/overrides.h"
#include "cli/registry.h"
#include "config/experiment.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "parallel/mpi_process_group.h"
#include "projection/projection.h"
#include "train/compute.h"

namespace primus::cli {
namespace projection_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Options {
  std::string config, hardware = "CPU", mode, sharding, format = "text", output, router_load;
  int nodes = 0, gpus_per_node = 0;
};

trace::Hardware hardware_of(const std::string& name);

// A hardware file: the keys of trace::Hardware (name, peak_tflops, memory_gb,
// memory_bandwidth_gbs, link_gbs, link_latency_us, nic_gbs, nic_latency_us, gpus_per_node),
// optionally on top of `base:` (a named machine or CPU), e.g. this machine's CPU with the link
// latency and bandwidth preflight measured.
trace::Hardware hardware_from_file(const std::string& path) {
  YAML::Node n;
  try {
    n = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    fail("--hardware-config {}: {}", path, e.what());
  }
  if (n["hardware_config"]) n = n["hardware_config"];
  if (!n.IsMap()) fail("--hardware-config {}: expected a map of the hardware's numbers", path);
  const bool based = bool(n["base"]);
  trace::Hardware h = based ? hardware_of(n["base"].as<std::string>()) : trace::Hardware{};
  if (n["name"]) h.name = n["name"].as<std::string>();
  else if (!based) h.name = path;
  if (!based) h.description = h.name;
  h.source = based ? h.source + ", with " + path : path;
  auto num = [&](const char* key, double& v, bool required) {
    if (!n[key]) {
      if (required) fail("--hardware-config {}: '{}' is missing", path, key);
      return;
    }
    try {
      v = n[key].as<double>();
    } catch (const YAML::Exception&) {
      fail("--hardware-config {}: '{}' must be a number", path, key);
    }
    if (v < 0) fail("--hardware-config {}: '{}' must not be negative", path, key);
  };
  num("peak_tflops", h.peak_tflops, !based);
  num("memory_bandwidth_gbs", h.memory_bandwidth_gbs, !based);
  num("memory_gb", h.memory_gb, false);
  num("link_gbs", h.link_gbs, !based);
  num("link_latency_us", h.link_latency_us, false);
  num("nic_gbs", h.nic_gbs, false);
  num("nic_latency_us", h.nic_latency_us, false);
  double g = based ? h.gpus_per_node : 8;
  num("gpus_per_node", g, false);
  h.gpus_per_node = int(g);
  if (h.nic_gbs == 0) h.nic_gbs = h.link_gbs;
  for (auto kv : n) {
    const std::string k = kv.first.as<std::string>();
    static const std::vector<std::string> known = {"base", "name", "peak_tflops", "memory_bandwidth_gbs", "memory_gb",
                                                   "link_gbs", "link_latency_us", "nic_gbs", "nic_latency_us",
                                                   "gpus_per_node"};
    if (std::find(known.begin(), known.end(), k) == known.end())
      fail("--hardware-config {}: unknown key '{}'{}", path, k, did_you_mean(k, known));
  }
  return h;
}

trace::Hardware hardware_of(const std::string& name) {
  std::string lower = name;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "cpu") return trace::this_cpu();
  if (const trace::Hardware* h = trace::find_hardware(name); h && h->name.size() == name.size()) return *h;
  if (lower.ends_with(".yaml") || lower.ends_with(".yml")) return hardware_from_file(name);
  fail("--hardware-config {} is not one of: {} (or a YAML file with the hardware's numbers)", name,
       fmt::format("{}", fmt::join(trace::hardware_names(), ", ")));
}

// A run's measured MoE load: the tokens per expert of each MoE layer in the last metrics.jsonl row
// that has them (the trainer logs them as moe_expert_load at every log interval).
ops::RouterLoad router_load_from(const std::string& path) {
  const std::string file = std::filesystem::is_directory(path) ? path + "/metrics.jsonl" : path;
  std::ifstream in(file);
  if (!in) fail("--router-load {}: cannot read it (give a run folder or its metrics.jsonl)", file);
  nlohmann::json last;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("moe_expert_load") == std::string::npos) continue;
    try {
      last = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("--router-load {}: a line is not JSON: {}", file, e.what());
    }
  }
  if (last.is_null() || !last["moe_expert_load"].is_array())
    fail("--router-load {}: no row with moe_expert_load (the tokens per expert an MoE run logs)", file);
  ops::RouterLoad load;
  for (const auto& layer : last["moe_expert_load"])
    load.per_layer[layer.at("layer").get<int64_t>()] = layer.at("tokens_per_expert").get<std::vector<double>>();
  return load;
}

int run(const std::string& what, const Options& o, const std::vector<std::string>& extras) {
  if (o.config.empty()) fail("projection {} needs --config <experiment.yaml>", what);
  const config::ExperimentConfig cfg = config::load_experiment(o.config, key_values(extras));
  parallel::ProcessGroup* world = nullptr;
  if (discover_launch_env().world_size > 1) {
    parallel::init_mpi();
    world = &parallel::mpi_world();
  }
  projection::Target t;
  t.nodes = o.nodes;
  t.gpus_per_node = o.gpus_per_node;
  t.hardware = hardware_of(o.hardware);
  if (!o.sharding.empty()) t.sharding = projection::parse_sharding(o.sharding);
  if (!o.router_load.empty()) t.load = router_load_from(o.router_load);
  // This machine's CPU with several ranks here: the link between them as it is now.
  if (world && t.hardware.measured && !o.hardware.ends_with(".yaml")) {
    const projection::Link l = projection::measure_link(*world);
    t.hardware.link_gbs = t.hardware.nic_gbs = l.gbs;
    t.hardware.link_latency_us = t.hardware.nic_latency_us = l.latency_us;
    t.hardware.source += fmt::format("; link between the ranks measured now: {:.1f} us, {:.2f} GB/s", l.latency_us, l.gbs);
  }
  projection::Projection p = projection::plan(cfg, t);
  if (what != "performance") projection::project_memory(p);
  if (what != "memory") {
    const std::string mode = o.mode.empty() ? (t.hardware.measured ? "benchmark" : "simulate") : o.mode;
    if (mode == "benchmark") {
      if (!t.hardware.measured)
        fail("--profiling-mode benchmark times ops on this machine, but --hardware-config {} names another: use "
             "--profiling-mode simulate (its roofline) or --hardware-config CPU",
             o.hardware);
      // Each rank of this machine gets its share of the cores, unless OMP_NUM_THREADS says otherwise.
      const char* env = std::getenv("OMP_NUM_THREADS");
      if (!env || !*env) {
        const int ranks_here = std::max(1, std::min(p.layout.world_size, p.gpus_per_node));
        omp_set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / ranks_here));
      }
      train::Compute compute = train::choose_compute(cfg.train, 0);
      // Started as several ranks (direct --nproc N), every rank measures at once, in step, so
      // that the ops see the cores shared as the training's ranks share them; rank 0 reports.
      std::function<void()> sync;
      if (world) sync = [world] { world->barrier(); };
      projection::MeasuredOps timer(*compute.backend, sync);
      projection::project_performance(p, timer);
    } else {
      projection::RooflineOps timer(t.hardware);
      projection::project_performance(p, timer);
    }
  }
  if (world && world->rank() != 0) return 0;
  const std::string text = o.format == "json" ? projection::to_json(p).dump(2) + "\n" : projection::to_text(p);
  if (o.output.empty()) {
    std::cout << text;
  } else {
    std::ofstream out(o.output);
    if (!out || !(out << text)) fail("cannot write {}", o.output);
  }
  return 0;
}

TaskSetup setup(const std::string& what) {
  return [what](CLI::App& app) -> TaskAction {
    auto o = std::make_shared<Options>();
    app.add_option("--config", o->config, "experiment YAML; any config key may follow as --key value");
    // 0 inside means "not given" (the default); given, they must be 1 or more.
    app.add_option("--target-nodes", o->nodes, "nodes to project for (default: the fewest that hold tp x pp x cp)")
        ->check(kAtLeastOne);
    app.add_option("--gpus-per-node", o->gpus_per_node,
                   "ranks per node (default: 8 for a named GPU; on this machine's CPU tp x pp x cp)")
        ->check(kAtLeastOne);
    app.add_option("--hardware-config", o->hardware,
                   "H100, H200, MI300X, MI325X, MI355X, CPU (this machine, measured) or a YAML file")
        ->capture_default_str();
    app.add_option("--profiling-mode", o->mode,
                   "benchmark: time the ops on this machine; simulate: the hardware's roofline (default: benchmark "
                   "for CPU, simulate for a named GPU)")
        ->check(CLI::IsMember({"benchmark", "simulate"}));
    app.add_option("--sharding", o->sharding,
                   "no_shard | zero1 | zero2 | fsdp, or Megatron's optim | optim_grads | optim_grads_params (default: "
                   "the config's data_parallel_sharding_strategy)")
        ->check(CLI::IsMember({"no_shard", "zero1", "zero2", "fsdp", "optim", "optim_grads", "optim_grads_params"}));
    app.add_option("--router-load", o->router_load,
                   "an MoE run's folder (or metrics.jsonl): route by its measured tokens per expert instead of "
                   "balanced");
    app.add_option("--format", o->format, "output format")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
    app.add_option("--output", o->output, "write to this file instead of stdout");
    app.allow_extras();
    CLI::App* self = &app;
    return [what, o, self] { return run(what, *o, self->remaining()); };
  };
}

TaskRegistrar reg_memory{{"projection", "memory", "memory per rank of a config at a target scale", setup("memory")}};
TaskRegistrar reg_perf{{"projection", "performance", "step time, tokens/s and MFU of a config at a target scale",
                        setup("performance")}};
TaskRegistrar reg_both{{"projection", "both", "memory and performance projections together", setup("both")}};

}  // namespace
}  // namespace primus::cli
