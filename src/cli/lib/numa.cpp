#include "cli/lib/numa.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

#ifdef PRIMUS_HAVE_NUMA
#include <numa.h>
#endif

namespace fs = std::filesystem;

namespace primus::cli {
namespace {

int read_int(const fs::path& p, int fallback) {
  std::ifstream in(p);
  int v = fallback;
  return in >> v ? v : fallback;
}

// PCI addresses of the GPUs, bus order.
std::vector<fs::path> gpu_devices(const fs::path& sys) {
  std::vector<fs::path> out;
  for (const char* driver : {"nvidia", "amdgpu"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(sys / "bus/pci/drivers" / driver, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && name[4] == ':') out.push_back(e.path());  // 0000:3b:00.0
    }
  }
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return out;
}

// "0-3,8-11" -> the CPU ids.
std::vector<int> parse_cpulist(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t end = s.find(',', i);
    if (end == std::string::npos) end = s.size();
    const std::string part = s.substr(i, end - i);
    const size_t dash = part.find('-');
    try {
      const int a = std::stoi(part.substr(0, dash)),
                b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
      for (int c = a; c <= b; ++c) out.push_back(c);
    } catch (const std::exception&) {
    }
    i = end + 1;
  }
  return out;
}

}  // namespace

std::vector<int> gpu_numa_nodes(const fs::path& sys) {
  std::vector<int> out;
  for (const auto& d : gpu_devices(sys)) out.push_back(read_int(d / "numa_node", -1));
  return out;
}

std::vector<int> cpu_numa_nodes(const fs::path& sys) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sys / "devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    std::ifstream in(e.path() / "cpulist");
    std::string list;
    std::getline(in, list);
    if (!parse_cpulist(list).empty()) out.push_back(std::stoi(name.substr(4)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

int numa_node_for_rank(int local_rank, int local_world, const std::vector<int>& gpu_nodes,
                       const std::vector<int>& nodes) {
  if (!gpu_nodes.empty()) {
    const int n = gpu_nodes[size_t(local_rank) % gpu_nodes.size()];
    if (n >= 0) return n;
  }
  if (nodes.empty()) return -1;
  const int world = std::max(1, local_world);
  return nodes[size_t(int64_t(local_rank % world) * int64_t(nodes.size()) / world)];
}

std::string bind_rank_to_numa_node(int local_rank, int local_world) {
#ifdef PRIMUS_HAVE_NUMA
  if (numa_available() < 0) fail("--numa: this kernel has no NUMA support (numa_available() failed)");
  const std::vector<int> gpus = gpu_numa_nodes(), nodes = cpu_numa_nodes();
  const int node = numa_node_for_rank(local_rank, local_world, gpus, nodes);
  if (node < 0) fail("--numa: no NUMA node with CPUs found under /sys/devices/system/node");
  if (numa_run_on_node(node) != 0) fail("--numa: cannot run local rank {} on NUMA node {}", local_rank, node);
  numa_set_preferred(node);
  const bool by_gpu = !gpus.empty() && gpus[size_t(local_rank) % gpus.size()] >= 0;
  return by_gpu ? fmt::format("local rank {} bound to NUMA node {} (the node of its GPU, {} of {})", local_rank, node,
                              local_rank % int(gpus.size()), gpus.size())
                : fmt::format("local rank {} of {} bound to NUMA node {} (spread over the host's {} node{}{})",
                              local_rank, local_world, node, nodes.size(), nodes.size() == 1 ? "" : "s",
                              gpus.empty() ? "; no GPU" : "; the kernel does not know its GPU's node");
#else
  (void)local_rank, (void)local_world;
  fail("--numa: this primus-cli was built without libnuma (Debian: libnuma-dev)");
#endif
}

std::string current_numa_nodes() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::set<int> nodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    std::ifstream in(e.path() / "cpulist");
    std::string list;
    std::getline(in, list);
    for (int c : parse_cpulist(list))
      if (c < CPU_SETSIZE && CPU_ISSET(c, &set)) nodes.insert(std::stoi(name.substr(4)));
  }
  return nodes.empty() ? "?" : fmt::format("{}", fmt::join(nodes, ","));
}

}  // namespace primus::cli
