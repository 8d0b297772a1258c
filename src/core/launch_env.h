// Where this process sits in a launch: its rank, local rank, world size and the rendezvous
// address, discovered once from whoever started it (OpenMPI's mpirun, Slurm's srun, or nobody).
// The CLI, the logger and the trainer all read it from here, so there is one answer.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace primus {

struct LaunchEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "single";  // "mpirun" | "slurm" | "primus" (RANK/WORLD_SIZE set) | "single"
  std::string node;                 // this host's name
};

// Reads OMPI_COMM_WORLD_* (mpirun), then SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS inside a Slurm
// job step, then RANK/LOCAL_RANK/WORLD_SIZE, else a single process. Malformed values throw
// primus::Error naming the variable.
LaunchEnv discover_launch_env();

// True when this process was started as one rank of a launch (by mpirun, by srun inside a job
// step, or by primus-cli itself), i.e. it should run the task rather than launch ranks.
bool is_launched_rank();

std::string host_name();

// The run folder <workspace>/<exp_name> chosen by primus-cli for this launch (PRIMUS_RUN_DIR),
// or nothing when the task was not started through primus-cli.
std::optional<std::filesystem::path> run_dir();

// The snapshot folder of this launch (PRIMUS_SNAPSHOT_DIR), if any.
std::optional<std::filesystem::path> snapshot_dir();

// Lets a task record the config it actually ran with (after overrides and presets) in the
// launch's snapshot as resolved_config.yaml. Only rank 0 writes; a no-op without a snapshot.
// Returns the file written, if any.
std::optional<std::filesystem::path> write_resolved_config(const std::string& yaml_text);

}  // namespace primus
