// The rank side of the in-flight watch, made by the trainer once it knows where it resumes:
//
//   safe::TrainWatch watch(cfg.run_dir(), state.iteration);
//   loop: watch.begin_step(it)                 test faults: kill, stall, slow
//         ... forward / backward ...
//         watch.inject_faults(it, grads, n)    test fault: NaN in the gradients
//         if (watch.check(it, loss, grad_norm) == safe::StepAction::Skip) -> no optimizer update
//         watch.end_step(it, loss, grad_norm, step_time[, compute_time])
//   watch.phase("eval", it); watch.before_save(it); watch.finish(it)
//
// It writes the heartbeat the launcher polls (heartbeat.h), applies the NaN/Inf policy, detects
// loss spikes, records events (events.h), and on SIGUSR1 writes this process's stack to
// <run_dir>/watch/stack_rank_<r>.txt (the launcher's fallback when gdb cannot attach).
//
// Settings (environment; `primus-cli direct` sets them from its options):
//   PRIMUS_NAN_POLICY   skip (default): a step whose loss or gradient norm is NaN/Inf makes no
//                       update; after PRIMUS_NAN_MAX_SKIPS (3) such steps in a row it stops.
//                       stop: fail at once. warn: record it and update anyway.
//   PRIMUS_SPIKE_ZSCORE robust z-score above which a loss is a spike (6; 0 turns it off),
//   PRIMUS_SPIKE_WINDOW losses in the window (50),
//   PRIMUS_WATCH=0      no heartbeats (the policy still applies),
//   PRIMUS_RESTART_COUNT restarts before this launch (set by the launcher; shown in metrics).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/tensor.h"
#include "safe/detect.h"
#include "safe/fault.h"
#include "safe/heartbeat.h"

namespace primus::safe {

enum class NanPolicy { Warn, Skip, Stop };
NanPolicy parse_nan_policy(const std::string& s);  // throws primus::Error on an unknown name
const char* nan_policy_name(NanPolicy p);

enum class StepAction { Continue, Skip };

class TrainWatch {
 public:
  TrainWatch(const std::filesystem::path& run_dir, int64_t start_iteration);
  ~TrainWatch();
  TrainWatch(const TrainWatch&) = delete;
  TrainWatch& operator=(const TrainWatch&) = delete;

  void begin_step(int64_t iteration);
  void inject_faults(int64_t iteration, float* grads, int64_t n);
  void inject_faults(int64_t iteration, const Tensor& grads);  // a flat fp32 buffer on any device
  // NaN/Inf policy and loss-spike detection for the step about to be applied. Throws
  // primus::Error when the policy says stop.
  StepAction check(int64_t iteration, double loss, double grad_norm);
  // compute_time: the part of the step spent computing rather than waiting for peers (what
  // straggler detection compares); < 0 means the whole step.
  void end_step(int64_t iteration, double loss, double grad_norm, double step_time, double compute_time = -1);
  void phase(const std::string& name, int64_t iteration);
  void before_save(int64_t iteration);  // heartbeat "save" + the kill-during-checkpoint fault
  void finish(int64_t iteration);       // heartbeat "done"

  int restarts() const { return restarts_; }
  int64_t skipped_iterations() const { return skipped_; }
  NanPolicy nan_policy() const { return policy_; }

 private:
  void beat(const std::string& phase, int64_t iteration);
  bool nan_fault_due(int64_t iteration, int64_t n);  // claims the fault and logs it
  void event(const std::string& kind, const std::string& severity, const std::string& message, int64_t iteration);

  std::filesystem::path run_dir_;
  bool heartbeats_ = true;
  NanPolicy policy_ = NanPolicy::Skip;
  int max_skips_ = 3;
  int consecutive_skips_ = 0;
  int64_t skipped_ = 0;
  int restarts_ = 0;
  double spike_z_ = 6;
  SpikeDetector spikes_;
  Faults faults_;
  Heartbeat hb_;
  bool heartbeat_failing_ = false;  // the last write failed (said on stderr once)
  bool finished_ = false;
};

}  // namespace primus::safe
