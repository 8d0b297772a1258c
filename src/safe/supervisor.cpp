#include "safe/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/launch_env.h"
#include "safe/detect.h"
#include "safe/events.h"
#include "safe/heartbeat.h"
#include "safe/launcher_link.h"

namespace fs = std::filesystem;
using nlohmann::json;

extern char** environ;

namespace primus::safe {
namespace {

std::atomic<pid_t> g_group{0};
std::atomic<int> g_interrupted{0};
void on_signal(int sig) {
  g_interrupted = sig;
  const pid_t g = g_group.load();
  if (g > 0) ::kill(-g, sig);
}

double mono() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool alive(int pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs argv with stdout+stderr appended to `out`, killing it after `timeout_s`. Returns the exit
// code, or -1 when it could not start or timed out.
int run_to_file(const std::vector<std::string>& argv, const fs::path& out, double timeout_s) {
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execvp(cargs[0], cargs.data());
    _exit(127);
  }
  ::close(fd);
  if (pid < 0) return -1;
  const double deadline = mono() + timeout_s;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return decode_status(status);
    if (r < 0 && errno != EINTR) return -1;
    if (mono() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::optional<std::string> which(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const fs::path cand = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(cand.c_str(), X_OK) == 0) return cand.string();
  }
  return std::nullopt;
}

std::string join_ranks(const std::vector<int>& r) { return fmt::format("{}", fmt::join(r, ",")); }

struct Attempt {
  bool hang = false, interrupted = false;
  std::vector<int> hung_ranks, dead_ranks, failed_ranks;
  std::map<int, int> signal_of;  // rank -> signal, from mpirun's report
  int rc = 0;
  bool saw_heartbeat = false;
  int64_t last_iteration = 0;
  std::map<int, int64_t> iteration_of;  // each rank's last reported iteration
  std::map<int, std::string> host_of;   // each rank's node, from its heartbeat or srun's report
  std::string first_error;
  // Where the ranks named by a finding were: the earliest of their last iterations.
  int64_t iteration_for(const std::vector<int>& ranks) const {
    int64_t best = -1;
    for (int r : ranks)
      if (auto it = iteration_of.find(r); it != iteration_of.end()) best = best < 0 ? it->second : std::min(best, it->second);
    return best < 0 ? last_iteration : best;
  }  // first "error: ..." line of the attempt's stderr
};

class Runner {
 public:
  Runner(std::vector<std::string> argv, std::map<std::string, std::string> env, const SuperviseOptions& o, int attempt)
      : argv_(std::move(argv)), env_(std::move(env)), o_(o), attempt_(attempt), hangs_(o.hang_timeout),
        stragglers_(o.straggler_factor) {}

  Attempt run();

 private:
  void start();
  void pump_stderr(int timeout_ms);
  void show_stderr(std::string_view chunk, bool end);
  void kill_job(const std::string& why);
  void event(const std::string& kind, const std::string& severity, const std::string& message, json extra = {},
             bool print = true);
  void watch_tick();
  // Ranks on other nodes (Slurm tasks): `scancel --signal=USR1 <step>` makes each write its own
  // stack into the shared watch folder (train_watch.h); copy_own_stack takes the rank's.
  bool ask_slurm_for_stacks(const std::string& step);
  std::string copy_own_stack(int rank, const std::string& host, const fs::path& out);
  // The ranks the job has: as launched, or (srun, world_size 0) as their heartbeats say.
  int world_size() const {
    if (o_.world_size > 0) return o_.world_size;
    int n = 0;
    for (const auto& [r, hb] : beats_) n = std::max(n, hb.world_size);
    return n;
  }

