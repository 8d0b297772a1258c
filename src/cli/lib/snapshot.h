// Snapshots: what a launch ran with, written to <workspace>/<exp_name>/snapshot/ so the run
// can be understood and replayed later:
//   command.json   runtime, runtime and task arguments, full argv, working folder
//   env.json       the variables primus set (with sources) and the inherited tuning variables
//   system.json    host, OS, CPU, memory, device, driver and toolkit versions, MPI
//   version.json   primus version and git commit
//   config.yaml    a copy of the task's --config file, when it has one
//   resolved_config.yaml   written by the task itself (primus::write_resolved_config)
//   metadata.json  when, who, where, which files, and what it replays (if it does)
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/lib/env_plan.h"
#include "cli/lib/gpu.h"

namespace primus::cli {

struct SnapshotInput {
  std::filesystem::path dir;
  std::string runtime;
  std::vector<std::string> runtime_args, task_args;
  std::optional<std::filesystem::path> config;  // the task's --config file
  int nproc = 1;
  std::string workspace, exp_name;
  std::optional<std::filesystem::path> replay_of;
};

struct Snapshot {
  std::filesystem::path dir;
  nlohmann::json command, env, system, version, metadata;
  std::optional<std::filesystem::path> config;  // config.yaml inside the snapshot
};

// The project's version (CMake) and git commit ("unknown" outside a git checkout).
nlohmann::json version_facts();
nlohmann::json system_facts(const DeviceInfo& device);
nlohmann::json env_facts(const EnvPlan& env);

void write_snapshot(const SnapshotInput& in, const EnvPlan& env, const DeviceInfo& device);

// A command-line argument in JSON, byte for byte: a string when it is UTF-8, else
// {"bytes_hex": "..."} (a Latin-1 path, say); arg_from_json reads either back.
nlohmann::json arg_json(const std::string& s);
std::string arg_from_json(const nlohmann::json& j);
// Rewrites env.json and system.json (used by rank 0 of a Slurm job, whose node is the one that
// matters, not the submitting host).
void update_snapshot_host(const std::filesystem::path& dir, const EnvPlan& env, const DeviceInfo& device);

// Accepts the snapshot folder itself or a run folder that contains snapshot/. Anything else
// throws primus::Error saying what is missing.
Snapshot load_snapshot(const std::filesystem::path& dir);

// Differences that make a replay not the same run: device model/count, driver, toolkit, CPU,
// primus version and commit. Each entry reads "device.model: H100 in the snapshot, CPU here".
std::vector<std::string> compare_with_here(const Snapshot& s, const DeviceInfo& device);

}  // namespace primus::cli
