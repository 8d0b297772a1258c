// Hooks: executables named NN_* (01_check.sh, 20_warmup) in hooks/<task>/<subtask>/ (or
// hooks/<task>/ for a task without subtasks) and in every --hooks-dir folder. All of them run
// in file-name order before the task, with the run's environment and the task's arguments;
// the ones in a post/ subfolder run afterwards (with PRIMUS_TASK_EXIT_CODE). Other files
// (README.md) are ignored; an NN_* file without the execute bit is an error, not a silent skip.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "cli/lib/process.h"

namespace primus::cli {

struct HookSet {
  std::vector<std::filesystem::path> pre, post;
};

// `task_dirs`: folders laid out like hooks/ (hooks/<task>/<subtask>); `plain_dirs`: folders
// that hold hooks directly (--hooks-dir).
HookSet find_hooks(const std::string& task, const std::string& subtask,
                   const std::vector<std::filesystem::path>& task_dirs,
                   const std::vector<std::filesystem::path>& plain_dirs);

// Runs the hooks in order, echoing their output; the first failure throws primus::Error naming
// the hook, its exit code and its output.
void run_hooks(const std::vector<std::filesystem::path>& hooks, const std::string& phase,
               const std::vector<std::string>& task_args, EnvMap env);

// The launch sequence every runtime shares: pre hooks, the command (in `command_env`), then the
// post hooks with PRIMUS_TASK_EXIT_CODE set. Returns the command's exit code.
int run_between_hooks(const HookSet& hooks, const std::vector<std::string>& task_args,
                      const std::vector<std::string>& command, const EnvMap& command_env, EnvMap hook_env);

}  // namespace primus::cli