  std::vector<std::string> argv_;
  std::map<std::string, std::string> env_;
  const SuperviseOptions& o_;
  int attempt_;
  pid_t pid_ = -1;
  int err_fd_ = -1;
  std::ofstream err_log_;
  std::string err_text_, partial_line_;
  std::string shown_pending_;           // the job's stderr not yet shown: the start of a line
  bool mid_line_ = false;               // part of the current line was shown already
  std::set<std::string> errors_shown_;  // "error: ..." lines shown
  HangDetector hangs_;
  StragglerDetector stragglers_;
  std::map<int, Heartbeat> beats_;
  std::map<int, int> pids_;  // rank -> pid of the heartbeat's process on this host
  double dead_since_ = -1;
  // Ranks that said on stderr that their heartbeat cannot be written (a full disk, say): their
  // silence is not a hang while their process lives. Cleared when their heartbeat moves again.
  std::map<int, UnwritableHeartbeat> unwritable_;
  std::map<int, int64_t> unwritable_beat_;  // the rank's beat when it said so
  std::set<int> unwritable_reported_;
  size_t err_parsed_ = 0;  // how much of err_text_ was searched for those lines
  std::string remote_stack_step_;              // the Slurm step asked for its stacks
  std::map<int, uintmax_t> own_stack_before_;  // each rank's own stack file size before that
  // Tests of the multi-node paths on one machine: every rank counts as on another host.
  const bool ranks_remote_ = [] {
    const char* e = std::getenv("PRIMUS_FAULT_REMOTE_RANKS");
    return e && std::string(e) == "1";
  }();
  Attempt a_;
  const std::string host_ = host_name();
};

void Runner::event(const std::string& kind, const std::string& severity, const std::string& message, json extra,
                   bool print) {
  json e = make_event("launcher", kind, severity, message);
  e["attempt"] = attempt_;
  e["host"] = host_;
  if (extra.is_object())
    for (auto& [k, v] : extra.items()) e[k] = v;
  append_event(o_.run_dir, e);
  if (print) std::cerr << fmt::format("primus watch: {}\n", message);
}

void Runner::start() {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) fail("pipe() failed: {}", std::strerror(errno));
  std::vector<std::string> args = argv_, envs;
  for (auto& [k, v] : env_) envs.push_back(k + "=" + v);
  std::vector<char*> cargs, cenv;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) fail("fork() failed: {}", std::strerror(errno));
  if (pid_ == 0) {
    ::setpgid(0, 0);  // one group for mpirun and its ranks: a hang kills them all at once
    die_with_parent();  // a launcher killed with SIGKILL cannot forward it: the job goes too
    ::dup2(pipefd[1], 2);
    ::execvpe(cargs[0], cargs.data(), cenv.data());
    dprintf(2, "error: cannot run %s: %s\n", cargs[0], std::strerror(errno));
    _exit(127);
  }
  ::setpgid(pid_, pid_);
  ::close(pipefd[1]);
  err_fd_ = pipefd[0];
  g_group = pid_;
}

void Runner::pump_stderr(int timeout_ms) {
  if (err_fd_ < 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return;
  }
  pollfd p{err_fd_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return;
  char buf[65536];
  const ssize_t n = ::read(err_fd_, buf, sizeof buf);
  if (n <= 0) {
    ::close(err_fd_);
    err_fd_ = -1;
    show_stderr({}, true);
    return;
  }
  show_stderr(std::string_view(buf, size_t(n)), false);
  err_log_.write(buf, n);
  err_log_.flush();
  if (err_text_.size() < (8u << 20)) err_text_.append(buf, size_t(n));
}

// The job's stderr on ours, line by line: an "error: ..." line shown once (every rank of a job
// stops on the same bad input and says so; mpirun forwards each rank's line). stderr.log keeps
// every line. A partial line that cannot become an error line goes out at once.
void Runner::show_stderr(std::string_view chunk, bool end) {
  static constexpr std::string_view kError = "error: ";
  shown_pending_ += chunk;
  size_t start = 0;
  for (size_t nl; (nl = shown_pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string_view line(shown_pending_.data() + start, nl - start);
    const bool repeated = !mid_line_ && line.starts_with(kError) && !errors_shown_.insert(std::string(line)).second;
    if (!repeated) (void)!::write(2, line.data(), line.size() + 1);
    mid_line_ = false;
  }
  shown_pending_.erase(0, start);
  const std::string_view rest(shown_pending_);
  if (!rest.empty() && (end || mid_line_ || !kError.starts_with(rest.substr(0, kError.size())))) {
    (void)!::write(2, rest.data(), rest.size());
    shown_pending_.clear();
    mid_line_ = !end;
  }
}

void Runner::kill_job(const std::string& why) {
  ::kill(-pid_, SIGTERM);
  const double deadline = mono() + 5;
  int status = 0;
  while (mono() < deadline) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -pid_;  // reaped: remember so run() does not wait again
      a_.rc = decode_status(status);
      break;
    }
    pump_stderr(50);
  }
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    a_.rc = decode_status(status);
    pid_ = -pid_;
  }
  // Ranks that left the group (or were never in it) on this host.
  for (auto [r, p] : pids_)
    if (alive(p)) ::kill(p, SIGKILL);
  (void)why;
}

