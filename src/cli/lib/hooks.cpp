#include "cli/lib/hooks.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::cli {
namespace fs = std::filesystem;
namespace {

bool is_hook_name(const std::string& name) {
  size_t i = 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  return i > 0 && i < name.size() && name[i] == '_' && name.back() != '~';
}

void collect(const fs::path& dir, std::vector<fs::path>& out) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (!is_hook_name(name) || e.is_directory()) continue;
    if (access(e.path().c_str(), X_OK) != 0)
      fail("hook '{}' is not executable (run: chmod +x {})", e.path().string(), e.path().string());
    out.push_back(e.path());
  }
}

void sort_by_name(std::vector<fs::path>& v) {
  // Name order across folders, so a user's 05_* can run between the project's 01_* and 10_*.
  std::stable_sort(v.begin(), v.end(), [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
}

}  // namespace

HookSet find_hooks(const std::string& task, const std::string& subtask, const std::vector<fs::path>& task_dirs,
                   const std::vector<fs::path>& plain_dirs) {
  HookSet h;
  std::vector<fs::path> dirs;
  for (auto& root : task_dirs) dirs.push_back(subtask.empty() ? root / task : root / task / subtask);
  for (auto& d : plain_dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) fail("hooks folder '{}' does not exist", d.string());
    dirs.push_back(d);
  }
  for (auto& d : dirs) {
    collect(d, h.pre);
    collect(d / "post", h.post);
  }
  sort_by_name(h.pre);
  sort_by_name(h.post);
  return h;
}

void run_hooks(const std::vector<fs::path>& hooks, const std::string& phase, const std::vector<std::string>& task_args,
               EnvMap env) {
  env["PRIMUS_HOOK_PHASE"] = phase;
  for (auto& hook : hooks) {
    std::vector<std::string> argv{hook.string()};
    argv.insert(argv.end(), task_args.begin(), task_args.end());
    auto r = run_capture(argv, &env);
    std::string output = r.out + r.err;
    if (r.exit_code != 0) {
      fail("{} hook '{}' failed (exit {}); the launch stops here. Its output:\n{}", phase, hook.string(), r.exit_code,
           output.empty() ? "(none)" : output);
    }
    if (!output.empty()) {
      std::string line;
      for (char c : output) {
        if (c == '\n') {
          std::cout << "[hook " << hook.filename().string() << "] " << line << "\n";
          line.clear();
        } else {
          line += c;
        }
      }
      if (!line.empty()) std::cout << "[hook " << hook.filename().string() << "] " << line << "\n";
    }
    std::cout << fmt::format("[hook {}] {} ok\n", phase, hook.filename().string()) << std::flush;
  }
}

int run_between_hooks(const HookSet& hooks, const std::vector<std::string>& task_args,
                      const std::vector<std::string>& command, const EnvMap& command_env, EnvMap hook_env) {
  run_hooks(hooks.pre, "pre", task_args, hook_env);
  const int rc = run_wait(command, command_env);
  hook_env["PRIMUS_TASK_EXIT_CODE"] = std::to_string(rc);
  run_hooks(hooks.post, "post", task_args, hook_env);
  return rc;
}

}  // namespace primus::cli
