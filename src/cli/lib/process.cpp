#include "cli/lib/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace primus::cli {
namespace {

std::vector<char*> cstrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::vector<std::string> envp_strings(const EnvMap& env) {
  std::vector<std::string> out;
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::atomic<pid_t> g_child{0};
void forward_signal(int sig) {
  pid_t c = g_child.load();
  if (c > 0) kill(c, sig);
}

}  // namespace

EnvMap current_environment() {
  EnvMap m;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) m[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  return m;
}

std::optional<std::string> find_program(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos)
    return access(name.c_str(), X_OK) == 0 ? std::optional(name) : std::nullopt;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t colon = p.find(':', pos);
    std::string dir = p.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + name;
    if (access(cand.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(cand)) return cand;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return std::nullopt;
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot find the primus-cli executable (/proc/self/exe): {}", ec.message());
  return p.string();
}

Captured run_capture(const std::vector<std::string>& argv, const EnvMap* env,
                     const std::optional<std::filesystem::path>& cwd) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) fail("pipe() failed: {}", std::strerror(errno));
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = envp_strings(env ? *env : current_environment());
  auto cargs = cstrings(args);
  auto cenv = cstrings(envs);
  pid_t pid = fork();
  if (pid < 0) fail("fork() failed: {}", std::strerror(errno));
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]), close(err_pipe[0]), close(out_pipe[1]), close(err_pipe[1]);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    if (cwd && chdir(cwd->c_str()) != 0) _exit(127);
    execvpe(cargs[0], cargs.data(), cenv.data());
    dprintf(2, "cannot run %s: %s\n", cargs[0], std::strerror(errno));
    _exit(127);
  }
  close(out_pipe[1]), close(err_pipe[1]);
  Captured c;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? c.out : c.err).append(buf, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  c.exit_code = decode_status(status);
  return c;
}

int run_wait(const std::vector<std::string>& argv, const EnvMap& env) {
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = envp_strings(env);
  auto cargs = cstrings(args);
  auto cenv = cstrings(envs);
  // A pipe closed on exec tells the parent whether execvpe succeeded.
  int status_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) fail("pipe() failed: {}", std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) fail("fork() failed: {}", std::strerror(errno));
  if (pid == 0) {
    close(status_pipe[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed with SIGKILL takes the job with it
    execvpe(cargs[0], cargs.data(), cenv.data());
    int e = errno;
    (void)!write(status_pipe[1], &e, sizeof e);
    _exit(127);
  }
  close(status_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  while ((n = read(status_pipe[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
  }
  close(status_pipe[0]);
  g_child = pid;
  struct sigaction sa{}, old_int{}, old_term{}, old_hup{};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  g_child = 0;
  if (n > 0) fail("cannot run '{}': {}", argv[0], std::strerror(child_errno));
  return decode_status(status);
}

void exec_replace(const std::vector<std::string>& argv, const EnvMap& env) {
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = envp_strings(env);
  auto cargs = cstrings(args);
  auto cenv = cstrings(envs);
  std::fflush(stdout);
  std::fflush(stderr);
  execvpe(cargs[0], cargs.data(), cenv.data());
  fail("cannot run '{}': {}", argv[0], std::strerror(errno));
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                        "_-+./:=,@%") == std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string s;
  for (size_t i = 0; i < argv.size(); ++i) s += (i ? " " : "") + shell_quote(argv[i]);
  return s;
}

}  // namespace primus::cli