bool Runner::ask_slurm_for_stacks(const std::string& step) {
  const auto scancel = which("scancel");
  if (!scancel) return false;
  for (const auto& [r, hb] : beats_) {
    const fs::path own = watch_dir(o_.run_dir) / ("stack_rank_" + std::to_string(r) + ".txt");
    std::error_code ec;
    own_stack_before_[r] = fs::exists(own, ec) ? fs::file_size(own, ec) : 0;
  }
  return run_to_file({*scancel, "--signal=USR1", step}, watch_dir(o_.run_dir) / "scancel.log", 10) == 0;
}

std::string Runner::copy_own_stack(int rank, const std::string& host, const fs::path& out) {
  const fs::path own = watch_dir(o_.run_dir) / ("stack_rank_" + std::to_string(rank) + ".txt");
  const uintmax_t before = own_stack_before_[rank];
  std::error_code ec;
  for (int i = 0; i < 60 && (!fs::exists(own, ec) || fs::file_size(own, ec) <= before); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!fs::exists(own, ec) || fs::file_size(own, ec) <= before) return "";
  std::ofstream(out, std::ios::app) << fmt::format("=== rank {} on {} (through scancel --signal=USR1 {}) at {} ===\n",
                                                   rank, host, remote_stack_step_, iso_time(now_epoch()))
                                    << slurp(own).substr(before);
  return fmt::format("the rank's own backtrace on {}, asked for with scancel --signal=USR1 {}", host,
                     remote_stack_step_);
}

