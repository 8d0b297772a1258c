// Heartbeats: each training rank rewrites <run_dir>/watch/rank_<r>.json after every step and at
// every phase change (start, eval, save, done, failed). The launcher polls these files. Plain
// files work wherever the run folder is shared (NFS, Lustre under Slurm) and survive a crash for
// the post-mortem. A file is replaced by rename, so a reader never sees half of one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace primus::safe {

struct Heartbeat {
  int rank = 0, world_size = 1;
  int pid = 0;
  std::string host;
  std::string slurm_step;       // "<job>.<step>" when the rank is a Slurm task (its stack can be asked for there)
  int64_t iteration = 0;        // the last iteration finished
  std::string phase = "start";  // start | step | eval | save | done | failed
  double step_time = 0;         // seconds, the last step
  double compute_time = 0;      // seconds of the last step spent computing (not waiting on peers)
  double loss = 0, grad_norm = 0;
  double time = 0;              // wall clock (epoch seconds) when written
  int64_t beat = 0;             // increases with every write: progress of any kind
  int restarts = 0;
  // (iteration, compute_time) of the last few steps, so that the launcher sees every step even
  // when steps are faster than it polls.
  std::vector<std::pair<int64_t, double>> recent;
};
inline constexpr size_t kHeartbeatRecentSteps = 8;

std::filesystem::path watch_dir(const std::filesystem::path& run_dir);
std::filesystem::path heartbeat_path(const std::filesystem::path& run_dir, int rank);

// Returns "" when written, else why not ("cannot write <path>: No space left on device"): the rank
// says so on stderr (heartbeat_unwritable_line), so the launcher can tell a full disk from a hang.
// PRIMUS_FAULT_HEARTBEAT="from=<iteration>" makes every write from that iteration fail with ENOSPC
// (fault-injection tests).
std::string write_heartbeat(const std::filesystem::path& run_dir, const Heartbeat& hb);

// The line a rank prints on stderr when its heartbeat cannot be written, and its parser (the
// launcher's side): rank, pid, host and the reason.
std::string heartbeat_unwritable_line(const Heartbeat& hb, const std::string& reason);
struct UnwritableHeartbeat {
  int rank = 0, pid = 0;
  std::string host, reason;
};
std::vector<UnwritableHeartbeat> parse_unwritable_heartbeats(const std::string& text);
std::optional<Heartbeat> read_heartbeat(const std::filesystem::path& file);
// Every rank_<r>.json in the run's watch folder, by rank.
std::map<int, Heartbeat> read_heartbeats(const std::filesystem::path& run_dir);
// Removes the heartbeats of an earlier launch (not the fault markers or stack dumps).
void clear_heartbeats(const std::filesystem::path& run_dir);

}  // namespace primus::safe
