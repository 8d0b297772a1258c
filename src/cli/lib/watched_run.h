// The end of every launch that starts ranks (direct, slurm srun, the job of slurm sbatch): pre
// hooks, the command under the in-flight watch (safe/supervisor.h: hangs with stack dumps, dead
// ranks, NaN, stragglers, --max-restarts from the last good checkpoint) or, with --no-watch, just
// the command, then post hooks with PRIMUS_TASK_EXIT_CODE.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli/lib/hooks.h"
#include "cli/lib/launch.h"
#include "cli/lib/process.h"

namespace primus::cli {

struct WatchedCommand {
  std::vector<std::string> argv;
  EnvMap env;          // the command's environment
  EnvMap hook_env;     // the hooks'
  int world_size = 0;  // ranks; 0: as the ranks' heartbeats say
  // Called before each restart with the nodes of the ranks that failed: may change argv (slurm
  // leaves those nodes out).
  std::function<void(std::vector<std::string>& argv, const std::vector<std::string>& failed_nodes)> before_restart;
};

int run_watched(const Launch& L, const WatchOptions& w, WatchedCommand c);

}  // namespace primus::cli
