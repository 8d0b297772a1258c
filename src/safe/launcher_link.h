// Ranks die with their launcher: when `primus-cli direct` is killed (even with SIGKILL, which it
// cannot forward), no trainer may survive it as an orphan that keeps writing into the run folder.
//
// The launcher exports its pid and start time (export_launcher_identity); every process it starts
// asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG, set between fork and exec),
// and a rank started further down (by mpirun) also runs a watchdog thread that polls the launcher
// (pid plus start time, so a reused pid does not fool it) and kills the rank when it is gone.
#pragma once

#include <map>
#include <string>

namespace primus::safe {

// Adds PRIMUS_LAUNCHER_PID, PRIMUS_LAUNCHER_START and PRIMUS_LAUNCHER_HOST (this process) to a child's
// environment.
void export_launcher_identity(std::map<std::string, std::string>& env);

// In a child between fork and exec: SIGKILL when the parent dies. Async-signal-safe.
void die_with_parent();

// In a rank: when PRIMUS_LAUNCHER_PID is set, die (SIGKILL) within about `poll_s` seconds of the
// launcher's end. Returns false when there is no launcher to watch (none, or on another host).
bool die_with_launcher(double poll_s = 0.25);

// The start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or -1.
long long process_start_ticks(int pid);

}  // namespace primus::safe
