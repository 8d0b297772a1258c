// direct runtime: starts the task on this host.
//   primus-cli direct [--nproc N] -- <task> ...
// The launching process builds the environment (device presets, patches, --env), writes the
// snapshot, runs the pre hooks, starts the ranks and waits, then runs the post hooks. Ranks
// are child processes: one re-run of primus-cli for a single rank (so OpenMP and friends read
// the new environment at start-up), or OpenMP's mpirun for N ranks. A process started as a rank
// (by mpirun, by srun inside a Slurm job step, or by us) skips all that and runs the task.
#include <unistd.h>

#include <iostream>

#include <fmt/format.h>

#include "cli/lib/launch.h"
#include "cli/lib/numa.h"
#include "cli/lib/process.h"
#include "cli/lib/watched_run.h"
#include "cli/registry.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "safe/launcher_link.h"
#include "safe/run_lock.h"
#include "safe/train_watch.h"

namespace primus::cli {
namespace direct_runtime {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct DirectOptions {
  CommonOptions common;
  int nproc = 0;
  std::string run_hooks;  // "pre" | "post": only run that phase's hooks (used by sbatch scripts)
  WatchOptions watch;     // the in-flight watch (src/safe/supervisor.h): on unless --no-watch
};

std::vector<std::string> rank_command(const std::vector<std::string>& task_args) {
  std::vector<std::string> cmd{self_exe(), "direct", "--"};
  cmd.insert(cmd.end(), task_args.begin(), task_args.end());
  return cmd;
}

// A rank: make sure the environment was built on this node, then run the task.
int run_rank(const DirectOptions& o, const std::vector<std::string>& task_args) {
  if (!std::getenv("PRIMUS_ENV_APPLIED")) {
    // Started by srun (the submitting host built nothing for this node): build the
    // environment here, where the device is, and start over with it.
    LaunchEnv where = discover_launch_env();
    PrepareOptions p;
    p.rank_mode = true;
    p.local_world_size = where.local_world_size;
    Launch L = prepare_launch("direct", o.common, task_args, p);
    if (where.rank == 0) update_snapshot_host(L.snapshot_dir(), L.env, L.device);
    exec_replace(rank_command(L.line.task_args), L.env.full());
  }
  export_rank_variables();
  safe::die_with_launcher();  // no trainer outlives `primus-cli direct`, even one killed with SIGKILL
  log::init_from_env();
  LaunchEnv e = discover_launch_env();
  // Before the task's threads exist, so that they inherit the binding.
  if (const char* numa = std::getenv("PRIMUS_NUMA"); numa && std::string(numa) == "1")
    log::info("numa: {}", bind_rank_to_numa_node(e.local_rank, e.local_world_size));
  log::debug("rank {} of {} (local {} of {}) on {}, started by {}", e.rank, e.world_size, e.local_rank,
             e.local_world_size, e.node, e.launcher);
  int rc = run_task(task_args);
  log::flush();
  return rc;
}

int launch(const DirectOptions& o, const std::vector<std::string>& task_args) {
  if (is_launched_rank()) return run_rank(o, task_args);
  safe::parse_nan_policy(o.watch.nan_policy);  // a typo fails here, before anything starts
  PrepareOptions p;
  p.nproc = o.nproc;
  Launch L = prepare_launch("direct", o.common, task_args, p);
  if (L.opt.print_env) {
    std::cout << L.describe();
    return 0;
  }
  HookSet hooks = L.hooks();
  if (!o.run_hooks.empty()) {
    if (o.run_hooks != "pre" && o.run_hooks != "post") fail("--run-hooks must be pre or post, got '{}'", o.run_hooks);
    auto& list = o.run_hooks == "pre" ? hooks.pre : hooks.post;
    if (L.opt.dry_run) {
      for (auto& h : list) std::cout << "hook " << o.run_hooks << ": " << h.string() << "\n";
      return 0;
    }
    run_hooks(list, o.run_hooks, L.line.task_args, L.env.full());
    return 0;
  }


  std::vector<std::string> cmd;
  if (L.nproc == 1) {
    L.env.set("PRIMUS_LAUNCHED", "1", "runtime");
    for (auto [k, v] : {std::pair{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_WORLD_SIZE", "1"}})
      L.env.set(k, v, "runtime");
    cmd = rank_command(L.line.task_args);
  } else {
    auto mpirun = find_program("mpirun");
    if (!mpirun) fail("direct --nproc {} starts ranks with OpenMPI's mpirun, which is not on PATH (Debian: openmpi-bin)", L.nproc);
    if (geteuid() == 0) {
      L.env.set("OMPI_ALLOW_RUN_AS_ROOT", "1", "runtime (running as root)");
      L.env.set("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", "runtime (running as root)");
    }
    // --bind-to none: OpenMPI pins each rank to one core by default, which would squeeze a
    // rank's OpenMP threads onto it.
    cmd = {*mpirun, "-np", std::to_string(L.nproc), "--oversubscribe", "--bind-to", "none"};
    auto r = rank_command(L.line.task_args);
    cmd.insert(cmd.end(), r.begin(), r.end());
  }

  if (L.opt.dry_run) {
    std::cout << "# dry run: nothing is started, nothing is written\n" << L.describe();
    std::cout << "# run folder: " << L.run_dir.string() << "\n";
    for (auto& h : hooks.pre) std::cout << "hook pre: " << h.string() << "\n";
    for (auto& h : hooks.post) std::cout << "hook post: " << h.string() << "\n";
    std::cout << "command: " << join_command(cmd) << "\n";
    return 0;
  }

  // A config, layout or memory error is said once, here, rather than by every rank.
  if (L.line.task == "train" && (L.line.subtask == "pretrain" || L.line.subtask == "posttrain")) {
    for (const auto& [k, v] : L.env.full()) ::setenv(k.c_str(), v.c_str(), 1);  // ${VAR}s as the ranks see them
    std::vector<std::string> check = L.line.task_args;
    check.insert(check.end(), {"--check-for-ranks", std::to_string(L.nproc)});
    if (const int rc = run_task(check); rc != 0) return rc;
  }
  // One training run per run folder: a second one stops here, before it writes anything there.
  safe::RunLock lock;
  if (L.line.task == "train") lock = safe::RunLock::acquire(L.run_dir, "primus-cli direct launcher");
  L.write_snapshot(invocation().runtime_args);
  std::cerr << fmt::format("primus-cli: run folder {} (snapshot in snapshot/, logs in logs/)\n", L.run_dir.string());
  WatchedCommand c;
  c.argv = cmd;
  c.env = L.env.full();
  if (lock.held()) c.env["PRIMUS_RUN_LOCK_TOKEN"] = lock.token();
  c.hook_env = c.env;
  c.world_size = L.nproc;
  return run_watched(L, o.watch, std::move(c));
}

RuntimeRegistrar reg{{"direct", "run the task on this host (N ranks through mpirun with --nproc N)",
                      [](CLI::App& app) -> RuntimeLauncher {
                        auto o = std::make_shared<DirectOptions>();
                        add_common_options(app, o->common);
                        app.add_option("--nproc,-n", o->nproc,
                                       "ranks to start on this host (default: PRIMUS_NPROC, .primus.yaml, the GPU count, 1)")
                            ->check(kAtLeastOne);
                        add_watch_options(app, o->watch, false);
                        app.add_option("--run-hooks", o->run_hooks, "only run the pre or post hooks of the task (sbatch scripts use it)")
                            ->group("");
                        return [o](const std::vector<std::string>& task_args) { return launch(*o, task_args); };
                      }}};

}  // namespace
}  // namespace primus::cli
