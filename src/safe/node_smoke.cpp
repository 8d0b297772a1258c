#include "safe/node_smoke.h"

#include <fcntl.h>
#include <gnu/libc-version.h>
#include <mpi.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/launch_env.h"
#include "safe/detect.h"
#include "safe/preflight.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::safe {
namespace {

std::string read_line(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return s;
}

double seconds_from(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// PRIMUS_FAULT_SMOKE="disk_delay_ms=200,version": the value of `key` ("" when set without one),
// or nullopt.
std::optional<std::string> smoke_fault(const std::string& key) {
  const char* e = std::getenv("PRIMUS_FAULT_SMOKE");
  if (!e) return std::nullopt;
  std::string s = e;
  for (size_t start = 0; start <= s.size();) {
    const size_t end = std::min(s.find(',', start), s.size());
    const std::string item = s.substr(start, end - start);
    const size_t eq = item.find('=');
    if (item.substr(0, eq) == key) return eq == std::string::npos ? "" : item.substr(eq + 1);
    start = end + 1;
  }
  return std::nullopt;
}

void check_nics(NodeFigures& f) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/class/net", ec)) {
    const std::string name = e.path().filename().string();
    if (name == "lo") continue;
    if (read_line(e.path() / "operstate") == "up") f.nics_up.push_back(name);
  }
  std::sort(f.nics_up.begin(), f.nics_up.end());
  if (f.nics_up.empty()) f.problems.push_back("no network interface is up");
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec))
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", ec)) {
      const std::string state = read_line(port.path() / "state");  // "4: ACTIVE"
      if (state.find("ACTIVE") == std::string::npos)
        f.problems.push_back(fmt::format("InfiniBand {} port {} is {}", dev.path().filename().string(),
                                         port.path().filename().string(), state.empty() ? "unreadable" : state));
    }
}

// Writes `bytes` (4 MiB blocks, fsync), drops them from the page cache, reads them back and
// compares: the speeds in MB/s, or a problem.
void check_disk(NodeFigures& f, const NodeSmokeOptions& o) {
  std::error_code ec;
  fs::create_directories(o.disk_path, ec);
  const fs::path file = o.disk_path / fmt::format(".primus_node_smoke_{}_{}", host_name(), ::getpid());
  const size_t block = size_t(4) << 20;
  const int64_t blocks = std::max<int64_t>(1, o.disk_bytes / int64_t(block));
  std::vector<char> data(block), back(block);
  for (size_t i = 0; i < block; ++i) data[i] = char((i * 131) ^ (i >> 12));
  const int64_t delay_ms = smoke_fault("disk_delay_ms") ? std::atoll(smoke_fault("disk_delay_ms")->c_str()) : 0;
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    f.problems.push_back(fmt::format("disk {}: cannot write: {}", o.disk_path.string(), std::strerror(errno)));
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  for (int64_t b = 0; b < blocks && ok; ++b) {
    ok = ::write(fd, data.data(), block) == ssize_t(block);
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  ok = ok && ::fsync(fd) == 0;
  const double write_s = seconds_from(t0);
  ::close(fd);
  if (!ok) {
    f.problems.push_back(fmt::format("disk {}: write failed: {}", o.disk_path.string(), std::strerror(errno)));
    fs::remove(file, ec);
    return;
  }
  const int rfd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  ::posix_fadvise(rfd, 0, 0, POSIX_FADV_DONTNEED);
  t0 = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < blocks && ok; ++b)
    ok = ::read(rfd, back.data(), block) == ssize_t(block) && std::memcmp(back.data(), data.data(), block) == 0;
  const double read_s = seconds_from(t0);
  ::close(rfd);
  fs::remove(file, ec);
  if (!ok) {
    f.problems.push_back(
        fmt::format("disk {}: the data read back differs from what was written", o.disk_path.string()));
    return;
  }
  const double mb = double(blocks) * double(block) / 1e6;
  f.disk_write_mbps = mb / write_s;
  f.disk_read_mbps = mb / read_s;
}

void collect_versions(NodeFigures& f) {
  utsname u{};
  ::uname(&u);
  f.versions["kernel"] = u.release;
  if (smoke_fault("version")) f.versions["kernel"] += "-injected";
  f.versions["glibc"] = gnu_get_libc_version();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);  // allowed before MPI_Init
  std::string m(mpi, size_t(len));
  f.versions["mpi"] = m.substr(0, m.find_first_of(",\n"));
  f.versions["compiler"] = __VERSION__;
  if (::access("/proc/driver/nvidia/version", R_OK) == 0)
    f.versions["gpu driver"] = read_line("/proc/driver/nvidia/version");
}

