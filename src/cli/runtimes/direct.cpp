// direct runtime: runs the task in this process. (Multi-rank launch through mpirun and Slurm
// rank discovery build on this.)
#include "cli/registry.h"

namespace primus::cli {
namespace {

RuntimeRegistrar reg{{"direct", "run the task here, in this process",
                      [](CLI::App& app) -> RuntimeLauncher {
                        return [](const std::vector<std::string>& task_args) { return run_task(task_args); };
                      }}};

}  // namespace
}  // namespace primus::cli
