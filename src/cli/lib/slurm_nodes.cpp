#include "cli/lib/slurm_nodes.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/lib/process.h"

namespace primus::cli {
namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The value of -N / --nodes in an srun command (0: none). Stops at the task (the first word that
// is not an option of srun's, i.e. primus-cli itself).
int node_count(const std::vector<std::string>& argv) {
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    std::string v;
    if ((a == "-N" || a == "--nodes") && i + 1 < argv.size())
      v = argv[i + 1];
    else if (a.rfind("--nodes=", 0) == 0)
      v = a.substr(8);
    else if (a.rfind("-N", 0) == 0 && a.size() > 2)
      v = a.substr(2);
    if (!v.empty()) return std::atoi(v.substr(0, v.find('-')).c_str());  // "2-4": the minimum
    if (a == "--" || (!a.empty() && a[0] != '-' && (i == 1 || argv[i - 1][0] != '-'))) break;
  }
  return 0;
}

}  // namespace

ExcludePlan plan_exclusion(const std::vector<std::string>& argv, const std::vector<std::string>& failed_nodes,
                           const std::vector<std::string>& allocation) {
  ExcludePlan p;
  p.argv = argv;
  // The --exclude= this function added before (the first srun option); a user's own -x stays as it is.
  auto ours = std::find_if(p.argv.begin(), p.argv.end(),
                           [](const std::string& a) { return a.rfind("--exclude=", 0) == 0; });
  if (ours != p.argv.end()) p.excluded = split_commas(ours->substr(10));
  std::vector<std::string> add;
  for (const auto& n : failed_nodes)
    if (std::find(p.excluded.begin(), p.excluded.end(), n) == p.excluded.end()) add.push_back(n);
  if (add.empty()) {
    p.note = failed_nodes.empty() ? "no node to blame: restarting on the same nodes"
                                  : "those nodes are already excluded";
    return p;
  }
  if (!allocation.empty()) {
    const int need = node_count(argv);
    int left = 0;
    for (const auto& n : allocation)
      if (std::find(p.excluded.begin(), p.excluded.end(), n) == p.excluded.end() &&
          std::find(add.begin(), add.end(), n) == add.end())
        ++left;
    if (need == 0 || left < need) {
      p.note = fmt::format("{} failed, but the allocation has no spare node ({} of {} left for a step of {} nodes{}): "
                           "restarting on the same nodes",
                           fmt::join(add, ","), left, allocation.size(), need == 0 ? "all" : std::to_string(need),
                           need == 0 ? "; give --spare-nodes" : "");
      return p;
    }
  }
  p.excluded.insert(p.excluded.end(), add.begin(), add.end());
  const std::string flag = fmt::format("--exclude={}", fmt::join(p.excluded, ","));
  if (ours != p.argv.end())
    *ours = flag;
  else
    p.argv.insert(p.argv.begin() + 1, flag);
  p.note = fmt::format("leaving out {} (excluded now: {}){}", fmt::join(add, ","), fmt::join(p.excluded, ","),
                       allocation.empty() ? "; Slurm allocates a replacement"
                                          : "; a spare node of the allocation replaces it");
  return p;
}

std::vector<std::string> allocation_nodes() {
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (!list || !*list || !find_program("scontrol")) return {};
  const Captured r = run_capture({"scontrol", "show", "hostnames", list});
  std::vector<std::string> out;
  std::stringstream ss(r.out);
  for (std::string n; ss >> n;) out.push_back(n);
  return out;
}

}  // namespace primus::cli
