// Rank-aware logging for every part of Primus. Each line carries the time, the node and the
// rank: "[2025-01-31 12:00:00.123] [node1 r3/8] [info] step 10 loss 2.31".
//   - every rank writes its full log to <run dir>/logs/rank-N.log (run dir: PRIMUS_RUN_DIR,
//     set by primus-cli; no file when a program runs outside primus-cli);
//   - the terminal (stdout) gets rank 0 only, or the ranks in PRIMUS_LOG_RANKS ("all", "0,3").
// The first call configures itself from the launch environment; init() is for explicit set-up
// (tests, tools that choose their own folder).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/launch_env.h"

namespace primus::log {

struct Options {
  std::optional<std::filesystem::path> log_dir;  // rank-N.log goes here; none: no file
  std::string terminal_ranks = "0";              // "all", "none" or a comma list of ranks
  std::string level = "info";                    // trace|debug|info|warn|error|off
};

// True when `ranks` ("all", "none", "0", "0,2,5") selects `rank`. Throws on malformed text.
bool rank_selected(const std::string& ranks, int rank);

// (Re)configures the process logger. Safe to call again (e.g. after the rank is known).
void init(const LaunchEnv& where, const Options& options);
// Configures from PRIMUS_RUN_DIR / PRIMUS_LOG_RANKS / PRIMUS_LOG_LEVEL and discover_launch_env().
void init_from_env();

spdlog::logger& logger();
// The file this rank logs to, if any.
std::optional<std::filesystem::path> log_file();
void flush();

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  logger().debug(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  logger().info(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  logger().warn(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  logger().error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace primus::log
