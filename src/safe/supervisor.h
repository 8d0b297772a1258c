// The launcher side of the in-flight watch: starts the job (mpirun or one rank) in its own
// process group, copies its stderr to the terminal and to <run_dir>/logs/stderr.log, polls the
// ranks' heartbeats, and acts:
//   - hang: no heartbeat progress from a rank for hang_timeout seconds -> its stack is dumped
//     (gdb, else the rank's own SIGUSR1 handler, plus the kernel stack), the job is killed;
//   - dead rank: a rank's process is gone without saying done/failed (its pid on this host, or
//     mpirun's / srun's report of a task killed by a signal) -> the job is killed if it does not
//     end by itself within a grace period;
//   - straggler: a rank consistently slower than its peers -> a warning event;
//   - failure after training started (a hang, a dead rank, a failed rank) -> relaunch, up to
//     max_restarts times; the trainer's auto-resume continues from the last good checkpoint.
// Every finding is an event in <run_dir>/events.jsonl (events.h).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace primus::safe {

struct SuperviseOptions {
  std::filesystem::path run_dir;
  int world_size = 1;           // 0: as many as the heartbeats say (srun's task count is Slurm's)
  bool watch = true;            // false: start and wait, nothing else (no restarts either)
  int max_restarts = 0;
  double hang_timeout = 600;    // seconds; 0: no hang detection
  std::string nan_policy = "skip";
  double straggler_factor = 1.5;
  double poll_interval = 0.1;   // seconds
  double dead_rank_grace = 10;  // seconds a job may take to end by itself after a rank died
  // Before each restart, with the nodes of the ranks that hung, died or failed (from their
  // heartbeats, or srun's "task N" lines): may change the command (slurm leaves the nodes out).
  std::function<void(std::vector<std::string>& argv, const std::vector<std::string>& failed_nodes)> before_restart;
};

// Runs `argv` with `env` under supervision; returns the exit code of the last attempt (124 when
// it was killed for a hang, 0 when an attempt finished).
int supervise(const std::vector<std::string>& argv, std::map<std::string, std::string> env,
              const SuperviseOptions& options);

// Writes what can be learnt about where process `pid` (rank `rank`) is stuck into `out`: gdb's
// backtrace of every thread when gdb can attach, else the stack the rank writes on SIGUSR1 (see
// train_watch.h), then the kernel stack and wait channel. Returns a one-line summary of what worked.
std::string dump_stack(int pid, int rank, const std::filesystem::path& run_dir, const std::filesystem::path& out);

}  // namespace primus::safe