std::string summary_of(const NodeFigures& f) {
  std::string s = fmt::format("gemm {:.1f} GFLOP/s ({}), memory {:.1f} GB/s", f.gemm_gflops, f.device, f.memory_gbs);
  if (f.disk_write_mbps > 0)
    s += fmt::format(", disk write {:.0f} MB/s read {:.0f} MB/s", f.disk_write_mbps, f.disk_read_mbps);
  s += fmt::format(", {} GPU{}, NICs up: {}", f.gpus, f.gpus == 1 ? "" : "s",
                   f.nics_up.empty() ? "none" : fmt::format("{}", fmt::join(f.nics_up, " ")));
  return s;
}

}  // namespace

json to_json(const NodeFigures& f) {
  return {{"node", f.node},
          {"device", f.device},
          {"gpus", f.gpus},
          {"gemm_gflops", f.gemm_gflops},
          {"gemm_expected_gflops", f.gemm_expected},
          {"gemm_wrong", f.gemm_wrong},
          {"memory_gbs", f.memory_gbs},
          {"disk_write_mbps", f.disk_write_mbps},
          {"disk_read_mbps", f.disk_read_mbps},
          {"nics_up", f.nics_up},
          {"problems", f.problems},
          {"versions", f.versions}};
}

NodeFigures node_figures_from_json(const json& j) {
  NodeFigures f;
  f.node = j.at("node");
  f.device = j.at("device");
  f.gpus = j.at("gpus");
  f.gemm_gflops = j.at("gemm_gflops");
  f.gemm_expected = j.at("gemm_expected_gflops");
  f.gemm_wrong = j.at("gemm_wrong");
  f.memory_gbs = j.at("memory_gbs");
  f.disk_write_mbps = j.at("disk_write_mbps");
  f.disk_read_mbps = j.at("disk_read_mbps");
  f.nics_up = j.at("nics_up").get<std::vector<std::string>>();
  f.problems = j.at("problems").get<std::vector<std::string>>();
  f.versions = j.at("versions").get<std::map<std::string, std::string>>();
  return f;
}

NodeFigures measure_node(const std::vector<GemmProbe>& devices, const NodeSmokeOptions& o) {
  NodeFigures f;
  f.node = host_name();
  for (const GemmProbe& p : devices) {
    const auto [gflops, wrong] = p.run();
    const double gbs = p.copy_gbs(o.memory_bytes);
    const bool first = f.device.empty();
    f.device = p.device;
    f.gemm_gflops = first ? gflops : std::min(f.gemm_gflops, gflops);
    f.gemm_expected = first ? p.expected_gflops : std::min(f.gemm_expected, p.expected_gflops);
    f.memory_gbs = first ? gbs : std::min(f.memory_gbs, gbs);
    f.gemm_wrong += wrong;
    if (p.gpu) ++f.gpus;
  }
  for (const CheckResult& c : gpu_checks())
    if (c.status == "fail") f.problems.push_back(fmt::format("GPU {}: {} ({})", c.name, c.value, c.detail));
  check_nics(f);
  check_disk(f, o);
  collect_versions(f);
  return f;
}

std::vector<NodeFigures> merge_by_node(const std::vector<NodeFigures>& parts) {
  std::vector<NodeFigures> out;
  for (const NodeFigures& p : parts) {
    auto it = std::find_if(out.begin(), out.end(), [&](const NodeFigures& n) { return n.node == p.node; });
    if (it == out.end()) {
      out.push_back(p);
      continue;
    }
    NodeFigures& n = *it;
    // The node's figures are its slowest device's; disk, NICs and versions come from the part that measured them.
    if (p.gemm_gflops > 0) {
      n.gemm_gflops = n.gemm_gflops > 0 ? std::min(n.gemm_gflops, p.gemm_gflops) : p.gemm_gflops;
      n.memory_gbs = n.memory_gbs > 0 ? std::min(n.memory_gbs, p.memory_gbs) : p.memory_gbs;
      n.gemm_expected = std::max(n.gemm_expected, p.gemm_expected);
    }
    n.gemm_wrong += p.gemm_wrong;
    n.gpus += p.gpus;
    if (n.device.empty()) n.device = p.device;
    if (p.disk_write_mbps > 0) n.disk_write_mbps = p.disk_write_mbps, n.disk_read_mbps = p.disk_read_mbps;
    if (n.nics_up.empty()) n.nics_up = p.nics_up;
    if (n.versions.empty()) n.versions = p.versions;
    for (const auto& pr : p.problems)
      if (std::find(n.problems.begin(), n.problems.end(), pr) == n.problems.end()) n.problems.push_back(pr);
  }
  return out;
}

