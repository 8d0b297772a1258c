// `benchmark checkpoint`: save and load speed of a config's model against the disk's own
// sequential write and read speed, measured in the same run (checkpoint/checkpoint_bench.h):
//
//   primus-cli direct --nproc 2 -- benchmark checkpoint --config exp.yaml [--dir D] [--<key> <value> ...]
//
// Every rank owns and writes 1/N of every tensor (values and both AdamW moments, fp32), as the
// trainer's ranks do; the model's tensors come from the config's model spec (not built).
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_bench.h"
#include "cli/lib/overrides.h"
#include "cli/registry.h"
#include "config/experiment.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "model/model_spec.h"
#include "parallel/mpi_process_group.h"

namespace fs = std::filesystem;

namespace primus::cli {
namespace benchmark_checkpoint_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Options {
  std::string config, dir, format = "text", output;
};

std::string report(const checkpoint::CheckpointBench& r, const std::string& dir, bool json) {
  auto row = [](const char* what, const checkpoint::BenchPhase& p, const checkpoint::BenchPhase& limit) {
    return fmt::format("| {} | {:.1f} | {:.0f} | {:.3f} | {:.0f}% | {:.2f} |\n", what, p.bytes / 1048576.0,
                       p.seconds * 1e3, p.gbps(), limit.gbps() > 0 ? 100 * p.gbps() / limit.gbps() : 0.0,
                       p.cpu_seconds_per_gb());
  };
  if (json) {
    nlohmann::json j{{"ranks", r.ranks}, {"parameters", r.parameters}, {"rank_bytes", r.rank_bytes}, {"dir", dir}};
    for (const auto& [name, p] :
         std::vector<std::pair<const char*, const checkpoint::BenchPhase*>>{{"disk_write", &r.disk_write},
                                                                            {"disk_read", &r.disk_read},
                                                                            {"save", &r.save},
                                                                            {"load", &r.load},
                                                                            {"load_new", &r.load_new},
                                                                            {"load_all", &r.load_all},
                                                                            {"load_shared", &r.load_shared}})
      j[name] = {{"bytes", p->bytes}, {"seconds", p->seconds}, {"gb_per_s", p->gbps()}, {"rank_seconds", p->rank_seconds},
                 {"cpu_seconds", p->cpu_seconds}};
    return j.dump(1) + "\n";
  }
  std::string s = fmt::format(
      "# benchmark checkpoint: {:.2f}M parameters, {} rank(s), each writing 1/{} of every tensor (fp32 values and "
      "two moments), in {}; times are the slowest rank's\n\n",
      r.parameters / 1e6, r.ranks, r.ranks, dir);
  s += "| phase | MiB (all ranks) | ms | GB/s | of the disk's | CPU s per GB |\n|---|---:|---:|---:|---:|---:|\n";
  s += row("disk sequential write (fsync)", r.disk_write, r.disk_write);
  s += row("checkpoint save", r.save, r.disk_write);
  s += row("disk sequential read (4 MiB reads, page cache dropped)", r.disk_read, r.disk_read);
  s += row("checkpoint load (own ranges, into the rank's buffers)", r.load, r.disk_read);
  s += row("checkpoint load (own ranges, into new buffers)", r.load_new, r.disk_read);
  s += row("replicas: every rank the whole state, each reading all", r.load_all, r.disk_read);
  s += row("replicas: every rank the whole state, each reading 1/N, exchanging", r.load_shared, r.disk_read);
  s += "\n| rank | shard MiB | save ms | load ms | load into new ms |\n|---:|---:|---:|---:|---:|\n";
  for (int k = 0; k < r.ranks; ++k)
    s += fmt::format("| {} | {:.1f} | {:.0f} | {:.0f} | {:.0f} |\n", k, r.rank_bytes[size_t(k)] / 1048576.0,
                     r.save.rank_seconds[size_t(k)] * 1e3, r.load.rank_seconds[size_t(k)] * 1e3,
                     r.load_new.rank_seconds[size_t(k)] * 1e3);
  return s;
}

int run(const Options& o, const std::vector<std::string>& extras) {
  if (o.config.empty()) fail("benchmark checkpoint needs --config <experiment.yaml>");
  if (o.format != "text" && o.format != "json") fail("--format must be text or json, got '{}'", o.format);
  const config::ExperimentConfig cfg = config::load_experiment(o.config, key_values(extras));
  parallel::ProcessGroup* world = nullptr;
  if (discover_launch_env().world_size > 1) {
    parallel::init_mpi();
    world = &parallel::mpi_world();
  }
  ParamStore layout;
  for (const ParamInfo& p : model_parameter_layout(cfg.model_spec))
    layout.add(p.name, p.shape, ParamInit::Normal, p.weight_decay);
  const std::string dir = o.dir.empty() ? (fs::path(cfg.checkpoint_dir()).parent_path() / "checkpoint_bench").string() : o.dir;
  const checkpoint::CheckpointBench r = checkpoint::bench_checkpoint(layout, world, dir);
  if (world && world->rank() != 0) return 0;
  const std::string text = report(r, dir, o.format == "json");
  std::cout << text << std::flush;
  if (!o.output.empty()) {
    std::ofstream f(o.output);
    f << text;
    if (!f.flush()) fail("cannot write {}", o.output);
  }
  return 0;
}

TaskAction setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("--config", o->config, "experiment YAML whose model is saved and loaded");
  app.add_option("--dir", o->dir, "where to write (default: checkpoint_bench beside the config's save folder)");
  app.add_option("--format", o->format, "text or json")->capture_default_str();
  app.add_option("--output", o->output, "also write the report to this file");
  app.allow_extras();
  CLI::App* self = &app;
  return [o, self] { return run(*o, self->remaining()); };
}

TaskRegistrar reg{{"benchmark", "checkpoint",
                   "checkpoint save and load speed against the disk's sequential write and read, every rank its shard",
                   setup}};

}  // namespace
}  // namespace primus::cli
