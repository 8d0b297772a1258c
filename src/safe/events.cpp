#include "safe/events.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::safe {

fs::path events_path(const fs::path& run_dir) { return run_dir / "events.jsonl"; }

double now_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string iso_time(double t) {
  const time_t secs = time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, int((t - double(secs)) * 1000) % 1000);
}

json make_event(const std::string& source, const std::string& kind, const std::string& severity,
                const std::string& message) {
  const double t = now_epoch();
  return json{{"time", iso_time(t)}, {"t", t}, {"source", source}, {"kind", kind}, {"severity", severity},
              {"message", message}};
}

void append_event(const fs::path& run_dir, json event) {
  if (!event.contains("t")) event["t"] = now_epoch();
  if (!event.contains("time")) event["time"] = iso_time(event["t"].get<double>());
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const std::string line = event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const int fd = ::open(events_path(run_dir).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, line.data(), line.size()) != ssize_t(line.size()))
    std::cerr << fmt::format("primus: cannot append to {}: {}\n", events_path(run_dir).string(), std::strerror(errno));
  if (fd >= 0) ::close(fd);
}

std::vector<json> read_events(const fs::path& run_dir, int* bad_lines) {
  std::vector<json> out;
  int bad = 0;
  std::ifstream in(events_path(run_dir));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      json e = json::parse(line);
      if (e.is_object() && e.contains("kind")) out.push_back(std::move(e));
      else ++bad;
    } catch (const json::exception&) {
      ++bad;
    }
  }
  if (bad_lines) *bad_lines = bad;
  return out;
}

}  // namespace primus::safe
