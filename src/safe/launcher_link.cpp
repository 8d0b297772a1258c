#include "safe/launcher_link.h"

#include "core/launch_env.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace primus::safe {

long long process_start_ticks(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return -1;
  return std::atoll(field.c_str());
}

void export_launcher_identity(std::map<std::string, std::string>& env) {
  env["PRIMUS_LAUNCHER_PID"] = std::to_string(::getpid());
  env["PRIMUS_LAUNCHER_START"] = std::to_string(process_start_ticks(::getpid()));
  env["PRIMUS_LAUNCHER_HOST"] = host_name();
}

void die_with_parent() { ::prctl(PR_SET_PDEATHSIG, SIGKILL); }

bool die_with_launcher(double poll_s) {
  const char* pid_text = std::getenv("PRIMUS_LAUNCHER_PID");
  const char* start_text = std::getenv("PRIMUS_LAUNCHER_START");
  if (!pid_text || !*pid_text) return false;
  const int pid = std::atoi(pid_text);
  const long long start = start_text ? std::atoll(start_text) : -1;
  if (pid <= 1) return false;
  // A rank that srun started on another node cannot see the launcher's pid (srun ends its tasks
  // when it ends).
  if (const char* h = std::getenv("PRIMUS_LAUNCHER_HOST"); h && *h && std::string(h) != host_name()) return false;
  if (::getppid() == pid) ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may already be gone between our start and now.
  auto gone = [pid, start] {
    if (start >= 0) return process_start_ticks(pid) != start;
    return ::kill(pid, 0) != 0 && errno == ESRCH;
  };
  if (gone()) ::raise(SIGKILL);
  std::thread([gone, poll_s] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
      if (gone()) ::raise(SIGKILL);  // a save in progress is discarded atomically (checkpoint.h)
    }
  }).detach();
  return true;
}

}  // namespace primus::safe
