// Fault injection, for tests only: environment variables make a training rank misbehave at a
// chosen iteration, so that the watch, the restart logic and `analyze run` can be tested with
// real processes. Nothing here runs unless one of these variables is set.
//
//   PRIMUS_FAULT_KILL="rank=1,iteration=7"                      SIGKILL at the start of iteration 7
//   PRIMUS_FAULT_KILL="rank=0,iteration=10,during=checkpoint"   SIGKILL in the middle of writing
//                                                               the checkpoint of iteration 10
//                                                               (right after this rank's shard;
//                                                               at=half|meta|renamed: halfway
//                                                               through it, after meta.json, after
//                                                               the folder's rename)
//   PRIMUS_FAULT_STALL="rank=0,iteration=6"                     sleep forever at iteration 6
//   PRIMUS_FAULT_NAN="rank=0,iteration=5"                       NaN in the gradients at iteration 5
//   PRIMUS_FAULT_SLOW="rank=1,ms=150"                           sleep 150 ms in every step
//                                                               (optional from=<iteration>)
//
// kill, stall and nan fire once per run folder (a marker file in <run>/watch/faults/ records
// that they fired), so a restarted run does not hit the same fault again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace primus::safe {

struct FaultSpec {
  std::string kind;        // kill | stall | nan | slow
  int rank = 0;
  int64_t iteration = 0;   // kill/stall/nan: when; slow: from
  std::string during;      // kill: "" (step start) or "checkpoint"
  std::string at = "shard";  // kill during a checkpoint: shard | half | meta | renamed
  int64_t ms = 0;          // slow: delay per step
};

// Parses "rank=1,iteration=7,..." for the given kind; throws primus::Error naming the variable.
FaultSpec parse_fault(const std::string& kind, const std::string& text, const std::string& variable);

// The faults set in the environment for this rank (none when unset or aimed at another rank).
struct Faults {
  std::optional<FaultSpec> kill, stall, nan, slow;
  static Faults from_env(int rank);
  bool any() const { return kill || stall || nan || slow; }
};

// Marks `name` as fired in <run_dir>/watch/faults/; false when it had already fired there.
bool claim_fault_once(const std::filesystem::path& run_dir, const std::string& name);

}  // namespace primus::safe
