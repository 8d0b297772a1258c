#include "safe/train_watch.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <exception>
#include <limits>
#include <thread>

#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "safe/events.h"

namespace fs = std::filesystem;

namespace primus::safe {
namespace {

char g_stack_file[4096];  // where the SIGUSR1 handler writes; set before the handler is installed

void write_str(int fd, const char* s) { (void)!::write(fd, s, std::strlen(s)); }

// Async-signal-safe enough for a debugging aid: open/write/close are; backtrace() was called once
// at install time so its library is already loaded.
void dump_stack_handler(int) {
  const int fd = ::open(g_stack_file, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  write_str(fd, "--- stack of the main thread (SIGUSR1 from the primus watch) ---\n");
  void* frames[128];
  const int n = ::backtrace(frames, 128);
  ::backtrace_symbols_fd(frames, n, fd);
  write_str(fd, "\n");
  ::close(fd);
}

void install_stack_handler(const fs::path& file) {
  std::snprintf(g_stack_file, sizeof g_stack_file, "%s", file.c_str());
  void* warm[4];
  (void)::backtrace(warm, 4);
  struct sigaction sa{};
  sa.sa_handler = dump_stack_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
}

double env_double(const char* name, double dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (*end || !std::isfinite(d) || d < 0) fail("{}='{}' is not a non-negative number", name, v);
  return d;
}

void die_now() {
  log::flush();
  ::raise(SIGKILL);
}

}  // namespace

NanPolicy parse_nan_policy(const std::string& s) {
  if (s == "warn") return NanPolicy::Warn;
  if (s == "skip") return NanPolicy::Skip;
  if (s == "stop") return NanPolicy::Stop;
  fail("unknown NaN policy '{}': use warn, skip or stop", s);
}

const char* nan_policy_name(NanPolicy p) {
  switch (p) {
    case NanPolicy::Warn: return "warn";
    case NanPolicy::Skip: return "skip";
    case NanPolicy::Stop: return "stop";
  }
  return "?";
}

TrainWatch::TrainWatch(const fs::path& run_dir, int64_t start_iteration)
    : run_dir_(run_dir),
      spikes_(size_t(env_double("PRIMUS_SPIKE_WINDOW", 50)), 10, env_double("PRIMUS_SPIKE_ZSCORE", 6.0)) {
  const LaunchEnv where = discover_launch_env();
  if (const char* p = std::getenv("PRIMUS_NAN_POLICY"); p && *p) policy_ = parse_nan_policy(p);
  max_skips_ = int(env_double("PRIMUS_NAN_MAX_SKIPS", 3));
  spike_z_ = env_double("PRIMUS_SPIKE_ZSCORE", 6.0);
  restarts_ = int(env_double("PRIMUS_RESTART_COUNT", 0));
  const char* w = std::getenv("PRIMUS_WATCH");
  heartbeats_ = !(w && std::string(w) == "0");
  faults_ = Faults::from_env(where.rank);
  hb_.rank = where.rank;
  hb_.world_size = where.world_size;
  hb_.pid = int(::getpid());
  hb_.host = where.node;
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  if (job && step && *job && *step) hb_.slurm_step = std::string(job) + "." + step;
  hb_.restarts = restarts_;
  hb_.iteration = start_iteration;
  if (heartbeats_) {
    fs::create_directories(watch_dir(run_dir_));
    install_stack_handler(watch_dir(run_dir_) / ("stack_rank_" + std::to_string(where.rank) + ".txt"));
  }
  beat("start", start_iteration);
  if (faults_.any()) log::warn("test fault injection is active on this rank (PRIMUS_FAULT_*)");
}

TrainWatch::~TrainWatch() {
  // Leaving by an exception (a primus::Error, bad_alloc): say so, so the launcher does not wait
  // for a hang timeout on a rank that is already gone.
  if (!finished_ && std::uncaught_exceptions() > 0) beat("failed", hb_.iteration);
}

void TrainWatch::beat(const std::string& phase, int64_t iteration) {
  if (!heartbeats_) return;
  hb_.phase = phase;
  hb_.iteration = iteration;
  hb_.time = now_epoch();
  hb_.beat += 1;
  const std::string err = write_heartbeat(run_dir_, hb_);
  // Said once per streak of failures: the launcher reads it and does not take the silence for a
  // hang (a full disk is reported as one, by the metrics writer or the checkpoint).
  if (!err.empty() && !heartbeat_failing_) std::cerr << heartbeat_unwritable_line(hb_, err) << std::flush;
  heartbeat_failing_ = !err.empty();
}

void TrainWatch::event(const std::string& kind, const std::string& severity, const std::string& message,
                       int64_t iteration) {
  auto e = make_event("rank", kind, severity, message);
  e["rank"] = hb_.rank;
  e["ranks"] = {hb_.rank};
  e["host"] = hb_.host;
  e["iteration"] = iteration;
  e["attempt"] = restarts_ + 1;
  append_event(run_dir_, e);
}

void TrainWatch::begin_step(int64_t iteration) {
  if (faults_.kill && faults_.kill->during.empty() && iteration == faults_.kill->iteration &&
      claim_fault_once(run_dir_, "kill")) {
    log::warn("test fault: SIGKILL at the start of iteration {}", iteration);
    die_now();
  }
  if (faults_.stall && iteration == faults_.stall->iteration && claim_fault_once(run_dir_, "stall")) {
    log::warn("test fault: stalling forever at iteration {}", iteration);
    log::flush();
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (faults_.slow && iteration >= faults_.slow->iteration)
    std::this_thread::sleep_for(std::chrono::milliseconds(faults_.slow->ms));
}

bool TrainWatch::nan_fault_due(int64_t iteration, int64_t n) {
  if (!(faults_.nan && iteration == faults_.nan->iteration && n > 0 && claim_fault_once(run_dir_, "nan"))) return false;
  log::warn("test fault: NaN written into the gradients at iteration {}", iteration);
  return true;
}

void TrainWatch::inject_faults(int64_t iteration, float* grads, int64_t n) {
  if (nan_fault_due(iteration, n)) grads[n / 2] = std::numeric_limits<float>::quiet_NaN();
}

void TrainWatch::inject_faults(int64_t iteration, const Tensor& grads) {
  if (grads.device() == Device::CPU) return inject_faults(iteration, grads.data<float>(), grads.numel());
  const int64_t n = grads.numel();
  if (!nan_fault_due(iteration, n)) return;
  Tensor nan = Tensor::empty({1});
  nan.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  grads.slice(0, n / 2, 1).copy_from(nan);
}

StepAction TrainWatch::check(int64_t iteration, double loss, double grad_norm) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    consecutive_skips_ = 0;
    if (spike_z_ > 0) {
      if (auto s = spikes_.observe(loss); s && hb_.rank == 0) {
        const std::string msg = fmt::format("loss spike at iteration {}: lm loss {:.4f} against a median of {:.4f} "
                                            "(robust z-score {:.1f})", iteration, s->loss, s->median, s->z);
        log::warn("{}", msg);
        auto e = make_event("rank", "loss_spike", "warn", msg);
        e["rank"] = hb_.rank;
        e["iteration"] = iteration;
        e["loss"] = s->loss;
        e["median"] = s->median;
        e["z"] = s->z;
        e["attempt"] = restarts_ + 1;
        append_event(run_dir_, e);
      }
    }
    return StepAction::Continue;
  }
  const std::string what = fmt::format("iteration {}: lm loss {} / grad norm {} is not finite", iteration, loss, grad_norm);
  switch (policy_) {
    case NanPolicy::Stop:
      event("nan", "error", what + "; policy stop", iteration);
      fail("{}; stopping before the update (NaN policy stop; try a lower lr)", what);
    case NanPolicy::Warn:
      event("nan", "warn", what + "; policy warn: the update is applied", iteration);
      log::warn("{}; NaN policy warn: applying the update anyway", what);
      return StepAction::Continue;
    case NanPolicy::Skip:
      ++consecutive_skips_;
      if (consecutive_skips_ > max_skips_) {
        event("nan", "error", fmt::format("{}; {} non-finite steps in a row, more than PRIMUS_NAN_MAX_SKIPS={}", what,
                                          consecutive_skips_, max_skips_), iteration);
        fail("{}; {} non-finite steps in a row: stopping (NaN policy skip allows {}; try a lower lr)", what,
             consecutive_skips_, max_skips_);
      }
      ++skipped_;
      event("nan", "warn", what + "; policy skip: no update for this step", iteration);
      log::warn("{}; NaN policy skip: this step makes no update", what);
      return StepAction::Skip;
  }
  return StepAction::Continue;
}

void TrainWatch::end_step(int64_t iteration, double loss, double grad_norm, double step_time, double compute_time) {
  hb_.loss = loss;
  hb_.grad_norm = grad_norm;
  hb_.step_time = step_time;
  hb_.compute_time = compute_time < 0 ? step_time : compute_time;
  hb_.recent.emplace_back(iteration, hb_.compute_time);
  if (hb_.recent.size() > kHeartbeatRecentSteps) hb_.recent.erase(hb_.recent.begin());
  beat("step", iteration);
}

void TrainWatch::phase(const std::string& name, int64_t iteration) { beat(name, iteration); }

void TrainWatch::before_save(int64_t iteration) {
  beat("save", iteration);
  if (faults_.kill && faults_.kill->during == "checkpoint" && iteration == faults_.kill->iteration &&
      claim_fault_once(run_dir_, "kill")) {
    // The checkpoint writer's own crash hook (maybe_kill_after, src/checkpoint/format.h): SIGKILL at
    // the chosen point of this rank's part of the save.
    const std::string shard = fmt::format("rank_{:05d}.bin", hb_.rank);
    const std::string& at = faults_.kill->at;
    const std::string point = at == "shard" ? shard : at == "half" ? shard + ":half" : at == "meta" ? "meta.json" : "renamed";
    log::warn("test fault: SIGKILL inside the checkpoint of iteration {} (after {})", iteration, point);
    log::flush();
    ::setenv("PRIMUS_FAULT_CHECKPOINT_KILL_AFTER", point.c_str(), 1);
  }
}

void TrainWatch::finish(int64_t iteration) {
  finished_ = true;
  beat("done", iteration);
}

}  // namespace primus::safe