void Runner::watch_tick() {
  const double now = mono();
  beats_ = read_heartbeats(o_.run_dir);
  if (const size_t end = err_text_.rfind('\n'); end != std::string::npos && end + 1 > err_parsed_) {
    for (const auto& u : parse_unwritable_heartbeats(err_text_.substr(err_parsed_, end + 1 - err_parsed_))) {
      unwritable_[u.rank] = u;
      unwritable_beat_[u.rank] = beats_.count(u.rank) ? beats_[u.rank].beat : -1;
    }
    err_parsed_ = end + 1;
  }
  for (auto it = unwritable_.begin(); it != unwritable_.end();) {
    const int r = it->first;
    if (beats_.count(r) && beats_[r].beat != unwritable_beat_[r]) {
      unwritable_reported_.erase(r);
      it = unwritable_.erase(it);
    } else {
      ++it;
    }
  }
  if (!beats_.empty()) a_.saw_heartbeat = true;
  hangs_.observe(beats_, now, world_size());
  for (const auto& [r, hb] : beats_) {
    a_.host_of[r] = hb.host;
    if (hb.host == host_ && hb.pid > 0 && !ranks_remote_) pids_[r] = hb.pid;
    a_.last_iteration = std::max(a_.last_iteration, hb.iteration);
    a_.iteration_of[r] = hb.iteration;
    for (auto [it, t] : hb.recent) stragglers_.add(r, it, t);
    if (hb.phase == "failed" &&
        std::find(a_.failed_ranks.begin(), a_.failed_ranks.end(), r) == a_.failed_ranks.end())
      a_.failed_ranks.push_back(r);
  }
  for (const auto& s : stragglers_.check()) {
    event("straggler", "warn",
          fmt::format("rank {} is a straggler: median step compute time {:.1f} ms against {:.1f} ms for its peers "
                      "({:.1f}x)", s.rank, 1e3 * s.median_s, 1e3 * s.peers_median_s, s.median_s / s.peers_median_s),
          {{"ranks", {s.rank}}, {"median_ms", 1e3 * s.median_s}, {"peers_median_ms", 1e3 * s.peers_median_s},
           {"node", beats_.count(s.rank) ? beats_[s.rank].host : ""}});
  }
  // Dead ranks: the process is gone but its heartbeat never said done or failed.
  std::vector<int> newly_dead;
  for (auto [r, p] : pids_) {
    const std::string ph = beats_.count(r) ? beats_[r].phase : "";
    if (ph == "done" || ph == "failed" || alive(p)) continue;
    if (std::find(a_.dead_ranks.begin(), a_.dead_ranks.end(), r) != a_.dead_ranks.end()) continue;
    a_.dead_ranks.push_back(r);
    newly_dead.push_back(r);
  }
  if (!newly_dead.empty()) {
    if (dead_since_ < 0) dead_since_ = now;
    event("rank_died", "error",
          fmt::format("rank {} died (process gone without finishing) after iteration {}", join_ranks(newly_dead),
                      beats_.count(newly_dead[0]) ? beats_[newly_dead[0]].iteration : 0),
          {{"ranks", newly_dead}, {"iteration", beats_.count(newly_dead[0]) ? beats_[newly_dead[0]].iteration : 0},
           {"detected_by", "pid"}});
  }
  if (dead_since_ >= 0 && now - dead_since_ > o_.dead_rank_grace) {
    event("kill", "error", fmt::format("the job did not end {:.0f} s after a rank died: killing it", o_.dead_rank_grace));
    kill_job("dead rank");
    return;
  }
  auto hung = hangs_.hung(now);
  std::erase_if(hung, [&](const HangDetector::Hung& h) {
    auto it = unwritable_.find(h.rank);
    if (it == unwritable_.end()) return false;
    const UnwritableHeartbeat& u = it->second;
    if (u.host == host_ && !alive(u.pid)) return false;  // the process is gone: not a disk problem
    if (unwritable_reported_.insert(h.rank).second)
      event("heartbeat_unwritable", "warn",
            fmt::format("rank {} cannot write its heartbeat ({}); its process {} is alive, so its silence for {:.0f} s "
                        "is not counted as a hang",
                        h.rank, u.reason, u.pid, h.idle_s),
            {{"ranks", {h.rank}}, {"reason", u.reason}, {"pid", u.pid}});
    return true;
  });
  if (!hung.empty() && !a_.hang) {
    a_.hang = true;
    std::vector<int> ranks;
    for (auto& h : hung) ranks.push_back(h.rank);
    a_.hung_ranks = ranks;
    event("hang", "error",
          fmt::format("hang: rank {} made no progress for {:.1f} s (limit {:.1f} s) at iteration {} (phase {})",
                      join_ranks(ranks), hung[0].idle_s, o_.hang_timeout, hung[0].iteration, hung[0].phase),
          {{"ranks", ranks}, {"iteration", hung[0].iteration}, {"phase", hung[0].phase}, {"idle_s", hung[0].idle_s},
           {"timeout_s", o_.hang_timeout}});
    for (int r : ranks) {
      auto it = pids_.find(r);
      if (it == pids_.end()) {
        const std::string step = beats_.count(r) ? beats_[r].slurm_step : "";
        if (!step.empty() && remote_stack_step_.empty() && ask_slurm_for_stacks(step)) remote_stack_step_ = step;
        if (remote_stack_step_.empty() || step != remote_stack_step_) {
          event("stack_dump", "warn",
                fmt::format("rank {}: no stack dump (its process is not on this host, and no Slurm step to signal)", r),
                {{"ranks", {r}}});
          continue;
        }
        const fs::path out = watch_dir(o_.run_dir) / fmt::format("stacks_attempt{}_rank{}.txt", attempt_, r);
        const std::string how = copy_own_stack(r, beats_[r].host, out);
        event("stack_dump", how.empty() ? "warn" : "info",
              how.empty() ? fmt::format("rank {}: no stack dump (rank on {} did not answer SIGUSR1 from scancel)", r,
                                        beats_[r].host)
                          : fmt::format("rank {}: stack written to {} ({})", r, out.string(), how),
              {{"ranks", {r}}, {"file", out.string()}});
        continue;
      }
      const fs::path out = watch_dir(o_.run_dir) / fmt::format("stacks_attempt{}_rank{}.txt", attempt_, r);
      const std::string how = dump_stack(it->second, r, o_.run_dir, out);
      event("stack_dump", "info", fmt::format("rank {}: stack written to {} ({})", r, out.string(), how),
            {{"ranks", {r}}, {"file", out.string()}});
    }
    kill_job("hang");
  }
}