std::vector<NodeVerdict> judge_nodes(const std::vector<NodeFigures>& nodes, const NodeSmokeOptions& o) {
  std::vector<NodeVerdict> out;
  // The nodes' medians, for slow outliers (with 2+ nodes).
  struct Figure {
    const char* what;
    double NodeFigures::*field;
    const char* unit;
  };
  const Figure figures[] = {{"GEMM", &NodeFigures::gemm_gflops, "GFLOP/s"},
                            {"memory bandwidth", &NodeFigures::memory_gbs, "GB/s"},
                            {"disk write", &NodeFigures::disk_write_mbps, "MB/s"},
                            {"disk read", &NodeFigures::disk_read_mbps, "MB/s"}};
  std::map<std::string, double> medians;
  for (const Figure& fg : figures) {
    std::vector<double> v;
    for (const auto& n : nodes)
      if (n.*fg.field > 0) v.push_back(n.*fg.field);
    medians[fg.what] = v.empty() ? 0.0 : median(v);  // safe/detect.h
  }
  // Versions: each node against the majority.
  std::map<std::string, std::map<std::string, int>> counts;
  for (const auto& n : nodes)
    for (const auto& [k, v] : n.versions) counts[k][v]++;
  for (const NodeFigures& n : nodes) {
    NodeVerdict v;
    v.node = n.node;
    v.summary = summary_of(n);
    v.reasons = n.problems;
    if (n.gemm_wrong > 0)
      v.reasons.push_back(fmt::format("GEMM results wrong: {} elements on {}", n.gemm_wrong, n.device));
    if (n.gemm_expected > 0 && n.gemm_gflops < o.min_gemm_fraction * n.gemm_expected)
      v.reasons.push_back(fmt::format("GEMM {:.1f} GFLOP/s is below {:.0f}% of the device's {:.1f}", n.gemm_gflops,
                                      100 * o.min_gemm_fraction, n.gemm_expected));
    for (const char* what : {"write", "read"}) {
      const double mbps = std::string(what) == "write" ? n.disk_write_mbps : n.disk_read_mbps;
      if (mbps > 0 && mbps < o.min_disk_mbps)
        v.reasons.push_back(fmt::format("slow disk: {} {:.1f} MB/s is below the floor of {:.0f} MB/s (--min-disk-mbps)",
                                        what, mbps, o.min_disk_mbps));
    }
    if (nodes.size() >= 2)
      for (const Figure& fg : figures) {
        const double x = n.*fg.field, m = medians[fg.what];
        if (x > 0 && x < o.slow_factor * m)
          v.reasons.push_back(
              fmt::format("slow {}: {:.1f} {} against the nodes' median {:.1f}", fg.what, x, fg.unit, m));
      }
    for (const auto& [k, value] : n.versions) {
      const auto& c = counts[k];
      const auto best = std::max_element(c.begin(), c.end(), [](auto& a, auto& b) { return a.second < b.second; });
      if (c.size() < 2) continue;
      if (2 * best->second <= int(nodes.size()))
        v.reasons.push_back(
            fmt::format("{} '{}': the nodes disagree ({} versions, none on most nodes)", k, value, c.size()));
      else if (value != best->first)
        v.reasons.push_back(fmt::format("{} '{}' differs from '{}' on {} of {} nodes", k, value, best->first,
                                        best->second, nodes.size()));
    }
    v.pass = v.reasons.empty();
    out.push_back(v);
  }
  return out;
}

std::string verdict_line(const NodeVerdict& v) {
  if (v.pass) return fmt::format("PASS {}: {}", v.node, v.summary);
  return fmt::format("FAIL {}: {} ({})", v.node, fmt::join(v.reasons, "; "), v.summary);
}

std::string exclude_list(const std::vector<NodeVerdict>& verdicts) {
  std::vector<std::string> bad;
  for (const auto& v : verdicts)
    if (!v.pass) bad.push_back(v.node);
  return fmt::format("{}", fmt::join(bad, ","));
}

}  // namespace primus::safe
