// Megatron's clean early exits (`exit_signal_handler`, `exit_duration_in_mins`): the trainer stops
// after the step in progress, saves a checkpoint and ends with exit code 0, before a job's time
// limit takes it down mid-step.
//
//   exit_signal_handler: true   SIGTERM (what Slurm sends at the time limit, KillWait seconds before
//                               SIGKILL, or earlier with sbatch --signal=TERM@SECONDS; what
//                               scancel sends) is caught instead of ending the process.
//   exit_duration_in_mins: M    stop once M minutes have passed since the trainer started.
//
// due() is collective over `world` (every rank reaches the same decision, as Megatron's MAX
// all-reduce) and costs one all-reduce per step only when one of the two is on.
#pragma once

#include <chrono>
#include <string>

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::safe {

class EarlyExit {
 public:
  EarlyExit(bool signal_handler, double duration_minutes);
  ~EarlyExit();  // the previous SIGTERM action comes back
  EarlyExit(const EarlyExit&) = delete;
  EarlyExit& operator=(const EarlyExit&) = delete;

  bool due(parallel::ProcessGroup& world);
  // Why due() said yes: "received SIGTERM" or "45.0 minutes passed (exit_duration_in_mins 45)".
  const std::string& reason() const { return reason_; }

 private:
  bool signal_handler_;
  double minutes_;
  std::chrono::steady_clock::time_point start_;
  std::string reason_;
};

}  // namespace primus::safe
