// primus-cli entry point: splits the command line at the first "--" into the runtime part and
// the task part, then hands the task part to the chosen runtime.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "parallel/mpi_process_group.h"

using namespace primus::cli;

static std::string usage() {
  std::string s =
      "primus-cli: one command line from a laptop to a cluster\n\n"
      "usage: primus-cli <runtime> [runtime options] -- <task> [<subtask>] [task options]\n\nruntimes:\n";
  for (const auto& r : runtime_registry()) s += fmt::format("  {:<12}{}\n", r.name, r.help);
  s += "\ntasks:\n";
  for (const auto& t : task_registry())
    s += fmt::format("  {:<22}{}\n", t.subtask.empty() ? t.task : t.task + " " + t.subtask, t.help);
  s += "\n'primus-cli <runtime> --help' and 'primus-cli <runtime> -- <task> [<subtask>] --help' say more.\n";
  return s;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << usage();
    return args.empty() ? 2 : 0;
  }
  try {
    std::vector<std::string> names;
    const RuntimeInfo* runtime = nullptr;
    for (const auto& r : runtime_registry()) {
      names.push_back(r.name);
      if (r.name == args[0]) runtime = &r;
    }
    if (!runtime) {
      primus::fail("unknown runtime '{}'{}; runtimes: {}", args[0], primus::did_you_mean(args[0], names),
                   fmt::join(names, ", "));
    }
    auto dashes = std::find(args.begin() + 1, args.end(), "--");
    std::vector<std::string> runtime_args(args.begin() + 1, dashes);
    std::vector<std::string> task_args;
    if (dashes != args.end()) task_args.assign(dashes + 1, args.end());

    invocation() = Invocation{argv[0], runtime->name, runtime_args};
    try {
      invocation().exe = std::filesystem::read_symlink("/proc/self/exe").string();
    } catch (const std::filesystem::filesystem_error&) {
    }
    CLI::App app{runtime->help, "primus-cli " + runtime->name};
    RuntimeLauncher launch = runtime->setup(app);
    std::vector<std::string> reversed(runtime_args.rbegin(), runtime_args.rend());
    try {
      app.parse(reversed);
    } catch (const CLI::ExtrasError& e) {
      std::string hint = unknown_flag_hint(app, runtime_args);
      if (hint.empty()) return app.exit(e);
      primus::fail("{} for runtime '{}'; see 'primus-cli {} --help'", hint, runtime->name, runtime->name);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    if (task_args.empty()) {
      std::cerr << "error: no task given: primus-cli " << runtime->name << " [options] -- <task> ...\n\n"
                << usage();
      return 2;
    }
    const int rc = launch(task_args);
    primus::parallel::finalize_mpi();  // a task that trained over MPI leaves it up for the exit
    return rc;
  } catch (const std::exception& e) {
    // One write for the whole line (std::cerr is unbuffered: three insertions would be three
    // writes, which the lines of other ranks could split), so that the launcher can show the line
    // that every rank of a job prints once.
    std::cerr << fmt::format("error: {}\n", e.what());
    primus::parallel::abort_mpi(1);  // one rank failed: end the others rather than leave them waiting
    return 1;
  }
}
