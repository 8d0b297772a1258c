// How tasks and runtimes plug into primus-cli without touching a core file: each lives in its
// own .cpp that defines a static Registrar. The CLI target compiles src/cli/tasks/*.cpp and
// src/cli/runtimes/*.cpp straight into the executable, so the registrars always run.
//
//   primus-cli <runtime> [runtime options] -- <task> [<subtask>] [task options]
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace primus::cli {

// A task's setup adds its options to `app` and returns the action to run once parsing is done.
// The action returns the process exit code.
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

// The nearest of `candidates` to `word` by edit distance, or "" when nothing is close.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace primus::cli
