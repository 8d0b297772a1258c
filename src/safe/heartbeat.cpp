#include "safe/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::safe {

fs::path watch_dir(const fs::path& run_dir) { return run_dir / "watch"; }
fs::path heartbeat_path(const fs::path& run_dir, int rank) {
  return watch_dir(run_dir) / ("rank_" + std::to_string(rank) + ".json");
}

std::string heartbeat_unwritable_line(const Heartbeat& hb, const std::string& reason) {
  return "primus heartbeat: rank " + std::to_string(hb.rank) + " (pid " + std::to_string(hb.pid) + " on " + hb.host +
         ") cannot write its heartbeat: " + reason + "\n";
}

std::vector<UnwritableHeartbeat> parse_unwritable_heartbeats(const std::string& text) {
  static const std::regex line(R"(primus heartbeat: rank (\d+) \(pid (\d+) on (\S*)\) cannot write its heartbeat: ([^\n]*))");
  std::vector<UnwritableHeartbeat> out;
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
    out.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), (*it)[3], (*it)[4]});
  return out;
}

std::string write_heartbeat(const fs::path& run_dir, const Heartbeat& hb) {
  // NaN has no JSON spelling: it is written as null and read back as NaN.
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json j{{"rank", hb.rank},
         {"world_size", hb.world_size},
         {"pid", hb.pid},
         {"host", hb.host},
         {"iteration", hb.iteration},
         {"phase", hb.phase},
         {"step_time", hb.step_time},
         {"compute_time", hb.compute_time},
         {"loss", num(hb.loss)},
         {"grad_norm", num(hb.grad_norm)},
         {"time", hb.time},
         {"beat", hb.beat},
         {"restarts", hb.restarts},
         {"recent", hb.recent}};
  if (!hb.slurm_step.empty()) j["slurm_step"] = hb.slurm_step;
  const std::string text = j.dump() + "\n";
  const fs::path final_path = heartbeat_path(run_dir, hb.rank);
  const fs::path tmp = final_path.string() + ".tmp";
  if (const char* f = std::getenv("PRIMUS_FAULT_HEARTBEAT")) {
    const char* from = std::strstr(f, "from=");
    if (hb.iteration >= (from ? std::atoll(from + 5) : 0))
      return "cannot write " + tmp.string() + ": " + std::strerror(ENOSPC) + " (injected: PRIMUS_FAULT_HEARTBEAT)";
  }
  std::error_code ec;
  fs::create_directories(final_path.parent_path(), ec);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot write " + tmp.string() + ": " + std::strerror(errno);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != ssize_t(text.size()))
    return "cannot write " + tmp.string() + ": " + (n < 0 ? std::strerror(err) : std::strerror(ENOSPC));
  fs::rename(tmp, final_path, ec);
  if (ec) return "cannot rename " + tmp.string() + ": " + ec.message();
  return "";
}

std::optional<Heartbeat> read_heartbeat(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    const json j = json::parse(ss.str());
    auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : std::nan(""); };
    Heartbeat hb;
    hb.rank = j.at("rank").get<int>();
    hb.world_size = j.value("world_size", 1);
    hb.pid = j.value("pid", 0);
    hb.host = j.value("host", "");
    hb.slurm_step = j.value("slurm_step", "");
    hb.iteration = j.value("iteration", int64_t(0));
    hb.phase = j.value("phase", "");
    hb.step_time = j.value("step_time", 0.0);
    hb.compute_time = j.value("compute_time", 0.0);
    hb.loss = num("loss");
    hb.grad_norm = num("grad_norm");
    hb.time = j.value("time", 0.0);
    hb.beat = j.value("beat", int64_t(0));
    hb.restarts = j.value("restarts", 0);
    if (j.contains("recent") && j["recent"].is_array())
      hb.recent = j["recent"].get<std::vector<std::pair<int64_t, double>>>();
    return hb;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::map<int, Heartbeat> read_heartbeats(const fs::path& run_dir) {
  std::map<int, Heartbeat> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(watch_dir(run_dir), ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("rank_") || !name.ends_with(".json")) continue;
    if (auto hb = read_heartbeat(e.path())) out[hb->rank] = *hb;
  }
  return out;
}

void clear_heartbeats(const fs::path& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(watch_dir(run_dir), ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("rank_") && (name.ends_with(".json") || name.ends_with(".tmp"))) fs::remove(e.path(), ec);
  }
}

}  // namespace primus::safe