Attempt Runner::run() {
  fs::create_directories(o_.run_dir / "logs");
  clear_heartbeats(o_.run_dir);
  err_log_.open(o_.run_dir / "logs" / "stderr.log", std::ios::app);
  err_log_ << fmt::format("=== primus watch: attempt {} started {} ===\n", attempt_, iso_time(now_epoch()));
  err_log_.flush();
  env_["PRIMUS_RESTART_COUNT"] = std::to_string(attempt_ - 1);
  env_["PRIMUS_NAN_POLICY"] = o_.nan_policy;
  env_["PRIMUS_WATCH"] = "1";
  event("launch", "info",
        fmt::format("attempt {} of at most {}: starting {} rank(s){}", attempt_, o_.max_restarts + 1, o_.world_size,
                    o_.hang_timeout > 0 ? fmt::format(", hang timeout {:.0f} s", o_.hang_timeout) : ""),
        {{"world_size", o_.world_size}, {"max_restarts", o_.max_restarts}, {"hang_timeout_s", o_.hang_timeout},
         {"nan_policy", o_.nan_policy}},
        o_.max_restarts > 0 || attempt_ > 1);
  start();
  int status = 0;
  while (pid_ > 0) {
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      a_.rc = decode_status(status);
      pid_ = -pid_;
      break;
    }
    pump_stderr(int(o_.poll_interval * 1000));
    if (g_interrupted) continue;  // the signal went to the group; wait for it to end
    watch_tick();
  }
  while (err_fd_ >= 0) pump_stderr(200);  // the rest of what the job wrote
  g_group = 0;
  a_.interrupted = g_interrupted != 0;
  beats_ = read_heartbeats(o_.run_dir);
  for (const auto& [r, hb] : beats_) {
    a_.saw_heartbeat = true;
    a_.host_of[r] = hb.host;
    a_.last_iteration = std::max(a_.last_iteration, hb.iteration);
    a_.iteration_of[r] = hb.iteration;
    if (hb.phase == "failed" &&
        std::find(a_.failed_ranks.begin(), a_.failed_ranks.end(), r) == a_.failed_ranks.end())
      a_.failed_ranks.push_back(r);
  }
  // mpirun names the rank that died and how: "process rank 1 with PID 123 on node n exited on signal 9".
  static const std::regex died(R"(process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+))");
  for (std::sregex_iterator it(err_text_.begin(), err_text_.end(), died), end; it != end; ++it)
    a_.signal_of[std::stoi((*it)[1])] = std::stoi((*it)[3]);
  // srun names them too: "srun: error: node7: task 1: Killed", "... tasks 0-3: Segmentation fault".
  static const std::regex srun_died(
      R"(srun: error: (\S+): tasks? (\d+)(?:-(\d+))?: (Killed|Segmentation fault|Aborted|Bus error|Terminated))");
  for (std::sregex_iterator it(err_text_.begin(), err_text_.end(), srun_died), end; it != end; ++it) {
    const std::string what = (*it)[4];
    const int sig = what == "Killed"               ? SIGKILL
                    : what == "Segmentation fault" ? SIGSEGV
                    : what == "Aborted"            ? SIGABRT
                    : what == "Bus error"          ? SIGBUS
                                                   : SIGTERM;
    const int first = std::stoi((*it)[2]), last = (*it)[3].matched ? std::stoi((*it)[3]) : first;
    for (int r = first; r <= last; ++r) {
      a_.signal_of[r] = sig;
      a_.host_of[r] = (*it)[1];
    }
  }
  // srun ends the peers of a dead rank with SIGTERM (--kill-on-bad-exit): they are not the cause.
  if (std::any_of(a_.signal_of.begin(), a_.signal_of.end(), [](auto& rs) { return rs.second != SIGTERM; }))
    std::erase_if(a_.signal_of, [](auto& rs) { return rs.second == SIGTERM; });
  if (o_.world_size == 1 && a_.rc > 128 && !a_.hang && !a_.interrupted) a_.signal_of[0] = a_.rc - 128;
  static const std::regex err_line(R"((^|\n)error: ([^\n]*))");
  std::smatch m;
  if (std::regex_search(err_text_, m, err_line)) a_.first_error = m[2];
  return a_;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "a signal";
  }
}

}  // namespace

