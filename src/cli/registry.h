// How tasks and runtimes plug into primus-cli without touching a core file: each lives in its
// own .cpp that defines a static Registrar. The CLI target compiles src/cli/tasks/*.cpp and
// src/cli/runtimes/*.cpp straight into the executable, so the registrars always run.
//
//   primus-cli <runtime> [runtime options] -- <task> [<subtask>] [task options]
#pragma once

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/suggest.h"  // nearest(), did_you_mean()

namespace primus::cli {

// A task's setup adds its options to `app` and returns the action to run once parsing is done.
// The action returns the process exit code.
// The check of a count option (--nproc, --target-nodes, ...): a whole number of 1 or more, with a
// message that says so ("--target-nodes: must be a whole number of 1 or more, got 0").
inline const CLI::Validator kAtLeastOne(
    [](std::string& v) -> std::string {
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || errno != 0 || n < 1)
        return "must be a whole number of 1 or more, got " + v;
      return "";
    },
    "N>=1");

using TaskAction = std::function<int()>;
using TaskSetup = std::function<TaskAction(CLI::App& app)>;

struct TaskInfo {
  std::string task;     // e.g. "analyze"
  std::string subtask;  // e.g. "model"; empty for a task without subtasks ("generate")
  std::string help;
  TaskSetup setup;
};

// A runtime's setup adds its options to `app` and returns the launcher, which receives the
// task's part of the command line (everything after "--") and returns the exit code.
using RuntimeLauncher = std::function<int(const std::vector<std::string>& task_args)>;
using RuntimeSetup = std::function<RuntimeLauncher(CLI::App& app)>;

struct RuntimeInfo {
  std::string name;  // direct | container | slurm
  std::string help;
  RuntimeSetup setup;
};

std::vector<TaskInfo>& task_registry();
std::vector<RuntimeInfo>& runtime_registry();

struct TaskRegistrar {
  explicit TaskRegistrar(TaskInfo info) { task_registry().push_back(std::move(info)); }
};
struct RuntimeRegistrar {
  explicit RuntimeRegistrar(RuntimeInfo info) { runtime_registry().push_back(std::move(info)); }
};

// Parses and runs the task part of a command line in this process ("train pretrain --config x").
// Used by the direct runtime and by tests.
int run_task(const std::vector<std::string>& task_args);

// How primus-cli was called: filled in by main() before the runtime's launcher runs, so a
// runtime can record the full command line (snapshots) or re-run itself (ranks).
struct Invocation {
  std::string exe;      // argv[0] as resolved (/proc/self/exe)
  std::string runtime;  // "direct"
  std::vector<std::string> runtime_args;  // options between the runtime name and "--"
};
Invocation& invocation();

// Checks that the task (and subtask) named by `task_args` exist, with the same "did you mean"
// errors run_task gives; lets a launcher refuse a typo before it starts anything.
void validate_task_names(const std::vector<std::string>& task_args);

// For a CLI11 "arguments were not expected" error: names the first unknown flag in `args` and
// the nearest option `app` (or its subcommands) knows. Empty when every flag is known.
std::string unknown_flag_hint(const CLI::App& app, const std::vector<std::string>& args);


}  // namespace primus::cli
