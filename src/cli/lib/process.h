// Small POSIX process helpers for the runtimes: find a program, run it (capturing or not),
// quote a command line for display, and the environment as a map.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace primus::cli {

using EnvMap = std::map<std::string, std::string>;

EnvMap current_environment();

// Full path of `name` searched in PATH (or `name` itself when it contains a '/').
std::optional<std::string> find_program(const std::string& name);

// The running primus-cli executable.
std::string self_exe();

struct Captured {
  int exit_code = 0;  // 128+signal when killed by a signal; 127 when it could not be started
  std::string out;    // stdout
  std::string err;    // stderr
};
// Runs argv to completion with `env` (the current one when null), capturing stdout and stderr.
Captured run_capture(const std::vector<std::string>& argv, const EnvMap* env = nullptr,
                     const std::optional<std::filesystem::path>& cwd = std::nullopt);

// Runs argv with inherited stdio and waits; SIGINT/SIGTERM reaching us are passed on to it.
// Returns its exit code (128+signal when killed). Throws when the program cannot be started.
int run_wait(const std::vector<std::string>& argv, const EnvMap& env);

// Replaces this process with argv (execve). Throws when that fails.
[[noreturn]] void exec_replace(const std::vector<std::string>& argv, const EnvMap& env);

// Shell-safe quoting, for printing commands that can be pasted back into a shell.
std::string shell_quote(const std::string& s);
std::string join_command(const std::vector<std::string>& argv);

}  // namespace primus::cli
