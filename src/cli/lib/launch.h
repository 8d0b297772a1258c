// What every runtime does before it starts anything: read the options shared by all runtimes,
// the task line, .primus.yaml and PRIMUS_* defaults, a snapshot to replay; pick the workspace
// and experiment name; detect the device and build the layered environment (env_plan.h).
// The runtimes (src/cli/runtimes/) then only decide how processes start.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/lib/env_plan.h"
#include "cli/lib/gpu.h"
#include "cli/lib/hooks.h"
#include "cli/lib/project_file.h"
#include "cli/lib/snapshot.h"

namespace primus::cli {

// Options every runtime accepts.
struct CommonOptions {
  bool dry_run = false;    // print the commands and environment, start nothing
  bool print_env = false;  // print the effective environment with sources, start nothing
  bool force = false;      // replay even when hardware or versions differ
  bool numa = false, no_numa = false;  // bind each rank to its GPU's NUMA node (cli/lib/numa.h)
  std::vector<std::string> env, patches, hooks_dirs;
  std::string log_ranks, workspace, exp_name, replay;
};
void add_common_options(CLI::App& app, CommonOptions& o);
// For runtimes that pass unknown flags through (slurm): is `name` one of ours, with a value?
bool common_option_arity(const std::string& name, bool& takes_value);

// The in-flight watch's options (src/safe/supervisor.h), for the runtimes that start ranks and
// watch them: direct and slurm (srun, and sbatch's job, which runs a watched srun).
struct WatchOptions {
  bool no_watch = false;
  int max_restarts = 0;
  double hang_timeout = 600;
  std::string nan_policy = "skip";
  bool exclude_failed_nodes = false;         // slurm: a restart leaves out the nodes of the ranks that failed
  std::vector<std::string> forward() const;  // the options again, for a primus-cli started by a batch script
};
// `slurm`: also --exclude-failed-nodes.
void add_watch_options(CLI::App& app, WatchOptions& o, bool slurm);
bool watch_option_arity(const std::string& name, bool& takes_value);

// The part of the command line after "--": optionally a nested runtime ("container --image I
// --"), then the task, its subtask and its options.
struct TaskLine {
  std::vector<std::string> nested;     // {"container", "--image", "I"} (without the "--")
  std::vector<std::string> task_args;  // {"train", "pretrain", "--config", "c.yaml"}
  std::string task, subtask;
  std::optional<std::string> config;   // the --config value, if any
  std::vector<std::string> all() const;  // nested + "--" + task_args, or task_args
};
TaskLine parse_task_line(const std::vector<std::string>& args);

struct PrepareOptions {
  bool allow_nested = false;
  int nproc = 0;            // from the runtime's --nproc; 0: not given
  bool rank_mode = false;   // preparing inside a rank (srun task): no replay, no snapshot
  int local_world_size = 0; // rank mode: ranks on this node
};

struct Launch {
  std::string runtime;
  CommonOptions opt;
  TaskLine line;
  ProjectFile project;
  std::vector<std::pair<std::string, Setting>> settings;  // shown by --print-env
  std::string workspace, exp_name;
  std::filesystem::path run_dir;
  std::optional<Snapshot> replay;
  int nproc = 1;
  DeviceInfo device;
  EnvPlan env;
  std::vector<std::string> patches, hooks_dirs;  // absolute
  std::string log_ranks = "0";
  bool numa = false;  // --numa / --no-numa, PRIMUS_NUMA, .primus.yaml numa (PRIMUS_NUMA in the ranks' environment)

  std::filesystem::path snapshot_dir() const { return run_dir / "snapshot"; }
  std::string describe() const;
  HookSet hooks() const;
  void write_snapshot(const std::vector<std::string>& runtime_args) const;
  // Options that carry this launch's choices to an inner `primus-cli direct` (ranks under
  // Slurm, the command inside a container).
  std::vector<std::string> forward_options(bool with_hooks_dirs) const;
};

Launch prepare_launch(const std::string& runtime, const CommonOptions& opt, const std::vector<std::string>& task_args,
                      const PrepareOptions& p);

// The project folder (configs/envs, hooks): PRIMUS_ROOT or the source tree primus-cli was built from.
std::filesystem::path project_root();

// Rank-mode variables for a process: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_*.
void export_rank_variables();

}  // namespace primus::cli
