// `preflight check [--host] [--gpu] [--network] [--storage] [--report out.md]`: checks the machines
// before a run (src/safe/preflight.h). Without a section flag, all sections run. Run it with the
// ranks of the job to check their network: `primus-cli direct --nproc 2 -- preflight check`.
// Rank 0 prints the Markdown report and writes it (and its JSON twin) to the run folder and to
// --report; the exit code is 1 when a check failed.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "parallel/mpi_process_group.h"
#include "safe/events.h"
#include "safe/preflight.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::cli {
namespace preflight_check_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct PreflightOptions {
  bool host = false, gpu = false, network = false, storage = false;
  std::string report, json_report, checkpoint_path;
  std::vector<std::string> storage_paths;
  double storage_mb = 64, p2p_mb = 4, max_allreduce_mb = 16;
};

// Gathers every rank's results (JSON text).
std::vector<safe::CheckResult> gather(parallel::ProcessGroup& pg, const std::vector<safe::CheckResult>& mine) {
  json arr = json::array();
  for (const auto& c : mine) arr.push_back(safe::to_json(c));
  std::vector<safe::CheckResult> out;
  for (const std::string& text : parallel::all_gather_strings(pg, arr.dump()))
    for (const auto& j : json::parse(text)) out.push_back(safe::check_from_json(j));
  return out;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  if (!f.flush()) fail("cannot write the preflight report to '{}'", p.string());
}

int run(const PreflightOptions& o) {
  const bool all = !(o.host || o.gpu || o.network || o.storage);
  fs::path md = o.report, js = o.json_report;
  if (!md.empty() && js.empty()) js = fs::path(md).replace_extension(".json");
  // Before anything runs (and before any rank enters MPI): a report that cannot be written.
  if (!md.empty()) safe::check_report_path(md);
  if (!js.empty()) safe::check_report_path(js);
  if (o.storage_mb <= 0 || o.p2p_mb <= 0 || o.max_allreduce_mb <= 0)
    fail("--storage-mb, --p2p-mb and --max-allreduce-mb must be positive");

  const LaunchEnv where = discover_launch_env();
  std::vector<safe::CheckResult> mine;
  // Per node: the checks of the machine itself.
  if (where.local_rank == 0) {
    if (all || o.host) {
      auto h = safe::host_checks();
      mine.insert(mine.end(), h.begin(), h.end());
    }
    if (all || o.gpu) {
      auto g = safe::gpu_checks();
      mine.insert(mine.end(), g.begin(), g.end());
    }
    if (all || o.storage) {
      std::vector<fs::path> paths;
      for (const auto& p : o.storage_paths) paths.emplace_back(p);
      if (paths.empty()) {
        const char* ws = std::getenv("PRIMUS_WORKSPACE");
        paths.emplace_back(ws && *ws ? ws : "./output");
      }
      if (!o.checkpoint_path.empty()) paths.emplace_back(o.checkpoint_path);
      auto s = safe::storage_checks(paths, int64_t(o.storage_mb * (1 << 20)));
      mine.insert(mine.end(), s.begin(), s.end());
    }
  }
  std::vector<safe::CheckResult> results;
  if (where.world_size > 1) {
    parallel::init_mpi();
    auto& world = parallel::mpi_world();
    if (all || o.network) {
      safe::NetworkOptions no;
      no.p2p_bytes = int64_t(o.p2p_mb * (1 << 20));
      no.allreduce_bytes.clear();
      for (int64_t b = 1 << 13; b <= int64_t(o.max_allreduce_mb * (1 << 20)); b *= 8) no.allreduce_bytes.push_back(b);
      auto n = safe::network_checks(world, no);
      mine.insert(mine.end(), n.begin(), n.end());
    }
    results = gather(world, mine);
  } else {
    results = mine;
    if (all || o.network)
      results.push_back({"network", "network", "skip", "1 rank",
                         "the network checks need 2+ ranks: primus-cli direct --nproc 2 -- preflight check", host_name(), 0});
  }
  if (where.rank != 0) return 0;

  safe::PreflightReport report;
  report.checks = results;
  report.host = host_name();
  report.time = safe::iso_time(safe::now_epoch());
  report.world_size = where.world_size;
  const std::string text = safe::render_markdown(report);
  const std::string jtext = safe::render_json(report).dump(2) + "\n";
  std::cout << text << std::flush;
  if (auto rd = primus::run_dir()) {
    write_text(*rd / "preflight.md", text);
    write_text(*rd / "preflight.json", jtext);
  }
  if (!md.empty()) write_text(md, text);
  if (!js.empty()) write_text(js, jtext);
  const int fails = report.count("fail");
  if (fails > 0) {
    std::vector<std::string> names;
    for (const auto& c : results)
      if (c.status == "fail") names.push_back(fmt::format("{} on {}", c.name, c.node));
    std::cerr << fmt::format("preflight: {} check(s) failed: {}\n", fails, fmt::join(names, "; "));
    return 1;
  }
  return 0;
}

TaskRegistrar reg{{"preflight", "check", "check hosts, GPUs, network and storage before a run",
                   [](CLI::App& app) -> TaskAction {
                     auto o = std::make_shared<PreflightOptions>();
                     app.add_flag("--host", o->host, "CPU, memory, limits, clock, versions");
                     app.add_flag("--gpu", o->gpu, "GPU count, model, memory, driver, ECC, clocks (skipped without GPUs)");
                     app.add_flag("--network", o->network, "p2p latency/bandwidth per pair and all-reduce bus bandwidth (2+ ranks)");
                     app.add_flag("--storage", o->storage, "free space, write and read speed of the workspace and checkpoint path");
                     app.add_option("--report", o->report, "write the Markdown report here (and the JSON beside it, .json)");
                     app.add_option("--json", o->json_report, "write the JSON report here");
                     app.add_option("--storage-path", o->storage_paths, "folder to test (repeatable; default: the workspace)");
                     app.add_option("--checkpoint-path", o->checkpoint_path, "checkpoint folder to test as well");
                     app.add_option("--storage-mb", o->storage_mb, "MiB written per storage path (default 64)");
                     app.add_option("--p2p-mb", o->p2p_mb, "message size of the p2p bandwidth test in MiB (default 4)");
                     app.add_option("--max-allreduce-mb", o->max_allreduce_mb, "largest all-reduce in MiB (default 16)");
                     app.footer("Without a section flag all sections run. Exit code 1 when a check fails.");
                     return [o]() { return run(*o); };
                   }}};

}  // namespace
}  // namespace primus::cli