std::string dump_stack(int pid, int rank, const fs::path& run_dir, const fs::path& out) {
  { std::ofstream(out, std::ios::app) << fmt::format("=== rank {} (pid {}) on {} at {} ===\n", rank, pid, host_name(), iso_time(now_epoch())); }
  std::string how;
  if (auto gdb = which("gdb")) {
    run_to_file({*gdb, "-p", std::to_string(pid), "-batch", "-nx", "-ex", "set pagination off", "-ex",
                 "thread apply all bt"}, out, 60);
    if (slurp(out).find("\n#0 ") != std::string::npos) how = "gdb backtrace of every thread";
  }
  if (how.empty()) {
    // The rank's own handler (train_watch.cpp) writes its main thread's stack; tgkill aims the
    // signal at the main thread rather than at whichever thread the kernel would pick.
    const fs::path own = watch_dir(run_dir) / ("stack_rank_" + std::to_string(rank) + ".txt");
    const auto before = fs::exists(own) ? fs::file_size(own) : 0;
    ::syscall(SYS_tgkill, pid, pid, SIGUSR1);
    for (int i = 0; i < 40 && (!fs::exists(own) || fs::file_size(own) == before); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (fs::exists(own) && fs::file_size(own) > before) {
      std::ofstream(out, std::ios::app) << slurp(own).substr(before);
      how = "the rank's own backtrace (SIGUSR1; gdb could not attach)";
    }
  }
  std::ofstream f(out, std::ios::app);
  const std::string kstack = slurp(fmt::format("/proc/{}/stack", pid));
  const std::string wchan = slurp(fmt::format("/proc/{}/wchan", pid));
  f << "--- kernel: wait channel '" << wchan << "'\n" << kstack << "\n";
  if (how.empty()) how = "kernel stack only: no user-space stack could be taken";
  return how;
}

int supervise(const std::vector<std::string>& argv, std::map<std::string, std::string> env,
              const SuperviseOptions& o) {
  // SIGINT, SIGTERM and SIGHUP go to the whole job (mpirun and its ranks), and the launcher waits
  // for it to end: a save in progress completes or is discarded atomically.
  struct sigaction sa{}, old_int{}, old_term{}, old_hup{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  ::sigaction(SIGHUP, &sa, &old_hup);
  export_launcher_identity(env);
  g_interrupted = 0;
  int rc = 0;
  std::vector<std::string> command = argv;
  for (int attempt = 1;; ++attempt) {
    Runner runner(command, env, o, attempt);
    Attempt a = runner.run();
    rc = a.hang ? 124 : a.rc;
    auto ev = [&](const std::string& kind, const std::string& sev, const std::string& msg, json extra,
                  bool print = true) {
      json e = make_event("launcher", kind, sev, msg);
      e["attempt"] = attempt;
      e["host"] = host_name();
      for (auto& [k, v] : extra.items()) e[k] = v;
      append_event(o.run_dir, e);
      if (print) std::cerr << "primus watch: " << msg << "\n";
    };
    // Why did it stop?
    std::string reason, detail;
    std::vector<int> ranks;
    if (a.rc == 0 && !a.hang) {
      reason = "finished";
    } else if (a.interrupted) {
      reason = "interrupted";
    } else if (a.hang) {
      reason = "hang";
      ranks = a.hung_ranks;
      detail = fmt::format("rank {} hung", join_ranks(ranks));
    } else if (!a.signal_of.empty() || !a.dead_ranks.empty()) {
      reason = "rank_died";
      for (auto [r, s] : a.signal_of) ranks.push_back(r);
      if (ranks.empty()) ranks = a.dead_ranks;
      std::vector<std::string> parts;
      for (int r : ranks)
        parts.push_back(a.signal_of.count(r) ? fmt::format("rank {} killed by {} (signal {})", r,
                                                           signal_name(a.signal_of[r]), a.signal_of[r])
                                             : fmt::format("rank {} died", r));
      detail = fmt::format("{}", fmt::join(parts, "; "));
      if (!a.signal_of.empty()) {
        json sig = json::object();
        for (auto [r, s] : a.signal_of) sig[std::to_string(r)] = s;
        ev("rank_died", "error", detail + fmt::format(" after iteration {}", a.iteration_for(ranks)),
           {{"ranks", ranks}, {"iteration", a.iteration_for(ranks)}, {"signals", sig}, {"detected_by", "exit status"}});
      }
    } else if (!a.failed_ranks.empty()) {
      reason = "rank_failed";
      ranks = a.failed_ranks;
      detail = fmt::format("rank {} stopped with an error{}", join_ranks(ranks),
                           a.first_error.empty() ? "" : ": " + a.first_error);
    } else {
      reason = "exit";
      detail = fmt::format("exit code {}{}", a.rc, a.first_error.empty() ? "" : ": " + a.first_error);
    }
    const bool restartable = reason != "finished" && reason != "interrupted" && o.watch &&
                             (a.hang || a.saw_heartbeat) && attempt <= o.max_restarts;
    if (restartable) {
      std::vector<std::string> nodes;
      for (int r : ranks)
        if (auto it = a.host_of.find(r); it != a.host_of.end() && !it->second.empty() &&
                                         std::find(nodes.begin(), nodes.end(), it->second) == nodes.end())
          nodes.push_back(it->second);
      if (o.before_restart) o.before_restart(command, nodes);
      ev("restart", "warn",
         fmt::format("restart {} of {} after {} (exit code {}): {}; resuming from the last good checkpoint", attempt,
                     o.max_restarts, reason, rc, detail),
         {{"reason", reason},
          {"ranks", ranks},
          {"nodes", nodes},
          {"restart", attempt},
          {"iteration", a.iteration_for(ranks)},
          {"detail", detail},
          {"command", command}});
      continue;
    }
    json extra{{"status", reason == "finished" ? "ok" : "failed"}, {"reason", reason}, {"exit_code", rc},
               {"restarts", attempt - 1}, {"ranks", ranks}, {"iteration", ranks.empty() ? a.last_iteration : a.iteration_for(ranks)},
               {"detail", detail}};
    if (!a.first_error.empty()) extra["error"] = a.first_error;
    if (reason == "finished")
      ev("job_end", "info", fmt::format("finished after {} restart(s), at iteration {}", attempt - 1, a.last_iteration),
         extra, attempt > 1);
    else
      ev("job_end", "error",
         fmt::format("stopped: {} (exit code {}){}{}", detail.empty() ? reason : detail, rc,
                     attempt > 1 ? fmt::format(" after {} restart(s)", attempt - 1) : "",
                     reason != "interrupted" && attempt > o.max_restarts && (a.hang || a.saw_heartbeat)
                         ? fmt::format("; no restarts left (--max-restarts {})", o.max_restarts)
                         : ""),
         extra, attempt > 1 || reason == "hang" || reason == "rank_died");
    break;
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGHUP, &old_hup, nullptr);
  return rc;
}

}  // namespace primus::safe
