#include "core/log.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "core/error.h"

namespace primus::log {
namespace {

std::mutex g_mu;
std::shared_ptr<spdlog::logger> g_logger;
std::optional<std::filesystem::path> g_file;

std::string escape_pattern(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '%') out += '%';
    out += c;
  }
  return out;
}

std::shared_ptr<spdlog::logger> make(const LaunchEnv& where, const Options& o) {
  std::vector<spdlog::sink_ptr> sinks;
  g_file.reset();
  if (o.log_dir) {
    std::error_code ec;
    std::filesystem::create_directories(*o.log_dir, ec);
    if (ec) fail("cannot create the log folder {}: {}", o.log_dir->string(), ec.message());
    auto path = *o.log_dir / fmt::format("rank-{}.log", where.rank);
    // Append: hooks, restarts and replays of the same run keep their history in one file.
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(path.string(), false));
    g_file = path;
  }
  if (rank_selected(o.terminal_ranks, where.rank))
    sinks.push_back(std::make_shared<spdlog::sinks::stdout_sink_mt>());
  auto lg = std::make_shared<spdlog::logger>("primus", sinks.begin(), sinks.end());
  lg->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [{} r{}/{}] [%l] %v", escape_pattern(where.node),
                              where.rank, where.world_size));
  auto level = spdlog::level::from_str(o.level);
  if (level == spdlog::level::off && o.level != "off")
    fail("unknown log level '{}' (trace, debug, info, warn, error, off)", o.level);
  lg->set_level(level);
  lg->flush_on(spdlog::level::info);  // a crash must not eat the last lines of a rank's log
  return lg;
}

}  // namespace

bool rank_selected(const std::string& ranks, int rank) {
  if (ranks == "all") return true;
  if (ranks == "none" || ranks.empty()) return false;
  // The whole list is checked, so a typo late in it is reported even when an early entry matches.
  bool found = false;
  size_t pos = 0;
  while (pos <= ranks.size()) {
    size_t comma = ranks.find(',', pos);
    std::string item = ranks.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0)
      fail("log ranks '{}' must be 'all', 'none' or a comma list of ranks like '0,3'", ranks);
    if (v == rank) found = true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return found;
}

void init(const LaunchEnv& where, const Options& options) {
  auto lg = make(where, options);
  std::lock_guard lock(g_mu);
  if (g_logger) g_logger->flush();
  g_logger = std::move(lg);
}

void init_from_env() {
  Options o;
  if (auto d = run_dir()) o.log_dir = *d / "logs";
  if (const char* r = std::getenv("PRIMUS_LOG_RANKS"); r && *r) o.terminal_ranks = r;
  if (const char* l = std::getenv("PRIMUS_LOG_LEVEL"); l && *l) o.level = l;
  init(discover_launch_env(), o);
}

spdlog::logger& logger() {
  {
    std::lock_guard lock(g_mu);
    if (g_logger) return *g_logger;
  }
  init_from_env();
  std::lock_guard lock(g_mu);
  return *g_logger;
}

std::optional<std::filesystem::path> log_file() {
  logger();
  std::lock_guard lock(g_mu);
  return g_file;
}

void flush() {
  std::lock_guard lock(g_mu);
  if (g_logger) g_logger->flush();
}

}  // namespace primus::log
