#include "core/launch_env.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>

#include "core/error.h"

namespace primus {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

std::optional<int> env_int(const char* name) {
  const char* v = env(name);
  if (!v) return std::nullopt;
  int out = 0;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || p != s.data() + s.size() || out < 0)
    fail("environment variable {}='{}' is not a non-negative integer", name, v);
  return out;
}

// Slurm sets SLURM_PROCID in the batch script too (as 0); only a job step started by srun is a
// real rank, and steps carry SLURM_STEP_ID (the batch script's own step is "batch"/absent).
bool in_slurm_step() {
  const char* step = env("SLURM_STEP_ID");
  if (!step || !env("SLURM_PROCID")) return false;
  std::string s(step);
  return s != "batch" && s != "extern" && s != "4294967294" && s != "4294967292";
}

// First host of a Slurm nodelist like "node[01-04,07],gpu5": good enough for the common forms;
// scontrol is the authority but is not on every compute node's PATH.
std::string first_slurm_host(const std::string& list) {
  auto br = list.find('[');
  auto comma = list.find(',');
  if (br == std::string::npos || (comma != std::string::npos && comma < br))
    return list.substr(0, comma);
  std::string prefix = list.substr(0, br);
  std::string inner = list.substr(br + 1);
  size_t end = inner.find_first_of("-,]");
  return prefix + inner.substr(0, end);
}

}  // namespace

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

LaunchEnv discover_launch_env() {
  LaunchEnv e;
  e.node = host_name();
  if (auto r = env_int("OMPI_COMM_WORLD_RANK")) {
    e.launcher = "mpirun";
    e.rank = *r;
    e.world_size = env_int("OMPI_COMM_WORLD_SIZE").value_or(1);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    e.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
    e.node_rank = env_int("OMPI_COMM_WORLD_NODE_RANK").value_or(0);
  } else if (in_slurm_step()) {
    e.launcher = "slurm";
    e.rank = *env_int("SLURM_PROCID");
    e.world_size = env_int("SLURM_NTASKS").value_or(env_int("SLURM_NPROCS").value_or(1));
    e.local_rank = env_int("SLURM_LOCALID").value_or(0);
    e.node_rank = env_int("SLURM_NODEID").value_or(0);
    // SLURM_TASKS_PER_NODE looks like "2(x3),1"; the local count is simplest from the step.
    if (const char* tpn = env("SLURM_STEP_TASKS_PER_NODE") ? env("SLURM_STEP_TASKS_PER_NODE")
                                                           : env("SLURM_TASKS_PER_NODE")) {
      std::string s(tpn);
      e.local_world_size = std::atoi(s.substr(0, s.find_first_of("(,")).c_str());
      if (e.local_world_size <= 0) e.local_world_size = 1;
    }
    if (const char* nl = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST"))
      e.master_addr = first_slurm_host(nl);
    // A port derived from the job id keeps concurrent jobs on shared nodes apart.
    if (auto job = env_int("SLURM_JOB_ID")) e.master_port = 20000 + (*job % 20000);
  } else if (auto r = env_int("RANK")) {
    e.launcher = "primus";
    e.rank = *r;
    e.world_size = env_int("WORLD_SIZE").value_or(1);
    e.local_rank = env_int("LOCAL_RANK").value_or(0);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(e.world_size);
  }
  if (const char* a = env("MASTER_ADDR")) e.master_addr = a;
  if (auto p = env_int("MASTER_PORT")) e.master_port = *p;
  if (e.rank >= e.world_size)
    fail("launch environment says rank {} of world size {} ({}): rank must be below the size", e.rank,
         e.world_size, e.launcher);
  if (e.local_rank >= e.local_world_size) e.local_world_size = e.local_rank + 1;
  return e;
}

bool is_launched_rank() {
  return env("OMPI_COMM_WORLD_RANK") || in_slurm_step() || env("PRIMUS_LAUNCHED");
}

std::optional<std::filesystem::path> run_dir() {
  if (const char* d = env("PRIMUS_RUN_DIR")) return std::filesystem::path(d);
  return std::nullopt;
}

std::optional<std::filesystem::path> snapshot_dir() {
  if (const char* d = env("PRIMUS_SNAPSHOT_DIR")) return std::filesystem::path(d);
  return std::nullopt;
}

std::optional<std::filesystem::path> write_resolved_config(const std::string& yaml_text) {
  auto dir = snapshot_dir();
  if (!dir || discover_launch_env().rank != 0) return std::nullopt;
  std::filesystem::create_directories(*dir);
  auto path = *dir / "resolved_config.yaml";
  std::ofstream f(path);
  f << yaml_text;
  if (!f) fail("cannot write the resolved config to {}", path.string());
  return path;
}

}  // namespace primus
